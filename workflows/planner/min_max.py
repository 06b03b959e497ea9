"""Passes: launch pods up to each group's `min_workers` (`enforce_min`); remove pods
above a group's or the cluster's maximum, pending first, then idle, never a busy pod
(`enforce_max`)."""

from __future__ import annotations

from collections.abc import Iterable

from raysize.workflows.model import PodPhase, PodView, TerminateAction
from raysize.workflows.planner.context import PlanContext


def enforce_min(ctx: PlanContext) -> None:
    for g in sorted(ctx.snap.groups.values(), key=lambda g: g.name):
        if g.is_head:
            continue
        missing = g.min_workers - ctx.worker_count(g.name)
        count = min(missing, ctx.launch_room(g, rate_limited=False))
        if count > 0:
            ctx.launches.add(g.name, count, f"min_workers={g.min_workers}")
        if missing > count:
            ctx.notes.append(
                f"group {g.name}: {missing - count} pod(s) short of min_workers="
                f"{g.min_workers}, held back by max_workers"
            )


def enforce_max(ctx: PlanContext) -> None:
    def removable(pods: Iterable[PodView]) -> list[PodView]:
        cands = [p for p in pods if p.name not in ctx.terminate and _is_removable(ctx, p)]
        # pending first, then the longest idle; names keep it deterministic
        return sorted(cands, key=lambda p: (p.phase != PodPhase.PENDING, -p.idle_s, p.name))

    for g in sorted(ctx.snap.groups.values(), key=lambda g: g.name):
        if g.is_head or g.max_workers is None:
            continue
        excess = ctx.worker_count(g.name) - g.max_workers
        for p in removable(ctx.pods_by_group.get(g.name, []))[: max(0, excess)]:
            ctx.terminate[p.name] = TerminateAction(
                pod=p.name,
                group=g.name,
                reason=f"group {g.name} has more than max_workers={g.max_workers}",
            )
    cap = ctx.settings.max_workers
    if cap is not None:
        excess = ctx.total_workers() - cap
        workers = [
            p
            for g in ctx.snap.groups.values()
            if not g.is_head
            for p in ctx.pods_by_group.get(g.name, [])
        ]
        for p in removable(workers)[: max(0, excess)]:
            ctx.terminate[p.name] = TerminateAction(
                pod=p.name,
                group=p.group,
                reason=f"cluster has more than max_workers={cap} workers",
            )


def _is_removable(ctx: PlanContext, p: PodView) -> bool:
    group = ctx.snap.groups.get(p.group)
    if group is None or group.is_head:
        return False
    return p.phase == PodPhase.PENDING or p.idle_s > 0
