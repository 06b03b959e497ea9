"""Pass: a pod launched for work that a smaller group's new pod (at its IPPR maximum)
also holds is launched in that group instead: as many pods, less capacity."""

from __future__ import annotations

from collections.abc import Iterable

from raysize.workflows.planner.bins import Bin
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.selectors import selector_matches


def smaller_launches(ctx: PlanContext, bins: Iterable[Bin]) -> int:
    """A pod launched for work that a smaller group's new pod (at its IPPR maximum)
    also holds is launched in that group instead: as many pods, less capacity. Returns
    how many pods moved: each leaves room under its first group's maximum."""
    ix = ctx.index
    groups = [g for g in ctx.snap.groups.values() if not g.is_head]
    size = {g.name: ix.new_pod_size(g) for g in groups}
    moved = 0
    by_size = sorted(groups, key=lambda g: (size[g.name], g.name))
    for b in bins:
        if b.pod is not None or b.launch_reason is None:
            continue
        used = [c - f for c, f in zip(b.ceiling, b.free, strict=True)]
        needs_gpu = ix.has_gpu(used)
        for g in by_size:
            if size[g.name] >= size[b.group.name]:
                break
            cap = ix.new_pod_capacity(g)
            if (ix.has_gpu(cap) and not needs_gpu) or any(
                u > c for u, c in zip(used, cap, strict=True)
            ):
                continue
            if not all(selector_matches(sel, g.labels) for sel in b.sels):
                continue
            if g.max_workers is not None and ctx.worker_count(g.name) >= g.max_workers:
                continue
            ctx.launches.take_back_one(b.group.name, b.launch_reason)
            ctx.launches.add(g.name, 1, b.launch_reason)
            b.group, b.labels = g, g.labels
            b.free = [c - u for c, u in zip(cap, used, strict=True)]
            b.base, b.ceiling = list(cap), list(cap)
            b.special = ix.special(cap)
            b.gpu = ix.has_gpu(cap)
            b.match_cache.clear()
            moved += 1
            break
    return moved
