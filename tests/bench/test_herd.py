"""The herd scenario on the virtual-time loop: exact arrival times, reproducible runs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path

import pytest

from herdless.bench.cli import main, missing_modules
from herdless.bench.herd import HerdParams, simulate
from herdless.bench.herd_arms import ARMS
from herdless.bench.herd_server import ServerParams
from herdless.bench.vtime import VirtualClock, run_virtual

pytestmark = [pytest.mark.server]

SMALL = HerdParams(n=20, server=ServerParams(slots=50, service=0.5, recover_at=1.5), repeats=1)


def test_virtual_loop_jumps_to_timers_in_order() -> None:
    async def scenario() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        clock = VirtualClock(loop)
        seen: list[tuple[str, float]] = []

        async def wake(name: str, after: float) -> None:
            await asyncio.sleep(after)
            seen.append((name, clock.monotonic()))

        await asyncio.gather(wake("late", 3600.0), wake("early", 0.25), wake("mid", 90.0))
        return seen

    assert run_virtual(scenario()) == [("early", 0.25), ("mid", 90.25 - 0.25), ("late", 3600.0)]


def test_virtual_clock_stands_still_while_a_thread_works() -> None:
    # The openai client looks up the platform in a thread on its first request; a clock
    # that jumped to the next timer meanwhile would fire deadlines before the answer.
    async def scenario() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []

        async def timer() -> None:
            await asyncio.sleep(1.0)
            seen.append(("timer", loop.time()))

        async def thread() -> None:
            await asyncio.to_thread(time.sleep, 0.05)  # real work in a thread: real time
            seen.append(("thread", loop.time()))

        await asyncio.gather(timer(), thread())
        return seen

    assert run_virtual(scenario()) == [("thread", 0.0), ("timer", 1.0)]


def test_naive_arm_retries_every_second() -> None:
    # t=0 and t=1: refused (the upstream loads until 1.5 s); t=2: all 20 fit in 50 slots.
    figures, arrivals = simulate(ARMS["naive"], SMALL, seed=1)
    assert arrivals == [0.0] * 20 + [1.0] * 20 + [2.0] * 20
    assert figures["attempts"] == 3.0
    assert figures["succeeded"] == 1.0
    assert figures["peak_x"] == pytest.approx(20 / 100)
    # last success at 2.5 s, 1 s after recovery; ideal = 20 * 0.5 / 50 = 0.2 s
    assert figures["makespan_x"] == pytest.approx(5.0)


def test_openai_arm_obeys_retry_after_exactly() -> None:
    figures, arrivals = simulate(ARMS["openai"], SMALL, seed=1)
    # Each caller comes back exactly when told: not before the gateway's upstream
    # Retry-After (2 s), and no later than a staggered schedule spreads them.
    assert arrivals[:20] == [0.0] * 20
    assert len(arrivals) == 40
    assert min(arrivals[20:]) == 2.0
    assert max(arrivals[20:]) <= 2.5
    assert figures["attempts"] == 2.0


def test_without_retry_after_openai_falls_back_on_its_own_backoff() -> None:
    params = HerdParams(n=5, server=ServerParams(cooperative=False, recover_at=10.0), repeats=1)
    figures, arrivals = simulate(ARMS["openai"], params, seed=1)
    assert figures["gave_up"] == 1.0  # 2 retries within ~1.5 s: all before recovery
    assert len(arrivals) == 15


def test_herdless_arm_is_reproducible_and_loses_nobody() -> None:
    first, arrivals = simulate(ARMS["herdless"], SMALL, seed=7)
    again, arrivals_again = simulate(ARMS["herdless"], SMALL, seed=7)
    assert (first, arrivals) == (again, arrivals_again)
    assert first["succeeded"] == 1.0
    assert first["hung"] == 0.0
    assert first["attempts"] >= 2.0  # every first attempt is refused


def test_cli_writes_tables_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "results"
    assert main(["herd", "--n", "10", "--repeats", "1", "--out", str(out)]) == 0
    for name in ("herd", "herd-plain"):
        data = json.loads((out / f"{name}.json").read_text())
        assert [row["arm"] for row in data["rows"]] == list(ARMS)
        assert (out / f"{name}.png").stat().st_size > 0
        assert f"## {name}:" in (out / f"{name}.md").read_text()
    assert "## herd:" in (out / "summary.md").read_text()


def test_cli_rejects_bad_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["herd", "--n", "0"]) == 2
    assert "argument --n: Input should be greater than 0" in capsys.readouterr().err


def test_cli_reads_the_environment_and_flags_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERDLESS_BENCH_OUT", str(tmp_path / "from-env"))
    monkeypatch.setenv("HERDLESS_BENCH_N", "10")
    monkeypatch.setenv("HERDLESS_BENCH_REPEATS", "5")
    assert main(["herd", "--repeats", "1"]) == 0
    data = json.loads((tmp_path / "from-env" / "herd.json").read_text())
    assert (data["params"]["n"], data["params"]["repeats"]) == (10, 1)


def test_a_missing_extra_is_named_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "tenacity" else real(name)
    )
    assert missing_modules(["overload"]) == []
    assert main(["herd", "--n", "10"]) == 2
    err = capsys.readouterr().err
    assert "missing tenacity" in err
    assert "pip install 'herdless[bench]'" in err
