"""`StandInFleet` (sandbox/ray_standin.py): many GCS stand-ins from one process, each at a
port of its own with a model of its own, over real gRPC (`grpc.aio` servers sharing one
event loop), read with raysize's own client; `bench.fleet_bench`'s pure helpers."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.fleet_bench import against, worker_sizes
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
