"""The gateway's admission core as a hypothesis state machine.

Invariants: every waiter starts once the running requests end (none is held for ever),
never more than ``max_concurrency`` running upstream, never more than
``max_queue`` waiting (nor more than a key's share), the KV budget never exceeded,
the core's counters equal the live tickets (per class too), a refused request always
says when to come back (``0 < retry_after <= max_retry_after``), each user's queue
reservations are handed out in order (a kept request told a place past its hold takes
none), only waiting requests are displaced (``vtc``):
batch ones by an interactive arrival, or those whose client comes back of the user of the
arrival's class that waited in two or more places beyond the arrival's own, and
token-budget tokens are conserved: a request
that never ran gives its whole price back, and no sequence of offers, releases,
expiries, displacements and drains ever mints tokens beyond what the clock refilled.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.property._profile import PROPERTY
from tests.property._tokens import assert_never_minted, level

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.limits import AdmissionConfig, Priority
from herdless.testing import FakeClock

KEYS = st.sampled_from(["key-a", "key-b", "key-c"])
USERS = st.sampled_from([None, "u-1", "u-2"])
PRIORITIES = st.sampled_from(["interactive", "batch"])


class AdmissionMachine(RuleBasedStateMachine):
    """Offers from three keys, releases, dispatches, expiries, drains, upstream flaps."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.config = AdmissionConfig()
        self.adm = Admission(self.config, clock=self.clock)
        self.tickets: list[Ticket] = []  # every ticket handed out, live or done
        self.refilled: dict[str, float] = {}  # key -> tokens the clock refilled since creation
        self.last_queue_retry_at: dict[tuple[str, str], float] = {}  # per class and user
        self.told: dict[tuple[str, str], float] = {}  # per call: the time its last refusal named

    @initialize(
        max_concurrency=st.integers(1, 4),
        max_queue=st.integers(0, 5),
        share=st.sampled_from([0.5, 1.0]),
        rate=st.none() | st.sampled_from([1.0, 5.0]),
        tpm=st.none() | st.sampled_from([600, 6000]),
        kv=st.none() | st.sampled_from([300, 1000]),
        scheduler=st.sampled_from(["vtc", "vtc", "round-robin", "fcfs"]),
    )
    def build(
        self,
        max_concurrency: int,
        max_queue: int,
        share: float,
        rate: float | None,
        tpm: int | None,
        kv: int | None,
        scheduler: str,
    ) -> None:
        self.config = AdmissionConfig(
            scheduler=scheduler,  # type: ignore[arg-type]
            max_concurrency=max_concurrency,
            max_queue=max_queue,
            key_queue_share=share,
            rate=rate,
            tokens_per_minute=tpm,
            max_inflight_tokens=kv,
            queue_timeout=5.0,
            max_retry_after=30.0,
        )
        self.adm = Admission(self.config, clock=self.clock)

    # -- helpers --------------------------------------------------------------------------

    def _live(self, state: str) -> list[Ticket]:
        return [t for t in self.tickets if t.state == state]

    # -- rules ----------------------------------------------------------------------------

    @rule(
        key_id=KEYS,
        price=st.integers(1, 1200),
        user=USERS,
        priority=PRIORITIES,
        prompt=st.none() | st.integers(0, 400),
        call=st.none() | st.sampled_from(["req-1", "req-2", "req-3"]),  # a herdless client's
        kept_back=st.booleans(),  # without a call: another client's, its retry kept
        kept_for=st.none() | st.sampled_from([0.5, 5.0]),  # without a call: a kept request
    )
    def offer(
        self,
        key_id: str,
        price: int,
        user: str | None,
        priority: Priority,
        prompt: int | None,
        call: str | None,
        kept_back: bool,
        kept_for: float | None = None,
    ) -> None:
        self.refilled.setdefault(key_id, 0.0)
        before = {t: t.state for t in self.tickets}
        klass = priority if self.config.scheduler == "vtc" else "interactive"
        unit = key_id if user is None else f"{key_id}/{user}"
        places: dict[tuple[str, str], int] = {}  # (class, user) -> places it waits in
        for t in self._live("queued"):
            places[(t.priority, t.unit)] = places.get((t.priority, t.unit), 0) + 1
        kept_for = None if call is not None else kept_for
        flow = self.adm.queue.flow(klass, key_id, user)
        horizon = flow.horizon
        decision = self.adm.offer(
            key_id, price, user=user, priority=priority, prompt=prompt, call=call,
            returns=call is not None, kept_back=kept_back and call is None, kept_for=kept_for,
        )  # fmt: skip
        if isinstance(decision, Admit | Enqueued):
            ticket = decision.ticket
            self.tickets.append(ticket)
            assert ticket.state == ("running" if isinstance(decision, Admit) else "queued")
            assert (ticket.priority, ticket.unit) == (klass, unit)
            for victim, refused in getattr(decision, "displaced", ()):
                assert self.config.scheduler == "vtc", "only vtc displaces"
                assert before[victim] == "queued", "only a waiter is displaced"
                assert victim.state == "done"
                if (klass, victim.priority) != ("interactive", "batch"):
                    assert victim.returns, "only a waiter whose client comes back"
                    assert victim.priority == klass, "only a waiter of the arrival's class"
                    mine = places.get((klass, unit), 0)
                    assert places[(klass, victim.unit)] >= mine + 2, "only the busiest's"
                assert (refused.status, refused.code) == (429, "displaced")
                assert 0 < refused.retry_after <= self.config.max_retry_after
                self._check_queue_order(refused, victim.priority, victim.unit)
            return
        assert isinstance(decision, Refuse)
        if decision.status in (429, 503):
            assert 0 < decision.retry_after <= self.config.max_retry_after, decision
        else:
            assert decision.status == 400
            assert decision.code == "request_too_large"
        if decision.code in ("queue_full", "kv_budget"):
            at = self.clock.monotonic() + decision.retry_after
            mine = None if call is None else (key_id, call)
            if mine is not None and abs(at - self.told.get(mine, -1.0)) < 1e-9:
                return  # back before its time, which it keeps: told before the later ones
            self._check_queue_order(decision, klass, unit)
            if kept_for is not None and decision.retry_after > kept_for:
                assert flow.horizon == horizon, "a kept request's answer took a place"
            if mine is not None:
                self.told[mine] = at

    @rule(key_id=KEYS, user=USERS, price=st.integers(1, 300))
    def batch_flood_then_a_chat(self, key_id: str, user: str | None, price: int) -> None:
        """Batch work fills the queue, then a chat arrives (the displacement case)."""
        for _ in range(self.config.max_concurrency + self.config.max_queue):
            self.offer(key_id, price, user, "batch", None, None, False)
        self.offer(key_id, price, "u-chat", "interactive", None, None, False)

    @rule(key_id=KEYS, price=st.integers(1, 300))
    def one_user_fills_the_queue_then_another_comes(self, key_id: str, price: int) -> None:
        """A herdless client's user fills the queue, then a new user arrives (the other
        displacement case)."""
        for _ in range(self.config.max_concurrency + self.config.max_queue):
            self.offer(key_id, price, "u-heavy", "interactive", None, "req-1", False)
        self.offer(key_id, price, "u-new", "interactive", None, None, True)

    def _check_queue_order(self, refused: Refuse, klass: str, unit: str) -> None:
        at = self.clock.monotonic() + refused.retry_after
        last = self.last_queue_retry_at.get((klass, unit), float("-inf"))
        assert at >= last - 1e-9, "a later refusal of a user was told an earlier time"
        self.last_queue_retry_at[(klass, unit)] = at

    @precondition(lambda self: any(t.state != "done" for t in self.tickets))
    @rule(index=st.integers(0, 100), used=st.none() | st.integers(0, 1500))
    def release(self, index: int, used: int | None) -> None:
        live = [t for t in self.tickets if t.state != "done"]
        ticket = live[index % len(live)]
        before = level(self.adm, ticket.key_id)
        was_queued = ticket.state == "queued"
        self.adm.release(ticket, used_tokens=used)
        assert ticket.state == "done"
        self.adm.release(ticket, used_tokens=used)  # idempotent: a second release is a no-op
        after = level(self.adm, ticket.key_id)
        if before is not None and after is not None and was_queued:
            # Never ran: the whole price comes back (up to the bucket's size).
            bucket = self.adm._keys[ticket.key_id].tokens
            assert bucket is not None
            assert abs(after - min(bucket.capacity, before + ticket.price)) < 1e-6

    @rule()
    def dispatch(self) -> None:
        for ticket in self.adm.dispatch():
            assert ticket.state == "running"

    @precondition(lambda self: any(t.state == "queued" for t in self.tickets))
    @rule(index=st.integers(0, 100))
    def expire(self, index: int) -> None:
        queued = self._live("queued")
        ticket = queued[index % len(queued)]
        refused = self.adm.expire(ticket)
        assert 0 < refused.retry_after <= self.config.max_retry_after
        if self.adm.out_for is not None:  # it waited for the upstream, not for a place
            assert (refused.status, refused.code) == (503, "upstream_unavailable")
            return
        assert (refused.status, refused.code) == (429, "queue_timeout")
        self._check_queue_order(refused, ticket.priority, ticket.unit)

    @precondition(lambda self: any(t.state == "queued" for t in self.tickets))
    @rule()
    def every_waiter_starts_once_the_running_end(self) -> None:
        """Once the running requests end and the buckets refilled, the head of the queue
        starts, and so on to the last waiter: none is held for ever."""
        self.adm.set_upstream(ready=True)
        self.adm.resume()
        while self._live("queued"):
            for ticket in self._live("running"):
                self.adm.release(ticket, used_tokens=ticket.price)
            for _ in range(24):  # two minutes: the interactive window, the buckets
                self.advance(5.0)
            assert self.adm.dispatch(), f"nothing started: held for {self.adm.held}"

    @rule()
    def drain(self) -> None:
        for ticket, refused in self.adm.drain():
            assert ticket.state == "done"
            assert refused.status == 503
            assert refused.drain
        assert self.adm.queue_depth == 0
        decision = self.adm.offer("key-a", 1)
        assert isinstance(decision, Refuse)
        assert decision.code == "draining"

    @rule()
    def resume(self) -> None:
        self.adm.resume()

    @rule(ready=st.booleans())
    def upstream(self, ready: bool) -> None:
        self.adm.set_upstream(ready=ready, code="upstream_unavailable")

    @rule(seconds=st.floats(0.0, 5.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        tpm = self.config.tokens_per_minute
        if tpm is not None:
            for key_id in self.refilled:
                self.refilled[key_id] += seconds * tpm / 60

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def counters_match_the_tickets(self) -> None:
        running, queued = self._live("running"), self._live("queued")
        assert self.adm.inflight == len(running) <= self.config.max_concurrency
        assert self.adm.queue_depth == len(queued) <= self.config.max_queue
        for klass in ("interactive", "batch"):
            assert self.adm.queue.depth(klass) == sum(t.priority == klass for t in queued)
        assert self.adm.inflight_tokens == sum(t.price for t in running)
        if self.config.max_inflight_tokens is not None:
            assert self.adm.inflight_tokens <= self.config.max_inflight_tokens
        for key_id in self.refilled:
            mine = sum(t.key_id == key_id for t in queued)
            assert mine <= self.config.key_queue_limit

    @invariant()
    def tokens_are_never_minted(self) -> None:
        tpm = self.config.tokens_per_minute
        if tpm is not None:
            assert_never_minted(self.adm, self.tickets, self.refilled, tpm)


AdmissionMachine.TestCase.settings = PROPERTY
test_admission_machine = AdmissionMachine.TestCase
