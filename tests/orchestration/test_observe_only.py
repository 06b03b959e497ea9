"""Observe-only (RAYSIZE_OBSERVE_ONLY) in the reconcile loop, against the real time-skipping
server with a scripted cluster: the loop plans and records as usual, says what it would do
once, acts on nothing, and acts again on the first tick after it is switched off."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.histories import local_activity, local_result
from raysize.activities.k8s import DEFAULT_TIMEOUT_S, Kube
from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.observe_only import ObserveOnly
from raysize.workflows.contracts import Act, Err, SetStatusInput
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.naming import RESIZE_WORKFLOW
from raysize.workflows.resize_workflow import PodResizeWorkflow

from ..workflows.kit import group, pod, res, snapshot
from .fake_world import FakeWorld
from .test_reconcile_workflow import ResizeRecorder, reconciling, status_of, until


def _cluster() -> FakeWorld:
    """w1 runs work and can grow for a pending 2-CPU task; w2 idle past the timeout."""
    return FakeWorld(
        snapshot([group()], [pod("w1", free_cpu=0), pod("w2", idle_s=120)], [(res(2), 1)])
    )


async def observed_ticks(handle: WorkflowHandle) -> list[dict[str, object]]:
    """The observe results in the loop's history: the ticks as recorded."""
    history = await handle.fetch_history()
    # the observe is a local activity: its result is in its marker
    return [
        local_result(e)
        for e in history.events
        if local_activity(e) == Act.OBSERVE and local_result(e) is not None
    ]


async def test_observe_only_says_what_it_would_do_once_and_does_nothing(
    ts_env: WorkflowEnvironment,
) -> None:
    world = _cluster()
    world.observe_only = True
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 8)
        status = await status_of(handle)
        # nothing carried out: no resize, no drain, no scaling
        assert world.started == [] and world.drains == [] and world.scales == []
        assert status.observe_only and status.resizes_started == 0
        # said once, in eight ticks: the mode, then each kind of action it would take
        assert [e.reason for e in world.events] == ["ObserveOnly", "WouldResize", "WouldScaleIn"]
        would = {e.reason: e.message for e in world.events}
        assert would["WouldResize"].startswith("observe-only, nothing was changed: would grow w1")
        assert would["WouldScaleIn"].startswith(
            "observe-only, nothing was changed: would remove w2"
        )
        # `raysize status` and the query: the mode, the plan it did not carry out
        assert [line.split(":")[0] for line in status.would] == [
            "would grow w1 1 → 3 CPU",
            "would remove w2",
        ]
        assert status.last_plan is not None and [r.pod for r in status.last_plan.resize] == ["w1"]
        observe_only_decisions = [d for d in status.decisions if "observe-only" in d.summary]
        assert len(observe_only_decisions) == 2  # the switch, and the plan (once)
        # every tick's decision is in the history: the observe's recorded result
        ticks = await observed_ticks(handle)
        assert len(ticks) >= 8 and all(t["observe_only"] and t["plan"] is None for t in ticks)
        assert all(t["would"]["lines"] == list(status.would) for t in ticks)  # type: ignore[index]

        # the worker restarted without it: the next tick acts
        world.observe_only = False
        world.version += 1
        await until(lambda: (world.started and world.scales) or world.observed > 60)
        status = await status_of(handle)
    assert world.started == ["w1"] and world.drains and world.scales
    assert world.scales[0].workers_to_delete == {"g1": ("w2",)}
    assert not status.observe_only and status.would == ()
    reasons = [e.reason for e in world.events]
    assert reasons[3] == "ObserveOnlyEnded" and "Reconciled" in reasons[4:]


async def test_beside_ray_s_autoscaler_it_says_what_it_would_do(
    ts_env: WorkflowEnvironment,
) -> None:
    """Ray's in-tree autoscaler owns the cluster: observe-only still plans (it writes
    nothing, so the two cannot undo each other's work), and its waits read Ray."""
    world = _cluster()
    world.in_tree_autoscaling = True
    world.observe_only = True
    async with reconciling(ts_env, world) as handle:
        await until(lambda: world.observed >= 4)
        status = await status_of(handle)
    assert world.started == [] and world.drains == [] and world.scales == []
    reasons = [e.reason for e in world.events]
    assert reasons == ["ObserveOnly", "InTreeAutoscaling", "WouldResize", "WouldScaleIn"]
    assert status.stood_down and status.observe_only and len(status.would) == 2
    assert world.waits and all(w.watch_ray for w in world.waits)


async def test_a_resize_in_flight_when_observe_only_begins_finishes(
    ts_env: WorkflowEnvironment,
) -> None:
    """Observe-only turned on while a resize saga runs: the loop starts nothing more and
    says the saga goes on; the saga finishes as it would have (its activities let a saga
    that began before observe-only go on: tests/activities/test_observe_only_guard.py)."""
    world = _cluster()
    recorder = ResizeRecorder(world)
    recorder.hold = True  # the kubelet takes its time
    async with reconciling(ts_env, world, recorder) as handle:
        await until(lambda: world.started == ["w1"])
        world.observe_only = True
        world.version += 1
        await until(lambda: any(e.reason == "ObserveOnly" for e in world.events))
        (switch,) = [e for e in world.events if e.reason == "ObserveOnly"]
        assert "the resizes in flight (w1) finish or roll back as usual" in switch.message
        recorder.hold = False
        ns = handle.id.split("/")[1]
        saga = ts_env.client.get_workflow_handle_for(PodResizeWorkflow.run, f"resize/{ns}/w1")
        state = await saga.result()
        observed = world.observed
        await until(lambda: world.observed >= observed + 4)
        status = await status_of(handle)
    assert state.outcome.value == "Succeeded" and (state.from_cpu, state.cpu) == (1000, 3000)
    assert world.started == ["w1"] and status.resizes_started == 1
    assert status.observe_only


@workflow.defn(name=RESIZE_WORKFLOW)
class Writes:
    """A resize saga reduced to pod writes (`set_ippr_status`), one on each task queue
    given: what each worker answered."""

    @workflow.run
    async def run(self, queues: list[str]) -> list[str]:
        out = []
        for queue in queues:
            try:
                await workflow.execute_activity(
                    Act.SET_STATUS,
                    SetStatusInput(namespace="ns", pod="p", status=IpprStatus()),
                    task_queue=queue,
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                )
                out.append("written")
            except ActivityError as exc:
                assert isinstance(exc.cause, ApplicationError)
                out.append(exc.cause.type or "")
        return out


class StatusRecorder(Kube):
    host = "https://recorder"  # the key of its calls' threads (activities/targets.py)
    timeout_s = 10.0

    def __init__(self) -> None:
        self.written: list[str] = []

    def set_ippr_status(self, namespace: str, pod: str, status: object, uid: str = "") -> dict:
        self.written.append(pod)
        return {}


async def test_the_activities_ask_temporal_whether_a_saga_may_go_on(
    ts_env: WorkflowEnvironment,
) -> None:
    """The refusal's exception, against the real server: a saga that began before the
    worker observed only writes (it finishes or rolls back as it would have); one that
    began after is refused before it writes, unless a worker that still acts (beside it
    in a rolling restart) has written for it already."""
    hour = timedelta(hours=1)
    acting, observing = StatusRecorder(), StatusRecorder()
    q = {name: f"{name}-{uuid.uuid4()}" for name in ("acting", "before", "after")}
    workers = [
        Worker(
            ts_env.client, task_queue=q["acting"], activities=[K8sActivities(acting).set_status]
        ),
        Worker(
            ts_env.client,
            task_queue=q["before"],
            workflows=[Writes],
            workflow_runner=UnsandboxedWorkflowRunner(),
            activities=[
                K8sActivities(
                    observing, observe_only=ObserveOnly(on=True, since=datetime.now(UTC) + hour)
                ).set_status
            ],
        ),
        Worker(
            ts_env.client,
            task_queue=q["after"],
            activities=[
                K8sActivities(
                    observing, observe_only=ObserveOnly(on=True, since=datetime.now(UTC) - hour)
                ).set_status
            ],
        ),
    ]
    async with contextlib.AsyncExitStack() as stack:
        for w in workers:
            await stack.enter_async_context(w)

        async def saga(*queues: str) -> list[str]:
            return await ts_env.client.execute_workflow(
                Writes.run,
                [q[name] for name in queues],
                id=f"resize/ns/{uuid.uuid4().hex[:6]}",
                task_queue=q["before"],
            )

        assert await saga("before", "before") == ["written", "written"]  # in flight before
        assert await saga("after", "after") == [Err.OBSERVE_ONLY, Err.OBSERVE_ONLY]
        assert await saga("acting", "after") == ["written", "written"]  # begun elsewhere
    assert observing.written == ["p", "p", "p"] and acting.written == ["p"]


async def test_an_event_has_room_for_a_call_queued_behind_a_saturated_api_server(
    ts_env: WorkflowEnvironment,
) -> None:
    """A Kubernetes call may wait its timeout behind the API server's calls in flight,
    then take as long again. An Event given 10 s was timed out and sent again beside
    itself, adding to the load (3,161 times in a 1,000-cluster burst)."""
    world = _cluster()
    world.observe_only = True  # says so in an Event at once
    async with reconciling(ts_env, world):
        await until(lambda: len(world.events) >= 1)
    # as the Event's (local) activity was given it
    timeouts = [t for t in world.event_timeouts if t is not None]
    assert timeouts and min(timeouts) >= 2 * timedelta(seconds=DEFAULT_TIMEOUT_S), timeouts
