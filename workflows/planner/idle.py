"""Pass: idle pods are shrunk back to their template size if they were grown, else
removed; room that made under the maxima is launched into for what still waits."""

from __future__ import annotations

from raysize.workflows.model import PodPhase, ResizeAction, TerminateAction
from raysize.workflows.planner.bins import Bin, empty_bins
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.gangs import fill_gang
from raysize.workflows.planner.gpu_stages import gpu_stages
from raysize.workflows.planner.packing import launch_for_items
from raysize.workflows.planner.work import Ledger, left_without_gpu
from raysize.workflows.resources import size_text


def remove_idle_and_launch_for_what_waits(
    ctx: PlanContext, ledger: Ledger, resizes: dict[str, ResizeAction]
) -> None:
    """Idle pods go (`shrink_or_remove_idle`). If that made room under the maxima, launch
    for what is still waiting now, not a tick later once the removal is seen (on new pods
    and pods that stay: never on a pod this plan removes)."""
    removed = len(ctx.terminate)
    shrink_or_remove_idle(ctx, ledger, resizes)
    if len(ctx.terminate) != removed:
        launch_for_what_waits(ctx, ledger)


def launch_for_what_waits(ctx: PlanContext, ledger: Ledger) -> None:
    """A later pass made room under the maxima (an idle pod removed, a launch moved to a
    smaller group): launch for what is still waiting, on new pods and pods that stay
    (never on a pod this plan removes), as the placing passes would have."""
    left = ledger.left()
    if not (left.demands or left.gangs or left.constraints):
        return
    capacity_bins, free_bins = ledger.capacity_bins, ledger.free_bins
    planned = len(capacity_bins)
    for gate in gpu_stages(ctx.index, lambda: left_without_gpu(ledger.constraints)):
        launch_for_items(ctx, ledger.constraints, capacity_bins, gate)
    free_bins.extend(empty_bins(ctx, capacity_bins[planned:]))
    live: list[Bin] = [b for b in free_bins if b.pod is None or b.pod.name not in ctx.terminate]
    known = len(live)
    for gate in gpu_stages(
        ctx.index, ledger.left_without_gpu, lambda: ledger.gpu_work_left(ctx.index)
    ):
        for pg in ledger.gangs:
            pg.left = fill_gang(ctx, pg.gang, pg.left, live, gate, grow=False, launch=True)
        launch_for_items(ctx, ledger.demands, live, gate)
    free_bins.extend(live[known:])


def shrink_or_remove_idle(
    ctx: PlanContext, ledger: Ledger, resizes: dict[str, ResizeAction]
) -> None:
    """A pod idle past the timeout that the plan does not use: back to its template
    size if it was grown, else removed (down to its group's `min_workers`)."""
    ix = ctx.index
    cpu_i, mem_i = ix.cpu_i, ix.mem_i
    timeout = ctx.settings.idle_timeout_s
    used = {b.key for b in ledger.free_bins if b.used} | {
        b.key for b in ledger.capacity_bins if b.used
    }
    for b in ledger.free_bins:
        p, g = b.pod, b.group
        if p is None or p.name in used or p.name in ctx.terminate or p.name in resizes:
            continue
        if p.phase != PodPhase.RUNNING or p.idle_s <= 0 or p.idle_s < timeout:
            continue
        if p.resize is not None:
            continue
        template = ix.vec(g.resources)
        size = ix.vec(p.total)
        grown = size[cpu_i] > template[cpu_i] or size[mem_i] > template[mem_i]
        # a failure record blocks growing, not going back to the template: a pod whose
        # grow failed later still shrinks once idle (a failed shrink is tried again no
        # sooner than an idle timeout after it failed)
        may_shrink = not p.failed or p.failed_age_s >= timeout
        if grown and g.ippr is not None and may_shrink and p.raylet_id is not None:
            cpu = min(size[cpu_i], template[cpu_i])
            mem = min(size[mem_i], template[mem_i])
            resizes[p.name] = ResizeAction(
                pod=p.name,
                group=g.name,
                cpu=cpu,
                memory=mem,
                from_cpu=size[cpu_i],
                from_memory=size[mem_i],
                reason=(
                    f"idle {p.idle_s:g}s ≥ {timeout:g}s after growing → shrink "
                    f"{size_text(size[cpu_i], size[mem_i])} → {size_text(cpu, mem)}"
                ),
            )
            continue
        if g.is_head:
            continue
        if ctx.worker_count(g.name) <= g.min_workers:
            continue
        ctx.terminate[p.name] = TerminateAction(
            pod=p.name, group=g.name, reason=f"idle {p.idle_s:g}s ≥ {timeout:g}s"
        )
