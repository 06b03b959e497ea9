"""An operator's controls on a live cluster, in both worlds: pause a cluster's reconcile,
cancel a resize in flight (it rolls back: the pod's spec, the kubelet's actual size and
the Raylet all back where they were; that pod is not grown again), and resume."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from raysize.sandbox.kubelet import KubeletTiming
from raysize.worker import cli_ops
from raysize.worker.cli import app
from raysize.workflows.contracts import ReconcileInput, ResizeOutcome, ResizePhase
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

from .conftest import Stack, eventually, ippr_cluster, raylet_total_reaches, stop_driver
from .test_seed_cases import cpu_of

# the kubelet takes 4 s to actuate: the saga is in flight long enough to cancel it
# slower than an apply takes to hear of a cancel (its first heartbeat, at 5 s): the
# cancel comes while the kubelet works, not after the resize took (then it stands)
SLOW = KubeletTiming(actuation_delay_s=10.0)


async def _until(check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    end = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < end, f"not reached in {timeout}s"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("kubelet_timing", [SLOW])
async def test_pause_then_cancel_rolls_back_and_resume_grows_again(any_stack: Stack) -> None:
    s = any_stack
    name = s.unique("controls")
    s.create(ippr_cluster(name))
    gcs = await s.gcs_address(name)
    (worker,) = await s.running_workers(name)
    pod = worker.metadata.name
    reconcile = s.temporal.get_workflow_handle_for(
        ReconcileWorkflow.run, reconcile_workflow_id(s.namespace, name)
    )
    resize = s.temporal.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/default/{pod}")

    async def polling() -> bool:
        try:
            return (await resize.query(PodResizeWorkflow.state)).phase == ResizePhase.POLLING
        except RPCError:
            return False  # not started yet

    driver = s.driver(name, gcs, "2", timeout_s=240)
    try:
        await _until(polling, 90)
        # pause first, so no new resize starts once this one is cancelled
        await reconcile.signal(ReconcileWorkflow.pause)
        assert (await reconcile.query(ReconcileWorkflow.status)).paused
        await resize.cancel()
        with pytest.raises(WorkflowFailureError):
            await resize.result()
        state = await resize.query(PodResizeWorkflow.state)
        assert state.outcome == ResizeOutcome.CANCELED

        def rolled_back() -> bool:
            p = s.core.read_namespaced_pod(pod, "default")
            actual = p.status.container_statuses[0].resources.limits["cpu"]
            return bool(cpu_of(p) == "1" and actual == "1")

        await eventually(rolled_back, 60)

        await raylet_total_reaches(gcs, pod, 1000)
        # paused: three ticks go by and nothing starts again, the task still waits
        await asyncio.sleep(6)
        runs = [wf async for wf in s.temporal.list_workflows(f"WorkflowId='{resize.id}'")]
        assert len(runs) == 1 and driver.poll() is None
        await reconcile.signal(ReconcileWorkflow.resume)
        out, err = await asyncio.to_thread(driver.communicate, timeout=240)
    finally:
        stop_driver(driver)
    assert any(line.startswith("ran with 2 CPU") for line in out.splitlines()), err[-2000:]
    # the operator's cancel stands: that pod is not grown again (its failure record blocks
    # growing it), so the task's room came from a new pod that grew
    runs = [wf async for wf in s.temporal.list_workflows(f"WorkflowId='{resize.id}'")]
    assert len(runs) == 1
    workers = {p.metadata.name: cpu_of(p) for p in s.workers(name)}
    assert workers.pop(pod) == "1"
    assert list(workers.values()) == ["2"]


async def test_status_with_no_worker_polling_says_so_instead_of_hanging(
    dev_server: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query is answered by a worker: with none polling the cluster's task queue,
    `raysize status` used to hang for more than 30 s. It gives up in a bounded time and
    says why."""
    queue = f"nobody-{uuid.uuid4().hex[:6]}"
    await dev_server.client.start_workflow(
        "ReconcileWorkflow",
        ReconcileInput(namespace="default", cluster="orphan"),
        id=reconcile_workflow_id("default", f"orphan-{queue}"),
        task_queue=queue,
    )
    monkeypatch.setattr(cli_ops, "QUERY_TIMEOUT", timedelta(seconds=2))
    env = {
        "RAYSIZE_TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "RAYSIZE_TASK_QUEUE": queue,
    }
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["status", f"default/orphan-{queue}"], env=env
    )
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: no answer in 2s: a query is answered by a raysize worker, and none is "
        f"polling task queue '{queue}' (start `raysize worker`, or set RAYSIZE_TASK_QUEUE "
        "to the worker's queue)"
    )
