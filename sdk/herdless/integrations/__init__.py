"""Drop-in integrations: herdless's policies under clients your app already uses.

- ``herdless.integrations.openai``: an ``httpx`` (or ``httpx2``) client for
  ``openai.OpenAI(http_client=...)`` / ``AsyncOpenAI``, and ready-made openai clients.
- ``herdless.integrations.langchain``: ``ChatOpenAI`` on herdless.
- ``herdless.integrations.llama_index``: LlamaIndex's ``OpenAI`` LLM on herdless.

Each module imports its framework lazily; herdless itself depends on none of them.
"""
