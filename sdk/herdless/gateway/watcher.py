"""The engine watcher: reads the upstream's Prometheus metrics for the sizing rule.

Every ``metrics_interval`` seconds it reads vLLM's ``/metrics``, keeps the few series
self-sizing needs (:func:`parse_metrics`) and hands the reading to the gate
(:meth:`~herdless.gateway.gate.Gate.observe`), which may start waiters at once. What it
found is logged once at start-up; a read that fails or comes late is reported to the
sizing rule, which falls back to the last good limit when the readings go stale
(logged once, and once more when they come back). While no prompt has been counted
by the engine, a read also asks its ``/tokenize`` for a started request's prompt
(:meth:`~herdless.gateway.core.sizing.Sizing.sample_prompt`). Neither is ever on a
request's path.

Why a line scan and not a Prometheus parser: the gateway needs a handful of series out
of a page of several hundred lines, four times a second; a scan that splits only the
lines whose name it wants costs a fraction of a full parse, and needs no dependency.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Callable
from typing import Any, Final

from herdless.gateway.core.engine import Reading
from herdless.gateway.gate import Gate
from herdless.gateway.logs import LOG, event
from herdless.gateway.upstream import Upstream

__all__ = ["SIGNALS", "Watcher", "parse_metrics", "tokenize_body"]

SIGNALS: Final = {
    "vllm:cache_config_info": "kv_capacity",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",  # vLLM before 0.10 (V0's name)
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:request_inference_time_seconds_sum": "run_seconds",
    "vllm:request_inference_time_seconds_count": "runs",
    "vllm:request_generation_tokens_sum": "answer_tokens",
    "vllm:request_generation_tokens_count": "answers",
}
"""The series read, and the :class:`Reading` field each feeds."""
_TOKENIZE_TRIES: Final = 3
"""Failed ``/tokenize`` asks after which a watcher asks no more (an engine without it)."""
_AWAKE = re.compile(r'^vllm:engine_sleep_state\{[^}]*sleep_state="awake"[^}]*\} 0', re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, at: float) -> Reading:
    """The sizing signals in a Prometheus text exposition (missing ones are ``None``).

    Several engines (vLLM's data parallel ranks, labelled ``engine``) are summed: their
    KV capacities and counts add up, and the KV use is their mean.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    blocks: list[tuple[int, int]] = []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        name = line[: brace if brace > 0 else line.find(" ")]
        field = SIGNALS.get(name)
        if field is None:
            continue
        if field == "kv_capacity":
            found = dict(_LABEL.findall(line[brace:]))
            try:
                blocks.append((int(found["num_gpu_blocks"]), int(found["block_size"])))
            except (KeyError, ValueError):
                continue
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if field == "kv_usage" and field in sums and name == "vllm:gpu_cache_usage_perc":
            continue  # both names published: the current one counts
        if not math.isfinite(value):
            continue
        sums[field] = sums.get(field, 0.0) + value
        counts[field] = counts.get(field, 0) + 1
    usage = sums.get("kv_usage")
    return Reading(
        at=at,
        kv_capacity=sum(n * size for n, size in blocks) if blocks else None,
        block_size=blocks[0][1] if blocks else None,
        kv_usage=None if usage is None else usage / counts["kv_usage"],
        running=_count(sums, "running"),
        waiting=_count(sums, "waiting"),
        preemptions=_count(sums, "preemptions"),
        generation_tokens=_count(sums, "generation_tokens"),
        prefix_hits=_count(sums, "prefix_hits"),
        run_seconds=sums.get("run_seconds"),
        runs=_count(sums, "runs"),
        answer_tokens=sums.get("answer_tokens"),
        answers=_count(sums, "answers"),
    )


def tokenize_body(body: bytes) -> dict[str, Any] | None:
    """``/tokenize``'s body for a chat or completion request's ``body``: its ``model`` and
    its ``messages`` (each text: a string, or text parts) or its ``prompt`` (a string);
    ``None`` for anything else (images, tools, token ids, a Messages API ``system``
    beside the messages), which the gateway's estimate does not count alike."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("tools") or data.get("system"):
        return None
    messages, prompt = data.get("messages"), data.get("prompt")
    asked: dict[str, Any]
    if isinstance(messages, list) and all(
        isinstance(m, dict) and _text(m.get("content")) for m in messages
    ):
        asked = {"messages": messages}
    elif isinstance(prompt, str):
        asked = {"prompt": prompt}
    else:
        return None
    if isinstance(data.get("model"), str):
        asked["model"] = data["model"]
    return asked


def _text(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    )


def _count(sums: dict[str, float], field: str) -> int | None:
    value = sums.get(field)
    return None if value is None else round(value)


class Watcher:
    """Reads the engine's metrics into the gate until cancelled.

    Args:
        upstream: the pooled client to the engine.
        gate: the gate whose admission sizes itself.
        interval: seconds between two reads.
        now: the admission clock (``Clock.monotonic``).
    """

    def __init__(
        self, upstream: Upstream, gate: Gate, *, interval: float, now: Callable[[], float]
    ) -> None:
        self._upstream = upstream
        self._gate = gate
        self._interval = interval
        self._now = now
        self._told: str | None = None  # what the log last said: sized, static, stale
        self.reads = 0
        """Reads that got an answer."""
        self.failures = 0
        """Reads that failed or came late."""
        self.tokenize_failures = 0
        """``/tokenize`` asks that got no count."""

    async def run(self) -> None:
        """Read every ``interval`` seconds, for ever (the first read is the caller's)."""
        while True:
            await asyncio.sleep(self._interval)
            await self.read_once()

    async def read_once(self) -> Reading | None:
        """One read: the reading handed to the gate, or ``None`` when it failed."""
        gate = self._gate
        if self._asleep():
            return None  # a sleeping engine's empty KV cache is no room
        text = await self._upstream.metrics(within=max(0.5, 2 * self._interval))
        if self._asleep() or (text is not None and _sleeping(text)):
            return None
        if text is None:
            self.failures += 1
            if gate.readings_failed():
                self._say("stale")
            return None
        reading = parse_metrics(text, self._now())
        self.reads += 1
        gate.observe(reading)
        self._say("sized" if reading.sizable else "static", reading)
        await self._count_prompt()
        return reading

    async def _count_prompt(self) -> None:
        """Ask the engine to count the sampled prompt, if any (at most ``_TOKENIZE_TRIES``
        asks fail in all: an engine without ``/tokenize`` is asked no more)."""
        sizing = self._gate.admission.sizing
        sample = sizing.take_prompt_sample()
        if sample is None or self.tokenize_failures >= _TOKENIZE_TRIES:
            return
        asked = tokenize_body(sample[0])
        if asked is None:
            return  # a request the estimate prices otherwise: the next one is sampled
        count = await self._upstream.tokenize(asked, within=max(0.5, 2 * self._interval))
        if count is None:
            self.tokenize_failures += 1
        else:
            sizing.count_prompt(sample[1], count)

    def _asleep(self) -> bool:
        return self._gate.admission.paused

    def _say(self, state: str, reading: Reading | None = None) -> None:
        """Log a change of state once: sized (with what was found), static, stale."""
        if state == self._told:
            return
        previous, self._told = self._told, state
        sizing = self._gate.admission.sizing
        if state == "stale":
            event(
                LOG,
                logging.WARNING,
                "engine readings stale: starts held to the last good limit",
                limit=sizing.limit,
            )
            return
        if previous == "stale":
            event(LOG, logging.INFO, "engine readings back", limit=sizing.limit)
        if state == "sized" and reading is not None:
            found = [f for f in SIGNALS.values() if getattr(reading, f) is not None]
            event(
                LOG,
                logging.INFO,
                "engine sized from its metrics",
                kv_capacity_tokens=reading.kv_capacity,
                block_size=reading.block_size,
                signals=",".join(dict.fromkeys(found)),
                limit=sizing.limit,
            )
        elif state == "static":
            event(
                LOG,
                logging.WARNING,
                "engine publishes no KV capacity on /metrics: static limits",
                max_concurrency=sizing.static_limit,
            )


def _sleeping(text: str) -> bool:
    """Whether the engine says it sleeps (``vllm:engine_sleep_state{sleep_state="awake"} 0``)."""
    return "vllm:engine_sleep_state" in text and _AWAKE.search(text) is not None
