"""Maintenance on real processes: ``herdless maintain``, measured load times, SIGHUP reload."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from herdless.gateway.maintain import MaintainSettings, counters, main, maintain
from herdless.launch.servers import ServerProcess, free_port, gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.server]

TOKEN = "admin-secret"
ENV = {"HERDLESS_GATEWAY_ADMIN_TOKEN": TOKEN}
KEYS = """
[keys.patient]
key = "sk-patient"
hold = 30

[keys.hasty]
key = "sk-hasty"
hold = 1
"""


def body(**extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **extra}


def emulator(port: int, *, model: str = "old", delay: float = 0.0) -> ServerProcess:
    flags = ["emulate", "--speed", "50", "--model", model, "--startup-delay", str(delay)]
    return ServerProcess(flags, port=port, ready_timeout=30 + delay)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS)
    return path


@pytest.fixture
def engine() -> Iterator[tuple[int, list[ServerProcess]]]:
    """The engine's port and every emulator started on it (all stopped at the end)."""
    port = free_port()
    started = [emulator(port).start()]
    try:
        yield port, started
    finally:
        for server in started:
            server.stop()


class Traffic:
    """A client sending requests one after another in a thread until stopped."""

    def __init__(self, url: str, key: str) -> None:
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, key), daemon=True)
        self._thread.start()

    def _run(self, url: str, key: str) -> None:
        auth = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, timeout=60) as client:
            while not self._stop.is_set():
                self.codes.append(
                    client.post("/v1/chat/completions", json=body(), headers=auth).status_code
                )
                time.sleep(0.05)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.codes


def test_a_window_swaps_the_engine_and_the_patient_wait_it_out(
    engine: tuple[int, list[ServerProcess]], keys: Path
) -> None:
    port, started = engine
    old = started[0]
    with gateway_process(
        upstream=old.url, key_policies=keys, health_interval=0.25, env=ENV
    ) as gateway:
        patient = [Traffic(gateway.url, "sk-patient") for _ in range(3)]
        hasty = Traffic(gateway.url, "sk-hasty")  # one attempt each, may not wait 8 s

        def restart(argv: object) -> int:
            old.stop()
            started.append(emulator(port, model="new", delay=3).start(wait=False))
            return 0

        time.sleep(0.5)
        before = counters(httpx.get(gateway.url + "/metrics").text)
        settings = MaintainSettings(
            gateway=gateway.url, upstream=old.url, expect=8, admin_token=TOKEN
        )  # type: ignore[arg-type]
        report = maintain(settings, ["restart"], run=restart)
        time.sleep(0.5)
        codes = [code for client in patient for code in client.stop()]
        hasty_codes = hasty.stop()
        assert report.changed, report
        assert report.outcome == "done"
        assert report.load_time is not None
        assert report.load_time >= 3
        assert report.held >= 1  # requests waited through the window
        assert set(codes) == {200}, codes  # none failed: held, never hung, never dropped
        models = httpx.get(
            gateway.url + "/v1/models", headers={"authorization": "Bearer sk-patient"}
        )
        assert models.json()["data"][0]["id"] == "new"
        status = httpx.get(gateway.url + "/readyz").json()
        assert status["load_time"] == pytest.approx(report.load_time, abs=0.5)
        # The report's counts are the gateway's own counters over the window: outside it
        # nothing is refused, spilled, or held through a drain.
        after = counters(httpx.get(gateway.url + "/metrics").text)
        assert report.held == after["held"] - before["held"]
        assert report.refused == after["refused"] - before["refused"]
        assert report.refused == hasty_codes.count(503) > 0  # the hasty ones, refused
        assert report.spilled == 0  # no fallback configured here


def test_a_failing_command_resumes_on_the_old_upstream(
    engine: tuple[int, list[ServerProcess]], capsys: pytest.CaptureFixture[str]
) -> None:
    _port, started = engine
    with gateway_process(upstream=started[0].url, health_interval=0.25, env=ENV) as gateway:
        argv = ["--gateway", gateway.url, "--upstream", started[0].url, "--", "false"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HERDLESS_MAINTAIN_ADMIN_TOKEN", TOKEN)
            assert main(argv) == 1
        out = capsys.readouterr().out
        assert "resumed on the old upstream" in out
        assert "maintenance window:" in out
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body())
        assert answer.status_code == 200


def test_a_failing_command_that_took_the_upstream_down_stays_drained(
    engine: tuple[int, list[ServerProcess]],
) -> None:
    _port, started = engine
    with gateway_process(upstream=started[0].url, health_interval=0.25, env=ENV) as gateway:

        def broken(argv: object) -> int:
            started[0].stop()
            return 1

        settings = MaintainSettings(gateway=gateway.url, upstream=started[0].url, admin_token=TOKEN)  # type: ignore[arg-type]
        report = maintain(settings, ["broken"], run=broken)
        assert report.outcome == "drained"
        assert not report.changed
        assert "stays drained" in report.message
        assert httpx.get(gateway.url + "/readyz").json()["draining"] is True


def test_the_next_outage_promises_the_time_left_of_the_last_load(
    engine: tuple[int, list[ServerProcess]],
) -> None:
    port, started = engine
    load = 0.0  # the load time the gateway measured, after the first round
    # A hold (1 s) shorter than the load: refused with the time left, not held through it.
    options = {"health_interval": 0.25, "queue_timeout": 1}
    with gateway_process(upstream=started[0].url, **options) as gateway:
        for round_ in range(2):
            started[-1].stop()
            out_at = time.monotonic()
            started.append(emulator(port, delay=4).start(wait=False))
            if round_ == 1:
                time.sleep(1.5)
                answer = httpx.post(gateway.url + "/v1/chat/completions", json=body())
                assert answer.status_code == 503
                promised = int(answer.headers["retry-after-ms"]) / 1000
                left = load - (time.monotonic() - out_at)
                assert abs(promised - left) <= max(0.1 * left, 1.0), (promised, left)
            started[-1].wait_ready()
            deadline = time.monotonic() + 5
            while not httpx.get(gateway.url + "/readyz").json()["upstream_ready"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            load = httpx.get(gateway.url + "/readyz").json()["load_time"]
            assert load >= 4


def test_sighup_reloads_a_new_limit_and_a_new_key_under_load(
    engine: tuple[int, list[ServerProcess]], tmp_path: Path
) -> None:
    _port, started = engine
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.alice]\nkey = "sk-alice"\n')
    config = tmp_path / "gateway.toml"
    config.write_text(f"max_queue = 64\nkey_policies = '{keys}'\n")
    with gateway_process(upstream=started[0].url, config=config, env=ENV) as gateway:
        load = [Traffic(gateway.url, "sk-alice") for _ in range(4)]
        time.sleep(0.5)
        keys.write_text('[keys.alice]\nkey = "sk-alice"\n[keys.bob]\nkey = "sk-bob"\n')
        config.write_text(f"max_queue = 128\nkey_policies = '{keys}'\n")
        assert gateway.process is not None
        gateway.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        bob = {"authorization": "Bearer sk-bob"}
        while (
            httpx.post(gateway.url + "/v1/chat/completions", json=body(), headers=bob).status_code
            != 200
        ):
            assert time.monotonic() < deadline, gateway.logs()
            time.sleep(0.05)
        assert "reloaded changed=key_policies,max_queue" in gateway.log_path.read_text()
        config.write_text("max_queue = -5\n")  # a bad file: the old settings stay
        gateway.process.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        answer = httpx.post(gateway.url + "/v1/chat/completions", json=body(), headers=bob)
        assert answer.status_code == 200  # bob's key still in force
        codes = [code for client in load for code in client.stop()]
        assert set(codes) == {200}, codes  # nothing dropped
        log = gateway.log_path.read_text()
        assert "reload refused" in log
        assert "line 1: max_queue" in log
