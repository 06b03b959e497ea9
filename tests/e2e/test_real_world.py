"""The product on the real world: kube-apiserver v1.36 with RBAC, the real KubeRay operator,
Ray 2.60 started by KubeRay's own `ray start` in each pod's network namespace, and a
raysize worker that runs with the token of the ServiceAccount from deploy/base."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from kubernetes import config
from temporalio.testing import WorkflowEnvironment

from sandbox.cluster import SandboxConfig
from sandbox.kubelet import KubeletTiming, NodeSpec
from sandbox.realworld import RealSandbox
from tests.deploy.conftest import DEPLOY, run_kubectl
from tests.e2e.conftest import DRIVER, GIB, Stack, eventually, ippr_cluster
from worker.run import run_worker
from worker.settings import Settings
from workflows.contracts import ResizeOutcome
from workflows.resize_workflow import PodResizeWorkflow


@pytest_asyncio.fixture
async def real_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """deploy/ applied as admin; the worker runs in-process with the raysize
    ServiceAccount's token, so the real server enforces deploy/base's RBAC on it."""
    sb = RealSandbox(
        SandboxConfig(
            node_specs=[NodeSpec("node-a", 8000, 32 * GIB)],
            with_ray=True,
            timing=KubeletTiming(actuation_delay_s=0.0),
        )
    )
    await asyncio.to_thread(sb.start)
    stop = asyncio.Event()
    worker: asyncio.Task[None] | None = None
    try:
        admin = sb.write_kubeconfig(tmp_path / "admin")
        applied = run_kubectl("apply", "-k", str(DEPLOY), kubeconfig=admin)
        assert applied.returncode == 0, applied.stderr
        as_worker = sb.control_plane.service_account_kubeconfig(
            tmp_path / "worker", "raysize", "raysize"
        )
        settings = Settings(
            temporal_address=dev_server.client.service_client.config.target_host,
            task_queue=f"raysize-{uuid.uuid4().hex[:8]}",
            kubeconfig=as_worker,
            namespaces="default",
            tick_s=2.0,
            discovery_interval_s=1.0,
        )
        worker = asyncio.create_task(run_worker(settings, stop=stop))
        api = config.new_client_from_config(config_file=str(admin))
        yield Stack(sandbox=sb, api=api, temporal=dev_server.client, kubeconfig=admin)  # type: ignore[arg-type]
    finally:
        stop.set()
        if worker is not None:
            try:
                await asyncio.wait_for(worker, 30)
            except Exception:
                worker.cancel()
        await asyncio.to_thread(sb.close)


def driver_in_head(sb: RealSandbox, head: str, gcs: str, cpus: str) -> subprocess.Popen[str]:
    """A Ray driver in the head pod's network namespace (what `kubectl exec` into the head
    would run): it joins the cluster on the head's node and waits for its tasks."""
    assert sb.runtime is not None
    return sb.runtime.exec(
        "default",
        head,
        ["python", "-c", DRIVER, gcs, cpus, "120", "0"],
        env={"RAY_USAGE_STATS_ENABLED": "0", "GRPC_DNS_RESOLVER": "native"},
    )


async def test_a_2_cpu_task_runs_after_raysize_grows_the_1_cpu_worker_in_place(real_stack):
    s = real_stack
    sb: RealSandbox = s.sandbox  # type: ignore[assignment]
    s.create(ippr_cluster("demo", replicas=1))
    gcs = await s.gcs_address("demo")
    (worker,) = await s.running_workers("demo")
    head = await eventually(
        lambda: [
            p.metadata.name
            for p in s.core.list_namespaced_pod(
                "default", label_selector="ray.io/cluster=demo,ray.io/node-type=head"
            ).items
            if p.status.phase == "Running"
        ]
    )
    driver = driver_in_head(sb, head[0], gcs, "2")
    try:
        out, err = await asyncio.to_thread(driver.communicate, timeout=150)
    finally:
        if driver.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
    assert "ran with 2 CPU" in out, err[-3000:]
    pod = s.core.read_namespaced_pod(worker.metadata.name, "default")  # the same pod, grown
    assert pod.spec.containers[0].resources.limits["cpu"] == "2"
    assert pod.status.container_statuses[0].restart_count == 0
    handle = s.temporal.get_workflow_handle_for(
        PodResizeWorkflow.run, f"resize/default/{worker.metadata.name}"
    )
    state = await handle.result()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    described = run_kubectl("describe", "pod", worker.metadata.name, kubeconfig=s.kubeconfig)
    assert "ResizeCompleted" in described.stdout, described.stdout[-2000:]
