"""What ``Client`` and ``AsyncClient`` share: arguments, environment, hooks, request
bodies, results, ``with_options``; everything per call that is not I/O.

The drivers themselves (``herdless._client``) differ only in how they wait and send.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Unpack

from herdless._actions import Accepted, Outcome, Response, Send
from herdless._backend import Backend
from herdless._call.flow import CallFlow
from herdless._call.record import response_received
from herdless._clock import SYSTEM_CLOCK
from herdless._config import (
    ChatOptions,
    ClientConfig,
    ClientOptions,
    DerivedOptions,
    derived_config,
)
from herdless._fields import check_extra_headers, llm_d_fields
from herdless._request import Endpoints
from herdless._state import ClientState
from herdless._types import ChatResult
from herdless._wire import build_body

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Self

    from herdless._stats import ClientStats
    from herdless.events import Event

__all__ = ["Hook", "SyncHooks", "hooks_of", "is_async_hook"]

logger = logging.getLogger("herdless")

Hook: TypeAlias = Callable[["Event"], Any]
SyncHooks: TypeAlias = Callable[["Event"], None] | Sequence[Callable[["Event"], None]]


def hooks_of(on_event: Hook | Sequence[Hook] | None) -> tuple[Hook, ...]:
    """``on_event`` as a tuple of hooks: one callable, or a sequence of them."""
    if on_event is None:
        return ()
    hooks = (on_event,) if callable(on_event) else tuple(on_event)
    for hook in hooks:
        if not callable(hook):
            raise TypeError(f"on_event takes a callable or a sequence of them, got {hook!r}")
    return hooks


def is_async_hook(hook: Hook) -> bool:
    """Whether ``hook`` is a coroutine function (or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 -- an object whose __call__ is async
    )


def _warn_unclosed(closed: list[bool], name: str) -> None:
    if not closed[0]:
        warnings.warn(
            f"{name} was not closed: use `with` / `async with`, or call close()",
            ResourceWarning,
            stacklevel=1,
        )


class _BaseClient:
    """Arguments, environment and everything per call that is not I/O."""

    def __init__(
        self,
        primary: str | Backend | Sequence[str | Backend] | None,
        hooks: tuple[Hook, ...],
        options: ClientOptions,
    ) -> None:
        config = ClientConfig.build(primary, options)
        self._state = ClientState(
            config, clock=options.get("clock", SYSTEM_CLOCK), rng=options.get("rng")
        )
        self._clock = self._state.clock
        self._hooks = hooks
        self._state.keep_events = bool(hooks)  # nobody to hand events to
        self._endpoints = Endpoints(config.backends, config.timeouts)
        self._allow_fallback = True  # with_options(allow_fallback=False) turns it off
        self._closes_http = True  # a with_options() client shares its parent's, never closes it
        # A shared flag, not self: the finalizer must not keep the client alive. It warns
        # when an open client is garbage-collected (a leak), not at interpreter exit, where
        # a module-level client that lives as long as the process is fine.
        self._closed = [False]
        finalizer = weakref.finalize(self, _warn_unclosed, self._closed, type(self).__name__)
        finalizer.atexit = False

    @property
    def config(self) -> ClientConfig:
        """What the client was configured with (frozen)."""
        return self._state.config

    @classmethod
    def from_env(cls, *, env_file: str | Path | None = ".env", **kwargs: Any) -> Self:
        """A client configured by ``HERDLESS_*`` variables (and ``env_file``); keyword
        arguments (``on_event=``, ``clock=``, ``fallback=``, ...) add to or override them.

        Raises:
            ConfigurationError: a variable is missing or malformed; ``.variable`` names it.
        """
        if "primary" in kwargs:
            raise TypeError("from_env() reads the primary from HERDLESS_PRIMARY_URL")
        # Client / AsyncClient take env_file among their options; this base does not.
        return cls(env_file=env_file, **kwargs)  # type: ignore[call-arg]

    def stats(self) -> ClientStats:
        """Counts by backend and outcome, fallbacks by reason, retries, waits, breaker
        states, latency percentiles, tokens and cost, computed from this client's events."""
        return self._state.stats()

    def with_options(self, **options: Unpack[DerivedOptions]) -> Self:
        """A client with other per-call defaults, sharing this one's connections and state.

        The new client sends through the same connection pool and shares everything this
        client learns: the breakers, windows, retry budgets, pacers, backend holds, spend
        guard and ``stats()`` (and ``on_event``). Only the defaults below change; an
        argument left out or ``None`` keeps this client's. Close this client, not the new
        one (closing the new one does nothing): it uses this one's connections.

        Args:
            **options: the defaults to change (``DerivedOptions``), below.

        Other Parameters:
            model (str | None): the model asked of the primary.
            retry (RetryPolicy | None): retry and backoff policy. Its retry-budget fields
                (``budget_ratio``, ``budget_floor``, ``budget_window``) must stay this
                client's: the budgets are shared state.
            timeouts (Timeouts | None): per-attempt limits for backends that set none.
            deadline (float | None): seconds for a whole call, waits included.
            stream_deadline (float | None): seconds from a streamed call's start to the
                stream's end (``math.inf``: no limit).
            fallback_policy (FallbackPolicy | None): when to leave a backend, where a call
                may not go. Its spend caps (``max_external_*``, ``spend_window``) and
                ``degraded_interval`` must stay this client's: the spend guard and the
                degraded signal are shared state.
            allow_fallback (bool | None): ``False``: no call of the new client reaches a
                fallback, even one that passes ``allow_fallback=True`` (a data guard for a
                whole module).
            priority (Priority | None): the class of the new client's calls
                (``"interactive"`` or ``"batch"``) unless a call says otherwise.

        What cannot change here, because it is the state shared with this client: the
        backends, the breaker, window, pacing and hedge policies, ``on_event``, the clock
        and the HTTP client.

        >>> strict = client.with_options(deadline=5, allow_fallback=False)  # doctest: +SKIP

        Raises:
            TypeError: a name that is not one of the options above.
            ValueError: an argument is out of range, or changes shared state (above).
        """
        allow_fallback = options.pop("allow_fallback", None)
        config = derived_config(self.config, options)
        derived = copy.copy(self)  # the same HTTP client, hooks and sleep
        derived._state = _derived_state(self._state, config)
        derived._endpoints = Endpoints(config.backends, config.timeouts)
        derived._closes_http = False
        derived._closed = [False]  # no finalizer: it holds nothing of its own to close
        if allow_fallback is not None:
            derived._allow_fallback = self._allow_fallback and allow_fallback
        return derived

    def _start(
        self, messages: Sequence[Mapping[str, Any]], stream: bool, options: ChatOptions
    ) -> tuple[CallFlow, str, float | None, dict[str, str] | None]:
        """The call's flow, request id, stream deadline and extra headers, from
        ``chat()``'s arguments (``options`` is the call's own dict: taken apart here)."""
        extra_headers = options.pop("extra_headers", None)
        headers = check_extra_headers(extra_headers) if extra_headers else None
        model = options.pop("model", None)
        deadline = options.pop("deadline", None)
        stream_deadline = options.pop("stream_deadline", None)
        allow_fallback = options.pop("allow_fallback", True)
        priority = options.pop("priority", None)
        body = build_body(
            messages,
            max_tokens=options.pop("max_tokens", None),
            temperature=options.pop("temperature", None),
            stream=stream,
            extra_body=options.pop("extra_body", None),
            extra=options,
        )
        total = None
        if stream:
            config = self._state.config
            total = config.stream_deadline if stream_deadline is None else stream_deadline
            if total is not None:
                if not total > 0:
                    raise ValueError(f"stream_deadline must be > 0 seconds, got {total!r}")
                # The first chunk cannot come later than the end of the whole stream.
                deadline = min(config.deadline if deadline is None else deadline, total)
        fairness, queue_ttl = (
            llm_d_fields(body, headers) if self._state.config.llm_d_headers else (None, False)
        )
        # 128 random bits: what uuid4().hex holds, without building a UUID.
        request_id = os.urandom(16).hex()
        flow = CallFlow(
            self._state,
            request_id=request_id,
            body=body,
            model=model,
            stream=stream,
            deadline=deadline,
            allow_fallback=allow_fallback and self._allow_fallback,
            priority=priority,
            fairness=fairness,
            queue_ttl=queue_ttl,
        )
        return flow, request_id, (None if total == math.inf else total), headers

    def _call_hook(self, hook: Hook, event: Event) -> Any:
        """Run one hook on one event; a hook that raises is logged, never breaks the call."""
        try:
            return hook(event)
        except Exception:
            logger.exception("herdless on_event hook raised on %s", type(event).__name__)
            return None

    @staticmethod
    def _answered(flow: CallFlow, send: Send, outcome: Outcome) -> None:
        """Count a whole answer's tokens before the flow accepts it (and emits
        ``CallFinished``): ``ResponseReceived`` comes first."""
        if type(outcome) is Response and outcome.completion is not None:
            completion = outcome.completion
            response_received(
                flow,
                send.backend,
                usage=completion.usage,
                model=completion.model,
                finish_reason=completion.finish_reason,
                raw=completion.raw,
            )

    @staticmethod
    def _result(accepted: Accepted, request_id: str) -> ChatResult:
        completion = accepted.response.completion
        if completion is None:  # the driver decodes every accepted whole answer (accept)
            raise TypeError("the driver must decode an accepted answer into Response.completion")
        return ChatResult(
            content=completion.content,
            backend=accepted.backend.name,
            model=completion.model,
            usage=completion.usage,
            attempts=accepted.attempts,
            fallback_reason=accepted.fallback_reason,
            request_id=request_id,
            finish_reason=completion.finish_reason,
            tool_calls=completion.tool_calls,
            raw=completion.raw,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._state!r})"


def _derived_state(state: ClientState, config: ClientConfig) -> ClientState:
    """``state`` seen through a derived ``config`` (``with_options``): the same breakers,
    budgets, windows, pacers, backend holds, spend guard and counters, shared, not copied."""
    derived = copy.copy(state)  # a shallow copy: every per-backend object is the same one
    derived.config = config
    if config.fallback_policy.allow_external != state.config.fallback_policy.allow_external:
        # The route a one-primary client plans once depends on allow_external: plan anew.
        derived._routes = derived.plan_routes()
    return derived
