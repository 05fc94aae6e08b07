"""Results of one scenario and how they are written: Markdown, JSON (and PNGs, by the scenario)."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from herdless.bench.runner import Runs
from herdless.bench.stats import median, ratio

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "Column",
    "Medians",
    "ScenarioResult",
    "Target",
    "knobs",
    "medians",
    "write_result",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    """One figure of the results table: ``key`` in each arm's metrics, shown as ``label``."""

    key: str
    label: str
    fmt: str = "{:.2f}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A claim checked against a measured figure: ``value <= limit`` (or ``>=``).

    ``note`` says what the table alone cannot: e.g. that no arm can meet the limit
    as written in this scenario, and why.
    """

    label: str
    value: float
    limit: float
    at_least: bool = False
    note: str = ""

    @property
    def met(self) -> bool:
        """Whether the measured value meets the limit (a missing value never does)."""
        if math.isnan(self.value):
            return False
        return self.value >= self.limit if self.at_least else self.value <= self.limit


@dataclass(slots=True, kw_only=True)
class ScenarioResult:
    """Everything one scenario measured, ready to write.

    Attributes:
        name: the scenario (file stem of its outputs).
        title: one line for the table's heading.
        params: the knobs it ran with (N, capacity, repeats, ...).
        columns: the table's figures, in order.
        rows: per arm (or sub-case) the median of every figure, keyed by ``arm``.
        runs: every repetition's raw metrics, per arm.
        targets: claims and whether they held.
        notes: sentences printed under the table (how it was measured).
        plots: PNG files written next to the table.
    """

    name: str
    title: str
    params: dict[str, Any]
    columns: list[Column]
    rows: list[dict[str, Any]]
    runs: Runs = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)

    def to_markdown(self) -> str:
        """The table, targets and notes as Markdown."""
        lines = [f"## {self.name}: {self.title}", ""]
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        lines += [f"Parameters: {params}.", ""]
        header = ["arm", *(c.label for c in self.columns)]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for row in self.rows:
            cells = [str(row["arm"])]
            for col in self.columns:
                value = row.get(col.key, math.nan)
                cells.append("n/a" if _missing(value) else col.fmt.format(value))
            lines.append("| " + " | ".join(cells) + " |")
        if self.targets:
            noted = any(t.note for t in self.targets)
            head = "| target | measured | limit | met |" + (" note |" if noted else "")
            lines += ["", head, "|---|---|---|---|" + ("---|" if noted else "")]
            for t in self.targets:
                sign = ">=" if t.at_least else "<="
                value = "n/a" if math.isnan(t.value) else f"{t.value:.3g}"
                line = f"| {t.label} | {value} | {sign} {t.limit:g} | {_yes(t.met)} |"
                lines.append(line + (f" {t.note} |" if noted else ""))
        if self.notes:
            lines += ["", *(f"- {note}" for note in self.notes)]
        if self.plots:
            lines += ["", *(f"![{p.stem}]({p.name})" for p in self.plots)]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``NaN`` becomes ``null``)."""
        cleaned: dict[str, Any] = _clean(
            {
                "name": self.name,
                "title": self.title,
                "params": self.params,
                "rows": self.rows,
                "runs": self.runs,
                "targets": [
                    {
                        "label": t.label,
                        "value": t.value,
                        "limit": t.limit,
                        "at_least": t.at_least,
                        "met": t.met,
                        "note": t.note,
                    }
                    for t in self.targets
                ],
                "notes": self.notes,
                "plots": [p.name for p in self.plots],
            }
        )
        return cleaned


def medians(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> list[dict[str, Any]]:
    """One row per arm: the median of each metric over the arm's repetitions."""
    rows: list[dict[str, Any]] = []
    for arm, samples in runs.items():
        keys = sorted({k for s in samples for k in s})
        row: dict[str, Any] = {"arm": arm}
        row.update({k: median(s.get(k, math.nan) for s in samples) for k in keys})
        rows.append(row)
    return rows


def knobs(params: DataclassInstance, *, leave_out: Collection[str] = ()) -> dict[str, Any]:
    """What a table states its scenario ran with: every field of its parameters (a
    dataclass), in their order, but those in ``leave_out``."""
    return {f.name: getattr(params, f.name) for f in fields(params) if f.name not in leave_out}


class Medians:
    """Each arm's median figures over its runs: the rows of a result table, found by arm.

    A scenario's table in three steps: ``table = Medians(runs)``; figures relative to a
    baseline arm added with :meth:`relative` and read back by arm (``table["vtc"]["p95"]``)
    for the targets; then :meth:`result`, which carries the rows and the raw runs.
    """

    __slots__ = ("rows", "runs")

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.rows = medians(runs)

    def __contains__(self, arm: object) -> bool:
        return arm in self.runs

    def __getitem__(self, arm: str) -> dict[str, Any]:
        """The row of ``arm`` (``KeyError`` if no arm has that name)."""
        for row in self.rows:
            if row["arm"] == arm:
                return row
        raise KeyError(arm)

    def relative(self, key: str, figure: str, base: str) -> None:
        """Give every row ``key``: its ``figure`` over the ``base`` arm's (``nan`` where
        that is zero or missing)."""
        baseline = float(self[base][figure])
        for row in self.rows:
            row[key] = ratio(float(row[figure]), baseline)

    def result(
        self,
        *,
        name: str,
        title: str,
        params: dict[str, Any],
        columns: list[Column],
        targets: Sequence[Target] = (),
        notes: Sequence[str] = (),
        plots: Sequence[Path] = (),
    ) -> ScenarioResult:
        """The scenario's result: these rows and runs, with the rest of its table."""
        return ScenarioResult(
            name=name,
            title=title,
            params=params,
            columns=columns,
            rows=self.rows,
            runs=self.runs,
            targets=list(targets),
            notes=list(notes),
            plots=list(plots),
        )


def write_result(result: ScenarioResult, out: Path) -> tuple[Path, Path]:
    """Write ``<name>.md`` and ``<name>.json`` into ``out``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{result.name}.md"
    md.write_text(result.to_markdown(), encoding="utf-8")
    js = out / f"{result.name}.json"
    js.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return md, js


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
