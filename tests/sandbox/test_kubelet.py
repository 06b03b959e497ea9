"""The kubelet simulator where only the sandbox's knobs can set the scene.

What a real cluster can show too (deferral, retries and their order, the ticker, sidecars,
conditions and events) is in test_conformance_kubelet.py. Here: a forced retry, the
actuation delay, simulated memory usage, a node without resize support, scheduling, and a
static pod's manifest changing on its node.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raysize.sandbox.kubelet import MEMORY_USAGE_ANNOTATION, KubeletTiming, NodeSpec, cluster_ip
from raysize.sandbox.pods import MIRROR_ANNOTATION
from tests.sandbox.conftest import client_for, pod_body, wait_for

GI = 1024**3


def cpu_pod(name: str, cpu: str, **kw):
    return pod_body(
        name, requests={"cpu": cpu, "memory": "1Gi"}, limits={"cpu": cpu, "memory": "2Gi"}, **kw
    )


def cond(core, name, ctype):
    pod = core.read_namespaced_pod(name, "default")
    return next((c for c in pod.status.conditions or [] if c.type == ctype), None)


def actual_cpu(core, name):
    return (
        core.read_namespaced_pod(name, "default")
        .status.container_statuses[0]
        .resources.limits["cpu"]
    )


def set_cpu(core, name, cpu):
    return core.patch_namespaced_pod_resize(
        name,
        "default",
        [
            {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": cpu},
            {"op": "replace", "path": "/spec/containers/0/resources/limits/cpu", "value": cpu},
        ],
    )


def running(core, name):
    return wait_for(lambda: core.read_namespaced_pod(name, "default").status.phase == "Running")


@pytest.fixture
def small(make_sandbox, tmp_path):
    """One node with 4 CPUs; retries only on triggers (the ticker is far away)."""
    sb = make_sandbox(
        node_cpu=4000,
        node_memory=16 * GI,
        timing=KubeletTiming(actuation_delay_s=0.0, retry_initial_s=3600, retry_interval_s=3600),
    )
    api = client_for(sb, tmp_path)
    yield sb, client.CoreV1Api(api)
    api.close()


def test_infeasible_resize_is_not_retried(small):
    sb, core = small
    core.create_namespaced_pod("default", cpu_pod("a", "1"))
    running(core, "a")
    set_cpu(core, "a", "5")
    pending = wait_for(lambda: cond(core, "a", "PodResizePending"))
    assert (pending.reason, pending.message) == (
        "Infeasible",
        "Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000",
    )
    sb.kubelet.retry_deferred_now()
    core.create_namespaced_pod("default", cpu_pod("other", "1"))
    running(core, "other")
    core.delete_namespaced_pod("other", "default")
    time.sleep(0.2)
    assert cond(core, "a", "PodResizePending").reason == "Infeasible"
    assert actual_cpu(core, "a") == "1"


def test_actuation_delay_is_respected(make_sandbox, tmp_path):
    sb = make_sandbox(timing=KubeletTiming(actuation_delay_s=0.6))
    core = client.CoreV1Api(client_for(sb, tmp_path))
    core.create_namespaced_pod("default", cpu_pod("a", "1"))
    running(core, "a")
    started = time.monotonic()
    set_cpu(core, "a", "2")
    in_progress = wait_for(lambda: cond(core, "a", "PodResizeInProgress"))
    assert in_progress.reason is None and in_progress.observed_generation == 2
    pod = core.read_namespaced_pod("a", "default")
    assert pod.status.container_statuses[0].allocated_resources["cpu"] == "2"
    assert pod.status.observed_generation == 2
    wait_for(lambda: actual_cpu(core, "a") == "2", timeout=10)
    assert time.monotonic() - started >= 0.6
    assert cond(core, "a", "PodResizeInProgress") is None


def test_memory_limit_below_usage_is_an_error_until_usage_drops(small):
    _, core = small
    body = cpu_pod("a", "1", annotations={MEMORY_USAGE_ANNOTATION: "2560Mi"})
    body["spec"]["containers"][0]["resources"]["limits"]["memory"] = "3Gi"
    core.create_namespaced_pod("default", body)
    running(core, "a")
    core.patch_namespaced_pod_resize(
        "a",
        "default",
        [{"op": "replace", "path": "/spec/containers/0/resources/limits/memory", "value": "2Gi"}],
    )
    error = wait_for(
        lambda: (c := cond(core, "a", "PodResizeInProgress")) and c.reason == "Error" and c
    )
    assert error.message == (
        'cannot decrease memory limits: attempting to set container "c0" memory limit '
        f"({2 * GI}) below current usage ({2560 * 1024**2})"
    )
    event = wait_for(
        lambda: [
            e for e in core.list_namespaced_event("default").items if e.reason == "ResizeError"
        ]
    )[0]
    assert event.type == "Warning"
    assert json.loads(event.message.split(": ", 1)[1])["error"] == error.message
    core.patch_namespaced_pod(
        "a", "default", {"metadata": {"annotations": {MEMORY_USAGE_ANNOTATION: "512Mi"}}}
    )
    wait_for(
        lambda: (
            core.read_namespaced_pod("a", "default")
            .status.container_statuses[0]
            .resources.limits["memory"]
            == "2Gi"
        )
    )
    assert cond(core, "a", "PodResizeInProgress") is None


def test_node_without_resize_support_rejects_resizes(make_sandbox, tmp_path):
    sb = make_sandbox(node_specs=[NodeSpec("old-node", 4000, 16 * GI, supports_resize=False)])
    core = client.CoreV1Api(client_for(sb, tmp_path))
    core.create_namespaced_pod("default", cpu_pod("a", "1"))
    running(core, "a")
    with pytest.raises(ApiException) as exc:
        set_cpu(core, "a", "2")
    assert json.loads(exc.value.body)["message"] == (
        'Pod "a" is invalid: spec: Forbidden: Pod running on node without support for resize'
    )


def test_unschedulable_pod_waits_for_room(small):
    _, core = small
    core.create_namespaced_pod("default", cpu_pod("a", "3"))
    core.create_namespaced_pod("default", cpu_pod("b", "2"))
    running(core, "a")
    scheduled = wait_for(lambda: cond(core, "b", "PodScheduled"))
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert scheduled.message == "0/1 nodes are available: 1 Insufficient cpu."
    core.delete_namespaced_pod("a", "default")
    running(core, "b")


def test_static_pod_resize_is_infeasible_without_an_event(small):
    """The API refuses to resize a mirror pod, so the kubelet only meets such a resize when
    the static pod's manifest on its node changes: here, the stored pod is changed directly."""
    sb, core = small
    body = cpu_pod("static", "1", annotations={MIRROR_ANNOTATION: "0123abcd"})
    body["spec"]["nodeName"] = next(iter(sb.kubelet.nodes))  # a mirror pod is bound at birth
    core.create_namespaced_pod("default", body)
    running(core, "static")

    def manifest_changed(p):
        for part in ("requests", "limits"):
            p["spec"]["containers"][0]["resources"][part]["cpu"] = "2"
        p["metadata"]["generation"] += 1
        return p

    changed = sb.store.update("pods", "default", "static", manifest_changed)
    pending = wait_for(lambda: cond(core, "static", "PodResizePending"))
    assert (pending.status, pending.reason, pending.message) == (
        "True",
        "Infeasible",
        "In-place resize of static-pods is not supported",
    )
    assert pending.observed_generation == changed["metadata"]["generation"]
    barrier = threading.Event()
    sb.kubelet.call(barrier.set)  # the kubelet is past the resize: any event is recorded
    assert barrier.wait(10)
    assert core.list_namespaced_event("default").items == []
    assert actual_cpu(core, "static") == "1"
    assert sb.kubelet.errors == []


def test_a_failed_retry_pass_does_not_stop_the_ticker(make_sandbox, tmp_path):
    """Through an API server a retry pass can fail (a timeout, a 500): the ticker goes on,
    so a deferred resize is still picked up when room appears without any trigger."""
    sb = make_sandbox(
        node_cpu=4000,
        node_memory=16 * GI,
        timing=KubeletTiming(actuation_delay_s=0.0, retry_initial_s=0.3, retry_interval_s=0.3),
    )
    core = client.CoreV1Api(client_for(sb, tmp_path))
    core.create_namespaced_pod("default", cpu_pod("a", "1"))
    running(core, "a")
    filler = cpu_pod("filler", "3")
    filler["spec"]["activeDeadlineSeconds"] = 2
    core.create_namespaced_pod("default", filler)
    running(core, "filler")
    set_cpu(core, "a", "2")
    assert wait_for(lambda: cond(core, "a", "PodResizePending")).reason == "Deferred"
    real_pass, failed = sb.kubelet._retry_deferred, []

    def flaky_pass(trigger: str) -> None:
        if trigger == "ticker" and not failed:
            failed.append(trigger)
            raise ApiException(status=500, reason="the API server timed out")
        real_pass(trigger)

    sb.kubelet.call(lambda: setattr(sb.kubelet, "_retry_deferred", flaky_pass))
    wait_for(lambda: failed)
    # the filler's deadline frees the room; only the ticker retries the resize
    wait_for(lambda: actual_cpu(core, "a") == "2", timeout=15)
    assert cond(core, "a", "PodResizePending") is None


def _exited(sb, name: str, container: str, code: int) -> None:
    """What the runtime reports when a container's process ends by itself (a crash, the
    OOM killer): the kubelet acts on the pod's restartPolicy."""
    pod = sb.store.get("pods", "default", name)
    sb.kubelet.call(
        lambda: sb.kubelet._container_exited(
            ("default", name), pod["metadata"]["uid"], container, code
        )
    )


def test_a_crashed_container_restarts_then_backs_off(small):
    """restartPolicy Always (the default): the first crash restarts the container at once
    (restartCount 1, the crash in lastState); the next waits in CrashLoopBackOff, not
    ready, with the kubelet's BackOff event."""
    sb, core = small
    core.create_namespaced_pod("default", cpu_pod("a", "1"))
    running(core, "a")
    _exited(sb, "a", "c0", 137)

    def restarted():
        cs = core.read_namespaced_pod("a", "default").status.container_statuses[0]
        return cs if cs.restart_count == 1 else None

    cs = wait_for(restarted)
    assert cs.state.running is not None and cs.ready
    assert (cs.last_state.terminated.exit_code, cs.last_state.terminated.reason) == (137, "Error")
    _exited(sb, "a", "c0", 1)
    pod = wait_for(
        lambda: (
            (p := core.read_namespaced_pod("a", "default"))
            .status.container_statuses[0]
            .state.waiting
            and p
        )
    )
    cs = pod.status.container_statuses[0]
    assert cs.state.waiting.reason == "CrashLoopBackOff"
    assert cs.state.waiting.message.startswith("back-off 10s restarting failed container=c0")
    assert not cs.ready and cs.last_state.terminated.exit_code == 1
    ready = cond(core, "a", "Ready")
    assert (ready.status, ready.reason) == ("False", "ContainersNotReady")
    assert pod.status.phase == "Running"
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=a")
    assert "BackOff" in [e.reason for e in events.items]


def test_an_ended_container_ends_its_pod_by_restart_policy(small):
    """restartPolicy Never: a container that ends is terminated, and its pod is Failed
    (non-zero exit) and frees its room; OnFailure and exit 0: Succeeded."""
    sb, core = small
    never = cpu_pod("never", "3")
    never["spec"]["restartPolicy"] = "Never"
    core.create_namespaced_pod("default", never)
    running(core, "never")
    core.create_namespaced_pod("default", cpu_pod("waiting", "2"))  # 3 + 2 > 4 CPU
    # the condition appears once the scheduler has looked at the pod: until then, no
    wait_for(lambda: getattr(cond(core, "waiting", "PodScheduled"), "status", None) == "False")
    _exited(sb, "never", "c0", 2)
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("never", "default")).status.phase == "Failed" and p
    )
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (2, "Error")
    assert pod.status.container_statuses[0].restart_count == 0
    running(core, "waiting")  # the failed pod's room went to the waiting one
    done = cpu_pod("done", "1")
    done["spec"]["restartPolicy"] = "OnFailure"
    core.create_namespaced_pod("default", done)
    running(core, "done")
    _exited(sb, "done", "c0", 0)
    wait_for(lambda: core.read_namespaced_pod("done", "default").status.phase == "Succeeded")


def test_pod_ips_stay_valid_and_distinct_past_the_256th_pod():
    """kube-apiserver refuses a pod status whose podIP is no address (a 5,000-pod
    cluster's 256th pod was given 10.244.0.256): every IP the kubelet hands out is one,
    and no two pods share one."""
    ips = [cluster_ip(i % 20, i) for i in range(12_000)]
    assert all(ipaddress.ip_address(ip).version == 4 for ip in ips)
    assert len(set(ips)) == len(ips)
    assert cluster_ip(3, 17) == "10.244.3.17"  # a small cluster's pods as before


class CountedReads:
    """The kubelet's store, its pod reads counted."""

    def __init__(self, store: object) -> None:
        self.store, self.reads = store, 0

    def find(self, resource: str, namespace: str, name: str):
        self.reads += resource == "pods"
        return self.store.find(resource, namespace, name)  # type: ignore[attr-defined]

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_the_periodic_sync_reads_only_pods_with_a_resize_to_actuate(make_sandbox, tmp_path):
    """The periodic sync retries actuation. It reads the pods allocated a resize that is
    not actuated yet, not every pod: it read each (one GET in the real world), and at
    5,000 pods a pass outlasted its 10 s interval, so the kubelet handled nothing else and
    resizes timed out (bench.scale_bench). A stalled one is still actuated by a pass."""
    sb = make_sandbox(
        node_specs=[NodeSpec("stuck", 4000, 16 * GI, stalls_actuation=True)],
        timing=KubeletTiming(actuation_delay_s=0.0, sync_interval_s=3600),
    )
    core = client.CoreV1Api(client_for(sb, tmp_path))
    for i in range(5):
        core.create_namespaced_pod("default", cpu_pod(f"p{i}", "500m"))
    for i in range(5):
        running(core, f"p{i}")
    kubelet = sb.kubelet
    counted = CountedReads(kubelet.store)

    def sync_pass() -> int:
        done = threading.Event()

        def run() -> None:
            kubelet.store = counted
            before = counted.reads
            try:
                kubelet._sync_pass()
            finally:
                kubelet.store = counted.store
                counted.last = counted.reads - before  # type: ignore[attr-defined]
                done.set()

        kubelet.call(run)  # on the kubelet's thread, where its state lives
        assert done.wait(10)
        return counted.last  # type: ignore[attr-defined]

    assert sync_pass() == 0  # five running pods, no resize: nothing to read
    set_cpu(core, "p0", "1")
    wait_for(lambda: (c := cond(core, "p0", "PodResizeInProgress")) is not None and c)
    assert actual_cpu(core, "p0") == "500m"  # allocated; the runtime stalls
    assert sync_pass() == 1  # only the pod with a resize to actuate
    kubelet.call(lambda: kubelet.nodes.update(stuck=NodeSpec("stuck", 4000, 16 * GI)))
    assert sync_pass() == 1
    wait_for(lambda: actual_cpu(core, "p0") == "1")  # the pass actuated it
    assert sync_pass() == 0
