"""Self-sizing: the dispatch rule on scripted engine readings (pure, fake clock)."""

from __future__ import annotations

import itertools

import pytest

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse, Ticket
from herdless.gateway.core.engine import AHEAD, DEFER, PACE, Reading, Run, Running
from herdless.gateway.core.limits import AdmissionConfig, Priority
from herdless.gateway.core.prefixes import chain
from herdless.gateway.core.sizing import FILL, Sizing
from herdless.testing import FakeClock

pytestmark = [pytest.mark.server]

_ids = itertools.count(1)


def ticket(prompt: int, max_tokens: int, priority: Priority = "interactive") -> Ticket:
    return Ticket(
        id=next(_ids),
        key_id="key-a",
        price=prompt + max_tokens,
        offered_at=0.0,
        prompt=prompt,
        priority=priority,
    )


def reading(at: float, *, capacity: int = 10_000, usage: float = 0.0, **more: int) -> Reading:
    fields: dict[str, int] = {"running": 0, "waiting": 0, "preemptions": 0}
    fields |= {"generation_tokens": 0, "block_size": 0} | more
    return Reading(at=at, kv_capacity=capacity, kv_usage=usage, **fields)


def fill(sizing: Sizing, make: object, now: float = 0.0, *, limit: int = 1000) -> int:
    """Start tickets from ``make()`` until the rule holds one back; returns how many."""
    started = 0
    while started < limit:
        t = make()  # type: ignore[operator]
        if sizing.hold(t, now, recent_interactive=False) is not None:
            return started
        sizing.start(t, now, predicted=None)
        started += 1
    return started


def test_static_until_the_engine_says_its_size() -> None:
    sizing = Sizing(AdmissionConfig())
    assert (sizing.sized, sizing.limit) == (False, 64)
    assert fill(sizing, lambda: ticket(10, 10)) == 64
    assert sizing.hold(ticket(10, 10), 0.0, recent_interactive=False) == "cap"
    # A reading without the KV capacity (another server) keeps it static.
    sizing.observe(Reading(at=0.0, running=3, waiting=0))
    assert not sizing.sized


def test_it_grows_to_the_engines_room_not_a_count() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000))
    assert sizing.sized
    # 900 + 100 tokens each, none generated yet: int(FILL * 10_000 / 1_000) fit.
    assert fill(sizing, lambda: ticket(900, 100)) == int(FILL * 10_000 / 1_000)
    assert sizing.hold(ticket(900, 100), 0.0, recent_interactive=False) == "kv"
    # Short requests of the same engine: many more.
    small = Sizing(AdmissionConfig())
    small.observe(reading(0.0, capacity=10_000))
    assert fill(small, lambda: ticket(90, 10)) == int(FILL * 10_000 / 100)


def test_the_caps_bound_the_engines_room() -> None:
    sizing = Sizing(AdmissionConfig(max_concurrency=3, max_inflight_tokens=5_000))
    sizing.observe(reading(0.0, capacity=10_000))
    assert fill(sizing, lambda: ticket(10, 10)) == 3
    tokens = Sizing(AdmissionConfig(max_inflight_tokens=5_000))
    tokens.observe(reading(0.0, capacity=10_000))
    assert fill(tokens, lambda: ticket(900, 100)) == 5


def test_a_request_the_gateway_would_run_alone_starts_whatever_its_size() -> None:
    """Nothing of the gateway's own can end to make room for it: held, it would wait its
    whole hold (and the queue behind it) for a 429 that never turns into an answer."""
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000))
    first = ticket(100, 100)
    sizing.start(first, 0.0, predicted=None)
    huge = ticket(9_950, 100)  # its prompt alone is over FILL x capacity
    assert sizing.hold(huge, 0.0, recent_interactive=False) == "kv"  # one of its own runs
    sizing.finish(first, 1.0, prompt_tokens=100, completion_tokens=100)
    assert sizing.hold(huge, 1.0, recent_interactive=False) is None  # alone: it starts
    # Batch keeps its interactive reserve beside running requests, not on an idle engine:
    # with a learned max_num_seqs of 1, a reserve of one sequence would hold it for ever.
    one = Sizing(AdmissionConfig())
    for at in (0.0, 0.25, 0.5, 0.75, 1.0):
        one.observe(reading(at, running=1, waiting=3, usage=0.05))
    assert one.seq_limit == 1
    one.observe(reading(1.25, running=0, waiting=0, usage=0.0))
    assert one.hold(ticket(10, 10, "batch"), 1.25, recent_interactive=False) is None
    chat = ticket(10, 10)
    one.start(chat, 1.25, predicted=None)
    assert one.hold(ticket(10, 10, "batch"), 1.25, recent_interactive=False) == "seqs"


def test_prompt_blocks_the_engine_shares_leave_room_once_it_has_taken_them_in() -> None:
    """A batch job whose requests share a 1,500-token instruction: vLLM's prefix cache
    holds it once. The gateway counts each request whole until a reading shows the
    engine past its prompt's pass, its prefix cache hitting and its queue empty; then
    what the engine holds less is room. New requests are still counted whole."""

    def measured(hits: int, waiting: int = 0) -> tuple[Sizing, list[Ticket]]:
        sizing = Sizing(AdmissionConfig())
        sizing.observe(reading(0.0, prefix_hits=0))
        warm = ticket(100, 100)
        sizing.start(warm, 0.0, predicted=None)
        sizing.observe(reading(0.5, running=1, generation_tokens=50, prefix_hits=0))
        sizing.observe(reading(1.0, running=1, generation_tokens=100, prefix_hits=0))
        sizing.finish(warm, 2.0, prompt_tokens=100, completion_tokens=100)  # 1 s of rest
        job = [ticket(1_500, 20, "batch") for _ in range(6)]
        for t in job:
            assert sizing.hold(t, 2.0, recent_interactive=False) is None
            sizing.start(t, 2.0, predicted=None)
        assert sizing.hold(ticket(1_500, 20, "batch"), 2.0, recent_interactive=False) == "kv"
        engine = {"running": 6, "generation_tokens": 200, "waiting": waiting}
        sizing.observe(reading(2.5, usage=0.17, prefix_hits=hits // 2, **engine))
        sizing.observe(reading(3.5, usage=0.17, prefix_hits=hits, **engine))
        return sizing, job

    sizing, job = measured(hits=9_000)
    more = fill(sizing, lambda: ticket(1_500, 20, "batch"), 3.5)
    # (99 % of 10,000, less the 1,700 the engine holds, less its answers to come) / 1,520
    assert more == 5
    unshared, _ = measured(hits=0)
    assert fill(unshared, lambda: ticket(1_500, 20, "batch"), 3.5) == 0
    # Prompts estimated longer than the engine counted them are no saving: the room is at
    # most what the prefix cache found.
    few, _ = measured(hits=1_600)
    assert fill(few, lambda: ticket(1_500, 20, "batch"), 3.5) == 1
    queued, _ = measured(hits=9_000, waiting=1)  # one may hold no block yet
    assert fill(queued, lambda: ticket(1_500, 20, "batch"), 3.5) == 0
    # The shared requests end: what they saved goes with them, before the next reading.
    ended, job = measured(hits=9_000)
    for t in job:
        ended.finish(t, 3.6, prompt_tokens=1_500, completion_tokens=20)
    assert fill(ended, lambda: ticket(1_500, 20, "batch"), 3.6) == 6


def test_answers_are_predicted_from_the_settled_usage_not_max_tokens() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000))
    first = ticket(400, 600)
    sizing.start(first, 0.0, predicted=None)
    sizing.finish(first, 1.0, prompt_tokens=400, completion_tokens=100)
    # The class's answers now average 100 tokens: 500 per request, not 1,000.
    assert fill(sizing, lambda: ticket(400, 600), 1.0) == int(FILL * 10_000 / 500)
    # A user's own average wins over the class's.
    other = Sizing(AdmissionConfig())
    other.observe(reading(0.0, capacity=10_000))
    t = ticket(400, 600)
    assert other.hold(t, 0.0, recent_interactive=False) is None
    other.start(t, 0.0, predicted=600)
    assert other._peak(0.0) == 1_000


def test_until_an_answer_ends_here_the_engines_mean_answer_is_the_prediction() -> None:
    # A gateway just started in front of an engine that has answered 100 tokens a request.
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000, answer_tokens=1_000, answers=10))
    assert fill(sizing, lambda: ticket(400, 600)) == int(FILL * 10_000 / 500)
    # At most a request's max_tokens.
    capped = Sizing(AdmissionConfig())
    capped.observe(reading(0.0, capacity=10_000, answer_tokens=1_000, answers=10))
    assert fill(capped, lambda: ticket(450, 20)) == int(FILL * 10_000 / 470)
    # Its own answers then predict: the class's average.
    first = ticket(400, 600)
    own = Sizing(AdmissionConfig())
    own.observe(reading(0.0, capacity=10_000, answer_tokens=1_000, answers=10))
    own.start(first, 0.0, predicted=None)
    own.finish(first, 1.0, prompt_tokens=400, completion_tokens=300)
    assert fill(own, lambda: ticket(400, 600), 1.0) == int(FILL * 10_000 / 700)
    # An engine that has finished nothing: max_tokens, as before.
    fresh = Sizing(AdmissionConfig())
    fresh.observe(reading(0.0, capacity=10_000, answer_tokens=0, answers=0))
    assert fill(fresh, lambda: ticket(400, 600)) == int(FILL * 10_000 / 1_000)


def open_ticket(prompt: int, assumed: int = 512) -> Ticket:
    """A request that names no ``max_tokens``, priced at the gateway's default."""
    made = ticket(prompt, assumed)
    made.open_ended = True
    return made


def test_a_request_without_max_tokens_is_predicted_as_measured_not_at_the_default() -> None:
    """Chat front-ends name no ``max_tokens``: the price's default (512) is a guess, not
    the answer's end, so it caps no prediction; only a ``max_tokens`` named does."""
    engine = Sizing(AdmissionConfig())  # answers of 1,200 on the engine so far
    engine.observe(reading(0.0, capacity=10_000, answer_tokens=12_000, answers=10))
    assert fill(engine, lambda: open_ticket(400)) == int(FILL * 10_000 / 1_600)
    named = Sizing(AdmissionConfig())
    named.observe(reading(0.0, capacity=10_000, answer_tokens=12_000, answers=10))
    assert fill(named, lambda: ticket(400, 512)) == int(FILL * 10_000 / 912)
    # Nothing measured: the default is the guess.
    fresh = Sizing(AdmissionConfig())
    fresh.observe(reading(0.0, capacity=10_000))
    assert fill(fresh, lambda: open_ticket(400)) == int(FILL * 10_000 / 912)
    # Its own answers, past the default: none is taken for one cut there.
    own = Sizing(AdmissionConfig())
    own.observe(reading(0.0, capacity=10_000))
    for completion in (1_200, 1_000):
        done = open_ticket(400)
        own.start(done, 0.0, predicted=None)
        own.finish(done, 1.0, prompt_tokens=400, completion_tokens=completion)
    assert fill(own, lambda: open_ticket(400), 1.0) == int(FILL * 10_000 / 1_560)


def test_a_run_without_max_tokens_past_its_prediction_may_end_any_moment() -> None:
    """Once past its predicted answer, a request with a ``max_tokens`` is expected to
    run to it; one without, to the default its price assumed, and past both, to end
    now. Its tokens made are not capped at the default."""
    rate = 100.0  # tokens a second

    def run(predicted: float, budget: float, open_ended: bool = True) -> Run:
        return Run(
            prompt=10,
            predicted=predicted,
            budget=budget,
            started=0.0,
            interactive=True,
            open_ended=open_ended,
        )

    named, guessed, long = run(300, 800, open_ended=False), run(300, 512), run(1_200, 512)
    for run, at, end in ((named, 4.0, 8.0), (guessed, 4.0, 5.12), (long, 13.0, 12.0)):
        runs = Running()
        runs.add(1, run)
        assert runs.ends(rate, at)[0] == pytest.approx(end)
    assert (named.made(20.0, rate, 0.0), long.made(20.0, rate, 0.0)) == (800, 2_000)


def test_the_first_prompt_count_replaces_the_guess_later_ones_are_averaged() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000))
    first = ticket(200, 0)
    sizing.start(first, 0.0, predicted=None)
    sizing.sample_prompt(b"{}", 200)
    assert sizing.prompt_sample == (b"{}", 200)
    sizing.count_prompt(200, 100)  # the engine counts half the estimate
    assert (sizing.prompt_counted, sizing.prompt_sample) == (True, None)
    running = sizing._runs.get(first.id)
    assert running is not None
    assert running.prompt == 100  # it started on the guess: counted anew
    assert fill(sizing, lambda: ticket(200, 0)) == int(FILL * 10_000 / 100) - 1
    sizing.count_prompt(200, 200)  # a later count moves the ratio a fifth of the way
    assert sizing._prompt_ratio == pytest.approx(0.6)
    assert running.prompt == 100
    sizing.sample_prompt(b"{}", 200)
    assert sizing.prompt_sample is None  # counted: no sample is kept
    sizing.reset()  # another engine, maybe another tokenizer
    assert not sizing.prompt_counted
    second = ticket(200, 0)
    sizing.start(second, 1.0, predicted=None)
    sizing.count_prompt(200, 300)  # the new engine's first count
    after = sizing._runs.get(second.id)
    assert after is not None
    assert after.prompt == 300  # started on the guess: counted anew
    assert running.prompt == 100  # counted on the engine before: not scaled twice


def test_the_prompt_estimate_is_calibrated_by_the_engines_counts() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000))
    for _ in range(40):  # the engine counts twice the prompt the gateway estimated
        t = ticket(100, 0)
        sizing.start(t, 0.0, predicted=None)
        sizing.finish(t, 0.0, prompt_tokens=200, completion_tokens=0)
    assert fill(sizing, lambda: ticket(100, 0)) == pytest.approx(FILL * 10_000 / 200, abs=2)


def test_requests_half_done_leave_room_the_final_sizes_would_not() -> None:
    """Each running sequence gains one token per step: the peak is not the sum of finals."""
    staggered = Sizing(AdmissionConfig())
    staggered.observe(reading(0.0, capacity=10_000, running=1, generation_tokens=0))
    staggered.observe(reading(1.0, capacity=10_000, running=1, generation_tokens=100))
    # 100 tokens per second per sequence; one request every second, 100 + 400 each.
    for second in range(4):
        staggered.start(ticket(100, 400), float(second), predicted=None)
    fresh = Sizing(AdmissionConfig())
    fresh.observe(reading(0.0, capacity=10_000))
    for _ in range(4):
        fresh.start(ticket(100, 400), 3.0, predicted=None)
    # The oldest ends before the newest grows: their peak is below 4 x 500.
    assert staggered._peak(3.0) < fresh._peak(3.0) == 2_000


def test_the_running_requests_ends_are_predicted_by_the_engines_decode_rate() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000, running=1, generation_tokens=0))
    assert sizing.predicted_ends(1.0) is None  # no decode rate yet
    sizing.observe(reading(1.0, capacity=10_000, running=1, generation_tokens=100))
    assert sizing.predicted_ends(1.0) is None  # none running
    sizing.start(ticket(10, 300), 1.0, predicted=None)  # 3 s at 100 tokens a second
    sizing.start(ticket(10, 500), 2.0, predicted=None)  # 5 s
    assert sizing.predicted_ends(2.0) == pytest.approx((4.0, 4.0))


def test_a_request_running_past_its_predicted_answer_is_predicted_at_its_max_tokens() -> None:
    """Answers of 50 tokens measured, then one of max_tokens 400 starts: predicted to end
    0.5 s later. Still running after that, its answer is longer than the typical one and
    its max_tokens is all that is known of it: 4 s."""
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000, running=1, generation_tokens=0))
    sizing.observe(reading(1.0, capacity=10_000, running=1, generation_tokens=100))
    short = ticket(10, 400)
    sizing.start(short, 1.0, predicted=None)
    sizing.finish(short, 1.5, prompt_tokens=10, completion_tokens=50)
    sizing.start(ticket(10, 400), 2.0, predicted=None)
    assert sizing.predicted_ends(2.4) == pytest.approx((2.5, 0.5))
    assert sizing.predicted_ends(2.6) == pytest.approx((6.0, 4.0))
    sizing.start(ticket(10, 400), 2.8, predicted=None)  # within its prediction: first to end
    assert sizing.predicted_ends(3.0) == pytest.approx((3.3, 2.25))


def test_a_runs_time_beyond_its_decode_is_measured_and_predicted() -> None:
    """Runs that took 0.5 s more than their answers at the decode rate (the prompt's
    pass, the answer's way back): the next ones are predicted to end 0.5 s later."""
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000, running=1, generation_tokens=0))
    sizing.observe(reading(1.0, capacity=10_000, running=1, generation_tokens=100))
    for _ in range(3):
        done = ticket(10, 100)
        sizing.start(done, 1.0, predicted=None)
        sizing.finish(done, 2.5, prompt_tokens=10, completion_tokens=100)  # 1 s + 0.5 s
    sizing.start(ticket(10, 100), 3.0, predicted=None)
    assert sizing.predicted_ends(3.0) == pytest.approx((4.5, 1.5))


def test_what_a_run_made_is_its_time_past_the_prompts_pass_at_the_decode_rate() -> None:
    """Runs measured to take 0.5 s beyond their decode at 100 tokens a second: one running
    for 2 s has made 150 tokens, one running past its max_tokens' time 300 at most."""
    sizing = Sizing(AdmissionConfig())
    cut = ticket(10, 300)
    sizing.start(cut, 0.0, predicted=None)
    assert sizing.made(cut, 2.0) is None  # no decode rate measured yet
    sizing.observe(reading(0.0, capacity=10_000, running=1, generation_tokens=0))
    sizing.observe(reading(1.0, capacity=10_000, running=1, generation_tokens=100))
    done = ticket(10, 100)
    sizing.start(done, 1.0, predicted=None)
    sizing.finish(done, 2.5, prompt_tokens=10, completion_tokens=100)  # 1 s + 0.5 s
    assert sizing.made(cut, 0.4) == 0.0  # still in its prompt's pass
    assert sizing.made(cut, 2.0) == pytest.approx(150.0)
    assert sizing.made(cut, 9.0) == 300.0
    assert sizing.made(done, 3.0) is None  # it does not run


def test_short_answers_cut_at_their_max_tokens_leave_long_ones_predicted_long() -> None:
    """300-token answers, then four cut at a max_tokens of 32: the next request of
    max_tokens 300 is still predicted at 300 (3 s at 100 tokens a second), not 142."""
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000, running=1, generation_tokens=0))
    sizing.observe(reading(1.0, capacity=10_000, running=1, generation_tokens=100))
    for max_tokens in (300, 32, 32, 32, 32):
        done = ticket(10, max_tokens)
        sizing.start(done, 1.0, predicted=None)
        sizing.finish(done, 1.0, prompt_tokens=10, completion_tokens=max_tokens)
    sizing.start(ticket(10, 300), 1.0, predicted=None)
    assert sizing.predicted_ends(1.0) == pytest.approx((4.0, 3.0))


def test_batch_leaves_the_interactive_headroom_it_measured() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=100_000))
    chats = [ticket(100, 100) for _ in range(3)]
    for chat in chats:
        sizing.start(chat, 0.0, predicted=None)
    for chat in chats:
        sizing.finish(chat, 1.0, prompt_tokens=100, completion_tokens=100)

    started = 0
    while sizing.hold(batch(), 1.0, recent_interactive=True) is None:
        sizing.start(batch(), 1.0, predicted=None)
        started += 1
    # Three chats of 200 tokens ran at once: batch leaves half of 3 x 200 + one more free.
    assert started == int((FILL * 100_000 - 400) / 1_000)
    assert sizing.hold(batch(), 1.0, recent_interactive=True) == "reserve"
    # A chat still starts at once; without recent interactive work, batch may fill it.
    assert sizing.hold(ticket(100, 100), 1.0, recent_interactive=True) is None
    assert sizing.hold(ticket(100, 100, "batch"), 1.0, recent_interactive=False) is None


def batch() -> Ticket:
    return ticket(900, 100, "batch")


def paced_sizing() -> Sizing:
    """Thirty batch requests started at 0 s, ten ended at 2 s: a 2 s run, 30 at most."""
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000_000))
    first = [batch() for _ in range(30)]
    for t in first:
        sizing.start(t, 0.0, predicted=None)
    for t in first[:10]:
        sizing.finish(t, 2.0, prompt_tokens=900, completion_tokens=100)
    return sizing


def starts_at(sizing: Sizing, now: float) -> int:
    """Batch starts the rule lets go at ``now`` (interactive work recent)."""
    started = 0
    while sizing.hold(batch(), now, recent_interactive=True) is None:
        sizing.start(batch(), now, predicted=None)
        started += 1
    return started


def test_batch_starts_catch_up_after_a_pause_while_no_chat_runs() -> None:
    sizing = paced_sizing()
    # Up to AHEAD gaps saved by the pause and AHEAD ahead of the schedule, and its own
    # (the last one is due at 2 s exactly, give or take a float's rounding).
    assert starts_at(sizing, 2.0) + starts_at(sizing, 2.0 + 1e-6) == 2 * AHEAD + 1
    assert sizing.hold(batch(), 2.0, recent_interactive=True) == "spacing"
    # Then one per gap: PACE of a 2 s run over the most batch running (30).
    gap = PACE * 2.0 / 30
    assert sizing.batch_spaced_until == pytest.approx(2.0 + gap)
    assert starts_at(sizing, 2.0 + gap + 1e-6) == 1
    # Without interactive work around, a cohort harms nobody: no pacing.
    assert sizing.hold(batch(), 2.0, recent_interactive=False) is None


def test_batch_starts_keep_to_the_schedule_while_a_chat_runs() -> None:
    sizing = paced_sizing()
    sizing.start(ticket(100, 10), 2.0, predicted=None)
    assert starts_at(sizing, 2.0) == 1
    gap = PACE * 2.0 / 30
    assert sizing.batch_spaced_until == pytest.approx(2.0 + gap)
    assert starts_at(sizing, 2.0 + gap + 1e-6) == 1
    # A chat is never paced.
    assert sizing.hold(ticket(100, 10), 2.0, recent_interactive=True) is None


def chat_measured(sizing: Sizing, run: float) -> None:
    chat = ticket(100, 10)
    sizing.start(chat, 0.0, predicted=None)
    sizing.finish(chat, run, prompt_tokens=100, completion_tokens=10)


def test_a_due_batch_start_waits_for_chats_about_to_end() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=1_000_000))
    chat_measured(sizing, 0.2)  # a chat runs 0.2 s: a start waits at most 0.6 x that
    longest = DEFER * 0.2
    chat = ticket(100, 10)
    sizing.start(chat, 1.0, predicted=None)
    # Due at 1.1 s, the chat ends at about 1.2 s: the batch start waits for it.
    assert sizing.hold(batch(), 1.1, recent_interactive=True) == "spacing"
    assert sizing.batch_spaced_until == pytest.approx(1.2)
    # A chat that overruns its typical time is waited for until `longest` since due.
    assert sizing.hold(batch(), 1.2, recent_interactive=True) == "spacing"
    assert sizing.hold(batch(), 1.1 + longest, recent_interactive=True) is None
    # Once the chat ended, nothing holds it.
    sizing.finish(chat, 1.15, prompt_tokens=100, completion_tokens=10)
    assert sizing.hold(batch(), 1.15, recent_interactive=True) is None


def test_a_batch_start_does_not_wait_for_a_chat_that_just_began() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=1_000_000))
    chat_measured(sizing, 0.2)
    sizing.start(ticket(100, 10), 1.0, predicted=None)
    # It would end at 1.2 s, more than DEFER x 0.2 s away: waiting would not spare it.
    assert sizing.hold(batch(), 1.0, recent_interactive=True) is None


def test_preemptions_brake_and_quiet_readings_release() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=100_000, preemptions=0))
    sizing.observe(reading(0.25, capacity=100_000, preemptions=3))
    braked = sizing.fill
    assert braked < FILL
    assert sizing.preemptions_seen == 3
    assert fill(sizing, lambda: ticket(900, 100), 0.25) == int(braked * 100) < int(FILL * 100)
    for step in range(1, 200):
        sizing.observe(reading(0.25 + step * 0.25, capacity=100_000, preemptions=3))
    assert sizing.fill == FILL


def test_the_engines_own_queue_holds_starts_until_answers_end() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0))
    running = [ticket(10, 10) for _ in range(3)]
    for t in running:
        sizing.start(t, 0.0, predicted=None)
    sizing.observe(reading(0.25, waiting=2, running=3, usage=0.01))
    # Once may be prompts waiting a step for the engine's token budget: no hold yet.
    assert sizing.hold(ticket(10, 10, "batch"), 0.25, recent_interactive=False) is None
    sizing.observe(reading(0.5, waiting=2, running=3, usage=0.01))
    assert sizing.hold(ticket(10, 10, "batch"), 0.5, recent_interactive=False) == "engine_waiting"
    # A chat is not held back by a queue that drains: it is short.
    assert sizing.hold(ticket(10, 10), 0.5, recent_interactive=False) is None
    sizing.finish(running[0], 0.6, prompt_tokens=None, completion_tokens=None)
    # One ended, so one of the engine's waiters runs: the count is back to the slack.
    assert sizing.engine_waiting == 1
    assert sizing.hold(ticket(10, 10, "batch"), 0.6, recent_interactive=False) is None


def test_max_num_seqs_is_learned_when_the_engine_queues_twice_with_kv_to_spare() -> None:
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0))
    for at in (0.25, 0.5, 0.75):  # a moment of arrivals, or the per-step token budget
        sizing.observe(reading(at, running=4, waiting=3, usage=0.05))
        assert sizing.seq_limit is None
    sizing.observe(reading(1.0, running=4, waiting=2, usage=0.05))
    assert sizing.seq_limit == 4
    assert sizing.hold(ticket(10, 10, "batch"), 1.0, recent_interactive=False) == "engine_waiting"
    sizing.observe(reading(1.1, running=4, waiting=0, usage=0.05))
    assert fill(sizing, lambda: ticket(10, 10), 1.1) == 4
    assert sizing.hold(ticket(10, 10), 1.1, recent_interactive=False) == "seqs"
    # The engine ran more than learned: the limit is raised, never a ceiling it proved wrong.
    sizing.observe(reading(1.25, running=6, waiting=0, usage=0.05))
    assert sizing.seq_limit == 6
    sizing.observe(reading(1.5, running=6, waiting=0, usage=0.05))
    assert sizing.seq_limit == 6
    # Queueing with a full KV cache says nothing of max_num_seqs.
    kv = Sizing(AdmissionConfig())
    for at in (0.0, 0.25, 0.5, 0.75, 1.0, 1.25):
        kv.observe(reading(at, running=4, waiting=3, usage=0.95))
    assert kv.seq_limit is None


def test_stale_readings_hold_the_last_good_limit_never_zero() -> None:
    config = AdmissionConfig(stale_after=1.0)
    sizing = Sizing(config)
    sizing.observe(reading(0.0, capacity=100_000))
    for t in [ticket(900, 100) for _ in range(5)]:
        sizing.start(t, 0.0, predicted=None)
    sizing.observe(reading(0.25, capacity=100_000, running=5, usage=0.05))
    good = sizing.limit
    assert 5 < good < 100
    assert not sizing.failed(1.0)  # 0.75 s without a reading: not yet stale
    assert sizing.failed(1.5)
    # Below the last good limit starts go on; at it they stop ("stale"), never at zero.
    assert sizing.hold(ticket(900, 100), 1.5, recent_interactive=False) is None
    assert fill(sizing, lambda: ticket(900, 100), 1.5) == good - 5
    assert sizing.hold(ticket(900, 100), 1.5, recent_interactive=False) == "stale"
    sizing.observe(reading(2.0, capacity=100_000, running=good, usage=0.5))
    assert not sizing.stale


def test_its_own_starts_count_between_readings() -> None:
    """The engine's KV use lags: what the gateway started since is in its own account."""
    sizing = Sizing(AdmissionConfig())
    sizing.observe(reading(0.0, capacity=10_000, usage=0.0))
    assert fill(sizing, lambda: ticket(900, 100)) == 9  # no reading in between
    # Usage the gateway did not cause (another client of the engine) leaves less room.
    shared = Sizing(AdmissionConfig())
    shared.observe(reading(0.0, capacity=10_000, usage=0.5))
    assert fill(shared, lambda: ticket(900, 100)) == 4


def test_a_restarted_engine_is_learned_anew() -> None:
    sizing = Sizing(AdmissionConfig())
    for at in (0.0, 0.25, 0.5, 0.75, 1.0):
        sizing.observe(reading(at, running=4, waiting=3, usage=0.05, generation_tokens=500))
    assert sizing.seq_limit == 4
    # Counters went back: another process. A new model may have another KV capacity.
    sizing.observe(reading(1.25, capacity=20_000, generation_tokens=0))
    assert (sizing.seq_limit, sizing.kv_capacity) == (None, 20_000)
    sizing.reset()
    assert (sizing.sized, sizing.limit) == (False, 64)


def test_static_sizing_ignores_the_readings() -> None:
    sizing = Sizing(AdmissionConfig(sizing="static", max_concurrency=2))
    sizing.observe(reading(0.0, capacity=10_000))
    assert not sizing.sized
    assert fill(sizing, lambda: ticket(10, 10)) == 2


# -- through admission --------------------------------------------------------------------


def test_admission_dispatches_by_the_engines_room_and_advertises_the_live_limit() -> None:
    clock = FakeClock()
    adm = Admission(AdmissionConfig(max_queue=100), clock=clock)
    assert adm.key_capacity == 64 + 100
    adm.observe(reading(clock.monotonic(), capacity=10_000))
    decisions = [adm.offer("key-a", 1_000, prompt=900) for _ in range(12)]
    started = [d for d in decisions if isinstance(d, Admit)]
    waiting = [d for d in decisions if isinstance(d, Enqueued)]
    assert (len(started), len(waiting)) == (9, 3)
    assert adm.held is None
    assert adm.dispatch() == []
    assert adm.held == "kv"
    # The limit follows the engine: about KV / the typical request, plus the queue.
    adm.observe(reading(clock.monotonic(), capacity=10_000, usage=0.9, running=9))
    assert adm.limit == 9
    assert adm.key_capacity == 9 + 100
    clock.advance(1.0)
    adm.release(started[0].ticket, prompt_tokens=900, completion_tokens=100)
    assert [t.id for t in adm.dispatch()] == [waiting[0].ticket.id]


def test_the_predicted_wait_uses_the_measured_drain_rate() -> None:
    clock = FakeClock()
    adm = Admission(AdmissionConfig(max_concurrency=2, max_queue=100), clock=clock)
    first = [adm.offer("key-a", 20, prompt=10) for _ in range(2)]
    # Answers finish at 4 per second, measured over 2 s.
    tickets = [d.ticket for d in first if isinstance(d, Admit)]
    for _ in range(8):
        clock.advance(0.25)
        done = tickets.pop(0)
        adm.release(done, prompt_tokens=10, completion_tokens=10)
        nxt = adm.offer("key-a", 20, prompt=10)
        assert isinstance(nxt, Admit)
        tickets.append(nxt.ticket)
    assert adm.drain_rate() == pytest.approx(8 / 1.75)
    for _ in range(9):
        adm.offer("key-a", 20, prompt=10)
    # The 10th waiter: place 10 at about 4.6 answers per second is about 2.2 s.
    refused = adm.offer("key-a", 20, prompt=10, deadline=2.0)
    assert not isinstance(refused, Admit | Enqueued)
    assert refused.code == "deadline_unattainable"
    fits = adm.offer("key-a", 20, prompt=10, deadline=3.0)
    assert isinstance(fits, Enqueued)


def first_wave(clock: FakeClock) -> tuple[Admission, list[Ticket]]:
    """8 running (300 tokens each at 75 a second: 4 s) and 16 queued, a second in."""
    adm = Admission(AdmissionConfig(max_concurrency=8, max_queue=16), clock=clock)
    adm.observe(reading(clock.monotonic(), capacity=100_000, running=0))
    offered = [adm.offer("key-a", 310, prompt=10) for _ in range(24)]
    assert [type(d) for d in offered] == [Admit] * 8 + [Enqueued] * 16
    clock.advance(0.25)
    adm.observe(reading(clock.monotonic(), capacity=100_000, running=8))
    clock.advance(0.25)
    adm.observe(reading(clock.monotonic(), capacity=100_000, running=8, generation_tokens=150))
    clock.advance(0.5)
    return adm, [d.ticket for d in offered if isinstance(d, Admit)]


def refused(adm: Admission) -> Refuse:
    decision = adm.offer("key-a", 310, prompt=10)
    assert isinstance(decision, Refuse)
    assert decision.code == "queue_full"
    return decision


def test_a_first_wave_s_refusals_name_when_its_answers_end() -> None:
    """Before any answer ended, a full queue frees no place until the first running
    request ends: told a fraction of a second (one answer per guessed second over the
    running), a client with two retries spends both before the wave ends."""
    clock = FakeClock()
    adm, _ = first_wave(clock)
    # The wave ends 4 s after it started (3 s from now); a place frees per 4 s / 8
    # running from then, the first caller told one past the end as one is past now.
    assert [refused(adm).retry_after for _ in range(3)] == pytest.approx([3.5, 4.0, 4.5])
    assert adm.drain_rate() == pytest.approx(2.0)


def test_a_wave_of_long_answers_after_short_ones_is_told_when_it_ends() -> None:
    """Short answers measured (50 tokens, 8 a second), then 24 long requests fill the 8
    running places and the 16 queued ones. Once no answer came for three of the measured
    gaps, the short answers' pace is not believed, and the running requests, past the
    short answer predicted for them, are predicted at their max_tokens: the refusals name
    the wave's end. Told the short answers' pace (0.15 s a place), openai-node spent its
    two retries before any place freed."""
    clock = FakeClock()
    adm = Admission(AdmissionConfig(max_concurrency=8, max_queue=16), clock=clock)
    for _ in range(40):
        short = adm.offer("key-a", 310, prompt=10)
        assert isinstance(short, Admit)
        clock.advance(0.125)
        adm.release(short.ticket, prompt_tokens=10, completion_tokens=50)
    adm.observe(reading(clock.monotonic(), capacity=100_000, running=8))
    clock.advance(0.25)
    adm.observe(reading(clock.monotonic(), capacity=100_000, running=8, generation_tokens=150))
    offered = [adm.offer("key-a", 310, prompt=10) for _ in range(24)]
    assert [type(d) for d in offered] == [Admit] * 8 + [Enqueued] * 16
    clock.advance(0.1)  # 0.35 s since the last answer, under three gaps: its rate stands
    assert refused(adm).retry_after == pytest.approx(5.225 / 40)  # 40 since the first
    clock.advance(0.9)  # a second in, no answer yet: 4 s a request at 75 tokens a second
    assert [refused(adm).retry_after for _ in range(3)] == pytest.approx([3.5, 4.0, 4.5])


def test_once_answers_are_measured_their_rate_names_the_places() -> None:
    clock = FakeClock()
    adm, running = first_wave(clock)
    for done in running[:5]:  # 4 answers a second, sooner than predicted
        clock.advance(0.25)
        adm.release(done, prompt_tokens=10, completion_tokens=300)
        adm.dispatch()
    assert [type(adm.offer("key-a", 310, prompt=10)) for _ in range(5)] == [Enqueued] * 5
    # 5 answers over the second since the first: a place every 0.2 s from now, though the
    # three first requests still running were predicted to end 1.75 s from now.
    assert adm.drain_rate() == pytest.approx(5.0)
    assert refused(adm).retry_after == pytest.approx(0.2)


def test_an_answer_cut_short_teaches_the_sizing_no_answer_length() -> None:
    """A stream its client stopped after 5 tokens says nothing of how long answers are:
    the engine's room is filled as if it had not run; a whole answer of 5 would teach it."""

    def room(after: list[tuple[int, bool]]) -> int:
        clock = FakeClock()
        adm = Admission(AdmissionConfig(max_queue=1000), clock=clock)
        adm.observe(reading(clock.monotonic(), capacity=10_000))
        for completion, whole in after:
            decision = adm.offer("key-a", 1_000, prompt=400)
            assert isinstance(decision, Admit)
            adm.release(
                decision.ticket, prompt_tokens=400, completion_tokens=completion, whole=whole
            )
        decisions = [adm.offer("key-a", 1_000, prompt=400) for _ in range(100)]
        return sum(isinstance(d, Admit) for d in decisions)

    whole = room([(100, True)])
    assert room([(100, True), (5, False)]) == whole
    assert room([(100, True), (5, True)]) > whole


def test_an_answer_cut_with_nothing_seen_is_charged_what_the_decode_rate_made() -> None:
    """A body not streamed whose client left (a timeout, an SDK's deadline or hedge) shows
    the gateway no token: it is charged what the engine's measured decode rate made in its
    run (100 tokens a second here), at most its max_tokens; with no rate, its price."""

    def charged(run: float, *, rate: bool) -> tuple[float | None, int, Ticket]:
        clock = FakeClock()
        adm = Admission(AdmissionConfig(max_queue=10), clock=clock)
        adm.observe(reading(clock.monotonic(), running=1))
        if rate:
            clock.advance(1.0)
            adm.observe(reading(clock.monotonic(), running=1, generation_tokens=100))
        decision = adm.offer("key-a", 1_010, prompt=10, user="u")
        assert isinstance(decision, Admit)
        clock.advance(run)
        adm.release(decision.ticket, whole=False)
        counter = adm.queue.counter("interactive", "key-a/u")
        return counter, adm.queue.served_tokens["interactive"], decision.ticket

    assert charged(2.0, rate=True)[:2] == (10 + 2 * 200, 10 + 200)
    assert charged(20.0, rate=True)[:2] == (10 + 2 * 1_000, 1_010)
    counter, served, cut = charged(2.0, rate=False)
    assert (counter, served) == (cut.charged, 1_010)  # its price stands


def test_a_request_vllm_did_not_run_is_charged_nothing_and_teaches_nothing() -> None:
    """vLLM refused it (a 400, a 404): its 0 tokens settle its user's share, and its
    prompt count of 0 is not the engine's count of a prompt (the room for the next is
    the same; taken for one, it would grow)."""

    def after(refused: int, *, whole: bool) -> tuple[float | None, int, int]:
        clock = FakeClock()
        adm = Admission(AdmissionConfig(max_queue=1000), clock=clock)
        adm.observe(reading(clock.monotonic(), capacity=10_000))
        for _ in range(refused):
            decision = adm.offer("key-a", 1_000, prompt=400, user="u")
            assert isinstance(decision, Admit)
            nothing = {"used_tokens": 0, "prompt_tokens": 0, "completion_tokens": 0}
            adm.release(decision.ticket, **nothing, whole=whole)
        counter = adm.queue.counter("interactive", "key-a/u")
        served = adm.queue.served_tokens["interactive"]
        decisions = [adm.offer("key-a", 1_000, prompt=400) for _ in range(100)]
        return counter, served, sum(isinstance(d, Admit) for d in decisions)

    room = after(0, whole=False)[2]
    assert after(20, whole=False) == (0.0, 0, room)
    assert after(20, whole=True)[2] > room


def test_a_run_cut_short_or_not_run_teaches_no_run_time() -> None:
    """A 400 answered in 2 ms says nothing of how long answers run: neither the mean run
    time (rule 7's drain hope, a refused caller's time before answers are measured) nor
    the batch pacing's run time moves; a whole answer teaches both."""
    clock = FakeClock()
    adm = Admission(AdmissionConfig(max_queue=10), clock=clock)
    adm.observe(reading(clock.monotonic(), capacity=10_000))
    before = adm.mean_service_time

    def run(seconds: float, *, whole: bool) -> None:
        decision = adm.offer("key-a", 1_000, prompt=400, priority="batch")
        assert isinstance(decision, Admit)
        clock.advance(seconds)
        tokens = {"used_tokens": 0, "prompt_tokens": 0, "completion_tokens": 0}
        adm.release(decision.ticket, **tokens, whole=whole)

    for _ in range(5):
        run(0.002, whole=False)
    assert adm.mean_service_time == before
    assert adm.sizing._pacing.batch_run is None
    run(2.0, whole=True)
    assert adm.mean_service_time != before
    assert adm.sizing._pacing.batch_run == pytest.approx(2.0)


def test_a_prompt_that_begins_as_one_the_engine_holds_is_counted_past_the_shared_blocks() -> None:
    """Chats that share a long system prompt: once the engine has taken one in and its
    prefix cache finds prompts, a new one that begins with the same text takes KV only for
    the rest of its prompt, before any reading shows it. Another text, or an engine whose
    cache finds nothing, is counted whole; so is each until the first is taken in."""
    system = chain("", ["You follow the house rules. " * 100])  # 2,800 characters
    assert len(system) == 10  # 640 tokens at the estimate: 624 of them in whole blocks

    def chat(links: tuple[int, ...]) -> Ticket:
        made = ticket(700, 20)
        made.prefix = links
        return made

    firsts: list[Ticket] = []

    def engine(hits: int, *, queued: int = 0) -> Sizing:
        sizing = Sizing(AdmissionConfig())
        sizing.observe(reading(0.0, prefix_hits=0, block_size=16))
        warm = ticket(100, 100)
        sizing.start(warm, 0.0, predicted=None)
        sizing.observe(reading(0.5, running=1, generation_tokens=50, prefix_hits=0))
        sizing.observe(reading(1.0, running=1, generation_tokens=100, prefix_hits=0))
        sizing.finish(warm, 2.0, prompt_tokens=100, completion_tokens=100)  # 1 s of rest
        sizing.start(first := chat(system), 2.0, predicted=None)
        firsts.append(first)
        running = {"running": 1, "generation_tokens": 200, "block_size": 16}
        sizing.observe(reading(2.5, usage=0.07, prefix_hits=hits // 2, **running))
        # Past its prompt's pass, a second after it started; taken in if nothing queues.
        sizing.observe(reading(4.0, usage=0.07, prefix_hits=hits, waiting=queued, **running))
        return sizing

    # 99 % of 10,000 over 700 - 624 + a block of 16 + 20 answered each (the first, about
    # done, ends before they grow).
    found = engine(hits=600)
    assert fill(found, lambda: chat(system), 4.0) == 88
    assert found.shared_prompt_tokens == 88 * 624  # /metrics: engine_shared_prompt_tokens
    # Four links in common: 256 tokens, 240 of them in whole blocks: (9,900 less the
    # first's 735) over 700 - 240 + 16 each at their start.
    assert fill(engine(hits=600), lambda: chat((*system[:4], 1, 2)), 4.0) == 19
    whole = fill(engine(hits=600), lambda: chat(tuple(range(10))), 4.0)
    assert whole == 12  # (9,900 - 735) over 716
    assert fill(engine(hits=0), lambda: chat(system), 4.0) == whole  # the cache finds none
    assert fill(engine(hits=600, queued=1), lambda: chat(system), 4.0) == whole
    # The first ends while the ones that share its blocks run: the engine holds the 624
    # tokens they share until they end, and the account keeps them (until a reading).
    sizing = engine(hits=600)
    sharing = [chat(system) for _ in range(10)]
    for t in sharing:
        sizing.start(t, 4.0, predicted=None)
    sizing.finish(firsts[-1], 4.1, prompt_tokens=700, completion_tokens=20)
    # They hold the links they found: a new one still finds them, and the 624 tokens take
    # the room of six such (85 start with them taken for free).
    assert fill(sizing, lambda: chat(system), 4.1) == 79


def test_a_bursts_first_chat_shares_its_prompt_blocks_once_the_engine_queues_nothing() -> None:
    """The first chats of a burst, before any has ended (the gateway knows no prompt's
    pass time yet): the engine caches a prompt's blocks as it takes the request in, so
    once a reading shows its queue empty, a chat started by the reading before holds all
    its links, and a new one that begins alike is counted past them; so are those sent
    with it, counted whole at their start."""
    system = chain("", ["You follow the house rules. " * 100])  # 624 tokens in whole blocks

    def chat(links: tuple[int, ...]) -> Ticket:
        made = ticket(700, 20)
        made.prefix = links
        return made

    def burst(*, started: float = 0.0, hits: int = 600, queued: int = 0, n: int = 1) -> Sizing:
        sizing = Sizing(AdmissionConfig())
        for at in (-0.25, 0.0):  # an idle engine, read
            sizing.observe(reading(at, prefix_hits=0, block_size=16))
        for _ in range(n):  # they found the prompt cached; the gateway saw none held
            sizing.start(chat(system), started, predicted=None)
        assert sizing.shared_prompt_tokens == 0
        engine = {"running": n - queued, "waiting": queued, "block_size": 16}
        sizing.observe(reading(0.25, usage=0.07, prefix_hits=hits, **engine))
        return sizing

    # (99 % of 10,000 less the first's 720 + a block of 16) over 700 - 624 + 20 + 16 each.
    assert fill(burst(), lambda: chat(system), 0.25) == 81
    whole = fill(burst(), lambda: chat(tuple(range(10))), 0.25)
    assert whole == 12  # another text: (9,900 - 736) over 720 + a block
    assert fill(burst(hits=0), lambda: chat(system), 0.25) == whole  # the cache finds none
    assert fill(burst(queued=1), lambda: chat(system), 0.25) == whole  # it may not be in
    assert fill(burst(started=0.1), lambda: chat(system), 0.25) == whole  # sent since
    # Five sent together: the four after the first found its blocks in the engine, and
    # are counted so from the reading: (9,900 - 736 - 4 x 112) over 112.
    together = burst(n=5)
    assert together.shared_prompt_tokens == 4 * 624
    assert fill(together, lambda: chat(system), 0.25) == 77
    assert fill(burst(n=5, queued=1), lambda: chat(system), 0.25) == 8  # (9,900 - 5 x 736) / 736
