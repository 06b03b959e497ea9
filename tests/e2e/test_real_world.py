"""What only the real world shows: kube-apiserver v1.36 with RBAC, the real KubeRay operator,
Ray 2.60 started by KubeRay's own `ray start` in each pod's network namespace, and a
raysize worker running with the token of the ServiceAccount from deploy/base. (The seed
cases run in both worlds: test_seed_cases.py.)"""

from __future__ import annotations

import asyncio

from raysize.workflows.contracts import ResizeOutcome
from raysize.workflows.resize_workflow import PodResizeWorkflow
from tests.deploy.conftest import run_kubectl

from .conftest import (
    Stack,
    ippr_cluster,
    stop_driver,
)


async def test_kuberays_ray_start_runs_and_the_pod_grows_in_place_with_kubelet_events(
    real_stack: Stack,
) -> None:
    """KubeRay's head runs `ray start --num-cpus=0` from its rayStartParams (no task lands
    on it), the worker pod keeps its container (no restart) while raysize grows it, and
    `kubectl describe pod` shows the kubelet's resize events."""
    s = real_stack
    name = s.unique("demo")  # the embedded tests' "demo" may still have a reconcile running
    s.create(ippr_cluster(name, replicas=1))
    gcs = await s.gcs_address(name)
    (worker,) = await s.running_workers(name)
    driver = s.driver(name, gcs, "2", timeout_s=150)
    try:
        out, err = await asyncio.to_thread(driver.communicate, timeout=170)
    finally:
        stop_driver(driver)
    # the task's line (Ray may print its own first, e.g. the raylet's infeasible warning)
    assert any(line.startswith("ran with 2 CPU") for line in out.splitlines()), err[-3000:]
    pod = s.core.read_namespaced_pod(worker.metadata.name, "default")  # the same pod, grown
    assert pod.spec.containers[0].resources.limits["cpu"] == "2"
    assert pod.status.container_statuses[0].restart_count == 0
    handle = s.temporal.get_workflow_handle_for(
        PodResizeWorkflow.run, f"resize/default/{worker.metadata.name}"
    )
    assert (await handle.result()).outcome == ResizeOutcome.SUCCEEDED
    described = run_kubectl("describe", "pod", worker.metadata.name, kubeconfig=s.kubeconfig)
    assert "ResizeStarted" in described.stdout and "ResizeCompleted" in described.stdout
