"""herdless: run your own LLM next to a hosted one."""

from herdless._version import __version__

__all__ = ["__version__"]
