"""Stubs shared by the policy tests: a random source with known answers."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class UpperRandom(random.Random):
    """``uniform`` returns the upper bound and ``sample`` the first items: exact delays."""

    def uniform(self, a: float, b: float) -> float:
        return b

    def sample(self, population: Sequence[T], k: int, **_: object) -> list[T]:
        return list(population[:k])


class LowerRandom(UpperRandom):
    """``uniform`` returns the lower bound."""

    def uniform(self, a: float, b: float) -> float:
        return a
