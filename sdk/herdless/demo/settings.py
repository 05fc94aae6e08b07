"""``DemoSettings``: every ``herdless demo`` flag, also settable as ``HERDLESS_DEMO_<FLAG>``.

A flag given on the command line wins over the environment (as for ``herdless
serve`` and ``herdless emulate``); ``--no-fallback`` is ``HERDLESS_DEMO_FALLBACK=false``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PositiveFloat, PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DemoSettings"]


class DemoSettings(BaseSettings):
    """What the day looks like.

    Attributes:
        length: seconds the day lasts (calls in flight then finish within their deadline).
        crowd: employees, each with their own herdless client.
        seed: seeds the employees' questions, their clients' jitter and the emulators.
        fallback: a hosted model behind the company GPU (``False``: see the day without).
        out: folder for the timeline PNG and the servers' logs (a temporary one if unset).
        speed: the emulated GPU's time scale.
        gpu_seqs: sequences the GPU runs at once; the gateway admits as many.
        deadline: seconds each employee's client allows a call, waits included.
    """

    model_config = SettingsConfigDict(env_prefix="HERDLESS_DEMO_", extra="forbid")

    length: PositiveFloat = Field(default=60.0, description="seconds the day lasts")
    crowd: PositiveInt = Field(default=150, description="employees")
    seed: int = Field(default=1, description="random seed")
    fallback: bool = Field(default=True, description="a hosted model behind the GPU")
    out: Path | None = Field(default=None, description="folder for the PNG and logs")
    speed: PositiveFloat = Field(default=4.0, description="the emulated GPU's time scale")
    gpu_seqs: PositiveInt = Field(default=8, description="sequences the GPU runs at once")
    deadline: PositiveFloat = Field(default=20.0, description="seconds per call, waits included")
