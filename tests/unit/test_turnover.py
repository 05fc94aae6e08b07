"""The wait estimator (``herdless._turnover``) on answers' arrival times, on a fake clock.

Each trace is when the answers of one burst reached the client, in the order the calls
were sent (a saturated backend answers them in that order). ``replay`` plays one against
a window of 8 (a gateway of 4 running + 4 waiting): every call asks for a slot at t=0,
a granted call is sent at once, the next answer frees the oldest sent call's slot.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from tests.unit._wait_traces import (
    VLLM_30,
    VLLM_30_LED,
    VLLM_30_LED_ROUND,
    VLLM_30_SPLIT,
    VLLM_100,
)

from herdless._turnover import Turnover
from herdless._window import SlotTicket, Window, WindowPolicy
from herdless.testing import FakeClock

# A real vLLM's shape (continuous batching, 4 sequences, 16-token answers on a 2-core CPU,
# as issue 24 measured it: 100 answers in about 136 s): clumps of four a few ms apart,
# about 5.4 s between clumps, +-8 %. Drawn from those figures (random.Random(24)). The
# bursts recorded from a real vLLM are in ``tests/unit/_wait_traces.py``.
VLLM_CLUMPS = [
    5.625,
    5.635,
    5.637,
    5.649,
    11.214,
    11.215,
    11.224,
    11.226,
    16.849,
    16.858,
    16.863,
    16.874,
    21.954,
    21.961,
    21.972,
    21.981,
    27.224,
    27.236,
    27.237,
    27.246,
    32.366,
    32.37,
    32.374,
    32.38,
    38.149,
    38.16,
    38.164,
    38.175,
    43.238,
    43.246,
    43.256,
    43.266,
    48.991,
    48.994,
    49.003,
    49.014,
    54.426,
    54.428,
    54.43,
    54.436,
    60.279,
    60.28,
    60.286,
    60.298,
    65.747,
    65.75,
    65.757,
    65.76,
    71.316,
    71.321,
    71.33,
    71.335,
    77.045,
    77.048,
    77.05,
    77.057,
    82.81,
    82.813,
    82.818,
    82.819,
    88.087,
    88.093,
    88.102,
    88.102,
    93.711,
    93.721,
    93.728,
    93.734,
    99.061,
    99.064,
    99.067,
    99.071,
    104.855,
    104.865,
    104.873,
    104.873,
    110.333,
    110.341,
    110.346,
    110.354,
    115.571,
    115.575,
    115.584,
    115.588,
    120.921,
    120.921,
    120.927,
    120.928,
    126.661,
    126.668,
    126.679,
    126.681,
    131.819,
    131.82,
    131.83,
    131.83,
    137.309,
    137.317,
    137.318,
    137.328,
]
# Recorded: 40 chats of 48 tokens from one AsyncClient through ``herdless serve
# --max-concurrency 4 --max-queue 4`` to ``herdless emulate --max-num-seqs 4``.
EMULATOR = [
    0.6688,
    0.6906,
    0.6991,
    0.7028,
    1.283,
    1.3097,
    1.3214,
    1.3243,
    1.8988,
    1.9243,
    1.9364,
    1.9384,
    2.5148,
    2.5405,
    2.5523,
    2.5549,
    3.1303,
    3.157,
    3.1684,
    3.1699,
    3.7463,
    3.7721,
    3.7842,
    3.7864,
    4.363,
    4.3888,
    4.3991,
    4.4012,
    4.9775,
    5.0033,
    5.0155,
    5.0176,
    5.5935,
    5.6455,
    5.6509,
    5.6526,
    6.209,
    6.2583,
    6.2599,
    6.2602,
]


@dataclass
class Replay:
    window: Window
    tickets: list[SlotTicket]
    granted: dict[int, float]  # call -> when it got its slot (s after the burst began)

    @property
    def spilled(self) -> list[int]:
        return [i for i, t in enumerate(self.tickets) if t.state == "spill"]


def replay(
    trace: Sequence[float], *, end: float = math.inf, last: bool = False, size: int = 8
) -> Replay:
    """Play ``trace`` (see the module docstring); waiters review their place once a
    clump is over, as their flow does when the window wakes one for it."""
    clock = FakeClock()
    window = Window(WindowPolicy(initial=size, minimum=size, maximum=size), clock=clock)
    start = clock.monotonic()
    tickets = [window.acquire(end=start + end, last=last) for _ in trace]
    sent: deque[SlotTicket] = deque()
    granted: dict[int, float] = {}

    def send_granted() -> None:
        for index, ticket in enumerate(tickets):
            if ticket.state == "granted" and not ticket.sent:
                window.sent(ticket)
                sent.append(ticket)
                granted[index] = clock.monotonic() - start

    send_granted()
    for at in trace:
        review = window.review_at()
        if review is not None and review < start + at:
            clock.advance(review + 0.001 - clock.monotonic())
            window.review()
        clock.advance(start + at - clock.monotonic())
        if not sent:
            break
        done = sent.popleft()
        window.answered(clock.monotonic() - done.sent_at, done)
        window.release(done)
        send_granted()
    return Replay(window, tickets, granted)


TRACES = [VLLM_CLUMPS, EMULATOR, VLLM_30, VLLM_30_SPLIT]
IDS = ["vllm-shaped", "emulator", "vllm-recorded", "vllm-split-batches"]


@pytest.mark.parametrize("trace", TRACES, ids=IDS)
def test_the_wait_predicted_after_the_first_clump_is_within_20_percent(
    trace: list[float],
) -> None:
    error = replay(trace).window.wait_error()
    # Every waiter's first prediction is made once the first clump is over.
    assert error["samples"] == min(64, len(trace) - 8 - 4)  # the last 64 are kept
    assert error["p50"] <= 0.20
    assert error["p90"] <= 0.50


def test_the_first_answer_of_a_batch_ahead_of_the_others_does_not_split_it() -> None:
    """Real vLLM on a busy CPU: a batch's first answer reaches the client a step (75 ms
    here) before its three others. Taken for a clump of one, the first clump read as one
    answer per answer time, every wait four times too long (issue 24: 300-400 %)."""
    turnover = Turnover()
    turnover.answered(0.8)
    turnover.completed(0.847, held=0.8, calls=8)
    turnover.settled(True)
    # One answer: the rest of its batch may be an engine step behind (half its hold,
    # 0.4 s, is waited for); until then only the best case judges.
    assert turnover.settles_at() == pytest.approx(0.847 + 0.5 * 0.8)
    assert turnover.wait(4, now=0.9) is None
    assert turnover.best(4, now=0.9) == 0.0  # the 8 at the backend may all answer now
    for at in VLLM_30[1:4]:
        turnover.answered(0.85)
        turnover.completed(at, held=0.85, calls=8)
        turnover.settled(True)
    # Over half a hold after its latest answer. Four answers per 0.8 s hold.
    assert turnover.settles_at() == pytest.approx(0.924 + 0.4)
    assert turnover.wait(4, now=1.3) is None
    assert turnover.wait(4, now=1.4) == pytest.approx(0.847 + 0.8 - 1.4)
    assert turnover.wait(5, now=1.4) == pytest.approx(0.847 + 1.6 - 1.4)
    for at in VLLM_30[4:8]:  # the next batch, 0.9 s on: the pace is measured
        turnover.answered(1.7)
        turnover.completed(at, held=1.7, calls=8)
        turnover.settled(True)
    assert turnover.firm
    assert turnover.samples == 1
    # Four answers a round, 0.91 s apart: the next four slots come a round after this
    # one began, the fifth a round later.
    assert turnover.wait(4, now=1.9) == pytest.approx(1.756 + 0.909 - 1.9, abs=1e-6)
    assert turnover.wait(5, now=1.9) == pytest.approx(1.756 + 2 * 0.909 - 1.9, abs=1e-6)


@pytest.mark.parametrize("trace", TRACES, ids=IDS)
@pytest.mark.parametrize("last", [False, True], ids=["with-fallback", "last"])
@pytest.mark.parametrize("share", [0.3, 0.5, 0.8, 1.0])
def test_no_waiter_is_told_to_leave_whose_answer_would_have_come_in_time(
    trace: list[float], last: bool, share: float
) -> None:
    end = trace[int(share * (len(trace) - 1))]  # the time it may stay: a share is served
    run = replay(trace, end=end, last=last)
    # In send order, call i is answered at trace[i] if nobody leaves; one that leaves
    # only brings the others' answers earlier.
    assert [i for i in run.spilled if trace[i] <= end] == []
    # ...and the estimate does send away those that could not make it, most of them
    # at the first clumps (a waiter that hoped leaves at its time limit: never later).
    hopeless = [i for i, answered in enumerate(trace) if answered > 1.5 * end]
    assert set(hopeless) <= set(run.spilled)


def test_a_pace_that_changes_within_the_burst_loses_nobody_with_a_deadline_to_spare() -> None:
    """The recorded 100-call burst: its first rounds 1.2-1.6 s apart, the rest 0.8-1.0 s
    (a shared machine). No estimate made in those first rounds can know that (the
    first predictions read about 20 % off); with the deadline of the real-engine check
    (twice the unrefused burst, 78 s), with a fallback or not, nobody is sent away, and
    the estimate has caught up by the end of the burst. With no time to spare (a
    deadline at a call's own answer) and a fallback, its 35 % margin shrinking with
    samples does not cover a pace 1.6 times faster than measured: not asserted."""
    for last in (False, True):
        run = replay(VLLM_100, end=78.0, last=last)
        assert run.spilled == []
        assert len(run.granted) == len(VLLM_100)
    window = replay(VLLM_100).window
    now = window._clock.monotonic()  # the burst's last answer (26.44 s)
    # Its last clump began at 26.15 s; the pace of the last 16 rounds is about 1 s (the
    # first rounds' 1.5 s are forgotten): the fifth slot from now is two rounds away.
    period = (26.15 - 11.086) / 16
    assert window._turnover.wait(5, now=now) == pytest.approx(26.15 - 26.439 + 2 * period, abs=0.1)


def _led(trace: Sequence[float], share: float) -> list[float]:
    """``trace`` with its first batch's other three answers ``share`` of the first
    answer's hold behind it (a slow engine step between them)."""
    led = list(trace)
    for i in (1, 2, 3):
        led[i] = trace[0] * (1 + share) + 0.001 * i
    assert led[3] < led[4]  # still before the next batch
    return led


@pytest.mark.parametrize("share", [0.3, 0.45])
def test_a_batch_whose_first_answer_leads_by_a_slow_step_is_one_clump(share: float) -> None:
    """The CI run that read 429 %: a batch's first answer more than a quarter of its
    hold ahead of the other three (a slow step on a shared CPU). Read as one answer per
    batch time, every wait was four times too long, and 28 of the 100 calls of the
    recorded burst left a GPU that would have served them in time. Up to half the hold
    the four are one clump."""
    error = replay(_led(VLLM_30, share)).window.wait_error()
    assert error["p50"] <= 0.20
    assert error["p90"] <= 0.50
    run = replay(_led(VLLM_100, share), end=78.0)
    assert run.spilled == []


@pytest.mark.parametrize("share", [0.6, 0.8, 1.0])
def test_a_first_answer_further_ahead_is_counted_with_its_batch(share: float) -> None:
    """Further ahead (a CI run: 139 %; real vLLM beside a busy loop on this CPU, four
    runs in 24: the first round's lone answer 0.3-1.0 s before its batch's three
    others, 111-704 %), the lone answer and the three others' clump made a pair, one
    answer per lead, firm at once: every wait two to four times too long (172-430 %
    here). The lone answer now waits for the next clump and is counted in it. What is
    left (p50 4-60 %): the pace is counted from the three others' clump, which real
    vLLM's runs bear out (its others came with the next round), but here they are that
    share of a round late, and so is every prediction."""
    error = replay(_led(VLLM_30, share)).window.wait_error()
    assert error["p50"] <= 0.65
    assert error["p90"] <= 0.80
    run = replay(_led(VLLM_100, share), end=78.0)
    assert run.spilled == []
    assert replay(_led(VLLM_100, share)).window.wait_error()["p50"] <= 0.45


@pytest.mark.parametrize("trace", [VLLM_30_LED, VLLM_30_LED_ROUND], ids=["half", "round"])
def test_a_recorded_lone_first_answer_sends_nobody_away(trace: list[float]) -> None:
    """Recorded (``tests/unit/_wait_traces.py``). With the lone answer's pair firm at
    once, their p50 read 111 % and 295 %, and with a fallback and a deadline at 0.5 and
    0.8 of the burst, the second sent 2 and 7 of its 30 calls away that the GPU answered
    in time (10 at the burst's end, where the first still sends one: not asserted)."""
    assert replay(trace).window.wait_error()["p50"] <= 0.40
    for last in (False, True):
        for share in (0.3, 0.5, 0.8):
            end = trace[int(share * (len(trace) - 1))]
            run = replay(trace, end=end, last=last)
            assert [i for i in run.spilled if trace[i] <= end] == []


def test_a_lone_first_answer_is_its_batch_s_leader_or_one_at_a_time() -> None:
    """The clump after a lone first answer (8 calls at the backend) tells which it was."""
    batch = Turnover()
    batch.answered(1.0)
    _clumps(batch, [1.0], held=1.0)  # the leader, straight in
    _clumps(batch, [1.7, 1.7, 1.71], held=1.7)  # its batch's three others, 0.7 s behind
    assert batch.wait(4, now=1.75) is None  # not over yet
    # Over: four answers per the leader's hold, from the others' clump on.
    assert batch.settles_at() == pytest.approx(1.71 + 0.5)  # half the leader's hold on
    assert batch.wait(4, now=2.25) == pytest.approx(1.7 + 1.0 - 2.25)
    assert batch.wait(5, now=2.25) == pytest.approx(1.7 + 2.0 - 2.25)
    _clumps(batch, [2.7, 2.7, 2.7, 2.7], held=2.0)  # the next batch: firm
    assert (batch.firm, batch.samples) == (True, 1)
    assert batch.wait(4, now=2.8) == pytest.approx(2.7 + 1.0 - 2.8)  # 4 (1 + 3) a second
    assert batch.settles_at() is None  # four answers, as the pair's clump had: over

    single = Turnover()
    single.answered(1.0)
    _clumps(single, [1.0, 2.0], held=1.0)  # a second apart: perhaps leaders of a batch
    assert single.wait(1, now=2.6) is None
    _clumps(single, [3.0], held=1.0)  # a third alone: one at a time, a second each
    assert single.wait(2, now=3.55) == pytest.approx(1.45)
    _clumps(single, [4.0], held=1.0)
    assert (single.firm, single.samples) == (True, 3)
    assert single.wait(2, now=4.05) == pytest.approx(1.95)


def test_two_lone_first_answers_are_counted_with_their_batch() -> None:
    """A batch split by slow steps into one answer, another, then the other two (8 calls
    at the backend). Read as one at a time after the second lone answer, every wait was
    the seconds between the two per answer: here twice too long."""
    turnover = Turnover()
    turnover.answered(1.0)
    _clumps(turnover, [0.3], held=0.3)  # the first leader
    _clumps(turnover, [0.8], held=0.8)  # the second, half a round later
    assert turnover.wait(4, now=0.96) is None  # over, and not known yet: a third, or a clump?
    _clumps(turnover, [1.0, 1.0], held=1.0)  # their batch's other two
    # Four answers per the first leader's hold, from the others' clump on.
    assert turnover.wait(4, now=1.2) == pytest.approx(1.0 + 0.3 - 1.2)
    _clumps(turnover, [2.0, 2.0, 2.0, 2.0], held=2.0)  # the next batch: firm
    assert (turnover.firm, turnover.samples) == (True, 1)
    assert turnover.wait(4, now=2.2) == pytest.approx(2.0 + 1.0 - 2.2)  # 4 (2 + 2) a second


def _split(trace: Sequence[float], first: float, second: float) -> list[float]:
    """``trace`` with its first batch split by slow steps: one answer at ``first`` of
    the batch's time, another at ``second``, then the other two."""
    split = list(trace)
    whole = trace[3]
    split[:4] = [whole * first, whole * second, whole, whole + 0.001]
    return split


@pytest.mark.parametrize(("first", "second"), [(0.3, 0.76), (0.2, 0.5), (0.4, 0.7)])
def test_a_batch_split_one_one_two_sends_no_more_away_than_whole(
    first: float, second: float
) -> None:
    """A CI run of the 100-call real-vLLM check read 115 % with the first round on
    time (``slow`` 0.99; no trace kept): what a batch split 1 + 1 + 2 gives when the
    two lone answers are read as an engine that answers one at a time. Replayed with
    the recorded 100-call burst so split: 52-140 % and 38-43 of its 100 calls sent
    away with the deadline at the burst's end (12 as recorded). Now the two leaders
    count in their batch: the waits are a share of a round short, never too long, and
    no more calls leave than with the batch whole."""
    split = _split(VLLM_100, first, second)
    error = replay(split).window.wait_error()
    assert error["p50"] <= 0.8
    whole = len(replay(VLLM_100, end=VLLM_100[-1]).spilled)
    assert len(replay(split, end=VLLM_100[-1]).spilled) <= whole
    assert replay(_split(VLLM_30, first, second)).window.wait_error()["p50"] <= 0.85


def test_a_burst_that_fits_its_deadline_loses_nobody() -> None:
    """Issue 24: 100 calls, 180 s, no fallback; the burst takes about 137 s."""
    run = replay(VLLM_CLUMPS, end=180.0, last=True)
    assert run.spilled == []
    assert len(run.granted) == len(VLLM_CLUMPS)


def _clumps(turnover: Turnover, times: Sequence[float], held: float = 5.0) -> None:
    """Answers at ``times`` from a full window of 8 (each held ``held`` seconds)."""
    for at in times:
        turnover.completed(at, held, calls=8)
        turnover.settled(True)


def test_the_silence_between_clumps_is_not_a_slowdown() -> None:
    turnover = Turnover()
    turnover.answered(5.0)
    _clumps(turnover, [5.0, 5.0, 5.0, 5.0, 10.0, 10.0, 10.0, 10.0])
    # Just after a clump and just before the next, the same next clump is expected: a
    # rate measured "to now" would read about twice as slow by then.
    assert turnover.wait(5, now=10.1) == pytest.approx(9.9)
    assert turnover.wait(5, now=14.9) == pytest.approx(5.1)
    assert turnover.wait(4, now=14.9) == pytest.approx(0.1)
    # Overdue: the next clump may come any moment, then one period per clump.
    assert turnover.wait(5, now=16.0) == pytest.approx(5.0)


def test_the_rest_of_a_clump_comes_at_once() -> None:
    turnover = Turnover()
    turnover.answered(5.0)
    _clumps(turnover, [5.0, 5.0, 5.0, 5.0, 10.0])  # the second clump's first answer
    assert turnover.wait(3, now=10.0) == 0.0  # its three others are due with it
    assert turnover.wait(4, now=10.0) == pytest.approx(5.0)


def test_before_the_pace_is_measured_only_the_best_case_judges() -> None:
    turnover = Turnover()
    turnover.answered(5.0)
    _clumps(turnover, [5.0])
    assert turnover.wait(1, now=5.0) is None  # one answer: a clump of 1, or of 8?
    # At best all 8 calls at the backend answer in this clump, then 8 per 5 s hold.
    assert turnover.best(7, now=5.05) == 0.0
    assert turnover.best(15, now=5.05) == 0.0
    assert turnover.best(16, now=5.05) == pytest.approx(5.0)
    # A clump is over after half its pace without an answer (here 2.5 s)...
    assert turnover.settles_at() == pytest.approx(7.5)
    # ...and a lone answer of 8 at the backend gives no estimate even then: it may
    # lead a batch whose others come later still.
    assert turnover.wait(1, now=8.0) is None
    assert turnover.best(16, now=8.0) == pytest.approx(5.0)
    _clumps(turnover, [10.0])  # the next clump: one answer, 5 s on...
    assert turnover.wait(1, now=10.05) is None  # ...the first one's batch, or the next?
    assert turnover.settles_at() == pytest.approx(12.5)
    # Over with one answer: two leaders of a batch still, or one at a time.
    assert turnover.wait(1, now=12.6) is None
    _clumps(turnover, [15.0])  # a third alone: one at a time, 5 s apart (next at 20 s)
    assert turnover.wait(1, now=17.6) == pytest.approx(2.4)
    assert turnover.wait(2, now=17.6) == pytest.approx(7.4)
    assert not turnover.firm
    _clumps(turnover, [20.0])  # every pair counts: firm
    assert turnover.firm
    assert turnover.samples == 3
    assert turnover.best(1, now=20.05) == turnover.wait(1, now=20.05) == pytest.approx(4.95)
    assert turnover.settles_at() is None  # as many answers as the clump before: over


def test_an_idle_backend_between_bursts_is_not_a_slow_one() -> None:
    turnover = Turnover()
    turnover.answered(5.0)
    _clumps(turnover, [5.0, 10.0, 15.0, 20.0])
    turnover.settled(False)  # the burst ended: the window emptied
    turnover.completed(600.0, 5.0)  # the next burst's first answer, ten minutes on
    turnover.settled(True)
    assert turnover.wait(2, now=600.05) == pytest.approx(9.95)  # still 5 s a clump


def test_the_margin_shrinks_with_samples_and_doubles_on_the_last_backend() -> None:
    turnover = Turnover()
    turnover.answered(1.0)
    _clumps(turnover, [1.0], held=1.0)
    assert (turnover.margin(False), turnover.margin(True)) == (0.35, 0.7)
    _clumps(turnover, [2.0, 3.0, 4.0, 5.0], held=1.0)  # four pairs of a full window
    assert turnover.margin(False) == pytest.approx(0.175)
    assert turnover.margin(True) == pytest.approx(0.35)


def test_an_error_is_relative_to_the_wait_or_the_answer_time() -> None:
    turnover = Turnover()
    turnover.answered(2.0)
    turnover.waited(predicted=1.0, actual=0.0)  # the first clump's near-zero waits
    turnover.waited(predicted=9.0, actual=10.0)
    turnover.waited(predicted=4.0, actual=4.0)
    assert turnover.error() == {"p50": pytest.approx(0.1), "p90": 0.5, "samples": 3.0}
