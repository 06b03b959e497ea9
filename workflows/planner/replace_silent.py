"""Pass: a worker pod Kubernetes has run past the Raylet start timeout with no Raylet is
removed (and replaced if the minimum or the work asks)."""

from __future__ import annotations

from raysize.workflows.model import PodView, TerminateAction
from raysize.workflows.planner.context import PlanContext


def silent(p: PodView, timeout_s: float) -> bool:
    """Kubernetes has run the pod for `timeout_s` (the Raylet start timeout) or more, and
    its Raylet has not registered (`running_s` is 0 for a pod Kubernetes does not run;
    the timeout is positive)."""
    return p.raylet_id is None and p.running_s >= timeout_s


def replace_silent_pods(ctx: PlanContext) -> None:
    """A worker pod Kubernetes has run this long with no Raylet registered will not
    bring one: it is removed (and replaced if the minimum or the work asks), not
    counted as room that is coming forever. Such a pod is PENDING in the snapshot (no
    Raylet yet); `running_s` says how long Kubernetes has run it (0: not running)."""
    timeout = ctx.settings.raylet_start_timeout_s
    for p in sorted(ctx.snap.pods, key=lambda p: p.name):
        g = ctx.snap.groups.get(p.group)
        if g is None or g.is_head or p.name in ctx.terminate:
            continue
        if silent(p, timeout):
            ctx.terminate[p.name] = TerminateAction(
                pod=p.name,
                group=g.name,
                reason=f"its Raylet has not registered {p.running_s:.0f}s after the pod "
                f"started (limit {timeout:g}s): replaced",
            )
