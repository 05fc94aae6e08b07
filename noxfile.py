"""Sessions: ``nox`` runs the default set (what CI runs); ``nox -s bench`` etc. on demand.

CI machines have exactly one Python, so sessions use the interpreter nox runs
on and never download another one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "tests_real",
    "tests_openai2",
    "examples",
    "docs",
]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True
nox.options.download_python = "never"
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml("pyproject.toml")


def _group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(PYPROJECT, name))


def _install_project(session: nox.Session, extras: str = "all") -> None:
    """Install herdless (editable, or the wheel given with --installpkg) and its test deps."""
    spec = "." if not extras else f".[{extras}]"
    wheel = os.environ.get("HERDLESS_INSTALLPKG")
    if wheel:
        session.install(f"{wheel}[{extras}]" if extras else wheel)
    else:
        session.install("-e", spec)


def _tests_impl(session: nox.Session, *, extras: str, marker: str, paths: list[str]) -> None:
    _install_project(session, extras)
    session.install(*_group("test"))
    args = session.posargs or paths
    session.run(
        "coverage",
        "run",
        "--parallel-mode",
        "-m",
        "pytest",
        "-m",
        marker,
        *args,
        env={"COVERAGE_FILE": str(ROOT / ".coverage")},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check; hadolint: the gateway's Dockerfile."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("hadolint", "deploy/Dockerfile")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package, the typing tests and this file."""
    _install_project(session, "all")
    session.install(*_group("typecheck"))
    session.run("mypy", "sdk/herdless", "tests/typing", "noxfile.py")


@nox.session
@nox.parametrize("extras", ["", "all"], ids=["core", "all"])
def tests(session: nox.Session, extras: str) -> None:
    """Unit and in-process tests; ``core`` proves the SDK works without the server extras."""
    marker = "not integration and not vllm and not clients"
    if not extras:
        # Without the server extras only the SDK's own tests can run.
        marker += " and not server"
    _tests_impl(session, extras=extras, marker=marker, paths=["tests"])


@nox.session
def tests_real(session: nox.Session) -> None:
    """Integration tests: real emulator and gateway processes on 127.0.0.1."""
    _tests_impl(session, extras="all", marker="integration", paths=["tests"])


@nox.session
def tests_vllm(session: nox.Session) -> None:
    """Contract and gateway tests against a real vLLM on CPU; skips where it cannot install.

    The vLLM venv and the converted model are kept in .cache/vllm between runs
    (cold: a few minutes and 3.5 GB; see docs/real-vllm.md).
    """
    _install_project(session, "all")
    session.install(*_group("test"))
    cache = ROOT / ".cache" / "vllm"
    prepare = ["python", "-m", "herdless.launch.vllm", "prepare", "--cache", str(cache)]
    session.run(*prepare, success_codes=[0, 3])  # 3: unavailable, reason in status.json
    status = json.loads((cache / "status.json").read_text())
    if not status["available"]:
        session.skip(f"vLLM's CPU build cannot be installed here: {status['reason']}")
    args = session.posargs or ["tests"]
    session.run("pytest", "-m", "vllm", *args, env={"HERDLESS_TEST_VLLM_HOME": str(cache)})


@nox.session
def tests_clients(session: nox.Session) -> None:
    """Real JavaScript clients from npm (openai-node, Vercel ``ai``, LangChain.js, Anthropic's
    SDK) against a real gateway, in node and (openai-node) in headless Chromium where one is
    on PATH; skips, saying why, where node or npm is missing (see docs/clients.md).

    The pinned clients are installed with ``npm ci`` into .cache/js-clients, once per lock file.
    """
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        session.skip(f"node/npm not found: no {' or '.join(missing)} on PATH; clients not run")
    _install_project(session, "all")
    session.install(*_group("test"))
    why = session.run(
        "python",
        "-c",
        "from herdless.bench.js_clients import node_available; print(node_available() or '')",
        silent=True,
    )
    if isinstance(why, str) and why.strip():
        session.skip(f"node/npm not usable: {why.strip()}; clients not run")
    session.run("pytest", "-m", "clients", *(session.posargs or ["tests/clients"]))


@nox.session
def tests_openai2(session: nox.Session) -> None:
    """The integrations against openai 2.x (on httpx) and LlamaIndex, which needs openai < 3."""
    _install_project(session, "all")
    session.install(
        *_group("test"), "openai>=2.45,<3", "langchain-openai>=1.0", "llama-index-llms-openai>=0.5"
    )
    session.run("pytest", "-p", "no:cacheprovider", *(session.posargs or ["tests/frameworks"]))


@nox.session
def examples(session: nox.Session) -> None:
    """Each example's own test, and each README's commands run as written
    (``examples/test_readme_commands.py``: real emulator, gateway, servers, worker)."""
    _install_project(session, "all")
    session.install(*_group("test"), *_group("examples"))
    # Every example's requirements in one resolve, as one environment runs them all.
    requirements = sorted((ROOT / "examples").glob("*/requirements.txt"))
    session.install(*(arg for path in requirements for arg in ("-r", str(path))))
    session.run("pytest", "-p", "no:cacheprovider", *(session.posargs or ["examples"]))


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly."""
    _install_project(session, "all")
    session.install(*_group("docs"))
    session.run("mkdocs", "build", "--strict", "--site-dir", str(ROOT / "site"))
    # What strict mode does not check: private bases, >>> examples, an entry per name.
    session.run("python", "docs/scripts/check_site.py", str(ROOT / "site"))


@nox.session
def coverage(session: nox.Session) -> None:
    """Combine the coverage data of the test sessions and report."""
    session.install("coverage[toml]")
    session.run("coverage", "combine", success_codes=[0, 1])
    session.run("coverage", "report")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: scenarios measured as ratios against baselines in the same run."""
    _install_project(session, "all")
    session.install("openai", "tenacity")
    session.run("herdless", "bench", "all", "--out", str(ROOT / "bench-results"), *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """The soak: thousands of calls through overload and two outages, fully accounted."""
    _install_project(session, "all")
    out = str(ROOT / "soak-results")
    session.run("python", "-m", "herdless.bench.soak", "--out", out, *session.posargs)
