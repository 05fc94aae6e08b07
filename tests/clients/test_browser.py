"""openai-node in a real browser page of another origin, against vLLM (emulated) and the gateway.

A web app that called vLLM from the browser (its origin in vLLM's ``--allowed-origins``)
must work against the gateway in its place (the same origin in the gateway's): Chromium
sends a CORS preflight first and then lets the page read only what the answer allows.
Real processes: the emulator, ``herdless serve``, a page server, headless Chromium
(skipped, saying so, where none is installed; ``.ci/run`` installs Debian's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.clients.browser import PageServer, chromium

from herdless.launch.servers import ServerProcess, emulator_process, gateway_process

pytestmark = [pytest.mark.clients, pytest.mark.server]

ADMIN = "admin-secret"
KEYS = """
[keys.chat]
key = "sk-chat"

[keys.web]
key = "sk-web"
rate = 0.5
burst = 1
"""


@pytest.fixture(scope="module")
def browser() -> str:
    found = chromium()
    if found is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it)")
    return found


@pytest.fixture(scope="module")
def page(js_clients: Path) -> Iterator[PageServer]:
    with PageServer(js_clients).serving() as server:
        yield server


@pytest.fixture(scope="module")
def servers(
    page: PageServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ServerProcess]]:
    """(vLLM's URL, the gateway in front of it), both allowing the page's origin (neither
    allows one by default); sk-web may make one call in 2 s."""
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS)
    env = {"HERDLESS_GATEWAY_ADMIN_TOKEN": ADMIN}
    origins = json.dumps([page.origin])
    with (
        emulator_process(max_num_seqs=8, model="emulated", allowed_origins=origins) as vllm,
        gateway_process(
            upstream=vllm.url, key_policies=keys, allowed_origins=page.origin, env=env
        ) as gateway,
    ):
        yield vllm.url, gateway
        print(gateway.logs())


@pytest.mark.parametrize("behind", ["vllm", "gateway"])
def test_a_page_of_another_origin_chats_with_vllm_and_with_the_gateway_alike(
    page: PageServer, browser: str, servers: tuple[str, ServerProcess], behind: str
) -> None:
    vllm, gateway = servers
    base = (vllm if behind == "vllm" else gateway.url) + "/v1"
    seen = page.run(browser, base=base, key="sk-chat", case="chat")
    assert "error" not in seen, seen
    assert seen["whole"]["content"]
    assert seen["streamed"]["content"]
    assert [a["status"] for a in seen["attempts"]] == [200, 200]


def test_a_refused_call_is_retried_when_the_gateway_says(
    page: PageServer, browser: str, servers: tuple[str, ServerProcess]
) -> None:
    """The second call is over the key's rate: its 429's Retry-After, readable by the page,
    is what openai-node waits before its retry (its own backoff is 0.5-1 s)."""
    _, gateway = servers
    seen = page.run(browser, base=gateway.url + "/v1", key="sk-web", case="refused")
    assert all("content" in call for call in seen["calls"]), seen
    first, refused, retry = seen["attempts"]
    assert (first["status"], refused["status"], retry["status"]) == (200, 429, 200)
    assert refused["retry_after"] is not None
    wait_ms = float(refused["retry_after_ms"])
    assert wait_ms > 1000  # the key's next place, not a backoff's
    assert retry["at_ms"] - refused["at_ms"] >= 0.95 * wait_ms


def test_a_page_cannot_reach_admin_even_with_its_token(
    page: PageServer, browser: str, servers: tuple[str, ServerProcess]
) -> None:
    _, gateway = servers
    seen = page.run(browser, base=gateway.url + "/v1", admin=ADMIN, case="admin")
    assert seen.get("error") == "TypeError", seen  # the preflight said no: nothing sent
    status = httpx.get(gateway.url + "/readyz", timeout=5).json()
    assert status["draining"] is False
