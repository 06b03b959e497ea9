"""Pass: the pods that grew in place, as resizes (a grow in flight taken further is a
`retarget`)."""

from __future__ import annotations

from raysize.workflows.model import ResizeAction
from raysize.workflows.planner.context import PlanContext
from raysize.workflows.planner.work import Ledger
from raysize.workflows.resources import size_text


def grow_actions(ctx: PlanContext, ledger: Ledger) -> dict[str, ResizeAction]:
    """A resize for each existing pod the plan grows, by pod name."""
    cpu_i, mem_i = ctx.index.cpu_i, ctx.index.mem_i
    out: dict[str, ResizeAction] = {}
    for b in ledger.free_bins:
        if b.pod is None or not b.grown:
            continue
        cpu = b.ceiling[cpu_i] - b.headroom[cpu_i]
        mem = b.ceiling[mem_i] - b.headroom[mem_i]
        from_cpu, from_mem = b.base[cpu_i], b.base[mem_i]
        if (cpu, mem) == (from_cpu, from_mem):
            continue
        what = ", ".join(
            f"{n} × {ctx.index.res(shape).describe()} {kind}"
            for (kind, shape), n in sorted(b.placed_by_growth.items())
        )
        grow = f"grow {size_text(from_cpu, from_mem)} → {size_text(cpu, mem)}"
        retarget = b.pod.resize is not None
        if retarget:
            # the saga started from the pod's size now: that stays its way back
            grow = f"retarget the grow in flight to {size_text(from_cpu, from_mem)} → " + (
                size_text(cpu, mem)
            )
            from_cpu, from_mem = b.pod.total.cpu, b.pod.total.memory
        node = ""
        if b.node is not None:
            # which node had how much room (the decision log, the saga, `raysize status`)
            node = f"{b.node.name} ({size_text(*b.node.start)} free)"
            grow += f" (node {b.node.name} had {size_text(*b.node.start)} free)"
        out[b.key] = ResizeAction(
            pod=b.key,
            group=b.group.name,
            cpu=cpu,
            memory=mem,
            from_cpu=from_cpu,
            from_memory=from_mem,
            reason=f"{what} → {grow}",
            retarget=retarget,
            node=node,
        )
    return out
