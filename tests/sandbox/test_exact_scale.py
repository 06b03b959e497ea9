"""Exact scale-in writes (issue #26 item 2), in both worlds with KubeRay (the real operator
in the real world): `replicas` goes down by exactly the pods named, stale names leave
`workersToDelete`, and the write is guarded by the spec's generation, not its
resourceVersion."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from raysize.activities import pod_watch
from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import Conflict
from raysize.activities.pod_watch import PodWatch
from tests.sandbox.conftest import wait_for
from tests.sandbox.test_kubectl_and_operator import raycluster

CO = ("ray.io", "v1")


def worker_pods(core: client.CoreV1Api, ns: str) -> dict[str, str]:
    """Live worker pods: name → UID."""
    pods = core.list_namespaced_pod(ns, label_selector="ray.io/cluster=rc,ray.io/node-type=worker")
    return {
        p.metadata.name: p.metadata.uid for p in pods.items if not p.metadata.deletion_timestamp
    }


def workers_if(
    core: client.CoreV1Api, ns: str, ok: Callable[[dict[str, str]], bool]
) -> dict[str, str] | None:
    w = worker_pods(core, ns)
    return w if ok(w) else None


def spec_of(co: client.CustomObjectsApi, ns: str) -> dict:
    rc = co.get_namespaced_custom_object(*CO, ns, "rayclusters", "rc")
    group = rc["spec"]["workerGroupSpecs"][0]
    return {
        "replicas": group["replicas"],
        "workersToDelete": (group.get("scaleStrategy") or {}).get("workersToDelete") or [],
        "generation": rc["metadata"]["generation"],
    }


def remove_one(kuberay: Kube, ns: str, pod: str, generation: int, uid: str) -> bool:
    """What the reconcile writes to remove `pod` (of UID `uid`) from the two workers."""
    return kuberay.scale(
        ns, "rc", {"small": 1}, {"small": (pod,)}, generation=generation, pod_uids={pod: uid}
    )


@pytest.fixture
def two_workers(kube: client.ApiClient, ns: str) -> tuple[Kube, dict[str, str]]:
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        *CO, ns, "rayclusters", raycluster(replicas=2)
    )
    core = client.CoreV1Api(kube)
    pods = wait_for(lambda: workers_if(core, ns, lambda w: len(w) == 2), timeout=60)
    return Kube(kube, timeout_s=5.0), pods


def test_a_pod_replaced_before_the_write_keeps_its_replica(
    kube: client.ApiClient, ns: str, two_workers: tuple[Kube, dict[str, str]]
) -> None:
    """The plan removes idle pod A; before the write lands, A is deleted and KubeRay
    replaces it with A'. Lowering `replicas` anyway (as raysize did) makes KubeRay, with
    enableInTreeAutoscaling off, delete a pod of its own choosing: B or A', maybe busy."""
    kuberay, pods = two_workers
    core, co = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    decided = kuberay.read_cluster(ns, "rc")  # what the decision was made on
    victim, _other = sorted(pods)
    core.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
    now = wait_for(
        lambda: workers_if(core, ns, lambda w: len(w) == 2 and victim not in w), timeout=60
    )
    # nothing to write: the pod named is gone, its replica stays
    assert remove_one(kuberay, ns, victim, decided.generation, pods[victim]) is False
    time.sleep(3)  # several of KubeRay's reconciles (each change of a pod is one)
    assert worker_pods(core, ns) == now  # B and A' both kept
    assert spec_of(co, ns)["replicas"] == 2
    assert spec_of(co, ns)["workersToDelete"] == []


def test_a_pod_is_named_only_with_the_uid_decided_on(
    kube: client.ApiClient, ns: str, two_workers: tuple[Kube, dict[str, str]]
) -> None:
    kuberay, pods = two_workers
    core, co = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    decided = kuberay.read_cluster(ns, "rc")
    victim, other = sorted(pods)
    # a pod of the same name, not the one decided on: it must not be named
    assert remove_one(kuberay, ns, victim, decided.generation, "another-uid") is False
    assert spec_of(co, ns)["replicas"] == 2
    # the one decided on: named, and exactly one replica less
    assert remove_one(kuberay, ns, victim, decided.generation, pods[victim])
    assert spec_of(co, ns)["replicas"] == 1
    wait_for(lambda: worker_pods(core, ns) == {other: pods[other]}, timeout=60)
    time.sleep(2)
    assert worker_pods(core, ns) == {other: pods[other]}


def test_names_of_pods_that_are_gone_leave_workers_to_delete(
    kube: client.ApiClient, ns: str, two_workers: tuple[Kube, dict[str, str]]
) -> None:
    """KubeRay v1.6 deletes the pods named and leaves the list as it is, deleting every
    listed name again on each reconcile: a name left there would delete a later pod of
    that name at birth. The next write leaves out every name whose pod is gone."""
    kuberay, pods = two_workers
    core, co = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    victim, other = sorted(pods)
    decided = kuberay.read_cluster(ns, "rc")
    assert kuberay.scale(
        ns, "rc", {"small": 1}, {"small": (victim,)}, generation=decided.generation
    )
    wait_for(lambda: victim not in worker_pods(core, ns), timeout=60)
    time.sleep(2)
    assert spec_of(co, ns)["workersToDelete"] == [victim]  # KubeRay leaves it there
    later = kuberay.read_cluster(ns, "rc")
    assert later.stale_to_delete == (victim,)
    assert kuberay.scale(ns, "rc", {"small": 2}, {}, generation=later.generation)
    assert spec_of(co, ns)["workersToDelete"] == []
    assert kuberay.read_cluster(ns, "rc").stale_to_delete == ()
    wait_for(lambda: len(worker_pods(core, ns)) == 2, timeout=60)
    assert other in worker_pods(core, ns)


def test_the_write_is_guarded_by_the_spec_generation(
    kube: client.ApiClient, ns: str, two_workers: tuple[Kube, dict[str, str]]
) -> None:
    kuberay, _pods = two_workers
    co = client.CustomObjectsApi(kube)
    decided = kuberay.read_cluster(ns, "rc")
    # KubeRay writes the status all the time: resourceVersion moves, the spec does not
    co.patch_namespaced_custom_object_status(
        *CO, ns, "rayclusters", "rc", {"status": {"reason": "a status write"}}
    )
    assert kuberay.read_cluster(ns, "rc").resource_version != decided.resource_version
    assert kuberay.scale(ns, "rc", {"small": 3}, {}, generation=decided.generation)
    assert spec_of(co, ns)["replicas"] == 3
    # a retried activity after its write landed: the cluster says so, a no-op
    assert not kuberay.scale(ns, "rc", {"small": 3}, {}, generation=decided.generation)
    # anyone else's change to the spec since the read: refused
    with pytest.raises(Conflict, match="spec changed since it was read"):
        kuberay.scale(ns, "rc", {"small": 1}, {}, generation=decided.generation)
    assert spec_of(co, ns)["replicas"] == 3


def test_the_scale_reads_the_pods_metadata_only(
    kube: client.ApiClient, ns: str, two_workers: tuple[Kube, dict[str, str]]
) -> None:
    """`Kube.scale` reads only names, UIDs, labels and deletions: asked as a
    PartialObjectMetadataList, both servers send the pods' metadata and nothing of their
    spec or status (5,000 whole KubeRay pods are about 200 MB of JSON), and it marks the
    pods as the whole list does."""
    kuberay, pods = two_workers

    def between_two_same_marks() -> tuple[list[Any], str, list[Any], str] | None:
        # the kubelet and KubeRay still write the new pods' status: the two reads are
        # compared only when no pod changed around them (resourceVersions never go back)
        metas, mark = kuberay.list_cluster_pod_metadata(ns, "rc")
        whole, whole_mark = kuberay.list_cluster_pods(ns, "rc")
        _, after = kuberay.list_cluster_pod_metadata(ns, "rc")
        return (metas, mark, whole, whole_mark) if after == mark else None

    metas, mark, whole, whole_mark = wait_for(between_two_same_marks, timeout=30)
    assert {m["name"]: m["uid"] for m in metas if m["name"] in pods} == pods
    assert sorted(m["name"] for m in metas) == sorted(p["metadata"]["name"] for p in whole)
    assert mark == whole_mark
    assert all(m["labels"]["ray.io/cluster"] == "rc" for m in metas)
    raw = client.CoreV1Api(kube).list_namespaced_pod(
        ns,
        label_selector="ray.io/cluster=rc",
        _headers={"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"},
        _preload_content=False,
    )
    doc = json.loads(raw.data)
    assert (doc["kind"], doc["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert doc["metadata"]["resourceVersion"]
    assert {item["kind"] for item in doc["items"]} == {"PartialObjectMetadata"}
    assert all(set(item) == {"kind", "apiVersion", "metadata"} for item in doc["items"])


class Watched:
    """`Kube` with a synced pod watch, as the worker has it, counting the scale's LISTs;
    `stall()` holds the watch's events back (a watch that lags: a starved thread, a slow
    connection) until `flow()`."""

    def __init__(self, kube: Kube, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.flowing = threading.Event()
        self.flowing.set()
        self.lists = 0
        original = pod_watch._RawWatch.stream
        flowing = self.flowing

        def stream(w: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            for ev in original(w, *args, **kwargs):
                flowing.wait()
                yield ev

        monkeypatch.setattr(pod_watch._RawWatch, "stream", stream)
        listing = kube.list_cluster_pod_metadata

        def counted(*args: Any) -> Any:
            self.lists += 1
            return listing(*args)

        monkeypatch.setattr(kube, "list_cluster_pod_metadata", counted)
        self.watch = PodWatch(kube.core)
        kube.pod_watch = self.watch
        self.watch.cluster_pods(ns, "rc", wait_s=0)  # starts the namespace's watch
        wait_for(lambda: self.watch.synced(ns) or None, timeout=30)

    def cached(self, ns: str) -> set[str]:
        """The names of the pods in the watch's cache (none while it cannot answer)."""
        found = self.watch.cluster_pods(ns, "rc", wait_s=0)
        return set() if found is None else {p["metadata"]["name"] for p in found[0]}

    def stall(self) -> None:
        self.flowing.clear()

    def flow(self) -> None:
        self.flowing.set()


@pytest.fixture
def watched(
    ns: str, two_workers: tuple[Kube, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Watched]:
    w = Watched(two_workers[0], ns, monkeypatch)
    try:
        yield w
    finally:
        w.flow()
        w.watch.close()


def test_with_a_synced_pod_watch_the_scale_lists_no_pods(
    kube: client.ApiClient,
    ns: str,
    two_workers: tuple[Kube, dict[str, str]],
    watched: Watched,
) -> None:
    """At 5,000 pods the scale's LIST of their metadata took 2.2–3.0 s of every scale-in
    (`bench.scale_bench`). With the worker's pod watch synced, the scale counts from its
    cache and reads only the pod it names, fresh: the same exact write, no LIST."""
    kuberay, pods = two_workers
    core, co = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    decided = kuberay.read_cluster(ns, "rc")
    victim, other = sorted(pods)
    # a pod of the same name, not the one decided on: not named, nothing written
    assert remove_one(kuberay, ns, victim, decided.generation, "another-uid") is False
    assert remove_one(kuberay, ns, victim, decided.generation, pods[victim])
    assert watched.lists == 0
    assert spec_of(co, ns)["replicas"] == 1
    assert spec_of(co, ns)["workersToDelete"] == [victim]
    wait_for(lambda: worker_pods(core, ns) == {other: pods[other]}, timeout=60)
    # the next write prunes the name of the pod that is gone, from the cache and a GET
    wait_for(lambda: victim not in watched.cached(ns), timeout=30)
    later = kuberay.read_cluster(ns, "rc")
    assert kuberay.scale(ns, "rc", {"small": 1}, {}, generation=later.generation)
    assert spec_of(co, ns)["workersToDelete"] == []
    assert watched.lists == 0


def test_a_lagging_pod_watch_is_caught_by_the_fresh_read_of_the_pod_named(
    kube: client.ApiClient,
    ns: str,
    two_workers: tuple[Kube, dict[str, str]],
    watched: Watched,
) -> None:
    """The race of `test_a_pod_replaced_before_the_write_keeps_its_replica`, with the
    worker's pod watch behind: its cache still has pod A when A is gone and KubeRay has
    made A'. Counting from the cache would name A and lower `replicas`, and KubeRay would
    delete a pod of its own choosing. The fresh read of A disagrees with the cache, so
    the scale lists the pods and keeps A's replica."""
    kuberay, pods = two_workers
    core, co = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    decided = kuberay.read_cluster(ns, "rc", cached=True)
    victim, _other = sorted(pods)
    watched.stall()
    core.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
    now = wait_for(
        lambda: workers_if(core, ns, lambda w: len(w) == 2 and victim not in w), timeout=60
    )
    assert victim in watched.cached(ns)  # the watch has not seen it go
    assert remove_one(kuberay, ns, victim, decided.generation, pods[victim]) is False
    assert watched.lists == 1
    watched.flow()
    time.sleep(3)  # several of KubeRay's reconciles
    assert worker_pods(core, ns) == now
    assert spec_of(co, ns)["replicas"] == 2
    assert spec_of(co, ns)["workersToDelete"] == []


def test_a_named_pod_that_only_moved_on_needs_no_list(
    kube: client.ApiClient,
    ns: str,
    two_workers: tuple[Kube, dict[str, str]],
    watched: Watched,
) -> None:
    """KubeRay and the kubelet change pods all the time; the watch delivers each change
    milliseconds later. A pod named whose newer version the watch has not delivered yet
    (another resourceVersion, the same UID, group and no deletion) is the same for the
    write: comparing resourceVersions made the 5,000-pod benchmark's scale-in list."""
    kuberay, pods = two_workers
    core, co = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    decided = kuberay.read_cluster(ns, "rc", cached=True)
    victim, _other = sorted(pods)
    watched.stall()
    core.patch_namespaced_pod(victim, ns, {"metadata": {"annotations": {"moved": "on"}}})
    assert remove_one(kuberay, ns, victim, decided.generation, pods[victim])
    assert watched.lists == 0
    watched.flow()
    assert spec_of(co, ns)["replicas"] == 1
    assert spec_of(co, ns)["workersToDelete"] == [victim]
