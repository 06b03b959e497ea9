"""The reconcile loop's wait: quiet until the tick passes, awake at once when a pod of the
cluster changes or Ray cannot be read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities import cluster
from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.gcs_cadence import CLOCK_SKEW_S
from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.gcs_standin import GcsStandIn
from raysize.sandbox.ports import free_port
from raysize.workflows.contracts import Err, RayletResizeInput, WaitInput
from raysize.workflows.resources import GIB

from .test_k8s_activities import env, wait_for, workers

__all__ = ["env"]  # the sandbox with a RayCluster "rc" of two workers


def changed_by(acts: ClusterActivities) -> Callable[[WaitInput], Awaitable[bool]]:
    """The wait activity of `acts`, as whether it saw a change."""

    async def changed(inp: WaitInput) -> bool:
        return (await acts.wait_for_change(inp)).changed

    return changed


def wait_input(kube, gcs: str, timeout_s: float) -> WaitInput:
    with RayGcsClient(gcs) as ray:
        version = ray.cluster_state().fingerprint
    return WaitInput(
        namespace="default",
        cluster="rc",
        gcs_address=gcs,
        gcs_version=version,
        pods_version=kube.read_cluster("default", "rc").pods_version,
        timeout_s=timeout_s,
    )


def test_quiet_until_the_tick_then_awake_when_a_pod_changes(env):
    _, kube = env
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            started = time.monotonic()
            quiet = asyncio.run(
                ActivityEnvironment().run(changed_by(acts), wait_input(kube, gcs.address, 1.5))
            )
            assert quiet is False and time.monotonic() - started >= 1.5

            async def change_a_pod() -> bool:
                waiting = asyncio.ensure_future(
                    ActivityEnvironment().run(changed_by(acts), wait_input(kube, gcs.address, 30))
                )
                await asyncio.sleep(0.5)
                pod = workers(kube)[0]
                await asyncio.to_thread(
                    kube.core.patch_namespaced_pod,
                    pod,
                    "default",
                    {"metadata": {"labels": {"touched": "yes"}}},
                )
                return await asyncio.wait_for(waiting, 10)  # not the 30 s tick

            assert asyncio.run(change_a_pod()) is True
        finally:
            acts.close()


def test_a_pod_changed_between_the_observe_and_the_wait_wakes_it_at_once(env):
    """The wait compares the pods the observe listed with the watch's (names and
    resourceVersions, for equality: resourceVersions are opaque, never ordered), so a
    change made before the wait began counts, and a wait with none stays quiet."""
    _, kube = env
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            inp = wait_input(kube, gcs.address, 30)
            kube.core.patch_namespaced_pod(
                workers(kube)[0], "default", {"metadata": {"labels": {"touched": "before"}}}
            )
            started = time.monotonic()
            assert asyncio.run(ActivityEnvironment().run(changed_by(acts), inp)) is True
            assert time.monotonic() - started < 10  # not the 30 s tick
            fresh = wait_input(kube, gcs.address, 1.0)
            assert asyncio.run(ActivityEnvironment().run(changed_by(acts), fresh)) is False
        finally:
            acts.close()


def test_awake_at_once_when_ray_cannot_be_read(env):
    _, kube = env
    with GcsStandIn() as gcs:
        inp = wait_input(kube, gcs.address, 30)
    # the stand-in is gone: the next observe must say what is wrong, now
    acts = ClusterActivities(kube=kube, ray=RaySettings(timeout_s=1))
    try:
        inp = inp.model_copy(update={"gcs_address": f"127.0.0.1:{free_port()}"})
        started = time.monotonic()
        assert asyncio.run(ActivityEnvironment().run(changed_by(acts), inp)) is True
        assert time.monotonic() - started < 10
    finally:
        acts.close()


def wait_through(kube, tick_s: float, patch, body) -> tuple[bool, bool]:
    """Start a wait (with the RayCluster's mark of now), `patch` the RayCluster `rc` with
    `body` half a second in; (what that wait returned, what a wait started afterwards
    with the same old mark returns)."""
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            inp = wait_input(kube, gcs.address, tick_s).model_copy(
                update={"cluster_mark": kube.read_cluster("default", "rc").mark}
            )

            async def change() -> bool:
                waiting = asyncio.ensure_future(ActivityEnvironment().run(changed_by(acts), inp))
                await asyncio.sleep(0.5)
                await asyncio.to_thread(patch, "ray.io", "v1", "default", "rayclusters", "rc", body)
                return await asyncio.wait_for(waiting, 20)

            during = asyncio.run(change())
            after = asyncio.run(
                ActivityEnvironment().run(
                    changed_by(acts), inp.model_copy(update={"timeout_s": 1.0})
                )
            )
            return during, after
        finally:
            acts.close()


def test_an_edited_raycluster_wakes_the_wait(env):
    """Fixing `ray.io/ippr` (or any spec change) is noticed at once, not at the tick: the
    loop's tick is minutes long now. A wait that starts after the edit, with the mark of
    before it, returns at once."""
    _, kube = env
    body = {"metadata": {"annotations": {"ray.io/ippr": '{"groups": {}}'}}}
    # not the 60 s tick: within the 20 s wait_through allows
    assert wait_through(kube, 60, kube.custom.patch_namespaced_custom_object, body) == (
        True,
        True,
    )


def test_a_status_write_by_kuberay_wakes_nobody(env):
    _, kube = env
    body = {"status": {"reason": "touched by a test"}}
    patch = kube.custom.patch_namespaced_custom_object_status
    assert wait_through(kube, 3, patch, body) == (False, False)


def test_a_cluster_raysize_may_not_act_on_costs_its_gcs_nothing(env):
    """With a config error (or Ray's autoscaler in charge) the observe carries no Ray
    version: the wait must not read Ray at all, or it would return at once and the loop
    would spin (220 reconciles in 24 s were seen)."""
    _, kube = env
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            inp = wait_input(kube, gcs.address, 2).model_copy(
                update={"gcs_version": 0, "watch_ray": False}
            )
            before = gcs.state_reads
            assert asyncio.run(ActivityEnvironment().run(changed_by(acts), inp)) is False
            assert gcs.state_reads == before
        finally:
            acts.close()


def test_a_raylet_sync_for_a_deleted_pod_ends_instead_of_retrying_for_ever(env):
    """A RayCluster deleted mid-resize left its saga in SyncingRaylet, retrying a GCS that
    no longer existed, for good. While the pod is there, an unreachable GCS is worth
    retrying; once it is gone, the activity says PodGone and is not retried."""
    _, kube = env
    pod = workers(kube)[0]
    acts = ClusterActivities(
        kube=kube, ray=RaySettings(gcs_override=f"127.0.0.1:{free_port()}", timeout_s=0.5)
    )
    inp = RayletResizeInput(
        namespace="default", cluster="rc", pod=pod, node_id="ab" * 28, cpu=2000, memory=GIB
    )
    try:
        with pytest.raises(ApplicationError) as there:
            asyncio.run(ActivityEnvironment().run(acts.resize_raylet, inp))
        assert there.value.type == "RayUnavailable" and not there.value.non_retryable
        kube.core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
        with pytest.raises(ApplicationError) as gone:
            asyncio.run(ActivityEnvironment().run(acts.resize_raylet, inp))
        assert gone.value.type == Err.POD_GONE and gone.value.non_retryable
        assert f"default/{pod}: the pod is gone" in gone.value.message
    finally:
        acts.close()


def test_a_worker_shutting_down_ends_the_wait_at_once(env):
    """A stopping worker waited out its 10 s grace period for each cluster's wait (a
    demo's Ctrl-C took 15-27 s); now the wait ends within its next look."""
    _, kube = env
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            activity_env = ActivityEnvironment()

            async def stop_midway() -> bool:
                waiting = asyncio.ensure_future(
                    activity_env.run(changed_by(acts), wait_input(kube, gcs.address, 60))
                )
                await asyncio.sleep(1.0)
                activity_env.worker_shutdown()
                return await asyncio.wait_for(waiting, 20)  # well before the 60 s tick

            assert asyncio.run(stop_midway()) is False
        finally:
            acts.close()


def test_a_slow_gcs_never_stops_the_wait_s_heartbeats(env, monkeypatch):
    """The wait's heartbeats kept the pace of its reads: a GCS that answers in 0.8 s
    makes the pause between reads 9 times that, so no heartbeat went out for 8 s and
    more. On a loaded worker, reads this slow timed out waits by the thousand (a
    1,000-cluster fleet: 4,328 heartbeat timeouts in 5 minutes, each a failed wait, a
    back-off and a new observe). Heartbeats keep their own pace now (here every second,
    not every 10 s, to keep the test short)."""
    _, kube = env
    monkeypatch.setattr(cluster, "HEARTBEAT_EVERY_S", 1.0)
    with GcsStandIn() as gcs:
        acts = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            inp = wait_input(kube, gcs.address, 5.0)
            gcs.state_delay_s = 0.8
            reads = gcs.state_reads
            beats: list[float] = []
            activity_env = ActivityEnvironment()
            activity_env.on_heartbeat = lambda *details: beats.append(time.monotonic())
            started = time.monotonic()
            assert asyncio.run(activity_env.run(changed_by(acts), inp)) is False
            ended = time.monotonic()
            assert gcs.state_reads - reads <= 2  # the slow GCS is still spared: few reads
            gaps = [b - a for a, b in zip([started, *beats], [*beats, ended], strict=True)]
            assert max(gaps) <= 2.0, gaps
        finally:
            acts.close()


def test_a_raylet_sync_dials_the_gcs_the_raycluster_reports_now(env):
    """A worker remembered where each cluster's GCS was for its Raylet syncs, and dialled
    that address for good: a GCS reported elsewhere later (a head pod started again), or
    first seen before KubeRay reported it at all (KubeRay's default head Service, which in
    the 1,000-cluster benchmark failed a sync for 16 s on "react-head-svc.default.svc:
    Domain name not found"), was never dialled. An address that does not answer is read
    again now, and the default Service is not remembered."""
    sb, kube = env
    pod = workers(kube)[0]
    acts = ClusterActivities(kube=kube, ray=RaySettings(timeout_s=0.5))
    inp = RayletResizeInput(
        namespace="default", cluster="rc", pod=pod, node_id="ab" * 28, cpu=2000, memory=GIB
    )
    custom = client.CustomObjectsApi(kube.core.api_client)

    def reported(address: str) -> None:
        custom.patch_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "rc",
            {"metadata": {"annotations": {"touched": address}}},
        )  # fmt: skip
        wait_for(lambda: kube.read_cluster("default", "rc").gcs_address == address)

    with GcsStandIn() as gcs:
        try:
            nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
            sb.serve_gcs("default", "rc", int(nowhere.rsplit(":", 1)[1]))
            reported(nowhere)
            with pytest.raises(ApplicationError) as unanswered:
                asyncio.run(ActivityEnvironment().run(acts.resize_raylet, inp))
            assert unanswered.value.type == "RayUnavailable", unanswered.value.message
            assert nowhere in unanswered.value.message
            sb.serve_gcs("default", "rc", gcs.port)  # reported elsewhere now
            reported(gcs.address)
            result = asyncio.run(ActivityEnvironment().run(acts.resize_raylet, inp))
            assert (result.cpu, gcs.resizes) == (2000, 1)
        finally:
            acts.close()


def test_kuberay_s_default_head_service_is_not_remembered(env):
    """Until KubeRay reports the GCS, raysize dials its default head Service; a later
    Raylet sync reads the RayCluster again instead of keeping that name."""
    _, kube = env
    acts = ClusterActivities(kube=kube, ray=RaySettings(timeout_s=0.5))
    try:
        unreported = kube.read_cluster("default", "rc").model_copy(update={"gcs_address": ""})
        assert acts._address(unreported, None) == "rc-head-svc.default.svc:6379"
        reported = kube.read_cluster("default", "rc")
        assert asyncio.run(acts._address_of("default", "rc")) == reported.gcs_address != ""
    finally:
        acts.close()


def test_a_wait_returns_the_gcs_timetable_and_one_on_another_worker_starts_from_it(env):
    """A worker that learned when its GCS publishes demands returns it from its wait;
    a wait on another worker, which has not learned it, starts from it (for that GCS
    only)."""
    _, kube = env
    with GcsStandIn() as gcs:
        learner = ClusterActivities(kube=kube, ray=RaySettings())
        other = ClusterActivities(kube=kube, ray=RaySettings())
        try:
            cadence = learner.gcs(gcs.address).cadence
            now = time.monotonic()
            for k in range(3):  # publications at now - 2.67 + k, seen by reads 50 ms apart
                cadence.note(2 * k, now - 3 + k + 0.30, now - 3 + k + 0.301)
                cadence.note(2 * k + 1, now - 3 + k + 0.35, now - 3 + k + 0.351)
            inp = wait_input(kube, gcs.address, 0.2)
            done = asyncio.run(ActivityEnvironment().run(learner.wait_for_change, inp))
            learned = done.gcs_timetable
            assert not done.changed and learned is not None
            assert learned.address == gcs.address and learned.confirmed == 2
            fresh = other.gcs(gcs.address).cadence
            assert fresh.next_publication(time.monotonic()) is None
            elsewhere = learned.model_copy(update={"address": "10.9.9.9:6379"})
            for given in (None, elsewhere):
                handed = inp.model_copy(update={"gcs_timetable": given})
                asyncio.run(ActivityEnvironment().run(other.wait_for_change, handed))
                assert fresh.next_publication(time.monotonic()) is None
            handed = inp.model_copy(update={"gcs_timetable": learned})
            again = asyncio.run(ActivityEnvironment().run(other.wait_for_change, handed))
            assert again.gcs_timetable is not None and again.gcs_timetable.confirmed == 2
            at = time.monotonic()
            adopted, known = fresh.next_publication(at), cadence.next_publication(at)
            assert adopted is not None and known is not None
            # the same instant, a clock skew's doubt wider (another machine's clock)
            assert adopted[0] <= known[0] <= known[1] <= adopted[1]
            assert (adopted[1] - adopted[0]) - (known[1] - known[0]) < 2 * CLOCK_SKEW_S + 1e-3
        finally:
            learner.close()
            other.close()
