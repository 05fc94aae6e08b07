"""The range check of the policies' numeric fields, written once: its error names the
class, the field, the bound and the value given, so a policy built wrong fails where it
is built (``BreakerPolicy.window must be > 0, got 0``)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["require"]

Bound = Literal["> 0", ">= 0", ">= 1"]

_HOLDS: dict[str, Callable[[Any], bool]] = {
    "> 0": lambda value: operator.gt(value, 0),
    ">= 0": lambda value: operator.ge(value, 0),
    ">= 1": lambda value: operator.ge(value, 1),
}


def require(owner: object, bound: Bound, *names: str, optional: bool = False) -> None:
    """Raise ``ValueError`` unless each field ``names`` of ``owner`` is ``bound`` (a NaN
    is not); with ``optional``, ``None`` (no limit) passes too.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Policy:
    ...     rate: float
    >>> require(Policy(rate=0.0), "> 0", "rate")
    Traceback (most recent call last):
    ...
    ValueError: Policy.rate must be > 0, got 0.0
    """
    holds = _HOLDS[bound]
    for name in names:
        value = getattr(owner, name)
        if optional and value is None:
            continue
        if not holds(value):
            raise ValueError(f"{type(owner).__name__}.{name} must be {bound}, got {value!r}")
