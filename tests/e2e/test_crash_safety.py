"""Crash safety: the worker process is SIGKILLed mid-resize (after the pod patch, before
the Raylet sync; while the Raylet sync retries against an unreachable Ray; as soon as the
resize workflow exists) and a new worker process finishes the resize exactly once."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from raysize.sandbox.faults import FaultRule
from raysize.sandbox.kubelet import KubeletTiming
from raysize.workflows.contracts import Act, ResizeOutcome, ResizePhase
from raysize.workflows.naming import RESIZE_PHASE
from raysize.workflows.resize_workflow import PodResizeWorkflow

from .conftest import (
    Stack,
    eventually,
    ippr_cluster,
    kill,
    pending_activity,
    process_world,
    raylet_total_reaches,
    start_worker,
    stop_driver,
)
from .gcs_proxy import GcsProxy


@pytest_asyncio.fixture(params=["embedded", "real"])
async def slow_stack(
    request: pytest.FixtureRequest, dev_server: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    """A world (each in turn, unless a test names one) whose kubelet takes 4 s to actuate:
    a window to kill the worker in. The worker runs as its own process (`raysize worker`)."""
    timing = KubeletTiming(actuation_delay_s=4.0)
    async with process_world(dev_server, tmp_path, str(request.param), timing) as world:
        yield world


async def test_worker_killed_between_pod_patch_and_raylet_sync(
    slow_stack: tuple[Stack, dict[str, str]], tmp_path: Path
) -> None:
    stack, env = slow_stack
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    driver = None
    name = stack.unique("crash")
    try:
        stack.create(ippr_cluster(name))
        gcs = await stack.gcs_address(name)
        pod = (await stack.running_workers(name))[0].metadata.name
        driver = stack.driver(name, gcs, "2", timeout_s=150)
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
        await _task_ran_and_resize_finished_once(stack, driver, gcs, pod)
    finally:
        if driver is not None:
            stop_driver(driver)
        kill(worker)


async def _task_ran_and_resize_finished_once(
    stack: Stack, driver: subprocess.Popen[str], gcs: str, pod: str
) -> None:
    out, err = await asyncio.to_thread(driver.communicate, timeout=170)
    assert driver.returncode == 0, err[-2000:]
    assert any(line.startswith("ran with 2 CPU") for line in out.splitlines()), out
    await assert_finished_once(stack, gcs, pod)  # with the new worker still up


async def assert_finished_once(stack: Stack, gcs: str, pod: str) -> None:
    # the task may run as soon as the Raylet has grown, a moment before the saga ends
    state = await asyncio.wait_for(
        stack.temporal.get_workflow_handle_for(
            PodResizeWorkflow.run, f"resize/default/{pod}"
        ).result(),
        60,
    )
    # the index (visibility) follows the workflow by a moment: read it until it has caught up
    for _ in range(100):
        runs = [
            wf
            async for wf in stack.temporal.list_workflows(
                f"WorkflowId='resize/default/{pod}'", limit=10
            )
        ]
        if all(wf.status != WorkflowExecutionStatus.RUNNING for wf in runs):
            break
        await asyncio.sleep(0.1)
    assert len(runs) == 1  # finished by the second worker, exactly once
    assert runs[0].status == WorkflowExecutionStatus.COMPLETED
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (state.cpu, state.raylet_cpu) == (2000, 2000)
    # the Raylet's totals equal the pod's size (the saga may end within the second the
    # GCS's node table takes to show it: CI read 1 CPU there once)
    await raylet_total_reaches(gcs, pod, 2000)
    final = stack.core.read_namespaced_pod(pod, "default")
    assert final.spec.containers[0].resources.limits["cpu"] == "2"
    assert 'resizing-at": null' in final.metadata.annotations["ray.io/ippr-status"]


def cpu_limit(stack: Stack, pod: str) -> str:
    container = stack.core.read_namespaced_pod(pod, "default").spec.containers[0]
    return str(container.resources.limits["cpu"])


async def _resize_started(stack: Stack, wf_id: str) -> bool:
    try:
        await stack.temporal.get_workflow_handle(wf_id).describe()
    except RPCError:
        return False
    return True


async def _sync_retrying(stack: Stack, wf_id: str) -> bool:
    try:
        desc = await stack.temporal.get_workflow_handle(wf_id).describe()
    except RPCError:
        return False
    phase = desc.typed_search_attributes.get(RESIZE_PHASE)
    attempt, failure = await pending_activity(stack.temporal, wf_id, Act.FINISH_RESIZE)
    return phase == ResizePhase.SYNCING_RAYLET and attempt > 1 and "reach" in failure


@pytest.mark.parametrize(
    ("slow_stack", "kill_at"),
    [
        ("embedded", "syncing_raylet"),
        ("real", "syncing_raylet"),
        # the world's fault injection refuses the patches
        ("embedded", "before_the_patch"),
        ("real", "before_the_patch"),
    ],
    indirect=["slow_stack"],
)
async def test_worker_killed_at_another_point_a_new_worker_finishes_the_resize_once(
    slow_stack: tuple[Stack, dict[str, str]], gcs_proxy: GcsProxy, tmp_path: Path, kill_at: str
) -> None:
    """syncing_raylet: Ray is unreachable (raysize's way to the GCS is cut), so the Raylet
    sync is failing and being retried when the worker dies; Ray comes back, a new worker
    finishes. before_the_patch: the worker dies as soon as the reconcile has started the
    resize workflow and its first pods/resize patch was refused (the API server refuses
    every one until the kill), so nothing has changed on the pod yet."""
    stack, env = slow_stack
    env = {**env, "RAYSIZE_GCS_ADDRESS": gcs_proxy.address}
    log = tmp_path / "worker.log"
    # one name per case: a dead worker's reconcile of a name stays RUNNING on the shared
    # dev server, and discovery leaves a running reconcile alone
    name = stack.unique(
        {"syncing_raylet": "crash-sync", "before_the_patch": "crash-patch"}[kill_at]
    )
    worker = start_worker(env, log)
    driver = None
    try:
        stack.create(ippr_cluster(name))
        gcs = await stack.gcs_address(name)
        gcs_proxy.set_upstream(gcs)
        pod = (await stack.running_workers(name))[0].metadata.name
        wf_id = f"resize/default/{pod}"
        refuse = FaultRule(verb="patch", resource="pods/resize", error_rate=1.0, codes=(500,))
        if kill_at == "before_the_patch":
            stack.sandbox.faults.add(refuse)  # every resize patch refused, until the kill
        driver = stack.driver(name, gcs, "2", timeout_s=150)
        if kill_at == "syncing_raylet":
            # the patch has landed, the kubelet is still actuating: cut Ray off, so the
            # sync that follows fails and is retried
            await eventually(lambda: cpu_limit(stack, pod) == "2", 90, every=0.05)
            gcs_proxy.go_dark()
            await _until(lambda: _sync_retrying(stack, wf_id), 60)
        else:
            await _until(lambda: _resize_started(stack, wf_id), 90, every=0.02)
            await eventually(lambda: refuse.injected > 0, 30, every=0.02)
        kill(worker)  # SIGKILL: no cleanup, no goodbye
        if kill_at == "before_the_patch":
            assert cpu_limit(stack, pod) == "1"  # the patch had not landed
        stack.sandbox.faults.clear()
        gcs_proxy.restore()
        worker = start_worker(env, log)
        await _task_ran_and_resize_finished_once(stack, driver, gcs, pod)
    finally:
        if driver is not None:
            stop_driver(driver)
        kill(worker)


async def _until(check: Callable[[], Awaitable[bool]], timeout: float, every: float = 0.2) -> None:
    end = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < end, f"not reached in {timeout}s"
        await asyncio.sleep(every)
