"""The reconcile loop against the real time-skipping server, with a scripted cluster."""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from bench.histories import runs
from raysize.worker.run import workflow_runner
from raysize.workflows.contracts import (
    Act,
    ApplyResizeInput,
    ApplyResizeResult,
    FinishResizeInput,
    FinishResizeResult,
    GcsTimetable,
    ProgressState,
    RayletResizeInput,
    RayletResizeResult,
    ReconcileInput,
    ReconcileStatus,
    ResizeOutcome,
    ResizeProgress,
    ResizeRequest,
    ResizeSagaState,
    SetStatusInput,
    WaitResizeInput,
)
from raysize.workflows.model import KubeletResizeState, PlannerSettings, PodResize, ResizePolicy
from raysize.workflows.planner import JUST_GROWN_S
from raysize.workflows.pod_template import ConfigError
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.resources import GIB

from ..workflows.kit import group, pod, res, snapshot
from .fake_world import FakeWorld


class ResizeRecorder:
    """Stands in for the resize saga's activities: records every pod patch."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world
        self.requests: list[ResizeRequest] = []
        self.applied: list[ApplyResizeInput] = []
        self.hold = False
        # the apply does the whole resize, Raylet and final status included, before it is
        # held (as the real one does on the happy path): the pod shows its new size while
        # the saga has not heard its apply end
        self.finishes = False

    def workflow_activities(self) -> list[object]:
        @activity.defn(name=Act.APPLY_RESIZE)
        async def apply(inp: ApplyResizeInput) -> ApplyResizeResult:
            self.applied.append(inp)
            self.world.resizing.add(inp.pod)
            self.world.started.append(inp.pod)
            finished = None
            if self.finishes and inp.finish is not None:
                self.world.resized(inp.pod, inp.cpu, inp.memory)
                self.world.resizing.discard(inp.pod)
                finished = FinishResizeResult(cpu=inp.cpu, memory=inp.memory)
            while self.hold:
                activity.heartbeat()
                await asyncio.sleep(0.02)
            done = ResizeProgress(state=ProgressState.DONE, cpu=inp.cpu, memory=inp.memory)
            return ApplyResizeResult(generation=2, progress=done, finished=finished)

        @activity.defn(name=Act.WAIT_RESIZE)
        async def wait(inp: WaitResizeInput) -> ResizeProgress:
            while self.hold:
                activity.heartbeat()
                await asyncio.sleep(0.02)
            return ResizeProgress(state=ProgressState.DONE, cpu=inp.cpu, memory=inp.memory)

        @activity.defn(name=Act.RESIZE_RAYLET)
        async def raylet(inp: RayletResizeInput) -> RayletResizeResult:
            self.world.resized(inp.pod, inp.cpu, inp.memory)
            return RayletResizeResult(cpu=inp.cpu, memory=inp.memory)

        @activity.defn(name=Act.SET_STATUS)
        async def status(inp: SetStatusInput) -> None:
            self.world.resizing.discard(inp.pod)

        @activity.defn(name=Act.FINISH_RESIZE)
        async def finish(inp: FinishResizeInput) -> FinishResizeResult:
            self.world.resized(inp.pod, inp.cpu, inp.memory)
            self.world.resizing.discard(inp.pod)
            return FinishResizeResult(cpu=inp.cpu, memory=inp.memory)

        return [apply, wait, raylet, status, finish]


@asynccontextmanager
async def reconciling(
    env: WorkflowEnvironment, world: FakeWorld, recorder: ResizeRecorder | None = None, **kw: object
) -> AsyncIterator[WorkflowHandle[ReconcileWorkflow, str]]:
    queue = f"q-{uuid.uuid4()}"
    recorder = recorder or ResizeRecorder(world)
    world.clock = world.clock or env.get_current_time
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        activities=[*world.activities(), *recorder.workflow_activities()],
        # cached: the observe and Events are local activities, and a worker that keeps
        # no workflow runs them again at each task (`replays_alike` checks determinism)
        max_cached_workflows=100,
        workflow_runner=workflow_runner(),  # as the worker runs them
    ):
        ns = f"ns-{uuid.uuid4().hex[:6]}"
        handle = await env.client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(namespace=ns, cluster="demo", **{"tick_s": 0.5, **kw}),  # type: ignore[arg-type]
            id=f"reconcile/{ns}/demo",
            task_queue=queue,
        )
        try:
            yield handle
        finally:
            if (await handle.describe()).status.name != "COMPLETED":  # type: ignore[union-attr]
                await handle.terminate("test over")
        await replays_alike(env, handle.id, handle.first_execution_run_id or "")


async def replays_alike(env: WorkflowEnvironment, workflow_id: str, first_run_id: str) -> None:
    """Every run of the workflow replays on this code without nondeterminism: what a
    worker that kept none cached would have done at each of its tasks."""
    replayer = Replayer(
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    for history in await runs(env.client, workflow_id, first_run_id):
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, (history.run_id, result.replay_failure)


async def count_events(handle: WorkflowHandle, *kinds: str) -> list[int]:
    """How many events of each kind (its attributes' field name) the run's history has."""
    counts = [0] * len(kinds)
    async for e in handle.fetch_history_events():
        for i, kind in enumerate(kinds):
            counts[i] += e.HasField(kind)
    return counts


async def until(check: Callable[[], object], seconds: float = 20) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not check():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def until_async(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 20) -> None:
    """`until`, for a check that awaits (a query, a history read)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not await check():
        assert loop.time() < end, what
        await asyncio.sleep(0.05)


async def status_of(handle: WorkflowHandle) -> ReconcileStatus:
    """Query with retries: a query can land while a run is handing over to the next."""
    for _ in range(10):
        try:
            return await handle.query(ReconcileWorkflow.status, rpc_timeout=timedelta(seconds=5))
        except RPCError:
            await asyncio.sleep(0.2)
    return await handle.query(ReconcileWorkflow.status)


async def children(env: WorkflowEnvironment, handle: WorkflowHandle) -> list[ResizeSagaState]:
    ns = handle.id.split("/")[1]
    out = []
    for name in ("w1", "w2", "w3"):
        try:
            child = env.client.get_workflow_handle(f"resize/{ns}/{name}")
            out.append(await child.query(PodResizeWorkflow.state))
        except Exception:
            continue
    return out


async def test_pending_demand_starts_one_resize_saga_per_pod(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.started or world.observed > 3)
        ns = handle.id.split("/")[1]
        child = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
        state = await child.result()
        status = await status_of(handle)
    assert (state.from_cpu, state.cpu) == (1000, 2000)
    assert status.resizes_started == 1
    assert any("grow w1" in d.summary for d in status.decisions)
    assert any(e.reason == "Reconciled" and "grow w1" in e.message for e in world.events)


async def test_a_resize_saga_is_for_the_pod_uid_it_was_decided_on(
    ts_env: WorkflowEnvironment,
) -> None:
    """The saga's pod writes name the UID the plan saw: a pod created again under the same
    name is never resized by the old decision."""
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    recorder = ResizeRecorder(world)
    async with reconciling(ts_env, world, recorder):
        await until(lambda: recorder.applied or world.observed > 3)
    assert [(a.pod, a.pod_uid) for a in recorder.applied[:1]] == [("w1", world.uids["w1"])]


async def test_launches_scale_the_group_with_absolute_replicas(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group(max_cpu=None)], [pod("w1", free_cpu=0)], [(res(1), 2)]))
    async with reconciling(ts_env, world):
        await until(lambda: world.scales)
        await asyncio.sleep(1.0)  # more ticks: the pending pods count, so no second launch
    assert world.scales[0].replicas == {"headgroup": 1, "g1": 3}
    assert len(world.scales) == 1


async def test_config_error_means_no_action_until_fixed(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    world.config_errors = (
        ConfigError(group="g1", field="max-cpu", problem="'x' is not a quantity", fix="use 4"),
    )
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 3)
        status = await status_of(handle)
        assert status.config_errors == ("group 'g1', max-cpu: 'x' is not a quantity; use 4",)
        assert not world.started and status.resizes_started == 0
        assert [e.reason for e in world.events] == ["InvalidIPPRConfig"]
        assert world.events[0].warning
        world.config_errors = ()
        world.version += 1
        # A resize can start and finish between two looks: ask whether it ever started.
        await until(lambda: (len(world.events) >= 2 and world.started) or world.observed > 40)
        status = await status_of(handle)
        await until(lambda: world.waits[-1].watch_ray)  # once valid, Ray counts again
    assert world.started == ["w1"]
    assert status.config_errors == ()
    assert world.events[1].reason == "IPPRConfigValid"
    # while raysize could not act, its waits read nothing from Ray (an invalid config once
    # made the wait return at once: 220 reconciles in 24 s)
    assert world.waits[0].watch_ray is False


async def test_an_idle_cluster_waits_for_its_next_deadline_not_a_tick(
    ts_env: WorkflowEnvironment,
) -> None:
    """With nothing pending, the loop sleeps until the idle pod's timeout (then shrinks
    it), not for a short tick, and not for the whole safety tick either."""
    world = FakeWorld(
        snapshot(
            [group()],
            [pod("w1", cpu=3, idle_s=50), pod("w2")],
            settings=PlannerSettings(idle_timeout_s=60),
        )
    )
    async with reconciling(ts_env, world, tick_s=300) as handle:
        await until(lambda: world.waits)
        status = await status_of(handle)
    assert 10 <= world.waits[0].timeout_s <= 11  # the idle pod expires in 10 s
    assert world.waits[0].watch_ray
    assert not world.started and status.resizes_started == 0


async def test_the_gcs_timetable_a_wait_returns_is_handed_to_every_later_wait(
    ts_env: WorkflowEnvironment,
) -> None:
    """Two workers take a cluster's waits in turn: the timetable of Ray's demand
    publications a wait's worker learned goes with every later wait, also after a wait
    on a worker that had learned nothing (it returns none); one of another GCS (the head
    moved) is not handed on."""
    world = FakeWorld(snapshot([group()], [pod("w1"), pod("w2")]))

    def learned(address: str = "127.0.0.1:6379") -> GcsTimetable:
        windows = ((0, 1.7e9, 1.7e9 + 0.004), (3, 1.7e9 + 3.0012, 1.7e9 + 3.0031))
        return GcsTimetable(address=address, period=(1.0003, 1.0005), windows=windows)

    world.timetables = [None, learned(), None, learned("10.0.0.7:6379"), None]
    async with reconciling(ts_env, world, tick_s=0.2):
        await until(lambda: len(world.waits) >= 5)
    assert world.waits[0].gcs_timetable is None  # nobody had learned it yet
    assert world.waits[1].gcs_timetable is None
    assert [w.gcs_timetable for w in world.waits[2:5]] == [learned()] * 3


async def test_a_wait_of_an_earlier_release_answering_a_bare_bool_still_works(
    ts_env: WorkflowEnvironment,
) -> None:
    """Workers of release 0.1 answer the wait with a bool: beside them in a rolling
    upgrade, the loop reads it as a wait that taught nothing, and goes on."""
    world = FakeWorld(snapshot([group()], [pod("w1"), pod("w2")]))
    world.bare_waits = True
    async with reconciling(ts_env, world, tick_s=0.2) as handle:
        await until(lambda: len(world.waits) >= 3)
        status = await status_of(handle)
    assert all(w.gcs_timetable is None for w in world.waits)
    assert not status.last_error


async def test_ray_in_tree_autoscaler_owns_the_cluster_until_handed_over(
    ts_env: WorkflowEnvironment,
) -> None:
    """With spec.enableInTreeAutoscaling on, Ray's own autoscaler acts: raysize neither
    resizes nor scales (two autoscalers would undo each other), says so once, and takes
    over when the flag goes off."""
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1), (res(4), 3)]))
    world.in_tree_autoscaling = True
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 3)
        status = await status_of(handle)
        assert status.stood_down
        assert not world.started and not world.scales and status.resizes_started == 0
        assert [e.reason for e in world.events] == ["InTreeAutoscaling"]
        assert "enableInTreeAutoscaling: true" in world.events[0].message
        world.in_tree_autoscaling = False
        world.version += 1
        await until(lambda: (world.started and world.scales) or world.observed > 40)
        status = await status_of(handle)
    assert world.started == ["w1"] and world.scales
    assert not status.stood_down
    assert [e.reason for e in world.events][:2] == ["InTreeAutoscaling", "ManagedByRaysize"]


async def test_ray_autoscaler_left_running_in_the_head_keeps_raysize_standing_by(
    ts_env: WorkflowEnvironment,
) -> None:
    """The flag goes off, but KubeRay does not restart a running head: Ray's autoscaler
    still runs in its sidecar. raysize stands by until that container stops, and says why
    and what to do; then it takes over."""
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1), (res(4), 3)]))
    world.in_tree_autoscaling = True
    world.ray_autoscaler_pod = "demo-head-x2k9p"
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 2)
        world.in_tree_autoscaling = False  # handed over, the sidecar still up
        world.version += 1
        await until(lambda: len(world.events) >= 2)
        await until(lambda: world.observed >= 6)
        status = await status_of(handle)
        assert status.stood_down and status.ray_autoscaler_pod == "demo-head-x2k9p"
        assert not world.started and not world.scales
        assert [e.reason for e in world.events] == ["InTreeAutoscaling", "RayAutoscalerRunning"]
        warning = world.events[1]
        assert warning.warning
        assert "still runs in head pod demo-head-x2k9p (container autoscaler)" in warning.message
        assert "Restart the head pod or stop that container" in warning.message
        assert not world.waits[-1].watch_ray  # standing by costs the GCS nothing
        world.ray_autoscaler_pod = ""  # the head restarted without it
        world.version += 1
        await until(lambda: (world.started and world.scales) or world.observed > 40)
        status = await status_of(handle)
    assert world.started == ["w1"] and world.scales
    assert not status.stood_down and status.ray_autoscaler_pod == ""
    assert [e.reason for e in world.events][:3] == [
        "InTreeAutoscaling",
        "RayAutoscalerRunning",
        "ManagedByRaysize",
    ]


async def test_failed_read_takes_no_action(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group(max_cpu=None)], [pod("w1", free_cpu=0)], [(res(1), 2)]))
    world.fail_observe = 3  # one whole tick's attempts fail
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 3)
        status = await status_of(handle)
        await until(lambda: world.scales)
    assert status.last_error.startswith("observe failed 1 time in a row, next try in ")
    assert "s; no action this tick: list pods: timed out" in status.last_error


async def test_concurrent_resizes_are_capped(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1"), pod("w2"), pod("w3")], [(res(2), 3)]))
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder, max_concurrent_resizes=2) as handle:
        await until(lambda: len(world.resizing) >= 2)
        await asyncio.sleep(1.0)
        assert len(world.resizing) == 2
        status = await status_of(handle)
        assert status.resizes_started == 2
        recorder.hold = False
        await until(lambda: len(world.resizing) == 0 and world.observed > 0)


async def test_deleted_raycluster_ends_the_workflow(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")]))
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 1)
        world.found = False
        result = await asyncio.wait_for(handle.result(), 20)
    assert result == "RayCluster deleted"


async def test_pause_stops_acting_and_resume_continues(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")]))
    async with reconciling(ts_env, world) as handle:
        # a paused reconcile holds before its next observe: let it observe once first (a
        # pause that lands before the first observe holds that one too)
        await until(lambda: world.observed >= 1)
        await handle.signal(ReconcileWorkflow.pause)
        world.set_demands((res(2), 1))
        await asyncio.sleep(1.0)
        assert not world.started
        assert (await status_of(handle)).paused
        await handle.signal(ReconcileWorkflow.resume)
        await until(lambda: world.snapshot.demands == ())  # resized, the demand ran
        status = await status_of(handle)
    assert status.resizes_started == 1


async def test_continue_as_new_keeps_decisions(ts_env: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    async with reconciling(ts_env, world, max_ticks_per_run=2) as handle:
        await until(lambda: world.observed >= 6)
        status = await status_of(handle)
        desc = await handle.describe()
    assert desc.run_id != handle.result_run_id  # a later run of the same workflow
    assert status.ticks >= 5
    assert any("grow w1" in d.summary for d in status.decisions)
    assert status.resizes_started == 1


async def test_right_size_policy_comes_from_the_worker_settings(
    ts_env: WorkflowEnvironment,
) -> None:
    from raysize.workflows.model import PlannerSettings

    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    async with reconciling(
        ts_env, world, settings=PlannerSettings(resize_policy=ResizePolicy.MAX)
    ) as handle:
        ns = handle.id.split("/")[1]
        await until(lambda: world.observed >= 2)
        state = await ts_env.client.get_workflow_handle_for(
            PodResizeWorkflow.run, f"resize/{ns}/w1"
        ).result()
    assert state.cpu == 4000


async def test_abandoned_watches_and_a_worker_stop_log_no_errors(
    ts_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker restart is routine: it used to log `_ActivityHandle exception was never
    retrieved` with a traceback for every watch a signal had abandoned or the stop tore
    down (1,088 lines in 20 s)."""
    caplog.set_level(logging.INFO)
    world = FakeWorld(snapshot([group()], [pod("w1")]))
    async with reconciling(ts_env, world) as handle:  # every task replays: evictions too
        await until(lambda: len(world.waits) >= 2)
        for _ in range(5):
            await handle.signal(ReconcileWorkflow.wake)  # ends the wait: the watch is left
            await asyncio.sleep(0.2)
        assert len(world.waits) >= 5
    gc.collect()  # an unretrieved exception is reported when its future is collected
    await asyncio.sleep(0.2)
    errors = [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


async def current_details(handle: WorkflowHandle) -> str:
    """What the Temporal UI shows as the workflow's current details."""
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return str(meta.current_details)


async def test_the_temporal_ui_tells_each_resize_story(ts_env: WorkflowEnvironment) -> None:
    """The workflow list showed identical `resize/<ns>/<pod>` rows: now each has a summary
    (which way, from → to, why), a page note, and says how it ended; activities are
    named by what they do."""
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.started or world.observed > 3)
        ns = handle.id.split("/")[1]
        child = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
        await child.result()
        desc = await child.describe()
        ended = await current_details(child)
        await until(lambda: len(world.waits) >= 2)
        loop_now = await current_details(handle)
        history = await child.fetch_history()
    assert await desc.static_summary() == "grow 1 → 2 CPU for 1 × {CPU: 2} pending"
    details = await desc.static_details()
    assert details is not None
    assert f"pod `w1` of RayCluster `{ns}/demo`" in details
    assert "from **1 CPU/2Gi** to **2 CPU/2Gi**" in details
    assert ended == "Succeeded at 2 CPU/2Gi"
    assert "last decision: tick" in loop_now and "grow w1" in loop_now
    assert "waiting for a change of the pods, the RayCluster or Ray's demands" in loop_now
    summaries = [
        e.user_metadata.summary.data.decode()
        for e in history.events
        if e.HasField("user_metadata") and e.user_metadata.HasField("summary")
    ]
    assert any("patch pods/resize to 2 CPU/2Gi" in s for s in summaries), summaries
    assert any("Raylet to 2 CPU/2Gi, then ray.io/ippr-status" in s for s in summaries), summaries


async def test_the_raylet_of_a_pod_launched_at_size_is_synced_at_once_as_a_matter_of_course(
    ts_env: WorkflowEnvironment,
) -> None:
    """A pod the launch-size policy made 3 CPU, its Raylet started at KubeRay's 1 CPU: the
    first tick starts the saga that brings the Raylet to the pod (no RAYLET_DRIFT_S wait),
    and says so as what it is, an Event of type Normal, not the warning of a repair."""
    born = PodResize(
        cpu=3000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS, raylet_only=True,
        launched=True,
    )  # fmt: skip
    world = FakeWorld(snapshot([group()], [pod("w1", resize=born)]))
    recorder = ResizeRecorder(world)
    async with reconciling(ts_env, world, recorder) as handle:
        await until(lambda: world.started == ["w1"])
        ns = handle.id.split("/")[1]
        child = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
        state = await child.result()
        await until(lambda: bool(world.events))
    assert (state.from_cpu, state.cpu, state.outcome) == (3000, 3000, ResizeOutcome.SUCCEEDED)
    (event,) = world.events
    assert event.reason == "SyncingLaunchedRaylet" and not event.warning, event
    assert event.message.startswith("settle w1: launched at size: the pod started at 3 CPU/2Gi")


async def test_a_stuck_resize_with_no_saga_is_settled_and_a_live_saga_is_left_alone(
    ts_env: WorkflowEnvironment,
) -> None:
    """A pod held spec 4 CPU / actuated 1 CPU for 600 s with no workflow on it: the loop
    starts a saga that takes the pod back to what it has, says so, and never retargets a
    saga that still runs (an operator may have paused it)."""
    stuck = PodResize(cpu=4000, memory=2 * GIB, state=KubeletResizeState.DEFERRED, asked_s=600)
    world = FakeWorld(snapshot([group()], [pod("w1", resize=stuck)]))
    world.resizing.add("w1")
    recorder = ResizeRecorder(world)
    async with reconciling(ts_env, world, recorder) as handle:
        await until(lambda: world.started == ["w1"])
        ns = handle.id.split("/")[1]
        child = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
        state = await child.result()
        status = await status_of(handle)
        summary = await (await child.describe()).static_summary()
    assert (state.from_cpu, state.cpu, state.outcome) == (1000, 1000, ResizeOutcome.SUCCEEDED)
    assert summary is not None and summary.startswith("settle 1 → 1 CPU for stuck resize")
    assert any(d.summary.startswith("settle w1: stuck resize") for d in status.decisions)
    assert [e.reason for e in world.events] == ["SettlingStuckResize"]

    # the same pod while a saga of its own still runs (paused, or slow): left to finish
    world = FakeWorld(snapshot([group()], [pod("w1")]))
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder) as handle:
        ns = handle.id.split("/")[1]
        held = await ts_env.client.start_workflow(
            PodResizeWorkflow.run,
            ResizeRequest(
                namespace=ns, cluster="demo", pod="w1", group="g1", node_id="n",
                from_cpu=1000, from_memory=2 * GIB, cpu=4000, memory=2 * GIB, timeout_s=600,
            ),
            id=f"resize/{ns}/w1",
            task_queue=(await handle.describe()).task_queue,
        )  # fmt: skip
        await until(lambda: world.started == ["w1"])  # its patch is being applied
        world.snapshot = snapshot([group()], [pod("w1", resize=stuck)])
        world.resizing.add("w1")
        world.version += 1
        before = world.observed
        await until(lambda: world.observed >= before + 3)
        status = await status_of(handle)
        state = await held.query(PodResizeWorkflow.state)
        await held.terminate("test over")
    assert not any(d.summary.startswith("settle") for d in status.decisions)
    assert state.cpu == 4000 and not any(a.result == "retargeted" for a in state.attempts)


async def test_a_resize_that_ends_while_its_read_is_under_way_is_not_started_again(
    ts_env: WorkflowEnvironment,
) -> None:
    """Under load an observe read the pods before a saga's patch landed and Ray before its
    Raylet sync, and the saga ended before the decision made on that read was acted on:
    the loop started a second saga from the size the read saw (the 1,000-cluster burst
    grew two pods 1 → 4 twice). Here the read of the pods misses the held saga's patch,
    and the saga ends before the read answers. The read is a local activity, so the end
    reaches the loop only in its next workflow task: the decision goes to the saga as a
    new target, that signal fails (the saga has ended), and the next tick decides on a
    fresh read. (Were the end heard with the read, `_fresh` would hold the decision.)"""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder) as handle:
        ns = handle.id.split("/")[1]
        await until(lambda: world.started == ["w1"])  # the first saga, held in its patch
        saga = ts_env.client.get_workflow_handle(f"resize/{ns}/w1")

        def before_the_patch() -> None:  # the pods as read before the patch landed
            world.resizing.discard("w1")
            world.on_read = None

        async def the_saga_ends() -> None:
            world.while_reading = None
            recorder.hold = False
            await saga.result()

        world.on_read, world.while_reading = before_the_patch, the_saga_ends
        world.version += 1  # wakes the loop
        await until(lambda: world.while_reading is None)
        before = world.observed
        await until(lambda: world.observed >= before + 2)
        starts, failed_signals = await count_events(
            handle,
            "start_child_workflow_execution_initiated_event_attributes",
            "signal_external_workflow_execution_failed_event_attributes",
        )
    assert world.started == ["w1"]  # one saga, not a second from the stale read
    assert starts == 1 and failed_signals == 1


async def test_a_pod_whose_saga_the_loop_runs_is_never_started_again_on_a_stale_read(
    ts_env: WorkflowEnvironment,
) -> None:
    """Under load a saga's end reached the loop tasks after the saga closed, and a read
    older than the saga's patch showed the pod still at its old size: the loop started a
    second saga from it (the 1,000-cluster burst, 3 pods 1 → 4 twice). A decision about a
    pod whose saga the loop has not heard end goes to that saga as a new target, never as
    a start: here the read misses the held saga's patch, and the loop's history shows no
    second start of it, only the signal."""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder) as handle:
        await until(lambda: world.started == ["w1"])  # the saga, held in its patch
        world.resizing.discard("w1")  # every read from now on misses the patch
        before = world.observed
        world.version += 1  # wakes the loop
        await until(lambda: world.observed >= before + 2)
        starts, signals = await count_events(
            handle,
            "start_child_workflow_execution_initiated_event_attributes",
            "signal_external_workflow_execution_initiated_event_attributes",
        )
        recorder.hold = False
    assert world.started == ["w1"]
    assert starts == 1  # the first saga's start alone
    assert signals >= 1


async def test_a_plan_that_does_not_see_a_running_saga_never_lowers_its_target(
    ts_env: WorkflowEnvironment,
) -> None:
    """In the 1,000-cluster burst a saga's patch waited a minute behind a busy API
    server, and a read meanwhile showed the pod at its old size, not resizing: the plan,
    blind to the saga's 4 CPU, decided the pod 1 → 2 CPU for one task, and that went to
    the saga as its new target. It ended at 2 CPU, and one task waited for good. Here w1
    grows 1 → 3 CPU for a {CPU: 2} task; held in its patch, reads miss it, and the plan
    would send w1 to 2 CPU: no such target is sent, and the saga reaches 3."""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder) as handle:
        await until(lambda: world.started == ["w1"])  # the saga, held in its patch
        assert recorder.applied[0].cpu == 3000
        world.resizing.discard("w1")  # every read from now on misses the patch
        world.set_demands((res(1), 1))  # ... and would take w1 to 2 CPU
        before = world.observed
        world.version += 1  # wakes the loop
        await until(lambda: world.observed >= before + 2)
        (signals,) = await count_events(
            handle, "signal_external_workflow_execution_initiated_event_attributes"
        )
        status = await handle.query(ReconcileWorkflow.status)
        recorder.hold = False
        ns = handle.id.split("/")[1]
        saga = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
        done = await saga.result()
    assert signals == 0
    assert any("would lower its target" in d.summary for d in status.decisions)
    assert done.cpu == 3000


async def test_a_target_a_saga_ended_without_is_decided_again_at_once(
    ts_env: WorkflowEnvironment,
) -> None:
    """The 100-cluster burst left a task waiting with room to grow for it: the saga's
    apply had grown the pod (Raylet and status included), and before its end reached the
    saga a read showed the pod done and short of a new task, so the loop sent the saga a
    new target. The saga, done, left it for the next tick (as designed) and ended short of
    it; but nothing changed after that to wake the loop (its wait lasts the tick), so the
    task waited. A saga that ends short of the target the loop sent it wakes the loop,
    which decides again on a fresh read: a new saga takes the pod there. (Here: w1 grows
    1 → 3 CPU for a {CPU: 2} task, which then runs elsewhere; a {CPU: 3} task needs 4.)"""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    world.quiet_wait_s = 60.0  # a quiet wait lasts the tick, as the real one does
    recorder = ResizeRecorder(world)
    recorder.hold = recorder.finishes = True
    async with reconciling(ts_env, world, recorder, tick_s=60.0) as handle:
        ns = handle.id.split("/")[1]
        # the apply grew w1 to 3 CPU and the task took it; its answer is held. The loop
        # sees the grow land and holds on until Ray has published again (a few short
        # waits), then waits quietly for a whole tick
        await until(lambda: world.started == ["w1"] and "w1" not in world.resizing)
        await until(lambda: len(world.waits) > 1 and world.waits[-1].timeout_s == 60.0)
        world.set_demands((res(3), 1))  # a new task: w1 could take it at 4 CPU
        child = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")

        async def signalled() -> bool:
            (signals,) = await count_events(child, "workflow_execution_signaled_event_attributes")
            return signals >= 1

        await until_async(signalled, "the saga was never sent the new target")
        recorder.hold = False
        first = await child.result()
        assert (first.cpu, first.attempts[-1].result) == (3000, "done")
        # the loop decides again at once, not after its 60 s tick
        await until(lambda: world.started == ["w1", "w1"], 20)
        second = await child.result()  # the new run of the same workflow id
    assert (second.from_cpu, second.cpu) == (3000, 4000)


async def test_a_grow_in_flight_is_taken_further_not_answered_with_a_new_pod(
    ts_env: WorkflowEnvironment,
) -> None:
    # issue 13: w1 (1 CPU, may grow to 4) is growing to 2 for a task when another task of
    # {CPU: 1} arrives. The running saga is sent the new target 3; no pod is launched.
    from raysize.workflows.model import KubeletResizeState, PodResize

    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder) as handle:
        ns = handle.id.split("/")[1]
        await until(lambda: "w1" in world.resizing)
        growing = PodResize(cpu=2000, memory=2 * 1024**3, state=KubeletResizeState.IN_PROGRESS)
        w1 = world.snapshot.pods[1].model_copy(update={"resize": growing})
        world.snapshot = world.snapshot.model_copy(update={"pods": (world.snapshot.pods[0], w1)})
        world.set_demands((res(2), 1), (res(1), 1))
        child = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")

        async def retargeted() -> bool:
            state = await child.query(PodResizeWorkflow.state)
            return state.cpu == 3000

        await until_async(retargeted, "the running saga was never sent the new target")
        recorder.hold = False
        state = await child.result()
        status = await status_of(handle)
    assert (state.from_cpu, state.cpu) == (1000, 3000)
    assert world.scales == []  # no pod launched
    assert status.resizes_started == 1
    assert any("retarget the grow in flight" in d.summary for d in status.decisions)


async def test_no_pod_is_launched_for_work_a_grow_just_took_that_ray_still_reports(
    ts_env: WorkflowEnvironment,
) -> None:
    # w1 (1 CPU, busy; may grow to 4) grows to 3 for a task of {CPU: 2}; the task runs
    # there, and Ray still reports it pending for a while. No pod is grown further or
    # launched for JUST_GROWN_S; the loop plans again when that ends, and then a demand
    # still reported gets its pod (w1 has room to grow by one CPU only).
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    world.stale_demand = True
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.started == ["w1"] and not world.resizing)
        grown = world.version
        await until(lambda: len([w for w in world.waits if w.gcs_version == grown]) >= 2)
        status = await status_of(handle)
        assert world.scales == [] and world.started == ["w1"]  # held
        holds = [w.timeout_s for w in world.waits if w.gcs_version == grown]
        assert all(t <= JUST_GROWN_S + 1 for t in holds)  # it plans again when the hold ends
        assert status.last_plan is not None
        assert any("after the grow of w1 landed" in n for n in status.last_plan.notes)
        await ts_env.sleep(timedelta(seconds=JUST_GROWN_S + 1))
        await until(lambda: world.scales)
    assert world.scales[0].replicas["g1"] == 2
    assert world.started == ["w1"]


async def test_tasks_waiting_inside_a_placement_group_are_not_reported_unplaceable(
    ts_env: WorkflowEnvironment,
) -> None:
    # a bundle's node died: Ray reports the group's waiting tasks with the group's own
    # resource names; no pod can offer those, and the group (not raysize) holds their room
    from raysize.workflows.resources import Resources

    pg = "6f1b4a2de0c3417a9b2c8d7e5f60718293a4"
    world = FakeWorld(snapshot([group()], [pod("w1")]))
    world.set_demands((Resources({f"CPU_group_0_{pg}": 10_000, f"bundle_group_0_{pg}": 10}), 3))
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 2)
        status = await status_of(handle)
    assert status.last_plan is not None
    assert status.last_plan.infeasible.demands == 0
    assert not any("cannot place" in n for n in status.last_plan.notes)
    assert any("wait inside their placement group" in n for n in status.last_plan.notes)
    assert world.scales == [] and not world.started


async def test_a_read_that_missed_a_finished_sagas_write_starts_no_second_saga(
    ts_env: WorkflowEnvironment,
) -> None:
    """#43 item 3: in the 1,000-cluster burst a resize ran twice, the second saga started
    within a second of the first one's end: the loop had heard the end, and the read it
    then made began after it, but came from a worker's pod cache that had not yet received
    the saga's own patch (the patch was made by the other worker), so it showed the pod
    at its old size with the demand still there. Here the saga grows w1 1 → 3 CPU and
    ends; the loop reads once after that, then a read shows the world as it was before
    the saga. The decision made on it must not start a second saga: its `from` is the
    size the last saga of the pod moved it away from, so the read is older than that
    saga's write; the loop decides again on a fresh read, which shows the pod grown."""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    before_the_saga = world.snapshot
    async with reconciling(ts_env, world) as handle:
        ns = handle.id.split("/")[1]
        await until(lambda: world.started == ["w1"])
        first = await ts_env.client.get_workflow_handle_for(
            PodResizeWorkflow.run, f"resize/{ns}/w1"
        ).result()
        assert (first.outcome, first.cpu) == (ResizeOutcome.SUCCEEDED, 3000)
        read = world.observed
        await until(lambda: world.observed >= read + 1)  # a read after the end was heard
        grown = world.snapshot

        def stale_once() -> None:  # a cache without the saga's patch, for one read
            world.snapshot = before_the_saga
            world.on_read = lambda: setattr(world, "snapshot", grown)

        world.on_read = stale_once
        world.version += 1  # wakes the loop
        read = world.observed
        await until(lambda: world.observed >= read + 3)
        status = await status_of(handle)
    assert world.started == ["w1"], "a second saga from a read that missed the first's write"
    assert any("older than the resize" in d.summary for d in status.decisions), status.decisions


async def test_a_saga_that_ends_after_a_continue_as_new_is_not_started_again(
    ts_env: WorkflowEnvironment,
) -> None:
    """The same after a continue-as-new: the run that started the saga is gone, and the
    next one never hears its end. The new run sees the grow landed, then a read from a
    cache that lags (the loop's reads alternate between two workers' caches once one
    worker is killed) shows the pod at the size the grow started from: not acted on
    either (the landing is remembered as the move, `Memory.moved`)."""
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    before_the_saga = world.snapshot
    recorder = ResizeRecorder(world)
    recorder.hold = True
    async with reconciling(ts_env, world, recorder, max_ticks_per_run=3) as handle:
        ns = handle.id.split("/")[1]
        first_run = handle.first_execution_run_id
        await until(lambda: world.started == ["w1"])  # held in its patch
        world.resizing.discard("w1")  # reads miss the patch from now on

        async def moved_on() -> bool:
            desc = await ts_env.client.get_workflow_handle(handle.id).describe()
            return desc.run_id != first_run

        while not await moved_on():  # ticks until the loop continues as new
            world.version += 1
            await asyncio.sleep(0.05)
        recorder.hold = False
        first = await ts_env.client.get_workflow_handle_for(
            PodResizeWorkflow.run, f"resize/{ns}/w1"
        ).result()
        assert first.outcome == ResizeOutcome.SUCCEEDED
        grown = world.snapshot
        # a read of the new run sees the grow landed (the loop's memory moves it from
        # growing to landed); then a read from a cache that lags shows it as before
        read = world.observed
        world.version += 1
        await until(lambda: world.observed >= read + 1 and "w1" in world.memories[-1].landed)

        def stale_once() -> None:
            world.snapshot = before_the_saga
            world.on_read = lambda: setattr(world, "snapshot", grown)

        world.on_read = stale_once
        world.version += 1
        read = world.observed
        await until(lambda: world.observed >= read + 3)
    assert world.started == ["w1"], "a second saga after the continue-as-new"
