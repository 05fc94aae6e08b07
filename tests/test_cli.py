from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys

import pytest

from herdless.cli import main


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("serve", "emulate", "demo", "bench"):
        assert name in out


def test_unknown_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"herdless {importlib.metadata.version('herdless')}\n"


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], pytest.param(["serve", "--help"], marks=pytest.mark.server)],
)
def test_a_reader_that_stops_early_ends_the_command_quietly(args: list[str]) -> None:
    # `python -m herdless --help | head -5` with a head that is already gone: the
    # pipe's read end is closed before the command writes (it is still importing).
    with subprocess.Popen(
        [sys.executable, "-m", "herdless", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        status = proc.wait(timeout=60)
    assert status in (0, 141)  # 0: argparse swallowed the error itself
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored"


def test_the_documented_pipe_prints_five_lines() -> None:
    shell = shutil.which("bash")
    if shell is None:  # pragma: no cover -- every CI machine has bash
        pytest.skip("no bash")
    done = subprocess.run(
        [shell, "-c", f"'{sys.executable}' -m herdless --help | head -5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines()[0] == "usage: herdless COMMAND [ARGS...]"
    assert len(done.stdout.splitlines()) == 5
    assert done.stderr == ""
