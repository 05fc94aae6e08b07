"""The script of the day: who is chatting when, and when the model is swapped (pure).

Times are fractions of the day's length, so a 60 s demo and a 4 s test run the
same story:

====================  ==========  ===============================================
phase                 from - to   what happens
====================  ==========  ===============================================
morning               0.00-0.15   employees arrive: the crowd grows to full size
rush                  0.15-0.45   everyone chats: the GPU saturates, 429s
maintenance           0.45-0.65   the gateway drains for a model swap: fallback
afternoon             0.65-0.85   the primary is back; traffic returns to it
evening               0.85-1.00   employees leave: the crowd shrinks to a tenth
====================  ==========  ===============================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PHASES", "Day", "Phase"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """A stretch of the day: ``[start, end)`` as fractions of its length."""

    name: str
    start: float
    end: float
    caption: str


PHASES = (
    Phase(name="morning", start=0.0, end=0.15, caption="employees arrive"),
    Phase(name="rush", start=0.15, end=0.45, caption="everyone chats: the GPU saturates"),
    Phase(
        name="maintenance",
        start=0.45,
        end=0.65,
        caption="model swap: the gateway drains, the hosted model serves",
    ),
    Phase(name="afternoon", start=0.65, end=0.85, caption="the primary is back"),
    Phase(name="evening", start=0.85, end=1.0, caption="employees leave"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Day:
    """The day's timeline for a given length (seconds) and crowd size.

    >>> day = Day(length=60, crowd=300)
    >>> day.active(0.0), day.active(20.0), day.active(60.0)
    (30, 300, 30)
    >>> day.maintenance
    (27.0, 39.0)
    """

    length: float
    crowd: int

    def __post_init__(self) -> None:
        if not self.length > 0:
            raise ValueError(f"length must be > 0 seconds, got {self.length!r}")
        if self.crowd < 1:
            raise ValueError(f"crowd must be >= 1, got {self.crowd!r}")

    def phase(self, t: float) -> Phase:
        """The phase at ``t`` seconds (the last one once the day is over)."""
        x = t / self.length
        for phase in PHASES:
            if x < phase.end:
                return phase
        return PHASES[-1]

    def active(self, t: float) -> int:
        """How many employees chat at ``t`` seconds: a tenth at dawn and dusk, all at noon."""
        x = min(max(t / self.length, 0.0), 1.0)
        low = max(1, self.crowd // 10)
        morning, evening = PHASES[0], PHASES[-1]
        if x < morning.end:  # ramp up from a tenth to everyone
            share = x / morning.end
        elif x >= evening.start:  # ramp down to a tenth
            share = 1 - (x - evening.start) / (evening.end - evening.start)
        else:
            share = 1.0
        return round(low + (self.crowd - low) * share)

    @property
    def maintenance(self) -> tuple[float, float]:
        """Seconds when the gateway drains and when it resumes."""
        phase = next(p for p in PHASES if p.name == "maintenance")
        return phase.start * self.length, phase.end * self.length
