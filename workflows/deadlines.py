"""When a cluster that nothing changes will next need a decision (pure).

The reconcile loop waits for a change: a pod, the RayCluster, or what Ray reports. Some
decisions come due with no change at all, only because time passed: an idle pod reaches
its idle timeout, a pod whose resize failed may shrink back an idle timeout after the
failure, a running pod whose Raylet never registered is replaced after the Raylet start
timeout. `next_decision_in` says when the first of those falls, so the loop's wait ends
then, and the fixed tick is only a safety net measured in minutes.
"""

from __future__ import annotations

from workflows.model import ClusterSnapshot, PodPhase

# read the cluster a little after the deadline, so the timer never fires just before it
MARGIN_S = 0.5


def next_decision_in(snapshot: ClusterSnapshot) -> float | None:
    """Seconds until a decision falls due on `snapshot` with nothing changing, or None
    when none will (the snapshot's ages are as of its reading)."""
    idle_timeout = snapshot.settings.idle_timeout_s
    start_timeout = snapshot.settings.raylet_start_timeout_s
    due: list[float] = []
    for p in snapshot.pods:
        if p.phase != PodPhase.RUNNING:
            continue  # a pending pod's next step is a pod change, which wakes the loop
        if p.raylet_id is None:
            if p.running_s > 0:
                due.append(start_timeout - p.running_s)
            continue
        if p.idle_s > 0:
            due.append(idle_timeout - p.idle_s)
            if p.failed:
                due.append(idle_timeout - p.failed_age_s)
    ahead = [d for d in due if d > 0]
    if not ahead:
        return None
    return min(ahead) + MARGIN_S
