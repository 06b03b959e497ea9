"""Passes: the pods by the room free now, with what the constraints planned carried
over (`carry_over_to_free_room`); then placement groups and tasks on them, on growth and
on new pods (`place_demands_and_gangs`)."""

from __future__ import annotations

from raysize.workflows.model import PodPhase
from raysize.workflows.planner.bins import Room, empty_bins, pod_bins
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.gangs import fill_gang, fits_totals
from raysize.workflows.planner.gpu_stages import gpu_stages
from raysize.workflows.planner.packing import launch_for_items, place_items
from raysize.workflows.planner.work import GangToPlace, Ledger, WorkKind, shapes_to_place


def carry_over_to_free_room(ctx: PlanContext, ledger: Ledger) -> None:
    """Demands need room that is free now: the pods as Ray reports them, with the
    growth and the launches the constraints planned carried over."""
    free_bins = pod_bins(ctx, Room.FREE)
    by_key = {b.key: b for b in ledger.capacity_bins}
    for b in free_bins:
        cb = by_key.get(b.key)
        if cb is None:
            continue
        grown = [cb.ceiling[i] - cb.headroom[i] - cb.base[i] for i in range(ctx.index.width)]
        for i, gi in enumerate(grown):
            if gi > 0:
                b.free[i] += gi
                b.headroom[i] -= gi
                if b.node is not None:  # the growth takes its node's room here too
                    b.node.room[i] -= gi
        if cb.grown:
            b.grown = True
            b.placed_by_growth.update(cb.placed_by_growth)
        b.used = b.used or cb.used
    free_bins.extend(empty_bins(ctx, ledger.capacity_bins))
    ledger.free_bins = free_bins

    # Ray retries a placement group that fits no node's *total* only when a node
    # registers (docs/design/ray-infeasible-pg.md): growing pods in place would not get it
    # placed, so such a gang is planned on free room and new pods only.
    registered = [
        ctx.index.vec(p.total)
        for p in ctx.snap.pods
        if p.phase == PodPhase.RUNNING and p.name not in ctx.terminate
    ]
    registered += [b.ceiling for b in free_bins if b.pod is None or b.pod.phase == PodPhase.PENDING]
    unique = [list(t) for t in sorted({tuple(t) for t in registered})]
    ledger.gangs = [
        GangToPlace(gang, gang.count, fits_totals(ctx, gang, unique)) for gang in ctx.snap.gangs
    ]
    ledger.demands = shapes_to_place(ctx.index, ctx.demands, WorkKind.DEMAND)


def place_demands_and_gangs(ctx: PlanContext, ledger: Ledger) -> None:
    """Each GPU stage: free room (gangs, then tasks), then growth, then new pods."""
    bins = ledger.free_bins
    for gate in gpu_stages(
        ctx.index, ledger.left_without_gpu, lambda: ledger.gpu_work_left(ctx.index)
    ):
        for pg in ledger.gangs:
            pg.left = fill_gang(ctx, pg.gang, pg.left, bins, gate, grow=False, launch=False)
        place_items(ctx, ledger.demands, bins, gate, grow=False)
        for pg in ledger.gangs:
            if pg.growable:
                pg.left = fill_gang(ctx, pg.gang, pg.left, bins, gate, grow=True, launch=False)
        place_items(ctx, ledger.demands, bins, gate, grow=True)
        for pg in ledger.gangs:
            pg.left = fill_gang(ctx, pg.gang, pg.left, bins, gate, grow=pg.growable, launch=True)
        launch_for_items(ctx, ledger.demands, bins, gate)
