"""``Backend``: one OpenAI-compatible endpoint the client may call."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Backend", "Price", "Timeouts"]


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

    Both clients bound a whole attempt (waiting for a pooled connection, connecting,
    sending, the response head and a whole answer's body, or a stream's first event) by
    ``first_byte``, clipped to the call's deadline, however slowly the server trickles
    its bytes. ``Client`` does it on every socket operation of the HTTP client it makes
    itself; with an ``http_client=`` or ``transport=`` of yours it checks the time
    between the pieces of the body instead, so one stalled read can outlast the attempt
    by up to its socket timeout, and a stream's gaps are bounded by ``first_byte`` (the
    socket timeout httpcore fixes when the body starts), not ``read``.
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
class Price:
    """What a backend charges per million tokens, in one currency of your choice (the
    spend guard's ``FallbackPolicy.max_external_cost`` counts in the same one).

    Args:
        input: the price of a million prompt (input) tokens.
        output: the price of a million completion (output) tokens.

    >>> Price(input=0.15, output=0.60).cost(input_tokens=1000, output_tokens=500)
    0.00045
    """

    input: float
    output: float

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"Price.{name} must be >= 0 per million tokens, got {value!r}")

    def cost(self, *, input_tokens: int, output_tokens: int) -> float:
        """The price of one answer: ``(input_tokens * input + output_tokens * output) / 1e6``."""
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


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
        price: what the backend charges per million tokens (``Price``); ``None``: free
            or unknown. ``client.stats().cost`` and the spend guard's money cap use it.

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
    price: Price | None = None

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
