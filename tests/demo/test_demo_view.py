"""The demo's live view and its summary, from a made-up state (no processes)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from worker.demo_scenarios import SCENARIOS, Progress, ResizeView
from worker.demo_view import DemoState, JsonSink, LiveSink, PodRow, RayletRow, summary, ui_link


def a_state() -> DemoState:
    state = DemoState(scenario=SCENARIOS["timeout"], ui_port=18233)
    state.pods = {
        "demo-small-worker-a": PodRow(
            "demo-small-worker-a",
            "worker",
            "Running",
            "stuck-node",
            "2",
            "1Gi",
            "1",
            "1Gi",
            "InProgress",
        ),
    }
    state.raylets = {"ab" * 28: RayletRow("ab" * 28, "demo-small-worker-a", "idle", 1, 1, 1.0)}
    state.demands = ("1× {CPU: 2}",)
    for pod, outcome, cpu in (("a", "RolledBack", 1000), ("b", "Succeeded", 2000)):
        view = ResizeView(
            workflow_id=f"resize/default/demo-small-worker-{pod}",
            run_id=f"run-{pod}",
            pod=f"demo-small-worker-{pod}",
            status="COMPLETED",
            phase="Done",
            outcome=outcome,
            from_cpu=1000,
            cpu=cpu,
            detail="Pod resize timed out after 5s" if outcome == "RolledBack" else "",
        )
        state.resizes[(view.workflow_id, view.run_id)] = view
    state.workload = ["submitting 1 task(s) of 2 CPU"]
    return state


def test_the_live_view_shows_pods_raylets_demands_resizes_and_the_workload() -> None:
    out = io.StringIO()
    sink = LiveSink(Console(file=out, width=140, force_terminal=False))
    state = a_state()
    sink.refresh(state)
    sink.close()
    text = out.getvalue()
    for expected in (
        "demo-small-worker-a",
        "1 → 2",  # running 1 CPU, spec 2
        "InProgress",
        "1× {CPU: 2}",
        "resize/default/demo-small-worker-b",
        "RolledBack",
        "submitting 1 task(s) of 2 CPU",
        "Temporal UI: http://localhost:18233",
    ):
        assert expected in text


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
        "no deferred resize has succeeded at the kubelet's suggestion yet"
    ]
    assert SCENARIOS["idle"].missing(Progress(resizes, {"a"}, {"a"}, 0)) == [
        "the idle pod has not shrunk back to its template size yet"
    ]
    assert SCENARIOS["grow"].missing(Progress(resizes, {"a"}, {"a"}, 0)) == []
    assert SCENARIOS["grow"].missing(Progress([], set(), set(), 1)) == [
        "the workload has not finished",
        "no resize has grown a pod yet",
    ]
