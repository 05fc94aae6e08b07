"""deploy/grafana: the dashboard imports as is, and every series it queries exists.

The gateway's series are read from a live gateway's /metrics (a real process in front
of the emulator, after one measured load and one request); the clients' from what
``herdless.prometheus.PrometheusHook`` exports, its registry served over HTTP as a
Prometheus server would scrape it. A series renamed on either side fails here.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from herdless.launch.servers import ServerProcess, free_port, gateway_process

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "herdless-dashboard.json"
SERIES = re.compile(r"\bherdless_(?:gateway|client)_[a-z0-9_]+\b")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def expressions(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return exprs


def exposed(text: str) -> set[str]:
    """Every series name in a Prometheus text: samples, and families by HELP and TYPE."""
    names = set()
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            names.add(line.split(" ", 3)[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_the_dashboard_is_importable_as_is() -> None:
    board = dashboard()
    assert board["uid"]
    assert board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"  # no datasource uid to edit
    for p in board["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]
    titles = {p["title"] for p in board["panels"]}
    assert "PrimaryDegraded (alert on this)" in titles
    names = {a["name"] for a in board["annotations"]["list"]}
    assert "maintenance windows" in names


def client_exposition() -> str:
    prometheus_client = pytest.importorskip("prometheus_client")
    from herdless.prometheus import PrometheusHook

    registry = prometheus_client.CollectorRegistry()
    PrometheusHook(registry)
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def gateway_exposition() -> str:
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    engine = ServerProcess(["emulate", "--speed", "50", "--startup-delay", "0.5"], port=port)
    # The gateway first, then the engine: the gateway measures its load (upstream_load_seconds).
    with gateway_process(upstream=upstream, health_interval=0.25) as gateway, engine:
        deadline = time.monotonic() + 15
        while httpx.get(gateway.url + "/readyz").json()["load_time"] is None:
            assert time.monotonic() < deadline, gateway.logs()
            time.sleep(0.05)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert httpx.post(gateway.url + "/v1/chat/completions", json=body).status_code == 200
        time.sleep(0.6)  # a reading of the engine after it
        return httpx.get(gateway.url + "/metrics").text


def test_every_series_the_dashboard_queries_exists() -> None:
    wanted = {name for expr in expressions(dashboard()) for name in SERIES.findall(expr)}
    assert any(n.startswith("herdless_client_") for n in wanted)
    have = exposed(gateway_exposition()) | exposed(client_exposition())
    missing = sorted(wanted - have)
    assert not missing, f"the dashboard queries series nobody exports: {missing}"
