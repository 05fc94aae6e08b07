"""What the framework wrappers (``langchain``, ``llama_index``) share: the two HTTP
clients their openai classes take, set from the herdless clients they were given."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

import httpx

from herdless.integrations._bridge import unserved
from herdless.integrations.openai import async_http_client, http_client

if TYPE_CHECKING:
    from herdless._async_client import AsyncClient
    from herdless._client import Client

__all__ = ["framework_http_clients"]


@overload
def _unserved_http_client(message: str, *, asynchronous: Literal[False]) -> httpx.Client: ...
@overload
def _unserved_http_client(message: str, *, asynchronous: Literal[True]) -> httpx.AsyncClient: ...
def _unserved_http_client(message: str, *, asynchronous: bool) -> httpx.Client | httpx.AsyncClient:
    """An http client that sends nothing and answers every request ``501`` with
    ``message``: for the path a framework wrapper was given no herdless client for, so
    a call there fails at once, saying why, instead of trying the placeholder URL."""
    reply = unserved(message)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(reply.status, headers=reply.headers, content=reply.body)

    transport = httpx.MockTransport(answer)  # httpx's "answer with a function" transport
    if asynchronous:
        return httpx.AsyncClient(transport=transport)
    return httpx.Client(transport=transport)


def framework_http_clients(
    kwargs: dict[str, Any],
    client: Client | None,
    async_client: AsyncClient | None,
    *,
    pass_model: bool,
    who: str,
    keys: tuple[str, str],
    methods: tuple[str, str],
) -> None:
    """Set the two HTTP clients a framework's openai class takes, in ``kwargs`` under
    ``keys`` (sync, async): herdless's for each client given; for the other, one that
    answers ``501`` at once, saying that ``who`` got no such client for ``methods``
    (unless ``kwargs`` already has one of the user's).

    Raises:
        ValueError: neither client was given.
    """
    if client is None and async_client is None:
        raise ValueError(f"{who} needs a herdless Client, an AsyncClient, or both")
    sync_key, async_key = keys
    if client is not None:
        kwargs[sync_key] = http_client(client, pass_model=pass_model)
    else:
        missing = f"{who} was given no herdless Client: {methods[0]} need one"
        kwargs.setdefault(sync_key, _unserved_http_client(missing, asynchronous=False))
    if async_client is not None:
        kwargs[async_key] = async_http_client(async_client, pass_model=pass_model)
    else:
        missing = f"{who} was given no herdless AsyncClient: {methods[1]} need one"
        kwargs.setdefault(async_key, _unserved_http_client(missing, asynchronous=True))
