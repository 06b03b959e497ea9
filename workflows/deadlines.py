"""When a cluster that nothing changes will next need a decision (pure).

The reconcile loop waits for a change: a pod, the RayCluster, or what Ray reports. Some
decisions come due with no change at all, only because time passed: an idle pod reaches
its idle timeout, a pod whose resize failed may shrink back an idle timeout after the
failure, a running pod whose Raylet never registered is replaced after the Raylet start
timeout, a resize no saga works on any more is settled (`stuck_resizes`), a grow that
held back launches stops landing (`planner.LANDING_S` after raysize asked for it), and
the short hold after a grow landed ends (`GrowWatch`: at Ray's next demand publication).
`next_decision_in` says when the first of those falls, so the loop's wait ends then, and
the fixed tick is only a safety net measured in minutes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from raysize.workflows.model import (
    ClusterSnapshot,
    GroupSpec,
    Plan,
    PodPhase,
    PodView,
    ResizeAction,
)
from raysize.workflows.planner import JUST_GROWN_S, LANDING_S, PUBLICATION_WAIT_S
from raysize.workflows.resources import size_text

# read the cluster a little after the deadline, so the timer never fires just before it
MARGIN_S = 0.5
# a Raylet whose total differs from its pod's this long, with no resize on the pod, is out
# of step (a saga's own Raylet sync takes a second or two; the GCS lags it by about one)
RAYLET_DRIFT_S = 30.0
DEFAULT_RESIZE_TIMEOUT_S = 60
# a grow whose saga has not begun (nor landed) this long after it was started is forgotten
GROW_WATCH_S = 600.0


def stuck_after_s(timeout_s: int) -> float:
    """A saga spends at most its attempts (3 × the group's resize-timeout) and a rollback
    (one more) on a pod, and writes `resizing-at` at each; a resize raysize asked for
    longer ago than this has no saga left working on it."""
    return 4 * timeout_s + 120.0


def resize_timeout_s(group: GroupSpec | None) -> int:
    """The group's `resize-timeout` (`ray.io/ippr`), else the default."""
    ippr = group.ippr if group is not None else None
    return ippr.resize_timeout_s if ippr is not None else DEFAULT_RESIZE_TIMEOUT_S


def _timeout(snapshot: ClusterSnapshot, p: PodView) -> int:
    return resize_timeout_s(snapshot.groups.get(p.group))


def resizable(snapshot: ClusterSnapshot, p: PodView) -> bool:
    """The pod is of a group `ray.io/ippr` names: raysize may resize it (and its Raylet).
    Any other pod, the head included unless named there, is the user's: what it shows is
    never settled."""
    group = snapshot.groups.get(p.group)
    return group is not None and group.ippr is not None


def drifting(snapshot: ClusterSnapshot) -> tuple[str, ...]:
    """Pods raysize may resize, Kubernetes has at their size, whose Raylet reports
    another total."""
    return tuple(
        sorted(
            p.name
            for p in snapshot.pods
            if p.phase == PodPhase.RUNNING
            and p.resize is not None
            and p.resize.raylet_only
            and p.raylet_id is not None
            and resizable(snapshot, p)
        )
    )


def stuck_resizes(
    snapshot: ClusterSnapshot, drift_s: Mapping[str, float] | None = None
) -> tuple[ResizeAction, ...]:
    """Resizes no saga works on any more, each with the saga that settles it:

    - Kubernetes still holds one (its spec asks for a size the kubelet has not given)
      that raysize asked for so long ago that no saga can still be working on it (a saga
      that ended abnormally, or a lost one): back to the size the pod has;
    - a Raylet has reported another total than its pod's for `RAYLET_DRIFT_S` (its
      `drift_s`, seconds since the reconcile first saw it): a Raylet restarted at its
      start-up size, say. Its pod keeps its size; the saga brings the Raylet to it.

    So spec, kubelet and Raylet agree again without a human. Only in the groups
    `ray.io/ippr` names (`resizable`): the others are not raysize's to change."""
    out = []
    drift_s = drift_s or {}
    for p in sorted(snapshot.pods, key=lambda p: p.name):
        r = p.resize
        if p.phase != PodPhase.RUNNING or r is None or not r.state.in_flight:
            continue
        if not resizable(snapshot, p):
            continue
        if r.raylet_only:
            age = drift_s.get(p.name, 0.0)
            # a pod launched at size has had no resize whose own Raylet step could still be
            # on its way: its Raylet is brought to it at once
            if p.raylet_id is None or (age < RAYLET_DRIFT_S and not r.launched):
                continue
            pod_size, raylet = size_text(r.cpu, r.memory), size_text(p.total.cpu, p.total.memory)
            if r.launched:
                why = (
                    f"launched at size: the pod started at {pod_size}, its Raylet at "
                    f"{raylet} (KubeRay's ray start line) → Raylet to {pod_size}"
                )
            else:
                why = (
                    f"Raylet out of step: the pod has {pod_size}, its Raylet reports {raylet} "
                    f"for {age:.0f}s and no resize is working on it → Raylet to {pod_size}"
                )
            out.append(
                ResizeAction(
                    pod=p.name,
                    group=p.group,
                    cpu=r.cpu,
                    memory=r.memory,
                    from_cpu=r.cpu,
                    from_memory=r.memory,
                    reason=why,
                    launched=r.launched,
                )
            )
            continue
        if r.asked_s is None or r.asked_s < stuck_after_s(_timeout(snapshot, p)):
            continue
        cpu, memory = p.total.cpu, p.total.memory
        out.append(
            ResizeAction(
                pod=p.name,
                group=p.group,
                cpu=cpu,
                memory=memory,
                from_cpu=cpu,
                from_memory=memory,
                reason=f"stuck resize: Kubernetes asks {size_text(r.cpu, r.memory)}, the kubelet "
                f"has {size_text(cpu, memory)} ({r.state.value}) {r.asked_s:.0f}s after raysize "
                f"asked, and no resize is working on it → back to {size_text(cpu, memory)}",
            )
        )
    return tuple(out)


def next_decision_in(
    snapshot: ClusterSnapshot, drift_s: Mapping[str, float] | None = None
) -> float | None:
    """Seconds until a decision falls due on `snapshot` with nothing changing, or None
    when none will (the snapshot's ages are as of its reading)."""
    idle_timeout = snapshot.settings.idle_timeout_s
    start_timeout = snapshot.settings.raylet_start_timeout_s
    due: list[float] = []
    waiting = bool(snapshot.demands or snapshot.gangs or snapshot.constraints)
    for p in snapshot.pods:
        group = snapshot.groups.get(p.group)
        if p.raylet_id is None and p.running_s > 0 and group is not None and not group.is_head:
            # Kubernetes runs it and its Raylet has not registered: replaced at the
            # timeout (`planner.silent`); the snapshot has it PENDING, as it has no Raylet
            due.append(start_timeout - p.running_s)
        if p.phase != PodPhase.RUNNING:
            continue  # a pending pod's next step is a pod change, which wakes the loop
        if p.resize is not None and not resizable(snapshot, p):
            pass  # not raysize's to settle, nor a grow of raysize's that lands
        elif p.resize is not None and p.resize.raylet_only:
            if p.resize.launched:
                due.append(MARGIN_S)  # settled by this very tick; again soon if it is not
            else:
                due.append(RAYLET_DRIFT_S - (drift_s or {}).get(p.name, 0.0))
        elif p.resize is not None and p.resize.state.in_flight and p.resize.asked_s is not None:
            due.append(stuck_after_s(_timeout(snapshot, p)) - p.resize.asked_s)
            if waiting:  # launches wait while a grow lands (planner.landing_grows)
                due.append(LANDING_S - p.resize.asked_s)
        if p.raylet_id is None:
            continue
        if p.idle_s > 0:
            due.append(idle_timeout - p.idle_s)
            if p.failed:
                due.append(idle_timeout - p.failed_age_s)
    ahead = [d for d in due if d > 0]
    if not ahead:
        return None
    return min(ahead) + MARGIN_S


@dataclass
class GrowWatch:
    """The grows the reconcile started, until they land, and from then until Ray has
    published its task demand once more (`plan(just_grown=...)`): a grow's saga ends in
    between two reads of the cluster, so the snapshot alone cannot say it landed moments
    ago. Times are the workflow's clock, except `seen` and the publication given to
    `observe`: the observe's (epoch seconds of the activity's clock, both). The reconcile
    keeps it in its `Memory` (over continue-as-new too)."""

    # pod → its size when the grow started, and when
    growing: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    # pod → when it was seen landed, and its size then
    landed: dict[str, tuple[float, int, int]] = field(default_factory=dict)
    # pod → when the Ray read that saw it landed was answered (the observe's clock)
    seen: dict[str, float] = field(default_factory=dict)
    # pod → what Ray ran on it (millicores, bytes) when the grow was planned
    used: dict[str, tuple[int, int]] = field(default_factory=dict)

    def started(self, r: ResizeAction, now: float) -> None:
        if r.cpu > r.from_cpu or r.memory > r.from_memory:
            self.growing[r.pod] = (r.from_cpu, r.from_memory, now)

    def planned(self, snapshot: ClusterSnapshot, p: Plan) -> None:
        """Note what each pod `p` grows runs now (its first grow's, for a retarget), so
        the room the grow opens for new work is known when it lands (`rooms`); forget it
        for pods no grow is watched on or planned for."""
        pods = {x.name: x for x in snapshot.pods}
        grows = {r.pod for r in p.resize if r.cpu > r.from_cpu or r.memory > r.from_memory}
        # a retarget keeps what its first grow saw; a new grow starts afresh
        for name in sorted(n for n in grows if n not in self.growing or n not in self.used):
            x = pods.get(name)
            if x is not None:
                self.used[name] = (
                    max(0, x.total.cpu - x.available.cpu),
                    max(0, x.total.memory - x.available.memory),
                )
        keep = grows | set(self.growing) | set(self.landed)
        self.used = {n: u for n, u in self.used.items() if n in keep}

    def observe(
        self,
        snapshot: ClusterSnapshot,
        resizing: Iterable[str],
        now: float,
        *,
        read_at: float | None = None,
        published: tuple[float, float] | None = None,
    ) -> list[str]:
        """Pods whose grow landed and whose hold goes on. A grow has landed when no
        resize is in flight on its pod any more and the pod (its Raylet) is bigger than
        when it started; one that ended no bigger (rolled back, failed) or never began
        within `GROW_WATCH_S` is forgotten. `read_at`: when the read of Ray that
        `snapshot` holds was answered; `published`: (earliest, latest) instant of the
        last demand publication Ray made before it was sent, when known (the observe's
        clock; `activities.gcs_cadence`).

        The hold ends at the first publication after the landing: Ray's task demand
        then no longer lists what the grown pod took. That is a publication whose
        earliest instant follows the read that saw the pod landed (its Raylet had its
        new size by then, so its queued work was running). Without one known, it ends
        JUST_GROWN_S after the landing. It ends early too once the pod is resized again
        or smaller (an idle pod shrinking back: the work is over, and Ray knows)."""
        pods = {p.name: p for p in snapshot.pods}
        busy = set(resizing)
        for name, (cpu, memory, since) in list(self.growing.items()):
            p = pods.get(name)
            if p is None:
                del self.growing[name]
            elif name in busy or p.resize is not None:
                continue
            elif p.failed or now - since > GROW_WATCH_S:
                del self.growing[name]
            elif p.phase == PodPhase.RUNNING and (p.total.cpu > cpu or p.total.memory > memory):
                del self.growing[name]
                self.landed[name] = (now, p.total.cpu, p.total.memory)
                if read_at is not None:
                    self.seen[name] = read_at
        for name, (at, cpu, memory) in list(self.landed.items()):
            p = pods.get(name)
            seen = self.seen.get(name)
            if (
                p is None
                or now - at >= JUST_GROWN_S
                or (published is not None and seen is not None and published[0] > seen)
                or name in busy
                or p.resize is not None
                or p.total.cpu < cpu
                or p.total.memory < memory
            ):
                del self.landed[name]
        self.seen = {n: t for n, t in self.seen.items() if n in self.landed}
        return sorted(self.landed)

    def rooms(self, snapshot: ClusterSnapshot) -> dict[str, tuple[int, int]]:
        """Each held pod's room for the work its grow took (millicores, bytes): its size
        now less what it ran when the grow was planned (`planned`); its whole size when
        that is not known."""
        pods = {p.name: p for p in snapshot.pods}
        out = {}
        for name in sorted(self.landed):
            p = pods.get(name)
            if p is None:
                continue
            used_cpu, used_memory = self.used.get(name, (0, 0))
            out[name] = (max(0, p.total.cpu - used_cpu), max(0, p.total.memory - used_memory))
        return out

    def due_in(self, now: float) -> float | None:
        """Seconds until the reconcile should look again whether a hold ended (None:
        none is on): one publication period and a margin after a landing
        (`PUBLICATION_WAIT_S`), when Ray has published again; past that, when the hold
        ends anyway (JUST_GROWN_S)."""
        due = []
        for at, _, _ in self.landed.values():
            age = now - at
            if age < PUBLICATION_WAIT_S:
                due.append(PUBLICATION_WAIT_S - age)
            else:
                due.append(max(0.0, JUST_GROWN_S - age) + MARGIN_S)
        return min(due) if due else None
