"""A hand driver for the call flow: scripted outcomes per backend, a fake clock, no HTTP.

Sends of a hedge's race (``Race``) run side by side in fake time: each ends ``elapsed``
seconds (its scripted outcome's) after it started; the driver jumps the clock to the
first end, or to the race's timeout when that comes first.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from tests.unit._policy_stubs import UpperRandom

from herdless._actions import (
    Accepted,
    Ended,
    Race,
    Response,
    Send,
    Sleep,
    SlotWait,
    TransportFailure,
)
from herdless._backend import Backend
from herdless._call.flow import CallFlow
from herdless._config import ClientConfig, ClientOptions
from herdless._drive import drive
from herdless._state import ClientState
from herdless.events import Event
from herdless.testing import FakeClock

Scripted = Response | TransportFailure | Callable[[Send], Response | TransportFailure]

PRIMARY = Backend(name="primary", base_url="http://gpu/v1", api_key="sk-primary-secret")
HOSTED = Backend(
    name="hosted",
    base_url="https://api.example/v1",
    api_key="sk-hosted",
    model="mini",
    external=True,
)


def ok(elapsed: float = 0.2) -> Response:
    body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
    return Response(status=200, headers={}, body=body, elapsed=elapsed)


def status(
    code: int,
    *,
    retry_after: float | None = None,
    error_code: str | None = None,
    drain: bool = False,
    elapsed: float = 0.01,
) -> Response:
    headers = {}
    if retry_after is not None:
        headers["retry-after-ms"] = str(int(retry_after * 1000))
        headers["Retry-After"] = str(int(retry_after + 0.999))
    if drain:
        headers["X-Herdless-Drain"] = "1"
    body = {"error": {"message": f"server says {code}", "type": "x", "code": error_code}}
    return Response(status=code, headers=headers, body=json.dumps(body).encode(), elapsed=elapsed)


def failure(kind: str, elapsed: float = 0.01) -> TransportFailure:
    return TransportFailure(kind=kind, message=f"{kind} happened", elapsed=elapsed)  # type: ignore[arg-type]  # kinds come as str


def hang(send: Send) -> TransportFailure:
    """A backend that accepts and says nothing: the attempt lasts its whole first-byte limit."""
    return failure("first_byte_timeout", elapsed=send.timeouts.first_byte)


class Driver:
    """Runs flows against scripted backends, recording every Send, Sleep and event."""

    def __init__(self, policies: ClientState, clock: FakeClock, **script: list[Scripted]) -> None:
        self.policies = policies
        self.clock = clock
        self.script = script
        self.sends: list[Send] = []
        self.sleeps: list[float] = []
        self.events: list[Event] = []
        self.log: list[object] = []  # sends, sleeps and events in order
        self.raced: list[Send] = []  # sends started by a Race (a subset of sends)
        self.cancelled: list[Send] = []  # raced sends the flow moved on from, unreported
        self.race_timeouts: list[float | None] = []
        # Raced sends running: (when it ends, order, send, outcome).
        self._running: list[tuple[float, int, Send, Response | TransportFailure]] = []
        self._flow: CallFlow | None = None  # the flow being driven

    def start(self, **call: Any) -> CallFlow:
        call.setdefault("request_id", f"req-{len(self.sends)}")
        call.setdefault("body", {"messages": [{"role": "user", "content": "hi"}]})
        return CallFlow(self.policies, **call)

    def run(self, **call: Any) -> Accepted:
        return self.drive(self.start(**call))

    def drive(self, flow: CallFlow) -> Accepted:
        """Run ``flow`` with the clients' own loop (``herdless._drive.drive``)."""
        self._flow = flow
        return drive(flow.run(), self)

    # -- the Performer: how each action is performed, in fake time --------------------------

    def deliver(self) -> None:
        if self._flow is not None:
            self._take(self._flow)

    def send(self, send: Send, /) -> Response | TransportFailure:
        return self.perform(send)

    def sleep(self, seconds: float, /) -> None:
        self.sleeps.append(seconds)
        self.log.append(Sleep(seconds=seconds))
        self.clock.advance(seconds)

    def slot_wait(self, wait: SlotWait, /) -> None:
        # One call at a time: nobody frees the slot meanwhile, so unless it is decided
        # already the wait lasts its whole timeout.
        woken: list[bool] = []
        wait.listen(functools.partial(woken.append, True))
        self.log.append(wait)
        if not woken:
            self.clock.advance(wait.timeout)

    def race(self, action: Race) -> Ended | None:
        """Start ``action.send`` in fake time; end the first running send, or time out."""
        self.race_timeouts.append(action.timeout)
        now = self.clock.monotonic()
        if action.send is not None:
            send = action.send
            self.sends.append(send)
            self.raced.append(send)
            self.log.append(send)
            outcome = self._scripted(send)
            self._running.append((now + outcome.elapsed, len(self.raced), send, outcome))
        assert self._running, "a Race with nothing running"
        end, order, send, outcome = min(self._running, key=lambda item: (item[0], item[1]))
        if action.timeout is not None and now + action.timeout < end:
            self.clock.advance(action.timeout)
            return None
        self._running.remove((end, order, send, outcome))
        self.clock.advance(max(0.0, end - now))
        return Ended(send=send, outcome=outcome)

    def cancel(self) -> None:
        self.cancelled += [send for _, _, send, _ in self._running]
        self._running = []

    def perform(self, send: Send) -> Response | TransportFailure:
        self.sends.append(send)
        self.log.append(send)
        outcome = self._scripted(send)
        self.clock.advance(outcome.elapsed)
        return outcome

    def _scripted(self, send: Send) -> Response | TransportFailure:
        queue = self.script[send.backend.name]
        scripted = queue.pop(0) if len(queue) > 1 else queue[0]  # the last one repeats
        return scripted(send) if callable(scripted) else scripted

    def _take(self, flow: CallFlow) -> None:
        events = flow.take_events()
        self.events.extend(events)
        self.log.extend(events)

    def of(self, kind: type[Event]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]

    def sent_to(self) -> list[str]:
        return [send.backend.name for send in self.sends]


def make(
    primary_script: list[Scripted] | None = None,
    hosted: list[Scripted] | None = None,
    *,
    fallback: list[Backend] | None = None,
    **kwargs: Any,
) -> Driver:
    clock = FakeClock()
    script: dict[str, list[Scripted]] = {"primary": primary_script or [ok()]}
    if hosted is not None:
        script["hosted"] = hosted
    if fallback is None:
        fallback = [HOSTED] if hosted is not None else []
    primary = kwargs.pop("primary", PRIMARY)
    options: ClientOptions = {"fallback": fallback, "model": "llama", **kwargs}  # type: ignore[typeddict-item]  # tests pass any option
    config = ClientConfig.build(primary, options)
    policies = ClientState(config, clock=clock, rng=UpperRandom(), wall=lambda: 0.0)
    return Driver(policies, clock, **script)
