"""The seed pull request's four example cases, end to end with real Ray and Temporal, in
both worlds: the embedded sandbox, and kube-apiserver v1.36 + KubeRay with the worker's
ServiceAccount token (RBAC enforced) and Ray started by KubeRay in the pods' namespaces."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.service import RPCError

from raysize.sandbox.kubelet import NodeSpec
from raysize.workflows.contracts import ResizeOutcome, ResizeSagaState
from raysize.workflows.resize_workflow import PodResizeWorkflow

from .conftest import GIB, Stack, ippr_cluster, stop_driver


def cpu_of(pod: object) -> str:
    return pod.spec.containers[0].resources.limits["cpu"]  # type: ignore[attr-defined]


async def run_driver(
    stack: Stack, cluster: str, gcs: str, cpus: str, hold_s: float = 0
) -> list[str]:
    driver = stack.driver(cluster, gcs, cpus, timeout_s=150, hold_s=hold_s)
    try:
        out, err = await asyncio.to_thread(driver.communicate, timeout=170)
    finally:
        stop_driver(driver)
    assert driver.returncode == 0, err[-2000:]
    # the tasks' lines (Ray may print its own, e.g. the raylet's infeasible-task warning)
    return [line for line in out.splitlines() if line.startswith(("ran with", "group ready"))]


async def resize_of(stack: Stack, pod: str) -> ResizeSagaState:
    handle = stack.temporal.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/default/{pod}")
    return await handle.result()


async def test_case_1_a_pending_two_cpu_task_runs_after_its_pod_grows(any_stack: Stack) -> None:
    stack = any_stack
    case1 = stack.unique("case1")
    stack.create(ippr_cluster(case1))
    gcs = await stack.gcs_address(case1)
    pods = await stack.running_workers(case1)
    out = await run_driver(stack, case1, gcs, "2")
    assert out[0].startswith("ran with 2 CPU")
    pod = stack.workers(case1)[0]
    assert pod.metadata.name == pods[0].metadata.name  # resized in place, not replaced
    assert cpu_of(pod) == "2"  # right-sized: what the task needs, not the maximum
    handle = stack.temporal.get_workflow_handle_for(
        PodResizeWorkflow.run, f"resize/default/{pod.metadata.name}"
    )
    state = await handle.result()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (state.raylet_cpu, state.cpu) == (2000, 2000)


async def test_case_2_resizing_an_existing_worker_and_scaling_out_a_new_worker(
    any_stack: Stack,
) -> None:
    stack = any_stack
    case2 = stack.unique("case2")
    stack.create(ippr_cluster(case2))
    gcs = await stack.gcs_address(case2)
    first = await stack.running_workers(case2)
    out = await run_driver(stack, case2, gcs, "2,4", hold_s=3)
    assert sorted(line.split(" on ")[0] for line in out) == ["ran with 2 CPU", "ran with 4 CPU"]
    pods = {p.metadata.name: cpu_of(p) for p in stack.workers(case2)}
    assert len(pods) == 2  # one grown in place, one launched (and grown)
    assert first[0].metadata.name in pods  # the pod it had was grown, not replaced
    # Each pod grows to what its task needs, but Ray, not raysize, decides which pod runs
    # which task. When the two resizes land together Ray may start the 2-CPU task on the
    # pod grown to 4; the other pod, grown to 2, is then grown again for the 4-CPU task
    # (seen in CI). On a loaded machine the new pod may come up only after the 2-CPU task
    # has ended; the pod it ran on grows to 4 for the 4-CPU task, and the new pod, needed
    # by nothing, stays at its launch size (seen with a load average of 11: 4 and 1).
    # Never past the IPPR maximum of 4.
    new = next(name for name in pods if name != first[0].metadata.name)
    assert sorted(pods.values()) in (["2", "4"], ["4", "4"]) or (
        pods[new] == "1" and pods[first[0].metadata.name] == "4"
    ), pods
    for name, cpu in pods.items():
        if cpu != "1":
            assert (await resize_of(stack, name)).outcome == ResizeOutcome.SUCCEEDED


async def test_case_3_scaling_out_with_ippr_capacity_considerations(any_stack: Stack) -> None:
    stack = any_stack
    case3 = stack.unique("case3")
    stack.create(ippr_cluster(case3, replicas=0))
    gcs = await stack.gcs_address(case3)
    out = await run_driver(stack, case3, gcs, "2")
    assert out[0].startswith("ran with 2 CPU")
    pods = stack.workers(case3)
    assert [cpu_of(p) for p in pods] == ["2"]  # one 1-CPU pod launched, then grown
    assert (await resize_of(stack, pods[0].metadata.name)).outcome == ResizeOutcome.SUCCEEDED
    assert stack.raycluster(case3)["spec"]["workerGroupSpecs"][0]["replicas"] == 1


def prefers(node: str) -> dict[str, Any]:
    """A pod's affinity for the node named `node`, where it fits (preferred, not required)."""
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    preferred = [{"weight": 100, "preference": {"matchExpressions": [term]}}]
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}


@pytest.mark.parametrize(
    "nodes",
    [[NodeSpec("stuck", 1500, 8 * GIB, stalls_actuation=True), NodeSpec("ok", 8000, 32 * GIB)]],
)
async def test_case_4_ippr_timeout_rolls_back_and_scales_out(any_stack: Stack) -> None:
    stack = any_stack
    # the first worker lands on a node whose runtime never applies a resize: its group
    # prefers that node (first fit puts it there in the embedded world; kube-scheduler
    # would score the roomier node higher). The node has room for the grow the 1.5-CPU
    # task needs (1 → 1.5 CPU: 500m left), so it is started (issue #44: a grow its node
    # has no room for never is); once rolled back, a new 1-CPU pod does not fit there
    case4 = stack.unique("case4")
    cluster = ippr_cluster(case4, timeout_s=5)
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["affinity"] = prefers("stuck")
    stack.create(cluster)
    gcs = await stack.gcs_address(case4)
    first = await stack.running_workers(case4)
    stuck = first[0].metadata.name
    out = await run_driver(stack, case4, gcs, "1.5")
    assert out[0].startswith("ran with 1.5 CPU")
    timed_out = await resize_of(stack, stuck)
    assert timed_out.outcome == ResizeOutcome.ROLLED_BACK
    assert timed_out.detail.startswith("Pod resize timed out after 5s")
    pods = {p.metadata.name: p for p in stack.workers(case4)}
    assert cpu_of(pods[stuck]) == "1"  # rolled back
    status = pods[stuck].metadata.annotations["ray.io/ippr-status"]
    assert '"last-failed-reason": "Pod resize timed out after 5s"' in status
    (other,) = [n for n in pods if n != stuck]
    assert cpu_of(pods[other]) == "2"  # scaled out, and the new pod grew (whole cores)
    assert (await resize_of(stack, other)).outcome == ResizeOutcome.SUCCEEDED


@pytest.mark.parametrize(
    "nodes", [[NodeSpec("tight", 1500, 8 * GIB), NodeSpec("roomy", 8000, 32 * GIB)]]
)
async def test_a_grow_its_node_has_no_room_for_is_not_started_a_pod_is_launched(
    any_stack: Stack,
) -> None:
    """Issue #44 item 3: the first worker (1 CPU) runs on a node with 500m left, and a
    {CPU: 2} task waits. Before, raysize grew it anyway: the kubelet deferred the grow
    (no room), the saga asked again at the 1.5 CPU the node allowed, the task still did not
    fit, and a pod was launched after all. Now the grow is not started (the node's room is
    read), and a pod is launched at once, at the 2 CPU its task needs (the launch-size
    admission policy, deploy/components/launch-size): from its first scheduling attempt it
    asks for 2 CPU, so it lands on the roomy node, and only its Raylet (started at the
    template's 1 CPU by KubeRay's `ray start` line) is brought to it."""
    stack = any_stack
    # not "tight": test_resilience's cluster of that name leaves its reconcile workflow
    # running on the shared Temporal server, and discovery then takes it as managed
    name = stack.unique("full-node")
    cluster = ippr_cluster(name)
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["affinity"] = prefers("tight")
    stack.create(cluster)
    gcs = await stack.gcs_address(name)
    (first,) = await stack.running_workers(name)
    assert first.spec.node_name == "tight"
    out = await run_driver(stack, name, gcs, "2")
    assert out[0].startswith("ran with 2 CPU")
    pods = {p.metadata.name: p for p in stack.workers(name)}
    assert cpu_of(pods[first.metadata.name]) == "1"  # never grown
    (other,) = [n for n in pods if n != first.metadata.name]
    assert pods[other].spec.node_name == "roomy" and cpu_of(pods[other]) == "2"
    # launched at 2 CPU: the one saga on it brought its Raylet from 1 CPU, not the pod
    settled = await resize_of(stack, other)
    assert settled.outcome == ResizeOutcome.SUCCEEDED, settled
    assert (settled.from_cpu, settled.cpu, settled.raylet_cpu) == (2000, 2000, 2000), settled
    # no saga was ever started for the pod on the full node
    handle = stack.temporal.get_workflow_handle(f"resize/default/{first.metadata.name}")
    with pytest.raises(RPCError, match="not found"):
        await handle.describe()


async def test_a_group_that_arrives_as_a_grow_finishes_takes_the_room_that_pod_can_reach(
    any_stack: Stack,
) -> None:
    """Issue #13 item 3, measured beside Ray's own autoscaler: one 1-CPU worker that may
    grow to 4, a task of {CPU: 2}, then at once a PACK group of 2 × {CPU: 2}. Ray grows
    the one pod to its maximum and the group is ready with one pod; raysize launched a
    second pod ("1 for gang bundle {CPU: 4}", every run here before the fix): while the
    grow to 2 landed, Ray still reported the task as pending (it publishes demands once a
    second) beside the new group, 6 CPUs for a pod of 4. No pod is launched for demand
    while a grow lands; then the group takes the room the pod can grow into."""
    stack = any_stack
    name = stack.unique("inflight")
    stack.create(ippr_cluster(name, max_replicas=2))
    gcs = await stack.gcs_address(name)
    first = await stack.running_workers(name)
    out = await run_driver(stack, name, gcs, "2;pg:2+2")
    assert out[0].startswith("ran with 2 CPU")
    assert out[1].startswith("group ready")
    assert sorted(line.split(" on ")[0] for line in out[2:]) == ["ran with 2 CPU"] * 2
    pods = stack.workers(name)
    assert [p.metadata.name for p in pods] == [first[0].metadata.name]  # no second pod
    assert cpu_of(pods[0]) == "4"
    assert stack.raycluster(name)["spec"]["workerGroupSpecs"][0]["replicas"] == 1
