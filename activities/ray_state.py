"""What the Ray GCS reports, as typed values with exact amounts.

`parse_cluster_state()` turns one `GetClusterResourceStateReply` into a `ClusterState`:
the nodes (pod name from `instance_id`, group from `ray_node_type_name`), the pending
demands grouped by shape, the pending placement groups and the `request_resources()`
constraints. `parse_node_infos()` reads `GetAllNodeInfo` (addresses, head flag, why a
node died). Every amount is a `Resources` (millicores, bytes, 1/10000 units).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum

from pydantic import Field

from raysize.activities.ray_errors import RayReplyError
from raysize.activities.ray_proto import ray_autoscaler_pb2 as autoscaler_pb2
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc_pb2
from raysize.workflows.model import GangStrategy
from raysize.workflows.resources import CPU, MEMORY, QuantityError, Resources, float_to_units
from raysize.workflows.values import StrictValue

_EXACT_SCALES = frozenset({CPU, MEMORY})
_OTHER = "other"  # stands for every other name: all are counted in 1/10000 units


class NodeStatus(StrEnum):
    RUNNING = "running"
    IDLE = "idle"
    DRAINING = "draining"
    DEAD = "dead"
    UNKNOWN = "unknown"


_NODE_STATUS = {
    autoscaler_pb2.RUNNING: NodeStatus.RUNNING,
    autoscaler_pb2.IDLE: NodeStatus.IDLE,
    autoscaler_pb2.DRAINING: NodeStatus.DRAINING,
    autoscaler_pb2.DEAD: NodeStatus.DEAD,
}


class RayNode(StrictValue):
    """One Raylet as the autoscaler state sees it (totals reflect resizes)."""

    node_id: str = Field(description="56 hex characters")
    pod: str = Field(description="instance_id: RAY_CLOUD_INSTANCE_ID, the pod name on KubeRay")
    group: str = Field(description="ray_node_type_name: RAY_NODE_TYPE_NAME, the group")
    ip: str = ""
    status: NodeStatus
    total: Resources
    available: Resources
    idle_ms: int = Field(default=0, description="how long the node has been idle; 0: busy")
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.status is not NodeStatus.DEAD


class LabelOperator(StrEnum):
    IN = "in"
    NOT_IN = "!in"


class LabelConstraint(StrictValue):
    key: str
    operator: LabelOperator
    values: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.key} {self.operator.value} ({','.join(self.values)})"


class LabelSelector(StrictValue):
    """All constraints must hold on the node."""

    constraints: tuple[LabelConstraint, ...]

    def describe(self) -> str:
        return ", ".join(c.describe() for c in self.constraints)


class PlacementConstraint(StrictValue):
    """A bundle must (affinity) or must not (anti-affinity) share a node with `label`."""

    affinity: bool
    label: str
    value: str = ""


class PendingDemand(StrictValue):
    """`count` tasks or actors of one shape that wait for resources.

    `label_selectors` are alternatives, any one of which will do; empty means any node.
    """

    shape: Resources
    count: int
    label_selectors: tuple[LabelSelector, ...] = ()


class GangBundle(StrictValue):
    shape: Resources
    label_selectors: tuple[LabelSelector, ...] = ()
    placement_constraints: tuple[PlacementConstraint, ...] = ()


class PendingGang(StrictValue):
    """A placement group that waits for resources: all bundles are placed or none."""

    placement_group_id: str
    strategy: GangStrategy
    state: str = Field(description="Ray's placement group state: PENDING, RESCHEDULING, …")
    bundles: tuple[GangBundle, ...]


class ResourceConstraint(StrictValue):
    """`request_resources()`: the cluster must have room (capacity) for `count` × `shape`."""

    shape: Resources
    count: int
    label_selectors: tuple[LabelSelector, ...] = ()


class ClusterState(StrictValue):
    version: int = Field(description="cluster_resource_state_version; grows on every change")
    fingerprint: int = Field(
        default=0, description="state_fingerprint of the reply it was read from (0: not read)"
    )
    session_name: str = ""
    nodes: tuple[RayNode, ...] = ()
    demands: tuple[PendingDemand, ...] = ()
    gangs: tuple[PendingGang, ...] = ()
    constraints: tuple[ResourceConstraint, ...] = ()

    @property
    def alive_nodes(self) -> tuple[RayNode, ...]:
        return tuple(n for n in self.nodes if n.alive)

    def node_for_pod(self, pod: str) -> RayNode | None:
        """The Raylet of `pod`: the live one if the pod's Raylet was ever replaced."""
        matches = [n for n in self.nodes if n.pod == pod]
        alive = [n for n in matches if n.alive]
        best = alive or matches
        return best[0] if best else None


class NodeDeathReason(StrEnum):
    UNSPECIFIED = "unspecified"
    EXPECTED_TERMINATION = "expected_termination"
    UNEXPECTED_TERMINATION = "unexpected_termination"
    AUTOSCALER_DRAIN_PREEMPTED = "autoscaler_drain_preempted"
    AUTOSCALER_DRAIN_IDLE = "autoscaler_drain_idle"


class NodeInfo(StrictValue):
    """One Raylet as registered with the GCS (`GetAllNodeInfo`)."""

    node_id: str
    pod: str
    group: str
    address: str
    raylet_port: int
    alive: bool
    is_head: bool
    labels: dict[str, str] = Field(default_factory=dict)
    start_time_ms: int = 0
    end_time_ms: int = 0
    death_reason: NodeDeathReason | None = None
    death_message: str = ""


# --- parsing --------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _units(scale_name: str, value: float) -> int:
    # A large cluster repeats the same few amounts thousands of times: convert each once.
    return float_to_units(value, scale_name)


def ray_amounts(amounts: Mapping[str, float], *, what: str) -> Resources:
    """Ray's float map → exact `Resources`; a negative amount stays negative."""
    units: dict[str, int] = {}
    try:
        for name in amounts:  # faster than .items() on a protobuf map
            value = amounts[name]
            scale_name = name if name in _EXACT_SCALES else _OTHER
            units[name] = -_units(scale_name, -value) if value < 0 else _units(scale_name, value)
    except QuantityError:
        # Convert again, uncached and with the real name, for a message that says which.
        for name in amounts:
            try:
                float_to_units(abs(amounts[name]), name, what=f"{what}.{name}")
            except QuantityError as exc:
                raise RayReplyError(f"unreadable amount in the reply: {exc}") from exc
        raise
    return Resources(units)


def _selectors(selectors: Iterable[rpc_pb2.LabelSelector]) -> tuple[LabelSelector, ...]:
    out: list[LabelSelector] = []
    for selector in selectors:
        if not selector.label_constraints:
            return ()  # one alternative is "any node": the request is unconstrained
        constraints = []
        for c in selector.label_constraints:
            if c.operator == rpc_pb2.LABEL_OPERATOR_IN:
                op = LabelOperator.IN
            elif c.operator == rpc_pb2.LABEL_OPERATOR_NOT_IN:
                op = LabelOperator.NOT_IN
            else:
                raise RayReplyError(f"label selector on {c.label_key!r} has no operator")
            constraints.append(
                LabelConstraint(key=c.label_key, operator=op, values=tuple(c.label_values))
            )
        out.append(LabelSelector(constraints=tuple(constraints)))
    return tuple(out)


def _placement(
    constraints: Iterable[autoscaler_pb2.PlacementConstraint],
) -> tuple[PlacementConstraint, ...]:
    out = []
    for c in constraints:
        if c.HasField("affinity"):
            out.append(
                PlacementConstraint(
                    affinity=True, label=c.affinity.label_name, value=c.affinity.label_value
                )
            )
        if c.HasField("anti_affinity"):
            out.append(
                PlacementConstraint(
                    affinity=False,
                    label=c.anti_affinity.label_name,
                    value=c.anti_affinity.label_value,
                )
            )
    return tuple(out)


def _node(state: autoscaler_pb2.NodeState) -> RayNode:
    node_id = state.node_id.hex()
    return RayNode(
        node_id=node_id,
        pod=state.instance_id,
        group=state.ray_node_type_name,
        ip=state.node_ip_address,
        status=_NODE_STATUS.get(state.status, NodeStatus.UNKNOWN),
        total=ray_amounts(state.total_resources, what=f"node {node_id}.total"),
        available=ray_amounts(state.available_resources, what=f"node {node_id}.available"),
        idle_ms=state.idle_duration_ms,
        labels=dict(state.labels),
    )


def _gang(gang: autoscaler_pb2.GangResourceRequest) -> PendingGang:
    # details: "<placement group id hex>:<STRATEGY>|<STATE>"
    pg_id, sep, rest = gang.details.partition(":")
    strategy, sep2, state = rest.partition("|")
    if not (sep and sep2 and pg_id):
        raise RayReplyError(f"unreadable placement group details {gang.details!r}")
    try:
        strategy_value = GangStrategy(strategy)
    except ValueError as exc:
        raise RayReplyError(f"placement group {pg_id}: unknown strategy {strategy!r}") from exc
    # The v2 scheduler reads bundle_selectors[0]; `requests` is the legacy copy.
    requests = (
        gang.bundle_selectors[0].resource_requests if gang.bundle_selectors else gang.requests
    )
    bundles = tuple(
        GangBundle(
            shape=ray_amounts(r.resources_bundle, what=f"placement group {pg_id}.bundle"),
            label_selectors=_selectors(r.label_selectors),
            placement_constraints=_placement(r.placement_constraints),
        )
        for r in requests
    )
    return PendingGang(
        placement_group_id=pg_id, strategy=strategy_value, state=state, bundles=bundles
    )


def state_fingerprint(reply: autoscaler_pb2.GetClusterResourceStateReply) -> int:
    """What a decision depends on in a cluster state reply, hashed: pending demands,
    placement groups and constraints, and each node with its totals, status (running or
    idle), labels and address, but not its free resources, idle time or the versions,
    which move with every usage report. Read from the reply itself, without building
    the typed state: the reconcile's wait compares it several times a second."""
    state = reply.cluster_resource_state
    digest = hashlib.blake2b(digest_size=7)
    nodes = []
    for n in state.node_states:
        node = autoscaler_pb2.NodeState()
        node.CopyFrom(n)
        node.ClearField("available_resources")
        node.ClearField("idle_duration_ms")
        node.DiscardUnknownFields()
        nodes.append(node.SerializeToString(deterministic=True))
    for blob in sorted(nodes):
        digest.update(len(blob).to_bytes(4, "big"))
        digest.update(blob)
    wanted = autoscaler_pb2.ClusterResourceState(
        pending_resource_requests=state.pending_resource_requests,
        pending_gang_resource_requests=state.pending_gang_resource_requests,
        cluster_resource_constraints=state.cluster_resource_constraints,
    )
    wanted.DiscardUnknownFields()
    digest.update(wanted.SerializeToString(deterministic=True))
    return int.from_bytes(digest.digest(), "big")


def demand_digest(reply: autoscaler_pb2.GetClusterResourceStateReply) -> int:
    """The pending task and actor demands of a cluster state reply, hashed: what a GCS
    publishes on its resource-load timer (`activities.gcs_cadence`). Placement groups and
    constraints are left out: the GCS changes those the moment it is asked."""
    digest = hashlib.blake2b(digest_size=7)
    for request in reply.cluster_resource_state.pending_resource_requests:
        digest.update(request.SerializeToString(deterministic=True))
    return int.from_bytes(digest.digest(), "big")


def parse_cluster_state(reply: autoscaler_pb2.GetClusterResourceStateReply) -> ClusterState:
    state = reply.cluster_resource_state
    demands = tuple(
        PendingDemand(
            shape=ray_amounts(d.request.resources_bundle, what="pending demand"),
            count=d.count,
            label_selectors=_selectors(d.request.label_selectors),
        )
        for d in state.pending_resource_requests
    )
    # `request_resources(num_cpus=0)` leaves one empty entry: no requests, no constraint.
    constraints = tuple(
        ResourceConstraint(
            shape=ray_amounts(r.request.resources_bundle, what="resource constraint"),
            count=r.count,
            label_selectors=_selectors(r.request.label_selectors),
        )
        for entry in state.cluster_resource_constraints
        for r in entry.resource_requests
    )
    return ClusterState(
        version=state.cluster_resource_state_version,
        fingerprint=state_fingerprint(reply),
        session_name=state.cluster_session_name,
        nodes=tuple(_node(n) for n in state.node_states),
        demands=demands,
        gangs=tuple(_gang(g) for g in state.pending_gang_resource_requests),
        constraints=constraints,
    )


_DEATH_REASON = {
    rpc_pb2.NodeDeathInfo.UNSPECIFIED: NodeDeathReason.UNSPECIFIED,
    rpc_pb2.NodeDeathInfo.EXPECTED_TERMINATION: NodeDeathReason.EXPECTED_TERMINATION,
    rpc_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION: NodeDeathReason.UNEXPECTED_TERMINATION,
    rpc_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED: NodeDeathReason.AUTOSCALER_DRAIN_PREEMPTED,
    rpc_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_IDLE: NodeDeathReason.AUTOSCALER_DRAIN_IDLE,
}


def parse_node_infos(reply: rpc_pb2.GetAllNodeInfoReply) -> tuple[NodeInfo, ...]:
    out = []
    for n in reply.node_info_list:
        alive = n.state == rpc_pb2.GcsNodeInfo.ALIVE
        out.append(
            NodeInfo(
                node_id=n.node_id.hex(),
                pod=n.instance_id,
                group=n.node_type_name,
                address=n.node_manager_address,
                raylet_port=n.node_manager_port,
                alive=alive,
                is_head=n.is_head_node,
                labels=dict(n.labels),
                start_time_ms=n.start_time_ms,
                end_time_ms=n.end_time_ms,
                death_reason=None
                if alive
                else _DEATH_REASON.get(n.death_info.reason, NodeDeathReason.UNSPECIFIED),
                death_message="" if alive else n.death_info.reason_message,
            )
        )
    return tuple(out)


def ray_version_of(metadata: bytes, *, what: str) -> str:
    """`ray_version` of the cluster metadata Ray keeps in the GCS (JSON)."""
    try:
        doc = json.loads(metadata)
        version = doc["ray_version"]
    except (ValueError, TypeError, KeyError):
        raise RayReplyError(f"{what}: no ray_version in {metadata[:200]!r}") from None
    if not isinstance(version, str) or not version:
        raise RayReplyError(f"{what}: ray_version is {version!r}, not a version")
    return version
