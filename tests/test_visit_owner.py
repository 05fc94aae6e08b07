"""A visit has one owner: nothing outside ``herdless._call.visit`` writes a ``Visit`` field.

Read from the source with ``ast``, as ``tests/test_layout.py`` reads the imports: every
assignment, augmented assignment, deletion or ``setattr`` of an attribute named like one
of ``Visit``'s fields, on anything but ``self``, anywhere else in the package. Another
class may have a field of the same name (``self.end``): a write through ``self`` is that
class's own. The visit's own methods (``take_slot``, ``record``, ``leave``, ...) are the
only way to change what it holds.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def _package() -> Path:
    spec = importlib.util.find_spec("herdless")
    if spec is None or spec.origin is None:
        raise RuntimeError("herdless is not installed")
    return Path(spec.origin).parent


PACKAGE = _package()
OWNER = PACKAGE / "_call" / "visit.py"


def _fields() -> set[str]:
    for node in ast.walk(ast.parse(OWNER.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Visit":
            for item in node.body:
                if isinstance(item, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets
                ):
                    return set(ast.literal_eval(item.value))
    raise AssertionError("Visit.__slots__ not found")


FIELDS = _fields()

# Other objects with a field named like one of Visit's, by the name the code gives them
# (a Visit is never called so): their writes are their own.
OTHERS = {
    "limit": "herdless._sockets.AttemptLimit.end",
    "state": "herdless._stream_state.StreamState.end",
    "ticket": "herdless._window.SlotTicket.sent",
    "access": "herdless.gateway's access record .backend",
}


def _writes(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, name)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.For | ast.AsyncFor):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in FIELDS
        ):
            found.append(f"{name}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
        for target in targets:
            for leaf in ast.walk(target):  # tuples and starred targets too
                if (
                    isinstance(leaf, ast.Attribute)
                    and leaf.attr in FIELDS
                    and not (isinstance(leaf.value, ast.Name) and leaf.value.id == "self")
                ):
                    if isinstance(leaf.value, ast.Name) and leaf.value.id in OTHERS:
                        continue
                    found.append(f"{name}:{leaf.lineno} .{leaf.attr}")
    return found


def test_the_reader_finds_the_fields_and_a_write() -> None:
    # Guards the reader itself: it knows the fields, and would see a write.
    assert {"slot", "permit", "budgeted", "paced", "phase"} <= FIELDS
    probe = "def f(visit, hedge):\n    visit.slot, visit.permit = None, None\n"
    probe += "    hedge.waited += 1\n    setattr(visit, 'paced', True)\n"
    assert len(_writes(probe, "probe")) == 4


def test_no_visit_goes_by_the_name_of_another_object() -> None:
    # The names OTHERS lets through are never a Visit's, in a parameter's annotation.
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.arg)
                and node.arg in OTHERS
                and node.annotation is not None
                and "Visit" in ast.unparse(node.annotation)
            ):
                wrong.append(f"{path.name}:{node.lineno} {node.arg}")
    assert wrong == []


def test_nothing_outside_the_visit_writes_its_fields() -> None:
    writes = [
        write
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != OWNER
        for write in _writes(path.read_text(), str(path.relative_to(PACKAGE)))
    ]
    assert writes == []
