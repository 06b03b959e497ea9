"""`StandInFleet` (sandbox/ray_standin.py): many GCS stand-ins from one process, each at a
port of its own with a model of its own, over real gRPC (`grpc.aio` servers sharing one
event loop), read with raysize's own client; `bench.fleet_bench`'s pure helpers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from bench.fleet_bench import StoreRegistrar, against, worker_sizes
from raysize.activities.ray_errors import RayReplyError
from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.ray_standin import RayStandIn, StandInFleet
from raysize.sandbox.store import Store

GIB = 1024**3


def test_each_stand_in_of_a_fleet_answers_for_its_own_cluster() -> None:
    with StandInFleet(3) as fleet:
        a, b, c = fleet.stand_ins
        assert len({a.port, b.port, c.port}) == 3 and 0 not in (a.port, b.port, c.port)
        a.add_node("a-w0", "small", 1.0, float(GIB))
        b.add_node("b-w0", "small", 1.0, float(GIB))
        b.add_node("b-w1", "small", 1.0, float(GIB))
        b.add_demands({"CPU": 2.0}, 1)
        states = {r: RayGcsClient(r.address, timeout=5).cluster_state() for r in (a, b, c)}
        assert [n.pod for n in states[a].nodes] == ["a-w0"]
        assert sorted(n.pod for n in states[b].nodes) == ["b-w0", "b-w1"]
        assert states[c].nodes == () and states[a].demands == () and len(states[b].demands) == 1
        # a resize reaches only its own stand-in's Raylet; an unknown one ends NOT_FOUND (the error `Abort` raises)
        node = states[b].nodes[0]
        gcs = RayGcsClient(b.address, timeout=5)
        gcs.resize_raylet(node.node_id, 2.0, float(GIB))
        assert b.counts()[:3] == (1, 0, 1) and a.counts()[2] == 0
        with pytest.raises(RayReplyError, match="NOT_FOUND"):
            RayGcsClient(c.address, timeout=5).resize_raylet(node.node_id, 2.0, float(GIB))
    assert a.counts()[3] == 1 and b.counts()[3] == 1


def test_a_stand_in_without_its_own_server_cannot_listen() -> None:
    with pytest.raises(ValueError, match="serve=False"):
        RayStandIn(serve=False).listen()
    with pytest.raises(ValueError, match="count: 0"):
        StandInFleet(0)


def test_worker_sizes_counts_the_fleet_s_worker_pods_by_cpu() -> None:
    store = Store()

    def pod(name: str, cluster: str, kind: str, cpu: str | None) -> None:
        statuses = [] if cpu is None else [{"resources": {"limits": {"cpu": cpu}}}]
        store.create(
            "pods",
            "default",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {"ray.io/cluster": cluster, "ray.io/node-type": kind},
                },
                "spec": {"containers": []},
                "status": {"containerStatuses": statuses},
            },
        )

    pod("f0-head", "fleet-000", "head", "1")
    pod("f0-w0", "fleet-000", "worker", "1")
    pod("f0-w1", "fleet-000", "worker", "4")
    pod("f1-w0", "fleet-001", "worker", "4")
    pod("f1-w1", "fleet-001", "worker", None)  # not started: not counted
    pod("react-w0", "react", "worker", "2")
    assert worker_sizes(store) == Counter({"4": 2, "1": 1})
    assert against("p50 0.2s", True, "< 0.3s") == "p50 0.2s (target < 0.3s) met"
    assert against("p50 0.4s", False, "< 0.3s") == "p50 0.4s (target < 0.3s) MISSED"


def test_the_store_s_label_index_answers_as_a_scan_does() -> None:
    """`Store.labelled` (what the KubeRay stand-in reads a cluster's pods with: a scan of
    10,000 pods per reconcile left a 1,000-cluster fleet minutes behind) follows every
    write: create, a label changed or dropped, remove, a finalizer-less delete by update."""
    store = Store()

    def scan(cluster: str) -> list[str]:
        items, _ = store.list(
            "pods", "ns", lambda o: (o["metadata"].get("labels") or {}).get(KEY) == cluster
        )
        return [o["metadata"]["name"] for o in items]

    def index(cluster: str) -> list[str]:
        return [o["metadata"]["name"] for o in store.labelled("pods", "ns", KEY, cluster)]

    def relabel(value: str | None):
        def change(o: dict) -> dict:
            labels = o["metadata"].setdefault("labels", {})
            if value is None:
                labels.pop(KEY, None)
            else:
                labels[KEY] = value
            return o

        return change

    for i in range(6):
        store.create("pods", "ns", {"metadata": {"name": f"p{i}", "labels": {KEY: f"c{i % 2}"}}})
    store.create("pods", "other", {"metadata": {"name": "p0", "labels": {KEY: "c0"}}})
    store.create("pods", "ns", {"metadata": {"name": "free"}})
    store.update("pods", "ns", "p1", relabel("c0"))
    store.update("pods", "ns", "p2", relabel(None))
    store.update("pods", "ns", "free", relabel("c1"))
    store.remove("pods", "ns", "p3")
    store.update(
        "pods",
        "ns",
        "p4",
        lambda o: {**o, "metadata": {**o["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}},
    )
    for cluster in ("c0", "c1", "c2"):
        assert index(cluster) == scan(cluster)
    assert index("c0") == ["p0", "p1"] and index("c1") == ["free", "p5"]
    assert [o["metadata"]["namespace"] for o in store.labelled("pods", "other", KEY, "c0")] == [
        "other"
    ]
    with pytest.raises(ValueError, match="not indexed"):
        store.labelled("pods", "ns", "app", "x")


KEY = "ray.io/cluster"


def test_the_store_registrar_follows_the_pods_as_they_are_written() -> None:
    """`bench.fleet_bench.StoreRegistrar` gives a stand-in a node per running pod of its
    cluster from the store's own pod events (pods there before it, then each write), and
    takes it away when the pod is being deleted."""
    store = Store()
    ray = RayStandIn(serve=False)

    def pod(name: str, phase: str) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"ray.io/cluster": "fleet-000"}},
            "spec": {"containers": []},
            "status": {"phase": phase},
        }

    def running(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"] = {"phase": "Running"}
        return obj

    def nodes() -> set[str]:
        with ray.model.lock:
            return set(ray.model.nodes)

    store.create("pods", "default", pod("before", "Running"))
    store.create("pods", "default", {**pod("elsewhere", "Running"), "metadata": {"name": "x"}})
    with StoreRegistrar(store, {"fleet-000": ray}) as registrar:
        store.create("pods", "default", pod("w0", "Pending"))
        store.create("pods", "default", pod("w1", "Pending"))
        store.update("pods", "default", "w1", running)
        assert until(lambda: nodes() == {"before", "w1"})
        store.remove("pods", "default", "before")
        assert until(lambda: nodes() == {"w1"})
        assert registrar.registered == 2


def until(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return check()
