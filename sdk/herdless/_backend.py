"""``Backend``: one OpenAI-compatible endpoint the client may call."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Backend", "Timeouts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """Per-attempt time limits, in seconds. Each is clipped to what is left of the call's deadline.

    Args:
        connect: establishing the TCP (and TLS) connection.
        first_byte: from sending the request to the first byte of the answer. A backend that
            accepts the connection and then says nothing is a failure, not a wait forever.
            For a non-streaming call the server sends nothing until the whole answer is
            generated, so this bounds the whole generation. ``AsyncClient`` also bounds the
            whole attempt (waiting for a pooled connection and connecting included) by it,
            so a crowded pool cannot outlast the call's deadline.
        read: idle time allowed between two chunks of a stream, after the first one.

    Sync streams: httpcore reads a response body under one socket timeout, fixed when the
    body starts, so ``Client`` bounds every read of a stream's body (the first event and
    each gap after it) by ``first_byte``; ``read`` applies only to ``AsyncClient``, which
    bounds the first event by ``first_byte`` and each later gap by ``read`` on its own.
    Give both the same value (the default) for the same behaviour in both clients.
    """

    connect: float = 3.0
    first_byte: float = 30.0
    read: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "read"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"Timeouts.{name} must be > 0 seconds, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """An OpenAI-compatible chat-completions endpoint.

    Args:
        name: short name used in events, stats and results (``"primary"``, ``"hosted"``).
        base_url: the API root, ending in ``/v1`` (``POST {base_url}/chat/completions``).
        api_key: sent as ``Authorization: Bearer``; never shown by ``repr``, logs or errors.
        model: the model name to send to this backend; ``None`` uses the client's model.
        external: ``True`` when data sent to this backend leaves the company. A call with
            ``allow_fallback=False`` never reaches an external backend.
        timeouts: per-attempt limits for this backend; ``None`` uses the client's.

    >>> hosted = Backend(name="hosted", base_url="https://api.example.com/v1",
    ...                  api_key="sk-secret", model="gpt-4o-mini", external=True)
    >>> "sk-secret" in repr(hosted)
    False
    """

    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None
    external: bool = False
    timeouts: Timeouts | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Backend.name must not be empty")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"Backend.base_url must start with http:// or https://, got {self.base_url!r}"
            )
        # Normalise once so that URL joining never doubles or drops a slash.
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    @property
    def chat_url(self) -> str:
        """``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"
