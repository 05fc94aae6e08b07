"""Self-sizing: what the engine behind the gateway can hold now (pure, no I/O).

The gateway reads the engine's Prometheus metrics (vLLM's ``/metrics``, read by
:mod:`herdless.gateway.watcher`) every few hundred milliseconds and hands each reading
to :meth:`Sizing.observe`; between two readings it counts what it started and ended
itself. Before a waiter starts, :meth:`Sizing.hold` says what holds it back, or
``None``. The rules, numbered as docs/gateway.md ("Self-sizing") explains them:

1. **Static until the engine says its size.** Until a reading names the KV capacity
   (vLLM's ``vllm:cache_config_info``: ``num_gpu_blocks x block_size`` tokens), or with
   ``sizing="static"``, the gateway runs ``max_concurrency`` requests (64 when not
   given) within ``max_inflight_tokens`` (none when not given): the gateway as it was.
2. **KV headroom, with predicted answers.** A request starts only while the peak of
   the KV the running requests will hold, each decoding one token per step until its
   *predicted* answer ends, stays within ``fill x capacity`` with it::

       peak = max over j of  sum(size_i for r_i >= r_j) + r_j x count(r_i >= r_j)

   ``size_i`` = prompt + tokens generated so far (elapsed x the decode rate per
   sequence the readings measure), ``r_i`` = predicted answer - generated. The
   predicted answer is the user's average answer (the fair queue's, from the usage it
   settles), else its class's, never more than ``max_tokens``; prompts are the
   gateway's estimates scaled by the ratio the engine's reported ``prompt_tokens``
   measured. KV the engine holds beyond this account (another client) is added.
3. **The engine's own queue stays near empty.** No batch start while the engine's waiting
   count, as last read plus what the gateway started since less what ended, is above
   ``ENGINE_WAITING`` and was in the reading before too (a queue that lasts, not the
   prompts waiting one step for the engine's per-step token budget). vLLM does not
   publish ``max_num_seqs``: it is learned as the running count when the engine queued
   with KV to spare and the same count running for ``SEQ_READINGS`` readings in a row.
4. **Interactive headroom.** Batch work leaves free, in KV tokens and in sequences,
   the most that interactive work held at once over the last ``reserve_window``
   seconds plus one typical interactive request (one request, before any was seen): a
   chat joins the running batch at once instead of waiting for a batch answer to end.
   An interactive request is not held by the engine's queue (rule 3): it is short,
   and behind a queue that drains it waits less than behind a batch answer.
   While interactive work is recent, batch starts are **spaced** at least
   ``batch run time / most batch requests running lately`` apart (the pace a steady
   batch job needs, so spacing never starves it): a
   cohort of long prompts started at once is prefilled in one queue that every chat
   sent meanwhile waits behind, and spaced starts break such cohorts up for good.
5. **Preemptions are the brake.** A reading whose ``num_preemptions_total`` rose
   lowers ``fill`` by 5 % (not below half); each reading without one gives back a
   little, up to ``FILL``.
6. **Stale readings never halt the GPU.** When no reading arrived for
   ``stale_after`` seconds, starts are bounded by the last limit the engine ran well
   at (never zero, never unbounded) until readings come back.
7. **Caps.** ``max_concurrency`` and ``max_inflight_tokens``, when given, bound
   everything above.

The live limit (:attr:`Sizing.limit`, requests) is what ``/metrics`` shows and what
``X-Herdless-Capacity`` is computed from: the running requests plus how many more of the
typical size fit, recomputed at each reading.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

from herdless.gateway.core.decisions import Ticket
from herdless.gateway.core.limits import AdmissionConfig

__all__ = ["ENGINE_WAITING", "FILL", "SEQ_READINGS", "Hold", "Reading", "Sizing"]

Hold = Literal["cap", "kv", "reserve", "spacing", "seqs", "engine_waiting", "stale"]
"""What holds the next waiter back: a configured cap (or the static limit), the KV
headroom, the interactive headroom or the spacing of batch starts (batch only), the
engine's learned ``max_num_seqs``,
the engine's own queue, or the last good limit while the readings are stale."""

FILL: Final = 0.97
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
_HIGH_DECAY = 0.995  # per reading: the most batch running lately fades over about a minute


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """One read of the engine's metrics; ``None`` where it does not publish the signal.

    Attributes:
        at: clock time of the read.
        kv_capacity: KV capacity in tokens (``num_gpu_blocks x block_size``).
        block_size: tokens per KV block.
        kv_usage: share of the KV cache in use, 0 to 1.
        running: requests the engine runs.
        waiting: requests waiting in the engine's own queue.
        preemptions: preemptions so far (a counter).
        generation_tokens: tokens generated so far (a counter).
    """

    at: float
    kv_capacity: int | None = None
    block_size: int | None = None
    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions: int | None = None
    generation_tokens: int | None = None

    @property
    def sizable(self) -> bool:
        """Whether it holds what self-sizing needs: the capacity and the KV use."""
        return self.kv_capacity is not None and self.kv_usage is not None


@dataclass(slots=True)
class _Run:
    prompt: float  # calibrated prompt tokens
    predicted: float  # predicted answer tokens
    started: float
    interactive: bool


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
        self._runs: dict[int, _Run] = {}
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
        self._prompt_ratio = 1.0  # engine's prompt tokens / the gateway's estimate
        self._answers: dict[bool, float] = {}  # EWMA of answers, per class (interactive?)
        self._external = 0.0  # KV tokens the engine holds beyond the gateway's account
        self._good_at = -math.inf
        self._good_limit: int | None = None
        self._queued_streak = 0  # readings in a row queueing with KV to spare, same running
        self._waited_before = False  # the reading before showed waiting > ENGINE_WAITING
        self._started_since = 0  # started since the last reading
        self._ended_since = 0  # ended since the last reading
        self._typical = float(_TYPICAL)  # EWMA of the footprints started
        self._typical_interactive = float(_TYPICAL)  # the same, of interactive requests
        self._batch_run: float | None = None  # EWMA of batch run times, seconds
        self._batch_started = -math.inf  # when the last batch request started
        self._batch_high = 0.0  # most batch requests running lately (decays per reading)
        self._interactive_peak: deque[tuple[float, float, int]] = deque()
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
        self._batch_high *= _HIGH_DECAY
        self.stale = False
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
        if self.seq_limit is not None and running + reserve_seqs >= self.seq_limit:
            return "seqs" if reserve_seqs == 0 or running >= self.seq_limit else "reserve"
        budget = self.kv_budget
        assert budget is not None
        peak = self._peak(now, self._run_of(ticket, None, now))
        if peak + reserve_tokens > budget:
            return "kv" if peak > budget else "reserve"
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

    @property
    def batch_spaced_until(self) -> float:
        """The earliest time the next batch request may start while interactive work is
        recent (rule 4's spacing); ``-inf`` before a batch run time is measured."""
        if self._batch_run is None or not self.sized:
            return -math.inf
        return self._batch_started + self._batch_run / max(1.0, self._batch_high)

    def start(self, ticket: Ticket, now: float, *, predicted: float | None) -> None:
        """``ticket`` starts; ``predicted``: its user's average answer, if known."""
        run = self._run_of(ticket, predicted, now)
        self._runs[ticket.id] = run
        self.inflight_tokens += ticket.price
        self._started_since += 1
        self._typical += _EWMA * (run.prompt + run.predicted - self._typical)
        if not run.interactive:
            self._batch_started = now
            batch = sum(1 for other in self._runs.values() if not other.interactive)
            self._batch_high = max(self._batch_high, float(batch))
        if run.interactive:
            footprint = run.prompt + run.predicted
            self._typical_interactive += _EWMA * (footprint - self._typical_interactive)
            self._note_interactive(now)

    def finish(
        self,
        ticket: Ticket,
        now: float,
        *,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """``ticket`` ended; the engine's usage, when reported, calibrates the predictions."""
        run = self._runs.pop(ticket.id, None)
        if run is None:
            return
        self.inflight_tokens -= ticket.price
        self._ended_since += 1
        if run.interactive:
            self._note_interactive(now)
        else:
            took, old = now - run.started, self._batch_run
            self._batch_run = took if old is None else old + _EWMA * (took - old)
        if prompt_tokens is not None and ticket.prompt > 0:
            ratio = prompt_tokens / ticket.prompt
            self._prompt_ratio += _EWMA * (ratio - self._prompt_ratio)
        if completion_tokens is not None:
            old = self._answers.get(run.interactive)
            new = completion_tokens if old is None else old + _EWMA * (completion_tokens - old)
            self._answers[run.interactive] = new

    # -- helpers ---------------------------------------------------------------------------

    def _run_of(self, ticket: Ticket, predicted: float | None, now: float) -> _Run:
        budget = max(0, ticket.price - ticket.prompt)  # its max_tokens
        interactive = ticket.priority == "interactive"
        if predicted is None:
            predicted = self._answers.get(interactive, budget)
        return _Run(
            prompt=ticket.prompt * self._prompt_ratio,
            predicted=min(budget, predicted),
            started=now,
            interactive=interactive,
        )

    @property
    def _block(self) -> int:
        """Tokens a sequence may waste in its last, partly filled KV block."""
        return 0 if self.last is None or self.last.block_size is None else self.last.block_size

    def _sizes(self, now: float) -> list[tuple[float, float]]:
        """(size now, tokens still to come) of every running request (rule 2)."""
        rate = self._decode_rate or 0.0
        block = self._block
        out = []
        for run in self._runs.values():
            generated = min(max(0.0, run.predicted - 1), (now - run.started) * rate)
            out.append((run.prompt + generated + block, run.predicted - generated))
        return out

    def _accounted(self, now: float) -> float:
        """KV the gateway's own running requests may hold at ``now``, by its account:
        their final sizes until the decode rate is measured (so that the tokens they
        generated meanwhile are not taken for another client's)."""
        if self._decode_rate is None:
            return sum(size + left for size, left in self._sizes(now))
        return sum(size for size, _ in self._sizes(now))

    def _peak(self, now: float, new: _Run | None = None) -> float:
        """The most KV the running requests (and ``new``) will hold at once (rule 2)."""
        sizes = self._sizes(now)
        if new is not None:
            sizes.append((new.prompt + self._block, new.predicted))
        sizes.sort(key=lambda item: -item[1])
        peak = held = 0.0
        for count, (size, left) in enumerate(sizes, 1):
            held += size
            peak = max(peak, held + count * left)
        return peak + self._external

    def _note_interactive(self, now: float) -> None:
        """Record what interactive work holds now, for the window's peak (rule 4)."""
        tokens = 0.0
        seqs = 0
        for run in self._runs.values():
            if run.interactive:
                tokens += run.prompt + run.predicted
                seqs += 1
        window = self._interactive_peak
        while window and window[-1][1] <= tokens and window[-1][2] <= seqs:
            window.pop()
        window.append((now, tokens, seqs))

    def _interactive_reserve(self, now: float, recent: bool) -> tuple[int, float]:
        """(sequences, KV tokens) batch leaves free for interactive work (rule 4)."""
        window = self._interactive_peak
        horizon = now - self.config.reserve_window
        while window and window[0][0] < horizon:
            window.popleft()
        tokens = max((item[1] for item in window), default=0.0) if recent else 0.0
        seqs = max((item[2] for item in window), default=0) if recent else 0
        typical = tokens / seqs if seqs else self._typical_interactive
        return seqs + 1, tokens + typical

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
