"""An upgrade, and a rollback, with Worker Versioning (README *Upgrading raysize*).

Two `raysize worker` processes, build v1 and build v2 of one Worker Deployment, on one task
queue of the real dev server. The world is the embedded Kubernetes with a GCS stand-in
(`RayStandIn`: no Ray processes), so the real workflows and activities run, cheaply. The
kubelet takes `HOLD_S` to actuate each resize: a resize is "held" that long.

v1 is installed first and makes itself current (a first install). A demand grows pod A:
that resize is held while v2 starts and is made current by the CLI. Expected: the held
resize finishes on v1 (pinned), the reconcile moves to v2 at its next continue-as-new, a
new demand's resize runs on v2, v1 then has nothing left and stops; no workflow task
fails anywhere. Then the same backwards (v1 again, made current)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from bench.clusters import small_raycluster
from bench.fleet_bench import Registrar
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.ray_standin import RayStandIn
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from tests.e2e.conftest import GIB, eventually, kill, start_worker
from tests.orchestration.temporal_env import venv_binary

NAME = "upgrade"
HOLD_S = 8.0  # the kubelet actuates a resize this long after it is asked


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lines: list[str] = []

    def mark(self, what: str) -> None:
        line = f"{time.monotonic() - self.t0:6.1f}s {what}"
        self.lines.append(line)
        print(line, flush=True)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Sandbox, RayStandIn, Path]]:
    sandbox = Sandbox(
        SandboxConfig(
            node_specs=[NodeSpec("node-a", 8000, 32 * GIB)],
            timing=KubeletTiming(actuation_delay_s=HOLD_S),
        )
    ).start()
    ray = RayStandIn()
    ray.__enter__()
    try:
        sandbox.serve_gcs("default", NAME, ray.port)
        yield sandbox, ray, sandbox.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        ray.__exit__(None, None, None)
        sandbox.close()


def worker_env(
    dev_server: WorkflowEnvironment, kubeconfig: Path, tmp: Path, queue: str, deployment: str
) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "RAYSIZE_TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "RAYSIZE_TASK_QUEUE": queue,
        "RAYSIZE_KUBECONFIG": str(kubeconfig),
        "RAYSIZE_NAMESPACES": "default",
        "RAYSIZE_DISCOVERY_INTERVAL_S": "1",
        # the reconcile's wait is long: only the current version's workers waking it
        # (worker/deployment.py wake_moved_loops, every second here) can move it in time
        "RAYSIZE_TICK_S": "300",
        "RAYSIZE_UPGRADE_CHECK_S": "1",
        "RAYSIZE_DEPLOYMENT_NAME": deployment,
    }


def start(env: dict[str, str], build: str, log: Path) -> subprocess.Popen[bytes]:
    return start_worker({**env, "RAYSIZE_BUILD_ID": build}, log)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as Kubernetes stops a pod: the worker finishes what runs, then exits."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    finally:
        kill(proc)


def set_current(dev_server: WorkflowEnvironment, deployment: str, build: str) -> None:
    """What the README tells an operator to run; refused while no worker of that build
    polls (a version whose workers are gone), so tried until one does."""
    end = time.monotonic() + 30
    while True:
        done = _set_current(dev_server, deployment, build)
        if done.returncode == 0 or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert done.returncode == 0, done.stderr


def _set_current(
    dev_server: WorkflowEnvironment, deployment: str, build: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            venv_binary("temporal"),
            "worker",
            "deployment",
            "set-current-version",
            "--address",
            dev_server.client.service_client.config.target_host,
            "--deployment-name",
            deployment,
            "--build-id",
            build,
            "--yes",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def build_of(temporal: Client, workflow_id: str, run_id: str | None = None) -> str:
    """The build a run is pinned to ("" while it has none, or does not exist yet)."""
    try:
        desc = await temporal.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return ""
        raise
    info = desc.raw_description.workflow_execution_info.versioning_info
    return info.deployment_version.build_id


async def task_builds(temporal: Client, workflow_id: str, run_id: str) -> set[str]:
    """The builds that completed this run's workflow tasks; fails on a failed task (a
    nondeterminism error, or a task the server refused)."""
    builds: set[str] = set()
    history = await temporal.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    for e in history.events:
        assert e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, (
            f"{workflow_id} {run_id}: {e.workflow_task_failed_event_attributes}"
        )
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            builds.add(e.workflow_task_completed_event_attributes.deployment_version.build_id)
    return builds


async def resizes(temporal: Client, queue: str) -> dict[str, tuple[str, WorkflowExecutionStatus]]:
    """Every resize saga on the queue: run id → (workflow id, status)."""
    out: dict[str, tuple[str, WorkflowExecutionStatus]] = {}
    query = f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow'"
    async for w in temporal.list_workflows(query):
        assert w.status is not None
        out[w.run_id] = (w.id, w.status)
    return out


async def test_an_upgrade_and_a_rollback_lose_nothing(
    dev_server: WorkflowEnvironment,
    world: tuple[Sandbox, RayStandIn, Path],
    tmp_path: Path,
) -> None:
    _, ray, kubeconfig = world
    temporal = dev_server.client
    clock = Clock()
    queue = f"raysize-{uuid.uuid4().hex[:8]}"
    deployment = f"raysize-{uuid.uuid4().hex[:6]}"  # one dev server serves the whole session
    env = worker_env(dev_server, kubeconfig, tmp_path, queue, deployment)
    env["RAYSIZE_GCS_ADDRESS"] = ray.address  # no Ray, so no head Service IP to reach it
    api = config.new_client_from_config(config_file=str(kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        "ray.io",
        "v1",
        "default",
        "rayclusters",
        small_raycluster(NAME, workers=2, idle_timeout_s=3600),
    )
    reconcile = reconcile_workflow_id("default", NAME)
    procs: list[subprocess.Popen[bytes]] = []
    moves: asyncio.Task[None] | None = None
    try:
        with Registrar(core, {NAME: ray}):
            v1 = start(env, "v1", tmp_path / "v1.log")
            procs.append(v1)
            # a first install: v1 makes itself current, discovery starts the reconcile on it
            assert await eventually(lambda: len(ray.model.nodes) == 3, 60)
            await eventually_async(lambda: build_of(temporal, reconcile), "v1", 60)
            clock.mark("v1 installed: current, reconcile on v1")

            # a demand for 2 CPU grows a pod; the kubelet holds that resize HOLD_S
            ray.add_demands({"CPU": 2.0}, 1)
            held = await eventually_async(lambda: running_resize(temporal, queue), None, 30)
            clock.mark(f"resize {held[0]} started, held at the kubelet")

            moves = asyncio.create_task(watch_builds(temporal, reconcile, clock))
            v2 = start(env, "v2", tmp_path / "v2.log")
            procs.append(v2)
            await eventually_async(lambda: listed(temporal, deployment, "v2"), True, 30)
            await asyncio.to_thread(set_current, dev_server, deployment, "v2")
            clock.mark("v2 current")

            # the held resize finishes, on v1
            await temporal.get_workflow_handle(held[0], run_id=held[1]).result()
            assert await task_builds(temporal, *held) == {"v1"}
            clock.mark("held resize finished on v1")
            # the reconcile moves to v2 at its next continue-as-new
            await eventually_async(lambda: build_of(temporal, reconcile), "v2", 30)
            clock.mark("reconcile on v2")

            # a new demand's resize runs on v2
            assert await new_resize(temporal, queue, ray, placed=2) == {"v2"}
            clock.mark("new resize finished on v2")

            # v1 has nothing left to run: it stops
            await nothing_open_on(temporal, queue, "v1")
            await asyncio.to_thread(stop, v1)
            clock.mark("v1 stopped")

            # rollback: v1 again, made current; the same story backwards, with the
            # reconcile paused by an operator meanwhile: it moves all the same, still paused
            loop = temporal.get_workflow_handle(reconcile)
            await loop.signal("pause")
            v1 = start(env, "v1", tmp_path / "v1-again.log")
            procs.append(v1)
            await asyncio.to_thread(set_current, dev_server, deployment, "v1")
            clock.mark("v1 current again (rollback), the reconcile paused")
            await eventually_async(lambda: build_of(temporal, reconcile), "v1", 30)
            status = await loop.query(ReconcileWorkflow.status)
            assert status.paused, "the reconcile moved to v1 and forgot its pause"
            clock.mark("paused reconcile back on v1, still paused")
            await loop.signal("resume")
            assert await new_resize(temporal, queue, ray, placed=3) == {"v1"}
            clock.mark("rollback's resize finished on v1")
            await nothing_open_on(temporal, queue, "v2")
            await asyncio.to_thread(stop, v2)
            clock.mark("v2 stopped")

            # nothing lost or doubled: three demands, three resizes, each done once
            assert ray.counts()[0] == 3 and not ray.model.waiting
            after = await resizes(temporal, queue)
            assert len(after) == 3, after
            assert {s for _, s in after.values()} == {WorkflowExecutionStatus.COMPLETED}
            # and no workflow task failed in any run of any workflow on the queue
            async for w in temporal.list_workflows(f"TaskQueue='{queue}'"):
                await task_builds(temporal, w.id, w.run_id)
            for log in tmp_path.glob("v*.log"):
                text = log.read_text()
                assert "Nondeterminism" not in text and "nondeterminism" not in text, log
    finally:
        if moves is not None:
            moves.cancel()
        for p in procs:
            kill(p)
        print("\n".join(clock.lines))


async def eventually_async(check, want, timeout: float):  # type: ignore[no-untyped-def]
    """The value of `await check()` once it is `want` (or, with want None, once truthy)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = await check()
        if (want is None and last) or (want is not None and last == want):
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"not reached in {timeout}s (last: {last!r}, wanted {want!r})")


async def running_resize(temporal: Client, queue: str) -> tuple[str, str] | None:
    query = (
        f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow' AND ExecutionStatus='Running'"
    )
    async for w in temporal.list_workflows(query):
        return w.id, w.run_id
    return None


async def listed(temporal: Client, deployment: str, build: str) -> bool:
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest

    try:
        resp = await temporal.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(
                namespace=temporal.namespace, deployment_name=deployment
            )
        )
    except Exception:
        return False
    return any(
        v.deployment_version.build_id == build
        for v in resp.worker_deployment_info.version_summaries
    )


async def nothing_open_on(temporal: Client, queue: str, build: str) -> None:
    """No running workflow on the queue is pinned to this build."""

    async def open_ones() -> list[str]:
        out = []
        async for w in temporal.list_workflows(
            f"TaskQueue='{queue}' AND ExecutionStatus='Running'"
        ):
            if await build_of(temporal, w.id, w.run_id) == build:
                out.append(w.id)
        return out

    await eventually_async(open_ones, [], 30)


async def watch_builds(temporal: Client, workflow_id: str, clock: Clock) -> None:
    """Marks each change of the build the workflow's latest run is on."""
    last = await build_of(temporal, workflow_id)
    while True:
        now = await build_of(temporal, workflow_id)
        if now != last:
            clock.mark(f"{workflow_id}: latest run now on {now or '(none yet)'}")
            last = now
        await asyncio.sleep(0.1)


async def new_resize(temporal: Client, queue: str, ray: RayStandIn, placed: int) -> set[str]:
    """One more demand for 2 CPU: exactly one new resize saga meets it; the builds that
    ran it, once it has finished."""
    before = await resizes(temporal, queue)
    ray.add_demands({"CPU": 2.0}, 1)
    await eventually(lambda: ray.counts()[0] == placed, 60)  # every demand so far placed
    after = await resizes(temporal, queue)
    new = {r: w for r, w in after.items() if r not in before}
    assert len(new) == 1, after
    ((run, (wid, _)),) = new.items()
    await temporal.get_workflow_handle(wid, run_id=run).result()
    return await task_builds(temporal, wid, run)
