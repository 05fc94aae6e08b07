"""Hypothesis settings shared by the state machines: bounded, deterministic, never sleeping.

The machines drive pure policy objects on a ``FakeClock``; a run is a bounded number
of short programs, so the whole folder takes seconds on a busy 2-core machine.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROPERTY = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,  # a loaded CI machine must not turn slowness into a failure
    derandomize=True,  # the same programs every run: a failure reproduces as is
    suppress_health_check=[HealthCheck.too_slow],
)
