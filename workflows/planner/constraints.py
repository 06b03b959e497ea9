"""Pass: request_resources asks for capacity, so its bundles go on the pods' whole size
(`Room.CAPACITY`), then growth, then new pods; this starts the plan's `Ledger`."""

from __future__ import annotations

from raysize.workflows.planner.bins import Room, new_bins, pod_bins
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.gpu_stages import gpu_stages
from raysize.workflows.planner.packing import launch_for_items, place_items
from raysize.workflows.planner.work import Ledger, WorkKind, left_without_gpu, shapes_to_place


def place_constraints(ctx: PlanContext) -> Ledger:
    """request_resources asks for capacity: its bundles go on the pods' whole size
    (then growth, then new pods), the pods the minimum launches included."""
    # without request_resources no bundle goes on a pod's whole size: only the new pods'
    # bins are needed (the passes after this one find the pods' bins empty and unused),
    # and a quiet tick at 5,000 pods spares a pass over every pod
    capacity_bins = pod_bins(ctx, Room.CAPACITY) if ctx.snap.constraints else []
    for g_name, count in sorted(ctx.launches.count.copy().items()):
        capacity_bins.extend(new_bins(ctx, ctx.snap.groups[g_name], count))
    constraints = shapes_to_place(ctx.index, ctx.snap.constraints, WorkKind.CONSTRAINT)
    for gate in gpu_stages(ctx.index, lambda: left_without_gpu(constraints)):
        place_items(ctx, constraints, capacity_bins, gate, grow=False)
        place_items(ctx, constraints, capacity_bins, gate, grow=True)
        launch_for_items(ctx, constraints, capacity_bins, gate)
    return Ledger(capacity_bins=capacity_bins, constraints=constraints)
