"""Arms, interleaved and repeated: the one loop every scenario measures with."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Arm", "GaveUp", "Progress", "Runs", "interleaved_order", "run_arms"]

Runs = dict[str, list[dict[str, float]]]
"""Every repetition's figures, per arm, in arm order (what :func:`run_arms` returns)."""

Progress = Callable[[str], None]
"""Called once per finished run with a short description (drives the progress bar)."""


class GaveUp(Exception):
    """An arm's client stopped trying before the call was answered (a figure, not a
    failure of the benchmark)."""


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
