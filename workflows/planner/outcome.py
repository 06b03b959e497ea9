"""Last passes: notes on what waits, and the `Plan` itself."""

from __future__ import annotations

from raysize.workflows.model import LaunchAction, Plan, ResizeAction
from raysize.workflows.planner.bins import Bin
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.selectors import is_placement_group_resource
from raysize.workflows.planner.work import Ledger
from raysize.workflows.resources import size_text


def leave_grouped_tasks_to_their_groups(ctx: PlanContext) -> None:
    """Tasks waiting inside a placement group: its bundles hold their room."""
    if not ctx.in_groups:
        return
    units = sum(d.count for d in ctx.in_groups)
    names = sorted({n for d in ctx.in_groups for n in d.shape if is_placement_group_resource(n)})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    ctx.notes.append(
        f"{units} task/actor unit(s) wait inside their placement group ({shown}): "
        "the group's bundles hold their room, so they are left to it, as Ray's "
        "autoscaler does"
    )


def note_what_waits(ctx: PlanContext, ledger: Ledger) -> None:
    left = ledger.left()
    left_c, gangs_left, left_d = left.constraints, left.gangs, left.demands
    if left_c:
        ctx.notes.append(f"{left_c} requested bundle(s) cannot be given capacity")
    hold = ctx.hold
    landing = hold.held_back and bool(hold.landing)
    if landing and (gangs_left or left_d or left_c):
        ctx.notes.append(
            f"no pod launched while the grow of {', '.join(hold.landing)} lands: Ray "
            "reports the work a grow is for as pending until it has landed"
        )
    by_pod: dict[str, list[str]] = {}
    for t in hold.taken:
        by_pod.setdefault(t.pod, []).append(f"{t.count} × {t.shape.describe()}")
    for pod, took in sorted(by_pod.items()):
        ctx.notes.append(
            f"{', '.join(took)} held just after the grow of {pod} landed, which took it: "
            "Ray reports it as pending until its next demand publication"
        )
    if gangs_left:
        what = "wait for the grow landing" if landing else "cannot be placed"
        ctx.notes.append(f"{gangs_left} placement group(s) {what}")
    if left_d:
        shapes = ", ".join(
            f"{it.remaining} × {ctx.index.res(it.shape).describe()}"
            for it in ledger.demands
            if it.remaining
        )
        what = "waits for the grow landing" if landing else "cannot place"
        ctx.notes.append(f"{what}: {shapes}")


def launch_sizes(ctx: PlanContext, bins: list[Bin]) -> dict[str, tuple[int, int]]:
    """The size (millicores, bytes) each group's new pods start at, where larger than its
    template: the most the work any of them is launched for takes, rounded up to the step
    as a grow is, and never past the group's IPPR maximum. A new pod then asks the
    scheduler for its real size from its first scheduling attempt (it lands where that
    fits, and a node autoscaler adds a node of that size) instead of landing at its
    template's size wherever that fits and growing there a tick later."""
    ix, settings = ctx.index, ctx.settings
    cpu_i, mem_i = ix.cpu_i, ix.mem_i

    def needs(b: Bin, i: int, step: int) -> int:
        return min(b.ceiling[i], -(-(b.ceiling[i] - b.free[i]) // step) * step)

    templates: dict[str, tuple[int, int]] = {}
    out: dict[str, tuple[int, int]] = {}
    for b in bins:
        if b.pod is not None or b.launch_reason is None or b.group.ippr is None:
            continue
        name = b.group.name
        t = ix.vec(b.group.resources)
        templates[name] = (t[cpu_i], t[mem_i])
        cpu, mem = out.get(name, templates[name])
        out[name] = (
            max(cpu, needs(b, cpu_i, settings.cpu_step)),
            max(mem, needs(b, mem_i, settings.memory_step)),
        )
    # sizes only grow from the template's: a size still equal to it needs no keys
    return {g: size for g, size in out.items() if size != templates[g]}


def to_plan(ctx: PlanContext, ledger: Ledger, resizes: dict[str, ResizeAction]) -> Plan:
    launches = ctx.launches
    sizes = launch_sizes(ctx, ledger.free_bins)

    def launch(g: str, n: int) -> LaunchAction:
        reason = "; ".join(f"{c} for {r}" for r, c in sorted(launches.reasons.get(g, {}).items()))
        cpu, mem = sizes.get(g, (0, 0))
        if cpu or mem:
            reason += f", at {size_text(cpu, mem)}"
        return LaunchAction(group=g, count=n, reason=reason, cpu=cpu, memory=mem)

    return Plan(
        launch=tuple(launch(g, n) for g, n in sorted(launches.count.items()) if n > 0),
        resize=tuple(sorted(resizes.values(), key=lambda r: r.pod)),
        terminate=tuple(sorted(ctx.terminate.values(), key=lambda t: t.pod)),
        infeasible=ledger.left(),
        notes=tuple(ctx.notes),
    )
