"""Scale-in against a scripted cluster (issue #26): drain first, remove durably, keep what
Ray refuses, never a pod being resized, a pause mid-tick, a retarget that loses its saga."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    Interceptor,
    SignalExternalWorkflowInput,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from raysize.worker.run import workflow_runner
from raysize.workflows.contracts import DrainInput, GroupRef, PodRef, ReconcileInput, Tick
from raysize.workflows.model import (
    KubeletResizeState,
    LaunchAction,
    Plan,
    PodPhase,
    PodResize,
    TerminateAction,
)
from raysize.workflows.naming import RESIZE_WORKFLOW
from raysize.workflows.reconcile_workflow import ReconcileWorkflow, clamp_launches
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.resources import GIB

from ..workflows.kit import group, pod, res, snapshot
from .fake_world import FakeWorld
from .stand_in_saga import Saga
from .test_reconcile_workflow import ResizeRecorder, reconciling, status_of, until

REFUSED = "The node to be idle terminated is no longer idle."  # Ray 2.60's own words


def decisions(status: Any) -> str:
    return "\n".join(d.summary for d in status.decisions)


async def decided(handle: WorkflowHandle[Any, Any], tick: int = 0) -> Any:
    """The status once `tick`'s decision is recorded. A write lands before its tick ends:
    the answer of the scale activity is still on its way when the test sees the write."""
    status = await status_of(handle)
    loop = asyncio.get_running_loop()
    end = loop.time() + 20
    while not any(d.tick == tick for d in status.decisions):
        assert loop.time() < end, f"tick {tick} decided nothing in 20 s: {decisions(status)!r}"
        await asyncio.sleep(0.05)
        status = await status_of(handle)
    return status


async def test_an_idle_pod_goes_only_once_ray_accepted_its_drain(
    ts_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1", idle_s=120), pod("w2", idle_s=120)]))
    world.refuse_drain = {"w2": REFUSED}
    world.scale_answer_s = 1.0  # the status is read while the write's answer is on its way
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.scales)
        status = await decided(handle)
    first = world.drains[0]
    assert [(t.pod, t.node_id) for t in first.targets] == [("w1", "raylet-w1"), ("w2", "raylet-w2")]
    assert first.targets[0].reason.startswith("raysize: idle 120s")
    scale = world.scales[0]
    assert scale.workers_to_delete == {"g1": ("w1",)}  # w2 refused: it stays, not named
    assert scale.replicas["g1"] == 1  # down by exactly the one pod named
    assert scale.pod_uids == {"w1": world.uids["w1"]}
    assert f"keep w2: Ray refused to drain it ({REFUSED})" in decisions(status)
    assert "remove w1: idle 120s ≥ 60s; Ray drained it" in decisions(status)


async def test_a_drained_pod_is_removed_though_its_first_write_failed(
    ts_env: WorkflowEnvironment,
) -> None:
    """Once Ray drained a Raylet it takes no work, and Ray reports it dead: the planner no
    longer sees an idle pod to remove. The removal is carried (across continue-as-new
    too) until a write names the pod."""
    world = FakeWorld(snapshot([group()], [pod("w1", idle_s=120), pod("w2")]))
    world.fail_scale = [ApplicationError("changed since read", type="Conflict", non_retryable=True)]

    async def raylet_dead(inp: DrainInput) -> None:
        pods = tuple(
            p.model_copy(update={"raylet_id": None, "phase": PodPhase.PENDING, "idle_s": 0})
            if p.name == "w1"
            else p
            for p in world.snapshot.pods
        )
        world.snapshot = world.snapshot.model_copy(update={"pods": pods})
        world.version += 1

    world.on_drain = raylet_dead
    async with reconciling(ts_env, world, max_ticks_per_run=1) as handle:
        await until(lambda: world.scales)
        status = await decided(handle, tick=1)  # tick 0's write failed
    assert len(world.drains) == 1  # drained once: the write is what was retried
    assert world.scales[0].workers_to_delete == {"g1": ("w1",)}
    assert world.scales[0].replicas["g1"] == 1
    assert status.ticks >= 1  # a later tick, in the next run, wrote it


async def test_a_pod_with_a_resize_in_flight_is_neither_drained_nor_removed(
    ts_env: WorkflowEnvironment,
) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1", idle_s=120), pod("w2", idle_s=120)]))
    world.resizing = {"w1"}  # Kubernetes says a resize runs on it
    world.scale_answer_s = 1.0
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.scales)
        status = await decided(handle)
    assert all(t.pod != "w1" for d in world.drains for t in d.targets)
    assert world.scales[0].workers_to_delete == {"g1": ("w2",)}
    assert "keep w1: a resize of it is in flight or just landed" in decisions(status)


async def test_a_pause_mid_tick_stops_the_rest_of_the_tick(ts_env: WorkflowEnvironment) -> None:
    """The pause lands while the tick drains: the launch of that tick is not written; the
    pod Ray drained still goes (its Raylet takes no work any more)."""
    world = FakeWorld(
        snapshot(
            [group("small", max_cpu=None), group("big", cpu=4, max_cpu=None)],
            [pod("w1", g="small", idle_s=120)],
            [(res(3), 1)],
        )
    )

    async def pause(inp: DrainInput) -> None:
        reconcile = ts_env.client.get_workflow_handle(f"reconcile/{inp.namespace}/{inp.cluster}")
        await reconcile.signal(ReconcileWorkflow.pause)

    world.on_drain = pause
    world.scale_answer_s = 1.0
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.scales)
        status = await decided(handle)
    assert status.paused
    scale = world.scales[0]
    assert scale.workers_to_delete == {"small": ("w1",)}
    assert scale.replicas == {"headgroup": 1, "small": 0, "big": 0}  # no launch
    assert "paused: the rest of tick 0's plan is not carried out" in decisions(status)
    assert "launch" not in decisions(status)


# --- the retarget that finds its saga ended ----------------------------------------------
@activity.defn(name="end-the-saga")
async def end_the_saga(workflow_id: str) -> None:
    saga: WorkflowHandle[Any, Any] = activity.client().get_workflow_handle(workflow_id)
    with contextlib.suppress(RPCError):  # ended already (a later tick's signal)
        await saga.signal(Saga.end)
    await saga.result()


class _EndSagaBeforeSignal(WorkflowOutboundInterceptor):
    async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
        # the race, made to happen: the saga ends between the failed start and the signal
        await workflow.execute_activity(
            "end-the-saga", input.workflow_id, start_to_close_timeout=timedelta(seconds=30)
        )
        await super().signal_external_workflow(input)


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_EndSagaBeforeSignal(outbound))


class EndSagaFirst(Interceptor):
    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _Inbound


@contextlib.asynccontextmanager
async def saga_ends_before_the_signal(
    env: WorkflowEnvironment, world: FakeWorld
) -> AsyncIterator[tuple[WorkflowHandle[Any, Any], WorkflowHandle[Any, Any]]]:
    """The reconcile, with a saga standing in at `resize/<ns>/w1` that ends between the
    loop's decision and its `retarget` signal (the interceptor ends it first)."""
    recorder = ResizeRecorder(world)
    queue = f"q-{uuid.uuid4()}"
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow, Saga],
        activities=[*world.activities(), *recorder.workflow_activities(), end_the_saga],
        interceptors=[EndSagaFirst()],
        max_cached_workflows=0,
        workflow_runner=workflow_runner(),
    ):
        saga = await env.client.start_workflow(Saga.run, id=f"resize/{ns}/w1", task_queue=queue)
        handle = await env.client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(namespace=ns, cluster="demo", tick_s=0.5),
            id=f"reconcile/{ns}/demo",
            task_queue=queue,
        )
        try:
            yield saga, handle
        finally:
            await handle.terminate("test over")


async def test_a_retarget_whose_saga_ended_meanwhile_does_not_fail_the_loop(
    ts_env: WorkflowEnvironment,
) -> None:
    """A new resize for w1 finds a saga running (the start is refused), and that saga
    ends before the `retarget` signal reaches it: the signal fails. That used to fail the
    reconcile workflow (the cluster unmanaged, a pause lost); now the next tick starts
    the resize on fresh state."""
    assert RESIZE_WORKFLOW != "resize-stand-in"
    world = FakeWorld(snapshot([group()], [pod("w1", free_cpu=0)], [(res(2), 1)]))
    async with saga_ends_before_the_signal(ts_env, world) as (saga, handle):
        await saga.result()  # ended by the interceptor, after the start was refused
        ticks = (await status_of(handle)).ticks
        await until(lambda: world.started == ["w1"], seconds=30)
        status = await status_of(handle)
        assert status.ticks > ticks
        assert (await handle.describe()).status.name == "RUNNING"  # type: ignore[union-attr]


async def test_a_grow_in_flight_taken_further_is_never_started_anew(
    ts_env: WorkflowEnvironment,
) -> None:
    """w1's grow to 2 CPU is in flight and more work arrives: the plan takes the grow to 3
    (`retarget`). Its saga ends before the signal: no new saga is started on that stale
    decision (it once was, after a start that raced the saga's end); the loop plans on
    what the saga left."""
    growing = PodResize(cpu=2000, memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS)
    world = FakeWorld(
        snapshot([group()], [pod("w1", free_cpu=0, resize=growing)], [(res(2), 1), (res(1), 1)])
    )
    world.resizing = {"w1"}
    async with saga_ends_before_the_signal(ts_env, world) as (saga, handle):
        await saga.result()
        ticks = (await status_of(handle)).ticks
        await until(lambda: world.observed > ticks + 4, seconds=30)
        status = await status_of(handle)
        assert world.started == []  # no saga of raysize's was ever started for w1
        assert status.resizes_started == 0
        assert (await handle.describe()).status.name == "RUNNING"  # type: ignore[union-attr]


def test_a_launch_that_needed_a_refused_pods_place_is_dropped() -> None:
    """g1 is at its maximum (2): the plan removes idle w1 and launches one for what waits.
    Ray refuses w1's drain: w1 stays, so the launch would go over the maximum."""
    at_max = Tick(refs={"w1": PodRef(group="g1")}, groups={"g1": GroupRef(pods=2, max_workers=2)})
    p = Plan(
        launch=(LaunchAction(group="g1", count=1, reason="for {CPU: 1} pending"),),
        terminate=(TerminateAction(pod="w1", group="g1", reason="idle 120s ≥ 60s"),),
    )
    assert clamp_launches(at_max, p, ["w1"]) == ()
    assert clamp_launches(at_max, p, []) == p.launch  # w1 went: its place is free
    wider = at_max.model_copy(update={"groups": {"g1": GroupRef(pods=2, max_workers=3)}})
    assert clamp_launches(wider, p, ["w1"]) == p.launch  # room under the maximum anyway
