"""Record the histories the replay test checks: `python -m tests.orchestration.record_histories`.

Run it when a workflow change is *meant* to change what the workflows do, and commit the
new files together with the change; an unintended difference fails test_replay.py.
Histories already recorded are kept (they are what runs in flight under the older code
look like, and must still replay); `--force` records every one anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from temporalio.worker import Worker

from raysize.workflows import deadlines
from raysize.workflows.contracts import ReconcileInput
from raysize.workflows.model import KubeletResizeState, PlannerSettings, PodPhase, PodResize
from raysize.workflows.pod_template import ConfigError
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow
from tests.orchestration.fake_cluster import FakeCluster, FakePod
from tests.orchestration.fake_world import FakeWorld
from tests.orchestration.temporal_env import start_time_skipping
from tests.orchestration.test_reconcile_workflow import ResizeRecorder
from tests.orchestration.test_resize_workflow import request
from tests.workflows.kit import group, pod, res, snapshot

HERE = Path(__file__).parent / "histories"
# histories recorded with a module constant of workflows/deadlines.py shortened, and
# replayed so (test_replay.py)
RECORDED_WITH: dict[str, dict[str, float]] = {"reconcile_head_drift": {"RAYLET_DRIFT_S": 0.5}}


@contextlib.contextmanager
def _constants(values: dict[str, float]) -> Iterator[None]:
    old = {name: getattr(deadlines, name) for name in values}
    for name, value in values.items():
        setattr(deadlines, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(deadlines, name, value)


GIB = 1024**3


def _keep(name: str, force: bool) -> bool:
    return not force and (HERE / f"{name}.json").exists()


async def record_reconcile(
    env: object,
    name: str,
    world: FakeWorld,
    observed: int,
    fix: bool = False,
    tick_s: float = 0.5,
    max_ticks: int = 8,
) -> None:
    """One reconcile run until `observed` observes (with `fix`, the config error goes
    away halfway), saved as `name`."""
    from temporalio.testing import WorkflowEnvironment

    assert isinstance(env, WorkflowEnvironment)
    recorder = ResizeRecorder(world)
    queue = f"q-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        activities=[*world.activities(), *recorder.workflow_activities()],
    ):
        handle = await env.client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(
                namespace="ns", cluster="demo", tick_s=tick_s, max_ticks_per_run=max_ticks
            ),
            id=f"reconcile/ns/{name}",
            task_queue=queue,
        )
        first_run = handle.result_run_id
        for _ in range(400):
            if fix and world.observed >= observed // 2 and world.config_errors:
                world.config_errors = ()
                world.version += 1
            if world.observed >= observed:
                break
            await asyncio.sleep(0.05)
        history = await env.client.get_workflow_handle(
            f"reconcile/ns/{name}", run_id=first_run
        ).fetch_history()
        await handle.terminate("recorded")
    (HERE / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1))


def pending_gpu_world() -> FakeWorld:
    """Three {CPU: 1} tasks; a CPU group and a pending GPU pod with 8 spare CPUs: the
    tasks go to the GPU pod's spare room, no CPU pod is launched."""
    gpu = group("gpu", cpu=8, mem_gib=32, GPU=1, max_cpu=None, max_workers=1)
    pending = pod("gpu1", g="gpu", cpu=8, mem_gib=32, phase=PodPhase.PENDING)
    pending = pending.model_copy(
        update={"total": pending.total + res(GPU=1), "available": pending.available + res(GPU=1)}
    )
    return FakeWorld(snapshot([group("cpu"), gpu], [pending], [(res(1), 3)]))


def landing_world() -> FakeWorld:
    """w1 is growing to 4 CPU (asked half a second ago: landing) while 5 CPUs of tasks
    wait: no pod is launched while it lands."""
    inflight = PodResize(
        cpu=4000, memory=8 * GIB, state=KubeletResizeState.IN_PROGRESS, asked_s=0.5
    )
    w1 = pod("w1", resize=inflight)
    return FakeWorld(snapshot([group()], [w1], [(res(2), 2), (res(1), 1)]))


def just_grown_world() -> FakeWorld:
    """w1 (1 CPU, busy) grows to 3 for a {CPU: 2} task, which Ray still reports once the
    grow has landed: no pod is grown or launched for it for a moment."""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    world.stale_demand = True
    return world


def scale_in_world() -> FakeWorld:
    """w1 idle past the timeout, w2 busy: w1 is drained first, then named."""
    return FakeWorld(snapshot([group()], [pod("w1", idle_s=120), pod("w2", free_cpu=0)]))


def head_drift_world() -> FakeWorld:
    """The head (not in ray.io/ippr) and w1 each have a Raylet apart from their pod: w1
    is settled after RAYLET_DRIFT_S (recorded and replayed at 0.5 s), the head never."""
    drift = PodResize(
        cpu=3000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, raylet_only=True
    )
    snap = snapshot([group()], [pod("w1", resize=drift)])
    head = snap.pods[0].model_copy(update={"resize": drift})
    return FakeWorld(snap.model_copy(update={"pods": (head, *snap.pods[1:])}))


def silent_pod_world() -> FakeWorld:
    """w1 has run past the Raylet start timeout with no Raylet: it is replaced."""
    silent = pod("w1", raylet_id=None, running_s=700)
    return FakeWorld(snapshot([group()], [silent], [(res(1), 1)]))


async def record(force: bool = False) -> None:
    env = await start_time_skipping()
    try:
        # the event-driven wait: an idle pod's deadline sets the wait, and a cluster with a
        # config error waits on Kubernetes alone, until the fix
        if not _keep("reconcile_idle_deadline", force):
            world = FakeWorld(
                snapshot(
                    [group()],
                    [pod("w1", cpu=3, idle_s=50), pod("w2")],
                    settings=PlannerSettings(idle_timeout_s=60),
                )
            )
            await record_reconcile(env, "reconcile_idle_deadline", world, 3, tick_s=300)
        if not _keep("reconcile_config_error", force):
            world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
            world.config_errors = (
                ConfigError(group="g1", field="max-cpu", problem="'x' is not a quantity", fix="4"),
            )
            await record_reconcile(env, "reconcile_config_error", world, 6, fix=True)
        runs = {
            "resize_happy": ("done", {}),
            "resize_deferred": ("done", {"node_room_cpu": 3000}),
            "resize_error_rollback": ("error", {}),
            # the kubelet never finishes: a last look at the deadline, then the rollback
            "resize_timeout": ("hang", {}),
        }
        for name, (mode, extra) in runs.items():
            if _keep(name, force):
                continue
            cluster = FakeCluster(
                FakePod(cpu=1000, memory=2 * GIB, raylet_cpu=1000, raylet_memory=2 * GIB, **extra)
            )
            cluster.mode = mode
            queue = f"q-{uuid.uuid4()}"
            async with Worker(
                env.client,
                task_queue=queue,
                workflows=[PodResizeWorkflow],
                activities=cluster.activities(),
            ):
                handle = await env.client.start_workflow(
                    PodResizeWorkflow.run, request(), id=f"resize/ns/{name}", task_queue=queue
                )
                await handle.result()
                history = await handle.fetch_history()
            (HERE / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1))

        if not _keep("reconcile_pending_gpu", force):
            # CPU tasks and a pending GPU pod with spare CPUs: no CPU pod is launched
            await record_reconcile(env, "reconcile_pending_gpu", pending_gpu_world(), 3)
        if not _keep("reconcile_landing", force):
            # more work than a landing grow can take: no pod is launched while it lands
            await record_reconcile(env, "reconcile_landing", landing_world(), 3)
        if not _keep("reconcile_just_grown", force):
            # the work a grow took is still reported: it is not grown or launched for again
            await record_reconcile(env, "reconcile_just_grown", just_grown_world(), 5)
        if not _keep("reconcile_scale_in", force):
            # an idle pod goes: drained first, then named
            await record_reconcile(env, "reconcile_scale_in", scale_in_world(), 3)
        if not _keep("reconcile_head_drift", force):
            # (replayed with the same RAYLET_DRIFT_S: test_replay.RECORDED_WITH)
            with _constants(RECORDED_WITH["reconcile_head_drift"]):
                await record_reconcile(
                    env, "reconcile_head_drift", head_drift_world(), 6, tick_s=0.3
                )
        if not _keep("reconcile_silent_pod", force):
            await record_reconcile(env, "reconcile_silent_pod", silent_pod_world(), 3)
        if not _keep("reconcile_grow", force):
            world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
            # (recorded before as workflow id reconcile/ns/demo, 4 ticks a run)
            await record_reconcile(env, "reconcile_grow", world, 5, max_ticks=4)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(record(force="--force" in sys.argv[1:]))
