"""The fair queue: who waits, in which order, and what each user was served (pure, no I/O).

Waiters are kept per **flow**: the requests of one user in one priority class, in
arrival order. A user is a key id, refined by the user the request names (the
OpenAI ``user`` field, or ``X-Herdless-User``): ``key-1a2b3c4d`` or
``key-1a2b3c4d/u-5e6f...``. When a slot frees, :meth:`FairQueue.head` names the
next request to start (scheduler ``vtc``):

1. **class**: every interactive waiter before any batch one;
2. **key**: among the keys with waiters in the class, the one with the least counter;
3. **user**: among that key's users with waiters, the one with the least counter;
4. **FIFO** within the user.

Two levels, so that a key cannot take more of the GPU by naming more users: keys
share fairly, then the users of a key share the key's part.

**Counters** (the Virtual Token Counter of Sheng et al., OSDI 2024, with its
length prediction). A request that starts is charged to its user's and its key's
counter, in its class::

    charge = prompt_weight * prompt + completion_weight * predicted
    predicted = min(max_tokens, the user's average completion), max_tokens before any

where the average is an EWMA (weight 0.2, VTC's window of five) of the user's
completions; one cut at its ``max_tokens`` raises it and never lowers it (its own
length is longer and unknown). A request that names no ``max_tokens`` is priced at the
gateway's ``default_max_tokens``: that is its prediction before any, never a cap. When
the request ends and vLLM reported its usage, the charge is settled to
``prompt_weight * prompt_tokens + completion_weight * completion_tokens`` (the
difference is added, or given back). The defaults weigh a completion token twice a
prompt token, as VTC does: decoding a token costs the GPU a step, while a prompt is
read in a batched pass.

**Lift.** A user (or key) that starts waiting takes ``max(own counter, the least
counter of those already waiting)``; when nobody waits, ``max(own, the counter of
the last one that stopped waiting)``. A user who was away banks no credit, and one
who used more than the others keeps its debt.

**Bound.** While two users both wait, and their answers are as long as predicted
(steady lengths, or ``ignore_eos``), the service they are charged never differs
by more than the largest charge of one request, so over any interval their service
differs by at most twice that (VTC's bound). A prediction that was off moves a
counter when its request ends, by the tokens mispredicted.

The reference schedulers keep the same flows: ``round-robin`` serves the keys, then
the users of a key, in turn by requests (the gateway's order before ``vtc``), and
``fcfs`` serves the oldest waiter first. Both ignore the classes (their callers
put every request in ``interactive``).

**A full queue** (``vtc``) gives way to an arrival: an interactive one takes the place
of the newest batch waiter of the batch user served most (:meth:`FairQueue.victim`);
else an arrival takes the place of the user of its class that waits in the most places,
two or more beyond its own (:meth:`FairQueue.longest`: a switch's longest-queue drop), so
one user cannot hold the queue against the others.

**Bounded.** At most ``max_users`` flows are remembered. A new one replaces the
least recently used flow that neither waits nor runs (among the oldest 16); when
there is none, the request joins its key's ``other`` flow (one per key and class,
beyond the bound). A forgotten user starts again from the lift, like a new one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

from herdless.gateway.core.decisions import Ticket
from herdless.gateway.core.limits import CLASSES, AdmissionConfig, Priority
from herdless.gateway.core.service import ServiceWindow, average_answer, jain_index

__all__ = ["OVERFLOW", "FairQueue", "Flow"]

OVERFLOW = "other"
"""The user of a key's overflow flow, used while the user table is full of busy flows."""

_EVICT_SCAN = 16  # oldest flows looked at for one to forget: bounded work per new user


class _Member:
    """What a fair level compares: a counter (a key, or a flow within its key)."""

    __slots__ = ("counter",)

    def __init__(self) -> None:
        self.counter = 0.0


class _KeyLevel(_Member):
    """One key in one class: its counter and its users that wait, in turn order."""

    __slots__ = ("id", "last_left", "waiting")

    def __init__(self, key_id: str) -> None:
        super().__init__()
        self.id = key_id
        self.waiting: dict[str, Flow] = {}  # label -> flow; insertion order is the turn
        self.last_left = -math.inf  # counter of the last of its flows to stop waiting


class Flow(_Member):
    """One user's requests of one class: FIFO, counter, reservation horizon.

    Attributes:
        label: the fairness unit (``key`` or ``key/user``).
        user: the user hash, or ``None``.
        priority: the class.
        waiting: its queued tickets, oldest first.
        running: its tickets running upstream.
        horizon: the latest time a queue refusal promised one of its callers.
        since: when it started waiting (``None`` while it does not).
    """

    __slots__ = (
        "horizon",
        "label",
        "owner",
        "predicted",
        "priority",
        "running",
        "since",
        "user",
        "waiting",
        "window",
    )

    def __init__(
        self, label: str, user: str | None, priority: Priority, owner: _KeyLevel, window: int
    ) -> None:
        super().__init__()
        self.label = label
        self.user = user
        self.priority: Priority = priority
        self.owner = owner
        self.waiting: deque[Ticket] = deque()
        self.running = 0
        self.predicted: float | None = None  # EWMA of its completions (tokens)
        self.horizon = -math.inf
        self.since: float | None = None
        self.window = ServiceWindow(window)

    @property
    def busy(self) -> bool:
        """Whether it waits or runs (a busy flow is never forgotten)."""
        return bool(self.waiting) or self.running > 0


class _Class:
    """One priority class: its keys and those with waiters, in turn order."""

    __slots__ = ("depth", "keys", "last_left", "waiting")

    def __init__(self) -> None:
        self.keys: dict[str, _KeyLevel] = {}  # every key seen (bounded by the configured keys)
        self.waiting: dict[str, _KeyLevel] = {}  # keys with waiters; insertion order is the turn
        self.last_left = -math.inf
        self.depth = 0


def _lift(member: _Member, waiting: dict[str, _KeyLevel] | dict[str, Flow], floor: float) -> None:
    """VTC's lift: ``max(own, least counter of those waiting)``, else ``max(own, floor)``."""
    least = min((m.counter for m in waiting.values()), default=floor)
    member.counter = max(member.counter, least)


class FairQueue:
    """The waiters of every class and user, their order, and the service counters.

    Not thread-safe: one event loop drives it (through ``Admission``).
    """

    __slots__ = ("_classes", "_config", "_flows", "_wp", "_wq", "served_tokens")

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self._wp = config.prompt_weight
        self._wq = config.completion_weight
        self._classes = {name: _Class() for name in CLASSES}
        # Every flow remembered, least recently used first (a dict is an ordered set).
        self._flows: dict[tuple[Priority, str], Flow] = {}
        self.served_tokens: dict[Priority, int] = dict.fromkeys(CLASSES, 0)
        """Tokens (prompt + completion) of the finished requests, per class."""

    def reconfigure(self, config: AdmissionConfig) -> None:
        """New weights (a reload); the flows, their counters and the waiters stay."""
        self._config = config
        self._wp = config.prompt_weight
        self._wq = config.completion_weight

    # -- observation ---------------------------------------------------------------------

    def depth(self, priority: Priority) -> int:
        """Requests of ``priority`` waiting."""
        return self._classes[priority].depth

    def __len__(self) -> int:
        """Flows remembered."""
        return len(self._flows)

    def waiting(self) -> Iterator[Ticket]:
        """Every waiting ticket (for a drain), interactive first."""
        for cls in self._classes.values():
            for key in cls.waiting.values():
                for flow in key.waiting.values():
                    yield from flow.waiting

    def counter(self, priority: Priority, unit: str) -> float | None:
        """The counter of a flow (``None`` when it is not remembered)."""
        flow = self._flows.get((priority, unit))
        return None if flow is None else flow.counter

    # -- flows -----------------------------------------------------------------------------

    def flow(self, priority: Priority, key_id: str, user: str | None) -> Flow:
        """The flow of ``user`` of ``key_id`` in ``priority``, remembered (or its key's
        overflow flow when the table is full of busy flows); marks it recently used."""
        label = key_id if user is None else f"{key_id}/{user}"
        table = self._flows
        flow = table.pop((priority, label), None)
        if flow is None:
            if len(table) >= self._config.max_users and not self._forget_one():
                user, label = OVERFLOW, f"{key_id}/{OVERFLOW}"
                flow = table.pop((priority, label), None)
            if flow is None:
                cls = self._classes[priority]
                owner = cls.keys.get(key_id)
                if owner is None:
                    owner = cls.keys[key_id] = _KeyLevel(key_id)
                flow = Flow(label, user, priority, owner, math.ceil(self._config.fair_window))
        table[(priority, label)] = flow  # most recently used last
        return flow

    def _forget_one(self) -> bool:
        for scanned, (ident, flow) in enumerate(self._flows.items()):
            if scanned >= _EVICT_SCAN:
                return False
            if not flow.busy:
                del self._flows[ident]
                return True
        return False

    def flow_of(self, ticket: Ticket) -> Flow:
        """The flow of a live ticket (a busy flow is never forgotten)."""
        return self._flows[(ticket.priority, ticket.unit)]

    # -- waiting -----------------------------------------------------------------------------

    def push(self, flow: Flow, ticket: Ticket, now: float) -> None:
        """Queue ``ticket`` at the end of ``flow`` (lifting the flow and its key if they
        start waiting now)."""
        if not flow.waiting:
            cls = self._classes[flow.priority]
            key = flow.owner
            if not key.waiting:
                _lift(key, cls.waiting, cls.last_left)
                cls.waiting[key.id] = key
            _lift(flow, key.waiting, key.last_left)
            key.waiting[flow.label] = flow
            flow.since = now
        flow.waiting.append(ticket)
        self._classes[flow.priority].depth += 1

    def head(self, priority: Priority) -> Ticket | None:
        """The next ticket of ``priority`` to start, by the scheduler's order."""
        cls = self._classes[priority]
        if not cls.waiting:
            return None
        scheduler = self._config.scheduler
        if scheduler == "fcfs":
            heads = (f.waiting[0] for k in cls.waiting.values() for f in k.waiting.values())
            return min(heads, key=lambda ticket: ticket.id)
        if scheduler == "vtc":
            # min() keeps the first of equals: ties go to whoever started waiting first.
            key = min(cls.waiting.values(), key=lambda k: k.counter)
            flow = min(key.waiting.values(), key=lambda f: f.counter)
        else:  # round-robin: the first in turn, moved to the back once served
            key = next(iter(cls.waiting.values()))
            flow = next(iter(key.waiting.values()))
        return flow.waiting[0]

    def remove(self, ticket: Ticket, *, served: bool = False) -> None:
        """Take ``ticket`` out of the queue: started (``served``), or gone."""
        flow = self.flow_of(ticket)
        if flow.waiting[0] is ticket:
            flow.waiting.popleft()
        else:
            flow.waiting.remove(ticket)
        cls = self._classes[flow.priority]
        cls.depth -= 1
        key = flow.owner
        if not flow.waiting:
            del key.waiting[flow.label]
            key.last_left = flow.counter
            flow.since = None
            if not key.waiting:
                del cls.waiting[key.id]
                cls.last_left = key.counter
                return
        elif served and self._config.scheduler == "round-robin":
            key.waiting[flow.label] = key.waiting.pop(flow.label)  # to the back of its key
        if served and self._config.scheduler == "round-robin":
            cls.waiting[key.id] = cls.waiting.pop(key.id)  # the key to the back of the class

    def victim(self, key_id: str | None) -> Ticket | None:
        """The batch ticket an interactive arrival displaces from a full queue: the
        newest of the batch user served last (of ``key_id`` only, when given)."""
        cls = self._classes["batch"]
        if key_id is not None:
            key = cls.waiting.get(key_id)
            keys = [] if key is None else [key]
        else:
            keys = list(cls.waiting.values())
        if not keys:
            return None
        key = max(keys, key=lambda k: k.counter)
        flow = max(key.waiting.values(), key=lambda f: f.counter)
        return flow.waiting[-1]

    def longest(self, flow: Flow, key_id: str | None) -> Ticket | None:
        """The waiter an arrival of ``flow`` displaces from a full queue: the newest that
        returns of the user of its class that waits in the most places, when that is at
        least two more than ``flow`` waits in (so that the two never swap), ties to the
        one served most (of ``key_id`` only, when given)."""
        cls = self._classes[flow.priority]
        if key_id is None:
            keys = list(cls.waiting.values())
        else:
            key = cls.waiting.get(key_id)
            keys = [] if key is None else [key]
        flows = (f for k in keys for f in k.waiting.values())
        most = max(flows, key=lambda f: (len(f.waiting), f.counter), default=None)
        if most is None or len(most.waiting) < len(flow.waiting) + 2:
            return None
        return next((t for t in reversed(most.waiting) if t.returns), None)

    # -- service ----------------------------------------------------------------------------

    def start(self, ticket: Ticket, flow: Flow, now: float) -> None:
        """``ticket`` starts: charge its user and key (see the module docstring)."""
        budget = ticket.price - ticket.prompt  # its max_tokens, or the default's
        predicted = budget if flow.predicted is None else min(ticket.answer_cap, flow.predicted)
        charge = self._wp * ticket.prompt + self._wq * predicted
        ticket.charged = charge
        flow.counter += charge
        flow.owner.counter += charge
        flow.running += 1
        flow.window.add(now, charge)

    def finish(
        self,
        ticket: Ticket,
        now: float,
        *,
        prompt: int | None,
        completion: int | None,
        learn: bool = True,
    ) -> None:
        """A started ``ticket`` ended; settle its charge when the usage is known (``learn``:
        its answer is whole, and counts in the flow's predicted answer)."""
        flow = self.flow_of(ticket)
        flow.running -= 1
        if completion is None:
            # No usage (a stream without it, a client that left): the charge stands.
            self.served_tokens[flow.priority] += ticket.price
            return
        prompt = ticket.prompt if prompt is None else prompt
        self.served_tokens[flow.priority] += prompt + completion
        delta = self._wp * prompt + self._wq * completion - ticket.charged
        ticket.charged += delta
        flow.counter += delta
        flow.owner.counter += delta
        flow.window.settle(now if ticket.started_at is None else ticket.started_at, now, delta)
        if learn:
            flow.predicted = average_answer(flow.predicted, completion, ticket.answer_cap)

    # -- places -----------------------------------------------------------------------------

    def share(self, flow: Flow) -> float:
        """The share of the slots that free which goes to ``flow`` while it waits: one
        over (keys waiting in its class x users of its key waiting), itself counted;
        1 under ``fcfs`` (one line for all)."""
        if self._config.scheduler == "fcfs":
            return 1.0
        cls = self._classes[flow.priority]
        key = flow.owner
        keys = len(cls.waiting) + (key.id not in cls.waiting)
        users = len(key.waiting) + (not flow.waiting)
        return 1.0 / (keys * users)

    def place(self, flow: Flow) -> int:
        """About how many waiters start before a new request of ``flow``, plus one: its
        own waiters and, at its share, the others' (every interactive waiter first
        for a batch one); under ``fcfs``, every waiter."""
        cls = self._classes[flow.priority]
        if self._config.scheduler == "fcfs":
            return cls.depth + 1  # one line: behind every waiter
        own = len(flow.waiting) + 1
        place = min(cls.depth + 1, math.ceil(own / self.share(flow)))
        if flow.priority == "batch":
            place += self._classes["interactive"].depth
        return place

    def fairness(self, priority: Priority, now: float) -> float:
        """Jain's index of the weighted tokens charged over the last ``fair_window``
        seconds to the users of ``priority`` that waited throughout it (1.0 when fewer
        than two did)."""
        since = now - self._config.fair_window
        cls = self._classes[priority]
        served = [
            flow.window.total(now)
            for key in cls.waiting.values()
            for flow in key.waiting.values()
            if flow.since is not None and flow.since <= since
        ]
        return jain_index(served)

    def service(self, now: float) -> dict[str, float]:
        """Weighted tokens charged per user (``key`` or ``key/user``) over the last
        ``fair_window`` seconds, both classes together; users with none are left out."""
        oldest = math.floor(now) - math.ceil(self._config.fair_window)
        served: dict[str, float] = {}
        for flow in self._flows.values():
            if flow.window.last > oldest:  # skips the idle flows cheaply
                tokens = flow.window.total(now)
                if tokens:
                    served[flow.label] = served.get(flow.label, 0.0) + tokens
        return served
