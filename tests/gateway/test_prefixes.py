"""A prompt's links: which requests the engine's prefix cache will share (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from herdless.gateway.core.prefixes import LINK, MAX_LINKS, Held, chain
from herdless.gateway.routes import parse_completion_request, parse_response_request
from herdless.gateway.wire import parse_chat_request

pytestmark = [pytest.mark.server]

SYSTEM = "You answer questions about the handbook. Be brief. " * 40  # 2,040 characters


def chat(*messages: dict[str, Any], **body: Any) -> tuple[int, ...]:
    raw = {"model": "m", "messages": list(messages), "max_tokens": 8} | body
    return parse_chat_request(json.dumps(raw).encode()).prefix


def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    held = Held()
    held.add(a)
    return held.depth(b)


def test_chats_that_begin_alike_share_the_links_of_their_common_text() -> None:
    system = {"role": "system", "content": SYSTEM}
    question = "What does rule 1 say about the rest of the rules? " * 20  # 1,000 characters
    first = chat(system, {"role": "user", "content": question})
    second = chat(system, {"role": "user", "content": question.replace("1", "2")})
    # The seed and the system message are alike: 2,000 characters or more.
    assert common(first, second) >= len(SYSTEM) // LINK
    assert common(first, second) < len(first) - 2  # the questions differ: 3 links or more
    # The same question in another conversation shares nothing before it.
    assert common(first, chat({"role": "user", "content": question})) == 0


@pytest.mark.parametrize(
    "other",
    [
        {"model": "another"},
        {"cache_salt": "team-b"},  # vLLM keeps salted prompts apart in its cache
        {"tools": [{"type": "function", "function": {"name": "f"}}]},  # rendered first
    ],
)
def test_what_changes_the_rendering_or_the_cache_shares_nothing(other: dict[str, Any]) -> None:
    system = {"role": "system", "content": SYSTEM}
    assert common(chat(system), chat(system, **other)) == 0


def test_a_part_that_is_not_text_ends_the_links() -> None:
    """An image's blocks are keyed by its bytes: text past it is not predicted shared."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    question = {"role": "user", "content": [{"type": "text", "text": SYSTEM}, image]}
    assert chat(question, {"role": "user", "content": SYSTEM}) == chat({"role": "user"}) == ()
    texts = {"role": "user", "content": [{"type": "text", "text": SYSTEM}]}
    assert len(chat(texts)) == len(chat({"role": "user", "content": SYSTEM}))


def test_a_messages_other_fields_are_part_of_its_text() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {}}]}
    other = call | {"tool_calls": [{"id": "b", "function": {}}]}
    user = {"role": "user", "content": SYSTEM}
    assert common(chat(call, user), chat(other, user)) == 0


def test_completions_and_responses_have_links_where_their_prompt_is_text() -> None:
    def completion(prompt: Any) -> tuple[int, ...]:
        return parse_completion_request(
            json.dumps({"model": "m", "prompt": prompt}).encode()
        ).prefix

    assert completion(SYSTEM) == completion([SYSTEM])
    assert len(completion(SYSTEM)) >= len(SYSTEM) // LINK
    assert completion([SYSTEM, SYSTEM]) == completion(list(range(600))) == ()

    def response(instructions: str, text: str) -> tuple[int, ...]:
        body = {"model": "m", "instructions": instructions, "input": text}
        return parse_response_request(json.dumps(body).encode()).prefix

    assert common(response(SYSTEM, "one?"), response(SYSTEM, "two?")) >= len(SYSTEM) // LINK
    assert common(response(SYSTEM, "one?"), response("Other rules.", "one?")) == 0


def test_links_are_whole_and_at_most_max_links() -> None:
    assert chain("", ["x" * (LINK - 1)]) == ()
    assert len(chain("", ["x" * (3 * LINK + 5)])) == 3
    assert chain("", ["ab" * LINK]) == chain("", ["ab" * (LINK // 2), "ab" * (LINK // 2)])
    assert len(chain("", ["x" * (LINK * (MAX_LINKS + 3))])) == MAX_LINKS


def test_a_link_stays_held_while_one_request_that_has_it_runs() -> None:
    long, short = chain("", [SYSTEM + "first"]), chain("", [SYSTEM[:600]])
    held = Held()
    held.add(long)
    held.add(short)
    assert held.depth(long) == len(long)
    held.remove(long)
    assert held.depth(long) == len(short) == 2  # the short one still holds the first two
    held.remove(short)
    assert held.depth(long) == 0
    held.remove(short)  # removing what is not held is a no-op
    assert held.depth(short) == 0
