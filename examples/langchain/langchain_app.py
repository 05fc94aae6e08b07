"""A LangChain chain, made resilient by one line: the ChatOpenAI model comes from herdless.

Before::

    llm = ChatOpenAI(model="gpt-4o-mini")

After::

    llm = chat_openai(herdless.Client(), herdless.AsyncClient(), model="gpt-4o-mini")

``invoke``/``stream``/``batch`` go through the sync herdless client, ``ainvoke``/
``astream``/``abatch`` through the async one; LangChain's own retries are off.
"""

from __future__ import annotations

import asyncio

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable

import herdless
from herdless.integrations.langchain import chat_openai


def build_chain(client: herdless.Client, async_client: herdless.AsyncClient) -> Runnable:
    """The app's chain; only the ``llm`` line differs from a plain LangChain app."""
    llm = chat_openai(client, async_client, model="gpt-4o-mini")  # was: ChatOpenAI(...)
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You translate the user's text into {language}. Answer with it only."),
            ("user", "{text}"),
        ]
    )
    return prompt | llm | StrOutputParser()


async def main() -> None:
    # Both clients read HERDLESS_*; each keeps its own breaker and backpressure window.
    with herdless.Client() as sync_client:
        async with herdless.AsyncClient() as async_client:
            chain = build_chain(sync_client, async_client)
            print(chain.invoke({"language": "Korean", "text": "The GPU is back."}))
            print(await chain.ainvoke({"language": "Japanese", "text": "The GPU is back."}))


if __name__ == "__main__":
    asyncio.run(main())
