"""The Kubernetes → planner translation on plain dicts (no API server): what the planner
is told about a pod's age, its failures and its resize."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from raysize.activities import k8s_objects
from raysize.activities.k8s_objects import pod_view, ray_autoscaler_running


def _pod(*, phase: str = "Running", start: str | None = None, status: dict | None = None) -> dict:
    pod_status: dict = {"phase": phase}
    if start is not None:
        pod_status["startTime"] = start
    annotations = {"ray.io/ippr-status": json.dumps(status)} if status else {}
    return {
        "metadata": {"name": "w1", "labels": {"ray.io/group": "g1"}, "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "ray", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
            ]
        },
        "status": pod_status,
    }


NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC).timestamp()


def test_a_running_pod_says_how_long_it_has_run() -> None:
    assert pod_view(_pod(start="2026-11-24T05:50:00Z"), now=NOW).running_s == 600
    assert pod_view(_pod(), now=NOW).running_s == 0  # no startTime yet
    assert pod_view(_pod(start="garbage"), now=NOW).running_s == 0
    pending = pod_view(_pod(phase="Pending", start="2026-11-24T05:50:00Z"), now=NOW)
    assert pending.running_s == 0


def test_a_failure_record_says_how_old_it_is() -> None:
    at = int(NOW) - 90
    view = pod_view(_pod(status={"last-failed-at": at, "last-failed-reason": "x"}), now=NOW)
    assert view.failed and view.failed_age_s == 90
    assert not pod_view(_pod(), now=NOW).failed


# --- Ray's autoscaler left running in the head (KubeRay's `autoscaler` sidecar) -------------
def _head(name: str, autoscaler_state: dict | None, node_type: str = "head") -> dict:
    statuses = [{"name": "ray-head", "state": {"running": {}}}]
    if autoscaler_state is not None:
        statuses.append({"name": "autoscaler", "state": autoscaler_state})
    return {
        "metadata": {"name": name, "labels": {"ray.io/node-type": node_type}},
        "status": {"containerStatuses": statuses},
    }


def test_the_head_whose_autoscaler_container_runs_is_named() -> None:
    assert ray_autoscaler_running([_head("h", {"running": {"startedAt": "x"}})]) == "h"


@pytest.mark.parametrize(
    "pods",
    [
        [_head("h", None)],  # no sidecar: in-tree autoscaling was never on
        [_head("h", {"terminated": {"exitCode": 0}})],  # stopped (v2: restartPolicy Never)
        [_head("h", {"waiting": {"reason": "CrashLoopBackOff"}})],
        [_head("w", {"running": {}}, node_type="worker")],  # only the head's counts
    ],
)
def test_no_running_autoscaler_container_names_no_pod(pods: list[dict]) -> None:
    assert ray_autoscaler_running(pods) == ""


# --- the pod watch's record of a pod (`compact_pod`): what an observe reads, and no more ----
def _variants() -> list[dict]:
    """Pods in each state an observe tells apart: running, pending, resizing (each
    condition, and asked but not reported), failed, being deleted, a head with Ray's
    autoscaler running or not, a pod without containers' status or resources."""
    from bench.observe_bench import kuberay_pod

    base = kuberay_pod("big", "cpu", 7)
    status = base["status"]
    ray = status["containerStatuses"][0]
    variants = [base]
    for ctype, reason in (
        ("PodResizePending", "Deferred"),
        ("PodResizePending", "Infeasible"),
        ("PodResizeInProgress", ""),
        ("PodResizeInProgress", "Error"),
    ):
        cond = {"type": ctype, "status": "True", "reason": reason, "message": "m"}
        variants.append({**base, "status": {**status, "conditions": [cond]}})
    grown = {"requests": {"cpu": "3", "memory": "4Gi"}, "limits": {"cpu": "3", "memory": "4Gi"}}
    spec = {**base["spec"], "containers": [{**base["spec"]["containers"][0], "resources": grown}]}
    variants.append({**base, "spec": spec})  # asked: spec ≠ status.resources
    noted = {"resizing-at": NOW - 5, "last-failed-at": NOW - 30, "suggested-max-cpu": "2"}
    meta = {**base["metadata"], "annotations": {"ray.io/ippr-status": json.dumps(noted)}}
    variants.append({**base, "metadata": meta})
    variants.append({**base, "status": {"phase": "Pending"}})  # no container statuses yet
    gone = {**base["metadata"], "deletionTimestamp": "2026-11-24T05:59:00Z"}
    variants.append({**base, "metadata": gone})
    head_meta = {
        **base["metadata"],
        "labels": {**base["metadata"]["labels"], "ray.io/node-type": "head"},
    }
    for state in ({"running": {"startedAt": "x"}}, {"waiting": {"reason": "CrashLoopBackOff"}}):
        sidecar = {"name": "autoscaler", "state": state, "restartCount": 3, "ready": True}
        head_status = {**status, "containerStatuses": [ray, sidecar]}
        variants.append({**base, "metadata": head_meta, "status": head_status})
    bare = {**base, "spec": {"containers": [{"name": "ray-worker"}]}}
    variants.append(
        {**bare, "status": {"phase": "Running", "containerStatuses": [{"name": "ray-worker"}]}}
    )
    return variants


@pytest.mark.parametrize("pod", _variants(), ids=lambda p: str(len(json.dumps(p))))
def test_the_watch_s_record_of_a_pod_reads_as_the_pod(pod: dict) -> None:
    """An observe from the cache sees each pod exactly as a LIST would show it: its view,
    whether it runs Ray's autoscaler, its name, UID and resourceVersion (the mark)."""
    from raysize.activities.k8s_objects import compact_pod

    record = compact_pod(pod)
    assert pod_view(record, now=NOW) == pod_view(pod, now=NOW)
    assert ray_autoscaler_running([record]) == ray_autoscaler_running([pod])
    for key in ("name", "uid", "resourceVersion", "deletionTimestamp"):
        assert record["metadata"].get(key) == pod["metadata"].get(key)
    assert len(json.dumps(record)) < len(json.dumps(pod))  # managedFields, env, … left out


def test_records_share_what_pods_have_in_common() -> None:
    """A group's pods keep one copy of their labels and container sizes: records hold
    under 1 KB a pod (a LIST's objects about 40 KB: `bench.observe_bench`), measured."""
    import tracemalloc

    from bench.observe_bench import kuberay_pod
    from raysize.activities.k8s_objects import compact_pod

    pods = [json.loads(json.dumps(kuberay_pod("big", "cpu", i))) for i in range(500)]
    tracemalloc.start()
    try:
        records = [compact_pod(p) for p in pods]
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert records[0]["metadata"]["labels"] is records[1]["metadata"]["labels"]
    assert records[0]["spec"] is records[1]["spec"]
    assert kept / len(pods) < 1024, kept / len(pods)


# --- a version of a pod read once -------------------------------------------------------------
def _versioned(rv: str, *, cpu: str = "1", status: dict | None = None, spec_cpu: str | None = None):
    pod = _pod(start="2026-11-24T05:50:00Z", status=status)
    pod["metadata"].update(uid="u-1", resourceVersion=rv)
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {"cpu": spec_cpu or cpu, "memory": "2Gi"}}
    pod["status"]["containerStatuses"] = [
        {"name": "ray", "resources": {"limits": {"cpu": cpu, "memory": "2Gi"}}}
    ]
    return pod


def test_a_version_of_a_pod_is_read_once_and_its_ages_follow_the_clock(monkeypatch) -> None:
    """An observe reads every pod each tick (5,000 pods' views took 0.3 s of a tick): a
    version seen before (uid and resourceVersion) is not read again, but how long it has
    run and how old its failure is are as of this tick, and a new version is read anew."""
    reads: list[str] = []
    read = k8s_objects._pod_view
    monkeypatch.setattr(
        k8s_objects,
        "_pod_view",
        lambda pod, now: reads.append(pod["metadata"]["uid"]) or read(pod, now),
    )
    failed = {"last-failed-at": int(NOW) - 90, "last-failed-reason": "x"}
    first = pod_view(_versioned("7", status=failed), now=NOW)
    again = pod_view(_versioned("7", status=failed), now=NOW + 10)
    assert (first.running_s, first.failed_age_s) == (600, 90)
    assert (again.running_s, again.failed_age_s) == (610, 100)
    assert again.model_copy(update={"running_s": 600, "failed_age_s": 90}) == first
    grown = pod_view(_versioned("8", cpu="2", status=failed), now=NOW + 20)
    assert (grown.total.cpu, grown.running_s) == (2000, 620)  # the new version, read
    assert len(reads) == 2  # versions 7 and 8, each once


def test_a_pod_with_a_resize_in_flight_is_read_each_time() -> None:
    """Its resize's age (`asked_s`) is read from the pod's record of when it was asked."""
    asked = {"resizing-at": int(NOW) - 5}
    pod = _versioned("9", cpu="1", spec_cpu="2", status=asked)  # asked 2, still at 1
    first, later = pod_view(pod, now=NOW), pod_view(pod, now=NOW + 3)
    assert first.resize is not None and later.resize is not None
    assert (first.resize.asked_s, later.resize.asked_s) == (5, 8)


def test_a_pod_keeps_one_view_and_none_once_the_watch_sees_it_deleted() -> None:
    """Issue #43 item 6b: views were kept by (uid, version) up to 16,384 of them, so every
    cluster created and deleted left its pods' views behind until the bound. Now one view
    a pod (its newest version), dropped when the pod watch delivers the pod's deletion."""
    from raysize.activities.pod_watch import PodWatch

    pod = _versioned("10")
    pod["metadata"]["uid"] = "u-deleted"
    pod_view(pod, now=NOW)
    pod_view(_versioned("11") | {"metadata": {**pod["metadata"], "resourceVersion": "11"}}, now=NOW)
    assert [k for k in k8s_objects._views if k == "u-deleted"] == ["u-deleted"]
    assert k8s_objects._views["u-deleted"][0] == "11"  # the newest version only
    watch = PodWatch(None)
    watch._deliver("ns", "w1", pod, pod["metadata"], True)  # the watch's DELETED event
    assert "u-deleted" not in k8s_objects._views


def test_shared_parts_no_record_holds_are_dropped(monkeypatch) -> None:
    """Issue #43 item 6b: a deleted cluster's labels stayed among the shared parts until
    10,000 had piled up. Every SHARED_SWEEP new parts, those no record holds go."""
    monkeypatch.setattr(k8s_objects, "_shared", {})
    monkeypatch.setattr(k8s_objects, "SHARED_SWEEP", 10)
    monkeypatch.setattr(k8s_objects, "_shared_added", 0)
    held = k8s_objects._share({"ray.io/cluster": "lives"})
    for i in range(8):  # parts whose records are gone at once
        k8s_objects._share({"ray.io/cluster": f"deleted-{i}"})
    assert len(k8s_objects._shared) == 9
    k8s_objects._share({"ray.io/cluster": "new"})  # the tenth: the sweep comes first
    kept = list(k8s_objects._shared.values())
    assert held in kept and {"ray.io/cluster": "new"} in kept
    assert not [p for p in kept if p["ray.io/cluster"].startswith("deleted-")]
