"""The resize saga against the real time-skipping Temporal server, with a scripted pod."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio import activity
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from raysize.worker.run import workflow_runner
from raysize.workflows.contracts import (
    Act,
    ApplyResizeInput,
    ApplyResizeResult,
    ResizeOutcome,
    ResizePhase,
    ResizeRequest,
    ResizeSagaState,
)
from raysize.workflows.naming import resize_workflow_id
from raysize.workflows.resize_workflow import PodResizeWorkflow

from .fake_cluster import FakeCluster, FakePod

GIB = 1024**3


def request(**kw: object) -> ResizeRequest:
    base: dict[str, object] = dict(
        namespace="ray",
        cluster="demo",
        pod="w1",
        group="g1",
        node_id="ab" * 28,
        from_cpu=1000,
        from_memory=2 * GIB,
        cpu=4000,
        memory=2 * GIB,
        timeout_s=60,
        reason="1 × {CPU: 2} pending",
        poll_interval_s=0.02,
        poll_window_s=0.2,
    )
    base.update(kw)
    return ResizeRequest.model_validate(base)


@asynccontextmanager
async def running(
    env: WorkflowEnvironment, cluster: FakeCluster, req: ResizeRequest, cached: bool = True
) -> AsyncIterator[WorkflowHandle[PodResizeWorkflow, ResizeSagaState]]:
    queue = f"q-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[PodResizeWorkflow],
        activities=cluster.activities(),
        max_cached_workflows=1000 if cached else 0,
        workflow_runner=workflow_runner(),  # as the worker runs them
    ):
        handle = await env.client.start_workflow(
            PodResizeWorkflow.run,
            req,
            id=f"{resize_workflow_id(req.namespace, req.pod)}-{uuid.uuid4().hex[:6]}",
            task_queue=queue,
        )
        yield handle


def activity_types(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


def workflow_tasks(history: WorkflowHistory) -> int:
    return sum(e.HasField("workflow_task_completed_event_attributes") for e in history.events)


def pod(**kw: int | str) -> FakePod:
    base: dict[str, int | str] = dict(
        cpu=1000, memory=2 * GIB, raylet_cpu=1000, raylet_memory=2 * GIB
    )
    base.update(kw)
    return FakePod(**base)


async def test_happy_path_grows_pod_then_raylet(ts_env: WorkflowEnvironment) -> None:
    cluster = FakeCluster(pod())
    async with running(ts_env, cluster, request(), cached=False) as handle:
        state = await handle.result()
        history = await handle.fetch_history()
        attrs = {p.key.name: p.value for p in (await handle.describe()).typed_search_attributes}
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (cluster.pod.cpu, cluster.pod.memory) == (4000, 2 * GIB)
    assert (cluster.pod.raylet_cpu, cluster.pod.raylet_memory) == (4000, 2 * GIB)
    assert cluster.calls == ["patch", "wait", "raylet", "status"]  # pod before Raylet
    assert cluster.statuses[0].resizing_at is not None
    assert cluster.statuses[0].raylet_id == "ab" * 28
    assert cluster.pod.status.resizing_at is None  # cleared once the Raylet has it
    assert len(history.events) <= 40
    # patch, kubelet, Raylet and final status in one activity: two workflow tasks, not
    # three (a 1,000-cluster burst is bound by workflow tasks per second)
    assert activity_types(history) == ["apply_pod_resize"]
    assert workflow_tasks(history) == 2
    assert attrs["ResizePhase"] == "Done" and attrs["ResizeOutcome"] == "Succeeded"
    assert attrs["PodName"] == "w1" and attrs["RayCluster"] == "demo"
    assert attrs["RayNamespace"] == "ray"
    assert attrs["ResizeChange"] == "grow 1 → 4 CPU"  # a column of the UI's workflow list


async def test_shrink_resizes_the_raylet_first_and_uses_what_it_applied(
    ts_env: WorkflowEnvironment,
) -> None:
    cluster = FakeCluster(pod(cpu=4000, raylet_cpu=4000, raylet_in_use_cpu=2000))
    req = request(from_cpu=4000, cpu=1000)
    async with running(ts_env, cluster, req) as handle:
        state = await handle.result()
    assert cluster.calls[:2] == ["raylet", "patch"]
    # the Raylet had 2 CPUs in use: it clamped to 2, so the pod goes to 2, not 1
    assert cluster.patches == [(2000, 2 * GIB)]
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (2000, 2000)


async def test_deferred_with_a_suggestion_retries_at_the_size_the_node_allows(
    ts_env: WorkflowEnvironment,
) -> None:
    cluster = FakeCluster(pod(node_room_cpu=3000))
    async with running(ts_env, cluster, request()) as handle:
        state = await handle.result()
    assert cluster.patches == [(4000, 2 * GIB), (3000, 2 * GIB)]
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert [a.result.split(":")[0] for a in state.attempts] == ["Deferred", "done"]
    assert cluster.pod.cpu == 3000 and cluster.pod.raylet_cpu == 3000
    assert cluster.pod.status.suggested_max_cpu == 3000


async def test_error_rolls_the_pod_back_and_records_why(ts_env: WorkflowEnvironment) -> None:
    cluster = FakeCluster(pod())
    cluster.mode = "error"
    async with running(ts_env, cluster, request()) as handle:
        state = await handle.result()
    assert state.outcome == ResizeOutcome.ROLLED_BACK
    assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (1000, 1000)
    assert cluster.pod.status.last_failed_at is not None
    assert "below current usage" in (cluster.pod.status.last_failed_reason or "")
    assert cluster.pod.status.resizing_at is None


async def test_timeout_rolls_back_without_waiting_in_real_time(
    ts_env: WorkflowEnvironment,
) -> None:
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with running(ts_env, cluster, request(timeout_s=300)) as handle:
        state = await asyncio.wait_for(handle.result(), 60)
    assert loop.time() - started < 60  # five minutes of workflow time, skipped
    assert state.outcome == ResizeOutcome.ROLLED_BACK
    assert state.detail.startswith("Pod resize timed out after 300s")
    assert cluster.pod.status.last_failed_reason == "Pod resize timed out after 300s"
    assert cluster.patches[-1] == (1000, 2 * GIB)


async def test_cancel_mid_resize_rolls_back_and_ends_canceled(
    ts_env: WorkflowEnvironment,
) -> None:
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        desc = await handle.describe()
        state = await handle.query(PodResizeWorkflow.state)
    assert desc.status is not None and desc.status.name == "CANCELED"
    assert state.outcome == ResizeOutcome.CANCELED
    assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
    assert cluster.pod.status.last_failed_reason == "canceled by operator"


async def test_pause_holds_the_saga_before_its_next_side_effect(
    ts_env: WorkflowEnvironment,
) -> None:
    cluster = FakeCluster(pod())
    cluster.finish_in_apply = False  # the Raylet is a step of its own (a worker without it)
    cluster.mode = "hang"
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        await handle.signal(PodResizeWorkflow.pause)
        cluster.mode = "done"
        for _ in range(100):
            state = await handle.query(PodResizeWorkflow.state)
            if state.phase == ResizePhase.POLLING and "raylet" not in cluster.calls:
                await asyncio.sleep(0.05)
                if cluster.pod.cpu == 4000:
                    break
        state = await handle.query(PodResizeWorkflow.state)
        assert state.paused
        assert "raylet" not in cluster.calls  # held before syncing the Raylet
        await handle.signal(PodResizeWorkflow.resume)
        final = await handle.result()
    assert final.outcome == ResizeOutcome.SUCCEEDED
    assert cluster.pod.raylet_cpu == 4000


async def test_a_pause_lets_the_step_in_flight_end_with_the_raylet_at_the_pods_size(
    ts_env: WorkflowEnvironment,
) -> None:
    """Paused while the kubelet works: the step in flight (patch, kubelet, Raylet) ends,
    so the pod and its Raylet agree, and nothing is left for the saga to do."""
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        await handle.signal(PodResizeWorkflow.pause)
        cluster.mode = "done"
        final = await asyncio.wait_for(handle.result(), 30)
    assert final.outcome == ResizeOutcome.SUCCEEDED and final.paused
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (4000, 4000)


async def test_a_raylet_step_that_fails_in_the_apply_is_run_by_the_saga(
    ts_env: WorkflowEnvironment,
) -> None:
    """The apply's try at the Raylet meets a GCS that is down: the saga's own
    finish_resize takes over, with its retries, until the Raylet has the pod's size."""
    cluster = FakeCluster(pod())
    cluster.raylet_failures = 2  # the apply's try, then the saga's first
    async with running(ts_env, cluster, request(), cached=False) as handle:
        state = await handle.result()
        history = await handle.fetch_history()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (4000, 4000)
    assert cluster.pod.status.resizing_at is None
    assert activity_types(history) == ["apply_pod_resize", "finish_resize"]


async def test_a_new_target_while_the_apply_brings_the_raylet_up_takes_the_resize_as_done(
    ts_env: WorkflowEnvironment,
) -> None:
    """A new target comes while the apply, the kubelet done, is bringing the Raylet up:
    the apply is canceled, carries its Raylet step through, and the saga takes the resize
    as done (the next tick decides on what it left). Taken as canceled instead, the saga
    would patch to the new target with a Raylet it does not know is at 4 CPU."""
    cluster = FakeCluster(pod())
    cluster.raylet_gate = asyncio.Event()
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.raylet_called.wait(), 30)
        await handle.signal(PodResizeWorkflow.retarget, request(cpu=3000))
        await asyncio.sleep(0.3)  # the cancel reaches the apply while its Raylet call runs
        cluster.raylet_gate.set()
        state = await asyncio.wait_for(handle.result(), 30)
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert (state.cpu, state.raylet_cpu) == (4000, 4000)
    assert cluster.patches == [(4000, 2 * GIB)]
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (4000, 4000)


@pytest.mark.parametrize("work_placed", [False, True])
async def test_a_cancel_after_the_apply_brought_the_raylet_up_rolls_the_raylet_back_first(
    ts_env: WorkflowEnvironment, work_placed: bool
) -> None:
    """An operator cancels while the apply, the kubelet done, brings the Raylet to 4 CPU
    (an apply hears of a cancel only at its next heartbeat). The rollback shrinks the
    Raylet first, as any shrink does: with no work on the new room, pod and Raylet go back
    to 1 CPU. If Ray already runs work on it, the Raylet keeps it, and so does the pod: a
    rollback would take the room from under that work (pod-first, it shrank the pod under
    a Raylet still at 4 CPU)."""
    cluster = FakeCluster(pod())
    cluster.raylet_gate = asyncio.Event()
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.raylet_called.wait(), 30)
        await handle.cancel()
        await asyncio.sleep(0.3)
        if work_placed:
            cluster.pod.raylet_in_use_cpu = 4000
        cluster.raylet_gate.set()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 30)
        state = await handle.query(PodResizeWorkflow.state)
    assert cluster.raylet_calls[:2] == [(4000, 2 * GIB), (1000, 2 * GIB)]
    if work_placed:
        assert state.outcome == ResizeOutcome.FAILED
        assert "Ray runs work on the new room" in state.detail
        assert cluster.patches == [(4000, 2 * GIB)]  # the pod keeps the room
        assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (4000, 4000)
        assert cluster.pod.status.last_failed_at is not None  # not grown again
    else:
        assert state.outcome == ResizeOutcome.CANCELED
        assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
        assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (1000, 1000)
        assert raylet_before_pod_on_the_way_back(cluster.calls)


def raylet_before_pod_on_the_way_back(calls: list[str]) -> bool:
    """The rollback's first Raylet call came before its patch of the pod."""
    raylets = [i for i, c in enumerate(calls) if c == "raylet"]
    patches = [i for i, c in enumerate(calls) if c == "patch"]
    return len(raylets) >= 2 and len(patches) >= 2 and raylets[1] < patches[1]


async def test_a_rollback_after_an_apply_whose_end_was_lost_brings_the_raylet_back_too(
    ts_env: WorkflowEnvironment,
) -> None:
    """The apply brings the Raylet to 4 CPU and then fails for good (its worker lost, its
    retries spent): the saga never learns where the Raylet is, and rolls back. The
    rollback's own apply first sees the kubelet still at work putting the pod back, which
    says nothing of the Raylet: the rollback brings the Raylet back to 1 CPU, first."""
    cluster = FakeCluster(pod())
    cluster.fail_after_finish = True
    cluster.raylet_gate = asyncio.Event()
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.raylet_called.wait(), 30)
        cluster.mode = "hang"  # the kubelet takes its time putting the pod back
        cluster.raylet_gate.set()
        await asyncio.sleep(1.0)  # the rollback's first window ends with the pod on its way
        cluster.mode = "done"
        state = await asyncio.wait_for(handle.result(), 30)
    assert state.outcome == ResizeOutcome.ROLLED_BACK
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (1000, 1000)
    assert cluster.raylet_calls[:2] == [(4000, 2 * GIB), (1000, 2 * GIB)]
    assert raylet_before_pod_on_the_way_back(cluster.calls)


async def test_raylet_unavailable_is_retried_until_synced(ts_env: WorkflowEnvironment) -> None:
    cluster = FakeCluster(pod())
    cluster.raylet_failures = 4
    async with running(ts_env, cluster, request()) as handle:
        state = await handle.result()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert cluster.pod.raylet_cpu == 4000


async def test_pod_deleted_mid_resize_ends_cleanly(ts_env: WorkflowEnvironment) -> None:
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        cluster.pod.gone = True
        state = await handle.result()
    assert state.outcome == ResizeOutcome.POD_GONE
    assert cluster.patches == [(4000, 2 * GIB)]


@pytest.mark.parametrize(
    ("start", "mode", "calls"),
    [
        # a shrink that succeeds: the Raylet first, the pod, the Raylet sync and status
        (dict(from_cpu=4000, cpu=2000), "done", {"raylet", "patch", "finish", "status"}),
        # a grow the kubelet fails: the pod back, then its status (no Raylet was changed)
        (dict(), "error", {"patch", "status"}),
    ],
)
async def test_every_activity_names_the_pod_uid_the_decision_was_made_on(
    ts_env: WorkflowEnvironment, start: dict[str, int], mode: str, calls: set[str]
) -> None:
    size = start.get("from_cpu", 1000)
    cluster = FakeCluster(pod(cpu=size, raylet_cpu=size, uid="uid-1"))
    cluster.mode = mode
    async with running(ts_env, cluster, request(**start, pod_uid="uid-1")) as handle:
        await handle.result()
    assert {call for call, _ in cluster.uids} == calls
    assert {uid for _, uid in cluster.uids} == {"uid-1"}


async def test_a_pod_replaced_mid_resize_ends_the_saga_as_gone(ts_env: WorkflowEnvironment) -> None:
    """The pod is deleted and created again under its name while the kubelet works: the
    saga's pod is gone. It does not wait out its timeout on the new pod, nor roll the new
    pod back to the old one's size."""
    cluster = FakeCluster(pod(uid="uid-1"))
    cluster.mode = "hang"
    async with running(ts_env, cluster, request(pod_uid="uid-1")) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        cluster.pod.uid = "uid-2"
        state = await handle.result()
    assert state.outcome == ResizeOutcome.POD_GONE
    assert cluster.patches == [(4000, 2 * GIB)]


async def test_retarget_sends_the_new_size(ts_env: WorkflowEnvironment) -> None:
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    async with running(ts_env, cluster, request()) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        await handle.signal(PodResizeWorkflow.retarget, request(cpu=3000))
        for _ in range(200):
            if len(cluster.patches) == 2:
                break
            await asyncio.sleep(0.05)
        cluster.mode = "done"
        state = await handle.result()
    assert cluster.patches == [(4000, 2 * GIB), (3000, 2 * GIB)]
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert cluster.pod.raylet_cpu == 3000


async def test_refused_resize_ends_rolled_back_with_the_failure_recorded(
    ts_env: WorkflowEnvironment,
) -> None:
    cluster = FakeCluster(pod())
    cluster.refuse_patches = True
    async with running(ts_env, cluster, request()) as handle:
        state = await handle.result()
    # the way back was refused too: not confirmed, so not "RolledBack"
    assert state.outcome == ResizeOutcome.FAILED
    assert state.detail.startswith('Kubernetes refused the resize: Pod "w1" is invalid')
    assert "rolling back failed" in state.detail
    assert cluster.pod.status.last_failed_at is not None  # never picked again
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (1000, 1000)


async def test_identical_retargets_are_no_news(ts_env: WorkflowEnvironment) -> None:
    """The reconcile sends the same target again every tick while the kubelet works: that
    neither redoes the patch nor counts as an attempt (it used to end "gave up after 3
    attempts" with no real failure)."""
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    req = request()
    async with running(ts_env, cluster, req) as handle:
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        for _ in range(5):
            await handle.signal(PodResizeWorkflow.retarget, req)
        cluster.mode = "done"
        state = await handle.result()
    assert state.outcome == ResizeOutcome.SUCCEEDED
    assert [a.result for a in state.attempts] == ["done"]
    assert cluster.patches == [(4000, 2 * GIB)]


async def test_a_retarget_during_rollback_does_not_cut_it_short(
    ts_env: WorkflowEnvironment,
) -> None:
    """The kubelet fails the resize; while it puts the pod back, new targets arrive. The
    rollback is not cut short: the saga reports RolledBack only once the kubelet has
    confirmed the starting size."""
    cluster = FakeCluster(pod())
    cluster.mode = "error"
    cluster.hold_rollback = True
    async with running(ts_env, cluster, request()) as handle:
        for _ in range(500):  # the rollback's patch has been sent
            if cluster.patches[-1:] == [(1000, 2 * GIB)]:
                break
            await asyncio.sleep(0.02)
        assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
        for cpu in (4000, 4000, 3000):
            await handle.signal(PodResizeWorkflow.retarget, request(cpu=cpu))
        await asyncio.sleep(0.5)  # a while with the kubelet still holding
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        cluster.hold_rollback = False
        state = await handle.result()
    assert state.outcome == ResizeOutcome.ROLLED_BACK
    assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
    assert (cluster.pod.spec_cpu, cluster.pod.cpu, cluster.pod.raylet_cpu) == (1000, 1000, 1000)


async def test_a_canceled_grow_in_flight_lands_before_the_rollback(
    ts_env: WorkflowEnvironment,
) -> None:
    """The operator cancels while the grow patch is on its way: the rollback's patch is
    sent only after the grow's has landed, so the pod ends at its starting size (a late
    grow used to overtake the rollback and leave the pod grown, its Raylet not)."""
    cluster = FakeCluster(pod())
    cluster.patch_in_flight_s = 1.0
    async with running(ts_env, cluster, request()) as handle:
        for _ in range(500):
            if "patch" in cluster.calls:
                break
            await asyncio.sleep(0.01)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        state = await handle.query(PodResizeWorkflow.state)
    assert state.outcome == ResizeOutcome.CANCELED
    assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
    assert (cluster.pod.spec_cpu, cluster.pod.raylet_cpu) == (1000, 1000)


async def test_a_raylet_gone_while_its_pod_stays_says_so(ts_env: WorkflowEnvironment) -> None:
    """The pod took its new size but its Raylet died before the sync: not "the pod is gone"
    (it is there), but what happened."""
    cluster = FakeCluster(pod())
    cluster.raylet_gone = True
    async with running(ts_env, cluster, request()) as handle:
        state = await handle.result()
    assert state.outcome == ResizeOutcome.RAYLET_GONE
    assert "its Raylet is gone" in state.detail and "the pod is gone" not in state.detail
    assert (cluster.pod.spec_cpu, cluster.pod.cpu) == (4000, 4000)


async def test_an_activity_that_gives_up_mid_resize_rolls_back_instead_of_failing(
    ts_env: WorkflowEnvironment,
) -> None:
    """An activity that gave up (retries spent, or an error no retry helps) used to fail
    the workflow with the patch landed: spec 4 CPU, kubelet 1 CPU, Raylet 1 CPU, and no
    workflow left on the pod. Now the saga rolls back, and ends with an outcome."""
    cluster = FakeCluster(pod())
    cluster.mode = "hang"  # the kubelet has not acted when the watch breaks
    cluster.watch_failures = 1
    async with running(ts_env, cluster, request()) as handle:
        state = await asyncio.wait_for(handle.result(), 60)
    assert state.outcome == ResizeOutcome.ROLLED_BACK
    assert state.detail.startswith("activity failed: the server has asked for the client")
    assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]  # the grow, then back
    assert (cluster.pod.spec_cpu, cluster.pod.cpu) == (1000, 1000)
    assert cluster.pod.status.resizing_at is None


async def test_a_resize_the_kubelet_finished_unseen_is_not_undone_at_the_deadline(
    ts_env: WorkflowEnvironment,
) -> None:
    """The saga's last look before its deadline sees the kubelet still at work; the kubelet
    finishes while the saga sleeps; the deadline passes. (A worker or an API server down
    over the deadline is the same: the saga wakes up past it.) It used to roll back at the
    deadline, undoing a resize that had taken and recording it as failed, so the pod was
    never grown again. Now it looks at the pod once more: done, so it goes on to the
    Raylet."""
    cluster = FakeCluster(pod())
    cluster.mode = "hang"
    cluster.finish_unseen = True
    # a 1 s timeout: the first watch (0.2 s) sees the kubelet at work, then the saga sleeps
    # until its deadline
    async with running(ts_env, cluster, request(timeout_s=1), cached=False) as handle:
        state = await asyncio.wait_for(handle.result(), 60)
    assert state.outcome == ResizeOutcome.SUCCEEDED, state.detail
    assert cluster.patches == [(4000, 2 * GIB)]  # never rolled back
    assert cluster.calls == ["patch", "wait", "wait", "raylet", "status"]  # one more look
    assert (cluster.pod.cpu, cluster.pod.raylet_cpu) == (4000, 4000)
    assert cluster.pod.status.last_failed_at is None
    assert cluster.pod.status.resizing_at is None
    assert [a.result for a in state.attempts] == ["done"]


async def test_a_resize_decided_from_a_size_the_pod_is_not_at_is_superseded_unpatched(
    ts_env: WorkflowEnvironment,
) -> None:
    """Issue #43: a settle decided on a stale read (`from = to = 1 CPU`) while the pod runs
    at 2 CPU under work. The apply is a compare-and-set: the pod is not patched, nothing is
    written, nothing rolled back, and the saga ends `Superseded` for the next tick to decide
    on a fresh read. It used to patch the live pod down to 1 CPU."""
    cluster = FakeCluster(pod(cpu=2000, raylet_cpu=2000))
    req = request(from_cpu=1000, cpu=1000, reason="Raylet out of step")
    async with running(ts_env, cluster, req, cached=False) as handle:
        state = await handle.result()
        attrs = {p.key.name: p.value for p in (await handle.describe()).typed_search_attributes}
    assert str(state.outcome) == "Superseded", state.detail
    assert cluster.calls == ["superseded"]  # no patch, no status, no Raylet, no rollback
    assert cluster.patches == [] and cluster.statuses == [] and cluster.raylet_calls == []
    assert (cluster.pod.cpu, cluster.pod.spec_cpu, cluster.pod.raylet_cpu) == (2000, 2000, 2000)
    assert [a.result for a in state.attempts] == ["superseded"]
    assert "not patched" in state.detail and "fresh read" in state.detail
    assert attrs["ResizeOutcome"] == "Superseded" and attrs["ResizePhase"] == "Done"


async def test_a_retried_attempt_may_find_the_pod_where_the_saga_put_it(
    ts_env: WorkflowEnvironment,
) -> None:
    """The compare-and-set accepts where this saga's own patches may have put the pod: the
    kubelet actuates the first attempt's size after it reported Deferred, and the second
    attempt still goes ahead (`expect` holds `from` and every size the saga asked for)."""
    cluster = FakeCluster(pod(node_room_cpu=3000))
    seen: list[ApplyResizeInput] = []
    original = cluster.activities()
    inner = next(a for a in original if getattr(a, "__name__", "") == "apply")

    @activity.defn(name=Act.APPLY_RESIZE)
    async def apply(inp: ApplyResizeInput) -> ApplyResizeResult:
        seen.append(inp)
        if len(seen) == 2:  # the node found room for the first size after all
            cluster.pod.cpu = 4000
        result: ApplyResizeResult = await inner(inp)
        return result

    others = [a for a in original if a is not inner]
    cluster.activities = lambda: [apply, *others]  # type: ignore[method-assign]
    async with running(ts_env, cluster, request()) as handle:
        state = await handle.result()
    assert [i.expect for i in seen] == [
        ((1000, 2 * GIB),),
        ((1000, 2 * GIB), (4000, 2 * GIB)),
    ]
    assert state.outcome == ResizeOutcome.SUCCEEDED, state.detail
    assert cluster.patches == [(4000, 2 * GIB), (3000, 2 * GIB)]
