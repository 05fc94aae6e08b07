"""The emulator's sleep mode: vLLM's /sleep, /wake_up, /is_sleeping and engine_sleep_state."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from herdless.emulator.app import create_app
from herdless.emulator.settings import EmulatorSettings

pytestmark = [pytest.mark.server]

HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def client(**options: object) -> httpx.AsyncClient:
    settings = EmulatorSettings(model="m", speed=1000, **options)  # type: ignore[arg-type]
    app = create_app(settings, crash=lambda: None)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://emulator")


def sleep_state(metrics: str) -> dict[str, float]:
    states = {}
    for line in metrics.splitlines():
        if line.startswith("vllm:engine_sleep_state{"):
            state = line.split('sleep_state="', 1)[1].split('"', 1)[0]
            states[state] = float(line.rsplit(" ", 1)[1])
    return states


async def test_sleep_and_wake_speak_vllm_s_wire_format() -> None:
    async with client(wake_time=0.0) as emulator:
        assert (await emulator.get("/is_sleeping")).json() == {"is_sleeping": False}
        states = sleep_state((await emulator.get("/metrics")).text)
        assert states == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
        asleep = await emulator.post("/sleep", params={"level": "1"})
        assert (asleep.status_code, asleep.content) == (200, b"")
        assert (await emulator.get("/is_sleeping")).json() == {"is_sleeping": True}
        states = sleep_state((await emulator.get("/metrics")).text)
        assert states == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
        assert (await emulator.post("/sleep", params={"level": "3"})).status_code == 400
        woken = await emulator.post("/wake_up")
        assert (woken.status_code, woken.content) == (200, b"")
        assert (await emulator.get("/is_sleeping")).json() == {"is_sleeping": False}


async def test_a_request_that_reaches_a_sleeping_engine_hangs_until_the_wake() -> None:
    async with client(wake_time=0.0) as emulator:
        await emulator.post("/sleep")
        pending = asyncio.create_task(emulator.post("/v1/chat/completions", json=HI))
        await asyncio.sleep(0.05)
        assert not pending.done()  # as a sleeping vLLM: no answer
        assert (await emulator.get("/_emulator/sleep")).json()["reached_asleep"] == 1
        await emulator.post("/wake_up")
        assert (await pending).status_code == 200
