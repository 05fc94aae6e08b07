"""The smallest whole OpenAI chat completion: what the bench's in-process stub servers answer.

The herd's server and the SDK-overhead server each answer every call with one fixed
completion; this is its shape (one choice, a ``stop``, the usage), theirs the words.
"""

from __future__ import annotations

from typing import Any

__all__ = ["chat_completion"]


def chat_completion(
    *, id_: str, model: str, content: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` with one choice, ready for ``json.dumps``."""
    return {
        "id": id_,
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
