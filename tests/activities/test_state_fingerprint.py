"""The reconcile's wait compares Ray's state several times a second: by what a decision
depends on, never by what moves with every usage report."""

from __future__ import annotations

from raysize.activities.ray_proto import ray_autoscaler_pb2 as pb
from raysize.activities.ray_state import parse_cluster_state, state_fingerprint


def reply(
    *,
    version: int = 1,
    cpu_free: float = 1.0,
    idle_ms: int = 0,
    cpu_total: float = 4.0,
    status: int = pb.RUNNING,
    demand: float | None = None,
    order: tuple[int, ...] = (1, 2),
) -> pb.GetClusterResourceStateReply:
    nodes = [
        pb.NodeState(
            node_id=bytes([i]) * 28,
            instance_id=f"pod-{i}",
            ray_node_type_name="small",
            total_resources={"CPU": cpu_total, "memory": 2.0**30},
            available_resources={"CPU": cpu_free},
            status=status,
            idle_duration_ms=idle_ms,
        )
        for i in order
    ]
    demands = (
        [
            pb.ResourceRequestByCount(
                request=pb.ResourceRequest(resources_bundle={"CPU": demand}), count=1
            )
        ]
        if demand is not None
        else []
    )
    return pb.GetClusterResourceStateReply(
        cluster_resource_state=pb.ClusterResourceState(
            cluster_resource_state_version=version,
            node_states=nodes,
            pending_resource_requests=demands,
        )
    )


def test_usage_reports_leave_it_and_decisions_change_it() -> None:
    base = state_fingerprint(reply())
    # what moves with every usage report, and the order the GCS lists nodes in
    assert state_fingerprint(reply(version=99, cpu_free=3.0, idle_ms=5000)) == base
    assert state_fingerprint(reply(order=(2, 1))) == base
    # what a decision depends on
    assert state_fingerprint(reply(demand=2.0)) != base
    assert state_fingerprint(reply(cpu_total=2.0)) != base  # a Raylet resized
    assert state_fingerprint(reply(status=pb.IDLE)) != base  # went idle: a deadline starts
    assert state_fingerprint(reply(order=(1,))) != base  # a node left


def test_the_typed_state_carries_the_same_fingerprint() -> None:
    """The observe (typed state) and the wait (raw reply) must agree, or every wait would
    end at once."""
    r = reply(demand=2.0)
    assert parse_cluster_state(r).fingerprint == state_fingerprint(r)
