"""herdless: run your own LLM next to a hosted one."""

# The error tree and the value types are public whole: their modules' ``__all__`` are
# re-exported as they stand (httpx's ``__init__`` does this for every module), so a new
# error is listed in ``herdless.errors.__all__`` and here, not in an import list too.
# ruff: noqa: F403, F405

from herdless._async_client import AsyncClient
from herdless._backend import Backend, Price, Timeouts
from herdless._breaker import BreakerPolicy
from herdless._client import Client
from herdless._config import CallDefaults, ChatOptions, ClientOptions, DerivedOptions
from herdless._hedge import HedgePolicy
from herdless._pacing import PacingPolicy
from herdless._retry import RetryPolicy
from herdless._routing import FallbackPolicy
from herdless._stats import ClientStats
from herdless._stream import AsyncStream, Stream
from herdless._types import *
from herdless._version import __version__
from herdless._window import WindowPolicy
from herdless.errors import *

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AllBackendsFailed",
    "AsyncClient",
    "AsyncStream",
    "AttemptRecord",
    "AuthenticationError",
    "Backend",
    "BadRequestError",
    "BreakerPolicy",
    "CallDefaults",
    "ChatOptions",
    "ChatResult",
    "Chunk",
    "Client",
    "ClientOptions",
    "ClientStats",
    "ConfigurationError",
    "ConflictError",
    "DeadlineExceeded",
    "DerivedOptions",
    "FallbackNotAllowed",
    "FallbackPolicy",
    "FunctionCall",
    "FunctionCallDelta",
    "HedgePolicy",
    "HerdlessError",
    "InternalServerError",
    "NotFoundError",
    "PacingPolicy",
    "PermissionDeniedError",
    "Price",
    "RateLimitError",
    "RetryPolicy",
    "ServiceUnavailableError",
    "SpendLimitExceeded",
    "Stream",
    "StreamDeadlineExceeded",
    "StreamInterrupted",
    "Timeouts",
    "ToolCall",
    "ToolCallDelta",
    "UnprocessableEntityError",
    "Usage",
    "WaitEstimate",
    "WindowPolicy",
    "__version__",
]
