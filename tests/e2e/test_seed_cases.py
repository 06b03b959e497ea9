"""The seed pull request's four example cases, end to end with real Ray and Temporal."""

from __future__ import annotations

import asyncio

from workflows.contracts import ResizeOutcome
from workflows.resize_workflow import PodResizeWorkflow

from .conftest import Stack, eventually, ippr_cluster, start_driver, stop_driver


def cpu_of(pod: object) -> str:
    return pod.spec.containers[0].resources.limits["cpu"]  # type: ignore[attr-defined]


async def test_case_1_a_pending_two_cpu_task_runs_after_its_pod_grows(stack: Stack) -> None:
    stack.create(ippr_cluster("case1"))
    gcs = await eventually(lambda: stack.gcs("case1"), 60)
    pods = await eventually(
        lambda: [p for p in stack.workers("case1") if p.status.phase == "Running"], 60
    )
    driver = start_driver(gcs, 2)
    try:
        out, err = await asyncio.to_thread(driver.communicate, timeout=150)
    finally:
        stop_driver(driver)
    assert driver.returncode == 0, err[-2000:]
    assert "ran with 2 CPU" in out
    pod = stack.workers("case1")[0]
    assert pod.metadata.name == pods[0].metadata.name  # resized in place, not replaced
    assert cpu_of(pod) == "2"  # right-sized: what the task needs, not the maximum
    handle = stack.temporal.get_workflow_handle_for(
        PodResizeWorkflow.run, f"resize/default/{pod.metadata.name}"
    )
    state = await handle.result()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (state.raylet_cpu, state.cpu) == (2000, 2000)
