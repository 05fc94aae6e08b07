"""``herdless.launch.vllm``'s metric readers, against a scripted ``/metrics``."""

from __future__ import annotations

import httpx
import pytest
import respx

from herdless.launch import vllm

# read_metric parses with prometheus_client (the prometheus extra; not in tests(core)).
pytest.importorskip("prometheus_client")

URL = "http://vllm.test"
RUNNING = "vllm:num_requests_running"


def exposition(running: int) -> str:
    return (
        f"# TYPE {RUNNING} gauge\n"
        f'{RUNNING}{{engine="0",model_name="m"}} {running}.0\n'
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0\n'
        'vllm:request_success_total{finished_reason="length",model_name="m"} 2.0\n'
    )


@pytest.fixture
def naps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``time.sleep`` in the module, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(vllm.time, "sleep", slept.append)
    return slept


@respx.mock
def test_read_metric_sums_the_samples_whose_labels_match() -> None:
    respx.get(f"{URL}/metrics").respond(text=exposition(2))
    assert vllm.read_metric(URL, RUNNING) == 2
    assert vllm.read_metric(URL, "vllm:request_success_total") == 5
    assert vllm.read_metric(URL, "vllm:request_success_total", finished_reason="stop") == 3
    assert vllm.read_metric(URL, "vllm:request_success_total", finished_reason="abort") == 0


@respx.mock
def test_wait_for_metric_polls_until_the_value_shows(naps: list[float]) -> None:
    route = respx.get(f"{URL}/metrics")
    route.side_effect = [httpx.Response(200, text=exposition(n)) for n in (0, 0, 1)]
    assert vllm.wait_for_metric(URL, RUNNING, 1) == 1
    assert route.call_count == 3
    assert naps == [0.1, 0.1]


@respx.mock
def test_wait_for_metric_gives_the_last_reading_when_time_runs_out(naps: list[float]) -> None:
    route = respx.get(f"{URL}/metrics").respond(text=exposition(4))
    assert vllm.wait_for_metric(URL, RUNNING, 0, timeout=0.0) == 4
    assert route.call_count == 1
    assert naps == []
