"""LangChain's ``ChatOpenAI`` on herdless: sync and async calls through herdless clients.

    import herdless
    from herdless.integrations.langchain import chat_openai

    llm = chat_openai(herdless.Client(), herdless.AsyncClient(), model="gpt-4o-mini")
    llm.invoke("Hello")            # herdless.Client: retries, breaker, fallback
    await llm.ainvoke("Hello")     # herdless.AsyncClient

The ``model`` you give LangChain is not sent by default: each herdless backend asks
for its own (``pass_model=True`` sends it to the primary).

The two clients share nothing (each has its own breaker, backpressure window, retry
budget and stats), so give the one your app uses: ``chat_openai(client)`` for a sync
app, ``chat_openai(async_client=...)`` for an async one. The path given no client
answers ``501`` (``openai.InternalServerError``, code ``herdless_client_missing``)
without sending anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from herdless.integrations._bridge import library_options
from herdless.integrations._extras import import_extra
from herdless.integrations._frameworks import framework_http_clients

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI  # type: ignore[import-not-found, import-untyped, unused-ignore]  # an optional extra

    from herdless._async_client import AsyncClient
    from herdless._client import Client

__all__ = ["chat_openai"]


def chat_openai(
    client: Client | None = None,
    async_client: AsyncClient | None = None,
    *,
    pass_model: bool = False,
    **kwargs: Any,
) -> ChatOpenAI:
    """A ``langchain_openai.ChatOpenAI`` whose requests go through herdless.

    Args:
        client: serves ``invoke``/``stream``/``batch``; with ``None`` they fail at once
            (``501``, nothing sent), unless ``http_client`` is in ``kwargs``.
        async_client: serves ``ainvoke``/``astream``/``abatch``; a separate client with
            its own breaker, window, budget and stats. ``None``: as for ``client``.
        pass_model: send LangChain's ``model`` to the primary.
        **kwargs: more ``ChatOpenAI`` arguments; ``max_retries`` is always 0.

    Raises:
        ValueError: neither client was given.
        ImportError: langchain-openai is missing (``pip install 'herdless[langchain]'``).
    """
    langchain_openai = import_extra(
        "langchain_openai", package="langchain-openai", extra="langchain", needed_by="chat_openai()"
    )
    framework_http_clients(
        kwargs,
        client,
        async_client,
        pass_model=pass_model,
        who="chat_openai()",
        keys=("http_client", "http_async_client"),
        methods=("invoke/stream/batch", "ainvoke/astream/abatch"),
    )
    library_options(kwargs)
    kwargs.setdefault("model", "herdless")
    chat: ChatOpenAI = langchain_openai.ChatOpenAI(**kwargs)
    return chat
