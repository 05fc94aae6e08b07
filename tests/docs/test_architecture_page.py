"""docs/architecture.md stays true: what it names exists, and the SDK core is all on its map."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

PAGE = Path(__file__).parents[2] / "docs" / "architecture.md"


def _package() -> Path:
    spec = importlib.util.find_spec("herdless")
    if spec is None or spec.origin is None:
        raise RuntimeError("herdless is not installed")
    return Path(spec.origin).parent


PACKAGE = _package()
TEXT = PAGE.read_text()
MAP = TEXT.split("```text", 1)[1].split("```", 1)[0]


def _defined(path: Path) -> set[str]:
    """Every class, function, method and assigned name in a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _module(name: str) -> Path | None:
    """The file of a module of the package: ``_wire``, or ``_call.visit`` in a folder."""
    base = PACKAGE.joinpath(*name.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _split(ref: str) -> tuple[str, list[str]]:
    """``_call.visit.Visit.record`` -> the longest module prefix and the names after it."""
    parts = ref.split(".")
    size = 1
    while size < len(parts) and _module(".".join(parts[: size + 1])) is not None:
        size += 1
    return ".".join(parts[:size]), parts[size:]


# The core's private modules, each as the map names it: `_wire`, `_call.visit`.
CORE = {p.stem for p in PACKAGE.glob("_*.py") if not p.stem.startswith("__")} | {
    f"{p.parent.name}.{p.stem}"
    for p in PACKAGE.glob("_*/*.py")
    if p.parent.name != "__pycache__" and p.stem != "__init__"
}


def test_every_module_and_folder_on_the_map_exists() -> None:
    names = re.findall(r"(?m)^ +([a-z_]+(?:\.py|/))", MAP)
    names += re.findall(r"(?<![\w.])(_[a-z][a-z_]*(?:\.[a-z_]+)*)\b", MAP)
    assert len(names) > 40  # the map was read
    missing = [n for n in names if _module(n.removesuffix(".py").removesuffix("/")) is None]
    assert missing == []


def test_every_module_of_the_sdk_core_is_on_the_map() -> None:
    on_map = set(re.findall(r"(?<![\w.])(_[a-z][a-z_]*(?:\.[a-z_]+)*)\b", MAP))
    assert sorted(CORE - on_map) == []


def test_every_name_in_the_text_exists_where_it_says() -> None:
    # `_module` and `_module.name` (a class, a function, a method or a constant in it).
    refs = re.findall(r"`(_[a-z][a-z_]*)((?:\.[A-Za-z_]+)*)`", TEXT.split("```text")[0])
    refs += re.findall(r"`(_[a-z][a-z_]*)((?:\.[A-Za-z_]+)*)`", TEXT.split("```", 2)[2])
    assert len(refs) > 25  # the text was read
    wrong = []
    for first, attrs in refs:
        module, names = _split(first + attrs)
        path = _module(module)
        if path is None:
            wrong.append(module)
        elif names and not set(names) <= _defined(path):
            wrong.append(first + attrs)
    assert wrong == []


def test_the_drivers_and_checks_it_walks_through_exist() -> None:
    # The bold steps of the call's path: `Client.chat`, `CallFlow.run`, ...
    steps = re.findall(r"\*\*`([A-Za-z_.]+)`\*\*", TEXT)
    assert len(steps) >= 6
    everything = set().union(
        *(_defined(p) for p in [*PACKAGE.glob("_*.py"), *PACKAGE.glob("_*/*.py")])
    )
    for step in steps:
        first, *rest = step.split(".")
        if re.fullmatch(r"_[a-z][a-z_]*", first):  # `_module.name`, `_folder.module.name`
            module, names = _split(step)
            path = _module(module)
            assert path is not None, step
            assert set(names) <= _defined(path), step
        else:  # `Class.method`, found in the core
            assert {first, *rest} <= everything, step
    checks = re.findall(r"`(hold|window|budget|pacing|spend|breaker)`", TEXT)
    assert set(checks) <= _defined(PACKAGE / "_call" / "checks.py")
    assert len(set(checks)) == 6
