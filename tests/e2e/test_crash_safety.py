"""Crash safety: the worker process is SIGKILLed mid-resize (after the pod patch, before
the Raylet sync) and a new worker process finishes the resize exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from kubernetes import config
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from activities.ray_gcs import RayGcsClient
from sandbox.cluster import Sandbox, SandboxConfig
from sandbox.kubelet import KubeletTiming, NodeSpec
from workflows.contracts import ResizeOutcome
from workflows.resize_workflow import PodResizeWorkflow

from .conftest import GIB, Stack, eventually, ippr_cluster, start_driver, stop_driver


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest_asyncio.fixture
async def slow_stack(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    # the kubelet takes 4 s to actuate: a window to kill the worker in
    sandbox = Sandbox(
        SandboxConfig(
            node_specs=[NodeSpec("node-a", 8000, 32 * GIB)],
            with_ray=True,
            timing=KubeletTiming(actuation_delay_s=4.0),
        )
    ).start()
    try:
        kubeconfig = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "RAYSIZE_TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "RAYSIZE_TASK_QUEUE": f"raysize-{uuid.uuid4().hex[:8]}",
            "RAYSIZE_KUBECONFIG": str(kubeconfig),
            "RAYSIZE_NAMESPACES": "default",
            "RAYSIZE_TICK_S": "2",
            "RAYSIZE_DISCOVERY_INTERVAL_S": "1",
            "RAYSIZE_RESIZE_POLL_INTERVAL_S": "0.05",
        }
        yield (
            Stack(sandbox=sandbox, api=api, temporal=dev_server.client, kubeconfig=kubeconfig),
            env,
        )
    finally:
        await asyncio.to_thread(sandbox.close)


async def test_worker_killed_between_pod_patch_and_raylet_sync(
    slow_stack: tuple[Stack, dict[str, str]], tmp_path: Path
) -> None:
    stack, env = slow_stack
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    driver = None
    try:
        stack.create(ippr_cluster("crash"))
        gcs = await eventually(lambda: stack.gcs("crash"), 60)
        pod = (
            await eventually(
                lambda: [p for p in stack.workers("crash") if p.status.phase == "Running"], 60
            )
        )[0].metadata.name
        driver = start_driver(gcs, "2", timeout_s=150)
        # the resize patch has landed (spec says 2 CPUs) and the kubelet is still actuating
        await eventually(
            lambda: (
                stack.core.read_namespaced_pod(pod, "default")
                .spec.containers[0]
                .resources.limits["cpu"]
                == "2"
            ),
            90,
        )
        kill(worker)  # SIGKILL: no cleanup, no goodbye
        worker = start_worker(env, log)
        out, err = await asyncio.to_thread(driver.communicate, timeout=170)
        assert driver.returncode == 0, err[-2000:]
        assert out.startswith("ran with 2 CPU")
    finally:
        if driver is not None:
            stop_driver(driver)
        kill(worker)
    runs = [
        wf
        async for wf in stack.temporal.list_workflows(
            f"WorkflowId='resize/default/{pod}'", limit=10
        )
    ]
    assert len(runs) == 1  # finished by the second worker, exactly once
    assert runs[0].status == WorkflowExecutionStatus.COMPLETED
    state = await stack.temporal.get_workflow_handle_for(
        PodResizeWorkflow.run, f"resize/default/{pod}"
    ).result()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    with RayGcsClient(gcs) as ray:
        node = next(n for n in ray.cluster_state().nodes if n.pod == pod)
    # the Raylet's totals equal the pod's size
    assert node.total.cpu == 2000
    final = stack.core.read_namespaced_pod(pod, "default")
    assert final.spec.containers[0].resources.limits["cpu"] == "2"
    assert 'resizing-at": null' in final.metadata.annotations["ray.io/ippr-status"]
