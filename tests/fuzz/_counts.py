"""How many fuzz cases ran, by family: printed at the end of the run (the report's numbers)."""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()
