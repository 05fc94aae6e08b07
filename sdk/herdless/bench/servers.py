"""The servers a scenario starts, quiet: the emulated GPU and the gateway, warnings only.

A scenario's figures come from its clients. The servers' access lines and info logs
would bury the one line that says why a run failed, and writing them costs the CPU the
clients are measured on, so the scenarios start them with ``--no-access-log
--log-level warning``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from herdless.launch.servers import ServerProcess, emulator_process, flags, gateway_process

__all__ = ["quiet_emulator", "quiet_flags", "quiet_gateway"]

_QUIET: dict[str, Any] = {"access_log": False, "log_level": "warning"}
"""The options that keep a server to its warnings."""


def quiet_flags(options: dict[str, Any]) -> list[str]:
    """The command-line flags of ``options``, quiet (for a server started by hand)."""
    return flags({**_QUIET, **options})


def quiet_emulator(**options: Any) -> AbstractContextManager[ServerProcess]:
    """A running ``herdless emulate`` with ``options`` as flags, quiet."""
    return emulator_process(**_QUIET, **options)


def quiet_gateway(*, upstream: str, **options: Any) -> AbstractContextManager[ServerProcess]:
    """A running ``herdless serve --upstream URL`` with ``options`` as flags, quiet."""
    return gateway_process(upstream=upstream, **_QUIET, **options)
