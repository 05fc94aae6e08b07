"""LangChain's ``ChatOpenAI`` on herdless: sync and async calls through herdless clients.

    import herdless
    from herdless.integrations.langchain import chat_openai

    llm = chat_openai(herdless.Client(), herdless.AsyncClient(), model="gpt-4o-mini")
    llm.invoke("Hello")            # herdless.Client: retries, breaker, fallback
    await llm.ainvoke("Hello")     # herdless.AsyncClient

The ``model`` you give LangChain is not sent by default: each herdless backend asks
for its own (``pass_model=True`` sends it to the primary).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from herdless.integrations._bridge import PLACEHOLDER_KEY, PLACEHOLDER_URL
from herdless.integrations.openai import async_http_client, http_client

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI  # type: ignore[import-not-found, import-untyped, unused-ignore]  # an optional extra

    from herdless._client import AsyncClient, Client

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
        client: serves ``invoke``/``stream``/``batch``; ``None`` leaves them to LangChain.
        async_client: serves ``ainvoke``/``astream``/``abatch``.
        pass_model: send LangChain's ``model`` to the primary.
        **kwargs: more ``ChatOpenAI`` arguments; ``max_retries`` is always 0.

    Raises:
        ValueError: neither client was given.
    """
    from langchain_openai import ChatOpenAI  # type: ignore[import-not-found, import-untyped, unused-ignore]  # an optional extra

    if client is None and async_client is None:
        raise ValueError("chat_openai() needs a herdless Client, an AsyncClient, or both")
    if client is not None:
        kwargs["http_client"] = http_client(client, pass_model=pass_model)
    if async_client is not None:
        kwargs["http_async_client"] = async_http_client(async_client, pass_model=pass_model)
    kwargs.setdefault("api_key", PLACEHOLDER_KEY)
    kwargs.setdefault("base_url", PLACEHOLDER_URL)
    kwargs.setdefault("model", "herdless")
    kwargs["max_retries"] = 0
    return ChatOpenAI(**kwargs)
