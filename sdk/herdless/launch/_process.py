"""What every launcher's server shares: used as a context manager, ``with`` starts it
(unless it runs already) and the way out stops it, also when the body failed."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

__all__ = ["Launched"]


class Launched(abc.ABC):
    """A server process a ``with`` block owns: started on entry unless it has a pid
    already, stopped on exit whatever happened in the block."""

    __slots__ = ()

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The process id once started (``None`` before)."""

    @abc.abstractmethod
    def start(self) -> object:
        """Start the process and wait until it is ready."""

    @abc.abstractmethod
    def stop(self) -> object:
        """Stop the process (idempotent)."""

    def __enter__(self) -> Self:
        if self.pid is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
