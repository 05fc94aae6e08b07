"""One call's stay at one backend: the checks, the attempt, the verdict, in a loop.

``serve`` is what ``CallFlow.run`` runs for each backend of the route, in order. The
rules themselves are the small functions of ``herdless._checks`` and
``herdless._attempt`` (``send``, ``judge``); this loop only strings them together and
turns their decisions into actions for the driver::

    until the backend answers, or the call must move on or end:
        ask each check (hold, window, budget, pacing, spend, breaker)
        if none is in the way: send the attempt (hedged, ``herdless._race``, when the
            client hedges and this is the route's first backend), judge its outcome
        a wait: announce it (event), then Sleep / SlotWait
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from typing import Any

from herdless._actions import Accepted, Action, Sleep, SlotWait
from herdless._attempt import judge, send
from herdless._call import Call, Stay
from herdless._checks import Decision, Fail, Move, Queue, Wait, checks_for
from herdless._race import race
from herdless.events import RetryScheduled, WaitScheduled

__all__ = ["serve"]


def serve(
    call: Call, stay: Stay, pending: Generator[Action, Any, Decision | Accepted] | None = None
) -> Generator[Action, Any, Accepted | Move | Fail]:
    """One call's stay at ``stay.backend``. Returns the answer, or why the call moves on
    (``Move``) or ends (``Fail``); raises at once for a request no backend can serve.

    ``pending``: the stay begins with an attempt already in flight (a hedge the call
    moved to, ``herdless._race.awaiting``): its verdict comes first, then the loop."""
    clock = call.state.clock
    checks = checks_for(stay)
    accepted = False
    try:
        while True:
            now = clock.monotonic()
            decision: Decision | Accepted = None
            if pending is not None:
                decision = yield from pending
                pending = None
                if decision is None:
                    continue
            else:
                for check in checks:
                    decision = check(call, stay, now)
                    if decision is not None:
                        break
                else:
                    action = send(call, stay, now)
                    if stay.backup is None:
                        outcome = yield action
                        if outcome is None:
                            raise TypeError(
                                "the driver must send the outcome of a Send action, not None"
                            )
                        decision = judge(call, stay, outcome)
                    else:  # a client that hedges, at the route's first backend
                        decision = yield from race(call, stay, action)
                    if decision is None:  # retry as soon as the checks let it
                        continue
            if isinstance(decision, Wait):
                _announce(call, stay, decision)
                if decision.until_release and stay.slot is not None:
                    yield SlotWait(
                        listen=functools.partial(stay.window.on_release, stay.slot),
                        timeout=decision.seconds,
                    )
                    stay.waited += clock.monotonic() - now
                else:
                    yield Sleep(seconds=decision.seconds)
                    stay.waited += decision.seconds
            elif isinstance(decision, Queue):
                yield SlotWait(
                    listen=functools.partial(stay.window.listen, decision.ticket),
                    timeout=max(0.0, decision.timeout),
                )
            else:
                accepted = isinstance(decision, Accepted)
                return decision
    finally:
        if accepted and call.stream:
            call.hold_slot(stay)  # a stream holds its slot until it ends
        stay.leave()


def _announce(call: Call, stay: Stay, wait: Wait) -> None:
    """The event that announces a wait, before it starts."""
    name = stay.backend.name
    if wait.retry:
        call.emit(
            RetryScheduled, backend=name, attempt=stay.attempt, delay=wait.seconds, reason=wait.why
        )
    else:
        call.emit(WaitScheduled, backend=name, delay=wait.seconds, reason=wait.why)
