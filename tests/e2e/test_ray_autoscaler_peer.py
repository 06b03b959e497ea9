"""Ray's own autoscaler as a peer, in the real world: Ray 2.60's unmodified KubeRay
autoscaler (v2, with `ray.io/ippr`) runs where KubeRay puts it, as the `autoscaler`
sidecar of the head pod, with the head's ServiceAccount token and the API server reached
through the `kubernetes` Service's address, as in a cluster. It resizes a pod in place
and scales an idle one in. The cluster is then handed to raysize
(`enableInTreeAutoscaling: false`), which carries on from the `ray.io/ippr-status` Ray
left, and back to Ray, which carries on from raysize's.

While `enableInTreeAutoscaling` is true raysize stands by (two autoscalers would undo
each other's work). KubeRay does not restart a running head when the flag changes, so
Ray's autoscaler keeps running in its sidecar: raysize sees that and stands by (a
`RayAutoscalerRunning` warning) until the sidecar is stopped (it ends, and with autoscaler
v2's `restartPolicy: Never` it stays ended); it is started again by `kubectl exec` into its
container for the way back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Any

from kubernetes import client

from raysize.workflows.contracts import ResizeOutcome
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow

from .conftest import (
    Stack,
    eventually,
    ippr_cluster,
    stop_driver,
)
from .test_seed_cases import cpu_of, resize_of, run_driver

# the sidecar's own command line (KubeRay's BuildAutoscalerContainer), in a shell
AUTOSCALER = (
    'ray kuberay-autoscaler --cluster-name "$RAY_CLUSTER_NAME" '
    '--cluster-namespace "$RAY_CLUSTER_NAMESPACE"'
)


def peer_cluster(name: str) -> dict[str, Any]:
    """Two 1-CPU workers that may grow to 4 (at least one kept), Ray's autoscaler v2 on."""
    rc = ippr_cluster(name, replicas=2, max_replicas=2, idle_timeout_s=10)
    rc["spec"]["enableInTreeAutoscaling"] = True
    rc["spec"]["autoscalerOptions"]["version"] = "v2"
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = 1
    return rc


def head_of(s: Stack, name: str) -> client.V1Pod:
    (head,) = s.core.list_namespaced_pod(
        s.namespace, label_selector=f"ray.io/cluster={name},ray.io/node-type=head"
    ).items
    return head


def container_status(pod: client.V1Pod, name: str) -> client.V1ContainerStatus:
    return next(cs for cs in pod.status.container_statuses if cs.name == name)


def set_in_tree(s: Stack, name: str, on: bool) -> None:
    s.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        s.namespace,
        "rayclusters",
        name,
        {"spec": {"enableInTreeAutoscaling": on}},
    )


async def stood_down(s: Stack, name: str) -> bool:
    handle = s.temporal.get_workflow_handle_for(
        ReconcileWorkflow.run, reconcile_workflow_id(s.namespace, name)
    )
    return (await handle.query(ReconcileWorkflow.status)).stood_down


async def test_rays_autoscaler_resizes_and_scales_in_then_hands_over_both_ways(
    real_stack: Stack,
) -> None:
    s = real_stack
    name = "peer-real"
    s.create(peer_cluster(name))
    gcs = await s.gcs_address(name)
    await eventually(lambda: len([p for p in s.workers(name) if p.status.phase == "Running"]) == 2)
    head = head_of(s, name)
    assert head.spec.service_account_name == name  # KubeRay's account for its autoscaler
    assert container_status(head, "autoscaler").state.running is not None
    assert s.sandbox.runtime is not None
    runtime = s.sandbox.runtime

    # --- Ray's autoscaler: a 2-CPU task grows a 1-CPU worker in place (to its maximum,
    # as Ray does), and the other, idle worker is scaled in (minReplicas 1 keeps one)
    driver = s.driver(name, gcs, "2", timeout_s=300, hold_s=60)
    try:

        def grown() -> list[client.V1Pod]:
            # Ray patches pods/resize, then writes ray.io/ippr-status at the end of its
            # reconciliation: grown is both
            return [
                p
                for p in s.workers(name)
                if cpu_of(p) == "4" and "ray.io/ippr-status" in (p.metadata.annotations or {})
            ]

        (big,) = await eventually(grown, 120)
        # the other worker goes: replicas 1 and its pod deleted by KubeRay
        await eventually(
            lambda: [p.metadata.name for p in s.workers(name)] == [big.metadata.name], 120
        )
        group = s.raycluster(name)["spec"]["workerGroupSpecs"][0]
        assert group["replicas"] == 1
        out, err = await asyncio.to_thread(driver.communicate, timeout=320)
    finally:
        stop_driver(driver)
    assert any(line.startswith("ran with 2 CPU") for line in out.splitlines()), err[-3000:]
    assert (await stood_down(s, name)) is True  # raysize only watched
    runs = [wf async for wf in s.temporal.list_workflows(f"RayCluster='{name}'")]
    assert [r.workflow_type for r in runs] == ["ReconcileWorkflow"]

    # --- to raysize: the flag goes off, but KubeRay leaves the head (and Ray's autoscaler
    # in it) running: raysize keeps standing by and says why, until the sidecar stops
    set_in_tree(s, name, False)
    handle = s.temporal.get_workflow_handle_for(
        ReconcileWorkflow.run, reconcile_workflow_id(s.namespace, name)
    )

    async def waits_for_sidecar() -> bool:
        status = await handle.query(ReconcileWorkflow.status)
        return status.stood_down and status.ray_autoscaler_pod == head.metadata.name

    await eventually_async(waits_for_sidecar, 60)
    warned = await eventually(
        lambda: [
            e
            for e in s.core.list_namespaced_event(
                s.namespace, field_selector=f"involvedObject.name={name}"
            ).items
            if e.reason == "RayAutoscalerRunning"
        ]
    )
    assert warned[0].type == "Warning" and head.metadata.name in warned[0].message
    # then the sidecar stops; raysize takes the 4-CPU pod Ray grew, shrinks it back once
    # idle, and grows it for a 2-CPU task
    runtime.kill(s.namespace, head.metadata.name, "autoscaler", signal.SIGTERM)
    await eventually(
        lambda: container_status(head_of(s, name), "autoscaler").state.terminated is not None
    )

    async def shrunk_by_raysize() -> bool:
        with contextlib.suppress(Exception):
            state = await resize_of(s, big.metadata.name)
            return state.from_cpu == 4000 and state.outcome == ResizeOutcome.SUCCEEDED
        return False

    end = asyncio.get_running_loop().time() + 120
    while not await shrunk_by_raysize():
        assert asyncio.get_running_loop().time() < end, "raysize did not take the pod over"
        await asyncio.sleep(1)
    assert (await stood_down(s, name)) is False
    assert cpu_of(s.workers(name)[0]) == "1"
    out_lines = await run_driver(s, name, gcs, "2")
    assert out_lines[0].startswith("ran with 2 CPU")
    (pod,) = s.workers(name)
    assert pod.metadata.name == big.metadata.name and cpu_of(pod) == "2"
    status = json.loads(pod.metadata.annotations["ray.io/ippr-status"])
    assert status  # raysize's record, which Ray reads next

    # --- back to Ray: the flag on (raysize stands by), Ray's autoscaler started again in
    # its container; it grows the pod raysize left at 2 CPU for a 4-CPU task
    set_in_tree(s, name, True)
    await eventually_async(lambda: stood_down(s, name), 60)
    autoscaler = runtime.exec(
        s.namespace,
        head.metadata.name,
        ["bash", "-c", "--", AUTOSCALER],
        container="autoscaler",
    )
    try:
        out_lines = await run_driver(s, name, gcs, "4")
        assert out_lines[0].startswith("ran with 4 CPU")
        (pod,) = s.workers(name)
        assert pod.metadata.name == big.metadata.name and cpu_of(pod) == "4"
        last = await resize_of(s, big.metadata.name)
        assert last.cpu == 2000  # raysize's last resize: the 2 → 4 CPU was Ray's
    finally:
        stop_driver(autoscaler)


async def eventually_async(check: Any, timeout: float) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < end, "not reached"
        await asyncio.sleep(0.5)
