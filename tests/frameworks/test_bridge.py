"""The request/answer translation of the integrations, without HTTP."""

from __future__ import annotations

import json

import pytest

from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    APITimeoutError,
    ConfigurationError,
    DeadlineExceeded,
    FallbackNotAllowed,
    RateLimitError,
)
from herdless.integrations._bridge import Call, Failure, Reply, parse_call, reply_for_error

CHAT = "/v1/chat/completions"
BODY = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_a_chat_request_becomes_a_call_without_the_apps_model():
    call = parse_call("POST", CHAT, {}, BODY, pass_model=False)
    assert isinstance(call, Call)
    assert call.messages == [{"role": "user", "content": "hi"}]
    assert call.kwargs == {"model": None}
    assert call.stream is False


def test_pass_model_and_headers_reach_the_call():
    headers = {"x-herdless-allow-fallback": "false", "x-herdless-deadline": "2.5"}
    payload = json.dumps({"model": "m", "messages": [], "stream": True, "seed": 7}).encode()
    call = parse_call("POST", CHAT, headers, payload, pass_model=True)
    assert isinstance(call, Call)
    assert call.stream is True
    assert call.kwargs == {"model": "m", "seed": 7, "allow_fallback": False, "deadline": 2.5}


def test_fields_chat_does_not_know_travel_in_extra_body():
    # openai's extra_body={"guided_json": ...} arrives merged into the body.
    payload = {"model": "m", "messages": [], "top_k": 5, "guided_json": {"type": "object"}}
    call = parse_call("POST", CHAT, {}, json.dumps(payload).encode(), pass_model=False)
    assert isinstance(call, Call)
    assert call.kwargs == {
        "model": None,
        "top_k": 5,
        "extra_body": {"guided_json": {"type": "object"}},
    }


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    [
        ("GET", "/v1/models", {}, b"", 404),
        ("POST", "/v1/embeddings", {}, BODY, 404),
        ("POST", CHAT, {}, b"not json", 400),
        ("POST", CHAT, {}, b'{"model": "m"}', 400),
        ("POST", CHAT, {"x-herdless-deadline": "soon"}, BODY, 400),
    ],
)
def test_what_cannot_be_served_is_refused_clearly(method, path, headers, body, status):
    reply = parse_call(method, path, headers, body, pass_model=False)
    assert isinstance(reply, Reply)
    assert reply.status == status
    assert json.loads(reply.body)["error"]["message"]


def test_status_errors_keep_their_status_and_say_do_not_retry():
    error = RateLimitError(
        "429 from primary", server_message="full", code="queue_full", retry_after=1.2, status=429
    )
    reply = reply_for_error(error)
    assert isinstance(reply, Reply)
    assert reply.status == 429
    assert reply.headers["x-should-retry"] == "false"
    assert reply.headers["retry-after"] == "1"
    assert json.loads(reply.body)["error"] == {
        "message": "full",
        "type": "api_error",
        "code": "queue_full",
    }


@pytest.mark.parametrize(
    ("error", "timeout"),
    [
        (APIConnectionError("refused"), False),
        (APITimeoutError("slow"), True),
        (DeadlineExceeded("late"), True),
        (AllBackendsFailed("all", errors={"a": APITimeoutError("slow")}), True),
        (AllBackendsFailed("all", errors={"a": APIConnectionError("refused")}), False),
    ],
)
def test_no_answer_becomes_a_transport_failure(error, timeout):
    reply = reply_for_error(error)
    assert isinstance(reply, Failure)
    assert reply.timeout is timeout


def test_all_backends_failed_with_a_status_keeps_the_last_status():
    last = RateLimitError("429", status=429, server_message="full")
    reply = reply_for_error(AllBackendsFailed("all failed", errors={"primary": last}))
    assert isinstance(reply, Reply)
    assert reply.status == 429


def test_the_data_guard_is_a_503_naming_it():
    reply = reply_for_error(FallbackNotAllowed("only an external fallback left"))
    assert isinstance(reply, Reply)
    assert reply.status == 503
    assert json.loads(reply.body)["error"]["code"] == "fallback_not_allowed"


def test_a_misconfigured_client_is_not_hidden():
    with pytest.raises(ConfigurationError):
        reply_for_error(ConfigurationError("HERDLESS_MODEL is malformed"))


@pytest.mark.parametrize(("timeout", "status"), [(True, 504), (False, 502)])
def test_a_failure_as_an_answer_says_do_not_retry(timeout, status):
    reply = Failure(timeout, "primary gave no answer").as_reply()
    assert reply.status == status
    assert reply.headers["x-should-retry"] == "false"
    assert json.loads(reply.body)["error"]["message"] == "primary gave no answer"
