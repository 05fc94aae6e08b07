"""``BenchSettings``: every ``herdless bench`` flag, also settable as ``HERDLESS_BENCH_<FLAG>``.

The scenario is the one positional argument; a flag given on the command line
wins over the environment (``HERDLESS_BENCH_TARGET=https://gpu.example.com/v1``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BenchSettings"]


class BenchSettings(BaseSettings):
    """How a bench run is sized and where it writes.

    Attributes:
        out: output folder (created).
        target: base URL of a deployment (ending in ``/v1``) for the client-side scenarios.
        repeats: repetitions per arm.
        n: callers in the herd.
        seed: first seed (repetition ``r`` uses ``seed + r``).
    """

    model_config = SettingsConfigDict(env_prefix="HERDLESS_BENCH_", extra="forbid")

    out: Path = Field(default=Path("bench-results"), description="output folder (created)")
    target: str | None = Field(
        default=None,
        description="base URL of a deployment (ending in /v1) for client-side runs",
        json_schema_extra={"metavar": "URL"},
    )
    repeats: PositiveInt = Field(default=3, description="repetitions per arm")
    n: PositiveInt = Field(default=1000, description="callers in the herd")
    seed: int = Field(default=1, description="first seed (repetition r: seed + r)")
