"""Resizes that meet a full node, a flaky API server or a deleted pod still end where they
should."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from raysize.sandbox.faults import FaultRule
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.workflows.contracts import ResizeOutcome, ResizePhase
from raysize.workflows.resize_workflow import PodResizeWorkflow

from .conftest import GIB, Stack, eventually, ippr_cluster, stop_driver
from .test_seed_cases import cpu_of, resize_of, run_driver


@pytest.mark.parametrize("nodes", [[NodeSpec("small-node", 2500, 16 * GIB)]])
async def test_a_grow_asks_for_what_its_node_has_room_for_not_more(stack: Stack) -> None:
    # a 2.5-CPU task: right-sizing would ask for 3 CPUs, which the 2.5-CPU node can never
    # give (the kubelet said Infeasible and the saga asked again at 2.5, issue #44 before);
    # the node's room is read, and the one attempt asks for 2.5 CPU
    stack.create(ippr_cluster("tight"))
    gcs = await stack.gcs_address("tight")
    pod = (await stack.running_workers("tight"))[0].metadata.name
    out = await run_driver(stack, "tight", gcs, "2.5")
    assert out[0].startswith("ran with 2.5 CPU")
    state = await resize_of(stack, pod)
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert [a.result for a in state.attempts] == ["done"]
    assert (state.cpu, state.raylet_cpu) == (2500, 2500)
    assert cpu_of(stack.workers("tight")[0]) == "2500m"


async def test_ten_percent_api_faults_lose_nothing(any_stack: Stack) -> None:
    """In the real world the faults are injected between the raysize worker and the real
    API server (the sandbox's fault proxy), in the embedded world by the server itself."""
    stack = any_stack
    flaky = stack.unique("flaky")
    stack.create(ippr_cluster(flaky))
    gcs = await stack.gcs_address(flaky)
    pod = (await stack.running_workers(flaky))[0].metadata.name
    # the saga makes few calls (a watch, not polling), so 10 % alone may miss it: its first
    # resize patch and first status write certainly fail, then every call fails at 10 %
    sure = [
        stack.sandbox.faults.add(
            FaultRule(verb="patch", resource=r, error_rate=1.0, times=1, codes=(c,))
        )
        for r, c in (("pods/resize", 500), ("pods", 409))
    ]
    stack.sandbox.faults.add(FaultRule(error_rate=0.1, codes=(409, 429, 500)))
    try:
        out = await run_driver(stack, flaky, gcs, "2")
    finally:
        stack.sandbox.faults.clear()
    assert out[0].startswith("ran with 2 CPU")
    assert [r.injected for r in sure] == [1, 1]  # the faults did happen (and maybe more)
    state = await resize_of(stack, pod)
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert state.raylet_cpu == 2000 and cpu_of(stack.workers(flaky)[0]) == "2"
    failed = [
        wf
        async for wf in stack.temporal.list_workflows(
            "ExecutionStatus='Failed' OR ExecutionStatus='TimedOut'"
        )
    ]
    assert failed == []
    reconcile = await stack.temporal.get_workflow_handle(f"reconcile/default/{flaky}").describe()
    assert reconcile.status == WorkflowExecutionStatus.RUNNING


async def test_idle_grown_pod_shrinks_back_raylet_first_then_goes(any_stack: Stack) -> None:
    stack = any_stack
    idle = stack.unique("idle")
    stack.create(ippr_cluster(idle, idle_timeout_s=3))
    gcs = await stack.gcs_address(idle)
    await stack.raylet_joined(idle)  # it may be removed at once: idle for 3 s
    out = await run_driver(stack, idle, gcs, "2")
    assert out[0].startswith("ran with 2 CPU")
    # the pod that grew for the task: the first worker, unless it sat idle for 3 s before
    # the task came (a slow driver on a loaded machine) and was removed, and the task
    # went to a new pod
    pod = await grown_pod(stack, idle)

    async def shrunk() -> bool:
        state = await resize_of(stack, pod)
        return state.from_cpu == 2000 and state.outcome == ResizeOutcome.SUCCEEDED

    end = asyncio.get_running_loop().time() + 90
    while not await shrunk():
        assert asyncio.get_running_loop().time() < end, "the idle pod was not shrunk back"
        await asyncio.sleep(0.5)
    state = await resize_of(stack, pod)
    assert (state.cpu, state.raylet_cpu) == (1000, 1000)  # back to its template size
    # then, still idle at its template size, it is removed (min_workers is 0)
    await eventually(lambda: pod not in {p.metadata.name for p in stack.workers(idle)}, 90)


async def grown_pod(stack: Stack, cluster: str) -> str:
    """The pod of the cluster's first resize (from the resize workflows' index)."""
    query = f"RayCluster='{cluster}' AND WorkflowType='PodResizeWorkflow'"
    end = asyncio.get_running_loop().time() + 30
    while True:
        runs = [wf async for wf in stack.temporal.list_workflows(query)]
        if runs:
            first = min(runs, key=lambda wf: wf.start_time)
            return first.id.rsplit("/", 1)[1]
        assert asyncio.get_running_loop().time() < end, f"no resize of {cluster} indexed"
        await asyncio.sleep(0.2)


async def _phase(stack: Stack, wf_id: str) -> ResizePhase | None:
    try:
        state = await stack.temporal.get_workflow_handle_for(PodResizeWorkflow.run, wf_id).query(
            PodResizeWorkflow.state
        )
    except RPCError:
        return None  # not started yet
    return state.phase


# the kubelet takes 4 s to actuate: the resize is in Polling long enough to delete the pod
@pytest.mark.parametrize("kubelet_timing", [KubeletTiming(actuation_delay_s=4.0)])
async def test_pod_deleted_mid_resize_ends_cleanly_and_its_replacement_grows(
    any_stack: Stack,
) -> None:
    stack = any_stack
    gone = stack.unique("gone")
    stack.create(ippr_cluster(gone))
    gcs = await stack.gcs_address(gone)
    pod = (await stack.running_workers(gone))[0].metadata.name
    wf_id = f"resize/default/{pod}"
    driver = stack.driver(gone, gcs, "2", timeout_s=150)
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while await _phase(stack, wf_id) != ResizePhase.POLLING:
            assert asyncio.get_running_loop().time() < deadline, "the resize never polled"
            await asyncio.sleep(0.1)
        stack.core.delete_namespaced_pod(pod, "default")

        first = stack.temporal.get_workflow_handle_for(PodResizeWorkflow.run, wf_id)
        state = await asyncio.wait_for(first.result(), 60)
        assert state.outcome == ResizeOutcome.POD_GONE  # a clean end, not a failure
        assert (await first.describe()).status == WorkflowExecutionStatus.COMPLETED

        # KubeRay puts a new pod in its place; raysize grows that one and the task runs
        out, err = await asyncio.to_thread(driver.communicate, timeout=170)
    finally:
        stop_driver(driver)
    assert driver.returncode == 0, err[-2000:]
    assert any(line.startswith("ran with 2 CPU") for line in out.splitlines()), out
    (replacement,) = stack.workers(gone)
    new = replacement.metadata.name
    assert new != pod
    assert cpu_of(replacement) == "2"
    second = await resize_of(stack, new)
    assert second.outcome == ResizeOutcome.SUCCEEDED
    assert (second.cpu, second.raylet_cpu) == (2000, 2000)
    group = stack.raycluster(gone)["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 1
    assert not (group.get("scaleStrategy") or {}).get("workersToDelete")
    failed = [
        wf
        async for wf in stack.temporal.list_workflows(
            f"RayCluster='{gone}' AND (ExecutionStatus='Failed' OR ExecutionStatus='TimedOut')"
        )
    ]
    assert failed == []
    runs = [wf async for wf in stack.temporal.list_workflows(f"WorkflowId='{wf_id}'")]
    assert [r.status for r in runs] == [WorkflowExecutionStatus.COMPLETED]


async def test_a_crashed_raylet_is_restarted_and_its_pod_still_grows(any_stack: Stack) -> None:
    """The Ray process of a worker pod dies (a crash, the OOM killer): the kubelet reports
    the container's exit (137) and restarts it in the same pod (restartPolicy Always); the
    new Raylet joins, and raysize grows that pod for a 2-CPU task."""
    stack = any_stack
    # its own name: crash safety's "crash" reconcile is still RUNNING on the shared dev
    # server (its worker was killed), and discovery leaves a running reconcile alone
    name = stack.unique("raylet-crash")
    stack.create(ippr_cluster(name))
    gcs = await stack.gcs_address(name)
    (worker,) = await stack.running_workers(name)
    await stack.crash(worker)

    def restarted() -> object:
        pod = stack.core.read_namespaced_pod(worker.metadata.name, "default")
        cs = pod.status.container_statuses[0]
        return cs if cs.restart_count == 1 and cs.state.running else None

    cs = await eventually(restarted, 60)
    assert (cs.last_state.terminated.exit_code, cs.last_state.terminated.reason) == (137, "Error")
    out = await run_driver(stack, name, gcs, "2")
    assert out[0].startswith("ran with 2 CPU")
    (pod,) = stack.workers(name)
    assert pod.metadata.name == worker.metadata.name and cpu_of(pod) == "2"
    assert pod.status.container_statuses[0].restart_count == 1
