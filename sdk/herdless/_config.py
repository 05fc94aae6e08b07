"""One frozen configuration that ``Client`` and ``AsyncClient`` share.

The two clients take the same keyword arguments but four (``on_event``, ``sleep``,
``http_client``, ``transport``, whose types differ between sync and async). Those
shared arguments are written once, as the ``ClientOptions`` ``TypedDict`` both
constructors unpack, and turned once into a ``ClientConfig``: validated, frozen, with
the environment read (lazily: pydantic is imported only then) for what was not given.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

from herdless._backend import Backend, Timeouts
from herdless._breaker import BreakerPolicy
from herdless._clock import Clock
from herdless._hedge import HedgePolicy
from herdless._pacing import PacingPolicy
from herdless._retry import RetryPolicy
from herdless._routing import FallbackPolicy
from herdless._window import WindowPolicy

__all__ = [
    "DEFAULT_DEADLINE",
    "PRIORITIES",
    "CallDefaults",
    "ClientConfig",
    "ClientOptions",
    "DerivedOptions",
    "Priority",
    "derived_config",
]

# Seconds for a whole call, waits and fallback included. An LLM answer of a few hundred
# tokens takes seconds to tens of seconds; a minute leaves room for a slow primary and
# still bounds a caller that would otherwise wait forever.
DEFAULT_DEADLINE = 60.0

# The constructors' own arguments, besides ClientOptions: their types differ sync/async.
_OWN_ARGUMENTS = ("on_event", "sleep", "http_client", "transport")

Priority = Literal["interactive", "batch"]
"""A call's class, sent as ``X-Herdless-Priority``: a herdless gateway serves interactive
work first and lets batch work use the capacity it leaves idle."""
PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")


class CallDefaults(TypedDict, total=False):
    """What a client's calls get unless a call says otherwise: part of ``ClientOptions``,
    and what ``with_options`` may change (``DerivedOptions``).

    Attributes:
        model: the model asked of the primary.
        retry: retry, backoff and retry-budget policy.
        deadline: seconds for a whole call, waits included (default 60); for a stream,
            until its first chunk.
        stream_deadline: seconds from a streamed call's start to the stream's end
            (default: none, ``Timeouts.read`` bounds each silence).
        timeouts: per-attempt limits for backends that set none.
        fallback_policy: when to leave a backend, where a call may not go.
        priority: the class of the client's calls unless a call says otherwise:
            ``"interactive"`` (default) or ``"batch"`` (``X-Herdless-Priority``). Batch
            calls wait for the primaries and never spill to an ``external`` fallback.
    """

    model: str | None
    retry: RetryPolicy | None
    deadline: float | None
    stream_deadline: float | None
    timeouts: Timeouts | None
    fallback_policy: FallbackPolicy | None
    priority: Priority | None


class ClientOptions(CallDefaults, total=False):
    """The keyword arguments ``Client`` and ``AsyncClient`` share: the ``CallDefaults``,
    and these.

    Attributes:
        fallback: backends to fall back to, in order.
        breaker: circuit-breaker policy (one breaker per backend, per client).
        window: flow control: how many calls may be at one backend at once.
        pacing: a rate the client never exceeds toward each backend (off by default).
        hedge: send a late attempt again to the next backend, keep the first answer
            (off by default).
        clock: monotonic clock (a ``herdless.testing.FakeClock`` in tests).
        rng: random source for jitter (seeded in tests).
        env_file: the ``.env`` file read when configuring from the environment.
        llm_d_headers: send llm-d's request headers beside herdless's own (default
            ``True``): ``x-llm-d-inference-fairness-id`` (the call's user) and
            ``x-llm-d-inference-ttl`` (the longest the attempt may wait in a queue).
    """

    fallback: Backend | Sequence[Backend] | None
    breaker: BreakerPolicy | None
    window: WindowPolicy | None
    pacing: PacingPolicy | None
    hedge: HedgePolicy | None
    clock: Clock
    rng: random.Random | None
    env_file: str | Path | None
    llm_d_headers: bool


class DerivedOptions(CallDefaults, total=False):
    """The keyword arguments of ``with_options``: the ``CallDefaults``, and this.

    Attributes:
        allow_fallback: ``False``: no call of the new client reaches a fallback, even one
            that passes ``allow_fallback=True`` (a data guard for a whole module).
    """

    allow_fallback: bool | None


class ChatOptions(TypedDict, total=False):
    """The keyword arguments of ``chat()`` besides ``messages`` and ``stream``: herdless's
    own options (``Client.chat`` says what each does), then the OpenAI and vLLM request
    fields herdless knows (``herdless._fields.BODY_FIELDS``), sent unchanged. A field
    herdless does not know goes in ``extra_body``; a misspelled name is a ``TypeError``
    naming the closest one (and a type checker's error too).
    """

    model: str | None
    max_tokens: int | None
    temperature: float | None
    deadline: float | None
    stream_deadline: float | None
    allow_fallback: bool
    priority: Priority | None
    extra_body: Mapping[str, Any] | None
    extra_headers: Mapping[str, str] | None
    # The OpenAI chat-completions fields (``herdless._fields.OPENAI_FIELDS``).
    audio: Mapping[str, Any] | None
    frequency_penalty: float | None
    function_call: str | Mapping[str, Any] | None
    functions: Sequence[Mapping[str, Any]] | None
    logit_bias: Mapping[str, float] | None
    logprobs: bool | None
    max_completion_tokens: int | None
    metadata: Mapping[str, str] | None
    modalities: Sequence[str] | None
    moderation: object
    n: int | None
    parallel_tool_calls: bool | None
    prediction: Mapping[str, Any] | None
    presence_penalty: float | None
    prompt_cache_key: str | None
    prompt_cache_options: object
    prompt_cache_retention: str | None
    reasoning_effort: str | None
    response_format: Mapping[str, Any] | None
    safety_identifier: str | None
    seed: int | None
    service_tier: str | None
    stop: str | Sequence[str] | None
    store: bool | None
    stream_options: Mapping[str, Any] | None
    tool_choice: str | Mapping[str, Any] | None
    tools: Sequence[Mapping[str, Any]] | None
    top_logprobs: int | None
    top_p: float | None
    user: str | None
    verbosity: str | None
    web_search_options: Mapping[str, Any] | None
    # vLLM's own fields (``herdless._fields.VLLM_FIELDS``).
    allowed_token_ids: Sequence[int] | None
    bad_words: Sequence[str] | None
    ignore_eos: bool
    include_stop_str_in_output: bool
    length_penalty: float
    min_p: float
    min_tokens: int
    prompt_logprobs: int | None
    repetition_penalty: float
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    stop_token_ids: Sequence[int] | None
    top_k: int | None
    truncate_prompt_tokens: int | None
    use_beam_search: bool
    add_generation_prompt: bool
    add_special_tokens: bool
    cache_salt: str | None
    chat_template: str | None
    chat_template_kwargs: Mapping[str, Any] | None
    continue_final_message: bool
    documents: Sequence[Mapping[str, Any]] | None
    echo: bool
    include_reasoning: bool
    mm_processor_kwargs: Mapping[str, Any] | None
    return_token_ids: bool | None
    return_tokens_as_token_ids: bool | None
    structured_outputs: Mapping[str, Any] | None
    vllm_xargs: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Everything a client decides with, validated and frozen (no state: see
    ``herdless._state.ClientState``)."""

    primaries: tuple[Backend, ...]
    fallbacks: tuple[Backend, ...] = ()
    model: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    fallback_policy: FallbackPolicy = field(default_factory=FallbackPolicy)
    window: WindowPolicy = field(default_factory=WindowPolicy)
    pacing: PacingPolicy | None = None
    hedge: HedgePolicy | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    deadline: float = DEFAULT_DEADLINE
    stream_deadline: float | None = None
    priority: Priority = "interactive"
    llm_d_headers: bool = True

    def __post_init__(self) -> None:
        if not self.primaries:
            raise ValueError("at least one primary backend is required")
        names = [backend.name for backend in self.backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique, got {names!r}")
        if not self.deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self.deadline!r}")
        if self.stream_deadline is not None and not self.stream_deadline > 0:
            raise ValueError(f"stream_deadline must be > 0 seconds, got {self.stream_deadline!r}")
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {self.priority!r}")

    @property
    def backends(self) -> tuple[Backend, ...]:
        """Every backend: the primaries, then the fallbacks."""
        return (*self.primaries, *self.fallbacks)

    @classmethod
    def build(
        cls, primary: str | Backend | Sequence[str | Backend] | None, options: ClientOptions
    ) -> ClientConfig:
        """The configuration of a client built with ``primary`` and ``options``; with no
        primary, the environment (``HERDLESS_*``) gives everything not given.

        Raises:
            ConfigurationError: read from the environment, and a variable is wrong.
            ValueError: an argument is out of range.
        """
        unknown = sorted(set(options) - set(ClientOptions.__annotations__))
        if unknown:
            known = [*ClientOptions.__annotations__, *_OWN_ARGUMENTS]
            raise TypeError(_unknown_message("the client", unknown[0], known))
        if primary is None:  # the environment says everything not given
            from herdless._settings import env_options  # lazy: pydantic only when needed

            primary, env = env_options(options.get("env_file", ".env"))
            given = {name: value for name, value in options.items() if value is not None}
            options = cast(ClientOptions, env | given)  # what is given wins
        deadline = options.get("deadline")
        llm_d_headers = options.get("llm_d_headers")
        return cls(
            primaries=_primaries(primary),
            fallbacks=_as_tuple(options.get("fallback")),
            model=options.get("model"),
            retry=options.get("retry") or RetryPolicy(),
            breaker=options.get("breaker") or BreakerPolicy(),
            fallback_policy=options.get("fallback_policy") or FallbackPolicy(),
            window=options.get("window") or WindowPolicy(),
            pacing=options.get("pacing"),
            hedge=options.get("hedge"),
            timeouts=options.get("timeouts") or Timeouts(),
            deadline=DEFAULT_DEADLINE if deadline is None else deadline,
            stream_deadline=options.get("stream_deadline"),
            priority=options.get("priority") or "interactive",
            llm_d_headers=True if llm_d_headers is None else bool(llm_d_headers),
        )


# What with_options() may not change in a policy: the fields its shared state was built
# from (the retry budgets; the spend guard and the degraded signal).
_SHARED_FIELDS = {
    "retry": ("budget_ratio", "budget_floor", "budget_window"),
    "fallback_policy": (
        "max_external_share",
        "max_external_per_minute",
        "max_external_tokens",
        "max_external_cost",
        "spend_window",
        "degraded_interval",
    ),
}


def derived_config(config: ClientConfig, changes: CallDefaults) -> ClientConfig:
    """``config`` with ``changes`` (those not ``None``), for ``with_options``.

    Raises:
        TypeError: a change that is not one of the ``CallDefaults``.
        ValueError: a change is out of range, or touches a field the client's shared state
            was built from (``_SHARED_FIELDS``).
    """
    unknown = sorted(set(changes) - set(CallDefaults.__annotations__))
    if unknown:
        known = list(DerivedOptions.__annotations__)
        raise TypeError(_unknown_message("with_options()", unknown[0], known))
    given = {name: value for name, value in changes.items() if value is not None}
    for name, fields in _SHARED_FIELDS.items():
        if name in given:
            for shared in fields:
                if getattr(given[name], shared) != getattr(getattr(config, name), shared):
                    raise ValueError(
                        f"with_options({name}=...) may not change {shared}: it is state the "
                        "derived client shares with its parent; build another client for that"
                    )
    return dataclasses.replace(config, **given)  # type: ignore[arg-type]


def _unknown_message(caller: str, name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{caller} got an unexpected keyword argument {name!r}{hint}"


def _primaries(primary: str | Backend | Sequence[str | Backend]) -> tuple[Backend, ...]:
    items = [primary] if isinstance(primary, str | Backend) else list(primary)
    return tuple(
        item
        if isinstance(item, Backend)
        else Backend(name="primary" if index == 0 else f"primary-{index + 1}", base_url=item)
        for index, item in enumerate(items)
    )


def _as_tuple(value: Backend | Sequence[Backend] | None) -> tuple[Backend, ...]:
    if value is None:
        return ()
    if isinstance(value, Backend):
        return (value,)
    return tuple(value)
