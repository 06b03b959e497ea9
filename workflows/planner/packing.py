"""Tasks, actors and request_resources bundles by shape: best fit on the bins
(`place_items`), then new pods for what is left (`launch_for_items`)."""

from __future__ import annotations

from collections.abc import Sequence

from raysize.workflows.model import GroupSpec, ResizePolicy
from raysize.workflows.planner.bins import Bin, fit, new_bins, take
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.gpu_stages import GpuGate
from raysize.workflows.planner.selectors import selector_matches
from raysize.workflows.planner.work import ShapeToPlace

# what one new pod takes: (shape, copies) pairs
Fill = list[tuple[ShapeToPlace, int]]


def place_items(
    ctx: PlanContext, items: list[ShapeToPlace], bins: list[Bin], gate: GpuGate, *, grow: bool
) -> None:
    """Best fit, largest shapes first: fill the tightest pods that still fit."""
    cpu_i, mem_i = ctx.index.cpu_i, ctx.index.mem_i
    idle_timeout_s = ctx.settings.idle_timeout_s
    for item in items:
        kind, shape, selector, remaining = item.kind, item.shape, item.selector, item.remaining
        if remaining <= 0:
            continue
        needs = frozenset(i for i, _ in shape)
        cands = []
        for b in bins:
            # a pod grown in this plan may have room left from rounding its growth up
            if grow and not (b.grow_room(cpu_i) or b.grow_room(mem_i) or b.grown):
                continue
            if not gate.may_use(b, item.gpu, idle_timeout_s):
                continue
            n = fit(b, shape, grow)
            if n and b.matches(selector):
                # work that needs no GPU (or other special resource) goes to pods
                # without one first
                cands.append((bool(b.special - needs), n, b.key, b))
        cands.sort(key=lambda c: (c[0], c[1], c[2]))
        for _, n, _, b in cands:
            if grow and b.node is not None:
                # a pod before it on the same node may have taken the node's room
                n = fit(b, shape, grow)
                if not n:
                    continue
            k = min(n, remaining)
            take(ctx, b, shape, k, kind, selector)
            remaining -= k
            if not remaining:
                break
            if grow:  # rounding may have opened more room on the last bin
                more = fit(b, shape, grow)
                if more:
                    k = min(more, remaining)
                    take(ctx, b, shape, k, kind, selector)
                    remaining -= k
                    if not remaining:
                        break
        item.remaining = remaining


def launch_for_items(
    ctx: PlanContext, items: list[ShapeToPlace], bins: list[Bin], gate: GpuGate
) -> None:
    """New pods for what is left. Room on pods already planned is used first; then,
    one pod at a time (identical ones in a batch), the group whose new pod the work
    still waiting fills best (`_best_fill`), so mixed shapes share pods and no big pod
    is bought for a little work."""
    planned = [b for b in bins if b.pod is None]
    if planned:
        place_items(ctx, items, planned, gate, grow=False)
    groups = ctx.worker_groups()
    while True:
        live = [it for it in items if it.remaining > 0]
        if not live:
            return
        choice = _best_fill(ctx, groups, live, gate)
        if choice is None:
            return
        g, fill, room = choice
        copies = max(1, min(room, min(it.remaining // k for it, k in fill)))
        fresh = new_bins(ctx, g, copies)
        bins.extend(fresh)
        what = ", ".join(f"{ctx.index.res(it.shape).describe()} {it.kind}" for it, _ in fill)
        for b in fresh:
            b.launch_reason = what
            for it, k in fill:
                take(ctx, b, it.shape, k, it.kind, it.selector)
        for it, k in fill:
            it.remaining -= k * copies
        ctx.launches.add(g.name, copies, what)


def _best_fill(
    ctx: PlanContext, groups: Sequence[GroupSpec], live: list[ShapeToPlace], gate: GpuGate
) -> tuple[GroupSpec, Fill, int] | None:
    """The group whose new pod (at its IPPR maximum) what is left fills best: fullest
    by size · utilisation³, then holding the most, then the smallest new pod (at launch,
    then at its IPPR maximum: `smaller_launches` would move it there)."""
    ix = ctx.index
    best: tuple[tuple[int, float, float, tuple[float, float], str], GroupSpec, Fill, int] | None
    best = None
    cluster_room = ctx.cluster_room(rate_limited=True)
    for g in groups:
        room = ctx.group_room(g, cluster_room)
        if room <= 0:
            continue
        cap = ix.new_pod_capacity(g)
        free = list(cap)
        fill: Fill = []
        volume = 0.0
        wanted: set[int] = set()
        has_gpu = ix.has_gpu(cap)
        for it in live:
            if it.selector and not selector_matches(it.selector, g.labels):
                continue
            if not gate.may_launch(has_gpu, it.gpu):
                continue
            k = min(it.remaining, min(free[i] // a for i, a in it.shape))
            if k <= 0:
                continue
            for i, a in it.shape:
                free[i] -= a * k
            fill.append((it, k))
            volume += k * sum(a / ix.ref[i] for i, a in it.shape)
            wanted.update(i for i, _ in it.shape)
        if not fill:
            continue
        # pods carrying resources the work does not need (GPUs for CPU work) come last
        unneeded = sum(
            1 for i, v in enumerate(cap) if v and i not in wanted and i not in (ix.cpu_i, ix.mem_i)
        )
        full = _fullness(ctx, g, cap, free)
        score = (unneeded, -full, -volume, ix.new_pod_size(g), g.name)
        if best is None or score < best[0]:
            best = (score, g, fill, room)
    return (best[1], best[2], best[3]) if best else None


def _fullness(ctx: PlanContext, g: GroupSpec, cap: list[int], free: list[int]) -> float:
    """How full a new pod of `g` would be with `cap - free` on it, weighted by its size:
    Σ size · utilisation³ over its resources (the terms of Ray's utilisation score), the
    size being what the pod is bought at: a fixed group's whole pod; for a group that
    grows in place, its template grown to what is placed (its IPPR maximum under the
    `max` policy). Taking the pod that holds the most first bought a 32-CPU pod of a
    fixed group for the last 24 CPUs of work, where Ray buys a 16-CPU and two 4-CPU pods
    that grow in place (issue #29): a fixed pod wins only when the work fills most of it
    (at 32 vs 16 CPU: 80 %); else a pod that it fills."""
    ix = ctx.index
    template = ix.vec(g.resources)
    right_size = g.ippr is not None and ctx.settings.resize_policy != ResizePolicy.MAX
    full = 0.0
    for i, c in enumerate(cap):
        used = c - free[i]
        if not c or not used:
            continue
        size = c
        if right_size and i in (ix.cpu_i, ix.mem_i):
            size = max(template[i], used)
        full += (size / ix.ref[i]) * (used / size) ** 3
    return full
