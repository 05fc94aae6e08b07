"""The launchers' old paths under herdless.testing: deprecated aliases of herdless.launch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("name", ["servers", "vllm", "vllm_pytest"])
def test_the_old_path_warns_and_gives_the_same_objects(name: str) -> None:
    new = importlib.import_module(f"herdless.launch.{name}")
    sys.modules.pop(f"herdless.testing.{name}", None)  # a first import, which warns
    with pytest.warns(DeprecationWarning, match=f"herdless.launch.{name}"):
        old = importlib.import_module(f"herdless.testing.{name}")
    assert old.__all__ == new.__all__
    for attr in new.__all__:
        assert getattr(old, attr) is getattr(new, attr), attr


def test_the_old_command_still_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "herdless.testing.vllm", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "prepare" in done.stdout
    assert "moved to herdless.launch.vllm" in done.stderr
