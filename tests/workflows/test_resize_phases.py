"""`ResizePhase` holds only phases a resize saga can be in: `raysize status`, the saga's
`ResizePhase` search attribute and the README's phase table speak of nothing else.

`PATCHING` was never set (issue #43 item 7): the patch and the watch of the kubelet are
one activity (`apply_pod_resize`), so the saga is `Polling` from the moment it asks, and
a `ResizePhase='Patching'` query found nothing, ever."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from raysize.workflows.contracts import ResizePhase

REPO = Path(__file__).resolve().parents[2]
SAGA = REPO / "workflows" / "resize_workflow.py"
NAMING = REPO / "workflows" / "naming.py"  # the phase a starter indexes first


def _phases_entered(path: Path) -> set[str]:
    """The `ResizePhase` members the module moves a saga to: `self.phase = …`,
    `self._set_phase(…)`, or a phase an expression hands on (naming's first phase)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        values: list[ast.expr] = []
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "phase" for t in node.targets
        ):
            values.append(node.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "_set_phase":
            values.extend(node.args)
        elif isinstance(node, ast.IfExp):  # naming: the first phase a starter indexes
            values.extend((node.body, node.orelse))
        for v in values:
            for sub in ast.walk(v):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "ResizePhase"
                ):
                    found.add(sub.attr)
    return found


def _readme_phases() -> set[str]:
    """The phases of the guide's PodResizeWorkflow table (its first column)."""
    text = (REPO / "docs" / "how-it-works.md").read_text()
    start = text.index("**PodResizeWorkflow**")
    table = text[start : text.index("\nOutcomes (", start)]
    return set(re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE))


def test_every_phase_is_one_the_saga_enters() -> None:
    entered = _phases_entered(SAGA) | _phases_entered(NAMING)
    assert {p.name for p in ResizePhase} - entered == set()


def test_the_readme_lists_the_phases_a_saga_shows() -> None:
    # Starting: the saga's state before its first step (a query may see it), not a step
    shown = {p.value for p in ResizePhase} - {ResizePhase.STARTING.value}
    assert _readme_phases() == shown
