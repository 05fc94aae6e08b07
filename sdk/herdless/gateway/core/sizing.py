"""Self-sizing: what the engine behind the gateway can hold now (pure, no I/O).

The watcher (:mod:`herdless.gateway.watcher`) hands each reading of the engine's
metrics to :meth:`Sizing.observe`; between readings the gateway counts what it started
and ended itself. Before a waiter starts, :meth:`Sizing.hold` names what holds it back,
or ``None``. The rules, explained in docs/gateway.md ("Self-sizing"):

1. static (``max_concurrency`` or 64, ``max_inflight_tokens``) until a reading names
   the KV capacity (``num_gpu_blocks x block_size``), or with ``sizing="static"``;
2. KV headroom: the peak KV of the running requests and this one, each decoding one
   token per step until its *predicted* answer ends (:func:`~.engine.kv_peak`), within
   ``fill x capacity``. The prediction, at most its ``max_tokens``: its user's average
   answer, else its class's, else the engine's mean over the requests it finished (a
   gateway just started in front of a serving engine), else its ``max_tokens`` (for a
   request that names none, the ``default_max_tokens`` its price assumed, a guess that
   caps nothing).
   Prompts calibrated by the engine's counts; KV beyond the gateway's own account
   (another client) added; KV below it, where the engine's prefix cache shares the
   prompt blocks of requests it has taken in (at most what it found since the oldest
   running request started), taken off; a new request that begins with the text of one
   the engine holds counted past their shared blocks (:mod:`~.prefixes`). A request
   the gateway would run alone starts whatever its size (nothing of its own can end to
   make room: the engine runs what its cache holds and refuses the rest);
3. no batch start while the engine's own queue lasts (two readings over
   ``ENGINE_WAITING``); its ``max_num_seqs`` learned over ``SEQ_READINGS`` readings;
4. batch leaves half the interactive demand of the last ``reserve_window`` (plus one
   request) free; while chats are around its starts are paced and put off briefly
   for chats about to end (:class:`~.engine.BatchPacing`);
5. a reading with new preemptions lowers ``fill`` by 5 %, quiet ones give it back;
6. stale readings: starts bounded by the last good limit, never zero or unbounded;
7. ``max_concurrency`` and ``max_inflight_tokens`` cap everything.

The live limit (:attr:`Sizing.limit`, requests) is what ``/metrics`` shows."""

from __future__ import annotations

import math
from collections import deque
from typing import Final, Literal

from herdless.gateway.core.decisions import Ticket
from herdless.gateway.core.engine import (
    BatchPacing,
    InteractiveDemand,
    Reading,
    Run,
    Running,
    kv_peak,
)
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.core.prefixes import LINK_TOKENS
from herdless.gateway.core.service import average_answer

__all__ = ["ENGINE_WAITING", "FILL", "SEQ_READINGS", "Hold", "Sizing"]

Hold = Literal["cap", "kv", "reserve", "spacing", "seqs", "engine_waiting", "stale"]
"""What holds the next waiter back: a cap (or the static limit), the KV headroom, the
interactive headroom or the spacing of batch starts (batch only), the engine's learned
``max_num_seqs``, its own queue, or the last good limit while the readings are stale."""

FILL: Final = 0.99
"""Share of the KV capacity the peak may reach (block rounding and mispredicted answers
take the rest)."""
ENGINE_WAITING: Final = 1
"""Requests the engine may hold waiting before the gateway stops starting more."""
SEQ_READINGS: Final = 4
"""Readings in a row that must show the engine queueing with KV to spare, the same count
running, before that count is taken for its ``max_num_seqs``."""
_MIN_FILL = 0.5
_BRAKE = 0.95
_RECOVER = 0.002
_EWMA = 0.2
_SEQ_KV = 0.9  # the engine queues with KV below this share: its max_num_seqs is the cause
_TYPICAL = 1024  # tokens of a request (prompt + answer) until one started
_BLOCK = 16  # tokens of a KV block until a reading names it (vLLM's default on a GPU)
_HIGH_DECAY = 0.995  # per reading: the most batch running lately fades over about a minute
_RESERVE_SHARE = 0.5  # of the interactive peak, batch leaves this share free (rule 4)


class Sizing:
    """The dispatch rule of the gateway. Not thread-safe: one event loop drives it.

    Usage::

        sizing = Sizing(config)
        sizing.observe(reading)                       # every few hundred ms
        if sizing.hold(ticket, now, recent_interactive=True) is None:
            sizing.start(ticket, predicted=120, now=now)
        ...
        sizing.finish(ticket, now, prompt_tokens=98, completion_tokens=131)
    """

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.engine = config.sizing == "engine"
        self._runs = Running()
        self.inflight_tokens = 0
        """Sum of the prices of the running requests (the static KV budget in use)."""
        self.preemptions_seen = 0
        """Preemptions the readings reported since the gateway started."""
        self.last: Reading | None = None
        """The last reading (``None`` before the first)."""
        self._reset_learned()

    def _reset_learned(self) -> None:
        self.kv_capacity: int | None = None
        """The engine's KV capacity in tokens, ``None`` while static."""
        self.seq_limit: int | None = None
        """The engine's ``max_num_seqs`` as learned, ``None`` until it queued."""
        self.fill = FILL
        """Share of the KV capacity the peak may reach now (lowered by preemptions)."""
        self._decode_rate: float | None = None  # tokens per second per running sequence
        self._rest: float | None = None  # EWMA of a run's seconds beyond its decode
        self._prompt_ratio = 1.0  # engine's prompt tokens / the gateway's estimate
        self.prompt_counted = False
        """Whether the engine has counted a prompt (its usage, or its ``/tokenize``): until
        then the prompts are as estimated (``_prompt_ratio`` 1, a guess)."""
        self.prompt_sample: tuple[bytes, int] | None = None
        """A request's body and its estimated prompt for the engine to count
        (:meth:`sample_prompt`), or ``None``."""
        self._answers: dict[bool, float] = {}  # EWMA of answers, per class (interactive?)
        self._engine_answer: float | None = None  # the engine's mean answer, read (rule 2)
        self._external = 0.0  # KV tokens the engine holds beyond the gateway's account
        self._shared = 0.0  # KV tokens its shared prompt blocks save on that account
        self._hits: deque[tuple[float, int]] = deque()  # (at, its prefix cache hits) read
        self._caching = False  # its prefix cache was seen finding prompts
        self._good_at = -math.inf
        self._good_limit: int | None = None
        self._queued_streak = 0  # readings in a row queueing with KV to spare, same running
        self._waited_before = False  # the reading before showed waiting > ENGINE_WAITING
        self._started_since = 0  # started since the last reading
        self._ended_since = 0  # ended since the last reading
        self._typical = float(_TYPICAL)  # EWMA of the footprints started
        self._typical_interactive = float(_TYPICAL)  # the same, of interactive requests
        self._pacing = BatchPacing()
        self._demand = InteractiveDemand(self.config.reserve_window)
        self.limit = self.static_limit
        self.stale = False

    # -- what the rule knows ---------------------------------------------------------------

    @property
    def static_limit(self) -> int:
        """The limit in requests while static: ``max_concurrency``, else 64."""
        return self.config.static_concurrency

    @property
    def sized(self) -> bool:
        """Whether the engine's readings size the dispatch (rule 1)."""
        return self.kv_capacity is not None

    @property
    def running(self) -> int:
        """Requests the gateway started and that have not ended."""
        return len(self._runs)

    @property
    def shared_prompt_tokens(self) -> float:
        """Prompt tokens of the running requests counted as found in the engine's prefix
        cache, not as new KV (rule 2)."""
        return self._runs.shared_prompts

    @property
    def engine_waiting(self) -> int:
        """The engine's waiting count as last read, less the requests ended since (each
        lets a waiter in), plus those started since when it was queueing then."""
        waiting = 0 if self.last is None or self.last.waiting is None else self.last.waiting
        if waiting <= ENGINE_WAITING or not self._waited_before:
            return 0
        return max(0, waiting + self._started_since - self._ended_since)

    @property
    def kv_budget(self) -> float | None:
        """KV tokens the peak may reach now (rule 2 and the cap), ``None`` when unbounded."""
        cap = self.config.max_inflight_tokens
        if self.kv_capacity is None:
            return cap
        budget = self.fill * self.kv_capacity
        return budget if cap is None else min(budget, cap)

    # -- readings --------------------------------------------------------------------------

    def observe(self, reading: Reading) -> None:
        """Take a reading of the engine (rules 2-6); the limit is recomputed."""
        if not self.engine:
            self.last = reading
            return
        last = self.last
        restarted = (
            last is not None
            and last.generation_tokens is not None
            and reading.generation_tokens is not None
            and reading.generation_tokens < last.generation_tokens
        )
        if self.sized and not reading.sizable:
            self.failed(reading.at)  # a glitch; a real swap comes through reset()
            return
        if restarted or (self.sized and reading.kv_capacity != self.kv_capacity):
            self._reset_learned()  # another engine, maybe another model: learn it anew
            last = None
        self.last = reading
        self._started_since = self._ended_since = 0
        self._pacing.fade(_HIGH_DECAY)
        self.stale = False
        if reading.answers and reading.answer_tokens is not None:
            self._engine_answer = reading.answer_tokens / reading.answers
        if not reading.sizable:
            return
        assert reading.kv_capacity is not None
        assert reading.kv_usage is not None
        self.kv_capacity = reading.kv_capacity
        self._good_at = reading.at
        if last is not None:
            self._learn(last, reading)
        used = reading.kv_usage * reading.kv_capacity
        self._external = max(0.0, used - self._accounted(reading.at))
        self._shared = 0.0 if last is None else self._shared_kv(last, reading, used)
        self.limit = self._live_limit(reading.at)
        self._good_limit = self.limit

    def _learn(self, last: Reading, now: Reading) -> None:
        """Decode rate, max_num_seqs and the preemption brake from two readings."""
        span = now.at - last.at
        if (
            span > 0
            and now.generation_tokens is not None
            and last.generation_tokens is not None
            and now.running
            and last.running
        ):
            per_seq = (now.generation_tokens - last.generation_tokens) / span
            per_seq /= (now.running + last.running) / 2
            if per_seq > 0:
                old = self._decode_rate
                self._decode_rate = per_seq if old is None else old + _EWMA * (per_seq - old)
        if now.preemptions is not None and last.preemptions is not None:
            new = now.preemptions - last.preemptions
            if new > 0:
                self.preemptions_seen += new
                self.fill = max(_MIN_FILL, self.fill * _BRAKE)
            else:
                self.fill = min(FILL, self.fill + _RECOVER)
        if now.running is not None and now.waiting is not None and now.kv_usage is not None:
            queued = now.waiting > 0 and now.kv_usage < _SEQ_KV
            same = queued and now.running == last.running
            self._queued_streak = self._queued_streak + 1 if same else int(queued)
            if self._queued_streak >= SEQ_READINGS:
                self.seq_limit = max(1, now.running)
            if self.seq_limit is not None and now.running > self.seq_limit:
                self.seq_limit = now.running  # learned on a moment of arrivals: raise it
        if last.waiting is not None:
            self._waited_before = last.waiting > ENGINE_WAITING

    def _shared_kv(self, last: Reading, now: Reading, used: float) -> float:
        """KV tokens the engine holds below the prompts alone of the requests it has taken
        in whole: prompt blocks shared through its prefix cache (rule 2); what they and
        anything else hold beside (answers, another client's requests) only lowers it.
        At most the tokens its cache found since the oldest running request started (a
        prompt estimated long is no saving), and none while a request waits in its queue
        (it holds no block yet, and would read as shared). With its queue empty, those
        started by the reading before are in it, and hold their prompts' links
        (:meth:`Running.admitted`)."""
        hits = self._hits
        if now.prefix_hits is None:
            hits.clear()
            return 0.0
        hits.append((now.at, now.prefix_hits))
        oldest = self._runs.oldest_start()
        while len(hits) > 1 and hits[1][0] <= oldest:
            hits.popleft()  # the first is the last read before the oldest started
        found = now.prefix_hits - hits[0][1]
        self._caching = self._caching or found > 0
        if now.waiting != 0:
            return 0.0
        if self._caching:
            self._runs.admitted(last.at, self._shared_prompt)
        if self._rest is None or found <= 0:
            return 0.0
        prompts = self._runs.taken_in(last.at, now.at, self._rest, self._typical)
        return max(0.0, min(prompts - used, found))

    def failed(self, now: float) -> bool:
        """A read failed or came late; returns whether the readings are stale now (rule 6)."""
        if self.engine and self.sized and now - self._good_at > self.config.stale_after:
            self.stale = True
        return self.stale

    def reset(self) -> None:
        """The upstream came back after an outage: another engine, maybe another model,
        whose size is learned anew (static until its first reading)."""
        self._reset_learned()
        self.last = None

    # -- the dispatch rule -----------------------------------------------------------------

    def hold(self, ticket: Ticket, now: float, *, recent_interactive: bool) -> Hold | None:
        """What holds ``ticket`` back from starting now, or ``None`` (rules 1-7).

        ``recent_interactive``: interactive work was seen within ``reserve_window``.
        """
        cfg = self.config
        running = len(self._runs)
        interactive = ticket.priority == "interactive"
        if cfg.max_concurrency is not None and running >= cfg.max_concurrency:
            return "cap"
        if not self.sized:
            return self._static_hold(ticket, running, interactive, recent_interactive)
        self.failed(now)
        if self.stale and self._good_limit is not None and running >= self._good_limit:
            return "stale"
        if not interactive and self.engine_waiting > ENGINE_WAITING:
            return "engine_waiting"
        reserve_seqs, reserve_tokens = (0, 0.0)
        if not interactive:
            reserve_seqs, reserve_tokens = self._interactive_reserve(now, recent_interactive)
            if recent_interactive and now < self.batch_spaced_until:
                return "spacing"
        if not running:  # alone: nothing of the gateway's can end to make room (rules 2-4)
            return None
        if self.seq_limit is not None and running + reserve_seqs >= self.seq_limit:
            return "seqs" if reserve_seqs == 0 or running >= self.seq_limit else "reserve"
        budget = self.kv_budget
        assert budget is not None
        new = self._run_of(ticket, None, now)
        bound = self._runs.final(self._block) + new.final(self._block) + self._beyond
        if bound + reserve_tokens > budget:  # else it fits even if all ended together
            peak = self._peak(now, new)
            if peak + reserve_tokens > budget:
                return "kv" if peak > budget else "reserve"
        if not interactive and recent_interactive and self._pacing.put_off(now, self._runs):
            return "spacing"
        return None

    def _static_hold(
        self, ticket: Ticket, running: int, interactive: bool, recent_interactive: bool
    ) -> Hold | None:
        """Rule 1: the static limits (the gateway before self-sizing)."""
        limit = self.static_limit
        if running >= limit:
            return "cap"
        cap = self.config.max_inflight_tokens
        if cap is not None and self.inflight_tokens + ticket.price > cap:
            return "kv"
        reserve = self.config.reserve_for(limit) if recent_interactive else 0
        if not interactive and running + 1 > limit - reserve:
            return "reserve"
        return None

    def predicted_ends(self, now: float) -> tuple[float, float] | None:
        """(when the first running request ends, clock time; seconds a request runs) as
        :meth:`Running.ends` predicts them, with the rest of a run measured on those that
        ended; ``None`` before the decode rate is measured or with none running."""
        if self._decode_rate is None or not self._runs:
            return None
        return self._runs.ends(self._decode_rate, now, self._rest or 0.0)

    @property
    def batch_spaced_until(self) -> float:
        """The earliest time the next batch request may start while interactive work is
        recent (rule 4's pacing); ``-inf`` before a batch run time is measured."""
        if not self.sized:
            return -math.inf
        return self._pacing.next_start(chats=self._runs.seqs[True] > 0)

    def start(self, ticket: Ticket, now: float, *, predicted: float | None) -> None:
        """``ticket`` starts; ``predicted``: its user's average answer, if known."""
        run = self._run_of(ticket, predicted, now)
        self._runs.add(ticket.id, run)
        footprint = run.prompt + run.predicted
        self.inflight_tokens += ticket.price
        self._started_since += 1
        self._typical += _EWMA * (footprint - self._typical)
        if run.interactive:
            self._typical_interactive += _EWMA * (footprint - self._typical_interactive)
            self._note_interactive(now)
        else:
            self._pacing.started(now, self._runs.seqs[False], chats=self._runs.seqs[True] > 0)

    def finish(
        self,
        ticket: Ticket,
        now: float,
        *,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        whole: bool = True,
    ) -> None:
        """``ticket`` ended; the engine's usage, when reported, calibrates the predictions
        (``whole``: the answer ended on its own; one cut short, or not run, teaches none)."""
        run = self._runs.pop(ticket.id)
        if run is None:
            return
        if run.holds:  # prompt blocks it paid for that others hold stay until they end
            held = self._shared_prompt(self._runs.held.depth(run.links), run.prompt + run.shared)
            self._external += max(0.0, held - run.shared)
        self.inflight_tokens -= ticket.price
        self._ended_since += 1
        if run.interactive:
            self._note_interactive(now)
        if not whole:
            return
        self._pacing.ended(run, now)
        if prompt_tokens is not None and ticket.prompt > 0:
            self.count_prompt(ticket.prompt, prompt_tokens)
        if completion_tokens is not None:
            if self._decode_rate is not None:  # the prompt's pass, the answer's way back
                rest = max(0.0, now - run.started - completion_tokens / self._decode_rate)
                old = rest if self._rest is None else self._rest
                self._rest = old + _EWMA * (rest - old)
            before = self._answers.get(run.interactive)
            cap = ticket.answer_cap  # an answer cut there
            self._answers[run.interactive] = average_answer(before, completion_tokens, cap)

    def sample_prompt(self, body: bytes, estimate: int) -> None:
        """A request starts with ``body``, its prompt estimated at ``estimate`` tokens: kept
        for the engine to count (the watcher asks its ``/tokenize``) while no prompt has
        been counted. A crowd's first answers may be seconds away, and their prompts,
        estimated at 4 characters a token, can be a quarter off."""
        if not self.prompt_counted and self.prompt_sample is None and estimate > 0:
            self.prompt_sample = (body, estimate)

    def take_prompt_sample(self) -> tuple[bytes, int] | None:
        """The prompt kept for the engine to count, handed over once (``None``: none)."""
        sample, self.prompt_sample = self.prompt_sample, None
        return sample

    def count_prompt(self, estimate: int, tokens: int) -> None:
        """The engine counted ``tokens`` for a prompt estimated at ``estimate``: the
        prompts' calibration (rule 2). The first count replaces the guess (and the
        prompts of the requests running on it), later ones are averaged in."""
        ratio = tokens / estimate
        if self.prompt_counted:
            ratio = self._prompt_ratio + _EWMA * (ratio - self._prompt_ratio)
        else:
            self._runs.calibrate(ratio)
        self._prompt_ratio, self.prompt_counted, self.prompt_sample = ratio, True, None

    def made(self, ticket: Ticket, now: float) -> float | None:
        """Answer tokens running ``ticket`` has likely made by ``now`` (``None``: no rate)."""
        run, rate = self._runs.get(ticket.id), self._decode_rate
        return None if run is None or rate is None else run.made(now, rate, self._rest or 0.0)

    # -- helpers ---------------------------------------------------------------------------

    def _run_of(self, ticket: Ticket, predicted: float | None, now: float) -> Run:
        budget = max(0, ticket.price - ticket.prompt)  # its max_tokens, or the default's
        interactive = ticket.priority == "interactive"
        if predicted is None:
            predicted = self._answers.get(interactive, self._engine_answer or budget)
        prompt, links = ticket.prompt * self._prompt_ratio, ticket.prefix
        depth = self._runs.held.depth(links) if self._caching else 0
        shared = self._shared_prompt(depth, prompt)
        return Run(
            prompt=prompt - shared,
            predicted=min(ticket.answer_cap, predicted),
            budget=budget,
            started=now,
            interactive=interactive,
            open_ended=ticket.open_ended,
            calibrated=self.prompt_counted,
            links=links,
            holds=links[:depth] if shared else (),
            shared=shared,
        )

    def _shared_prompt(self, depth: int, prompt: float) -> float:
        """Tokens of a ``prompt`` whose first ``depth`` links the engine holds that its
        prefix cache finds (rule 2): their whole blocks, less one (where the text's tokens
        end is an estimate)."""
        block = self._block or _BLOCK
        tokens = min(depth * LINK_TOKENS * self._prompt_ratio, prompt) - block
        return max(0.0, tokens // block * block)

    @property
    def _block(self) -> int:  # tokens a sequence may waste in its last, partial KV block
        return 0 if self.last is None or self.last.block_size is None else self.last.block_size

    def _accounted(self, now: float) -> float:
        """KV the gateway's own running requests may hold at ``now``, by its account:
        their final sizes until the decode rate is measured (so that the tokens they
        generated meanwhile are not taken for another client's)."""
        if self._decode_rate is None:
            return self._runs.final(self._block)
        return sum(size for size, _ in self._runs.sizes(now, self._decode_rate, self._block))

    def _peak(self, now: float, new: Run | None = None) -> float:
        """The most KV the running requests (and ``new``) will hold at once (rule 2)."""
        sizes = self._runs.sizes(now, self._decode_rate or 0.0, self._block)
        if new is not None:
            sizes.append((new.prompt + self._block, new.predicted))
        return kv_peak(sizes) + self._beyond

    @property
    def _beyond(self) -> float:
        """KV the engine holds beyond the gateway's account (less, where it shares the
        prompt blocks of requests still running)."""
        return self._external - min(self._shared, self._runs.taken_in_prompts)

    def _note_interactive(self, now: float) -> None:
        """Record what interactive work holds now, for the window's peak (rule 4)."""
        self._demand.note(now, self._runs.tokens[True], self._runs.seqs[True])

    def _interactive_reserve(self, now: float, recent: bool) -> tuple[int, float]:
        """(sequences, KV tokens) batch leaves free for interactive work (rule 4)."""
        seqs, tokens = self._demand.peak(now) if recent else (0, 0.0)
        typical = tokens / seqs if seqs else self._typical_interactive
        return max(1, math.floor((seqs + 1) * _RESERVE_SHARE)), (tokens + typical) * _RESERVE_SHARE

    def _live_limit(self, now: float) -> int:
        """Requests the engine holds now: running, plus how many more of the typical
        running request fit in the KV headroom (rules 2, 3 and 7)."""
        running = len(self._runs)
        budget = self.kv_budget
        assert budget is not None
        room = max(0.0, budget - self._peak(now))
        limit = running + int(room // max(1.0, self._typical))
        if self.seq_limit is not None:
            limit = min(limit, self.seq_limit)
        if self.config.max_concurrency is not None:
            limit = min(limit, self.config.max_concurrency)
        return max(1, limit)
