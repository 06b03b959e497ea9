"""Bins: the pods work is placed on, existing (`pod_bins`) or launched by the plan
(`new_bins`), and placing on one (`fit`, `take`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from raysize.workflows.model import (
    GroupSpec,
    KubeletResizeState,
    PodPhase,
    PodView,
    ResizePolicy,
)
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.selectors import Selector, selector_matches
from raysize.workflows.planner.vectors import Shape
from raysize.workflows.planner.work import WorkKind


class Room(Enum):
    """Which room of the existing pods a pass places on."""

    CAPACITY = "capacity"  # their whole size: request_resources asks for capacity
    FREE = "free"  # what Ray reports available: demands need room that is free now


# the room of a resource a node does not limit (all but CPU and memory)
UNLIMITED = 1 << 62


@dataclass(eq=False, slots=True)
class NodeBudget:
    """The room a node has left for its pods to grow into (`NodeRoom`), shared by the bins
    of the pods on it: a grow planned on one leaves less for the others."""

    name: str
    room: list[int]  # by resource index; UNLIMITED but for CPU and memory
    start: tuple[int, int]  # (millicores, bytes) free before this plan: said in its reasons


@dataclass(eq=False, slots=True)
class Bin:
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
    placed_by_growth: Counter[tuple[WorkKind, Shape]] = field(default_factory=Counter)
    placed: Counter[tuple[WorkKind, Shape]] = field(default_factory=Counter)
    match_cache: dict[Selector, bool] = field(default_factory=dict)
    special: frozenset[int] = frozenset()  # resources other than CPU/memory (GPU, …)
    gpu: bool = False  # it has GPUs: work that needs none comes here last
    sels: set[Selector] = field(default_factory=set)  # label selectors of what it holds
    launch_reason: str | None = None  # a new pod launched for work: why
    node: NodeBudget | None = None  # its node's room (None: not known, not limited)

    def grow_room(self, i: int) -> int:
        """How much more resource `i` it may take by growing: its own headroom, up to
        what its node has left."""
        node = self.node
        return self.headroom[i] if node is None else min(self.headroom[i], node.room[i])

    def matches(self, selector: Selector) -> bool:
        if not selector:
            return True
        hit = self.match_cache.get(selector)
        if hit is None:
            hit = self.match_cache[selector] = selector_matches(selector, self.labels)
        return hit


@dataclass(slots=True)
class BinState:
    """A bin as it was before a placement group started on it: put back if the group
    does not fit whole."""

    bin: Bin
    free: list[int]
    headroom: list[int]
    grown: bool
    used: bool
    placed: Counter[tuple[WorkKind, Shape]]
    placed_by_growth: Counter[tuple[WorkKind, Shape]]

    @classmethod
    def of(cls, b: Bin) -> BinState:
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


class UndoLog:
    """The bins one placement group's attempt has taken room on, and their nodes' room, as
    they were before."""

    def __init__(self) -> None:
        self._before: dict[int, BinState] = {}
        self._nodes: dict[int, tuple[NodeBudget, list[int]]] = {}

    def record(self, b: Bin) -> None:
        if id(b) not in self._before:
            self._before[id(b)] = BinState.of(b)
        node = b.node
        if node is not None and id(node) not in self._nodes:
            self._nodes[id(node)] = (node, list(node.room))

    def restore(self) -> None:
        for state in self._before.values():
            state.restore()
        for node, room in self._nodes.values():
            node.room[:] = room


# --- placing on a bin ------------------------------------------------------------------------


def fit(b: Bin, shape: Shape, grow: bool) -> int:
    """How many copies of `shape` the bin's free room (and headroom if `grow`) holds."""
    best = 1 << 62
    if grow:
        free = b.free
        for i, a in shape:
            n = (free[i] + b.grow_room(i)) // a
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


def take(
    ctx: PlanContext,
    b: Bin,
    shape: Shape,
    k: int,
    kind: WorkKind,
    sel: Selector = (),
    undo: UndoLog | None = None,
) -> None:
    """Put k copies on b, growing it into its headroom where its free room ends (`undo`:
    the log of the placement group being placed, if any)."""
    if undo is not None:
        undo.record(b)
    grew = False
    for i, a in shape:
        need = a * k
        if need > b.free[i]:
            extra = need - b.free[i]
            b.headroom[i] -= extra
            if b.node is not None:
                b.node.room[i] -= extra
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
        _round_growth(ctx, b)


def _round_growth(ctx: PlanContext, b: Bin) -> None:
    """Round the size the pod grows to up to the step (or to the max): the surplus
    becomes free room for the next placements."""
    settings = ctx.settings
    policy = settings.resize_policy
    for i, step in (
        (ctx.index.cpu_i, settings.cpu_step),
        (ctx.index.mem_i, settings.memory_step),
    ):
        size = b.ceiling[i] - b.headroom[i]
        if size <= b.base[i] and policy != ResizePolicy.MAX:
            continue
        if policy == ResizePolicy.MAX:
            target = b.ceiling[i]
        else:
            target = min(b.ceiling[i], -(-size // step) * step)
        if b.node is not None:  # no further than its node has room for
            target = min(target, size + max(0, b.node.room[i]))
        surplus = target - size
        if surplus > 0:
            b.headroom[i] -= surplus
            b.free[i] += surplus
            if b.node is not None:
                b.node.room[i] -= surplus


# --- making bins ----------------------------------------------------------------------------


def eligible_for_growth(ctx: PlanContext, p: PodView, g: GroupSpec) -> bool:
    """May grow: a running pod of an IPPR group with no failure on record, and no
    resize in flight other than a grow the kubelet is carrying out (which the plan
    may retarget further up). Just after a grow landed, pods grow all the same: the
    task demand it took that Ray may still report is not planned for (`taken_by_grows`)."""
    return (
        g.ippr is not None
        and p.phase == PodPhase.RUNNING
        and p.raylet_id is not None
        and (p.resize is None or retargetable(p))
        and not p.failed
    )


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


def pod_bins(ctx: PlanContext, room: Room) -> list[Bin]:
    """Existing pods as bins: their `room`, plus the headroom they may grow into."""
    ix = ctx.index
    cpu_i, mem_i, width = ix.cpu_i, ix.mem_i, ix.width
    nodes = node_budgets(ctx)
    bins: list[Bin] = []
    for p in sorted(ctx.snap.pods, key=lambda p: p.name):
        g = ctx.snap.groups.get(p.group)
        if g is None or p.name in ctx.terminate:
            continue
        labels = {**g.labels, **p.labels}
        if p.phase == PodPhase.PENDING:
            cap = ix.new_pod_capacity(g)
            bins.append(Bin(p.name, g, labels, list(cap), [0] * width, list(cap), list(cap), pod=p))
            continue
        total = ix.vec(p.total)
        free = list(total) if room is Room.CAPACITY else ix.vec(p.available)
        doubt = ctx.hold.doubt.get(p.name)
        if doubt is not None and room is Room.FREE:
            # a grow landed moments ago: the work it took may be over, and Ray reports
            # the room in use until its next publication (`landing.taken_by_grows`)
            free[cpu_i] = min(total[cpu_i], free[cpu_i] + doubt[0])
            free[mem_i] = min(total[mem_i], free[mem_i] + doubt[1])
        size = list(total)
        # in flight: counts at its target; error / timed out: being rolled back to
        # where it started, so it counts as it is now
        if p.resize is not None and p.resize.state.in_flight:
            target_cpu, target_mem = p.resize.cpu, p.resize.memory
            if p.suggested_max_cpu is not None:
                target_cpu = min(target_cpu, max(p.suggested_max_cpu, total[cpu_i]))
            if p.suggested_max_memory is not None:
                target_mem = min(target_mem, max(p.suggested_max_memory, total[mem_i]))
            free[cpu_i] += target_cpu - total[cpu_i]
            free[mem_i] += target_mem - total[mem_i]
            size[cpu_i], size[mem_i] = target_cpu, target_mem
        free = [max(0, v) for v in free]
        headroom = [0] * width
        ceiling = list(size)
        if eligible_for_growth(ctx, p, g):
            assert g.ippr is not None
            max_cpu = g.ippr.max_cpu
            max_mem = g.ippr.max_memory
            if p.suggested_max_cpu is not None:
                max_cpu = min(max_cpu, p.suggested_max_cpu)
            if p.suggested_max_memory is not None:
                max_mem = min(max_mem, p.suggested_max_memory)
            ceiling[cpu_i] = max(size[cpu_i], max_cpu)
            ceiling[mem_i] = max(size[mem_i], max_mem)
            headroom[cpu_i] = ceiling[cpu_i] - size[cpu_i]
            headroom[mem_i] = ceiling[mem_i] - size[mem_i]
        node = nodes.get(p.node) if p.node else None
        bins.append(Bin(p.name, g, labels, free, headroom, size, ceiling, pod=p, node=node))
    for b in bins:
        b.special = ix.special(b.ceiling)
        b.gpu = ix.has_gpu(b.ceiling)
    return bins


def node_budgets(ctx: PlanContext) -> dict[str, NodeBudget]:
    """The room of each node the snapshot read (`ClusterSnapshot.nodes`), fresh for one
    set of bins. A node already charged past its allocatable has none."""
    ix = ctx.index
    out: dict[str, NodeBudget] = {}
    for name, room in sorted(ctx.snap.nodes.items()):
        vec = [UNLIMITED] * ix.width
        vec[ix.cpu_i], vec[ix.mem_i] = max(0, room.cpu), max(0, room.memory)
        out[name] = NodeBudget(name, vec, (room.cpu, room.memory))
    return out


def new_bins(ctx: PlanContext, g: GroupSpec, count: int) -> list[Bin]:
    """`count` pods the plan launches in group `g`, empty at their IPPR maximum."""
    ix = ctx.index
    cap = ix.new_pod_capacity(g)
    special = ix.special(cap)
    gpu = ix.has_gpu(cap)
    out = []
    for _ in range(count):
        ctx.new_serial += 1
        out.append(
            Bin(
                f"{g.name}#new{ctx.new_serial}",
                g,
                g.labels,
                list(cap),
                [0] * ix.width,
                list(cap),
                list(cap),
                special=special,
                gpu=gpu,
            )
        )
    return out


def empty_bins(ctx: PlanContext, capacity_bins: Iterable[Bin]) -> list[Bin]:
    """A free-room bin for each planned pod among `capacity_bins`: a new pod starts empty."""
    return [new_bins(ctx, cb.group, 1)[0] for cb in capacity_bins if cb.pod is None]
