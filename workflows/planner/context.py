"""`PlanContext`: what every pass of one plan reads and adds to. The snapshot and its
`ResourceIndex` are fixed; the decisions so far (`launches`, `terminate`, `notes`) grow
pass by pass; `hold` says whether grows landing hold launches back. Modes that last one
step are not kept here: the GPU stage is a `GpuGate` handed to the placing functions, a
placement group's all-or-nothing undo an `UndoLog` handed to `take`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from raysize.workflows.model import (
    ClusterSnapshot,
    GroupSpec,
    PodPhase,
    PodView,
    TerminateAction,
    UpscalingMode,
)
from raysize.workflows.planner.landing import (
    GrownRoom,
    LaunchHold,
    grown_rooms,
    landing_grows,
    taken_by_grows,
)
from raysize.workflows.planner.selectors import in_placement_group
from raysize.workflows.planner.vectors import ResourceIndex


@dataclass(slots=True)
class Launches:
    """The pods the plan launches so far: how many per group, and what for."""

    count: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, group: str, n: int, reason: str) -> None:
        self.count[group] += n
        self.reasons.setdefault(group, Counter())[reason] += n

    def take_back_one(self, group: str, reason: str) -> None:
        self.count[group] -= 1
        reasons = self.reasons[group]
        reasons[reason] -= 1
        if reasons[reason] <= 0:
            del reasons[reason]

    def copy(self) -> Launches:
        return Launches(Counter(self.count), {k: Counter(v) for k, v in self.reasons.items()})


class PlanContext:
    """One plan's context: the snapshot, its resource index, the decisions so far."""

    def __init__(
        self,
        snap: ClusterSnapshot,
        bound_note: str = "",
        *,
        just_grown: GrownRoom | Sequence[str] = (),
    ) -> None:
        self.snap = snap
        self.settings = snap.settings
        # tasks waiting inside a placement group: its bundle holds their room
        demands = [d for d in snap.demands if not in_placement_group(d)]
        self.in_groups = [d for d in snap.demands if in_placement_group(d)]
        # grows that landed moments ago (`GrowWatch`): Ray may still report the task
        # demand they took as pending; up to the room each opened, it is not planned for
        rooms = grown_rooms(snap, just_grown)
        self.demands, taken, doubt = taken_by_grows(snap, demands, rooms)
        self.index = ResourceIndex(snap, self.demands)
        self.launches = Launches()
        self.terminate: dict[str, TerminateAction] = {}
        self.notes: list[str] = [bound_note] if bound_note else []
        # grows raysize asked for that are landing (`landing_grows`): no pod is launched for
        # demand until they have
        self.hold = LaunchHold(landing_grows(snap), taken, doubt)
        self.new_serial = 0  # numbers the pods the plan launches ("<group>#new<i>")
        # groups' live worker counts, used for caps
        self.pods_by_group: dict[str, list[PodView]] = {g: [] for g in snap.groups}
        for p in sorted(snap.pods, key=lambda p: p.name):
            self.pods_by_group.setdefault(p.group, []).append(p)

    # --- caps ------------------------------------------------------------------------------
    def worker_count(self, group: str) -> int:
        live = [p for p in self.pods_by_group.get(group, []) if p.name not in self.terminate]
        return len(live) + self.launches.count[group]

    def total_workers(self) -> int:
        return sum(self.worker_count(g.name) for g in self.snap.groups.values() if not g.is_head)

    def launch_room(self, g: GroupSpec, *, rate_limited: bool = True) -> int:
        """How many more pods of this group this plan may launch."""
        return self.group_room(g, self.cluster_room(rate_limited=rate_limited))

    def cluster_room(self, *, rate_limited: bool) -> int:
        """The launch room all groups share: the cluster's max_workers and Conservative's bound.

        It changes only when a launch or termination is added, so a caller that asks for
        every group in turn computes it once.
        """
        room = 1 << 62
        if rate_limited and self.hold.holds():
            # Ray reports the work a grow is for as pending until the grow lands (its demand
            # list is published once a second, later under load): a pod launched now could
            # be for work that is about to run, or already runs. Launch for what is still
            # waiting once the grow has landed (what it took is then `taken_by_grows`).
            return 0
        conservative = rate_limited and self.settings.upscaling_mode == UpscalingMode.CONSERVATIVE
        if self.settings.max_workers is None and not conservative:
            return room
        total = self.total_workers()
        if self.settings.max_workers is not None:
            room = min(room, self.settings.max_workers - total)
        if conservative:
            # KubeRay: "the number of pending worker pods is at most the number of worker
            # pods connected to the Ray cluster" — counted over all worker groups; one may
            # start while none is connected, or a cluster with no workers could never grow.
            # Every other worker (not connected, or to be launched) is pending.
            connected = sum(
                1
                for group in self.snap.groups.values()
                if not group.is_head
                for p in self.pods_by_group.get(group.name, [])
                if p.name not in self.terminate and p.phase == PodPhase.RUNNING and p.raylet_id
            )
            room = min(room, max(1, connected) - (total - connected))
        return room

    def group_room(self, g: GroupSpec, cluster_room: int) -> int:
        """`launch_room` given the shared part, `cluster_room`."""
        if g.is_head:
            return 0
        room = cluster_room
        if g.max_workers is not None:
            room = min(room, g.max_workers - self.worker_count(g.name))
        return max(0, room)

    def worker_groups(self) -> list[GroupSpec]:
        """The groups a pod may be launched in, by name."""
        return sorted((g for g in self.snap.groups.values() if not g.is_head), key=lambda g: g.name)
