"""herdless: run your own LLM next to a hosted one."""

from herdless._backend import Backend, Timeouts
from herdless._types import AttemptRecord, ChatResult, Chunk, Message, Usage
from herdless._version import __version__
from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    DeadlineExceeded,
    FallbackNotAllowed,
    HerdlessError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    SpendLimitExceeded,
    StreamInterrupted,
)

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AllBackendsFailed",
    "AttemptRecord",
    "AuthenticationError",
    "Backend",
    "BadRequestError",
    "ChatResult",
    "Chunk",
    "ConfigurationError",
    "DeadlineExceeded",
    "FallbackNotAllowed",
    "HerdlessError",
    "Message",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "SpendLimitExceeded",
    "StreamInterrupted",
    "Timeouts",
    "Usage",
    "__version__",
]
