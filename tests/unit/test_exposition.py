"""The Prometheus writer both servers use, and the process series it adds."""

from __future__ import annotations

import builtins
import os
import time
from typing import Any

import pytest

from herdless import __version__
from herdless._exposition import Exposition, labels, process_metrics
from herdless.gateway.metrics import GatewayMetrics


def _samples(text: str) -> dict[str, float]:
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def test_label_values_are_escaped() -> None:
    assert labels() == ""
    assert labels(user='a"b\\c\nd', n=1) == '{user="a\\"b\\\\c\\nd",n="1"}'


def test_every_family_has_help_and_type_before_its_samples() -> None:
    out = Exposition()
    out.by("x_total", "counter", "Xs.", "code", {"200": 3, "429": 1})
    lines = out.text().splitlines()
    assert lines == ["# HELP x_total Xs.", "# TYPE x_total counter",
                     'x_total{code="200"} 3', 'x_total{code="429"} 1']  # fmt: skip


def test_the_process_series_describe_this_process() -> None:
    out = Exposition()
    process_metrics(out)
    samples = _samples(out.text())
    assert samples["process_resident_memory_bytes"] > 1_000_000
    assert samples["process_virtual_memory_bytes"] >= samples["process_resident_memory_bytes"]
    assert samples["process_open_fds"] == pytest.approx(len(os.listdir("/proc/self/fd")), abs=2)
    times = os.times()
    assert 0 < samples["process_cpu_seconds_total"] <= times.user + times.system
    assert time.time() - 24 * 3600 < samples["process_start_time_seconds"] <= time.time()


def test_without_proc_only_what_the_platform_gives_is_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_open = builtins.open

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    out = Exposition()
    process_metrics(out)
    assert set(_samples(out.text())) == {"process_cpu_seconds_total"}


def test_the_gateway_says_which_build_serves() -> None:
    text = GatewayMetrics(lambda: {"inflight": 0}).render()
    assert f'herdless_gateway_build_info{{version="{__version__}",' in text
    assert "process_resident_memory_bytes " in text
