"""vLLM's sleep mode, emulated: ``POST /sleep?level=1|2``, ``POST /wake_up``,
``GET /is_sleeping`` and the ``vllm:engine_sleep_state`` gauge, in vLLM's wire format.

vLLM (``--enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``, CUDA or ROCm only) frees the
GPU while asleep: level 1 offloads the weights to CPU memory and discards the KV cache,
level 2 discards both. ``/sleep`` and ``/wake_up`` answer 200 with an empty body once done;
``/is_sleeping`` answers ``{"is_sleeping": true|false}``. A generation request that reaches
a sleeping engine hangs: the emulator holds it until the wake, and counts it
(``GET /_emulator/sleep``), so that a test can say none did.
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import Response

from herdless.emulator import wire

__all__ = ["GENERATION_PATHS", "Sleep"]

GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages"}
)
"""The routes that need the weights: held while asleep."""
_STATES = ("awake", "weights_offloaded", "discard_all")


class Sleep:
    """The engine's sleep state and its routes.

    Args:
        wake_time: seconds a wake takes (the weights back on the GPU, the KV reallocated).
    """

    def __init__(self, wake_time: float) -> None:
        self.wake_time = wake_time
        self.level = 0
        """0 awake, 1 weights offloaded, 2 all discarded."""
        self.reached_asleep = 0
        """Generation requests that reached the engine while it slept."""
        self._awake = asyncio.Event()
        self._awake.set()

    @property
    def asleep(self) -> bool:
        """Whether the engine sleeps."""
        return self.level > 0

    async def hold(self) -> None:
        """A generation request arrived: while asleep, count it and wait for the wake."""
        if self.asleep:
            self.reached_asleep += 1
            await self._awake.wait()

    async def sleep(self, request: Request) -> Response:
        """``POST /sleep?level=1``: 200, empty; 400 for another level."""
        text = request.query_params.get("level", "1")
        if text not in ("1", "2"):
            message = f"level must be 1 or 2, got {text[:20]!r}"
            return Response(wire.error_body(message, "BadRequestError", 400), 400)
        self.level = int(text)
        self._awake.clear()
        return Response(status_code=200)

    async def wake_up(self, request: Request) -> Response:
        """``POST /wake_up``: 200, empty, once awake (after ``wake_time``)."""
        if self.asleep:
            await asyncio.sleep(self.wake_time)
            self.level = 0
            self._awake.set()
        return Response(status_code=200)

    async def is_sleeping(self, request: Request) -> Response:
        """``GET /is_sleeping``: ``{"is_sleeping": bool}``."""
        return Response(json.dumps({"is_sleeping": self.asleep}), media_type="application/json")

    async def report(self, request: Request) -> Response:
        """``GET /_emulator/sleep``: the state, and the requests that reached it asleep."""
        body = {"level": self.level, "reached_asleep": self.reached_asleep}
        return Response(json.dumps(body), media_type="application/json")

    def metrics(self, model: str) -> str:
        """The ``vllm:engine_sleep_state`` family, one sample per state (1 for the current)."""
        lines = [
            "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is "
            "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep "
            "level 1; discard_all = 1 means sleep level 2.",
            "# TYPE vllm:engine_sleep_state gauge",
        ]
        for index, state in enumerate(_STATES):
            value = 1.0 if index == self.level else 0.0
            labels = f'engine="0",model_name="{model}",sleep_state="{state}"'
            lines.append(f"vllm:engine_sleep_state{{{labels}}} {value}")
        return "\n".join(lines) + "\n"
