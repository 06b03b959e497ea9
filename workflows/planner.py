"""`plan(snapshot) -> Plan`: what to resize, launch and remove. Pure and deterministic.

The order of decisions:

1. launch pods to reach each group's `min_workers`;
2. remove pods above a group's or the cluster's maximum (pending first, then idle; never
   a busy pod);
3. `request_resources` constraints, bin-packed on pod *capacity*;
4. gangs (placement groups), then task/actor demands, bin-packed on *free* capacity.

Constraints, gangs and demands are each placed in three passes: on the room pods have
now (a resize in flight counts at its target, a pending pod at its IPPR maximum), then on
the headroom of pods that may grow in place, then on new pods (counted at their IPPR
maximum so no more are launched than needed). Finally idle pods are shrunk back to
their template size if they were grown, else removed.

GPU pods are kept for GPU work (Ray's `RAY_scheduler_avoid_gpu_nodes`): each of those
steps runs in up to three stages (`gpu_stages`). GPU work may use any pod from the first.
Work that needs no GPU uses, in turn, (1) the free room and growth of pods without GPUs,
(2) the spare room of GPU pods, running or pending (a pending pod counts empty at its
maximum), once GPU work has had its pick, and new pods without GPUs (as Ray, which fills
the nodes it has before it launches one), (3) new GPU pods. While GPU work waits, a GPU
pod the plan does not use that is pending or idle past the timeout is kept to stage 3: it
will go, and make room under its group's maximum for a GPU pod that the waiting work fits.

A pod whose grow is in flight (`in_progress`) counts at its target and may grow further up
to its group's IPPR maximum: the plan then retargets the running resize (`ResizeAction.
retarget`) rather than launching a pod. While such a grow lands (`landing_grows`), no pod
is launched for demand at all: Ray publishes its demand list once a second, so the work
the grow is for may still be reported pending beside new work that the grown pod could
take once that work has run (issue #13: a task, then a placement group).

Task and actor demands that name a placement group's own resources (`CPU_group_<id>`,
`CPU_group_<i>_<id>`, `bundle_group_<id>`, ...) wait for a bundle of that group, which
already holds their room: they are dropped, as Ray's autoscaler drops them.

Amounts are integer vectors indexed by resource name; a shape is stored sparsely as
((index, amount), ...) because Ray shapes name one to three resources.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum, StrEnum

from raysize.workflows.model import (
    MAX_PLAN_UNITS,
    ClusterSnapshot,
    Constraint,
    Demand,
    Gang,
    GangStrategy,
    GroupSpec,
    Infeasible,
    KubeletResizeState,
    LaunchAction,
    Plan,
    PodPhase,
    PodView,
    ResizeAction,
    ResizePolicy,
    TerminateAction,
    UpscalingMode,
    bounded,
    plan_units,
)
from raysize.workflows.resources import CPU, MEMORY, Resources

Shape = tuple[tuple[int, int], ...]
Selector = tuple[tuple[str, str], ...]


class Work(StrEnum):
    """What a unit of work placed on a pod is (the value is what plans and
    `raysize plan --explain` call it)."""

    DEMAND = "pending"  # a task's or an actor's pending demand
    GANG = "gang bundle"  # a bundle of a placement group
    CONSTRAINT = "requested"  # capacity asked with request_resources


GPU = "GPU"


class GpuStage(IntEnum):
    """How far work that needs no GPU may go onto GPU pods (`_Planner.gpu_stages`)."""

    OWN_PODS = 0  # pods without GPUs only
    SPARE_GPU = 1  # also the spare room of GPU pods, and new pods without GPUs
    ANY_GPU = 2  # anywhere


class Room(Enum):
    """Which room of the existing pods a pass places on."""

    CAPACITY = "capacity"  # their whole size: request_resources asks for capacity
    FREE = "free"  # what Ray reports available: demands need room that is free now


# Ray names a placement group's resources `<name>_group_<pg id>` and
# `<name>_group_<bundle index>_<pg id>` (ray/_private/utils.py); the id is hex
_PG_RESOURCE = re.compile(r"^.+_group_(?:\d+_)?[0-9a-fA-F]{16,}$")


def is_placement_group_resource(name: str) -> bool:
    """A resource only a placement group's bundle offers (`CPU_group_0_<id>`, ...)."""
    return bool(_PG_RESOURCE.match(name))


# --- label selectors (Ray syntax: "v", "!v", "in(a,b)", "!in(a,b)") ------------------


def _value_matches(expr: str, actual: str | None) -> bool:
    negate = expr.startswith("!")
    body = expr[1:] if negate else expr
    if body.startswith("in(") and body.endswith(")"):
        ok = actual is not None and actual in {v.strip() for v in body[3:-1].split(",")}
    else:
        ok = actual == body
    return not ok if negate else ok


def selector_matches(selector: Mapping[str, str] | Selector, labels: Mapping[str, str]) -> bool:
    items = selector.items() if isinstance(selector, Mapping) else selector
    return all(_value_matches(expr, labels.get(key)) for key, expr in items)


# --- bins -------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Bin:
    """A pod (existing or planned) that work can be placed on."""

    key: str  # pod name, or "<group>#new<i>" for a planned pod
    group: GroupSpec
    labels: Mapping[str, str]
    free: list[int]
    headroom: list[int]  # how much more it may grow in place (cpu, memory only)
    base: list[int]  # its size before growth (totals)
    ceiling: list[int]  # the most it may grow to
    pod: PodView | None = None
    grown: bool = False
    used: bool = False
    placed_by_growth: Counter[tuple[Work, Shape]] = field(default_factory=Counter)
    placed: Counter[tuple[Work, Shape]] = field(default_factory=Counter)
    match_cache: dict[Selector, bool] = field(default_factory=dict)
    special: frozenset[int] = frozenset()  # resources other than CPU/memory (GPU, …)
    gpu: bool = False  # it has GPUs: work that needs none comes here last
    sels: set[Selector] = field(default_factory=set)  # label selectors of what it holds
    launch_reason: str | None = None  # a new pod launched for work: why

    def matches(self, selector: Selector) -> bool:
        if not selector:
            return True
        hit = self.match_cache.get(selector)
        if hit is None:
            hit = self.match_cache[selector] = selector_matches(selector, self.labels)
        return hit


@dataclass(slots=True)
class _Undo:
    """A bin as it was before a placement group started on it: put back if the group
    does not fit whole."""

    bin: _Bin
    free: list[int]
    headroom: list[int]
    grown: bool
    used: bool
    placed: Counter[tuple[Work, Shape]]
    placed_by_growth: Counter[tuple[Work, Shape]]

    @classmethod
    def of(cls, b: _Bin) -> _Undo:
        return cls(
            b,
            list(b.free),
            list(b.headroom),
            b.grown,
            b.used,
            Counter(b.placed),
            Counter(b.placed_by_growth),
        )

    def restore(self) -> None:
        b = self.bin
        b.free, b.headroom, b.grown, b.used = self.free, self.headroom, self.grown, self.used
        b.placed, b.placed_by_growth = self.placed, self.placed_by_growth


@dataclass(slots=True)
class _Item:
    """`remaining` copies of one shape (demand or constraint) still to place."""

    kind: Work
    shape: Shape
    selector: Selector
    remaining: int
    gpu: bool = False  # it needs a GPU


@dataclass(slots=True)
class _Gang:
    """A placement group of the snapshot, and how many of its copies still wait."""

    gang: Gang
    left: int
    # it fits some registered node's total: growing pods in place can get it placed
    growable: bool


@dataclass(slots=True)
class _Work:
    """What one plan works through, pass by pass (`_Planner.run`)."""

    # existing pods by their whole size, then the pods the plan launches: for constraints
    capacity_bins: list[_Bin]
    constraints: list[_Item]
    # existing pods by the room free now (the constraints' growth carried over), then
    # the pods the plan launches: for demands and placement groups
    free_bins: list[_Bin] = field(default_factory=list)
    demands: list[_Item] = field(default_factory=list)
    gangs: list[_Gang] = field(default_factory=list)

    def left_without_gpu(self) -> bool:
        return _left_without_gpu(self.demands) or any(pg.left for pg in self.gangs)

    def left(self) -> Infeasible:
        """What is still waiting: demand units, placement groups, requested bundles."""
        return Infeasible(
            demands=sum(it.remaining for it in self.demands),
            gangs=sum(pg.left for pg in self.gangs),
            constraints=sum(it.remaining for it in self.constraints),
        )


class _Planner:
    def __init__(
        self,
        snap: ClusterSnapshot,
        bound_note: str = "",
        *,
        just_grown: Sequence[str] = (),
    ) -> None:
        self.snap = snap
        self.settings = snap.settings
        # tasks waiting inside a placement group: its bundle holds their room
        self.demands = [d for d in snap.demands if not _in_placement_group(d)]
        self.in_groups = [d for d in snap.demands if _in_placement_group(d)]
        names: set[str] = {CPU, MEMORY}
        for g in snap.groups.values():
            names.update(g.resources)
        for p in snap.pods:
            names.update(p.total)
            names.update(p.available)
        for d in self.demands:
            names.update(d.shape)
        for c in snap.constraints:
            names.update(c.shape)
        for gang in snap.gangs:
            for b in gang.bundles:
                names.update(b)
        self.names = sorted(names)
        self.idx = {n: i for i, n in enumerate(self.names)}
        self.cpu_i = self.idx[CPU]
        self.mem_i = self.idx[MEMORY]
        self.gpu_i = self.idx.get(GPU)
        # how far work that needs no GPU may go onto GPU pods (`gpu_stages`)
        self.gpu_stage: GpuStage = GpuStage.ANY_GPU
        # GPU work is still waiting after its pick (unknown: assume so)
        self.gpu_waiting = True
        # the placement group being placed has a GPU bundle (`place_gang`)
        self.gang_gpu = False
        self.width = len(self.names)
        # reference size per resource, to compare shapes of different kinds
        self.ref = [1] * self.width
        for g in snap.groups.values():
            for i, v in enumerate(self._new_pod_capacity(g)):
                self.ref[i] = max(self.ref[i], v)
        self.launch: Counter[str] = Counter()
        self.launch_reasons: dict[str, Counter[str]] = {}
        self.terminate: dict[str, TerminateAction] = {}
        self.notes: list[str] = [bound_note] if bound_note else []
        # grows raysize asked for that are landing (`landing_grows`): no pod is launched for
        # demand until they have
        self.landing = landing_grows(snap)
        # and grows that landed moments ago (`JUST_GROWN_S`): Ray may still report the work
        # they took as pending, so no pod is grown either
        running = {p.name for p in snap.pods if p.phase == PodPhase.RUNNING}
        self.just_grown = sorted((set(just_grown) & running) - set(self.landing))
        self.held_for_landing = False
        self.new_serial = 0
        # undo log of the gang being placed: bin id -> (bin, state before)
        self.txn: dict[int, _Undo] | None = None
        # what the passes worked through (for `plan_with_trace`)
        self.work = _Work(capacity_bins=[], constraints=[])
        # groups' live worker counts, used for caps
        self.pods_by_group: dict[str, list[PodView]] = {g: [] for g in snap.groups}
        for p in sorted(snap.pods, key=lambda p: p.name):
            self.pods_by_group.setdefault(p.group, []).append(p)

    # --- vectors -------------------------------------------------------------------------
    def vec(self, res: Mapping[str, int]) -> list[int]:
        out = [0] * self.width
        for n, v in res.items():
            out[self.idx[n]] = v
        return out

    def shape(self, res: Mapping[str, int]) -> Shape:
        return tuple((self.idx[n], v) for n, v in sorted(res.items()) if v > 0)

    def res(self, shape: Shape) -> Resources:
        return Resources({self.names[i]: a for i, a in shape})

    def size_key(self, shape: Shape) -> tuple[float, Shape]:
        return (-sum(a / self.ref[i] for i, a in shape), shape)

    def _new_pod_capacity(self, g: GroupSpec) -> list[int]:
        """A new pod counts at its IPPR maximum: it will be grown once it runs."""
        cap = self.vec(g.resources)
        if g.ippr is not None:
            cap[self.cpu_i] = max(cap[self.cpu_i], g.ippr.max_cpu)
            cap[self.mem_i] = max(cap[self.mem_i], g.ippr.max_memory)
        return cap

    # --- caps ------------------------------------------------------------------------------
    def worker_count(self, group: str) -> int:
        live = [p for p in self.pods_by_group.get(group, []) if p.name not in self.terminate]
        return len(live) + self.launch[group]

    def total_workers(self) -> int:
        return sum(self.worker_count(g.name) for g in self.snap.groups.values() if not g.is_head)

    def launch_room(self, g: GroupSpec, *, rate_limited: bool = True) -> int:
        """How many more pods of this group this plan may launch."""
        return self._group_room(g, self._cluster_room(rate_limited=rate_limited))

    def _cluster_room(self, *, rate_limited: bool) -> int:
        """The launch room all groups share: the cluster's max_workers and Conservative's bound.

        It changes only when a launch or termination is added, so a caller that asks for
        every group in turn computes it once.
        """
        room = 1 << 62
        if rate_limited and (self.landing or self.just_grown):
            # Ray reports the work a grow is for as pending until the grow lands (its demand
            # list is published once a second, later under load): a pod launched now could
            # be for work that is about to run, or already runs. Launch for what is still
            # waiting once the grow has landed and Ray has had JUST_GROWN_S to say so.
            self.held_for_landing = True
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

    def _group_room(self, g: GroupSpec, cluster_room: int) -> int:
        """`launch_room` given the shared part, `_cluster_room`."""
        if g.is_head:
            return 0
        room = cluster_room
        if g.max_workers is not None:
            room = min(room, g.max_workers - self.worker_count(g.name))
        return max(0, room)

    # --- step 1 and 2: min and max -----------------------------------------------------------
    def enforce_min(self) -> None:
        for g in sorted(self.snap.groups.values(), key=lambda g: g.name):
            if g.is_head:
                continue
            missing = g.min_workers - self.worker_count(g.name)
            count = min(missing, self.launch_room(g, rate_limited=False))
            if count > 0:
                self.add_launch(g, count, f"min_workers={g.min_workers}")
            if missing > count:
                self.notes.append(
                    f"group {g.name}: {missing - count} pod(s) short of min_workers="
                    f"{g.min_workers}, held back by max_workers"
                )

    def enforce_max(self) -> None:
        def removable(pods: Iterable[PodView]) -> list[PodView]:
            cands = [p for p in pods if p.name not in self.terminate and self._is_removable(p)]
            # pending first, then the longest idle; names keep it deterministic
            return sorted(cands, key=lambda p: (p.phase != PodPhase.PENDING, -p.idle_s, p.name))

        for g in sorted(self.snap.groups.values(), key=lambda g: g.name):
            if g.is_head or g.max_workers is None:
                continue
            excess = self.worker_count(g.name) - g.max_workers
            for p in removable(self.pods_by_group.get(g.name, []))[: max(0, excess)]:
                self.terminate[p.name] = TerminateAction(
                    pod=p.name,
                    group=g.name,
                    reason=f"group {g.name} has more than max_workers={g.max_workers}",
                )
        cap = self.settings.max_workers
        if cap is not None:
            excess = self.total_workers() - cap
            workers = [
                p
                for g in self.snap.groups.values()
                if not g.is_head
                for p in self.pods_by_group.get(g.name, [])
            ]
            for p in removable(workers)[: max(0, excess)]:
                self.terminate[p.name] = TerminateAction(
                    pod=p.name,
                    group=p.group,
                    reason=f"cluster has more than max_workers={cap} workers",
                )

    def _is_removable(self, p: PodView) -> bool:
        group = self.snap.groups.get(p.group)
        if group is None or group.is_head:
            return False
        return p.phase == PodPhase.PENDING or p.idle_s > 0

    def add_launch(self, g: GroupSpec, count: int, reason: str) -> None:
        self.launch[g.name] += count
        self.launch_reasons.setdefault(g.name, Counter())[reason] += count

    # --- bins -------------------------------------------------------------------------------
    def eligible_for_growth(self, p: PodView, g: GroupSpec) -> bool:
        """May grow: a running pod of an IPPR group with no failure on record, and no
        resize in flight other than a grow the kubelet is carrying out (which the plan
        may retarget further up); none just after a grow landed (`just_grown`), as Ray
        may still report the work it took."""
        return (
            not self.just_grown
            and g.ippr is not None
            and p.phase == PodPhase.RUNNING
            and p.raylet_id is not None
            and (p.resize is None or self.retargetable(p))
            and not p.failed
        )

    @staticmethod
    def retargetable(p: PodView) -> bool:
        """A grow in progress: the saga running it takes a higher target (`retarget`).
        A deferred or infeasible one waits for room on the node: asking for more would
        not help."""
        r = p.resize
        return (
            r is not None
            and r.state == KubeletResizeState.IN_PROGRESS
            and r.cpu >= p.total.cpu
            and r.memory >= p.total.memory
            # a kubelet suggestion below the target: the node has no room for more
            and (p.suggested_max_cpu is None or p.suggested_max_cpu >= r.cpu)
            and (p.suggested_max_memory is None or p.suggested_max_memory >= r.memory)
        )

    def pod_bins(self, room: Room) -> list[_Bin]:
        """Existing pods as bins: their `room`, plus the headroom they may grow into."""
        bins: list[_Bin] = []
        for p in sorted(self.snap.pods, key=lambda p: p.name):
            g = self.snap.groups.get(p.group)
            if g is None or p.name in self.terminate:
                continue
            labels = {**g.labels, **p.labels}
            if p.phase == PodPhase.PENDING:
                cap = self._new_pod_capacity(g)
                bins.append(
                    _Bin(
                        p.name, g, labels, list(cap), [0] * self.width, list(cap), list(cap), pod=p
                    )
                )
                continue
            total = self.vec(p.total)
            free = list(total) if room is Room.CAPACITY else self.vec(p.available)
            size = list(total)
            # in flight: counts at its target; error / timed out: being rolled back to
            # where it started, so it counts as it is now
            if p.resize is not None and p.resize.state.in_flight:
                target_cpu, target_mem = p.resize.cpu, p.resize.memory
                if p.suggested_max_cpu is not None:
                    target_cpu = min(target_cpu, max(p.suggested_max_cpu, total[self.cpu_i]))
                if p.suggested_max_memory is not None:
                    target_mem = min(target_mem, max(p.suggested_max_memory, total[self.mem_i]))
                free[self.cpu_i] += target_cpu - total[self.cpu_i]
                free[self.mem_i] += target_mem - total[self.mem_i]
                size[self.cpu_i], size[self.mem_i] = target_cpu, target_mem
            free = [max(0, v) for v in free]
            headroom = [0] * self.width
            ceiling = list(size)
            if self.eligible_for_growth(p, g):
                assert g.ippr is not None
                max_cpu = g.ippr.max_cpu
                max_mem = g.ippr.max_memory
                if p.suggested_max_cpu is not None:
                    max_cpu = min(max_cpu, p.suggested_max_cpu)
                if p.suggested_max_memory is not None:
                    max_mem = min(max_mem, p.suggested_max_memory)
                ceiling[self.cpu_i] = max(size[self.cpu_i], max_cpu)
                ceiling[self.mem_i] = max(size[self.mem_i], max_mem)
                headroom[self.cpu_i] = ceiling[self.cpu_i] - size[self.cpu_i]
                headroom[self.mem_i] = ceiling[self.mem_i] - size[self.mem_i]
            bins.append(_Bin(p.name, g, labels, free, headroom, size, ceiling, pod=p))
        for b in bins:
            b.special = self._special(b.ceiling)
            b.gpu = self.has_gpu(b.ceiling)
        return bins

    def _special(self, capacity: list[int]) -> frozenset[int]:
        return frozenset(
            i for i, v in enumerate(capacity) if v and i != self.cpu_i and i != self.mem_i
        )

    def new_bins(self, g: GroupSpec, count: int) -> list[_Bin]:
        cap = self._new_pod_capacity(g)
        special = self._special(cap)
        gpu = self.has_gpu(cap)
        out = []
        for _ in range(count):
            self.new_serial += 1
            out.append(
                _Bin(
                    f"{g.name}#new{self.new_serial}",
                    g,
                    g.labels,
                    list(cap),
                    [0] * self.width,
                    list(cap),
                    list(cap),
                    special=special,
                    gpu=gpu,
                )
            )
        return out

    def _empty_bins(self, capacity_bins: Iterable[_Bin]) -> list[_Bin]:
        """A free-room bin for each planned pod among `capacity_bins`: a new pod starts empty."""
        return [self.new_bins(cb.group, 1)[0] for cb in capacity_bins if cb.pod is None]

    # --- placing -----------------------------------------------------------------------------
    def has_gpu(self, capacity: list[int]) -> bool:
        return self.gpu_i is not None and capacity[self.gpu_i] > 0

    def needs_gpu(self, shape: Shape) -> bool:
        return self.gpu_i is not None and any(i == self.gpu_i for i, _ in shape)

    def may_use(self, b: _Bin, needs_gpu: bool) -> bool:
        """May work place on this pod at the current GPU stage (see `gpu_stages`)?"""
        if not b.gpu or needs_gpu or self.gpu_stage == GpuStage.ANY_GPU:
            return True
        if self.gpu_stage == GpuStage.OWN_PODS:
            return False
        # SPARE_GPU: the spare room of a GPU pod, running or pending (counted empty at
        # its maximum), once GPU work has had its pick: Ray too fills the nodes it has
        # before it buys one. While GPU work waits, a GPU pod the plan does not use comes
        # last if it is pending or idle past the timeout: once free it goes (idle removal)
        # and makes room under the group's maximum for a GPU pod that work fits
        p = b.pod
        if p is None:
            return False
        may_go = p.phase != PodPhase.RUNNING or (
            p.idle_s > 0 and self.settings.idle_timeout_s <= p.idle_s
        )
        return not (self.gpu_waiting and may_go and not b.used)

    def may_launch(self, group_has_gpu: bool, needs_gpu: bool) -> bool:
        """May work launch a pod of such a group at the current GPU stage?"""
        if needs_gpu or self.gpu_stage == GpuStage.ANY_GPU:
            return True
        return self.gpu_stage == GpuStage.SPARE_GPU and not group_has_gpu

    def gpu_stages(
        self, left: Callable[[], bool], gpu_left: Callable[[], bool] = lambda: True
    ) -> Iterator[None]:
        """GPU work may go anywhere from the start. Work that needs no GPU goes first to
        pods without GPUs (free room, growth: OWN_PODS); what is left then to the spare
        room of GPU pods and to new pods without GPUs (SPARE_GPU, see `may_use`); only
        what is still `left` to new GPU pods and any GPU pod (ANY_GPU)."""
        if self.gpu_i is None:  # no GPUs anywhere: one pass with everything allowed
            self.gpu_stage = GpuStage.ANY_GPU
            yield
            return
        for stage in (GpuStage.OWN_PODS, GpuStage.SPARE_GPU, GpuStage.ANY_GPU):
            if stage != GpuStage.OWN_PODS and not left():
                break
            if stage == GpuStage.SPARE_GPU:
                self.gpu_waiting = gpu_left()
            self.gpu_stage = stage
            yield
        self.gpu_stage = GpuStage.ANY_GPU
        self.gpu_waiting = True

    @staticmethod
    def fit(b: _Bin, shape: Shape, grow: bool) -> int:
        best = 1 << 62
        if grow:
            free, head = b.free, b.headroom
            for i, a in shape:
                n = (free[i] + head[i]) // a
                if n < best:
                    best = n
                    if not n:
                        return 0
        else:
            free = b.free
            for i, a in shape:
                n = free[i] // a
                if n < best:
                    best = n
                    if not n:
                        return 0
        return best

    def take(self, b: _Bin, shape: Shape, k: int, kind: Work, sel: Selector = ()) -> None:
        """Put k copies on b, growing it into its headroom where its free room ends."""
        if self.txn is not None and id(b) not in self.txn:
            self.txn[id(b)] = _Undo.of(b)
        grew = False
        for i, a in shape:
            need = a * k
            if need > b.free[i]:
                extra = need - b.free[i]
                b.headroom[i] -= extra
                b.free[i] = 0
                grew = True
            else:
                b.free[i] -= need
        b.used = True
        b.placed[(kind, shape)] += k
        if sel:
            b.sels.add(sel)
        if grew:
            b.grown = True
            b.placed_by_growth[(kind, shape)] += k
            self._round_growth(b)

    def _round_growth(self, b: _Bin) -> None:
        """Round the size the pod grows to up to the step (or to the max): the surplus
        becomes free room for the next placements."""
        policy = self.settings.resize_policy
        for i, step in (
            (self.cpu_i, self.settings.cpu_step),
            (self.mem_i, self.settings.memory_step),
        ):
            size = b.ceiling[i] - b.headroom[i]
            if size <= b.base[i] and policy != ResizePolicy.MAX:
                continue
            if policy == ResizePolicy.MAX:
                target = b.ceiling[i]
            else:
                target = min(b.ceiling[i], -(-size // step) * step)
            surplus = target - size
            if surplus > 0:
                b.headroom[i] -= surplus
                b.free[i] += surplus

    def place_items(
        self,
        items: list[_Item],
        bins: list[_Bin],
        grow: bool,
    ) -> None:
        """Best fit, largest shapes first: fill the tightest pods that still fit."""
        for item in items:
            kind, shape, selector, remaining = item.kind, item.shape, item.selector, item.remaining
            if remaining <= 0:
                continue
            needs = frozenset(i for i, _ in shape)
            cands = []
            for b in bins:
                # a pod grown in this plan may have room left from rounding its growth up
                if grow and not (b.headroom[self.cpu_i] or b.headroom[self.mem_i] or b.grown):
                    continue
                if not self.may_use(b, item.gpu):
                    continue
                n = self.fit(b, shape, grow)
                if n and b.matches(selector):
                    # work that needs no GPU (or other special resource) goes to pods
                    # without one first
                    cands.append((bool(b.special - needs), n, b.key, b))
            cands.sort(key=lambda c: (c[0], c[1], c[2]))
            for _, n, _, b in cands:
                k = min(n, remaining)
                self.take(b, shape, k, kind, selector)
                remaining -= k
                if not remaining:
                    break
                if grow:  # rounding may have opened more room on the last bin
                    more = self.fit(b, shape, grow)
                    if more:
                        k = min(more, remaining)
                        self.take(b, shape, k, kind, selector)
                        remaining -= k
                        if not remaining:
                            break
            item.remaining = remaining

    def launch_for_items(self, items: list[_Item], bins: list[_Bin]) -> None:
        """New pods for what is left. Room on pods already planned is used first; then,
        one pod at a time (identical ones in a batch), the group whose new pod takes the
        most of everything still waiting, so mixed shapes share pods (fewest launches)."""
        planned = [b for b in bins if b.pod is None]
        if planned:
            self.place_items(items, planned, grow=False)
        groups = sorted(
            (g for g in self.snap.groups.values() if not g.is_head), key=lambda g: g.name
        )
        while True:
            live = [it for it in items if it.remaining > 0]
            if not live:
                return
            choice = self._best_fill(groups, live)
            if choice is None:
                return
            g, fill, room = choice
            copies = max(1, min(room, min(it.remaining // k for it, k in fill)))
            fresh = self.new_bins(g, copies)
            bins.extend(fresh)
            what = ", ".join(f"{self.res(it.shape).describe()} {it.kind}" for it, _ in fill)
            for b in fresh:
                b.launch_reason = what
                for it, k in fill:
                    self.take(b, it.shape, k, it.kind, it.selector)
            for it, k in fill:
                it.remaining -= k * copies
            self.add_launch(g, copies, what)

    def _best_fill(
        self, groups: Sequence[GroupSpec], live: list[_Item]
    ) -> tuple[GroupSpec, list[tuple[_Item, int]], int] | None:
        """The group whose new pod (at its IPPR maximum) holds the most of what is left."""
        best: tuple[tuple[int, float, float, str], GroupSpec, list[tuple[_Item, int]], int] | None
        best = None
        cluster_room = self._cluster_room(rate_limited=True)
        for g in groups:
            room = self._group_room(g, cluster_room)
            if room <= 0:
                continue
            cap = self._new_pod_capacity(g)
            free = list(cap)
            fill: list[tuple[_Item, int]] = []
            volume = 0.0
            wanted: set[int] = set()
            has_gpu = self.has_gpu(cap)
            for it in live:
                if it.selector and not selector_matches(it.selector, g.labels):
                    continue
                if not self.may_launch(has_gpu, it.gpu):
                    continue
                k = min(it.remaining, min(free[i] // a for i, a in it.shape))
                if k <= 0:
                    continue
                for i, a in it.shape:
                    free[i] -= a * k
                fill.append((it, k))
                volume += k * sum(a / self.ref[i] for i, a in it.shape)
                wanted.update(i for i, _ in it.shape)
            if not fill:
                continue
            # pods carrying resources the work does not need (GPUs for CPU work) come last
            unneeded = sum(
                1
                for i, v in enumerate(cap)
                if v and i not in wanted and i not in (self.cpu_i, self.mem_i)
            )
            template = sum(v / self.ref[i] for i, v in enumerate(self.vec(g.resources)))
            score = (unneeded, -volume, template, g.name)
            if best is None or score < best[0]:
                best = (score, g, fill, room)
        return (best[1], best[2], best[3]) if best else None

    def _best_group(
        self, groups: Sequence[GroupSpec], shape: Shape, selector: Selector, remaining: int
    ) -> tuple[GroupSpec, int] | None:
        best: tuple[tuple[int, float, str], GroupSpec, int] | None = None
        wanted = {i for i, _ in shape}
        gpu = self.needs_gpu(shape) or self.gang_gpu
        cluster_room = self._cluster_room(rate_limited=True)
        for g in groups:
            if not selector_matches(selector, g.labels) or self._group_room(g, cluster_room) <= 0:
                continue
            cap = self._new_pod_capacity(g)
            if not self.may_launch(self.has_gpu(cap), gpu):
                continue
            per_pod = min((cap[i] // a for i, a in shape), default=0)
            if per_pod <= 0:
                continue
            k = min(per_pod, remaining)
            used = [(a * k) / cap[i] for i, a in shape]
            # avoid pods carrying resources the shape does not need (GPUs for CPU work)
            unneeded = sum(
                1
                for i, v in enumerate(cap)
                if v and i not in wanted and i not in (self.cpu_i, self.mem_i)
            )
            score = (unneeded, -sum(used) / len(used), g.name)
            if best is None or score < best[0]:
                best = (score, g, per_pod)
        return (best[1], best[2]) if best else None

    # --- gangs ---------------------------------------------------------------------------------
    def _fill_gang(
        self, gang: Gang, left: int, bins: list[_Bin], *, grow: bool, launch: bool
    ) -> int:
        """Place copies of `gang` until `left` are placed or one does not fit; how many are left."""
        while left and self.place_gang(gang, bins, grow=grow, launch=launch):
            left -= 1
        return left

    def place_gang(self, gang: Gang, bins: list[_Bin], grow: bool, launch: bool) -> bool:
        """Place every bundle of one gang, or nothing."""
        bundles = [
            (
                self.shape(b),
                tuple(
                    sorted(
                        (gang.bundle_selectors[i] if i < len(gang.bundle_selectors) else {}).items()
                    )
                ),
            )
            for i, b in enumerate(gang.bundles)
        ]
        order = sorted(range(len(bundles)), key=lambda i: self.size_key(bundles[i][0]))
        # a placement group with a GPU bundle is GPU work, its other bundles included:
        # they may go where GPU work may (a pod without GPUs still comes first for them)
        self.gang_gpu = any(self.needs_gpu(shape) for shape, _ in bundles)
        self.txn = {}
        launched_before = Counter(self.launch)
        reasons_before = {k: Counter(v) for k, v in self.launch_reasons.items()}
        n_bins = len(bins)
        ok = self._place_bundles(gang.strategy, bundles, order, bins, grow, launch)
        self.gang_gpu = False
        saved, self.txn = self.txn, None
        if ok:
            return True
        del bins[n_bins:]
        for undo in saved.values():
            undo.restore()
        self.launch = launched_before
        self.launch_reasons = reasons_before
        return False

    def _place_bundles(
        self,
        strategy: GangStrategy,
        bundles: list[tuple[Shape, Selector]],
        order: list[int],
        bins: list[_Bin],
        grow: bool,
        launch: bool,
    ) -> bool:
        if strategy in (GangStrategy.STRICT_PACK, GangStrategy.PACK):
            total: Counter[int] = Counter()
            for shape, _ in bundles:
                for i, a in shape:
                    total[i] += a
            whole = tuple(sorted(total.items()))
            sel = tuple(sorted({kv for _, s in bundles for kv in s}))
            b = self._pick_bin(bins, whole, sel, grow, exclude=set())
            if b is None and launch:
                b = self._launch_one(bins, whole, sel)
            if b is not None:
                for shape, bundle_sel in bundles:
                    self.take(b, shape, 1, Work.GANG, bundle_sel)
                return True
            if strategy == GangStrategy.STRICT_PACK:
                return False
        spread = strategy in (GangStrategy.SPREAD, GangStrategy.STRICT_SPREAD)
        used: set[int] = set()
        for i in order:
            shape, sel = bundles[i]
            b = None
            if strategy == GangStrategy.PACK and used:
                # keep a packed gang together: the pods it already uses come first
                b = self._pick_bin([x for x in bins if id(x) in used], shape, sel, grow, set())
            if b is None:
                b = self._pick_bin(bins, shape, sel, grow, exclude=used if spread else set())
            if b is None and strategy == GangStrategy.SPREAD:
                b = self._pick_bin(bins, shape, sel, grow, exclude=set())
            if b is None and launch:
                b = self._launch_one(bins, shape, sel)
            if b is None:
                return False
            self.take(b, shape, 1, Work.GANG, sel)
            used.add(id(b))
        return True

    def _fits_totals(self, gang: Gang, totals: list[list[int]]) -> bool:
        """Could Ray place this gang on the registered nodes if they were empty?"""
        shapes = sorted((self.shape(b) for b in gang.bundles), key=self.size_key)

        def fits(shape: Shape, t: list[int]) -> bool:
            return all(t[i] >= a for i, a in shape)

        if gang.strategy == GangStrategy.STRICT_PACK:
            whole: Counter[int] = Counter()
            for shape in shapes:
                for i, a in shape:
                    whole[i] += a
            return any(fits(tuple(whole.items()), t) for t in totals)
        if gang.strategy == GangStrategy.STRICT_SPREAD:
            free = sorted(range(len(totals)), key=lambda k: sum(totals[k]))
            for shape in shapes:
                k = next((k for k in free if fits(shape, totals[k])), None)
                if k is None:
                    return False
                free.remove(k)
            return True
        return all(any(fits(shape, t) for t in totals) for shape in shapes)

    def _pick_bin(
        self, bins: Sequence[_Bin], shape: Shape, sel: Selector, grow: bool, exclude: set[int]
    ) -> _Bin | None:
        best: tuple[bool, int, str, _Bin] | None = None
        i0, a0 = shape[0] if shape else (0, 0)
        fit = self.fit
        gpu = self.needs_gpu(shape)
        for b in bins:
            # cheap first test on one resource before the full fit
            if b.free[i0] + (b.headroom[i0] if grow else 0) < a0 or id(b) in exclude:
                continue
            if not self.may_use(b, gpu or self.gang_gpu):
                continue
            n = fit(b, shape, grow)
            if not n or not b.matches(sel):
                continue
            # GPU pods last for work that needs none (round two lets it use them)
            rank = (b.gpu and not gpu, n, b.key)
            if best is None or rank < best[:3]:
                best = (*rank, b)
                if rank[:2] == (False, 1):  # the tightest possible fit: in list order
                    break
        return best[3] if best else None

    def _launch_one(self, bins: list[_Bin], shape: Shape, sel: Selector) -> _Bin | None:
        groups = sorted(
            (g for g in self.snap.groups.values() if not g.is_head), key=lambda g: g.name
        )
        choice = self._best_group(groups, shape, sel, 1)
        if choice is None:
            return None
        g = choice[0]
        b = self.new_bins(g, 1)[0]
        bins.append(b)
        b.launch_reason = f"{Work.GANG} {self.res(shape).describe()}"
        self.add_launch(g, 1, b.launch_reason)
        return b

    def smaller_launches(self, bins: Iterable[_Bin]) -> None:
        """A pod launched for work that a smaller group's new pod (at its IPPR maximum)
        also holds is launched in that group instead: as many pods, less capacity."""
        groups = [g for g in self.snap.groups.values() if not g.is_head]
        size = {g.name: self._template_size(g) for g in groups}
        by_size = sorted(groups, key=lambda g: (size[g.name], g.name))
        for b in bins:
            if b.pod is not None or b.launch_reason is None:
                continue
            used = [c - f for c, f in zip(b.ceiling, b.free, strict=True)]
            needs_gpu = self.has_gpu(used)
            for g in by_size:
                if size[g.name] >= size[b.group.name]:
                    break
                cap = self._new_pod_capacity(g)
                if (self.has_gpu(cap) and not needs_gpu) or any(
                    u > c for u, c in zip(used, cap, strict=True)
                ):
                    continue
                if not all(selector_matches(sel, g.labels) for sel in b.sels):
                    continue
                if g.max_workers is not None and self.worker_count(g.name) >= g.max_workers:
                    continue
                old = b.group.name
                self.launch[old] -= 1
                reasons = self.launch_reasons[old]
                reasons[b.launch_reason] -= 1
                if reasons[b.launch_reason] <= 0:
                    del reasons[b.launch_reason]
                self.add_launch(g, 1, b.launch_reason)
                b.group, b.labels = g, g.labels
                b.free = [c - u for c, u in zip(cap, used, strict=True)]
                b.base, b.ceiling = list(cap), list(cap)
                b.special = self._special(cap)
                b.gpu = self.has_gpu(cap)
                b.match_cache.clear()
                break

    def _template_size(self, g: GroupSpec) -> tuple[float, float]:
        """How big a new pod of the group is: its size at launch, then at its maximum."""
        return (
            sum(v / self.ref[i] for i, v in enumerate(self.vec(g.resources))),
            sum(v / self.ref[i] for i, v in enumerate(self._new_pod_capacity(g))),
        )

    # --- the whole plan ------------------------------------------------------------------------
    def replace_silent_pods(self) -> None:
        """A worker pod Kubernetes has run this long with no Raylet registered will not
        bring one: it is removed (and replaced if the minimum or the work asks), not
        counted as room that is coming forever. Such a pod is PENDING in the snapshot (no
        Raylet yet); `running_s` says how long Kubernetes has run it (0: not running)."""
        timeout = self.settings.raylet_start_timeout_s
        for p in sorted(self.snap.pods, key=lambda p: p.name):
            g = self.snap.groups.get(p.group)
            if g is None or g.is_head or p.name in self.terminate:
                continue
            if silent(p, timeout):
                self.terminate[p.name] = TerminateAction(
                    pod=p.name,
                    group=g.name,
                    reason=f"its Raylet has not registered {p.running_s:.0f}s after the pod "
                    f"started (limit {timeout:g}s): replaced",
                )

    def run(self) -> Plan:
        """One plan, pass by pass (each pass is a method below, in this order)."""
        self.replace_silent_pods()
        self.enforce_min()
        self.enforce_max()
        work = self.place_constraints()
        self.carry_over_to_free_room(work)
        self.place_demands_and_gangs(work)
        resizes = self._resizes(work.capacity_bins, work.free_bins)
        self.remove_idle_and_launch_for_what_waits(work, resizes)
        self.leave_grouped_tasks_to_their_groups()
        self.smaller_launches(work.free_bins)
        self.note_what_waits(work)
        self.work = work  # kept for `plan_with_trace`
        return self.to_plan(work, resizes)

    def place_constraints(self) -> _Work:
        """request_resources asks for capacity: its bundles go on the pods' whole size
        (then growth, then new pods), the pods the minimum launches included."""
        capacity_bins = self.pod_bins(Room.CAPACITY)
        for g_name, count in sorted(self.launch.copy().items()):
            capacity_bins.extend(self.new_bins(self.snap.groups[g_name], count))
        constraints = self._items(self.snap.constraints, Work.CONSTRAINT)
        for _ in self.gpu_stages(lambda: _left_without_gpu(constraints)):
            self.place_items(constraints, capacity_bins, grow=False)
            self.place_items(constraints, capacity_bins, grow=True)
            self.launch_for_items(constraints, capacity_bins)
        return _Work(capacity_bins=capacity_bins, constraints=constraints)

    def carry_over_to_free_room(self, work: _Work) -> None:
        """Demands need room that is free now: the pods as Ray reports them, with the
        growth and the launches the constraints planned carried over."""
        free_bins = self.pod_bins(Room.FREE)
        by_key = {b.key: b for b in work.capacity_bins}
        for b in free_bins:
            cb = by_key.get(b.key)
            if cb is None:
                continue
            grown = [cb.ceiling[i] - cb.headroom[i] - cb.base[i] for i in range(self.width)]
            for i, gi in enumerate(grown):
                if gi > 0:
                    b.free[i] += gi
                    b.headroom[i] -= gi
            if cb.grown:
                b.grown = True
                b.placed_by_growth.update(cb.placed_by_growth)
            b.used = b.used or cb.used
        free_bins.extend(self._empty_bins(work.capacity_bins))
        work.free_bins = free_bins

        # Ray retries a placement group that fits no node's *total* only when a node
        # registers (docs/ray-infeasible-pg.md): growing pods in place would not get it
        # placed, so such a gang is planned on free room and new pods only.
        registered = [
            self.vec(p.total)
            for p in self.snap.pods
            if p.phase == PodPhase.RUNNING and p.name not in self.terminate
        ]
        registered += [
            b.ceiling for b in free_bins if b.pod is None or b.pod.phase == PodPhase.PENDING
        ]
        unique = [list(t) for t in sorted({tuple(t) for t in registered})]
        work.gangs = [
            _Gang(gang, gang.count, self._fits_totals(gang, unique)) for gang in self.snap.gangs
        ]
        work.demands = self._items(self.demands, Work.DEMAND)

    def place_demands_and_gangs(self, work: _Work) -> None:
        """Each GPU stage: free room (gangs, then tasks), then growth, then new pods."""
        for _ in self.gpu_stages(work.left_without_gpu, lambda: self._gpu_work_left(work)):
            for pg in work.gangs:
                pg.left = self._fill_gang(
                    pg.gang, pg.left, work.free_bins, grow=False, launch=False
                )
            self.place_items(work.demands, work.free_bins, grow=False)
            for pg in work.gangs:
                if pg.growable:
                    pg.left = self._fill_gang(
                        pg.gang, pg.left, work.free_bins, grow=True, launch=False
                    )
            self.place_items(work.demands, work.free_bins, grow=True)
            for pg in work.gangs:
                pg.left = self._fill_gang(
                    pg.gang, pg.left, work.free_bins, grow=pg.growable, launch=True
                )
            self.launch_for_items(work.demands, work.free_bins)

    def _gpu_work_left(self, work: _Work) -> bool:
        return any(it.remaining and it.gpu for it in work.demands) or any(
            pg.left and any(self.needs_gpu(self.shape(b)) for b in pg.gang.bundles)
            for pg in work.gangs
        )

    def remove_idle_and_launch_for_what_waits(
        self, work: _Work, resizes: dict[str, ResizeAction]
    ) -> None:
        """Idle pods go (`_idle`). If that made room under the maxima, launch for what
        is still waiting now, not a tick later once the removal is seen (on new pods and
        pods that stay: never on a pod this plan removes)."""
        removed = len(self.terminate)
        self._idle(work.free_bins, work.capacity_bins, resizes)
        left = work.left()
        if len(self.terminate) == removed or not (left.demands or left.gangs or left.constraints):
            return
        capacity_bins, free_bins = work.capacity_bins, work.free_bins
        planned = len(capacity_bins)
        for _ in self.gpu_stages(lambda: _left_without_gpu(work.constraints)):
            self.launch_for_items(work.constraints, capacity_bins)
        free_bins.extend(self._empty_bins(capacity_bins[planned:]))
        live = [b for b in free_bins if b.pod is None or b.pod.name not in self.terminate]
        known = len(live)
        for _ in self.gpu_stages(work.left_without_gpu, lambda: self._gpu_work_left(work)):
            for pg in work.gangs:
                pg.left = self._fill_gang(pg.gang, pg.left, live, grow=False, launch=True)
            self.launch_for_items(work.demands, live)
        free_bins.extend(live[known:])

    def leave_grouped_tasks_to_their_groups(self) -> None:
        """Tasks waiting inside a placement group: its bundles hold their room."""
        if not self.in_groups:
            return
        units = sum(d.count for d in self.in_groups)
        names = sorted(
            {n for d in self.in_groups for n in d.shape if is_placement_group_resource(n)}
        )
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self.notes.append(
            f"{units} task/actor unit(s) wait inside their placement group ({shown}): "
            "the group's bundles hold their room, so they are left to it, as Ray's "
            "autoscaler does"
        )

    def note_what_waits(self, work: _Work) -> None:
        left = work.left()
        left_c, gangs_left, left_d = left.constraints, left.gangs, left.demands
        if left_c:
            self.notes.append(f"{left_c} requested bundle(s) cannot be given capacity")
        if self.held_for_landing and (gangs_left or left_d or left_c):
            if self.landing:
                self.notes.append(
                    f"no pod launched while the grow of {', '.join(self.landing)} lands: Ray "
                    "reports the work a grow is for as pending until it has landed"
                )
            if self.just_grown:
                self.notes.append(
                    f"no pod grown or launched for {JUST_GROWN_S:.0f}s after the grow of "
                    f"{', '.join(self.just_grown)} landed: Ray may still report the work it "
                    "took as pending"
                )
        if gangs_left:
            self.notes.append(f"{gangs_left} placement group(s) cannot be placed")
        if left_d:
            shapes = ", ".join(
                f"{it.remaining} × {self.res(it.shape).describe()}"
                for it in work.demands
                if it.remaining
            )
            self.notes.append(f"cannot place: {shapes}")

    def to_plan(self, work: _Work, resizes: dict[str, ResizeAction]) -> Plan:
        return Plan(
            launch=tuple(
                LaunchAction(
                    group=g,
                    count=n,
                    reason="; ".join(
                        f"{c} for {r}" for r, c in sorted(self.launch_reasons.get(g, {}).items())
                    ),
                )
                for g, n in sorted(self.launch.items())
                if n > 0
            ),
            resize=tuple(sorted(resizes.values(), key=lambda r: r.pod)),
            terminate=tuple(sorted(self.terminate.values(), key=lambda t: t.pod)),
            infeasible=work.left(),
            notes=tuple(self.notes),
        )

    def _items(self, entries: Iterable[Demand | Constraint], kind: Work) -> list[_Item]:
        merged: Counter[tuple[Shape, Selector]] = Counter()
        for e in entries:
            sel: Selector = ()
            if isinstance(e, Demand):
                sel = tuple(sorted(e.label_selector.items()))
            shape = self.shape(e.shape)
            if shape and e.count > 0:
                merged[(shape, sel)] += e.count
        items = [
            _Item(kind, shape, sel, n, self.needs_gpu(shape)) for (shape, sel), n in merged.items()
        ]
        # most constrained first (label selectors leave fewer pods to choose from), then
        # largest first
        items.sort(key=lambda it: (not it.selector, self.size_key(it.shape), it.selector))
        return items

    def _resizes(self, capacity_bins: list[_Bin], free_bins: list[_Bin]) -> dict[str, ResizeAction]:
        out: dict[str, ResizeAction] = {}
        for b in free_bins:
            if b.pod is None or not b.grown:
                continue
            cpu = b.ceiling[self.cpu_i] - b.headroom[self.cpu_i]
            mem = b.ceiling[self.mem_i] - b.headroom[self.mem_i]
            from_cpu, from_mem = b.base[self.cpu_i], b.base[self.mem_i]
            if (cpu, mem) == (from_cpu, from_mem):
                continue
            what = ", ".join(
                f"{n} × {self.res(shape).describe()} {kind}"
                for (kind, shape), n in sorted(b.placed_by_growth.items())
            )
            grow = f"grow {_size_text(from_cpu, from_mem)} → {_size_text(cpu, mem)}"
            retarget = b.pod.resize is not None
            if retarget:
                # the saga started from the pod's size now: that stays its way back
                grow = f"retarget the grow in flight to {_size_text(from_cpu, from_mem)} → " + (
                    _size_text(cpu, mem)
                )
                from_cpu, from_mem = b.pod.total.cpu, b.pod.total.memory
            out[b.key] = ResizeAction(
                pod=b.key,
                group=b.group.name,
                cpu=cpu,
                memory=mem,
                from_cpu=from_cpu,
                from_memory=from_mem,
                reason=f"{what} → {grow}",
                retarget=retarget,
            )
        return out

    def _idle(
        self, free_bins: list[_Bin], capacity_bins: list[_Bin], resizes: dict[str, ResizeAction]
    ) -> None:
        timeout = self.settings.idle_timeout_s
        used = {b.key for b in free_bins if b.used} | {b.key for b in capacity_bins if b.used}
        for b in free_bins:
            p, g = b.pod, b.group
            if p is None or p.name in used or p.name in self.terminate or p.name in resizes:
                continue
            if p.phase != PodPhase.RUNNING or p.idle_s <= 0 or p.idle_s < timeout:
                continue
            if p.resize is not None:
                continue
            template = self.vec(g.resources)
            size = self.vec(p.total)
            grown = (
                size[self.cpu_i] > template[self.cpu_i] or size[self.mem_i] > template[self.mem_i]
            )
            # a failure record blocks growing, not going back to the template: a pod whose
            # grow failed later still shrinks once idle (a failed shrink is tried again no
            # sooner than an idle timeout after it failed)
            may_shrink = not p.failed or p.failed_age_s >= timeout
            if grown and g.ippr is not None and may_shrink and p.raylet_id is not None:
                cpu = min(size[self.cpu_i], template[self.cpu_i])
                mem = min(size[self.mem_i], template[self.mem_i])
                resizes[p.name] = ResizeAction(
                    pod=p.name,
                    group=g.name,
                    cpu=cpu,
                    memory=mem,
                    from_cpu=size[self.cpu_i],
                    from_memory=size[self.mem_i],
                    reason=(
                        f"idle {p.idle_s:g}s ≥ {timeout:g}s after growing → shrink "
                        f"{_size_text(size[self.cpu_i], size[self.mem_i])} → {_size_text(cpu, mem)}"
                    ),
                )
                continue
            if g.is_head:
                continue
            if self.worker_count(g.name) <= g.min_workers:
                continue
            self.terminate[p.name] = TerminateAction(
                pod=p.name, group=g.name, reason=f"idle {p.idle_s:g}s ≥ {timeout:g}s"
            )


def _left_without_gpu(items: Iterable[_Item]) -> bool:
    return any(it.remaining and not it.gpu for it in items)


def _in_placement_group(d: Demand) -> bool:
    return any(is_placement_group_resource(name) for name in d.shape)


def _size_text(cpu: int, memory: int) -> str:
    cores = cpu / 1000
    mem = Resources({MEMORY: memory}).to_k8s().get("memory", "0")
    return f"{int(cores) if cores == int(cores) else cores} CPU/{mem}"


# A grow raysize asked for longer ago than this is stuck, not landing: launches go ahead.
LANDING_S = 10.0
# After a grow has landed, Ray may report the work it took as pending for a moment more
# (its demand list is published about once a second; later on a loaded head): grows and
# launches wait this long after a grow's saga finished (`plan(just_grown=...)`), about
# the period of Ray's own autoscaler loop.
JUST_GROWN_S = 5.0


def silent(p: PodView, timeout_s: float) -> bool:
    """Kubernetes has run the pod for `timeout_s` (the Raylet start timeout) or more, and
    its Raylet has not registered (`running_s` is 0 for a pod Kubernetes does not run;
    the timeout is positive)."""
    return p.raylet_id is None and p.running_s >= timeout_s


def landing_grows(snap: ClusterSnapshot) -> list[str]:
    """Pods whose grow is landing: the pod has its new size and only its Raylet is
    catching up (`raylet_only`), or raysize asked the kubelet within LANDING_S and it is
    carrying the grow out. A pod with a failure on record grows no more."""
    return sorted(
        p.name
        for p in snap.pods
        if p.phase == PodPhase.RUNNING
        and not p.failed
        and (r := p.resize) is not None
        and r.state == KubeletResizeState.IN_PROGRESS
        and (r.cpu > p.total.cpu or r.memory > p.total.memory)
        and (r.raylet_only or (r.asked_s is not None and r.asked_s <= LANDING_S))
    )


def plan(snapshot: ClusterSnapshot, *, just_grown: Sequence[str] = ()) -> Plan:
    """Decide one reconcile tick. Pure: the same inputs always give the same plan.
    `just_grown`: pods whose grow landed less than JUST_GROWN_S ago (the reconcile
    workflow's memory, not in the snapshot): no pod is grown or launched for demand yet."""
    return _Planner(*_bound(snapshot), just_grown=just_grown).run()


def _bound(snapshot: ClusterSnapshot) -> tuple[ClusterSnapshot, str]:
    """At most MAX_PLAN_UNITS units a plan, and a note saying what waits."""
    cut, left_out = bounded(snapshot)
    if not left_out:
        return snapshot, ""
    return cut, (
        f"{left_out} of {plan_units(snapshot)} pending units wait for the next plan: one plan "
        f"places at most {MAX_PLAN_UNITS} (tasks first, then placement groups, then "
        "request_resources)"
    )


# --- where the plan puts the work (for people: `raysize plan --explain`) -------------------

FREE_ROOM, GROWN, PENDING_POD, NEW_POD = "free room", "grown", "pending pod", "new pod"


@dataclass(frozen=True)
class Placement:
    """`count` units of one shape that the plan puts on one pod."""

    pod: str  # a pod's name, or "<group>#new<i>" for a pod the plan launches
    group: str
    where: str  # FREE_ROOM, GROWN (needs the pod's resize), PENDING_POD or NEW_POD
    kind: str  # "pending" (task/actor), "gang bundle" or "requested" (request_resources)
    shape: Resources
    count: int


@dataclass(frozen=True)
class Left:
    """`count` units of one shape (or placement groups) the plan leaves waiting."""

    kind: str  # "pending", "requested" or "placement group"
    shape: Resources  # a placement group's bundles added up
    count: int
    selector: tuple[tuple[str, str], ...] = ()
    strategy: str = ""  # a placement group's strategy
    bundles: int = 0  # a placement group's bundle count


@dataclass(frozen=True)
class Trace:
    placements: tuple[Placement, ...]
    left: tuple[Left, ...]
    in_groups: tuple[Demand, ...]  # demands left to their placement group (dropped)


def plan_with_trace(snapshot: ClusterSnapshot) -> tuple[Plan, Trace]:
    """The plan, and where it puts each unit: the same decision as `plan()`."""
    planner = _Planner(*_bound(snapshot))
    result = planner.run()
    placements: list[Placement] = []

    def add(bins: Iterable[_Bin], kinds: set[str]) -> None:
        for b in bins:
            if b.pod is None:
                where = NEW_POD
            elif b.pod.phase == PodPhase.PENDING:
                where = PENDING_POD
            else:
                where = FREE_ROOM
            for (kind, shape), n in sorted(b.placed.items()):
                if kind not in kinds:
                    continue
                grown = b.placed_by_growth.get((kind, shape), 0) if where == FREE_ROOM else 0
                for part, k in ((GROWN, grown), (where, n - grown)):
                    if k > 0:
                        placements.append(
                            Placement(b.key, b.group.name, part, kind, planner.res(shape), k)
                        )

    work = planner.work
    add(work.capacity_bins, {Work.CONSTRAINT})
    add(work.free_bins, {Work.DEMAND, Work.GANG})
    left = [
        Left(it.kind, planner.res(it.shape), it.remaining, it.selector)
        for it in (*work.constraints, *work.demands)
        if it.remaining
    ]
    left += [
        Left(
            "placement group",
            sum(gang.bundles, Resources()),
            n,
            strategy=gang.strategy.value,
            bundles=len(gang.bundles),
        )
        for gang, n in ((pg.gang, pg.left) for pg in work.gangs)
        if n
    ]
    return result, Trace(tuple(placements), tuple(left), tuple(planner.in_groups))
