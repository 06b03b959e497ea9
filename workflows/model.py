"""The domain model the planner decides on: groups, pods, demands and the plan.

All amounts are exact `Resources` (millicores, bytes, 1/10000 units). Everything here is
plain data: the activities fill a `ClusterSnapshot`, `plan()` turns it into a `Plan`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from raysize.workflows.resources import GIB, Resources
from raysize.workflows.values import StrictValue, Value

HEAD_GROUP = "headgroup"


class IpprLimits(StrictValue):
    """A group's in-place resize limits, from the `ray.io/ippr` annotation."""

    max_cpu: int = Field(description="millicores")
    max_memory: int = Field(description="bytes")
    resize_timeout_s: int


class GroupSpec(StrictValue):
    """One Ray group (worker group or the head group) as the planner needs it."""

    name: str
    resources: Resources = Field(description="Ray resources of a new pod (template size)")
    min_workers: int = 0
    max_workers: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    ippr: IpprLimits | None = None
    is_head: bool = False


class PodPhase(StrEnum):
    RUNNING = "running"  # the Raylet is registered
    PENDING = "pending"  # launched, no Raylet yet


class KubeletResizeState(StrEnum):
    """Where the kubelet stands on a resize asked of it (the pod's resize conditions)."""

    IN_PROGRESS = "in_progress"
    DEFERRED = "deferred"
    INFEASIBLE = "infeasible"
    ERROR = "error"
    TIMED_OUT = "timed_out"

    @property
    def in_flight(self) -> bool:
        return self in (
            KubeletResizeState.IN_PROGRESS,
            KubeletResizeState.DEFERRED,
            KubeletResizeState.INFEASIBLE,
        )


class PodResize(StrictValue):
    """A resize that has been asked of Kubernetes and not yet finished."""

    cpu: int = Field(description="target millicores")
    memory: int = Field(description="target bytes")
    state: KubeletResizeState = KubeletResizeState.IN_PROGRESS
    asked_s: float | None = Field(
        default=None,
        description="seconds since raysize last asked for it (ray.io/ippr-status resizing-at;"
        " None: raysize did not, or does not know)",
    )
    raylet_only: bool = Field(
        default=False,
        description="Kubernetes has the pod at `cpu`/`memory`; only its Raylet differs",
    )
    launched: bool = Field(
        default=False,
        description="with `raylet_only`: no resize of raysize's was ever on the pod (no "
        "ray.io/ippr-status): it was created at this size (launched at size), and its "
        "Raylet started at the size of KubeRay's `ray start` line",
    )


class PodView(StrictValue):
    """One Ray pod as the planner sees it."""

    name: str
    group: str
    phase: PodPhase = PodPhase.RUNNING
    raylet_id: str | None = None
    uid: str = Field(default="", description="the pod's metadata.uid ('' : not created yet)")
    total: Resources = Field(default_factory=Resources)
    available: Resources = Field(default_factory=Resources)
    idle_s: float = 0.0
    labels: dict[str, str] = Field(default_factory=dict)
    resize: PodResize | None = None
    suggested_max_cpu: int | None = None
    suggested_max_memory: int | None = None
    failed: bool = Field(default=False, description="a resize failed on this pod before")
    failed_age_s: float = Field(
        default=0.0, description="seconds since that failure (0: none, or just now)"
    )
    running_s: float = Field(
        default=0.0, description="seconds since the pod started running (0: not known)"
    )
    node: str = Field(default="", description="the node it is bound to ('': not bound)")
    resized: bool = Field(
        default=False, description="raysize has resized it before (ray.io/ippr-status is on it)"
    )


class Demand(StrictValue):
    """`count` tasks or actors of one shape waiting for resources."""

    shape: Resources
    count: int = 1
    label_selector: dict[str, str] = Field(default_factory=dict)


class GangStrategy(StrEnum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


class Gang(StrictValue):
    """A placement group waiting for resources: all bundles or none."""

    bundles: tuple[Resources, ...]
    strategy: GangStrategy = GangStrategy.PACK
    count: int = 1
    bundle_selectors: tuple[dict[str, str], ...] = ()


class Constraint(StrictValue):
    """`request_resources()`: the cluster must have capacity (not free space) for these."""

    shape: Resources
    count: int = 1


class UpscalingMode(StrEnum):
    CONSERVATIVE = "Conservative"
    DEFAULT = "Default"
    AGGRESSIVE = "Aggressive"


class ResizePolicy(StrEnum):
    RIGHT_SIZE = "right-size"  # smallest step-rounded size that fits what was placed
    MAX = "max"  # Ray's behaviour: one step to the group maximum


class PlannerSettings(Value):
    idle_timeout_s: float = 60.0
    max_workers: int | None = Field(default=None, description="cluster-wide cap on workers")
    upscaling_mode: UpscalingMode = UpscalingMode.DEFAULT
    resize_policy: ResizePolicy = ResizePolicy.RIGHT_SIZE
    cpu_step: int = Field(default=1000, gt=0, description="millicores")
    memory_step: int = Field(default=GIB, gt=0, description="bytes")
    raylet_start_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="a running worker pod whose Raylet has not registered after this long is "
        "replaced (Ray's own autoscaler times such nodes out too)",
    )


class NodeRoom(StrictValue):
    """What a node has left for pods to grow into: its allocatable minus what the scheduler
    charges its pods (each the larger of its desired, allocated and actual requests, so a
    grow the kubelet has not carried out already holds its room), other workloads' pods
    included."""

    cpu: int = Field(description="millicores free")
    memory: int = Field(description="bytes free")


class ClusterSnapshot(StrictValue):
    """Everything one decision needs; time enters only through `idle_s`."""

    name: str = "cluster"
    groups: dict[str, GroupSpec]
    pods: tuple[PodView, ...] = ()
    demands: tuple[Demand, ...] = ()
    gangs: tuple[Gang, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    settings: PlannerSettings = Field(default_factory=PlannerSettings)
    # the room of the nodes the pods run on, by node name; a pod whose node is not here
    # (not read: no RBAC for nodes, the node cache not synced) grows up to its group's
    # maximum as before, and the kubelet defers what does not fit
    nodes: dict[str, NodeRoom] = Field(default_factory=dict)


# One plan places at most this many units (tasks and actors, placement-group bundles,
# request_resources bundles): ~1 s of planning on one core. Ray may report more (a
# demand of 10⁹ tasks took the planner minutes); the rest waits for the next plan.
MAX_PLAN_UNITS = 100_000


def plan_units(snapshot: ClusterSnapshot) -> int:
    """The units a plan for `snapshot` would place."""
    return (
        sum(d.count for d in snapshot.demands)
        + sum(g.count * len(g.bundles) for g in snapshot.gangs)
        + sum(c.count for c in snapshot.constraints)
    )


def bounded(snapshot: ClusterSnapshot, limit: int = MAX_PLAN_UNITS) -> tuple[ClusterSnapshot, int]:
    """The snapshot with its pending work cut to `limit` units, in Ray's order (tasks,
    then placement groups, then request_resources), and how many units were left out."""
    total = plan_units(snapshot)
    if total <= limit:
        return snapshot, 0
    left = limit
    demands, gangs, constraints = [], [], []
    for d in snapshot.demands:
        take = min(d.count, left)
        if take:
            demands.append(d.model_copy(update={"count": take}))
        left -= take
    for g in snapshot.gangs:
        take = min(g.count, left // max(1, len(g.bundles)))
        if take:
            gangs.append(g.model_copy(update={"count": take}))
        left -= take * len(g.bundles)
    for c in snapshot.constraints:
        take = min(c.count, left)
        if take:
            constraints.append(c.model_copy(update={"count": take}))
        left -= take
    cut = snapshot.model_copy(
        update={
            "demands": tuple(demands),
            "gangs": tuple(gangs),
            "constraints": tuple(constraints),
        }
    )
    return cut, total - plan_units(cut)


class ResizeAction(Value):
    pod: str
    group: str
    cpu: int = Field(description="absolute target millicores")
    memory: int = Field(description="absolute target bytes")
    from_cpu: int
    from_memory: int
    reason: str
    retarget: bool = Field(
        default=False,
        description="grows a resize in flight further: its saga takes the new target",
    )
    node: str = Field(
        default="",
        description="a grow's node and the room it had, 'n1 (2 CPU/4Gi free)' ('': not known)",
    )
    launched: bool = Field(
        default=False,
        description="a settle of a pod launched at size: its Raylet brought to the pod as a "
        "matter of course, not a repair",
    )

    @property
    def shrinks(self) -> bool:
        return self.cpu < self.from_cpu or self.memory < self.from_memory


class TerminateAction(Value):
    pod: str
    group: str
    reason: str


class LaunchAction(Value):
    group: str
    count: int
    reason: str
    cpu: int = Field(
        default=0,
        description="millicores the new pods start at (0: their template's size): the work "
        "they are launched for, so the scheduler places them where that fits and a node "
        "autoscaler sees their real size (docs/design/architecture.md, launching at size)",
    )
    memory: int = Field(default=0, description="bytes the new pods start at (0: the template's)")


class Infeasible(Value):
    demands: int = 0
    gangs: int = 0
    constraints: int = 0


class Plan(Value):
    launch: tuple[LaunchAction, ...] = ()
    resize: tuple[ResizeAction, ...] = ()
    terminate: tuple[TerminateAction, ...] = ()
    infeasible: Infeasible = Field(default_factory=Infeasible)
    notes: tuple[str, ...] = Field(default=(), description="why some demand was not served")

    @property
    def launch_by_group(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.launch:
            out[a.group] = out.get(a.group, 0) + a.count
        return out

    @property
    def is_empty(self) -> bool:
        return not (self.launch or self.resize or self.terminate)
