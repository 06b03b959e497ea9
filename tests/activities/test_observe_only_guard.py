"""Observe-only's second line (`activities/observe_only.py`): every activity that writes to
a pod, a Raylet or a RayCluster refuses by itself, so a bug in a workflow cannot write;
a resize saga that was in flight before the worker observed only still finishes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities.cluster import ClusterActivities
from raysize.activities.k8s import Kube
from raysize.activities.observe_only import ObserveOnly
from raysize.workflows.contracts import (
    OBSERVE_ONLY_VAR,
    Act,
    ApplyResizeInput,
    DrainInput,
    DrainTarget,
    Err,
    FinishResizeInput,
    RayletResizeInput,
    ScaleInput,
    SetStatusInput,
)
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.naming import RECONCILE_WORKFLOW, RESIZE_WORKFLOW

# what the worker registers that only reads, or only records an Event (allowed)
READS = {Act.OBSERVE, Act.WAIT_FOR_CHANGE, Act.WAIT_RESIZE, Act.EVENT}
RAYLET = "ab" * 28

# one input for each activity that writes: an activity added without a line here fails
WRITES: dict[str, Any] = {
    Act.APPLY_RESIZE: ApplyResizeInput(
        namespace="ns", pod="p", cpu=2000, memory=1, status=IpprStatus()
    ),
    Act.SET_STATUS: SetStatusInput(namespace="ns", pod="p", status=IpprStatus()),
    Act.SCALE: ScaleInput(
        namespace="ns", cluster="c", replicas={"g": 3}, workers_to_delete={}, generation=2
    ),
    Act.DRAIN: DrainInput(
        namespace="ns",
        cluster="c",
        gcs_address="127.0.0.1:1",
        targets=(DrainTarget(pod="p", node_id=RAYLET, reason="idle"),),
    ),
    Act.RESIZE_RAYLET: RayletResizeInput(
        namespace="ns", cluster="c", pod="p", node_id=RAYLET, cpu=2000, memory=1
    ),
    Act.FINISH_RESIZE: FinishResizeInput(
        namespace="ns",
        cluster="c",
        pod="p",
        node_id=RAYLET,
        cpu=2000,
        memory=1,
        status=IpprStatus(),
    ),
}


class Wrote(Exception):
    """A write got through to Kubernetes or Ray."""


class RecordingKube(Kube):
    """Every call is recorded, and fails: nothing reaches a server."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in ("calls", "core", "custom", "host", "timeout_s", "limits", "pod_watch") or (
            name.startswith("__")
        ):
            return object.__getattribute__(self, name)

        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append(name)
            raise Wrote(name)

        return call

    core = None
    custom = None
    host = "https://recording"  # where the calls would go: their threads' key
    timeout_s = 10.0
    limits = None  # no request budget: the calls are recorded, not sent
    pod_watch = None


class RecordingRay:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append(f"ray.{name}")
            raise Wrote(name)

        return call


def _activities(kube: RecordingKube, on: bool, since: datetime | None = None) -> dict[str, Any]:
    guard = ObserveOnly(on=on, since=since or datetime.now(UTC))
    cluster = ClusterActivities(kube=kube, observe_only=guard)
    cluster.gcs = lambda address, source=None, cluster=None: RecordingRay(kube.calls)  # type: ignore[method-assign]
    cluster._addresses[("ns", "c")] = "127.0.0.1:1"
    cluster._sources[("ns", "c")] = None  # the worker's own Ray token (as an observe found)
    return {activity._Definition.must_from_callable(fn).name: fn for fn in cluster.activities()}


class FakeClient:
    """What `activity.client()` answers the guard: when the saga started."""

    def __init__(self, started: datetime) -> None:
        self.started = started
        self.described = 0

    def get_workflow_handle(self, workflow_id: str, run_id: str | None = None) -> Any:
        client = self

        class Handle:
            async def describe(self) -> Any:
                client.described += 1
                return type("Desc", (), {"start_time": client.started})()

            async def fetch_history_events(self) -> Any:  # no write ran yet
                for e in ():
                    yield e

        return Handle()


def _env(workflow_type: str, client: FakeClient | None = None) -> ActivityEnvironment:
    env = ActivityEnvironment(client=client)  # type: ignore[arg-type]
    env.info = dataclasses.replace(
        env.info, workflow_type=workflow_type, workflow_id="wf", workflow_run_id="run-1"
    )
    return env


async def test_every_activity_that_writes_refuses_and_writes_nothing() -> None:
    kube = RecordingKube()
    acts = _activities(kube, on=True)
    assert set(acts) == READS | set(WRITES), "a new activity: a read, or a write to refuse?"
    client = FakeClient(datetime.now(UTC) + timedelta(seconds=5))  # a saga started after
    for name, inp in WRITES.items():
        for kind in (RECONCILE_WORKFLOW, RESIZE_WORKFLOW):
            with pytest.raises(ApplicationError) as refused:
                await _env(kind, client).run(acts[name], inp)
            assert refused.value.type == Err.OBSERVE_ONLY and refused.value.non_retryable, name
            assert f"{OBSERVE_ONLY_VAR}=true" in refused.value.message
    assert kube.calls == []  # not one write, nor even a read, reached a server


async def test_without_observe_only_the_same_calls_go_through() -> None:
    """The test above fails where the guard is missing: each write then reaches Kubernetes
    or Ray (here, the recorders)."""
    kube = RecordingKube()
    acts = _activities(kube, on=False)
    for name, inp in WRITES.items():
        before = len(kube.calls)
        try:
            await _env(RECONCILE_WORKFLOW).run(acts[name], inp)
        except Exception as exc:  # what the recorder raised, however the activity words it
            assert not isinstance(exc, ApplicationError) or exc.type != Err.OBSERVE_ONLY
        assert len(kube.calls) > before, name


async def test_a_resize_in_flight_before_observe_only_finishes() -> None:
    """A worker restarted with RAYSIZE_OBSERVE_ONLY while a resize runs: that saga goes on
    to its end or its rollback (never left half-done). A saga started after it, and the
    reconcile's own writes, are refused."""
    since = datetime.now(UTC)
    kube = RecordingKube()
    acts = _activities(kube, on=True, since=since)
    earlier = FakeClient(since - timedelta(minutes=1))
    env = _env(RESIZE_WORKFLOW, earlier)
    with pytest.raises(Wrote):  # it reached Kubernetes: let through
        await env.run(acts[Act.APPLY_RESIZE], WRITES[Act.APPLY_RESIZE])
    with pytest.raises(Wrote):
        await env.run(acts[Act.SET_STATUS], WRITES[Act.SET_STATUS])
    with pytest.raises(Wrote):
        await env.run(acts[Act.RESIZE_RAYLET], WRITES[Act.RESIZE_RAYLET])
    assert kube.calls == ["patch_resize", "set_ippr_status", "ray.resize_raylet"]
    assert earlier.described == 1  # asked once per saga run
    # the reconcile started long before, but its writes are its own decisions: refused
    with pytest.raises(ApplicationError) as refused:
        await _env(RECONCILE_WORKFLOW, earlier).run(acts[Act.SCALE], WRITES[Act.SCALE])
    assert refused.value.type == Err.OBSERVE_ONLY
    assert len(kube.calls) == 3
