"""The Kubernetes activities against the sandbox, including injected faults."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import timedelta

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities import k8s_activities
from raysize.activities.k8s import Kube
from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.k8s_errors import (
    ClusterGone,
    Conflict,
    Forbidden,
    Invalid,
    NoRoom,
    PodGone,
    Superseded,
    Unavailable,
)
from raysize.activities.k8s_objects import (
    gcs_address,
    progress_of,
    ray_container_resources,
    resize_patch,
    running_size,
)
from raysize.activities.pod_watch import PodWatch
from raysize.sandbox.faults import FaultRule
from raysize.sandbox.kubelet import KubeletTiming
from raysize.workflows.contracts import (
    ApplyResizeInput,
    Err,
    EventInput,
    FinishResizeInput,
    FinishResizeResult,
    ProgressState,
    SetStatusInput,
    WaitResizeInput,
)
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.kubelet_messages import parse_kubelet_message
from raysize.workflows.model import KubeletResizeState, PodPhase
from raysize.workflows.resources import GIB
from tests.sandbox.conftest import client_for, wait_for
from tests.sandbox.test_kubectl_and_operator import raycluster


def run(fn, inp):
    """Drive an activity as the worker would: in an activity context (heartbeats work)."""
    return asyncio.run(ActivityEnvironment().run(fn, inp))


IPPR = json.dumps(
    {"groups": {"small": {"max-cpu": "4", "max-memory": "8Gi", "resize-timeout": 60}}}
)


@pytest.fixture
def env(make_sandbox, tmp_path):
    sb = make_sandbox(
        node_cpu=8000, node_memory=32 * GIB, timing=KubeletTiming(actuation_delay_s=0.05)
    )
    api = client_for(sb, tmp_path)
    rc = raycluster(replicas=2)
    rc["metadata"]["annotations"] = {"ray.io/ippr": IPPR}
    burstable = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    burstable["resources"] = {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "2Gi"},
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "ray.io", "v1", "default", "rayclusters", rc
    )
    kube = Kube(api, timeout_s=2.0)
    wait_for(
        lambda: (
            len([p for p in kube.read_cluster("default", "rc").pods if p.phase == PodPhase.RUNNING])
            == 3
        )
    )
    yield sb, kube
    api.close()


def workers(kube):
    return sorted(p.name for p in kube.read_cluster("default", "rc").pods if p.group == "small")


def test_read_cluster_fills_the_snapshot_model(env):
    _, kube = env
    view = kube.read_cluster("default", "rc")
    assert set(view.groups.groups) == {"headgroup", "small"}
    assert view.groups.groups["small"].ippr is not None
    assert view.replicas == {"small": 2} and view.workers_to_delete == ()
    pod = next(p for p in view.pods if p.group == "small")
    assert (pod.total.cpu, pod.total.memory) == (1000, 2 * GIB)  # the limit, as Ray reads it
    assert pod.resize is None
    assert view.gcs_address.endswith(":6379")
    snap = view.snapshot()
    assert snap.name == "rc" and len(snap.pods) == 3


def test_resize_keeps_the_gap_and_reports_progress(env):
    _sb, kube = env
    acts = K8sActivities(kube)
    pod = workers(kube)[0]
    status = IpprStatus(raylet_id="abc", resizing_at=123)
    apply = ApplyResizeInput(
        namespace="default", pod=pod, cpu=3000, memory=5 * GIB, status=status, window_s=0
    )
    patched = run(acts.apply_resize, apply)  # no window: patch, record, look once
    raw = kube.get_pod("default", pod)
    res = raw["spec"]["containers"][0]["resources"]
    assert res == {
        "requests": {"cpu": "2500m", "memory": "4Gi"},
        "limits": {"cpu": "3", "memory": "5Gi"},
    }
    assert raw["status"]["qosClass"] == "Burstable"
    assert (
        IpprStatus.from_annotation(raw["metadata"]["annotations"]["ray.io/ippr-status"]) == status
    )
    progress = run(
        acts.wait_resize,
        (
            WaitResizeInput(
                namespace="default",
                pod=pod,
                cpu=3000,
                memory=5 * GIB,
                generation=patched.generation,
                poll_interval_s=0.02,
                window_s=10,
            )
        ),
    )
    assert progress.state == ProgressState.DONE
    assert (progress.cpu, progress.memory, progress.cpu_gap) == (3000, 5 * GIB, 500)
    # Asking again for the same size changes nothing: absolute targets are idempotent.
    again = run(acts.apply_resize, apply.model_copy(update={"window_s": 5}))
    assert again.generation == patched.generation
    assert again.progress.state == ProgressState.DONE


def grow_to_2_cpu(pod: str, **timing: float) -> ApplyResizeInput:
    """The apply of a grow of `pod` to 2 CPU / 3 GiB; `timing`: its poll interval and
    window."""
    status = IpprStatus(raylet_id="abc", resizing_at=123)
    return ApplyResizeInput(
        namespace="default", pod=pod, cpu=2000, memory=3 * GIB, status=status, **timing
    )


def long_activity() -> ActivityEnvironment:
    """An activity context with the saga's apply timeout: an apply begins its Raylet step
    only with time for it left (the test environment's default is 1 s)."""
    env_ = ActivityEnvironment()
    env_.info = dataclasses.replace(env_.info, start_to_close_timeout=timedelta(seconds=60))
    return env_


def finishing(pod: str) -> FinishResizeInput:
    return FinishResizeInput(
        namespace="default", cluster="rc", pod=pod, node_id="abc", cpu=2000,
        memory=3 * GIB, status=IpprStatus(raylet_id="abc"),
    )  # fmt: skip


def test_an_apply_with_finish_brings_the_raylet_up_once_the_kubelet_is_done(env):
    """The saga's happy path in one activity: patch, kubelet, then `finish_resize`'s work
    (here a stand-in for the Raylet), asked only once the pod has its size."""
    _, kube = env
    pod = workers(kube)[0]
    seen: list[ProgressState] = []

    async def finisher(inp: FinishResizeInput) -> FinishResizeResult:
        raw = kube.get_pod("default", pod)
        seen.append(progress_of(raw, inp.cpu, inp.memory, raw["metadata"]["generation"]).state)
        return FinishResizeResult(cpu=inp.cpu, memory=inp.memory)

    acts = K8sActivities(kube, finisher=finisher)
    apply = grow_to_2_cpu(pod, poll_interval_s=0.05, window_s=10)
    result = asyncio.run(
        long_activity().run(acts.apply_resize, apply.model_copy(update={"finish": finishing(pod)}))
    )
    assert result.progress.state == ProgressState.DONE
    assert result.finished == FinishResizeResult(cpu=2000, memory=3 * GIB)
    assert seen == [ProgressState.DONE]
    # not asked to finish: the saga does it (a rollback, or an older saga's apply)
    other = workers(kube)[1]
    result = run(acts.apply_resize, grow_to_2_cpu(other, poll_interval_s=0.05, window_s=10))
    assert result.progress.state == ProgressState.DONE and result.finished is None
    assert len(seen) == 1


def test_an_apply_leaves_the_raylet_to_the_saga_when_its_try_fails_or_the_kubelet_is_not_done(
    env,
):
    _, kube = env
    pod = workers(kube)[0]
    calls: list[str] = []

    async def down(inp: FinishResizeInput) -> FinishResizeResult:
        calls.append(inp.pod)
        raise ApplicationError("GCS unavailable", type="RayUnavailable")

    acts = K8sActivities(kube, finisher=down)
    apply = grow_to_2_cpu(pod, poll_interval_s=0.05, window_s=10)
    result = asyncio.run(
        long_activity().run(acts.apply_resize, apply.model_copy(update={"finish": finishing(pod)}))
    )
    assert result.progress.state == ProgressState.DONE and result.finished is None
    assert calls == [pod]
    # the kubelet not done within the window: the Raylet is not touched
    other = workers(kube)[1]
    apply = grow_to_2_cpu(other, window_s=0).model_copy(update={"finish": finishing(other)})
    result = asyncio.run(long_activity().run(acts.apply_resize, apply))
    assert result.progress.state == ProgressState.IN_PROGRESS and result.finished is None
    assert calls == [pod]


def test_an_apply_canceled_while_it_brings_the_raylet_up_ends_with_the_raylets_size(env):
    """A new target (the saga cancels the apply) while the Raylet is being brought to the
    pod's size: the Raylet step is carried through and its size reported, so the saga knows
    where the Raylet is; stopped half-way, it would not."""
    _, kube = env
    pod = workers(kube)[0]
    env_ = long_activity()

    async def main() -> object:
        called, release = asyncio.Event(), asyncio.Event()

        async def slow(inp: FinishResizeInput) -> FinishResizeResult:
            called.set()
            await release.wait()
            return FinishResizeResult(cpu=inp.cpu, memory=inp.memory)

        acts = K8sActivities(kube, finisher=slow)
        apply = grow_to_2_cpu(pod, poll_interval_s=0.05, window_s=10)
        task = asyncio.ensure_future(
            env_.run(acts.apply_resize, apply.model_copy(update={"finish": finishing(pod)}))
        )
        await asyncio.wait_for(called.wait(), 10)
        env_.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()
        release.set()
        return await asyncio.wait_for(task, 10)

    result = asyncio.run(main())
    assert result.finished == FinishResizeResult(cpu=2000, memory=3 * GIB)


def test_a_resize_behind_a_slow_api_server_keeps_heartbeating(env, monkeypatch):
    """The apply heartbeated only while it watched the kubelet: its patches, queued behind
    a saturated API server's calls in flight and then sent, went quiet for up to twice
    the call timeout, past the 15 s heartbeat timeout. Temporal then ran it again beside
    the first (4,901 times in a 1,000-cluster burst), and every repeat added to the load.
    Here each write takes 1.5 s; heartbeats every 0.5 s (not 5 s) keep the test short."""
    sb, kube = env
    monkeypatch.setattr(k8s_activities, "HEARTBEAT_EVERY_S", 0.5)
    apply = grow_to_2_cpu(workers(kube)[0], window_s=0)
    sb.faults.add(FaultRule(verb="patch", resource="*", latency_s=1.5))
    beats: list[float] = []
    activity_env = ActivityEnvironment()
    activity_env.on_heartbeat = lambda *details: beats.append(time.monotonic())
    started = time.monotonic()
    patched = asyncio.run(activity_env.run(K8sActivities(kube).apply_resize, apply))
    ended = time.monotonic()
    sb.faults.clear()
    assert ended - started >= 3.0  # the resize patch and the status write, each slow
    assert patched.generation > 0
    gaps = [b - a for a, b in zip([started, *beats], [*beats, ended], strict=True)]
    assert max(gaps) <= 1.0, gaps


def test_a_kubelet_that_finishes_just_after_the_status_write_is_heard(env, monkeypatch):
    """The apply began to listen to the pod's changes after its status write answered: a
    kubelet that finished in between, its change delivered before anyone listened, was
    heard only at the next read of the pod, after 5 s of silence (a reaction trial of the
    1,000-cluster benchmark took 5.7 s instead of 0.2). Here the write's reply is held
    until the kubelet has finished and the watch has delivered it, and the silence is
    made as long as the watch window: only a listener from before the write hears it; the
    one after hears nothing, and reads the pod when the window ends."""
    _sb, kube = env
    watch = PodWatch(kube.core)
    monkeypatch.setattr(k8s_activities, "HEARTBEAT_EVERY_S", 30.0)
    try:
        watch.cluster_pods("default", "rc", wait_s=0)  # starts the namespace's watch
        wait_for(lambda: watch.synced("default"), timeout=30)
        pod = workers(kube)[0]
        write = kube.set_ippr_status

        def cached_version() -> str | None:
            found = watch.cluster_pods("default", "rc", wait_s=0)
            records = {} if found is None else {r["metadata"]["name"]: r for r in found[0]}
            return records[pod]["metadata"]["resourceVersion"] if pod in records else None

        def write_then_hold_the_reply(*args):
            reply = write(*args)
            # the kubelet finishes, and the watch delivers it, before the reply is read
            done = wait_for(
                lambda: (
                    (p := kube.get_pod("default", pod))
                    and progress_of(p, 2000, 3 * GIB, p["metadata"]["generation"]).state
                    == ProgressState.DONE
                    and p
                ),
                timeout=10,
            )
            wait_for(lambda: cached_version() == done["metadata"]["resourceVersion"], timeout=10)
            return reply

        monkeypatch.setattr(kube, "set_ippr_status", write_then_hold_the_reply)
        find, reads = kube.find_pod, []

        def counted_find(*args):
            reads.append(args)
            return find(*args)

        monkeypatch.setattr(kube, "find_pod", counted_find)
        apply = grow_to_2_cpu(pod, poll_interval_s=30, window_s=3)
        result = run(K8sActivities(kube, pods=watch).apply_resize, apply)
        assert result.progress.state == ProgressState.DONE, result.progress
        assert reads == []  # heard from the watch, not found by a read after the silence
    finally:
        watch.close()


def test_a_resize_reads_the_pod_from_the_watch_not_the_server(env, monkeypatch):
    """With the pod watch's cache current, a resize sends its status write and its patch
    and reads the pod not once: the compare-and-set compares the watch's record and the
    patch tests its resourceVersion, and the kubelet's progress comes from the watch. A
    GET before each patch was one request in five of a resize's, and in a 1,000-cluster
    burst one worker's requests are paced by its QPS. A record that lags is refused by
    the server and read again (the next test)."""
    _sb, kube = env
    watch = PodWatch(kube.core)
    monkeypatch.setattr(kube, "pod_watch", watch)
    try:
        watch.cluster_pods("default", "rc", wait_s=0)  # starts the namespace's watch
        wait_for(lambda: watch.synced("default"), timeout=30)
        pod = workers(kube)[0]
        reads: list[tuple] = []
        for name in ("find_pod", "get_pod"):

            def counted(*args, _read=getattr(kube, name)):
                reads.append(args)
                return _read(*args)

            monkeypatch.setattr(kube, name, counted)
        apply = grow_to_2_cpu(pod, poll_interval_s=5, window_s=10)
        apply = apply.model_copy(update={"expect": ((1000, 2 * GIB),)})  # a compare-and-set
        result = run(K8sActivities(kube, pods=watch).apply_resize, apply)
        assert result.progress.state == ProgressState.DONE, result.progress
        assert reads == []
    finally:
        watch.close()


def running_ray_worker(core: client.CoreV1Api, ns: str, labels: dict | None = None) -> None:
    """Pod `ray-worker` in `ns` (a Ray container of 1 CPU / 1 GiB, Guaranteed), Running."""
    body = {
        "metadata": {"name": "ray-worker", "labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": "ray",
                    "image": "rayproject/ray:2.60.0",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                }
            ]
        },
    }
    core.create_namespaced_pod(ns, body)
    # 10 s was too short once for the real world's pod, with CI's three parts running
    wait_for(
        lambda: core.read_namespaced_pod("ray-worker", ns).status.phase == "Running", timeout=60
    )


def test_a_resize_from_the_watchs_record_is_guarded_by_its_version_in_both_worlds(
    kube, ns, monkeypatch
):
    """Both API servers apply the patch built from the pod watch's record only while the
    pod's resourceVersion is the record's. A record that lags (from before another
    client's resize to 1.2 CPU) is refused, the pod read, and the resize decided from 1
    CPU is superseded: the pod keeps its 1.2 CPU. A current record is patched with no
    read at all."""
    core = client.CoreV1Api(kube)
    running_ray_worker(core, ns, labels={"ray.io/cluster": "rc"})
    kube_ = Kube(kube, timeout_s=5.0)
    watch = PodWatch(core)
    try:
        watch.cluster_pods(ns, "rc", wait_s=0)  # starts the namespace's watch

        def record_at(size: tuple[int, int]) -> dict | None:
            r = watch.cached_pod(ns, "ray-worker")
            return r if r is not None and running_size(r) == size else None

        lagging = wait_for(lambda: record_at((1000, GIB)), timeout=30)
        Kube(kube, timeout_s=5.0).patch_resize(ns, "ray-worker", 1200, GIB)  # someone else
        wait_for(lambda: running_size(kube_.get_pod(ns, "ray-worker")) == (1200, GIB), timeout=30)
        kube_.pod_watch = watch
        with monkeypatch.context() as m:
            m.setattr(watch, "cached_pod", lambda namespace, pod: lagging)
            with pytest.raises(Superseded):
                kube_.patch_resize(ns, "ray-worker", 2000, GIB, expect=((1000, GIB),))
        assert running_size(kube_.get_pod(ns, "ray-worker")) == (1200, GIB)
        # the record caught up: the patch goes out without a read
        wait_for(lambda: record_at((1200, GIB)), timeout=30)
        reads: list[tuple] = []
        get = kube_.get_pod
        monkeypatch.setattr(kube_, "get_pod", lambda *a: reads.append(a) or get(*a))
        kube_.patch_resize(ns, "ray-worker", 1400, GIB, expect=((1200, GIB),))
        assert reads == []
        assert ray_container_resources(get(ns, "ray-worker"))["limits"]["cpu"] == "1400m"
    finally:
        watch.close()


def test_deferred_and_infeasible_progress(env):
    _, kube = env
    pod = workers(kube)[0]
    gen = kube.patch_resize("default", pod, 9000, 2 * GIB)
    progress = wait_for(
        lambda: (
            (p := kube.resize_progress("default", pod, 9000, 2 * GIB, gen)).state
            != ProgressState.IN_PROGRESS
            and p
        )
    )
    assert progress.state == ProgressState.INFEASIBLE
    assert progress.message == (
        "Node didn't have enough capacity: cpu, requested: 8500, capacity: 8000"
    )
    view = next(p for p in kube.read_cluster("default", "rc").pods if p.name == pod)
    assert view.resize is not None and view.resize.state == KubeletResizeState.INFEASIBLE
    assert pod in kube.read_cluster("default", "rc").resizing
    gen = kube.patch_resize("default", pod, 7500, 2 * GIB)
    progress = wait_for(
        lambda: (
            (p := kube.resize_progress("default", pod, 7500, 2 * GIB, gen)).state
            != ProgressState.IN_PROGRESS
            and p
        )
    )
    assert progress.state == ProgressState.DEFERRED
    assert progress.message.startswith("Node didn't have enough resource: cpu, requested: 7000")


def test_scale_is_idempotent_and_guarded(env):
    _sb, kube = env
    victim = workers(kube)[0]
    view = kube.read_cluster("default", "rc")
    assert kube.scale("default", "rc", {"small": 1}, {"small": (victim,)}, view.generation)
    wait_for(lambda: workers(kube) == [w for w in workers(kube) if w != victim])
    wait_for(lambda: len(workers(kube)) == 1)
    # The same request again (a retried activity) is a no-op, even with the old generation:
    # the victim is gone and the replicas already match.
    assert not kube.scale("default", "rc", {"small": 1}, {"small": (victim,)}, view.generation)
    stale = view.generation
    with pytest.raises(Conflict):
        kube.scale("default", "rc", {"small": 3}, {}, stale)
    fresh = kube.read_cluster("default", "rc").generation
    assert kube.scale("default", "rc", {"small": 3}, {}, fresh)
    wait_for(lambda: len(workers(kube)) == 3)
    with pytest.raises(Invalid):
        kube.scale("default", "rc", {"nope": 1}, {})


def test_events_on_pods_and_rayclusters(env):
    _, kube = env
    acts = K8sActivities(kube)
    pod = workers(kube)[0]
    run(
        acts.record_event,
        (
            EventInput(
                namespace="default",
                kind="Pod",
                name=pod,
                reason="RaysizeResize",
                message="to 2 CPU",
            )
        ),
    )
    run(
        acts.record_event,
        (
            EventInput(
                namespace="default",
                kind="RayCluster",
                name="rc",
                reason="RaysizeScale",
                message="+1",
                warning=True,
            )
        ),
    )
    events = kube.core.list_namespaced_event("default").items
    mine = {
        (e.involved_object.kind, e.reason, e.type)
        for e in events
        if e.source and e.source.component == "raysize"
    }
    assert mine == {("Pod", "RaysizeResize", "Normal"), ("RayCluster", "RaysizeScale", "Warning")}


def test_errors_are_typed(env):
    sb, kube = env
    with pytest.raises(PodGone):
        kube.patch_resize("default", "no-such-pod", 1000, GIB)
    with pytest.raises(ClusterGone):
        kube.read_cluster("default", "no-such-cluster")
    pod = workers(kube)[0]
    with pytest.raises(Invalid) as invalid:
        kube.patch_resize("default", pod, 100, GIB)  # below the 500m gap
    assert "gap" in invalid.value.message
    sb.api.deny("patch", "pods/resize")
    with pytest.raises(Forbidden) as forbidden:
        kube.patch_resize("default", pod, 2000, 2 * GIB)
    assert forbidden.value.rule == {
        "apiGroups": [""],
        "resources": ["pods/resize"],
        "verbs": ["patch"],
        "namespace": "default",
    }
    assert 'resources: ["pods/resize"], verbs: ["patch"]' in forbidden.value.message
    assert not forbidden.value.retryable
    sb.api.allow_all()
    sb.faults.add(FaultRule(verb="list", resource="pods", error_rate=1.0, codes=(500,)))
    with pytest.raises(Unavailable):
        kube.read_cluster("default", "rc")  # a failed list is an error, never "no pods"
    sb.faults.clear()
    sb.faults.add(FaultRule(verb="list", resource="pods", latency_s=3.0))
    with pytest.raises(Unavailable):
        kube.read_cluster("default", "rc")  # ... and so is a timed-out one
    sb.faults.clear()


def test_a_resize_the_server_refuses_is_invalid_with_its_message(env):
    """A 422 from the API server itself (not raysize's own gap check) is `Invalid`: kept
    verbatim, not retryable, through Kube and through the apply_resize activity."""
    _, kube = env
    kube.core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "best-effort"},
            "spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0"}]},
        },
    )
    # The pod has no resources: the patch adds requests, which would make it Burstable.
    refusal = (
        'Pod "best-effort" is invalid: spec: Invalid value: "BestEffort": '
        "Pod QOS Class may not change as a result of resizing"
    )
    with pytest.raises(Invalid) as invalid:
        kube.patch_resize("default", "best-effort", 1000, GIB)
    assert (invalid.value.message, invalid.value.status) == (refusal, 422)
    assert not invalid.value.retryable
    with pytest.raises(ApplicationError) as refused:
        run(
            K8sActivities(kube).apply_resize,
            ApplyResizeInput(
                namespace="default",
                pod="best-effort",
                cpu=1000,
                memory=GIB,
                status=IpprStatus(raylet_id="abc", resizing_at=1),
                window_s=0,
            ),
        )
    assert (refused.value.type, refused.value.message) == (Err.INVALID, refusal)
    assert refused.value.non_retryable
    # Refused before anything was written: no resize, no ippr-status annotation.
    pod = kube.get_pod("default", "best-effort")
    assert pod["metadata"]["generation"] == 1
    assert "ray.io/ippr-status" not in (pod["metadata"].get("annotations") or {})


def test_activities_raise_application_errors_with_retry_semantics(env):
    sb, kube = env
    acts = K8sActivities(kube)
    with pytest.raises(ApplicationError) as gone:
        run(acts.set_status, (SetStatusInput(namespace="default", pod="nope", status=IpprStatus())))
    assert gone.value.type == Err.POD_GONE and gone.value.non_retryable
    sb.faults.add(FaultRule(verb="patch", resource="pods", error_rate=1.0, codes=(409,)))
    with pytest.raises(ApplicationError) as conflict:
        run(
            acts.set_status,
            (SetStatusInput(namespace="default", pod=workers(kube)[0], status=IpprStatus())),
        )
    assert conflict.value.type == "Conflict" and not conflict.value.non_retryable


def test_resize_under_random_faults_converges(env):
    """With 30% of calls failing (409/429/500), retrying absolute targets reaches the goal."""
    sb, kube = env
    pods = workers(kube)
    sb.faults.add(FaultRule(verb="*", resource="pods/*", error_rate=0.3, codes=(409, 429, 500)))
    sb.faults.add(FaultRule(verb="*", resource="pods", error_rate=0.3, codes=(429, 500)))
    for pod in pods:
        for _ in range(50):
            try:
                kube.patch_resize("default", pod, 2000, 3 * GIB)
                break
            except (Conflict, Unavailable):
                continue
    sb.faults.clear()
    for pod in pods:
        wait_for(
            lambda pod=pod: (
                kube.resize_progress("default", pod, 2000, 3 * GIB, 0).state == ProgressState.DONE
            )
        )
    assert sb.faults.injected_errors > 0


def test_resize_patch_without_limits_sets_requests():
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    assert resize_patch(pod, 2500, GIB) == [
        {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "2500m"},
        {"op": "add", "path": "/spec/containers/0/resources/requests/memory", "value": "1Gi"},
    ]


def test_a_resize_above_the_nodes_room_is_infeasible_in_both_worlds(kube, ns):
    """The same over-sized resize on both worlds (the embedded server run as 1.36, and the
    real v1.36 kube-apiserver): 1.36 refuses it at admission with a 403 that is about the
    node's room, not RBAC. apply_resize reports it as Infeasible with numbers the saga
    parses, so it asks again at what fits or rolls back and scales out; the pod and its
    ray.io/ippr-status are left as they were."""
    core = client.CoreV1Api(kube)
    running_ray_worker(core, ns)
    kube_ = Kube(kube, timeout_s=5.0)
    with pytest.raises(NoRoom) as refused:
        kube_.patch_resize(ns, "ray-worker", 9000, GIB)
    assert not refused.value.retryable
    assert "missing RBAC rule" not in refused.value.message
    result = run(
        K8sActivities(kube_).apply_resize,
        ApplyResizeInput(
            namespace=ns,
            pod="ray-worker",
            cpu=9000,
            memory=GIB,
            status=IpprStatus(raylet_id="abc", resizing_at=1),
            window_s=5,
        ),
    )
    progress = result.progress
    assert (progress.state, progress.reason) == (ProgressState.INFEASIBLE, "Infeasible")
    assert progress.message == (
        'refused at admission: pods "ray-worker" is forbidden: node didn\'t have enough '
        "allocatable resources: cpu, requested: 9000, allocatable: 8000"
    )
    report = parse_kubelet_message(progress.reason, progress.message)
    assert report is not None and (report.resource, report.max_request) == ("cpu", 8000)
    pod = kube_.get_pod(ns, "ray-worker")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"
    assert result.generation == pod["metadata"]["generation"] == 1
    assert "ray.io/ippr-status" not in (pod["metadata"].get("annotations") or {})


def test_the_gcs_address_is_read_from_the_status_kuberay_writes():
    """KubeRay 1.6 names the head's GCS port `gcs`, older KubeRay `gcs-server`; the head
    service's IP comes first, the head pod's when the service has none yet."""
    v16 = {"head": {"podIP": "10.1.0.2", "serviceIP": "10.1.0.2"}, "endpoints": {"gcs": "6379"}}
    assert gcs_address({"status": v16}) == "10.1.0.2:6379"
    older = {"head": {"podIP": "10.1.0.3"}, "endpoints": {"gcs-server": "6380"}}
    assert gcs_address({"status": older}) == "10.1.0.3:6380"
    assert gcs_address({"status": {"head": {"podIP": "10.1.0.3"}}}) == ""
    assert gcs_address({}) == ""
