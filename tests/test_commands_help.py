"""The four commands share one help format and one error format, from their settings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from pydantic_settings import BaseSettings

pytest.importorskip("starlette", reason="the commands need the server extra")
pytest.importorskip("rich", reason="demo and bench need the demo extra")

from herdless import cli  # after the skips: the commands import the extras
from herdless._cli_settings import is_secret, shown_default
from herdless.bench import cli as bench_cli
from herdless.bench.settings import BenchSettings
from herdless.demo import cli as demo_cli
from herdless.demo.settings import DemoSettings
from herdless.emulator import cli as emulator_cli
from herdless.emulator.settings import EmulatorSettings
from herdless.gateway import cli as gateway_cli
from herdless.gateway import maintain as maintain_cli
from herdless.gateway.settings import GatewaySettings

pytestmark = [pytest.mark.server]


@dataclass(frozen=True)
class Command:
    name: str
    model: type[BaseSettings]
    help_text: Callable[[], str]
    main: Callable[[Sequence[str]], int]
    args: tuple[str, ...]  # what the command needs besides the setting (bench's scenario)
    field: str  # a number field, to set wrong
    bad: str  # a value it refuses


COMMANDS = [
    Command("serve", GatewaySettings, gateway_cli.help_text, gateway_cli.main, (), "max_queue",
            "abc"),
    Command("emulate", EmulatorSettings, emulator_cli.help_text, emulator_cli.main, (), "speed",
            "fast"),
    Command("maintain", maintain_cli.MaintainSettings, maintain_cli.help_text, maintain_cli.main,
            (), "expect", "soon"),
    Command("demo", DemoSettings, demo_cli.help_text, demo_cli.main, (), "crowd", "0"),
    Command("bench", BenchSettings, bench_cli.help_text, bench_cli.main, ("herd",), "n", "x"),
]  # fmt: skip
IDS = [c.name for c in COMMANDS]


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_every_setting_has_help_a_default_and_its_variable(command: Command) -> None:
    # Fails when a field is added without a description: its flag would have no help.
    text = " ".join(command.help_text().split())  # argparse wraps lines
    prefix = str(command.model.model_config["env_prefix"])
    assert text.startswith(f"usage: herdless {command.name} [options]")
    for name, field in command.model.model_fields.items():
        description = " ".join((field.description or "").split())
        assert description, f"{command.model.__name__}.{name} has no description"
        env = f"{prefix}{name}".upper()
        if is_secret(field):
            assert "--" + name.replace("_", "-") not in text  # environment only
            assert f"{env} {description}" in text
        else:
            assert f"{description} [default: {shown_default(field)}; env: {env}]" in text, name


def test_the_help_keeps_the_defaults_the_settings_use() -> None:
    text = " ".join(gateway_cli.help_text().split())
    # Typed by hand before: now read from the model, so these can only change there.
    assert "[default: 256; env: HERDLESS_GATEWAY_MAX_QUEUE]" in text
    assert "[default: 1048576; env: HERDLESS_GATEWAY_MAX_BODY_BYTES]" in text
    assert "[default: unset; env: HERDLESS_GATEWAY_RATE]" in text
    assert "--access-log, --no-access-log" in text
    assert "--scheduler {vtc,round-robin,fcfs}" in text


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_bad_variable_blames_the_variable(
    command: Command, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = f"{command.model.model_config['env_prefix']}{command.field}".upper()
    monkeypatch.setenv(env, command.bad)
    assert command.main(list(command.args)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"herdless {command.name}: error: variable {env}: "), err
    assert len(err.splitlines()) == 1
    assert "--" + command.field.replace("_", "-") not in err


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_bad_flag_blames_the_flag(command: Command, capsys: pytest.CaptureFixture[str]) -> None:
    flag = "--" + command.field.replace("_", "-")
    assert command.main([*command.args, flag, command.bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"herdless {command.name}: error: argument {flag}: "), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_an_unknown_flag_is_the_same_one_line(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    assert command.main([*command.args, "--nope"]) == 2
    err = capsys.readouterr().err
    assert err == f"herdless {command.name}: error: unrecognized arguments: --nope\n"


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_help_is_status_0_through_the_top_level_command(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([command.name, "--help"]) == 0
    assert capsys.readouterr().out == command.help_text()


def test_the_issue_s_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HERDLESS_GATEWAY_MAX_QUEUE", "abc")
    assert cli.main(["serve"]) == 2
    assert capsys.readouterr().err == (
        "herdless serve: error: variable HERDLESS_GATEWAY_MAX_QUEUE: Input should be a valid "
        "integer, unable to parse string as an integer (got 'abc')\n"
    )


def test_a_secret_flag_says_which_variable_to_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert gateway_cli.main(["--admin-token", "t0ken"]) == 2
    err = capsys.readouterr().err
    assert "set HERDLESS_GATEWAY_ADMIN_TOKEN" in err
    assert "t0ken" not in err
