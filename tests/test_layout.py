"""The package's layout holds: no import cycle, imports go down the layers, and a long
module says why it is one concept.

The import graph is read from the source with ``ast`` (no module is imported): every
``import`` and ``from ... import`` naming a herdless module, wherever it stands, also
under ``if TYPE_CHECKING:`` and inside functions, so that a cycle hidden in type hints
or a lazy import counts too. The layers, low to high::

    core        herdless/__init__, herdless._*, errors, events (the SDK)
    plugins     testing (test doubles), launch (process launchers), integrations,
                otel, prometheus: each on the core, none on another
    servers     gateway, emulator: on the core, not on each other
    apps        demo, bench: on everything below, not on each other
    cli         cli, __main__
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


def _package() -> Path:
    # Found, not imported: a cycle must fail its test, not the collection of this file.
    spec = importlib.util.find_spec("herdless")
    if spec is None or spec.origin is None:
        raise RuntimeError("herdless is not installed")
    return Path(spec.origin).parent


PACKAGE = _package()

# Packages at the same rank may not import each other; a lower rank never imports a higher.
RANKS = {
    "core": 0,
    "testing": 1,
    "launch": 1,
    "integrations": 1,
    "otel": 1,
    "prometheus": 1,
    "gateway": 2,
    "emulator": 2,
    "demo": 3,
    "bench": 3,
    "cli": 4,
}

# Imports across one rank that are known and scheduled to go, each with its reason.
PENDING: set[tuple[str, str]] = set()

# Past this many lines a module is a review trigger, not a rule that splits concepts...
MAX_LINES = 400
# ...it stays one module when it says here why it is one concept, which a split would
# cut in two.
ONE_CONCEPT = {
    "herdless.gateway.core.admission": "the admission state machine: every rule that moves a "
    "ticket between offered, queued, running and done reads and writes the same counters",
    "herdless.gateway.core.fairqueue": "the fair queue: the waiters' order and whom a full "
    "queue displaces both walk the same flows by the same service counters",
    "herdless.gateway.core.sizing": "the dispatch rule: its seven rules read and write the "
    "one account of the running requests and the engine's readings (what each start holds, "
    "what each end frees and teaches)",
    "herdless._window": "flow control at one backend: the window's size, its slots and the "
    "line of calls waiting for one move together under one lock (every grant, release, "
    "refusal, requeue and review reads and writes the same counters and tickets)",
}
# The gateway's pure admission core lives in gateway/core/ (admission, fair queue, sizing ...).


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module a dotted name refers to: itself, or the nearest package above it."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {_resolve(a.name) for a in node.names if a.name.startswith("herdless")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            if base.partition(".")[0] != "herdless":
                continue
            for alias in node.names:  # `from herdless import errors` imports a module
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else _resolve(base))
    found.discard(module)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"
    top = parts[1]
    if top == "__main__":
        return "cli"
    if top.startswith("_") or top in ("errors", "events"):
        return "core"
    return top


def _cycle() -> list[str] | None:
    """One import cycle of ``GRAPH``, or ``None`` (depth-first, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_the_imports_it_checks() -> None:
    # Guards the reader itself: a relative, a lazy and a TYPE_CHECKING import are seen.
    assert "herdless._actions" in GRAPH["herdless._client"]
    assert "herdless.bench.herd" in GRAPH["herdless.bench.cli"]  # inside a function
    assert "herdless._state" in GRAPH["herdless._call.record"]  # under TYPE_CHECKING
    assert "herdless.errors" in GRAPH["herdless"]


def test_no_import_cycle_anywhere_in_the_package() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_imports_go_down_the_layers() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        here = _layer(module)
        for target in targets:
            there = _layer(target)
            if here == there or (module, target) in PENDING:
                continue
            if RANKS[there] >= RANKS[here]:
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_package_never_depends_on_its_test_doubles() -> None:
    users = sorted(
        module
        for module, targets in GRAPH.items()
        if _layer(module) != "testing" and any(_layer(t) == "testing" for t in targets)
    )
    assert users == []


def test_the_pending_exceptions_are_still_needed() -> None:
    # Once the import goes, its entry must go too, or it would hide its return.
    for module, target in PENDING:
        assert target in GRAPH[module], f"{module} no longer imports {target}: drop it"


def test_no_module_is_over_the_size_limit() -> None:
    over = {
        module: n
        for module, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES and module not in ONE_CONCEPT
    }
    assert over == {}
    assert all(len(MODULES[m].read_text().splitlines()) > MAX_LINES for m in ONE_CONCEPT)


def _loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``statement``."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_import_herdless_does_not_pay_for_pydantic() -> None:
    loaded = _loaded_after("import herdless")
    assert "herdless._client" in loaded  # the check is on a real import
    assert not {m for m in loaded if m.partition(".")[0] in ("pydantic", "pydantic_settings")}
    assert "herdless._settings" not in loaded


@pytest.mark.parametrize(
    "statement",
    ["from herdless.testing import FakeClock", "import herdless.testing.pytest_plugin"],
)
def test_the_test_doubles_start_no_process_and_load_no_model(statement: str) -> None:
    loaded = _loaded_after(statement)
    assert "herdless.testing" in loaded
    unwanted = ("herdless.launch", "herdless.gateway", "herdless.emulator", "torch", "transformers")
    assert not {m for m in loaded if any(m == u or m.startswith(u + ".") for u in unwanted)}
