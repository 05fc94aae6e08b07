"""Stats folded from events, and the repeated PrimaryDegraded signal."""

from __future__ import annotations

import threading

from herdless._stats import ClientStats, DegradedTracker, StatsRecorder
from herdless.events import (
    AttemptFailed,
    AttemptStarted,
    CallFailed,
    CallFinished,
    FallbackUsed,
    RetryScheduled,
    WaitScheduled,
)


def test_counts_by_backend_and_outcome() -> None:
    stats = StatsRecorder()
    for event in (
        AttemptStarted(call_id="a", backend="primary", at=0, attempt=1, model="m"),
        AttemptFailed(call_id="a", backend="primary", at=0, attempt=1, kind="status", status=503),
        RetryScheduled(call_id="a", backend="primary", at=0, attempt=1, delay=0.5, reason="x"),
        AttemptStarted(call_id="a", backend="primary", at=0, attempt=2, model="m"),
        AttemptFailed(call_id="a", backend="primary", at=0, attempt=2, kind="connect"),
        FallbackUsed(call_id="a", backend="hosted", at=0, from_backend="primary", reason="r"),
        WaitScheduled(call_id="a", backend="hosted", at=0, delay=1.5, reason="budget"),
        AttemptStarted(call_id="a", backend="hosted", at=0, attempt=3, model="m"),
        CallFinished(call_id="a", backend="hosted", at=0, attempts=3, latency=2.0),
        CallFailed(call_id="b", backend=None, at=0, attempts=0, latency=1.0, error="X"),
    ):
        stats.record(event)
    stats.slot_waited(0.25)
    snapshot = stats.snapshot({"primary": "open", "hosted": "closed"}, {"primary": 16.0})
    assert snapshot == ClientStats(
        calls=2,
        succeeded=1,
        failed=1,
        by_backend={
            "primary": {"attempts": 2, "status_503": 1, "connect": 1},
            "hosted": {"attempts": 1, "ok": 1},
        },
        fallbacks={"r": 1},
        retries=1,
        waits=2,
        waited=2.0,
        queued=1,
        queued_for=0.25,
        breakers={"primary": "open", "hosted": "closed"},
        windows={"primary": 16.0},
        latency={"p50": 2.0, "p90": 2.0, "p99": 2.0, "max": 2.0},
    )


def test_latency_percentiles() -> None:
    stats = StatsRecorder()
    for n in range(1, 101):
        stats.record(CallFinished(call_id=None, backend="p", at=0, attempts=1, latency=n / 100))
    assert stats.snapshot({}, {}).latency == {"p50": 0.51, "p90": 0.91, "p99": 1.0, "max": 1.0}


def test_an_empty_snapshot() -> None:
    snapshot = StatsRecorder().snapshot({}, {})
    assert snapshot.as_dict() == {
        "calls": 0,
        "succeeded": 0,
        "failed": 0,
        "by_backend": {},
        "fallbacks": {},
        "retries": 0,
        "waits": 0,
        "waited": 0.0,
        "queued": 0,
        "queued_for": 0.0,
        "breakers": {},
        "windows": {},
        "latency": {},
        "tokens": {},
        "cost": {},
        "hedges": {},
        "hedge_wins": {},
        "wait_error": {},
    }


def test_threads_lose_no_count() -> None:
    stats = StatsRecorder()
    event = AttemptStarted(call_id=None, backend="p", at=0, attempt=1, model=None)

    def record() -> None:
        for _ in range(1000):
            stats.record(event)

    threads = [threading.Thread(target=record) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.snapshot({}, {}).by_backend == {"p": {"attempts": 8000}}


def test_degraded_is_said_at_once_then_every_interval() -> None:
    tracker = DegradedTracker(interval=60.0)
    said = [
        tracker.served(primary="p", by_fallback=True, reason="breaker_open", now=t)
        for t in (0.0, 30.0, 59.0, 60.0, 100.0, 121.0)
    ]
    assert [s["fallbacks"] if s else None for s in said] == [1, None, None, 4, None, 6]
    assert said[0] == {"backend": "p", "since": 0.0, "fallbacks": 1, "reason": "breaker_open"}
    assert tracker.served(primary="p", by_fallback=False, reason=None, now=130.0) is None
    again = tracker.served(primary="p", by_fallback=True, reason=None, now=131.0)
    assert again == {"backend": "p", "since": 131.0, "fallbacks": 1, "reason": "fallback"}
