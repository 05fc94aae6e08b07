"""The self-sized admission (``sizing = "engine"``) as a hypothesis state machine.

The admission machine drives the gateway's core on static limits; this one feeds it the
engine's readings too (capacity, KV use, running and waiting counts, and its counters of
generated tokens, preemptions and prefix cache hits, which grow, restart or go missing),
and ends requests every way the proxy does: whole with vLLM's usage, cut short with what
was seen or nothing at all, and not run (a 400, a 404, vLLM's own 429).

Invariants: the counters equal the live tickets, the dispatch limit stays between 1 and
the cap, every waiter starts once the engine is idle (nothing holds one for ever), a
running request's estimated answer stays within its ``max_tokens``, the run time and
drain rate behind Retry-After stay positive and finite, every refusal says when to come
back and each user's queue refusals are told times in order, the service window never
reads a negative share, and the key's token budget is never minted beyond what the clock
refilled, whatever the estimate settled on.
"""

from __future__ import annotations

import math
from typing import Literal

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.property._profile import PROPERTY
from tests.property._tokens import assert_never_minted, level

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.engine import Reading
from herdless.gateway.core.limits import AdmissionConfig, Priority
from herdless.gateway.core.prefixes import chain
from herdless.testing import FakeClock

KEYS = st.sampled_from(["key-a", "key-b"])
USERS = st.sampled_from([None, "u-1", "u-2"])
PRIORITIES = st.sampled_from(["interactive", "batch"])
Ending = Literal["usage", "cut", "cut_seen", "unrun", "queued"]
ENDINGS: st.SearchStrategy[Ending] = st.sampled_from(["usage", "cut", "cut_seen", "unrun"])
TOKENS = st.sampled_from([1, 100, 1500, 3000]) | st.integers(1, 3000)
_SYSTEM = chain("", ["Answer from the handbook only. " * 200])  # 6,200 characters: 24 links
# Prompts that share a system prompt, part of it, or nothing: what the prefix cache finds.
PREFIXES = st.sampled_from([(), _SYSTEM, _SYSTEM[:6], (*_SYSTEM[:12], 7)])
TPM = 8000


class SizingMachine(RuleBasedStateMachine):
    """Offers, dispatches, releases of every kind, engine readings, time."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.adm = Admission(AdmissionConfig(), clock=self.clock)
        self.cap: int | None = None
        self.tickets: list[Ticket] = []
        self.refilled: dict[str, float] = {}
        self.generated = 0  # the engine's generation counter
        self.preempted = 0  # the engine's preemption counter
        self.hits = 0  # the engine's prefix cache hits
        self.told: dict[tuple[str, str], float] = {}  # the latest time told, per class and user

    @initialize(
        cap=st.none() | st.integers(1, 8),
        max_queue=st.integers(0, 6),
        scheduler=st.sampled_from(["vtc", "vtc", "round-robin", "fcfs"]),
        tpm=st.booleans(),
    )
    def build(self, cap: int | None, max_queue: int, scheduler: str, tpm: bool) -> None:
        self.cap = cap
        config = AdmissionConfig(
            scheduler=scheduler,  # type: ignore[arg-type]
            max_concurrency=cap,
            max_queue=max_queue,
            tokens_per_minute=TPM if tpm else None,
            queue_timeout=5.0,
            max_retry_after=30.0,
        )
        self.adm = Admission(config, clock=self.clock)

    def _live(self, state: str) -> list[Ticket]:
        return [t for t in self.tickets if t.state == state]

    # -- rules ----------------------------------------------------------------------------

    @rule(
        key_id=KEYS,
        user=USERS,
        priority=PRIORITIES,
        prompt=TOKENS,
        max_tokens=TOKENS,
        prefix=PREFIXES,
    )
    def offer(
        self,
        key_id: str,
        user: str | None,
        priority: Priority,
        prompt: int,
        max_tokens: int,
        prefix: tuple[int, ...],
    ) -> None:
        self.refilled.setdefault(key_id, 0.0)
        price = prompt + max_tokens
        decision = self.adm.offer(
            key_id, price, user=user, priority=priority, prompt=prompt, prefix=prefix
        )
        if isinstance(decision, Admit | Enqueued):
            self.tickets.append(decision.ticket)
            return
        assert isinstance(decision, Refuse)
        if decision.status not in (429, 503):
            assert (decision.status, decision.code) == (400, "request_too_large"), decision
            return
        assert 0 < decision.retry_after <= self.adm.config.max_retry_after, decision
        if decision.code in ("queue_full", "kv_budget"):
            klass = priority if self.adm.config.scheduler == "vtc" else "interactive"
            unit = key_id if user is None else f"{key_id}/{user}"
            at = self.clock.monotonic() + decision.retry_after
            last = self.told.get((klass, unit), -math.inf)
            assert at >= last - 1e-9, "a later refusal of a user was told an earlier time"
            self.told[(klass, unit)] = at

    @rule()
    def dispatch(self) -> None:
        for ticket in self.adm.dispatch():
            assert ticket.state == "running"

    @precondition(lambda self: any(t.state != "done" for t in self.tickets))
    @rule(index=st.integers(0, 100), ending=ENDINGS, share=st.floats(0.0, 1.0))
    def release(self, index: int, ending: Ending, share: float) -> None:
        """End a ticket as the proxy does: ``share`` of its ``max_tokens`` made, and the
        engine's prompt count off the estimate by up to a half either way."""
        live = [t for t in self.tickets if t.state != "done"]
        ticket = live[index % len(live)]
        budget = ticket.price - ticket.prompt
        made = round(share * budget)
        if ticket.state == "running":
            self.generated += made
        before = level(self.adm, ticket.key_id)
        if ticket.state == "queued":
            self.adm.release(ticket)
        elif ending == "usage":
            prompt = max(1, round(ticket.prompt * (0.5 + share)))
            self.adm.release(
                ticket, used_tokens=prompt + made, prompt_tokens=prompt, completion_tokens=made
            )
        elif ending == "cut":  # nothing seen of it: the engine's rate estimates it
            self.adm.release(ticket, whole=False)
        elif ending == "cut_seen":  # a stream stopped: its events counted
            self.adm.release(ticket, completion_tokens=made, whole=False)
        else:  # vLLM refused it, or was not reached
            self.adm.release(ticket, used_tokens=0, whole=False)
        assert ticket.state == "done"
        after = level(self.adm, ticket.key_id)
        if before is not None and after is not None and ending == "unrun":
            bucket = self.adm._keys[ticket.key_id].tokens
            assert bucket is not None  # not run: its whole price comes back
            assert abs(after - min(bucket.capacity, before + ticket.price)) < 1e-6

    @rule(
        capacity=st.sampled_from([3_000, 8_000, 200_000]),
        usage=st.floats(0.0, 1.0),
        waiting=st.integers(0, 6),
        extra=st.integers(-2, 2),
        preempted=st.integers(0, 2),
        missing=st.sampled_from([None, "kv_usage", "running", "generation_tokens"]),
        restart=st.booleans(),
        hits=st.sampled_from([0, 0, 1_500]),
    )
    def observe(
        self,
        capacity: int,
        usage: float,
        waiting: int,
        extra: int,
        preempted: int,
        missing: str | None,
        restart: bool,
        hits: int,
    ) -> None:
        """A reading of the engine: its running count is the gateway's, give or take
        others' requests; its counters grow, unless it restarted."""
        if restart:
            self.generated = self.preempted = self.hits = 0
        self.preempted += preempted
        self.hits += hits  # prompt tokens its prefix cache found
        fields: dict[str, float | int | None] = {
            "kv_usage": usage,
            "running": max(0, self.adm.inflight + extra),
            "generation_tokens": self.generated,
        }
        if missing is not None:
            fields[missing] = None
        self.adm.observe(
            Reading(
                at=self.clock.monotonic(),
                kv_capacity=capacity,
                block_size=16,
                waiting=waiting,
                preemptions=self.preempted,
                prefix_hits=self.hits,
                **fields,  # type: ignore[arg-type]
            )
        )

    @precondition(lambda self: any(t.state == "queued" for t in self.tickets))
    @rule()
    def an_idle_engine_starts_every_waiter(self) -> None:
        """Whatever was learned, once the running requests end, the engine reads idle and
        the buckets refilled, the head of the queue starts, and so on to the last waiter:
        a request waits for those ahead of it, never for ever (all wait behind it)."""
        self.adm.set_upstream(ready=True)
        if self.adm.draining:
            self.adm.resume()
        while self._live("queued"):
            for ticket in self._live("running"):
                self.adm.release(ticket, used_tokens=ticket.price)
            self.advance(120.0)  # the interactive window, the batch pacing, the buckets
            self.observe(  # the engine reads idle
                self.adm.sizing.kv_capacity or 20_000,
                usage=0.0, waiting=0, extra=0, preempted=0, missing=None, restart=False, hits=0,
            )  # fmt: skip
            assert self.adm.dispatch(), f"nothing started: held for {self.adm.held}"

    @rule(hits=st.sampled_from([0, 1_500]))
    def one_answers_as_measured(self, hits: int) -> None:
        """A chat of the shared system prompt runs a second and ends with its usage: the
        engine's decode rate and a run's time beyond it are measured, as a warm engine's
        are (where prompts the engine holds are counted past their shared blocks)."""
        self.refilled.setdefault("key-b", 0.0)  # its bucket refills from here on
        decision = self.adm.offer("key-b", 150, prompt=100, prefix=_SYSTEM)
        if isinstance(decision, Admit | Enqueued):
            self.tickets.append(decision.ticket)
        if not isinstance(decision, Admit):
            return
        capacity = self.adm.sizing.kv_capacity or 20_000
        engine = {"usage": 0.1, "waiting": 0, "extra": 0, "preempted": 0, "restart": False}
        self.observe(capacity, **engine, missing=None, hits=0)
        self.decode(50)  # a second of decoding between two readings
        self.observe(capacity, **engine, missing=None, hits=hits)
        self.adm.release(decision.ticket, used_tokens=150, prompt_tokens=100, completion_tokens=50)

    @rule(tokens_per_second=st.integers(0, 400))
    def decode(self, tokens_per_second: int) -> None:
        """A second of decoding: the engine's counter grows with the running requests."""
        self.clock.advance(1.0)
        self.generated += tokens_per_second * self.adm.inflight
        self._refill(1.0)

    @rule(seconds=st.floats(0.0, 5.0))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._refill(seconds)

    @rule(ready=st.booleans())
    def upstream(self, ready: bool) -> None:
        self.adm.set_upstream(ready=ready, code="upstream_unavailable")

    def _refill(self, seconds: float) -> None:
        for key_id in self.refilled:
            self.refilled[key_id] += seconds * TPM / 60

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def counters_match_the_tickets(self) -> None:
        running, queued = self._live("running"), self._live("queued")
        assert self.adm.inflight == len(running) == self.adm.sizing.running
        assert self.adm.queue_depth == len(queued) <= self.adm.config.max_queue
        assert self.adm.inflight_tokens == sum(t.price for t in running)

    @invariant()
    def shared_prompt_blocks_are_held_while_a_request_that_found_them_runs(self) -> None:
        runs = self.adm.sizing._runs
        if not self._live("running"):
            assert runs.held.depth(_SYSTEM) == 0
        shared = [run.shared for t in self._live("running") if (run := runs.get(t.id))]
        assert abs(self.adm.sizing.shared_prompt_tokens - sum(shared)) < 1e-6
        for ticket in self._live("running"):
            run = runs.get(ticket.id)
            assert run is not None
            assert run.shared >= 0
            assert run.prompt >= 0  # it finds no more than its whole prompt
            assert runs.held.depth(run.holds) == len(run.holds)

    @invariant()
    def the_limit_stays_between_one_and_the_cap(self) -> None:
        limit = self.adm.sizing.limit
        assert limit >= 1
        if self.cap is not None:
            assert limit <= self.cap
            assert self.adm.inflight <= self.cap

    @invariant()
    def an_estimate_stays_within_max_tokens(self) -> None:
        now = self.clock.monotonic()
        for ticket in self._live("running"):
            made = self.adm.sizing.made(ticket, now)
            if made is not None:
                assert 0 <= made <= ticket.price - ticket.prompt

    @invariant()
    def retry_after_rests_on_finite_times(self) -> None:
        assert 0 < self.adm.mean_service_time < math.inf
        assert 0 < self.adm.drain_rate() < math.inf

    @invariant()
    def service_is_never_negative(self) -> None:
        for user, served in self.adm.user_service().items():
            assert served >= -1e-6, (user, served)

    @invariant()
    def tokens_are_never_minted(self) -> None:
        if self.adm.config.tokens_per_minute is not None:
            assert_never_minted(self.adm, self.tickets, self.refilled, TPM)


SizingMachine.TestCase.settings = PROPERTY
test_sizing_machine = SizingMachine.TestCase
