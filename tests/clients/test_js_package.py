"""What ships for the JavaScript clients' harness, checked without node (default session)."""

from __future__ import annotations

import importlib.resources
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from herdless.bench.js_clients import CallResult, Scenario, Usage

ROOT = Path(__file__).parents[2]
JS = importlib.resources.files("herdless.bench").joinpath("js")


def _json(name: str) -> Any:
    return json.loads(JS.joinpath(name).read_text())


def test_the_runner_and_the_pins_are_package_data() -> None:
    for name in ("package.json", "package-lock.json", "run.mjs"):
        assert JS.joinpath(name).is_file(), name


def test_every_client_is_pinned_to_one_version_and_locked() -> None:
    pins = _json("package.json")["dependencies"]
    lock = _json("package-lock.json")
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", version) for version in pins.values()), pins
    assert lock["lockfileVersion"] == 3
    assert lock["packages"][""]["dependencies"] == pins
    for name, version in pins.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    assert pins["openai"] == "7.59.0"
    assert pins["ai"].startswith("6.")
    assert pins["@langchain/openai"].startswith("1.5.")
    assert "@langchain/core" in pins  # @langchain/openai's peer
    # The provider is the one built for this ai: the same provider-utils.
    utils = "@ai-sdk/provider-utils"
    ai = lock["packages"]["node_modules/ai"]["dependencies"][utils]
    provider = lock["packages"]["node_modules/@ai-sdk/openai-compatible"]["dependencies"][utils]
    assert ai == provider
    # No registry address: npm fetches from whichever registry the machine is set to.
    assert not any("resolved" in entry for entry in lock["packages"].values())


def test_a_scenario_is_checked_and_sent_as_run_mjs_reads_it() -> None:
    sent = Scenario(
        client="vercel", base_url="http://127.0.0.1:1", api_key="sk-x", model="m",
        calls=48, concurrency=24, max_tokens=(32, 64), stream=True,
    )  # fmt: skip
    data = sent.to_json()
    assert data["max_tokens"] == [32, 64]
    assert (data["client"], data["calls"], data["stream"]) == ("vercel", 48, True)
    assert "sk-x" not in repr(sent)
    assert (
        Scenario(client="single", base_url="u", api_key="k", model="m").to_json()["max_tokens"]
        == 32
    )
    assert sent.process_timeout() == 2 * 180.0 + 30.0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"client": "curl"}, "client"),
        ({"calls": 0}, "calls"),
        ({"concurrency": 0}, "concurrency"),
        ({"max_tokens": (64, 32)}, "max_tokens"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"start_spacing_ms": -1}, "start_spacing_ms"),
    ],
)
def test_a_wrong_scenario_names_its_field(options: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {"client": "openai", "base_url": "u", "api_key": "k", "model": "m"}
    with pytest.raises(ValueError, match=field):
        Scenario(**{**base, **options})


def test_a_line_of_run_mjs_becomes_a_call_result() -> None:
    line = {
        "index": 3, "client": "openai", "ok": True, "status": 200, "attempts": 2,
        "statuses": [429, 200], "first_byte_s": 0.5, "total_s": 1.5, "chunks": 7,
        "headers": {"x-herdless-backend": "upstream"}, "model": "m",
        "usage": {"prompt_tokens": 20, "completion_tokens": 7}, "error": None,
    }  # fmt: skip
    result = CallResult.from_json(line)
    assert result.statuses == (429, 200)
    assert result.retried
    assert result.usage == Usage(prompt_tokens=20, completion_tokens=7)
    assert CallResult.from_json({**line, "usage": None, "attempts": 1}).usage is None


def test_the_wheel_carries_the_runner_and_the_lock(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the test dependency group brings hatchling")
    from hatchling.builders.wheel import WheelBuilder

    wheel = next(WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"]))
    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
    for name in ("package.json", "package-lock.json", "run.mjs"):
        assert f"herdless/bench/js/{name}" in names
    assert not any("node_modules" in name for name in names)
