"""The request fields ``chat()`` takes as keyword arguments, and the checks of what a
caller adds (``extra_body``, ``extra_headers``), as openai-python does them.

``chat(**extra)`` accepts the OpenAI chat-completions fields and vLLM's own request
fields; any other name is a ``TypeError`` that names the closest known one
(``temprature`` -> ``temperature``), and fields herdless does not know go in
``extra_body``. The lists follow openai-python's ``CompletionCreateParams`` and vLLM
0.32's ``ChatCompletionRequest`` (``tests/unit/test_wire.py`` checks the first against
the installed openai).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "BODY_FIELDS",
    "CHAT_PARAMETERS",
    "OPENAI_FIELDS",
    "VLLM_FIELDS",
    "check_extra_headers",
    "llm_d_fields",
    "split_fields",
    "unknown_argument",
]

OPENAI_FIELDS: Final = frozenset(
    {
        # The OpenAI chat-completions request (openai-python's CompletionCreateParams),
        # less messages / model / stream, which are chat()'s own arguments.
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
"""The OpenAI chat-completions fields ``chat()`` takes as keyword arguments."""

VLLM_FIELDS: Final = frozenset(
    {
        # vLLM's extra sampling parameters of /v1/chat/completions (its
        # "chat-completion-sampling-params" block).
        "allowed_token_ids",
        "bad_words",
        "ignore_eos",
        "include_stop_str_in_output",
        "length_penalty",
        "min_p",
        "min_tokens",
        "prompt_logprobs",
        "repetition_penalty",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop_token_ids",
        "top_k",
        "truncate_prompt_tokens",
        "use_beam_search",
        # Its extra chat parameters that apps use (chat template, structured output,
        # reasoning, token ids, prefix-cache salt). vLLM's ``priority`` and
        # ``request_id`` are left out: herdless has its own priority and request id.
        "add_generation_prompt",
        "add_special_tokens",
        "cache_salt",
        "chat_template",
        "chat_template_kwargs",
        "continue_final_message",
        "documents",
        "echo",
        "include_reasoning",
        "mm_processor_kwargs",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "structured_outputs",
        "vllm_xargs",
    }
)
"""vLLM's own request fields ``chat()`` takes as keyword arguments (vLLM 0.32)."""

BODY_FIELDS: Final = OPENAI_FIELDS | VLLM_FIELDS
"""Every body field ``chat()`` takes as a keyword argument; anything else goes in
``extra_body``."""

CHAT_PARAMETERS: Final = (
    "messages",
    "model",
    "max_tokens",
    "temperature",
    "stream",
    "deadline",
    "stream_deadline",
    "allow_fallback",
    "priority",
    "extra_body",
    "extra_headers",
)
"""``chat()``'s own parameters."""

# Headers herdless sets itself on every attempt: an extra header may not replace them
# (``Authorization`` would send one backend's key to every backend, fallbacks included).
_OWN_HEADERS: Final = frozenset(
    {
        "authorization",
        "content-type",
        "content-length",
        "accept",
        "host",
        "transfer-encoding",
        "x-request-id",
        "x-herdless-attempt",
        "x-herdless-deadline-ms",
        "x-herdless-priority",
    }
)


def unknown_argument(name: str, *, where: str = "chat()") -> str:
    """The ``TypeError`` message for an unknown keyword argument of ``chat()``: the
    closest known parameter or field, and where fields herdless does not know go."""
    close = difflib.get_close_matches(name, [*CHAT_PARAMETERS, *sorted(BODY_FIELDS)], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"{where} got an unexpected keyword argument {name!r}{hint} A request field "
        f"herdless does not know goes in extra_body={{{name!r}: ...}}."
    )


def split_fields(fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``fields`` of a request body as ``(keyword arguments, extra_body)``: the fields
    ``chat()`` knows, and the others (for a body built by another library)."""
    known: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for name, value in fields.items():
        (known if name in BODY_FIELDS else other)[name] = value
    return known, other


def check_extra_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """``extra_headers`` as a plain dict (``None`` when empty), checked.

    Raises:
        TypeError: not a mapping of strings.
        ValueError: it sets a header herdless sets itself (``Authorization``, ...).
    """
    if not headers:
        return None
    if not isinstance(headers, Mapping):
        raise TypeError("extra_headers must be a mapping of header names to strings")
    checked = {}
    given: Mapping[Any, Any] = headers  # from untyped callers too: check every item
    for name, value in given.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError("extra_headers must be a mapping of header names to strings")
        if name.lower() in _OWN_HEADERS:
            why = (
                "each backend sends its own api_key (Backend.api_key)"
                if name.lower() == "authorization"
                else "herdless sets it on every attempt"
            )
            raise ValueError(f"extra_headers may not set {name}: {why}")
        checked[name] = value
    return checked


_USER_HEADER: Final = "x-herdless-user"
_LLM_D_HEADERS: Final = ("x-llm-d-inference-fairness-id", "x-llm-d-inference-ttl")


def llm_d_fields(
    body: Mapping[str, Any], headers: Mapping[str, str] | None
) -> tuple[str | None, bool]:
    """What a call sends of llm-d's request headers: ``(fairness id, queue TTL?)``.

    The fairness id is the call's user, as a herdless gateway reads it: ``X-Herdless-User``
    in ``extra_headers``, else the body's ``user``. A header the caller set itself (in
    ``extra_headers``) is the caller's: herdless does not send its own. A user that is
    not printable ASCII is not sent (a header cannot carry it as it is).
    """
    user = body.get("user")
    fairness = user if isinstance(user, str) and user else None
    if not headers:
        return (fairness if fairness is None or _header_safe(fairness) else None), True
    given = {name.lower(): value for name, value in headers.items()}
    fairness = given.get(_USER_HEADER, "").strip() or fairness
    if _LLM_D_HEADERS[0] in given:
        fairness = None
    if fairness is not None and not _header_safe(fairness):
        fairness = None
    return fairness, _LLM_D_HEADERS[1] not in given


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable()
