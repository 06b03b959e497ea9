"""Ray unreachable for 30 s, in the middle of a resize: the Raylet is synced afterwards,
and while Ray can't be read raysize takes no action on the cluster.

raysize reaches the GCS only through a TCP proxy the test cuts; the Raylets and the
driver talk to the GCS directly, so only raysize loses Ray."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.kubelet import KubeletTiming
from raysize.workflows.contracts import Act, ResizeOutcome, ResizePhase
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

from .conftest import Stack, eventually, ippr_cluster, pending_activity, start_driver, stop_driver
from .gcs_proxy import GcsProxy

OUTAGE_S = 30.0


def cpu_limit(stack: Stack, pod: str) -> str:
    return stack.core.read_namespaced_pod(pod, "default").spec.containers[0].resources.limits["cpu"]


def scale_of(stack: Stack, name: str) -> tuple[int, list[str]]:
    group = stack.raycluster(name)["spec"]["workerGroupSpecs"][0]
    return group["replicas"], list((group.get("scaleStrategy") or {}).get("workersToDelete") or [])


# the kubelet takes 2 s to actuate: the proxy goes dark in that window, so the Raylet
# sync that follows runs into the outage
@pytest.mark.parametrize("kubelet_timing", [KubeletTiming(actuation_delay_s=2.0)])
async def test_ray_unreachable_for_30s_the_raylet_is_synced_afterwards(
    proxied_stack: Stack, gcs_proxy: GcsProxy
) -> None:
    stack = proxied_stack
    stack.create(ippr_cluster("outage"))
    gcs = await stack.gcs_address("outage")
    gcs_proxy.set_upstream(gcs)
    pod = (await stack.running_workers("outage"))[0].metadata.name
    wf_id = f"resize/default/{pod}"
    resize = stack.temporal.get_workflow_handle_for(PodResizeWorkflow.run, wf_id)
    reconcile = stack.temporal.get_workflow_handle_for(
        ReconcileWorkflow.run, "reconcile/default/outage"
    )
    driver = start_driver(gcs, "2", timeout_s=150)
    try:
        # the patch has landed and the kubelet is still actuating: cut Ray off now
        await eventually(lambda: cpu_limit(stack, pod) == "2", 60, every=0.05)
        gcs_proxy.go_dark()
        cut_at = time.monotonic()
        scale_before = scale_of(stack, "outage")
        assert scale_before == (1, [])

        # the kubelet finishes; the Raylet sync fails and is retried, the saga waits
        async def sync_retrying() -> bool:
            state = await resize.query(PodResizeWorkflow.state)
            attempt, failure = await pending_activity(stack.temporal, wf_id, Act.FINISH_RESIZE)
            return (
                state.phase == ResizePhase.SYNCING_RAYLET
                and attempt > 1
                and ("unreachable" in failure or "cannot reach" in failure)
            )

        await _until(sync_retrying, OUTAGE_S - 5)
        # reads fail too: the reconcile says so and does nothing
        await _until(
            lambda: _reconcile_says(reconcile, "in a row, next try in"),
            OUTAGE_S - 5,
        )
        assert gcs_proxy.refused > 0
        # the outage lasts its 30 s of wall time (an outage of a real process)
        await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))
        state = await resize.query(PodResizeWorkflow.state)
        assert state.phase == ResizePhase.SYNCING_RAYLET  # still waiting for Ray
        assert state.outcome == ResizeOutcome.PENDING
        with RayGcsClient(gcs) as ray:  # the real GCS, not through the proxy
            node = next(n for n in ray.cluster_state().nodes if n.pod == pod)
        assert node.total.cpu == 1000  # not synced: nobody could reach it
        assert driver.poll() is None  # the 2-CPU task still waits
        assert scale_of(stack, "outage") == scale_before  # no scale-in, no scale-out
        assert [p.metadata.name for p in stack.workers("outage")] == [pod]  # no pod deleted
        gcs_proxy.restore()

        # Ray is back: the next retry syncs the Raylet (backoff may hold it ~16 s more)
        result = await asyncio.wait_for(resize.result(), 60)
        out, err = await asyncio.to_thread(driver.communicate, timeout=60)
    finally:
        stop_driver(driver)
    assert driver.returncode == 0, err[-2000:]
    assert out.startswith("ran with 2 CPU")
    assert result.outcome == ResizeOutcome.SUCCEEDED
    assert (result.cpu, result.raylet_cpu) == (2000, 2000)
    with RayGcsClient(gcs) as ray:
        node = next(n for n in ray.cluster_state().nodes if n.pod == pod)
    assert node.total.cpu == 2000 == result.cpu  # the Raylet's total is the pod's limit
    assert cpu_limit(stack, pod) == "2"
    assert scale_of(stack, "outage") == scale_before
    assert [p.metadata.name for p in stack.workers("outage")] == [pod]
    runs = [wf async for wf in stack.temporal.list_workflows(f"WorkflowId='{wf_id}'")]
    assert len(runs) == 1


async def _reconcile_says(reconcile: WorkflowHandle[Any, Any], text: str) -> bool:
    status = await reconcile.query(ReconcileWorkflow.status)
    return text in status.last_error


async def _until(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < end, f"not reached in {timeout}s"
        await asyncio.sleep(0.2)
