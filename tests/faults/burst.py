"""A small burst of SDK calls through the stack, and the accounting of how each one ended."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.faults.stack import API_KEY, Stack

from herdless import Backend, BreakerPolicy, Client, HerdlessError, RetryPolicy, Timeouts
from herdless.events import AttemptStarted, Event

DEADLINE = 4.0  # seconds, per call: a call must end (result or typed error) before it
SLACK = 1.5  # thread scheduling on a loaded 2-core machine, on top of the deadline
CALLS = 12
MESSAGES = [{"role": "user", "content": "Say something about herds."}]


@dataclass
class Tally:
    """How the calls of one scenario ended."""

    calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # backend name or error class
    hung: int = 0  # calls still running long after their deadline
    late: int = 0  # calls that ended, but after deadline + slack
    guard_violations: int = 0  # allow_fallback=False attempts that reached the hosted model
    max_latency: float = 0.0
    untyped: list[str] = field(default_factory=list)  # exceptions that are not HerdlessError

    @property
    def results(self) -> int:
        return sum(n for name, n in self.outcomes.items() if name in ("gateway", "hosted"))

    @property
    def errors(self) -> int:
        return sum(n for name, n in self.outcomes.items() if name not in ("gateway", "hosted"))


class Clients:
    """Two SDK clients on the stack: one whose calls may fall back, one whose may not."""

    def __init__(self, stack: Stack, seed: int) -> None:
        self.strict_attempts: list[AttemptStarted] = []
        self._lock = threading.Lock()
        self.free = self._client(stack, seed, on_event=None)
        self.strict = self._client(stack, seed + 1, on_event=self._record_strict)

    def _record_strict(self, event: Event) -> None:
        if isinstance(event, AttemptStarted):
            with self._lock:
                self.strict_attempts.append(event)

    @staticmethod
    def _client(stack: Stack, seed: int, on_event: object) -> Client:
        return Client(
            primary=Backend(name="gateway", base_url=stack.gateway.url + "/v1", api_key=API_KEY),
            fallback=Backend(
                name="hosted",
                base_url=stack.hosted.url + "/v1",
                api_key="sk-hosted-secret",
                model="hosted-mini",
                external=True,
            ),
            model="local-llm",
            deadline=DEADLINE,
            timeouts=Timeouts(connect=0.5, first_byte=1.0, read=1.0),
            retry=RetryPolicy(max_attempts=3, base=0.1, cap=0.5, max_retry_after=2.0),
            breaker=BreakerPolicy(consecutive_failures=3, min_calls=5, window=10.0, open_for=1.0),
            rng=random.Random(seed),
            on_event=on_event,  # type: ignore[arg-type]
            env_file=None,
        )

    def strict_attempts_hosted(self) -> list[AttemptStarted]:
        """Attempts of ``allow_fallback=False`` calls that went to the external backend."""
        return [event for event in self.strict_attempts if event.backend == "hosted"]

    def close(self) -> None:
        self.free.close()
        self.strict.close()


def one_call(clients: Clients, index: int, start_at: float) -> tuple[str, float]:
    """Call ``index`` of a burst: every third may not fall back, every other one streams."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    strict = index % 3 == 0
    client = clients.strict if strict else clients.free
    began = time.monotonic()
    try:
        if index % 2:
            with client.chat(MESSAGES, max_tokens=16, stream=True, allow_fallback=not strict) as s:
                "".join(chunk.content for chunk in s)
                backend = s.backend
        else:
            backend = client.chat(MESSAGES, max_tokens=16, allow_fallback=not strict).backend
    except HerdlessError as exc:
        backend = type(exc).__name__
    return backend, time.monotonic() - began


def burst(
    clients: Clients, tally: Tally, *, inject: object = None, inject_at: float = 0.25
) -> None:
    """Run ``CALLS`` calls staggered over ~0.6 s; ``inject()`` runs ``inject_at`` s in."""
    begin = time.monotonic() + 0.05
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(one_call, clients, i, begin + 0.05 * i) for i in range(CALLS)]
        if inject is not None:
            time.sleep(max(0.0, begin + inject_at - time.monotonic()))
            inject()  # type: ignore[operator]
        for future in futures:
            tally.calls += 1
            try:
                backend, elapsed = future.result(timeout=DEADLINE + 10.0)
            except TimeoutError:
                tally.hung += 1
                continue
            except Exception as exc:  # not a HerdlessError: a defect, reported in the table
                tally.untyped.append(f"{type(exc).__name__}: {exc}")
                tally.outcomes[type(exc).__name__] += 1
                continue
            tally.outcomes[backend] += 1
            tally.max_latency = max(tally.max_latency, elapsed)
            tally.late += elapsed > DEADLINE + SLACK
