"""Placement groups: every bundle of one copy or none (`place_gang`), by its strategy,
on the bins and, where allowed, on new pods."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from raysize.workflows.model import Gang, GangStrategy, GroupSpec
from raysize.workflows.planner.bins import Bin, UndoLog, fit, new_bins, take
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.gpu_stages import GpuGate
from raysize.workflows.planner.selectors import Selector, selector_matches
from raysize.workflows.planner.vectors import Shape
from raysize.workflows.planner.work import WorkKind

Bundles = list[tuple[Shape, Selector]]


def fill_gang(
    ctx: PlanContext,
    gang: Gang,
    left: int,
    bins: list[Bin],
    gate: GpuGate,
    *,
    grow: bool,
    launch: bool,
) -> int:
    """Place copies of `gang` until `left` are placed or one does not fit; how many are left."""
    while left and place_gang(ctx, gang, bins, gate, grow=grow, launch=launch):
        left -= 1
    return left


def place_gang(
    ctx: PlanContext, gang: Gang, bins: list[Bin], gate: GpuGate, *, grow: bool, launch: bool
) -> bool:
    """Place every bundle of one gang, or nothing."""
    ix = ctx.index
    bundles = [
        (
            ix.shape(b),
            tuple(
                sorted((gang.bundle_selectors[i] if i < len(gang.bundle_selectors) else {}).items())
            ),
        )
        for i, b in enumerate(gang.bundles)
    ]
    order = sorted(range(len(bundles)), key=lambda i: ix.size_key(bundles[i][0]))
    # a placement group with a GPU bundle is GPU work, its other bundles included:
    # they may go where GPU work may (a pod without GPUs still comes first for them)
    gpu_gang = any(ix.needs_gpu(shape) for shape, _ in bundles)
    undo = UndoLog()
    launches_before = ctx.launches.copy()
    n_bins = len(bins)
    attempt = _Attempt(ctx, bins, gate, undo, gpu_gang=gpu_gang, grow=grow, launch=launch)
    if attempt.place(gang.strategy, bundles, order):
        return True
    del bins[n_bins:]
    undo.restore()
    ctx.launches = launches_before
    return False


class _Attempt:
    """One copy of a placement group being placed: everything it takes is logged in
    `undo`, and all of it is given back if a bundle finds no room."""

    def __init__(
        self,
        ctx: PlanContext,
        bins: list[Bin],
        gate: GpuGate,
        undo: UndoLog,
        *,
        gpu_gang: bool,
        grow: bool,
        launch: bool,
    ) -> None:
        self.ctx, self.bins, self.gate, self.undo = ctx, bins, gate, undo
        self.gpu_gang, self.grow, self.launch = gpu_gang, grow, launch

    def place(self, strategy: GangStrategy, bundles: Bundles, order: list[int]) -> bool:
        bins = self.bins
        if strategy in (GangStrategy.STRICT_PACK, GangStrategy.PACK):
            total: Counter[int] = Counter()
            for shape, _ in bundles:
                for i, a in shape:
                    total[i] += a
            whole = tuple(sorted(total.items()))
            sel = tuple(sorted({kv for _, s in bundles for kv in s}))
            b = self.pick_bin(bins, whole, sel, exclude=set())
            if b is None and self.launch:
                b = self.launch_one(whole, sel)
            if b is not None:
                for shape, bundle_sel in bundles:
                    take(self.ctx, b, shape, 1, WorkKind.GANG, bundle_sel, self.undo)
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
                b = self.pick_bin([x for x in bins if id(x) in used], shape, sel, set())
            if b is None:
                b = self.pick_bin(bins, shape, sel, exclude=used if spread else set())
            if b is None and strategy == GangStrategy.SPREAD:
                b = self.pick_bin(bins, shape, sel, exclude=set())
            if b is None and self.launch:
                b = self.launch_one(shape, sel)
            if b is None:
                return False
            take(self.ctx, b, shape, 1, WorkKind.GANG, sel, self.undo)
            used.add(id(b))
        return True

    def pick_bin(
        self, bins: Sequence[Bin], shape: Shape, sel: Selector, exclude: set[int]
    ) -> Bin | None:
        grow = self.grow
        best: tuple[bool, int, str, Bin] | None = None
        i0, a0 = shape[0] if shape else (0, 0)
        gpu = self.ctx.index.needs_gpu(shape)
        idle_timeout_s = self.ctx.settings.idle_timeout_s
        for b in bins:
            # cheap first test on one resource before the full fit
            if b.free[i0] + (b.grow_room(i0) if grow else 0) < a0 or id(b) in exclude:
                continue
            if not self.gate.may_use(b, gpu or self.gpu_gang, idle_timeout_s):
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

    def launch_one(self, shape: Shape, sel: Selector) -> Bin | None:
        ctx = self.ctx
        choice = self.best_group(ctx.worker_groups(), shape, sel, 1)
        if choice is None:
            return None
        g = choice[0]
        b = new_bins(ctx, g, 1)[0]
        self.bins.append(b)
        b.launch_reason = f"{WorkKind.GANG} {ctx.index.res(shape).describe()}"
        ctx.launches.add(g.name, 1, b.launch_reason)
        return b

    def best_group(
        self, groups: Sequence[GroupSpec], shape: Shape, selector: Selector, remaining: int
    ) -> tuple[GroupSpec, int] | None:
        ctx, ix = self.ctx, self.ctx.index
        best: tuple[tuple[int, float, tuple[float, float], str], GroupSpec, int] | None = None
        wanted = {i for i, _ in shape}
        gpu = ix.needs_gpu(shape) or self.gpu_gang
        cluster_room = ctx.cluster_room(rate_limited=True)
        for g in groups:
            if not selector_matches(selector, g.labels) or ctx.group_room(g, cluster_room) <= 0:
                continue
            cap = ix.new_pod_capacity(g)
            if not self.gate.may_launch(ix.has_gpu(cap), gpu):
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
                if v and i not in wanted and i not in (ix.cpu_i, ix.mem_i)
            )
            # alike, the smallest new pod (`smaller_launches` would move it there, after
            # this pod had taken a place under its group's maximum)
            score = (unneeded, -sum(used) / len(used), ix.new_pod_size(g), g.name)
            if best is None or score < best[0]:
                best = (score, g, per_pod)
        return (best[1], best[2]) if best else None


def fits_totals(ctx: PlanContext, gang: Gang, totals: list[list[int]]) -> bool:
    """Could Ray place this gang on the registered nodes if they were empty?"""
    ix = ctx.index
    shapes = sorted((ix.shape(b) for b in gang.bundles), key=ix.size_key)

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
