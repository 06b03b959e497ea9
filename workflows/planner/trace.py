"""Where the plan puts the work, for people (`raysize plan --explain`): `plan_with_trace`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from raysize.workflows.model import ClusterSnapshot, Demand, Plan, PodPhase
from raysize.workflows.planner.bins import Bin
from raysize.workflows.planner.passes import run
from raysize.workflows.planner.work import WorkKind
from raysize.workflows.resources import Resources

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
    result, ctx, ledger = run(snapshot)
    res = ctx.index.res
    placements: list[Placement] = []

    def add(bins: Iterable[Bin], kinds: set[str]) -> None:
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
                        placements.append(Placement(b.key, b.group.name, part, kind, res(shape), k))

    add(ledger.capacity_bins, {WorkKind.CONSTRAINT})
    add(ledger.free_bins, {WorkKind.DEMAND, WorkKind.GANG})
    left = [
        Left(it.kind, res(it.shape), it.remaining, it.selector)
        for it in (*ledger.constraints, *ledger.demands)
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
        for gang, n in ((pg.gang, pg.left) for pg in ledger.gangs)
        if n
    ]
    return result, Trace(tuple(placements), tuple(left), tuple(ctx.in_groups))
