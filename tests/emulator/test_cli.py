"""``herdless emulate`` flags and settings, without starting a server."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from tests.by_name import assert_built_by_name

from herdless.emulator.cli import build_parser, load_settings, main
from herdless.emulator.faults import MetricsOutage
from herdless.emulator.settings import EmulatorSettings
from herdless.launch.servers import ServerProcess, flags

pytestmark = [pytest.mark.server]


def test_every_setting_has_a_flag() -> None:
    parser = build_parser()
    options = {o for action in parser._actions for o in action.option_strings}
    for name in EmulatorSettings.model_fields:
        assert "--" + name.replace("_", "-") in options


def test_flags_override_environment_which_overrides_defaults() -> None:
    os.environ["HERDLESS_EMULATOR_MAX_NUM_SEQS"] = "7"
    os.environ["HERDLESS_EMULATOR_MODEL"] = "env-model"
    settings = load_settings(["--model", "flag-model", "--hang"])
    assert (settings.model, settings.max_num_seqs, settings.hang) == ("flag-model", 7, True)
    assert settings.speed == 1.0


def test_the_slow_fault_flags_reach_the_faults() -> None:
    faults = load_settings(["--slow-rate", "0.1", "--slow-latency", "5"]).faults()
    assert (faults.slow_rate, faults.slow_latency) == (0.1, 5.0)


def test_the_scheduler_flags_reach_the_engine_with_vllms_defaults() -> None:
    default = load_settings([]).engine_config()
    assert (default.max_num_batched_tokens, default.block_size) == (8192, 16)
    assert default.num_gpu_blocks == 400_000 // 16
    flagged = load_settings(["--max-num-batched-tokens", "2048", "--block-size", "32"])
    config = flagged.engine_config()
    assert (config.max_num_batched_tokens, config.block_size) == (2048, 32)
    os.environ["HERDLESS_EMULATOR_MAX_NUM_BATCHED_TOKENS"] = "512"
    assert load_settings([]).engine_config().max_num_batched_tokens == 512


@pytest.mark.parametrize(
    ("build", "unnamed"),
    [(EmulatorSettings.engine_config, {"max_lag"}), (EmulatorSettings.faults, set())],
)
def test_each_config_field_is_the_setting_of_its_name(
    build: Callable[[EmulatorSettings], object], unnamed: set[str]
) -> None:
    # The engine's config and the faults are built by name: a field is the setting of its
    # name, of the same type and value, but for those no setting names.
    settings = load_settings(["--max-num-seqs", "8", "--block-size", "32", "--cut-after", "3"])
    assert_built_by_name(build(settings), settings, unnamed)


def test_the_metrics_fault_flags_begin_a_window_at_start() -> None:
    assert load_settings([]).metrics_outage() is None
    outage = load_settings(["--metrics-stall-for", "10"]).metrics_outage()
    assert outage == MetricsOutage(mode="stall", seconds=10.0)
    outage = load_settings(["--metrics-error-for", "2.5"]).metrics_outage()
    assert outage == MetricsOutage(mode="error", seconds=2.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-num-seqs", "0"], "argument --max-num-seqs: Input should be greater than"),
        (["--kv-cache-tokens", "100"], "--kv-cache-tokens (100) must be >= max_model_len"),
        (["--error-rate", "2"], "argument --error-rate:"),
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
         "--max-num-batched-tokens (256) must be >= --max-num-seqs (512)"),
        (["--max-model-len", "100", "--kv-cache-tokens", "100"],
         "fewer than --max-model-len (100)"),
        (["--metrics-error-for", "1", "--metrics-stall-for", "1"], "not both"),
        (["--metrics-stall-for", "-1"], "argument --metrics-stall-for:"),
    ],
)  # fmt: skip
def test_bad_settings_exit_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_bad_environment_is_reported_too(capsys: pytest.CaptureFixture[str]) -> None:
    os.environ["HERDLESS_EMULATOR_SPEED"] = "fast"
    assert main([]) == 2
    assert "variable HERDLESS_EMULATOR_SPEED: " in capsys.readouterr().err


def test_unknown_choice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--on-kv-exhausted", "explode"]) == 2
    assert "Input should be 'preempt' or 'crash'" in capsys.readouterr().err


def test_harness_flags_and_validation() -> None:
    assert flags({"max_num_seqs": 8, "hang": True, "access_log": False, "cut_after": None}) == [
        "--max-num-seqs", "8", "--hang", "--no-access-log",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="ready_timeout"):
        ServerProcess(["emulate"], ready_timeout=0)
    server = ServerProcess(["emulate"], port=12345)
    assert server.url == "http://127.0.0.1:12345"
    assert server.returncode() is None
    assert server.stop() is None  # never started: nothing to stop
