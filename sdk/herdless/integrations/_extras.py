"""The frameworks the integrations drive, imported on first use.

herdless depends on none of them; each has an extra that installs it (and the versions
herdless is tested with). A missing one is an ``ImportError`` naming that extra, as
``herdless.otel`` and ``herdless.prometheus`` do.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["import_extra"]


def import_extra(module: str, *, package: str, extra: str, needed_by: str) -> ModuleType:
    """``module`` imported, or an ``ImportError`` that says what to install.

    Args:
        module: the module to import (``"langchain_openai"``).
        package: the distribution that provides it (``"langchain-openai"``).
        extra: herdless's extra that installs it (``"langchain"``).
        needed_by: what needs it, for the message (``"chat_openai()"``).

    Raises:
        ImportError: ``module`` cannot be imported; chained to the original error.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{needed_by} needs {package}: pip install 'herdless[{extra}]'", name=module
        ) from error
