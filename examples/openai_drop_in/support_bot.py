"""An existing app written for the official openai client, made resilient by one line.

Before::

    client = OpenAI()

After (the only change)::

    client = openai_client(herdless.Client())

Everything else (``client.chat.completions.create(model="gpt-4o-mini", ...)``, the
``except openai.RateLimitError`` below, streaming) stays as it was. herdless now
picks the backend: the company GPU first, the hosted model when the GPU cannot
answer in time, each with its own URL, key and model name.
"""

from __future__ import annotations

import openai

import herdless
from herdless.integrations.openai import openai_client

client = openai_client(herdless.Client())  # was: client = openai.OpenAI()


def answer(question: str) -> str:
    """The app's code, unchanged."""
    try:
        completion = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": "You answer employees' IT questions briefly."},
                {"role": "user", "content": question},
            ],
        )
    except openai.APIError:
        return "Sorry, the assistant is unavailable right now."
    return completion.choices[0].message.content or ""


if __name__ == "__main__":
    print(answer("How do I reset my VPN password?"))
