"""LlamaIndex's ``OpenAI`` LLM on herdless.

    import herdless
    from herdless.integrations.llama_index import openai_llm

    llm = openai_llm(herdless.Client(), herdless.AsyncClient(), model="gpt-4o-mini")
    llm.complete("Hello")

LlamaIndex checks ``model`` against OpenAI's model names (for the context window), so
give it a name it knows; herdless still asks each backend for its own model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from herdless.integrations._bridge import library_options
from herdless.integrations._extras import import_extra
from herdless.integrations._frameworks import framework_http_clients

if TYPE_CHECKING:
    from llama_index.llms.openai import OpenAI  # type: ignore[import-not-found, import-untyped, unused-ignore]  # an optional extra

    from herdless._async_client import AsyncClient
    from herdless._client import Client

__all__ = ["openai_llm"]


def openai_llm(
    client: Client | None = None,
    async_client: AsyncClient | None = None,
    *,
    pass_model: bool = False,
    **kwargs: Any,
) -> OpenAI:
    """A ``llama_index.llms.openai.OpenAI`` whose requests go through herdless.

    Args:
        client: serves ``complete``/``chat``/``stream_*``; with ``None`` they fail at
            once (``501``, nothing sent), unless ``http_client`` is in ``kwargs``.
        async_client: serves ``acomplete``/``achat``/``astream_*``; a separate client
            with its own breaker, window, budget and stats. ``None``: as for ``client``.
        pass_model: send LlamaIndex's ``model`` to the primary.
        **kwargs: more ``OpenAI`` arguments; ``max_retries`` is always 0.

    Raises:
        ValueError: neither client was given.
        ImportError: llama-index-llms-openai is missing
            (``pip install 'herdless[llamaindex]'``).
    """
    llms_openai = import_extra(
        "llama_index.llms.openai",
        package="llama-index-llms-openai",
        extra="llamaindex",
        needed_by="openai_llm()",
    )
    framework_http_clients(
        kwargs,
        client,
        async_client,
        pass_model=pass_model,
        who="openai_llm()",
        keys=("http_client", "async_http_client"),
        methods=("complete/chat/stream_*", "acomplete/achat/astream_*"),
    )
    library_options(kwargs, url_key="api_base")
    llm: OpenAI = llms_openai.OpenAI(**kwargs)
    return llm
