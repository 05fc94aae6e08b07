"""A framework the integrations need and that is missing names the extra to install."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from herdless._client import Client

ROOT = Path(__file__).parents[2]


def _langchain(hl: Client) -> Any:
    from herdless.integrations.langchain import chat_openai

    return chat_openai(hl)


def _llama_index(hl: Client) -> Any:
    from herdless.integrations.llama_index import openai_llm

    return openai_llm(hl)


def _openai(hl: Client) -> Any:
    from herdless.integrations.openai import openai_client

    return openai_client(hl)


def _httpx2(hl: Client) -> Any:
    from herdless.integrations.openai import http_client

    return http_client(hl, flavor="httpx2")


@pytest.mark.parametrize(
    ("hidden", "build", "extra"),
    [
        ("langchain_openai", _langchain, "langchain"),
        ("llama_index.llms.openai", _llama_index, "llamaindex"),
        ("openai", _openai, "openai"),
        ("httpx2", _httpx2, "openai"),
    ],
)
def test_a_missing_framework_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, hidden: str, build: Callable[[Client], Any], extra: str
) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)  # `import hidden` now fails
    with (
        Client(primary="http://gpu.test/v1", model="m") as hl,
        pytest.raises(ImportError, match=rf"pip install 'herdless\[{extra}\]'") as caught,
    ):
        build(hl)
    assert caught.value.name == hidden
    assert isinstance(caught.value.__cause__, ImportError)


def test_the_extras_named_in_messages_exist() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"openai", "langchain", "llamaindex"} <= set(extras)
    assert any(req.startswith("langchain-openai") for req in extras["langchain"])
    assert any(req.startswith("llama-index-llms-openai") for req in extras["llamaindex"])
    assert any(req.startswith("openai>=") for req in extras["openai"])
