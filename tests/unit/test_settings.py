"""``HERDLESS_*`` settings: what they build, and errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdless._backend import Price, Timeouts
from herdless._breaker import BreakerPolicy
from herdless._config import ClientOptions
from herdless._hedge import HedgePolicy
from herdless._retry import RetryPolicy
from herdless._settings import env_options
from herdless.errors import ConfigurationError

URL = "http://gpu.test:8080/v1"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("HERDLESS_PRIMARY_URL", URL)
    return monkeypatch


def test_the_minimum_is_a_primary_url(env: pytest.MonkeyPatch) -> None:
    primary, options = env_options(None)
    assert primary.base_url == URL
    assert primary.name == "primary"
    assert primary.api_key is None
    assert options["fallback"] == ()
    assert options["model"] is None
    assert options["deadline"] is None
    assert options["timeouts"] == Timeouts()
    assert options["retry"] == RetryPolicy()
    assert options["breaker"] == BreakerPolicy()
    assert options["hedge"] is None  # hedging is off unless asked for


@pytest.mark.parametrize(
    ("variables", "policy"),
    [
        ({"HEDGE_AFTER": "auto"}, HedgePolicy(after="auto")),
        ({"HEDGE_AFTER": " Auto "}, HedgePolicy(after="auto")),
        ({"HEDGE_AFTER": "1.5", "HEDGE_MAX_SHARE": "0.15"}, HedgePolicy(after=1.5, max_share=0.15)),
    ],
)
def test_hedging_from_the_environment(
    env: pytest.MonkeyPatch, variables: dict[str, str], policy: HedgePolicy
) -> None:
    for name, value in variables.items():
        env.setenv(f"HERDLESS_{name}", value)
    assert env_options(None)[1]["hedge"] == policy


def test_the_environment_sets_only_client_options(env: pytest.MonkeyPatch) -> None:
    # ClientConfig.build merges these into the given ClientOptions, a cast mypy cannot check.
    _, options = env_options(None)
    assert set(options) <= set(ClientOptions.__annotations__)


def test_a_client_from_the_environment_hedges(env: pytest.MonkeyPatch) -> None:
    import herdless

    env.setenv("HERDLESS_HEDGE_AFTER", "2")
    with herdless.Client(env_file=None) as client:
        assert client.config.hedge == HedgePolicy(after=2.0)
    with herdless.Client(env_file=None, hedge=HedgePolicy(after="auto")) as client:
        assert client.config.hedge == HedgePolicy(after="auto")  # an argument wins


def test_llm_d_headers_can_be_turned_off_from_the_environment(env: pytest.MonkeyPatch) -> None:
    import herdless

    with herdless.Client(env_file=None) as client:
        assert client.config.llm_d_headers  # on by default
    env.setenv("HERDLESS_LLM_D_HEADERS", "false")
    assert env_options(None)[1]["llm_d_headers"] is False
    with herdless.Client(env_file=None) as client:
        assert not client.config.llm_d_headers
    with herdless.Client(env_file=None, llm_d_headers=True) as client:
        assert client.config.llm_d_headers  # an argument wins
    env.setenv("HERDLESS_LLM_D_HEADERS", "sometimes")
    with pytest.raises(ConfigurationError, match="HERDLESS_LLM_D_HEADERS"):
        env_options(None)


def test_everything_set(env: pytest.MonkeyPatch) -> None:
    for name, value in {
        "PRIMARY_API_KEY": "sk-p",
        "MODEL": "gemma-4",
        "FALLBACK_URL": "https://api.hosted.test/v1",
        "FALLBACK_API_KEY": "sk-f",
        "FALLBACK_MODEL": "gpt-mini",
        "FALLBACK_EXTERNAL": "false",
        "DEADLINE": "20",
        "CONNECT_TIMEOUT": "1.5",
        "FIRST_BYTE_TIMEOUT": "12",
        "READ_TIMEOUT": "9",
        "RETRY_MAX_ATTEMPTS": "3",
        "RETRY_CAP": "4",
        "RETRY_MAX_RETRY_AFTER": "30",
        "BREAKER_OPEN_FOR": "2.5",
        "BREAKER_CONSECUTIVE_FAILURES": "7",
    }.items():
        env.setenv(f"HERDLESS_{name}", value)
    primary, options = env_options(None)
    assert primary.api_key == "sk-p"
    assert options["model"] == "gemma-4"
    [fallback] = options["fallback"]
    assert (fallback.name, fallback.base_url, fallback.api_key) == (
        "fallback",
        "https://api.hosted.test/v1",
        "sk-f",
    )
    assert (fallback.model, fallback.external) == ("gpt-mini", False)
    assert options["deadline"] == 20.0
    assert options["timeouts"] == Timeouts(connect=1.5, first_byte=12.0, read=9.0)
    assert options["retry"] == RetryPolicy(max_attempts=3, cap=4.0, max_retry_after=30.0)
    assert options["breaker"] == BreakerPolicy(open_for=2.5, consecutive_failures=7)


def test_a_fallback_is_external_by_default(env: pytest.MonkeyPatch) -> None:
    env.setenv("HERDLESS_FALLBACK_URL", "https://api.hosted.test/v1")
    env.setenv("HERDLESS_FALLBACK_MODEL", "gpt-mini")
    assert env_options(None)[1]["fallback"][0].external is True


def test_a_dotenv_file_is_read(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(
        f"HERDLESS_PRIMARY_URL={URL}\nHERDLESS_MODEL=from-file\nHERDLESS_GATEWAY_PORT=9\n"
    )
    _, options = env_options(dotenv)
    assert options["model"] == "from-file"  # and the gateway's variable is ignored, not an error


def test_the_environment_wins_over_the_dotenv_file(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("HERDLESS_PRIMARY_URL=http://file.test/v1\n")
    assert env_options(dotenv)[0].base_url == URL


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({}, "HERDLESS_PRIMARY_URL"),
        ({"HERDLESS_PRIMARY_URL": "gpu.test:8080/v1"}, "HERDLESS_PRIMARY_URL"),
        ({"HERDLESS_PRIMARY_URL": URL, "HERDLESS_DEADLINE": "soon"}, "HERDLESS_DEADLINE"),
        ({"HERDLESS_PRIMARY_URL": URL, "HERDLESS_RETRY_CAP": "-1"}, "HERDLESS_RETRY_CAP"),
        (
            {"HERDLESS_PRIMARY_URL": URL, "HERDLESS_RETRY_MAX_ATTEMPTS": "2.5"},
            "HERDLESS_RETRY_MAX_ATTEMPTS",
        ),
        (
            {"HERDLESS_PRIMARY_URL": URL, "HERDLESS_BREAKER_FAILURE_RATE": "2"},
            "HERDLESS_BREAKER_FAILURE_RATE",
        ),
        (
            {"HERDLESS_PRIMARY_URL": URL, "HERDLESS_FIRST_BYTE_TIMEOUT": "0"},
            "HERDLESS_FIRST_BYTE_TIMEOUT",
        ),
        (
            {"HERDLESS_PRIMARY_URL": URL, "HERDLESS_FALLBACK_URL": "https://h.test/v1"},
            "HERDLESS_FALLBACK_MODEL",
        ),
        (
            {"HERDLESS_PRIMARY_URL": URL, "HERDLESS_FALLBACK_EXTERNAL": "maybe"},
            "HERDLESS_FALLBACK_EXTERNAL",
        ),
        ({"HERDLESS_PRIMARY_URL": URL, "HERDLESS_HEDGE_AFTER": "soon"}, "HERDLESS_HEDGE_AFTER"),
        ({"HERDLESS_PRIMARY_URL": URL, "HERDLESS_HEDGE_AFTER": "-1"}, "HERDLESS_HEDGE_AFTER"),
        (
            {
                "HERDLESS_PRIMARY_URL": URL,
                "HERDLESS_HEDGE_AFTER": "1",
                "HERDLESS_HEDGE_MAX_SHARE": "2",
            },
            "HERDLESS_HEDGE_MAX_SHARE",
        ),
        (
            {"HERDLESS_PRIMARY_URL": URL, "HERDLESS_HEDGE_MAX_SHARE": "0.1"},
            "HERDLESS_HEDGE_AFTER",
        ),
    ],
)
def test_errors_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        env_options(None)
    assert caught.value.variable == named
    assert named in str(caught.value)


def test_a_malformed_key_setting_never_shows_the_key(env: pytest.MonkeyPatch) -> None:
    env.setenv("HERDLESS_PRIMARY_API_KEY", "sk-SECRET-1")
    env.setenv("HERDLESS_DEADLINE", "sk-SECRET-2")
    with pytest.raises(ConfigurationError) as caught:
        env_options(None)
    assert "SECRET" not in str(caught.value)
    env.setenv("HERDLESS_DEADLINE", "5")
    assert "SECRET" not in repr(env_options(None))


def test_a_misspelled_variable_is_named_with_the_one_it_resembles(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("HERDLESS_DEADLNE", "5")
    with pytest.warns(UserWarning, match="HERDLESS_DEADLNE .* did you mean HERDLESS_DEADLINE"):
        _, options = env_options(None)
    assert options["deadline"] is None  # ignored, as the warning says


def test_a_misspelled_variable_in_the_dotenv_file_is_named(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("HERDLESS_FALLBACK_MODLE=gpt-mini\n")
    with pytest.warns(UserWarning, match="did you mean HERDLESS_FALLBACK_MODEL"):
        env_options(dotenv)


@pytest.mark.parametrize(
    "name",
    [
        "HERDLESS_GATEWAY_MAX_QUEUE",  # the gateway's, the emulator's, the tools'
        "HERDLESS_EMULATOR_MODEL",
        "HERDLESS_BENCH_TARGET",
        "HERDLESS_MODELS_DIR",  # not close enough to HERDLESS_MODEL to be taken for it
        "HERDLESS_WRITE_FAULT_TABLE",
    ],
)
def test_other_herdless_variables_are_left_alone(env: pytest.MonkeyPatch, name: str) -> None:
    env.setenv(name, "1")
    env_options(None)  # filterwarnings=error: any warning fails the test


def test_stream_deadline_and_a_fallback_price_from_the_environment(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("HERDLESS_STREAM_DEADLINE", "120")
    env.setenv("HERDLESS_FALLBACK_URL", "https://api.hosted.test/v1")
    env.setenv("HERDLESS_FALLBACK_MODEL", "gpt-mini")
    env.setenv("HERDLESS_FALLBACK_PRICE_INPUT", "0.15")
    env.setenv("HERDLESS_FALLBACK_PRICE_OUTPUT", "0.6")
    _, options = env_options(None)
    assert options["stream_deadline"] == 120.0
    assert options["fallback"][0].price == Price(input=0.15, output=0.6)


def test_a_fallback_price_needs_both_variables(env: pytest.MonkeyPatch) -> None:
    env.setenv("HERDLESS_FALLBACK_URL", "https://api.hosted.test/v1")
    env.setenv("HERDLESS_FALLBACK_MODEL", "gpt-mini")
    env.setenv("HERDLESS_FALLBACK_PRICE_INPUT", "0.15")
    with pytest.raises(ConfigurationError) as caught:
        env_options(None)
    assert caught.value.variable == "HERDLESS_FALLBACK_PRICE_OUTPUT"
