"""A short day: the whole demo with its real servers, in a few seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from herdless.demo.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.server]


def _children() -> list[int]:
    """Pids of this process's children that are still alive (or not yet reaped)."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").exists(), reason="counts children through /proc")
def test_short_day_ends_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = set(_children())
    status = main(["--length", "5", "--crowd", "12", "--seed", "3", "--out", str(tmp_path)])
    assert status == 0
    out = capsys.readouterr().out
    words = " ".join(out.split())  # the console wraps long lines
    assert "the day, accounted for" in out
    assert "maintenance window (herdless maintain)" in words
    assert "all accounted for; none ended after the 20 s deadline" in words
    assert (tmp_path / "timeline.png").stat().st_size > 0
    assert f"timeline: {(tmp_path / 'timeline.png').resolve()}" in out.replace("\n", "")
    assert set(_children()) <= before  # every server it started is stopped and reaped


def test_json_writes_the_accounting_to_stdout_and_the_rest_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--json", "--length", "5", "--crowd", "12", "--seed", "3", "--out", str(tmp_path)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # stdout is the JSON document alone
    started = summary["requests"]["started"]
    assert started > 0
    assert started == sum(summary["served"].values()) + summary["failed"]
    assert summary["requests"]["unaccounted"] == 0
    assert set(summary["served"]) == {"company-gpu", "hosted"}
    # The chat front-end's employees asked once each: every request held or spilled,
    # none shown an error (the gateway spills what it cannot serve within the hold).
    frontend = summary["frontend"]
    assert frontend["started"] > 0
    assert frontend["started"] == sum(frontend[k] for k in ("gpu", "held", "spilled", "refused"))
    assert frontend["refused"] == 0
    assert summary["timeline"] == str((tmp_path / "timeline.png").resolve())
    # The model swap ran through herdless maintain: the window as it reported it.
    window = summary["maintenance"]
    assert window["changed"] is True
    assert window["outcome"] == "done"
    assert window["window"] >= 0.9  # the day's 20 % of 5 s, drain to resume
    # The human summary went to stderr, with the same figures.
    words = " ".join(captured.err.split())
    served = " + ".join(f"{n} by {name}" for name, n in summary["served"].items())
    assert f"requests started: {started} = {served} + {summary['failed']} failed" in words
