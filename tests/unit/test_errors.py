"""The error tree: status mapping, server messages, context, pickling, no secrets."""

from __future__ import annotations

import pickle

import pytest

import herdless
from herdless._actions import Response, TransportFailure
from herdless._backend import Backend
from herdless._call.errors import status_error, transport_error
from herdless._types import AttemptRecord
from herdless.errors import (
    AllBackendsFailed,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    DeadlineExceeded,
    FallbackNotAllowed,
    HerdlessError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    SpendLimitExceeded,
    StreamDeadlineExceeded,
    StreamInterrupted,
    UnprocessableEntityError,
)

KEY = "sk-very-SECRET-key-123"
BACKEND = Backend(name="hosted", base_url="https://h.test/v1", api_key=KEY)
ATTEMPTS = (
    AttemptRecord(backend="hosted", attempt=1, kind="status", status=503),
    AttemptRecord(backend="hosted", attempt=2, kind="connect", waited=0.4),
)


def _response(status: int, body: bytes) -> Response:
    return Response(status=status, headers={}, body=body, elapsed=0.1)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (404, NotFoundError),
        (413, BadRequestError),
        (422, UnprocessableEntityError),
        (409, ConflictError),
        (418, BadRequestError),
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (429, RateLimitError),
        (500, InternalServerError),
        (502, InternalServerError),
        (503, InternalServerError),
        (504, InternalServerError),
        (599, InternalServerError),
    ],
)
def test_status_maps_to_its_class(status: int, cls: type[APIStatusError]) -> None:
    error = status_error(_response(status, b"{}"), backend=BACKEND, request_id="r", attempts=())
    assert type(error) is cls
    assert error.status == status
    assert error.status_code == status
    assert error.backend == "hosted"


@pytest.mark.parametrize(
    ("status", "old"),
    [
        (404, BadRequestError),
        (409, BadRequestError),
        (422, BadRequestError),
        (500, ServiceUnavailableError),
        (503, ServiceUnavailableError),
    ],
)
def test_new_classes_are_still_caught_by_the_old_except_clauses(
    status: int, old: type[APIStatusError]
) -> None:
    error = status_error(_response(status, b"{}"), backend=BACKEND, request_id="r", attempts=())
    with pytest.raises(old):
        raise error


def test_the_tree_matches_openais_names() -> None:
    openai = pytest.importorskip("openai")
    for name in (
        "APIStatusError",
        "BadRequestError",
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        "ConflictError",
        "UnprocessableEntityError",
        "RateLimitError",
        "InternalServerError",
        "APIConnectionError",
        "APITimeoutError",
    ):
        assert hasattr(openai, name), name
        assert issubclass(getattr(herdless, name), HerdlessError), name


def test_the_server_sentence_and_the_advice_are_one_period_apart() -> None:
    body = (
        b'{"error":{"message":"The model `gemma-3` does not exist. Valid aliases: gemma-4.",'
        b'"type":"NotFoundError","code":404}}'
    )
    error = status_error(_response(404, body), backend=BACKEND, request_id="r", attempts=())
    assert "gemma-4. Check the backend's base_url" in error.message
    assert ".." not in error.message


@pytest.mark.parametrize(
    ("base_url", "hint"),
    [
        ("http://gpu.test:8000", "does not end in /v1"),
        ("http://gpu.test:8000/", "try http://gpu.test:8000/v1."),
        ("http://gpu.test/openai", "try http://gpu.test/openai/v1."),
        ("http://gpu.test/v1/chat/completions", "give the API root (http://gpu.test/v1)"),
        (
            "http://gpu.test/v1/embeddings",
            "give the API root (http://gpu.test/v1); herdless serves chat only and adds "
            "/chat/completions itself (it posted to http://gpu.test/v1/embeddings/chat/completions)",
        ),
        ("http://gpu.test/v1/completions/", "give the API root (http://gpu.test/v1)"),
        ("http://gpu.test/v1/responses", "serves chat only"),
    ],
)
def test_a_404_from_a_base_url_without_v1_says_so(base_url: str, hint: str) -> None:
    backend = Backend(name="primary", base_url=base_url)
    body = b'{"detail":"Not Found"}'
    error = status_error(_response(404, body), backend=backend, request_id="r", attempts=())
    assert type(error) is NotFoundError
    assert hint in error.message


def test_a_404_from_an_api_root_gives_the_usual_advice() -> None:
    error = status_error(_response(404, b"{}"), backend=BACKEND, request_id="r", attempts=())
    assert "/v1" not in error.message
    assert "Check the backend's base_url and the model name" in error.message


def test_the_v1_hint_never_shows_credentials_in_the_url() -> None:
    backend = Backend(name="p", base_url="http://user:s3cret-pass@gpu.test:8000/api?key=s3cret")
    error = status_error(_response(404, b"{}"), backend=backend, request_id="r", attempts=())
    assert "s3cret" not in str(error)
    assert "http://gpu.test:8000/api/v1" in error.message


@pytest.mark.parametrize(
    ("body", "message", "code", "kind"),
    [
        # The gateway's refusal.
        (
            b'{"error":{"message":"queue full","type":"rate_limit_error","code":"queue_full"}}',
            "queue full",
            "queue_full",
            "rate_limit_error",
        ),
        # vLLM's: an int code (VLLM_WIRE.md).
        (
            b'{"error":{"message":"The model `nope` does not exist.","type":"NotFoundError",'
            b'"param":"model","code":404}}',
            "The model `nope` does not exist.",
            404,
            "NotFoundError",
        ),
        (b'{"error":"plain text"}', "plain text", None, None),
        (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>", None, None),
        (b"", "", None, None),
        (b"\xff\xfe", "\ufffd\ufffd", None, None),
    ],
)
def test_server_message_is_parsed(
    body: bytes, message: str, code: str | int | None, kind: str | None
) -> None:
    error = status_error(_response(404, body), backend=BACKEND, request_id="r", attempts=())
    assert error.server_message == message
    assert error.code == code
    assert error.error_type == kind


def test_message_says_what_to_do_and_carries_context() -> None:
    error = status_error(
        _response(503, b'{"error":{"message":"draining"}}'),
        backend=BACKEND,
        request_id="req-1",
        attempts=ATTEMPTS,
        retry_after=30.0,
    )
    text = str(error)
    assert text.startswith("hosted answered 503: draining. The backend is not serving")
    assert "request_id=req-1" in text
    assert "hosted#1 503, hosted#2 connect after 0.40s wait" in text
    assert error.retry_after == 30.0
    assert error.attempts == ATTEMPTS


def test_an_echoed_key_is_redacted() -> None:
    body = f'{{"error":{{"message":"Incorrect API key provided: {KEY}"}}}}'.encode()
    error = status_error(_response(401, body), backend=BACKEND, request_id="r", attempts=())
    assert KEY not in str(error)
    assert KEY not in error.server_message
    assert "[secure]" in error.server_message


def test_a_huge_body_is_capped() -> None:
    error = status_error(_response(502, b"x" * 100_000), backend="b", request_id=None, attempts=())
    assert len(error.server_message) <= 500


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("connect", APIConnectionError),
        ("read", APIConnectionError),
        ("protocol", APIConnectionError),
        ("connect_timeout", APITimeoutError),
        ("first_byte_timeout", APITimeoutError),
        ("read_timeout", APITimeoutError),
    ],
)
def test_transport_failures_map_to_connection_errors(kind: str, cls: type[HerdlessError]) -> None:
    failure = TransportFailure(kind=kind, message="boom", elapsed=1.0)  # type: ignore[arg-type]
    error = transport_error(failure, backend=BACKEND, request_id="r", attempts=ATTEMPTS)
    assert type(error) is cls
    assert error.kind == kind
    assert "boom" in str(error)


ERRORS: list[HerdlessError] = [
    status_error(
        _response(429, b'{"error":{"message":"m","code":"queue_full"}}'),
        backend=BACKEND,
        request_id="r",
        attempts=ATTEMPTS,
        retry_after=1.5,
    ),
    transport_error(
        TransportFailure(kind="first_byte_timeout", message="slow", elapsed=3.0),
        backend=BACKEND,
        request_id="r",
        attempts=ATTEMPTS,
    ),
    DeadlineExceeded("late", deadline=10.0, request_id="r", attempts=ATTEMPTS, backend="p"),
    StreamInterrupted("cut", delivered_chunks=3, delivered_chars=12, request_id="r"),
    StreamDeadlineExceeded(
        "too long", delivered_chunks=2, delivered_chars=5, deadline=30.0, request_id="r"
    ),
    status_error(
        _response(404, b'{"error":{"message":"no such model"}}'),
        backend=BACKEND,
        request_id="r",
        attempts=ATTEMPTS,
    ),
    status_error(_response(500, b"{}"), backend=BACKEND, request_id="r", attempts=ATTEMPTS),
    FallbackNotAllowed("guarded", request_id="r"),
    SpendLimitExceeded("spent", limit="cost", request_id="r", backend="hosted"),
    AllBackendsFailed(
        "all",
        errors={"p": DeadlineExceeded("late", request_id="r"), "h": HerdlessError("x")},
        request_id="r",
    ),
    ConfigurationError("bad", variable="HERDLESS_PRIMARY_URL"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_pickle_with_their_context(error: HerdlessError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy).keys() == vars(error).keys()
    for name, value in vars(error).items():
        if name != "errors":
            assert getattr(copy, name) == value, name
    if isinstance(error, AllBackendsFailed):
        assert {k: str(v) for k, v in copy.errors.items()} == {
            k: str(v) for k, v in error.errors.items()
        }


def test_every_error_is_public_and_under_herdless_error() -> None:
    for name in herdless.errors.__all__:
        obj = getattr(herdless.errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, HerdlessError)
            assert obj.__doc__
            assert getattr(herdless, name) is obj


def test_a_stream_deadline_is_both_an_interruption_and_a_deadline() -> None:
    error = StreamDeadlineExceeded(
        "too long", delivered_chunks=2, delivered_chars=5, deadline=30.0, request_id="r"
    )
    assert isinstance(error, StreamInterrupted)
    assert isinstance(error, DeadlineExceeded)
    assert (error.delivered_chunks, error.delivered_chars, error.deadline) == (2, 5, 30.0)


def test_context_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        HerdlessError("m", "request-id")  # type: ignore[misc]
