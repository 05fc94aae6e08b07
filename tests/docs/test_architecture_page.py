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
    for path in (PACKAGE / f"{name}.py", PACKAGE / name / "__init__.py"):
        if path.exists():
            return path
    return None


def test_every_module_and_folder_on_the_map_exists() -> None:
    names = re.findall(r"(?m)^ +([a-z_]+(?:\.py|/))", MAP)
    names += re.findall(r"(?<![\w.])(_[a-z][a-z_]*)\b", MAP)
    assert len(names) > 40  # the map was read
    missing = [n for n in names if _module(n.removesuffix(".py").removesuffix("/")) is None]
    assert missing == []


def test_every_module_of_the_sdk_core_is_on_the_map() -> None:
    core = {p.stem for p in PACKAGE.glob("_*.py") if not p.stem.startswith("__")}
    on_map = set(re.findall(r"(?<![\w.])(_[a-z][a-z_]*)\b", MAP))
    assert sorted(core - on_map) == []


def test_every_name_in_the_text_exists_where_it_says() -> None:
    # `_module` and `_module.name` (a class, a function, a method or a constant in it).
    refs = re.findall(r"`(_[a-z][a-z_]*)((?:\.[A-Za-z_]+)*)`", TEXT.split("```text")[0])
    refs += re.findall(r"`(_[a-z][a-z_]*)((?:\.[A-Za-z_]+)*)`", TEXT.split("```", 2)[2])
    assert len(refs) > 25  # the text was read
    wrong = []
    for module, attrs in refs:
        path = _module(module)
        if path is None:
            wrong.append(module)
        elif attrs and not set(attrs.strip(".").split(".")) <= _defined(path):
            wrong.append(module + attrs)
    assert wrong == []


def test_the_drivers_and_checks_it_walks_through_exist() -> None:
    # The bold steps of the call's path: `Client.chat`, `CallFlow.run`, ...
    steps = re.findall(r"\*\*`([A-Za-z_.]+)`\*\*", TEXT)
    assert len(steps) >= 6
    everything = set().union(*(_defined(p) for p in PACKAGE.glob("_*.py")))
    for step in steps:
        first, *rest = step.split(".")
        if re.fullmatch(r"_[a-z][a-z_]*", first):  # `_module.name`
            path = _module(first)
            assert path is not None, step
            assert set(rest) <= _defined(path), step
        else:  # `Class.method`, found in the core
            assert {first, *rest} <= everything, step
    checks = re.findall(r"`(hold|window|budget|pacing|spend|breaker)`", TEXT)
    assert set(checks) <= _defined(PACKAGE / "_checks.py")
    assert len(set(checks)) == 6
