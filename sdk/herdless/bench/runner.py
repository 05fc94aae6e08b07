"""Arms, interleaved and repeated: the one loop every scenario measures with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Arm", "GaveUp", "Progress", "Runs", "cookbook_call", "interleaved_order", "run_arms"]

Runs = dict[str, list[dict[str, float]]]
"""Every repetition's figures, per arm, in arm order (what :func:`run_arms` returns)."""

Progress = Callable[[str], None]
"""Called once per finished run with a short description (drives the progress bar)."""


class GaveUp(Exception):
    """An arm's client stopped trying before the call was answered (a figure, not a
    failure of the benchmark)."""


def cookbook_call(send: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
    """``send``, retried by the OpenAI cookbook's recipe ("How to handle rate limits"),
    verbatim but async: random exponential waits of 1 to 60 s, on a 429 or a 5xx, six
    attempts; then ``GaveUp``. The retrying arm the scenarios set beside herdless."""
    import openai  # lazy: the bench extra
    import tenacity

    retrying = tenacity.retry(
        wait=tenacity.wait_random_exponential(min=1, max=60),
        stop=tenacity.stop_after_attempt(6),
        retry=tenacity.retry_if_exception_type((openai.RateLimitError, openai.InternalServerError)),
    )(send)

    async def call() -> None:
        try:
            await retrying()
        except tenacity.RetryError as exc:
            raise GaveUp("6 attempts") from exc

    return call


@dataclass(frozen=True, slots=True, kw_only=True)
class Arm:
    """One way of doing the same work: ``run(seed)`` measures it once and returns its figures."""

    name: str
    run: Callable[[int], Mapping[str, float]]


def interleaved_order(n_arms: int, repeats: int) -> list[tuple[int, int]]:
    """``(repetition, arm index)`` pairs: every repetition runs every arm once, and the
    starting arm rotates, so no arm always runs first (a warm cache) or last (a busy machine)."""
    if n_arms < 1 or repeats < 1:
        raise ValueError(f"need at least one arm and one repeat, got {n_arms} and {repeats}")
    return [(rep, (rep + i) % n_arms) for rep in range(repeats) for i in range(n_arms)]


def run_arms(
    arms: Sequence[Arm], *, repeats: int, seed: int, progress: Progress | None = None
) -> Runs:
    """Run every arm ``repeats`` times, interleaved; returns the figures per arm, in arm order.

    Repetition ``r`` runs every arm with seed ``seed + r``, so arms face the same
    randomness in the same repetition.
    """
    runs: Runs = {arm.name: [] for arm in arms}
    for rep, index in interleaved_order(len(arms), repeats):
        arm = arms[index]
        runs[arm.name].append(dict(arm.run(seed + rep)))
        if progress is not None:
            progress(f"{arm.name} #{rep + 1}")
    return runs
