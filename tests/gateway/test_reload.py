"""Reload without a restart: the settings file, POST /admin/reload, measured load times."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from tests.gateway.fakes import FakeVllm, GatewayFactory, chat_body, rendered, until

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Enqueued, Refuse
from herdless.gateway.core.keys import KeyLimits
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.reload import ConfigError, SettingsLayers, read_settings_file
from herdless.testing import FakeClock

ADMIN = {"authorization": "Bearer admin-secret"}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- the pure core -----------------------------------------------------------------------


def test_reconfigure_keeps_the_queue_and_starts_who_now_fits() -> None:
    clock = FakeClock()
    adm = Admission(AdmissionConfig(max_concurrency=1, max_queue=4), clock=clock)
    assert adm.offer("a", 10).__class__.__name__ == "Admit"
    waiting = adm.offer("a", 10)
    assert isinstance(waiting, Enqueued)
    adm.reconfigure(AdmissionConfig(max_concurrency=2, max_queue=8), {})
    assert adm.queue_depth == 1  # still waiting: nothing was dropped
    assert adm.dispatch() == [waiting.ticket]  # the new limit lets it start
    assert adm.config.max_queue == 8


def test_reconfigure_refuses_a_change_of_the_scheduler() -> None:
    adm = Admission(AdmissionConfig(), clock=FakeClock())
    with pytest.raises(ValueError, match="scheduler"):
        adm.reconfigure(AdmissionConfig(scheduler="fcfs"), {})


def test_a_key_whose_rate_changes_keeps_no_more_than_it_had() -> None:
    clock = FakeClock()
    adm = Admission(AdmissionConfig(rate=1, burst=2), clock=clock)
    adm.offer("a", 1)
    adm.offer("a", 1)
    assert adm.offer("a", 1).__class__.__name__ == "Refuse"  # bucket empty
    adm.reconfigure(AdmissionConfig(rate=1, burst=10), {"b": KeyLimits(rate=5)})
    assert adm.offer("a", 1).__class__.__name__ == "Refuse"  # a reload frees no budget
    assert adm.key_limits("b").rate == 5


def test_the_retry_after_while_out_is_the_time_left_of_the_last_load() -> None:
    clock = FakeClock()
    # A hold (2 s) shorter than the load's time left: refused with that time.
    adm = Admission(AdmissionConfig(upstream_retry_after=2, queue_timeout=2), clock=clock)
    adm.set_upstream(ready=False)
    clock.advance(8.0)
    adm.set_upstream(ready=True)
    assert adm.load_time == 8.0
    adm.set_upstream(ready=False)
    clock.advance(3.0)
    refused = adm.offer("a", 10)
    assert refused.__class__.__name__ == "Refuse"
    assert refused.retry_after == pytest.approx(5.0, abs=0.5)  # type: ignore[union-attr]
    clock.advance(6.0)  # past the expected end: back to the configured guess
    assert adm.offer("b", 10).retry_after >= 2.0  # type: ignore[union-attr]


def out_again(load: float) -> tuple[Admission, FakeClock]:
    """An upstream out again, whose last load took ``load`` seconds; holds of 30 s."""
    clock = FakeClock()
    adm = Admission(AdmissionConfig(queue_timeout=30), clock=clock)
    adm.set_upstream(ready=False)
    clock.advance(load)
    adm.set_upstream(ready=True)
    adm.set_upstream(ready=False)
    return adm, clock


def test_a_request_whose_hold_outlasts_the_load_waits_for_the_upstream() -> None:
    adm, clock = out_again(8.0)  # expected back in 8 s
    held = adm.offer("a", 10)
    assert isinstance(held, Enqueued)  # held, not refused
    assert adm.dispatch() == []  # nothing starts on an upstream that is out
    hasty = adm.offer("b", 10, deadline=1.0)
    assert hasty.__class__.__name__ == "Refuse"  # a caller's deadline: refused at once
    clock.advance(7.5)
    adm.set_upstream(ready=True)
    assert adm.dispatch() == [held.ticket]


def test_a_client_that_would_show_a_503_waits_out_a_load_no_one_knows_up_to_its_hold() -> None:
    clock = FakeClock()
    adm = Admission(AdmissionConfig(queue_timeout=30), clock=clock)
    adm.set_upstream(ready=False, code="upstream_unavailable")  # no load measured yet
    told = adm.offer("a", 10)
    assert isinstance(told, Refuse)  # a client that retries is told at once
    assert told.code == "upstream_unavailable"
    waits = [adm.offer(key, 10, waits=True) for key in ("b", "c")]
    assert all(isinstance(w, Enqueued) for w in waits)  # one that would not: it waits
    assert isinstance(adm.offer("d", 10, waits=True, deadline=60.0), Refuse)  # it decides
    clock.advance(5.0)
    adm.set_upstream(ready=True)
    assert adm.dispatch() == [w.ticket for w in waits if isinstance(w, Enqueued)]
    adm.set_upstream(ready=False, code="upstream_unavailable")  # back in 5 s, as last time
    clock.advance(10.0)  # past it: the time left is not known again
    late = adm.offer("e", 10, waits=True)
    assert isinstance(late, Enqueued)
    clock.advance(30.0)
    expired = adm.expire(late.ticket)  # its hold passed with the upstream still out
    assert (expired.status, expired.code) == (503, "upstream_unavailable")


def test_a_client_that_waits_is_still_told_at_once_when_the_load_outlasts_its_hold() -> None:
    adm, _ = out_again(120.0)  # expected back in 120 s: past its hold
    refused = adm.offer("a", 10, waits=True)
    assert isinstance(refused, Refuse)
    assert refused.retry_after == pytest.approx(59.0)  # capped by --max-retry-after


# -- the file ------------------------------------------------------------------------------


def test_the_file_names_an_unknown_setting_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "g.toml", "max_queue = 3\nmax_qeue = 4\n")
    with pytest.raises(ConfigError, match=r"line 2: max_qeue: no such setting"):
        read_settings_file(path)


def test_a_relative_path_in_the_file_is_relative_to_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    write(folder / "keys.toml", '[keys.team]\nkey = "sk-team"\n')
    layers = SettingsLayers(
        environ={}, file=write(folder / "g.toml", 'key_policies = "keys.toml"\n')
    )
    assert layers.read().key_policies == folder / "keys.toml"  # whatever the working folder
    absolute = write(folder / "h.toml", f'key_policies = "{folder / "keys.toml"}"\n')
    assert read_settings_file(absolute)["key_policies"] == str(folder / "keys.toml")


def test_flags_and_variables_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "g.toml", "max_queue = 3\nqueue_timeout = 7\nrate = 2\n")
    layers = SettingsLayers(
        flags={"max_queue": "9"}, environ={"HERDLESS_GATEWAY_RATE": "5"}, file=path
    )
    assert layers.pinned() == {"max_queue": "--max-queue", "rate": "HERDLESS_GATEWAY_RATE"}
    settings = layers.read()
    assert (settings.max_queue, settings.queue_timeout) == (9, 7.0)


def test_a_bad_value_in_the_file_is_named_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "g.toml", "# limits\nmax_queue = -1\n")
    with pytest.raises(ConfigError, match=r"line 2: max_queue: .*greater than or equal to 0"):
        SettingsLayers(environ={}, file=path).read()


# -- a running gateway ------------------------------------------------------------------


async def test_reload_puts_a_new_limit_and_a_new_key_in_force(
    gateway: GatewayFactory, fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    keys = write(tmp_path / "keys.toml", '[keys.alice]\nkey = "sk-alice"\n')
    path = write(tmp_path / "g.toml", f"max_queue = 2\nkey_policies = '{keys}'\n")
    fake_vllm.hold = asyncio.Event()
    async with gateway(config=path, admin_token="admin-secret", max_concurrency=1) as (
        client,
        rt,
    ):
        alice = {"authorization": "Bearer sk-alice"}
        running = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=alice)
        )
        waiting = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body(), headers=alice)
        )
        await until(lambda: rt.gate.admission.queue_depth == 1)
        write(keys, '[keys.alice]\nkey = "sk-alice"\n[keys.bob]\nkey = "sk-bob"\n')
        write(path, f"max_queue = 5\nkey_policies = '{keys}'\n")
        answer = await client.post("/admin/reload", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        assert answer.json()["changed"] == {"max_queue": 5, "key_policies": "changed"}
        assert rt.gate.admission.config.max_queue == 5
        assert rt.gate.admission.queue_depth == 1  # the waiter survived the reload
        fake_vllm.hold.set()
        assert (await running).status_code == 200
        assert (await waiting).status_code == 200
        bob = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer sk-bob"}
        )
        assert bob.status_code == 200


async def test_an_invalid_file_keeps_the_old_settings(
    gateway: GatewayFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "g.toml", "max_queue = 2\n")
    async with gateway(config=path, admin_token="admin-secret") as (client, rt):
        write(path, "max_queue = 7\nqueue_timeout = 0\n")
        with caplog.at_level(logging.ERROR, logger="herdless.gateway"):
            answer = await client.post("/admin/reload", headers=ADMIN)
        assert answer.status_code == 400
        assert "line 2: queue_timeout" in answer.json()["error"]["message"]
        assert rt.gate.admission.config.max_queue == 2  # nothing changed, not even max_queue
        assert "queue_timeout" in rendered(caplog.records)


async def test_the_port_and_a_flag_are_reported_not_reloaded(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    path = write(tmp_path / "g.toml", "max_queue = 2\n")
    async with gateway(config=path, admin_token="admin-secret", rate=4) as (client, rt):
        write(path, "max_queue = 2\nport = 9999\nrate = 1\n")
        answer = await client.post("/admin/reload", headers=ADMIN)
        assert answer.status_code == 200
        ignored = answer.json()["ignored"]
        assert ignored["port"] == "needs a restart (kept)"
        assert ignored["rate"].startswith("set by --rate")
        assert rt.settings.port == 8080
        assert rt.settings.rate == 4


async def test_resume_takes_the_load_time_measured_by_maintain(gateway: GatewayFactory) -> None:
    async with gateway(admin_token="admin-secret") as (client, rt):
        await client.post("/admin/drain", headers=ADMIN)
        answer = await client.post("/admin/resume?load_time=12.5", headers=ADMIN)
        assert answer.status_code == 200
        assert rt.gate.admission.load_time == 12.5
        assert answer.json()["load_time"] == 12.5
        bad = await client.post("/admin/resume?load_time=soon", headers=ADMIN)
        assert bad.status_code == 400
