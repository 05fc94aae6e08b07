"""The httpx boundary: exceptions to failure kinds, request building."""

from __future__ import annotations

import httpx
import pytest
from tests.client.client_harness import Harness

import herdless
from herdless._actions import Send
from herdless._backend import Backend, Timeouts
from herdless._outcomes import failure
from herdless._request import USER_AGENT, Endpoints, read_cookies_when_set
from herdless.testing import Reply, ok, stream

_REQUEST = httpx.Request("POST", "http://gpu.test/v1/chat/completions")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectError("refused", request=_REQUEST), "connect"),
        (httpx.ConnectTimeout("slow", request=_REQUEST), "connect_timeout"),
        (httpx.PoolTimeout("pool", request=_REQUEST), "connect_timeout"),
        (httpx.WriteTimeout("write", request=_REQUEST), "connect_timeout"),
        (httpx.ReadTimeout("silent", request=_REQUEST), "first_byte_timeout"),
        (httpx.WriteError("reset", request=_REQUEST), "connect"),
        (httpx.ReadError("reset", request=_REQUEST), "read"),
        (httpx.RemoteProtocolError("closed", request=_REQUEST), "read"),
        (httpx.LocalProtocolError("bad", request=_REQUEST), "protocol"),
        (httpx.DecodingError("gzip", request=_REQUEST), "protocol"),
        (httpx.ProxyError("proxy", request=_REQUEST), "connect"),
        (ValueError("not JSON"), "protocol"),
        (StopIteration(), "read"),
        (StopAsyncIteration(), "read"),
    ],
)
def test_exceptions_map_to_failure_kinds(exc: BaseException, kind: str) -> None:
    result = failure(exc, elapsed=1.5)
    assert result.kind == kind
    assert result.elapsed == 1.5
    assert result.message


def _send(backend: Backend, timeouts: Timeouts) -> Send:
    return Send(
        backend=backend,
        attempt=2,
        model="gemma",
        body={"messages": []},
        headers={"X-Request-ID": "rid", "X-Herdless-Attempt": "2"},
        timeouts=timeouts,
        stream=True,
    )


def test_request_has_body_headers_and_clipped_timeouts() -> None:
    backend = Backend(name="p", base_url="http://gpu.test/v1/", api_key="sk-k")
    endpoints = Endpoints([backend], Timeouts())
    with httpx.Client() as http:
        request = endpoints.request(http, _send(backend, Timeouts(connect=1.0, first_byte=4.0)))
    assert str(request.url) == "http://gpu.test/v1/chat/completions"
    assert request.content == b'{"model":"gemma","messages":[]}'
    assert request.headers["authorization"] == "Bearer sk-k"
    assert request.headers["x-request-id"] == "rid"
    assert request.headers["x-herdless-attempt"] == "2"
    assert request.headers["accept"] == "text/event-stream"
    assert request.extensions["timeout"] == {
        "connect": 1.0,
        "read": 4.0,  # first byte: everything before acceptance (head and first event)
        "write": 1.0,
        "pool": 1.0,
    }


def test_request_uses_the_backends_own_timeouts_unless_clipped() -> None:
    own = Timeouts(connect=2.0, first_byte=8.0)
    backend = Backend(name="p", base_url="http://gpu.test/v1", timeouts=own)
    endpoints = Endpoints([backend], Timeouts())
    with httpx.Client() as http:
        request = endpoints.request(http, _send(backend, own))
    assert "authorization" not in request.headers
    assert request.extensions["timeout"] == {
        "connect": 2.0,
        "read": 8.0,
        "write": 2.0,
        "pool": 2.0,
    }


def _sent(request: httpx.Request) -> tuple[str, list[tuple[bytes, bytes]], bytes, object]:
    return str(request.url), request.headers.raw, request.content, request.extensions


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "client_headers",
    [
        {},  # httpx's defaults only
        {"User-Agent": "mine", "X-Team": "search"},
        # An attempt's own headers replace the client's, whatever their case.
        {"authorization": "Bearer other", "ACCEPT": "text/html", "x-request-id": "old"},
    ],
)
def test_own_clients_requests_are_built_as_httpx_builds_them(
    stream: bool, client_headers: dict[str, str]
) -> None:
    backend = Backend(name="p", base_url="http://gpu.test/v1", api_key="sk-k")
    endpoints = Endpoints([backend], Timeouts())
    send = _send(backend, Timeouts())
    send.stream = stream
    with httpx.Client(headers=client_headers) as http:
        fast = endpoints.request(http, send, own=True)
        general = endpoints.request(http, send, own=False)  # httpx's build_request
    assert _sent(fast) == _sent(general)
    assert fast.headers["authorization"] == "Bearer sk-k"
    assert fast.headers["x-request-id"] == "rid"


def test_an_own_client_with_cookies_builds_with_httpx() -> None:
    backend = Backend(name="p", base_url="http://gpu.test/v1")
    endpoints = Endpoints([backend], Timeouts())
    with httpx.Client(cookies={"lb": "node-2"}) as http:
        request = endpoints.request(http, _send(backend, Timeouts()), own=True)
    assert request.headers["cookie"] == "lb=node-2"


def test_each_request_gets_its_own_timeout_extension() -> None:
    # The async driver sets a stream's body timeout on the request: it must not leak
    # into the next request of the same backend.
    backend = Backend(name="p", base_url="http://gpu.test/v1")
    endpoints = Endpoints([backend], Timeouts())
    with httpx.Client() as http:
        first = endpoints.request(http, _send(backend, Timeouts()), own=True)
        first.extensions["timeout"]["read"] = 99.0
        second = endpoints.request(http, _send(backend, Timeouts()), own=True)
    assert second.extensions["timeout"]["read"] == Timeouts().first_byte


@pytest.mark.parametrize("kind", [httpx.Client, httpx.AsyncClient])
async def test_the_own_clients_jar_reads_only_answers_that_set_a_cookie(
    kind: type[httpx.Client] | type[httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    extract = httpx.Cookies.extract_cookies

    def counted(self: httpx.Cookies, response: httpx.Response) -> None:
        read.append(response.status_code)
        extract(self, response)

    monkeypatch.setattr(httpx.Cookies, "extract_cookies", counted)
    answers = iter([(200, {}), (201, {"set-cookie": "lb=node-2; Path=/"}), (202, {})])

    def handler(request: httpx.Request) -> httpx.Response:
        status, headers = next(answers)
        return httpx.Response(status, headers=headers)

    http = kind(transport=httpx.MockTransport(handler))
    jar = http.cookies.jar
    assert read_cookies_when_set(http)
    assert http.cookies.jar is jar  # the same cookies, read less often
    for _ in range(3):
        if isinstance(http, httpx.AsyncClient):
            await http.get("http://gpu.test/v1/models")
        else:
            http.get("http://gpu.test/v1/models")
    if isinstance(http, httpx.AsyncClient):
        await http.aclose()
    else:
        http.close()
    assert read == [201]
    assert dict(http.cookies) == {"lb": "node-2"}


def test_a_users_http_client_keeps_httpxs_jar() -> None:
    with httpx.Client() as http, herdless.Client("http://gpu.test/v1", http_client=http):
        assert type(http.cookies) is httpx.Cookies


async def test_the_own_clients_requests_carry_only_headers_that_say_something(
    harness: Harness,
) -> None:
    # httpx's "Accept: */*" and "Connection: keep-alive" say what HTTP/1.1 means without
    # them; a stream asks for event-stream itself; the User-Agent names herdless.
    harness.primary.script(ok(), stream())
    harness.build()
    await harness.chat()
    await harness.stream()
    plain, streamed = (request.headers for request in harness.primary.requests)
    assert "connection" not in plain
    assert "connection" not in streamed
    assert "accept" not in plain
    assert streamed["accept"] == "text/event-stream"
    assert plain["user-agent"] == streamed["user-agent"] == USER_AGENT
    assert USER_AGENT.startswith(f"herdless/{herdless.__version__} ")
    with httpx.Client() as defaults:
        assert plain["accept-encoding"] == defaults.headers["accept-encoding"]


def test_a_users_http_client_keeps_its_headers() -> None:
    with (
        httpx.Client() as http,
        httpx.Client() as untouched,
        herdless.Client("http://gpu.test/v1", http_client=http),
    ):
        assert http.headers == untouched.headers


def _setting_cookie(reply: Reply, cookie: str) -> Reply:
    def answer(request: httpx.Request) -> httpx.Response:
        response = reply(request)
        response.headers["set-cookie"] = cookie
        return response

    return answer


async def test_a_cookie_the_backend_sets_comes_back_on_the_next_calls(harness: Harness) -> None:
    # A load balancer's sticky session, say; an answer that sets none leaves it as it is.
    harness.primary.script(_setting_cookie(ok(), "lb=node-2; Path=/"), ok(), ok())
    harness.build()
    for _ in range(3):
        await harness.chat()
    sent = [request.headers.get("cookie") for request in harness.primary.requests]
    assert sent == [None, "lb=node-2", "lb=node-2"]
