"""The deployment files parse and say what the docs say; the runbook works on real processes.

Real emulators and gateways on 127.0.0.1 (``herdless.launch.servers``), the
emulator at 50x speed so that the whole runbook takes a few seconds.
"""

from __future__ import annotations

import configparser
import contextlib
import time
from pathlib import Path

import pytest
import runbook
import yaml
from client_config import build_client, gateways

from herdless.launch.servers import ServerProcess, flags

HERE = Path(__file__).parent
TOKEN = "test-admin-token"
HELLO = [{"role": "user", "content": "Hello"}]


def test_the_kubernetes_clients_list_every_gpu_pod():
    # The manifests live in deploy/kubernetes (tested in tests/deploy); the apps'
    # ConfigMap there feeds client_config.py's GPU_GATEWAYS.
    k8s = HERE.parents[1] / "deploy" / "kubernetes"
    (statefulset,) = [
        d
        for d in yaml.safe_load_all((k8s / "gpu-server.yaml").read_text())
        if d["kind"] == "StatefulSet"
    ]
    config = yaml.safe_load((k8s / "clients.yaml").read_text())
    assert len(gateways(config["data"]["GPU_GATEWAYS"])) == statefulset["spec"]["replicas"]


def test_systemd_unit_runs_the_gateway_and_outlives_its_drain():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keep the case of systemd's keys
    unit.read(HERE / "herdless-gateway.service")
    assert unit["Service"]["ExecStart"].endswith("herdless serve")
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    assert int(unit["Service"]["TimeoutStopSec"]) > 30  # above the default shutdown grace


def test_gateways_parses_a_list():
    assert [b.name for b in gateways("http://a/v1, http://b/v1")] == ["gpu-0", "gpu-1"]
    with pytest.raises(ValueError, match="at least one"):
        gateways(" , ")


@pytest.fixture(scope="module")
def fleet():
    """Two GPU servers (emulated) with a gateway each.

    All four start at once and are waited for together: starting them one by one
    costs a Python start-up each.
    """
    env = {"HERDLESS_GATEWAY_ADMIN_TOKEN": TOKEN}
    fast = {"speed": 50, "model": "gemma-4"}
    gpu0 = ServerProcess(["emulate", *flags(fast)])
    gpu1 = ServerProcess(["emulate", *flags(fast)])
    gateways = [
        ServerProcess(
            ["serve", "--upstream", gpu.url, "--drain-retry-after", "1"],
            # Ready when the gateway has seen its GPU ready too: before that it answers
            # 503 upstream_loading, and a client sends its calls to the other GPU.
            ready_path="/readyz",
            env=env,
        )
        for gpu in (gpu0, gpu1)
    ]
    servers = [gpu0, gpu1, *gateways]
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)  # registered first: stopped even if a start fails
            server.start(wait=False)
        for server in servers:
            server.wait_ready()
        yield gateways[0].url, gateways[1].url


def _client(fleet):
    gw0, gw1 = fleet
    # No hosted fallback needed here: while one GPU is drained, the other serves.
    env = {"GPU_GATEWAYS": f"{gw0}/v1,{gw1}/v1", "HERDLESS_MODEL": "gemma-4"}
    return build_client(env)


def test_calls_spread_over_both_gateways(fleet):
    with _client(fleet) as client:
        served = {client.chat(HELLO, max_tokens=4).backend for _ in range(12)}
    assert served == {"gpu-0", "gpu-1"}


def test_runbook_drain_wait_resume_keeps_every_call_answered(fleet):
    gw0, _ = fleet
    with _client(fleet) as client:
        drained = runbook.drain(gw0, TOKEN)
        assert drained["draining"] is True
        during = [client.chat(HELLO, max_tokens=4) for _ in range(8)]
        assert runbook.wait_until_idle(gw0, timeout=10)["inflight"] == 0
        assert all(r.backend != "gpu-0" for r in during)  # nobody waits on the drained one
        assert runbook.status(gw0)["ready"] is False

        assert runbook.resume(gw0, TOKEN)["draining"] is False
        # The clients' breakers stay open for the drain's Retry-After (1 s here), then
        # one probe brings gpu-0 back. Bounded: at most 50 calls, 0.1 s apart.
        for _ in range(50):
            if client.chat(HELLO, max_tokens=4).backend == "gpu-0":
                break
            time.sleep(0.1)
        else:
            pytest.fail("gpu-0 never served again after resume")
