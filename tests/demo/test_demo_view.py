"""The demo's live view and its summary, from a made-up state (no processes)."""

from __future__ import annotations

import io
import json
import re

from rich.console import Console

from raysize.worker.demo_scenarios import SCENARIOS, Progress, ResizeView
from raysize.worker.demo_view import (
    DemoState,
    DemoView,
    JsonSink,
    LiveSink,
    PodRow,
    RayletRow,
    Reason,
    summary,
    ui_link,
)

INFEASIBLE = "Infeasible: Node didn't have enough capacity: cpu, requested: 2000, capacity: 1500"


def a_state() -> DemoState:
    """The `timeout` story at its end, as a run of it recorded it: the first worker's
    resize was Infeasible at 2 CPU, timed out at 1.5 and rolled back; a second worker was
    launched and grown to 2 CPU."""
    state = DemoState(scenario=SCENARIOS["timeout"], ui_port=18233)
    state.stage = "done"
    state.ended = (True, 26)
    state.pods = {
        "demo-head-4kx2p": PodRow(
            "demo-head-4kx2p", "head", "Running", "node-b", "0", "1Gi", "0", "1Gi", ""
        ),
        "demo-small-worker-a": PodRow(
            "demo-small-worker-a",
            "worker",
            "Running",
            "stuck-node",
            "1",
            "1Gi",
            "1",
            "1Gi",
            "",
        ),
        "demo-small-worker-b": PodRow(
            "demo-small-worker-b",
            "worker",
            "Running",
            "node-b",
            "2",
            "1Gi",
            "1",
            "1Gi",
            "InProgress",
        ),
    }
    state.raylets = {"ab" * 28: RayletRow("ab" * 28, "demo-small-worker-a", "idle", 1, 1, 1.0)}
    state.demands = ("1× {CPU: 2}",)
    for pod, outcome, cpu, attempts in (
        ("a", "RolledBack", 1000, ((2000, INFEASIBLE), (1500, "timed out"))),
        ("b", "Succeeded", 2000, ((2000, "done"),)),
    ):
        view = ResizeView(
            workflow_id=f"resize/default/demo-small-worker-{pod}",
            run_id=f"run-{pod}",
            pod=f"demo-small-worker-{pod}",
            status="COMPLETED",
            phase="Done",
            outcome=outcome,
            from_cpu=1000,
            cpu=cpu,
            attempts=tuple(a for _, a in attempts),
            attempt_cpus=tuple(c for c, _ in attempts),
            detail="Pod resize timed out after 5s" if outcome == "RolledBack" else "",
            started=1000.0 + ord(pod),
        )
        state.resizes[(view.workflow_id, view.run_id)] = view
    state.reasons = [
        Reason(
            5, "grow demo-small-worker-a: 1 × {CPU: 2} pending → grow 1 CPU/1Gi → 2 CPU/1Gi", 16
        ),
        Reason(6, "launch 1 × small: 1 for {CPU: 2} pending", 18),
        Reason(
            8, "grow demo-small-worker-b: 1 × {CPU: 2} pending → grow 1 CPU/1Gi → 2 CPU/1Gi", 21
        ),
    ]
    state.workload = [
        "submitting 1 task(s) of 2 CPU",
        "task of 2 CPU ran on node 1e6fcb64… (pod demo-small-worker-b)",
        "workload finished",
    ]
    state.workload_rc = 0
    return state


NOTES = [
    "starting the raysize worker",
    "creating RayCluster default/demo (1 worker of 1 CPU, growable to 4)",
    "running the Ray workload: it needs more than the cluster has",
    "resize of demo-small-worker-b 1 → 2 CPU: Succeeded",
    "resize of demo-small-worker-a 1 → 1.5 CPU: RolledBack",
    "done",
]


def screen(state: DemoState, width: int = 80, height: int = 24) -> list[str]:
    """The live view as a terminal of that size shows it."""
    console = Console(
        width=width, height=height, record=True, force_terminal=False, file=io.StringIO()
    )
    console.print(DemoView(state, NOTES))
    return console.export_text().splitlines()


def rows(lines: list[str], section: str) -> list[list[str]]:
    """The cells of a section's table rows (columns are two spaces or more apart)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(section))
    out = []
    for line in lines[start + 1 :]:
        if line.startswith("  +"):  # "+N earlier" / "+N more": older rows not shown
            continue
        if not line.startswith("demo-"):
            break
        out.append(re.split(r"\s{2,}", line.strip()))
    return out


def test_the_live_view_fits_80x24_with_every_resize_phase_outcome_and_reason() -> None:
    lines = screen(a_state())
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert lines[0] == "raysize demo timeout · done in 26s; still following the cluster (0s)"
    resizes = rows(lines, "Resizes")
    assert [r[:4] for r in resizes] == [
        ["demo-small-worker-a", "1 → 1.5", "Done", "RolledBack"],  # its last attempt's size
        ["demo-small-worker-b", "1 → 2", "Done", "Succeeded"],
    ]
    # the attempts are the only cell that may be cut short
    assert resizes[0][4].startswith("2: Infeasible: Node didn't") and resizes[0][4].endswith("…")
    # why each step happened, in the reconcile's words, none cut short
    text = "\n".join(lines)
    assert "  18s launch 1 × small: 1 for {CPU: 2} pending" in lines
    assert "grow demo-small-worker-b: 1 × {CPU: 2} pending → grow 1 CPU/1Gi" in text
    assert "Ray waits for: 1× {CPU: 2}" in lines
    assert [r[:3] for r in rows(lines, "Pods")] == [
        ["demo-head-4kx2p", "Running", "0"],
        ["demo-small-worker-a", "Running", "1"],
        ["demo-small-worker-b", "Running", "1 → 2"],  # running 1 CPU, spec 2
    ]
    assert "  task of 2 CPU ran on node 1e6fcb64… (pod demo-small-worker-b)" in lines
    assert lines[lines.index("Ray workload (exit 0)") + 3] == "  workload finished"


def test_a_long_story_keeps_the_newest_resizes_and_reasons_in_24_lines() -> None:
    state = a_state()
    for i in range(12):
        view = ResizeView(
            workflow_id=f"resize/default/demo-small-worker-n{i:02d}",
            run_id=f"run-n{i}",
            pod=f"demo-small-worker-n{i:02d}",
            status="RUNNING" if i == 11 else "COMPLETED",
            phase="Polling" if i == 11 else "Done",
            outcome="Pending" if i == 11 else "Succeeded",
            from_cpu=1000,
            cpu=4000,
            started=2000.0 + i,
        )
        state.resizes[(view.workflow_id, view.run_id)] = view
        state.reasons.append(
            Reason(10 + i, f"grow demo-small-worker-n{i:02d}: 2 × {{CPU: 2}} gang bundle", 30 + i)
        )
    lines = screen(state)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    resizes = rows(lines, "Resizes")
    assert resizes[-1][:4] == ["demo-small-worker-n11", "1 → 4", "Polling", "Pending"]
    assert len(resizes) >= 2
    assert any(re.fullmatch(r"  \+\d+ earlier", line) for line in lines)
    assert "  41s grow demo-small-worker-n11: 2 × {CPU: 2} gang bundle" in lines
    assert any(line.startswith("  +") and "raysize status default/demo" in line for line in lines)


def test_a_smaller_terminal_drops_columns_and_parts_before_phases_and_outcomes() -> None:
    lines = screen(a_state(), width=60, height=14)
    assert len(lines) <= 14 and all(len(line) <= 60 for line in lines)
    assert [r for r in rows(lines, "Resizes")] == [
        ["demo-small-worker-a", "1 → 1.5", "Done", "RolledBack"],
        ["demo-small-worker-b", "1 → 2", "Done", "Succeeded"],
    ]  # the attempts column went first
    why = lines.index("  21s grow demo-small-worker-b: 1 × {CPU: 2} pending →")
    assert lines[why + 1] == "      grow 1 CPU/1Gi → 2 CPU/1Gi"  # wrapped, not cut
    assert not any("starting the raysize worker" in line for line in lines)  # the log went


def test_after_the_summary_the_view_goes_on_following_the_cluster() -> None:
    out = io.StringIO()
    sink = LiveSink(Console(file=out, width=80, height=24, force_terminal=False))
    state = a_state()
    sink.refresh(state)
    sink.event(summary(state, True, []))
    # the cluster goes on: the grown pod shrinks back once idle
    shrink = ResizeView(
        workflow_id="resize/default/demo-small-worker-b",
        run_id="run-b2",
        pod="demo-small-worker-b",
        status="COMPLETED",
        phase="Done",
        outcome="Succeeded",
        from_cpu=2000,
        cpu=1000,
        started=3000.0,
    )
    state.resizes[(shrink.workflow_id, shrink.run_id)] = shrink
    sink.refresh(state)
    sink.close()
    text = out.getvalue()
    after = text[text.index("done — scenario timeout") :].splitlines()
    assert rows(after, "Resizes")[-1] == ["demo-small-worker-b", "2 → 1", "Done", "Succeeded"]


def test_the_live_view_uses_a_wide_terminal() -> None:
    lines = screen(a_state(), width=140, height=60)
    assert rows(lines, "Pods")[-1] == [
        "demo-small-worker-b", "Running", "1 → 2", "-", "InProgress", "1Gi", "node-b"
    ]  # fmt: skip
    assert "· resize of demo-small-worker-a 1 → 1.5 CPU: RolledBack" in lines
    assert (
        "story: the first worker's node never actuates a resize: timeout, rollback; a second pod "
        "is launched instead, at the task's size" in lines
    )
    assert rows(lines, "Resizes")[0][4].startswith(f"2: {INFEASIBLE}; 1.5")


def test_the_summary_names_what_happened_and_links_each_resize_unbroken() -> None:
    state = a_state()
    doc = summary(state, True, [])
    assert doc["grew"] == ["demo-small-worker-b: 1 → 2 CPU"]
    assert doc["rolled_back"] == [
        "demo-small-worker-a: back to 1 CPU (Pod resize timed out after 5s)"
    ]
    assert doc["ui_links"] == [
        "http://localhost:18233/namespaces/default/workflows/"
        "resize%2Fdefault%2Fdemo-small-worker-a/run-a/history",
        "http://localhost:18233/namespaces/default/workflows/"
        "resize%2Fdefault%2Fdemo-small-worker-b/run-b/history",
    ]
    out = io.StringIO()
    LiveSink(Console(file=out, width=60, force_terminal=False)).event(doc)
    lines = out.getvalue().splitlines()
    for link in doc["ui_links"]:  # a narrow terminal does not break a link
        assert any(link in line for line in lines)
    headless = io.StringIO()
    JsonSink(headless).event(doc)
    assert json.loads(headless.getvalue())["ui_links"] == doc["ui_links"]


def test_ui_link_without_a_run() -> None:
    assert ui_link(8233, "resize/default/p") == (
        "http://localhost:8233/namespaces/default/workflows/resize%2Fdefault%2Fp"
    )


def test_each_scenario_says_what_it_still_lacks() -> None:
    state = a_state()
    resizes = list(state.resizes.values())
    timeout = SCENARIOS["timeout"]
    assert timeout.missing(Progress(resizes, {"a"}, {"a"}, None)) == [
        "the workload has not finished",
        "no worker pod was launched yet",
    ]
    assert timeout.missing(Progress(resizes, {"a"}, {"a", "b"}, 0)) == []
    assert SCENARIOS["deferred"].missing(Progress(resizes, {"a"}, {"a"}, 0)) == [
        "no resize has grown a pod to the 2.5 CPU its node has room for yet"
    ]
    assert SCENARIOS["idle"].missing(Progress(resizes, {"a"}, {"a"}, 0)) == [
        "the idle pod has not shrunk back to its template size yet"
    ]
    assert SCENARIOS["grow"].missing(Progress([], {"a"}, {"a"}, 1)) == [
        "the workload has not finished",
        "the first worker has not grown 1 → 2 CPU yet",
        "the first worker has not grown 2 → 4 CPU yet",
    ]


def grown(pod: str, from_cpu: int, cpu: int, started: float) -> ResizeView:
    return ResizeView(
        f"resize/default/{pod}", f"run{started}", pod, "COMPLETED", "Done", "Succeeded",
        from_cpu=from_cpu, cpu=cpu, started=started,
    )  # fmt: skip


def test_the_grow_story_is_what_the_planner_does_and_nothing_else() -> None:
    """The `grow` story's words and its end check say the same: the first worker grows
    1 → 2 CPU, then 2 → 4 CPU for the placement group, and no pod is launched (as a run
    of it does). Its words once said the group got a second pod, grown 1 → 4, while
    the demo showed the first pod growing 2 → 4: that run now misses its end."""
    grow = SCENARIOS["grow"]
    assert "2 CPU" in grow.title and "4 CPU" in grow.title and "no pod is launched" in grow.title
    assert "1 → 2 CPU, then 2 → 4 CPU" in grow.expect and "no pod launched" in grow.expect
    what_happens = [grown("a", 1000, 2000, 1.0), grown("a", 2000, 4000, 2.0)]
    assert grow.missing(Progress(what_happens, {"a"}, {"a"}, 0)) == []
    what_it_said = [grown("a", 1000, 2000, 1.0), grown("b", 1000, 4000, 2.0)]
    assert grow.missing(Progress(what_it_said, {"a"}, {"a", "b"}, 0)) == [
        "the first worker has not grown 2 → 4 CPU yet",
        "a pod was launched (b): the story grows the first one",
    ]
