"""Injectable faults (pure): what a misbehaving vLLM does, switched on by flags or at run time.

Steady faults stay on until cleared (``DELETE /_emulator/faults``):

- ``hang``: accept the request, never answer (until the client gives up);
- ``error_rate`` / ``error_status``: answer that fraction of completions with
  that status and a vLLM-shaped error body;
- ``extra_latency``: seconds added before a completion is scheduled;
- ``slow_rate`` / ``slow_latency``: that fraction of completions is held that many
  seconds before its first byte (the response head included), while its sequence runs
  in the engine (it holds its batch slot and KV, as a request stuck before its first
  token does); a client that leaves meanwhile aborts it, as any other;
- ``cut_after``: close streams abruptly after that many SSE events, without
  ``[DONE]`` (the connection drops mid-body).

Actions happen once, when posted:

- ``refuse_for``: close the listening socket for that many seconds (new
  connections are refused; requests in flight carry on);
- ``maintenance_for``: a model swap: abort everything in flight, refuse
  connections, come back after that many seconds;
- ``crash``: the process exits at once (status 70), as a dead engine would;
- ``metrics_error_for``: ``GET /metrics`` answers 500 for that many seconds (a
  scraper reads nothing; every other route is served);
- ``metrics_stall_for``: ``GET /metrics`` gets no answer for that many seconds; the
  scrapes held meanwhile are answered when it ends (with the metrics then), as an
  overloaded API server answers late. One of the two at a time: a new one replaces
  the window in progress, and ``DELETE /_emulator/faults`` ends it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any, Literal

from herdless._bounds import require

__all__ = ["FaultActions", "Faults", "MetricsOutage", "parse_faults"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """The steady faults; the defaults inject nothing."""

    hang: bool = False
    error_rate: float = 0.0
    error_status: int = 500
    extra_latency: float = 0.0
    cut_after: int | None = None
    slow_rate: float = 0.0
    slow_latency: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be within [0, 1], got {self.error_rate!r}")
        if not 400 <= self.error_status <= 599:
            raise ValueError(f"error_status must be a 4xx or 5xx status, got {self.error_status!r}")
        require(self, ">= 0", "extra_latency", "slow_latency")
        require(self, ">= 0", "cut_after", optional=True)
        if not 0.0 <= self.slow_rate <= 1.0:
            raise ValueError(f"slow_rate must be within [0, 1], got {self.slow_rate!r}")

    @property
    def active(self) -> bool:
        return self != Faults()

    def should_fail(self, rng: random.Random) -> bool:
        """Whether this completion is answered with ``error_status`` (draws from ``rng``)."""
        # Draw only when needed so that a seeded run without errors is unchanged.
        return self.error_rate > 0 and rng.random() < self.error_rate

    def hold(self, rng: random.Random) -> float:
        """Seconds this completion is held before its first byte: ``slow_latency`` for a
        ``slow_rate`` share of them, else 0 (draws from ``rng`` only when the fault is on)."""
        if self.slow_rate > 0 and self.slow_latency > 0 and rng.random() < self.slow_rate:
            return self.slow_latency
        return 0.0

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsOutage:
    """``GET /metrics`` failing (``"error"``: a 500) or stalling (``"stall"``: no answer)
    for ``seconds``."""

    mode: Literal["error", "stall"]
    seconds: float

    def __post_init__(self) -> None:
        if self.mode not in ("error", "stall"):
            raise ValueError(f"mode must be 'error' or 'stall', got {self.mode!r}")
        if self.seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {self.seconds!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultActions:
    """One-shot actions posted with the faults; ``None`` or ``False`` does nothing."""

    refuse_for: float | None = None
    maintenance_for: float | None = None
    crash: bool = False
    metrics_error_for: float | None = None
    metrics_stall_for: float | None = None

    def __post_init__(self) -> None:
        windows = ("refuse_for", "maintenance_for", "metrics_error_for", "metrics_stall_for")
        require(self, ">= 0", *windows, optional=True)
        if self.metrics_error_for is not None and self.metrics_stall_for is not None:
            raise ValueError("metrics_error_for and metrics_stall_for: give one, not both")

    def metrics_outage(self) -> MetricsOutage | None:
        """The ``/metrics`` window these actions begin, if any."""
        if self.metrics_error_for is not None:
            return MetricsOutage(mode="error", seconds=self.metrics_error_for)
        if self.metrics_stall_for is not None:
            return MetricsOutage(mode="stall", seconds=self.metrics_stall_for)
        return None


_STEADY = {f.name: f for f in fields(Faults)}
_ACTIONS = {f.name: f for f in fields(FaultActions)}


def parse_faults(body: object) -> tuple[Faults, FaultActions]:
    """Turn a ``POST /_emulator/faults`` JSON body into faults and actions.

    Unset steady fields take their defaults: a POST replaces the steady faults.

    Raises:
        ValueError: on an unknown key, a wrong type or a value out of range.
    """
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - _STEADY.keys() - _ACTIONS.keys())
    if unknown:
        raise ValueError(f"unknown fault(s): {', '.join(unknown)}")
    for key, value in body.items():
        _check_type(key, value)
    steady = {k: v for k, v in body.items() if k in _STEADY}
    actions = {k: v for k, v in body.items() if k in _ACTIONS}
    return Faults(**steady), FaultActions(**actions)


def _check_type(key: str, value: object) -> None:
    if key in {"hang", "crash"}:
        ok = isinstance(value, bool)
    elif key in {"error_status"}:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif key == "cut_after":
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
    else:  # seconds and rates
        ok = (value is None and key.endswith("_for")) or (
            isinstance(value, int | float) and not isinstance(value, bool)
        )
    if not ok:
        raise ValueError(f"{key}: wrong type {type(value).__name__}")
