"""What a plan places, and its ledger of what is still to place: `WorkKind` (what a unit
is), `ShapeToPlace` (copies of one task or request shape), `GangToPlace` (the planner's
count of a snapshot `Gang`'s copies still waiting) and `Ledger` (the bins and all of
those, as the passes work through them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from raysize.workflows.model import Constraint, Demand, Gang, Infeasible
from raysize.workflows.planner.selectors import Selector
from raysize.workflows.planner.vectors import ResourceIndex, Shape

if TYPE_CHECKING:
    from raysize.workflows.planner.bins import Bin


class WorkKind(StrEnum):
    """What a unit of work placed on a pod is (the value is what plans and
    `raysize plan --explain` call it)."""

    DEMAND = "pending"  # a task's or an actor's pending demand
    GANG = "gang bundle"  # a bundle of a placement group
    CONSTRAINT = "requested"  # capacity asked with request_resources


@dataclass(slots=True)
class ShapeToPlace:
    """`remaining` copies of one shape (demand or constraint) still to place."""

    kind: WorkKind
    shape: Shape
    selector: Selector
    remaining: int
    gpu: bool = False  # it needs a GPU


@dataclass(slots=True)
class GangToPlace:
    """A placement group of the snapshot, and how many of its copies still wait."""

    gang: Gang
    left: int
    # it fits some registered node's total: growing pods in place can get it placed
    growable: bool


@dataclass(slots=True)
class Ledger:
    """What one plan works through, pass by pass (`passes.run`)."""

    # existing pods by their whole size, then the pods the plan launches: for constraints
    capacity_bins: list[Bin]
    constraints: list[ShapeToPlace]
    # existing pods by the room free now (the constraints' growth carried over), then
    # the pods the plan launches: for demands and placement groups
    free_bins: list[Bin] = field(default_factory=list)
    demands: list[ShapeToPlace] = field(default_factory=list)
    gangs: list[GangToPlace] = field(default_factory=list)

    def left_without_gpu(self) -> bool:
        return left_without_gpu(self.demands) or any(pg.left for pg in self.gangs)

    def gpu_work_left(self, index: ResourceIndex) -> bool:
        return any(it.remaining and it.gpu for it in self.demands) or any(
            pg.left and any(index.needs_gpu(index.shape(b)) for b in pg.gang.bundles)
            for pg in self.gangs
        )

    def left(self) -> Infeasible:
        """What is still waiting: demand units, placement groups, requested bundles."""
        return Infeasible(
            demands=sum(it.remaining for it in self.demands),
            gangs=sum(pg.left for pg in self.gangs),
            constraints=sum(it.remaining for it in self.constraints),
        )


def left_without_gpu(items: Iterable[ShapeToPlace]) -> bool:
    return any(it.remaining and not it.gpu for it in items)


def shapes_to_place(
    index: ResourceIndex, entries: Iterable[Demand | Constraint], kind: WorkKind
) -> list[ShapeToPlace]:
    """The entries merged by shape and selector, in the order they are placed."""
    merged: Counter[tuple[Shape, Selector]] = Counter()
    for e in entries:
        sel: Selector = ()
        if isinstance(e, Demand):
            sel = tuple(sorted(e.label_selector.items()))
        shape = index.shape(e.shape)
        if shape and e.count > 0:
            merged[(shape, sel)] += e.count
    items = [
        ShapeToPlace(kind, shape, sel, n, index.needs_gpu(shape))
        for (shape, sel), n in merged.items()
    ]
    # most constrained first (label selectors leave fewer pods to choose from), then
    # largest first
    items.sort(key=lambda it: (not it.selector, index.size_key(it.shape), it.selector))
    return items
