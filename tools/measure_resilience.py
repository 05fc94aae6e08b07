"""Measure the SDK's resilience against real processes (not a test; prints a table).

    python tools/measure_resilience.py

Two emulated vLLMs on loopback (``primary`` and ``hosted``, speed x50). It measures:

1. hang -> fallback: time from the primary starting to hang until a call is served by
   the fallback, and until calls no longer wait for the primary at all (breaker open);
2. the latency the open breaker adds per call: calls through the client whose primary's
   breaker is open, against calls of a client whose primary *is* the hosted backend,
   interleaved; plus the flow's own CPU time for a skipped primary, in-process;
3. attempts per call at the primary when it answers 502 to everything, with the
   retry budget, with a fallback and without one;
4. recovery: time from the primary answering again until calls are served by it.

Settings: per-attempt first-byte timeout 1 s, breaker defaults (5 consecutive
failures, open 5 s with up to 20 % jitter), retry defaults.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from herdless import Backend, BreakerPolicy, Client, RetryPolicy, Timeouts
from herdless._actions import Response
from herdless._call.flow import CallFlow
from herdless._config import ClientConfig
from herdless._state import ClientState
from herdless.events import CallFinished, Event
from herdless.launch.servers import ServerProcess, emulator_process
from herdless.testing import FakeClock

HI = [{"role": "user", "content": "hi"}]
TIMEOUTS = Timeouts(connect=1.0, first_byte=1.0, read=2.0)


def _faults(server: ServerProcess, **faults: Any) -> None:
    if faults:
        httpx.post(server.url + "/_emulator/faults", json=faults, timeout=5).raise_for_status()
    else:
        httpx.delete(server.url + "/_emulator/faults", timeout=5).raise_for_status()


def _client(primary: str, hosted: ServerProcess | None, **kwargs: Any) -> Client:
    fallback = (
        Backend(name="hosted", base_url=hosted.url + "/v1", model="hosted-mini", external=True)
        if hosted is not None
        else None
    )
    return Client(
        primary=primary,
        fallback=fallback,
        model="emulated-llama-3-8b",
        timeouts=TIMEOUTS,
        deadline=kwargs.pop("deadline", 10.0),
        env_file=None,
        **kwargs,
    )


def _load(client: Client, stop: threading.Event, log: list[tuple[float, float, str]]) -> None:
    """One caller: calls back to back, logging (start, end, backend)."""
    while not stop.is_set():
        start = time.monotonic()
        try:
            backend = client.chat(HI, max_tokens=4).backend
        except Exception as error:
            backend = type(error).__name__
        log.append((start, time.monotonic(), backend))


Log = list[tuple[float, float, str]]


def _with_callers(client: Client, seconds: float, act: Callable[[], float]) -> tuple[float, Log]:
    """Four callers in a loop; ``act()`` after half a second; stop ``seconds`` later."""
    stop = threading.Event()
    log: Log = []
    callers = [threading.Thread(target=_load, args=(client, stop, log)) for _ in range(4)]
    for caller in callers:
        caller.start()
    time.sleep(0.5)
    at = act()
    time.sleep(seconds)
    stop.set()
    for caller in callers:
        caller.join()
    return at, log


def hang_to_fallback(gpu: ServerProcess, hosted: ServerProcess) -> dict[str, float]:
    with _client(gpu.url + "/v1", hosted) as client:

        def hang() -> float:
            _faults(gpu, hang=True)
            return time.monotonic()

        at, log = _with_callers(client, 4.0, hang)
        stats = client.stats()
    _faults(gpu)
    after = sorted((end, start, backend) for start, end, backend in log if end > at)
    first_fallback = next(end for end, _, backend in after if backend == "hosted")
    # "Calls no longer wait": the first call that started after the hang and took less
    # than half the first-byte timeout while served by the fallback.
    fast = next(
        end
        for end, start, backend in after
        if start > at and backend == "hosted" and end - start < TIMEOUTS.first_byte / 2
    )
    return {
        "first_fallback_s": first_fallback - at,
        "no_wait_after_s": fast - at,
        "primary_timeouts": stats.by_backend["primary"].get("first_byte_timeout", 0),
    }


def open_breaker_latency(gpu: ServerProcess, hosted: ServerProcess) -> dict[str, float]:
    """The SDK's own time per call outside the HTTP attempt (call latency minus the served
    attempt's elapsed), with the primary's breaker open, against a client whose primary is
    the hosted backend itself. This isolates what skipping costs from the emulator's
    timing, which varies by tens of milliseconds with the order of requests."""
    latencies: dict[str, float] = {}

    def own_time(client: Client, name: str) -> list[float]:
        out = []
        for _ in range(200):
            result = client.chat(HI, max_tokens=4)
            assert name == "direct" or result.fallback_reason == "breaker_open"
            out.append(latencies.pop(result.request_id) - result.attempts[-1].elapsed)
        return out

    def hook(event: Event) -> None:
        if isinstance(event, CallFinished) and event.call_id is not None:
            latencies[event.call_id] = event.latency

    # Open for the whole measurement: no probe in the middle.
    stays_open = BreakerPolicy(consecutive_failures=1, open_for=600, max_open_for=600)
    direct = Client(primary=hosted.url + "/v1", model="hosted-mini", env_file=None, on_event=hook)
    with _client(gpu.url + "/v1", hosted, breaker=stays_open, on_event=hook) as client, direct:
        _faults(gpu, hang=True)
        client.chat(HI, max_tokens=4)  # opens the breaker
        _faults(gpu)
        via, plain = own_time(client, "via"), own_time(direct, "direct")
    return {
        "sdk_time_via_open_breaker_ms": statistics.median(via) * 1000,
        "sdk_time_direct_ms": statistics.median(plain) * 1000,
        "added_ms": (statistics.median(via) - statistics.median(plain)) * 1000,
        "flow_cpu_skip_and_fallback_us": _skip_cpu() * 1e6,
    }


def _skip_cpu() -> float:
    """CPU seconds for the flow to skip an open primary and send to the fallback, no I/O."""
    clock = FakeClock()
    primary = Backend(name="primary", base_url="http://p/v1")
    hosted = Backend(name="hosted", base_url="http://h/v1")
    policies = ClientState(
        ClientConfig(
            primaries=(primary,),
            fallbacks=(hosted,),
            breaker=BreakerPolicy(consecutive_failures=1, open_for=1e9, max_open_for=1e9),
        ),
        clock=clock,
    )
    policies.breaker(primary).record_failure(policies.breaker(primary).acquire()[0])
    ok = Response(status=200, headers={}, body=b"{}", elapsed=0.0)
    rounds = 20_000
    start = time.process_time()
    for n in range(rounds):
        flow = CallFlow(policies, request_id=str(n), body={"messages": HI})
        steps = flow.run()
        next(steps)  # the Send to the fallback
        with contextlib.suppress(StopIteration):
            steps.send(ok)
        flow.take_events()
    return (time.process_time() - start) / rounds


def attempts_per_call(gpu: ServerProcess, hosted: ServerProcess | None, calls: int) -> float:
    never_opens = BreakerPolicy(consecutive_failures=10**6, min_calls=10**6)
    _faults(gpu, error_rate=1.0, error_status=502)
    try:
        with _client(gpu.url + "/v1", hosted, breaker=never_opens, deadline=2.0) as client:
            stop = threading.Event()
            log: list[tuple[float, float, str]] = []
            callers = [threading.Thread(target=_load, args=(client, stop, log)) for _ in range(8)]
            for caller in callers:
                caller.start()
            while len(log) < calls:
                time.sleep(0.05)
            stop.set()
            for caller in callers:
                caller.join()
            stats = client.stats()
    finally:
        _faults(gpu)
    return stats.by_backend["primary"]["attempts"] / stats.calls


def recovery(gpu: ServerProcess, hosted: ServerProcess) -> dict[str, float]:
    with _client(gpu.url + "/v1", hosted) as client:
        _faults(gpu, hang=True)
        while client.stats().breakers.get("primary") != "open":
            client.chat(HI, max_tokens=4)

        def heal() -> float:
            _faults(gpu)
            return time.monotonic()

        at, log = _with_callers(client, 8.0, heal)
    back = min(end for start, end, backend in log if start > at and backend == "primary")
    return {"back_to_primary_s": back - at, "open_for_default_s": BreakerPolicy().open_for}


def main() -> None:
    with (
        emulator_process(speed=50) as gpu,
        emulator_process(speed=50, model="hosted-mini") as hosted,
    ):
        print("1. hang -> fallback:", hang_to_fallback(gpu, hosted))
        print("2. open breaker:", open_breaker_latency(gpu, hosted))
        print(
            "3. attempts per call, primary 502s everything, with fallback:",
            round(attempts_per_call(gpu, hosted, 300), 3),
        )
        print(
            "3. attempts per call, primary 502s everything, no fallback (2 s deadline):",
            round(attempts_per_call(gpu, None, 100), 3),
        )
        print("   budget:", RetryPolicy())
        print("4. recovery:", recovery(gpu, hosted))


if __name__ == "__main__":
    main()
