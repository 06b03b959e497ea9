"""docs/design/architecture.md's *Workflow types and activities* is the checked list of what the
worker registers: its two tables must say exactly what the code does.

- Workflow types: what `build_worker` (worker/run.py) registers, with each type's
  registered name, class, signals and queries (`temporalio.workflow._Definition`) and its
  versioning behaviour (`raysize.workflows.versioning.BEHAVIOR`).
- Activities: the `@activity.defn` methods `build_worker` registers (registered name,
  defining class and method, module), the workflows whose module calls each by its `Act`
  constant, and every `Act` constant in exactly one row.

A failure names each row to add, remove or replace, with the row the code wants."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio import activity, workflow
from temporalio.client import Client

from raysize.activities.cluster import RaySettings
from raysize.activities.k8s import Kube
from raysize.worker import run
from raysize.worker.settings import Settings
from raysize.workflows.contracts import Act
from raysize.workflows.versioning import BEHAVIOR

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "design" / "architecture.md"
SECTION = "## Workflow types and activities"
WHERE = f"docs/design/architecture.md, section {SECTION[3:]!r}"
NONE = "—"  # an empty cell (no signals, no queries)


# --- the doc -------------------------------------------------------------------------------
def section_tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of the section, each as its body rows' cells (header and
    separator dropped)."""
    start = text.find(f"\n{SECTION}\n")
    assert start >= 0, f"docs/design/architecture.md has no {SECTION!r} section"
    end = text.find("\n## ", start + len(SECTION) + 2)
    body = text[start : end if end >= 0 else len(text)]
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in body.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None:  # the header row
            current = []
            tables.append(current)
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
            current.append(cells)
    return tables


def ticked(cell: str) -> list[str]:
    """The `code` spans of a cell, in order."""
    return re.findall(r"`([^`]+)`", cell)


def name_of(row: list[str]) -> str:
    names = ticked(row[0])
    return names[0] if names else row[0]


# --- the code ------------------------------------------------------------------------------
def module_path(module: str) -> str:
    """`raysize.activities.cluster` → `activities/cluster.py` (raysize/ links the folders)."""
    return module.removeprefix("raysize.").replace(".", "/") + ".py"


@dataclass(frozen=True)
class WorkflowRow:
    name: str
    cls: str
    path: str
    behavior: str
    signals: frozenset[str]
    queries: frozenset[str]

    def render(self) -> str:
        return (
            f"| `{self.name}` | `{self.cls}` (`{self.path}`) | `{self.behavior}` | "
            f"{_list(self.signals)} | {_list(self.queries)} |"
        )


@dataclass(frozen=True)
class ActivityRow:
    name: str
    method: str  # Class.method
    path: str
    callers: frozenset[str]

    def render(self) -> str:
        return f"| `{self.name}` | `{self.method}` (`{self.path}`) | {_list(self.callers)} |"


def _list(names: frozenset[str]) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names)) or NONE


def registered(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `build_worker` hands to Temporal's `Worker`: built with a stand-in `Worker`
    that only records its arguments, so no server, Kubernetes or Ray is needed."""
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, client: object, **kwargs: Any) -> None:
            seen.update(kwargs)

    monkeypatch.setattr(run, "Worker", Recorder)
    kube = cast(Kube, SimpleNamespace(core=None, custom=None))
    _, cluster = run.build_worker(cast(Client, object()), Settings(), kube, RaySettings())
    cluster.close()
    return seen


def acts_called(cls: type) -> set[str]:
    """The activity names (`Act` values) the workflow's module refers to."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    return {
        getattr(Act, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Act"
        and hasattr(Act, node.attr)
    }


def workflow_rows(classes: list[type]) -> dict[str, WorkflowRow]:
    rows = {}
    for cls in classes:
        d = workflow._Definition.must_from_class(cls)
        assert d.name is not None
        rows[d.name] = WorkflowRow(
            name=d.name,
            cls=cls.__name__,
            path=module_path(cls.__module__),
            behavior=BEHAVIOR[d.name].name if d.name in BEHAVIOR else "(none in BEHAVIOR)",
            signals=frozenset(n for n in d.signals if n is not None),
            queries=frozenset(n for n in d.queries if n is not None),
        )
    return rows


def activity_rows(fns: list[Callable[..., Any]], classes: list[type]) -> dict[str, ActivityRow]:
    callers: dict[str, set[str]] = {}
    for cls in classes:
        name = workflow._Definition.must_from_class(cls).name
        assert name is not None
        for act in acts_called(cls):
            callers.setdefault(act, set()).add(name)
    rows = {}
    for fn in fns:
        d = activity._Definition.from_callable(fn)
        assert d is not None and d.name is not None, f"{fn!r} is not an @activity.defn"
        func = getattr(fn, "__func__", fn)
        rows[d.name] = ActivityRow(
            name=d.name,
            method=func.__qualname__,
            path=module_path(func.__module__),
            callers=frozenset(callers.get(d.name, ())),
        )
    return rows


# --- parsing the doc's rows into the same shape ----------------------------------------------
def doc_workflow_row(row: list[str]) -> WorkflowRow:
    assert len(row) == 5, f"{WHERE}: a workflow row has 5 cells, not {len(row)}: {row}"
    cls = [*ticked(row[1]), "", ""]
    return WorkflowRow(
        name=name_of(row),
        cls=cls[0],
        path=cls[1],
        behavior=(ticked(row[2]) or [row[2]])[0],
        signals=frozenset(ticked(row[3])),
        queries=frozenset(ticked(row[4])),
    )


def doc_activity_row(row: list[str]) -> ActivityRow:
    assert len(row) == 3, f"{WHERE}: an activity row has 3 cells, not {len(row)}: {row}"
    impl = [*ticked(row[1]), "", ""]
    return ActivityRow(
        name=name_of(row), method=impl[0], path=impl[1], callers=frozenset(ticked(row[2]))
    )


def differences(what: str, doc: list[Any], code: dict[str, Any], how_to_add: str) -> list[str]:
    """Each way the doc's rows differ from the code's, said as the edit that fixes it."""
    problems = []
    by_name: dict[str, list[Any]] = {}
    for row in doc:
        by_name.setdefault(row.name, []).append(row)
    for name, rows in sorted(by_name.items()):
        if len(rows) > 1:
            problems.append(f"{what} `{name}` has {len(rows)} rows: keep one")
    for name, want in code.items():
        if name not in by_name:
            problems.append(f"missing row for {what} `{name}`: add\n    {want.render()}")
        elif by_name[name][0] != want:
            problems.append(
                f"row for {what} `{name}` disagrees with the code: replace\n"
                f"    {by_name[name][0].render()}\n  with\n    {want.render()}"
            )
    for name in by_name:
        if name not in code:
            problems.append(
                f"extra row for {what} `{name}`: the worker registers no such {what}. "
                f"Remove the row, or {how_to_add}"
            )
    return problems


def check(tables: list[list[list[str]]], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    assert len(tables) == 2, f"{WHERE}: expected 2 tables (workflow types, activities)"
    seen = registered(monkeypatch)
    classes: list[type] = list(seen["workflows"])
    problems = differences(
        "workflow type",
        [doc_workflow_row(r) for r in tables[0]],
        workflow_rows(classes),
        "register the workflow in worker/run.py WORKFLOWS",
    )
    problems += differences(
        "activity",
        [doc_activity_row(r) for r in tables[1]],
        activity_rows(list(seen["activities"]), classes),
        "register the activity in worker/run.py build_worker",
    )
    # every Act constant in exactly one row (an Act the worker does not register is a row
    # the code would not have: reported above as missing or here as absent)
    names = [name_of(r) for r in tables[1]]
    for attr, value in vars(Act).items():
        if attr.startswith("_") or not isinstance(value, str):
            continue
        if names.count(value) != 1:
            problems.append(
                f"Act.{attr} = {value!r} appears in {names.count(value)} rows of the "
                "activities table, not exactly 1"
            )
    return problems


def test_the_docs_tables_say_what_the_worker_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    problems = check(section_tables(DOC.read_text()), monkeypatch)
    assert not problems, f"{WHERE} does not match the code:\n- " + "\n- ".join(problems)


def test_a_missing_or_wrong_row_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check bites, and says which row and how to fix it."""
    tables = section_tables(DOC.read_text())
    workflows, activities = tables
    dropped = [r for r in activities if name_of(r) != Act.DRAIN]
    problems = check([workflows, dropped], monkeypatch)
    assert any("missing row for activity `drain_raylets`" in p for p in problems), problems
    assert any(f"Act.DRAIN = {Act.DRAIN!r} appears in 0 rows" in p for p in problems), problems
    extra = [*activities, ["`drain_everything`", "`X.y` (`activities/x.py`)", "`Nobody`"]]
    problems = check([workflows, extra], monkeypatch)
    assert problems == [
        "extra row for activity `drain_everything`: the worker registers no such activity. "
        "Remove the row, or register the activity in worker/run.py build_worker"
    ]
    wrong = [
        [*r[:3], "`pause`", r[4]] if name_of(r) == "PodResizeWorkflow" else r for r in workflows
    ]
    problems = check([wrong, activities], monkeypatch)
    assert len(problems) == 1 and "`retarget`" in problems[0], problems
