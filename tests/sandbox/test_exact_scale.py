"""Exact scale-in writes (issue #26 item 2), in both worlds with KubeRay (the real operator
in the real world): `replicas` goes down by exactly the pods named, stale names leave
`workersToDelete`, and the write is guarded by the spec's generation, not its
resourceVersion."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from kubernetes import client

from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import Conflict
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
    metas, mark = kuberay.list_cluster_pod_metadata(ns, "rc")
    whole, whole_mark = kuberay.list_cluster_pods(ns, "rc")
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
