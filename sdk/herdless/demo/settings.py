"""``DemoSettings``: every ``herdless demo`` flag, also settable as ``HERDLESS_DEMO_<FLAG>``.

A flag given on the command line wins over the environment (as for ``herdless
serve`` and ``herdless emulate``); ``--no-fallback`` is ``HERDLESS_DEMO_FALLBACK=false``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["VLLM_DEFAULTS", "DemoSettings"]

# A real vLLM on CPU is slow: on the busy 2-core box it read a 210-token question in
# about 4 s and four 64-token answers at once took 22 s, past the 20 s deadline. A
# small crowd asking short questions for short answers through a gateway admitting
# 4 still saturates it, and a call fits its deadline.
VLLM_DEFAULTS: dict[str, object] = {"crowd": 8, "gpu_seqs": 4, "max_words": 40, "max_tokens": 16}


class DemoSettings(BaseSettings):
    """What the day looks like.

    Attributes:
        length: seconds the day lasts (calls in flight then finish within their deadline).
        crowd: employees, each with their own herdless client or chat front-end.
        frontend: the share of them on a chat front-end that sends each question once
            and never retries (as Open WebUI's backend does), through a key whose policy
            holds its requests in the gateway and spills them to the hosted model.
        seed: seeds the employees' questions, their clients' jitter and the emulators.
        fallback: a hosted model behind the company GPU (``False``: see the day without).
        out: folder for the timeline PNG and the servers' logs (a temporary one if unset).
        speed: the emulated GPU's time scale.
        gpu_seqs: sequences the GPU runs at once; the gateway admits as many.
        deadline: seconds each employee's client allows a call, waits included.
        max_words: the longest question an employee asks (words).
        max_tokens: the longest answer an employee asks for (tokens).
        backend: the company GPU: the emulator, or a real vLLM on CPU
            (:mod:`herdless.launch.vllm`; the hosted model stays an emulator).
            With ``vllm``, ``crowd``, ``gpu_seqs``, ``max_words`` and ``max_tokens`` default to
            :data:`VLLM_DEFAULTS` unless set by flag or variable.
    """

    model_config = SettingsConfigDict(env_prefix="HERDLESS_DEMO_", extra="forbid")

    length: PositiveFloat = Field(
        default=60.0, description="seconds the day lasts (calls in flight then finish)"
    )
    crowd: PositiveInt = Field(
        default=150, description="employees, each with their own herdless client"
    )
    frontend: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="share of the employees on a chat front-end that asks once and never "
        "retries (held, or spilled to the hosted model, by the gateway)",
    )
    seed: int = Field(
        default=1, description="seeds the questions, the clients' jitter and the emulators"
    )
    fallback: bool = Field(
        default=True,
        description="a hosted model behind the company GPU (--no-fallback: see the day without)",
    )
    out: Path | None = Field(
        default=None,
        description="folder for the timeline PNG and the servers' logs (unset: a temporary one)",
    )
    speed: PositiveFloat = Field(default=4.0, description="the emulated GPU's time scale")
    gpu_seqs: PositiveInt = Field(
        default=8, description="sequences the GPU runs at once; the gateway admits as many"
    )
    deadline: PositiveFloat = Field(
        default=20.0, description="seconds each client allows a call, waits included"
    )
    max_words: PositiveInt = Field(
        default=300, description="the longest question an employee asks (words)"
    )
    max_tokens: PositiveInt = Field(
        default=512, description="the longest answer an employee asks for (tokens)"
    )
    backend: Literal["emulator", "vllm"] = Field(
        default="emulator",
        description="the company GPU: emulated, or a real vLLM on CPU, prepared in "
        "$HERDLESS_VLLM_CACHE or ./.cache/vllm; vllm defaults to --crowd 8 --gpu-seqs 4 "
        "--max-words 40 --max-tokens 16",
    )

    @model_validator(mode="before")
    @classmethod
    def _vllm_defaults(cls, data: Any) -> Any:
        """Smaller defaults for a real vLLM; what flags or variables set is kept."""
        if isinstance(data, dict) and data.get("backend") == "vllm":
            data = VLLM_DEFAULTS | data
        return data
