"""``herdless._cli_settings``: a command line generated from a settings model, on a
model of its own (the four real commands are checked in tests/test_commands_help.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from herdless._cli_settings import SettingsCommand, exit_status, fail


class _Toy(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOY_", extra="forbid")

    size: int = Field(default=3, gt=0, description="how many, at 100 %")
    ratio: float = Field(default=0.5, le=1, description="a share")
    limit: int | None = Field(default=None, gt=0, description="a cap (unset: none)")
    mode: Literal["fast", "slow"] = Field(default="fast", description="how")
    out: Path | None = Field(default=None, description="a folder")
    loud: bool = Field(default=True, description="say more")
    token: SecretStr | None = Field(default=None, min_length=20, description="a secret")

    @model_validator(mode="after")
    def _cap_over_size(self) -> _Toy:
        if self.limit is not None and self.limit < self.size:
            raise ValueError(f"limit ({self.limit}) must be >= size ({self.size})")
        return self


def _command() -> SettingsCommand[_Toy]:
    return SettingsCommand(_Toy, prog="toy", description="A toy.")


def _error(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> str:
    with pytest.raises(SystemExit) as exc:
        _command().parse(argv)
    assert exit_status(exc.value) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err  # one line, as argparse's own errors
    assert err.startswith("toy: error: ")
    return err.removeprefix("toy: error: ").rstrip("\n")


def test_flags_win_over_variables_which_win_over_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOY_SIZE", "7")
    monkeypatch.setenv("TOY_RATIO", "0.25")
    toy, _ = _command().parse(["--ratio", "0.75", "--no-loud", "--mode", "slow"])
    assert (toy.size, toy.ratio, toy.loud, toy.mode, toy.limit) == (7, 0.75, False, "slow", None)


def test_help_shows_each_flag_with_its_default_and_variable() -> None:
    text = " ".join(_command().format_help().split())  # argparse wraps lines
    assert "--size N how many, at 100 % [default: 3; env: TOY_SIZE]" in text
    assert "--ratio NUMBER a share [default: 0.5; env: TOY_RATIO]" in text
    assert "--limit N a cap (unset: none) [default: unset; env: TOY_LIMIT]" in text
    assert "--mode {fast,slow} how [default: fast; env: TOY_MODE]" in text
    assert "--out PATH a folder [default: unset; env: TOY_OUT]" in text
    assert "--loud, --no-loud say more [default: true; env: TOY_LOUD]" in text
    # The secret: no flag, listed as environment only.
    assert "--token" not in text
    assert "Environment only" in text
    assert "TOY_TOKEN a secret" in text


def test_a_bad_variable_is_blamed_on_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_SIZE", "abc")
    assert _error([], capsys, monkeypatch) == (
        "variable TOY_SIZE: Input should be a valid integer, unable to parse string as an "
        "integer (got 'abc')"
    )


def test_the_variable_is_named_as_the_user_spelled_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # pydantic-settings reads variables whatever their case.
    monkeypatch.setenv("toy_size", "0")
    assert _error([], capsys, monkeypatch).startswith("variable toy_size: ")


def test_a_bad_flag_is_blamed_on_the_flag_even_beside_a_good_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_SIZE", "5")
    assert _error(["--size", "0"], capsys, monkeypatch) == (
        "argument --size: Input should be greater than 0 (got '0')"
    )


def test_a_good_flag_hides_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_SIZE", "abc")
    assert _command().parse(["--size", "4"])[0].size == 4


def test_a_check_across_fields_names_what_set_each_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_SIZE", "9")
    assert _error(["--limit", "4"], capsys, monkeypatch) == ("--limit (4) must be >= TOY_SIZE (9)")
    monkeypatch.delenv("TOY_SIZE")
    assert _error(["--limit", "2"], capsys, monkeypatch) == "--limit (2) must be >= size (3)"


def test_every_problem_is_on_the_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOY_RATIO", "2")
    problems = _error(["--mode", "medium"], capsys, monkeypatch).split("; ")
    assert [p.split(":")[0] for p in problems] == ["variable TOY_RATIO", "argument --mode"]


def test_a_secret_is_refused_as_a_flag_and_never_echoed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _error(["--token=hunter2"], capsys, monkeypatch) == (
        "--token is a secret, environment only: set TOY_TOKEN (a command line is visible "
        "to every user of the machine)"
    )
    monkeypatch.setenv("TOY_TOKEN", "short-SECRET")
    message = _error([], capsys, monkeypatch)
    assert message.startswith("variable TOY_TOKEN: ")
    assert "SECRET" not in message


def test_an_unknown_flag_is_argparses_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _error(["--nope"], capsys, monkeypatch) == "unrecognized arguments: --nope"


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _command().parse(["--help"])
    assert exit_status(exc.value) == 0
    assert capsys.readouterr().out.startswith("usage: toy [options]")


def test_fail_is_the_same_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail("toy", "port taken", status=1) == 1
    assert capsys.readouterr().err == "toy: error: port taken\n"


def test_a_misspelt_variable_of_the_command_is_named_not_ignored_in_silence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOY_SIZ", "9")
    monkeypatch.setenv("TOY_COLOUR", "red")
    monkeypatch.setenv("OTHER_SIZE", "9")  # another prefix: not this command's business
    toy, _ = _command().parse([])
    assert toy.size == 3  # the misspelt one changed nothing
    assert capsys.readouterr().err.splitlines() == [
        "toy: warning: TOY_COLOUR is not a setting of this command and is ignored",
        "toy: warning: TOY_SIZ is not a setting of this command and is ignored; "
        "did you mean TOY_SIZE?",
    ]
