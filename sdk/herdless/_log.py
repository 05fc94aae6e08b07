"""herdless's log: every event, structured, at a level that says who must look.

A library logs; the application decides where it goes. Routine steps are DEBUG; what
an operator must see (a breaker moving, a call failing, a primary hidden behind a
fallback) is WARNING; every other decision is INFO. Events never hold secrets.
"""

from __future__ import annotations

import logging
from dataclasses import fields

from herdless.events import (
    AttemptStarted,
    BreakerStateChanged,
    CallFailed,
    CallFinished,
    Event,
    PrimaryDegraded,
    SlotAwaited,
)

__all__ = ["log_event", "logged", "logger"]

logger = logging.getLogger("herdless")
# Without this, Python's last-resort handler would print herdless's warnings to stderr
# of every user.
logger.addHandler(logging.NullHandler())

_LEVELS: dict[type[Event], int] = {
    AttemptStarted: logging.DEBUG,
    CallFinished: logging.DEBUG,
    SlotAwaited: logging.DEBUG,
    BreakerStateChanged: logging.WARNING,
    CallFailed: logging.WARNING,
    PrimaryDegraded: logging.WARNING,
}


def logged(event_type: type[Event]) -> bool:
    """Whether an event of this type would be logged now."""
    return logger.isEnabledFor(_LEVELS.get(event_type, logging.INFO))


def log_event(event: Event) -> None:
    """Log one event, its fields as ``extra={"herdless": {...}}``."""
    level = _LEVELS.get(type(event), logging.INFO)
    if logger.isEnabledFor(level):  # building the fields costs; skip when unused
        data = {f.name: getattr(event, f.name) for f in fields(event)}
        logger.log(level, "%s %s", type(event).__name__, data, extra={"herdless": data})
