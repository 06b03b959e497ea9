"""One tick's decision, from what was read and what the reconcile loop remembers (pure).

The observe activity reads the cluster and calls `decide`; the reconcile workflow records
the `Tick` it returns and acts on it. So the planner runs once, in an activity, and never
again on replay: a new release may plan differently without breaking a running loop's
history, and the snapshot (every pod with its labels: megabytes at thousands of pods)
never enters the history. What the loop remembers between ticks (`Memory`: drained pods,
grows just landed, drift clocks, since when demand waits) goes in with the read and comes
back updated; the workflow adds to it only what it did (a grow started, a settle tried).

With `observe_only` (the worker's RAYSIZE_OBSERVE_ONLY) the tick has nothing to act on: no
plan, no settles. What they would have been is in `Tick.would` (`would_do`), with an Event
for each kind of action not said before (`Memory.reported`), so an unchanged plan is said
once, not every tick.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from raysize.workflows.contracts import (
    MAX_NAMED_PODS,
    MAX_REMOVALS_PER_TICK,
    ClusterRead,
    GroupRef,
    Memory,
    Observation,
    ObserveInput,
    PodRef,
    Tick,
    WouldDo,
    WouldEvent,
)
from raysize.workflows.deadlines import (
    GrowWatch,
    drifting,
    next_decision_in,
    resize_timeout_s,
    stuck_resizes,
)
from raysize.workflows.model import (
    ClusterSnapshot,
    LaunchAction,
    Plan,
    PlannerSettings,
    ResizeAction,
    TerminateAction,
)
from raysize.workflows.planner import plan
from raysize.workflows.summaries import change_text, why

# the Events an observe-only tick records on the RayCluster, in this order
WOULD_SCALE_OUT = "WouldScaleOut"
WOULD_RESIZE = "WouldResize"
WOULD_SCALE_IN = "WouldScaleIn"
WOULD_SETTLE = "WouldSettle"
NOTHING_CHANGED = "observe-only, nothing was changed"
MAX_EVENT_MESSAGE = 1000


def decide(obs: Observation, inp: ObserveInput, *, observe_only: bool = False) -> Tick:
    """The tick of `obs`: the plan, with the facts the workflow acts on. No plan while
    Ray's own autoscaler owns the cluster, `ray.io/ippr` is wrong, or Ray was not read;
    none either with `observe_only`, which says what it would be instead (`observing`),
    Ray's autoscaler acting or not."""
    tick = _facts(obs, inp.memory).model_copy(update={"observe_only": observe_only})
    # Ray's own autoscaler acting: raysize stands by, except observe-only, which writes
    # nothing and so may plan beside it (to compare the two)
    stand_by = obs.ray_autoscaler_acts and not observe_only
    if not obs.found or stand_by or obs.config_errors or obs.snapshot is None:
        return tick
    now = inp.now
    memory = inp.memory
    snapshot = obs.snapshot.model_copy(
        update={"settings": merge_settings(inp.settings, obs.snapshot.settings)}
    )
    # drained pods that are gone, or were replaced, are forgotten; the rest leave the
    # snapshot: they are leaving, their Raylets take no work, and the next write names them
    uids = {x.name: x.uid for x in snapshot.pods}
    drained = tuple(d for d in memory.drained if d.pod in uids and uids[d.pod] == d.uid)
    leaving = {d.pod for d in drained}
    snapshot = snapshot.model_copy(
        update={"pods": tuple(x for x in snapshot.pods if x.name not in leaving)}
    )
    # since when each pod's Raylet has differed from its pod
    drift_since = {n: memory.drift_since.get(n, now) for n in drifting(snapshot)}
    drift_s = {n: now - t for n, t in drift_since.items()}
    due = next_decision_in(snapshot, drift_s)
    grows = GrowWatch(
        growing=dict(memory.growing),
        landed=dict(memory.landed),
        seen=dict(memory.landed_seen),
        used=dict(memory.grow_used),
    )
    grows.observe(
        snapshot, obs.resizing, now, read_at=obs.ray_read_at, published=obs.demand_published
    )
    hold = grows.due_in(now)
    if hold is not None:
        due = min(due or hold, hold)
    p, held = within_budget(
        plan(snapshot, just_grown=grows.rooms(snapshot)), obs.resizing, inp.max_resizes
    )
    p = within_removal_budget(p, snapshot, MAX_REMOVALS_PER_TICK)
    grows.planned(snapshot, p)
    stuck = stuck_resizes(snapshot, drift_s)
    memory = Memory(
        drained=drained,
        demand_seen_at=demand_seen_at(memory.demand_seen_at, snapshot, now),
        drift_since=drift_since,
        growing=grows.growing,
        landed=grows.landed,
        landed_seen=grows.seen,
        grow_used=grows.used,
    )
    named = [*(r.pod for r in p.resize), *(t.pod for t in p.terminate)]
    named += [r.pod for r in stuck]
    tick = tick.model_copy(
        update={
            "plan": p,
            "stuck": stuck,
            "next_decision_in": due,
            "memory": memory,
            "refs": _refs(obs.snapshot, named),
            "groups": _groups(snapshot),
            "held_resizes": held,
        }
    )
    return observing(tick, inp.memory.reported) if observe_only else tick


def observing(tick: Tick, reported: Iterable[str]) -> Tick:
    """The tick of an observe-only worker: nothing to act on (no plan, no settles), and
    what would have been done (`would_do`); the loop remembers what its Events said."""
    would, keys = would_do(tick.plan or Plan(), tick.stuck, reported)
    return tick.model_copy(
        update={
            "plan": None,
            "stuck": (),
            "refs": {},
            "would": would,
            "memory": tick.memory.model_copy(update={"reported": keys}),
        }
    )


def would_do(
    p: Plan, stuck: Iterable[ResizeAction], reported: Iterable[str] = ()
) -> tuple[WouldDo, tuple[str, ...]]:
    """What carrying out `p` and settling `stuck` would do, a line each, and an Event per
    kind of action (`WOULD_*`) naming those not in `reported`; with every action's key,
    to be `reported` next tick. A key is the action, not its wording: a pod's idle time
    or a drift's age grows each tick, and the plan is still the same."""
    items: list[tuple[str, str, str]] = []  # (Event reason, key, line)
    for a in p.launch:
        line = f"would launch {a.count} × {a.group}: {a.reason}"
        items.append((WOULD_SCALE_OUT, f"launch {a.group} {a.count}", line))
    for r in p.resize:
        verb = "shrink" if r.shrinks else "grow"
        change = change_text(r.from_cpu, r.from_memory, r.cpu, r.memory)
        line = f"would {verb} {r.pod} {change}: {why(r.reason)}"
        items.append((WOULD_RESIZE, f"resize {r.pod} {r.cpu} {r.memory}", line))
    for t in p.terminate:
        items.append((WOULD_SCALE_IN, f"remove {t.pod}", f"would remove {t.pod}: {t.reason}"))
    for r in stuck:
        line = f"would settle {r.pod}: {r.reason}"
        items.append((WOULD_SETTLE, f"settle {r.pod} {r.cpu} {r.memory}", line))
    said = set(reported)
    events = []
    for reason in (WOULD_SCALE_OUT, WOULD_RESIZE, WOULD_SCALE_IN, WOULD_SETTLE):
        new = [line for r, key, line in items if r == reason and key not in said]
        if new:
            events.append(WouldEvent(reason=reason, message=_event_message(new)))
    lines = tuple(line for _, _, line in items)
    would = WouldDo(plan=p, stuck=tuple(stuck), lines=lines, events=tuple(events))
    return would, tuple(sorted({key for _, key, _ in items}))


def _event_message(lines: list[str]) -> str:
    """`observe-only, nothing was changed: would …; would …`, within an Event's message
    (what does not fit is counted: `raysize status` lists it all)."""

    def more(n: int) -> str:
        return f" … and {n} more (raysize status lists them)" if n else ""

    text = f"{NOTHING_CHANGED}: {lines[0]}"
    if len(text) + len(more(len(lines) - 1)) > MAX_EVENT_MESSAGE:
        cut = MAX_EVENT_MESSAGE - len(more(len(lines) - 1)) - 1
        return text[:cut] + "…" + more(len(lines) - 1)
    for i, line in enumerate(lines[1:], start=1):
        longer = f"{text}; {line}"
        if len(longer) + len(more(len(lines) - i - 1)) > MAX_EVENT_MESSAGE:
            return text + more(len(lines) - i)
        text = longer
    return text


def within_budget(p: Plan, in_flight: Iterable[str], max_resizes: int | None) -> tuple[Plan, int]:
    """The plan with no more new resizes than may start now (the rest are planned again
    next tick, on what these left), and how many were left out. The reconcile starts no
    more than that anyway; at thousands of pods the rest would cost the history hundreds
    of KB per tick. A grow in flight taken further (`retarget`) goes to its saga and is
    always kept."""
    if max_resizes is None:
        return p, 0
    busy = set(in_flight)
    room = max(0, max_resizes - len(busy))
    kept = []
    new = 0
    for r in p.resize:
        if r.pod in busy:
            kept.append(r)
        elif new < room:
            kept.append(r)
            new += 1
    held = len(p.resize) - len(kept)
    if not held:
        return p, 0
    note = f"{held} more resize(s) wait for room: {len(busy)} running, at most {max_resizes}"
    return p.model_copy(update={"resize": tuple(kept), "notes": (*p.notes, note)}), held


def within_removal_budget(p: Plan, snapshot: ClusterSnapshot, max_removals: int) -> Plan:
    """The plan with no more removals than `max_removals`, in the plan's order; the rest
    are planned again next tick (the removed pods' deletion wakes the loop for it). Every
    removal costs the tick's records (its action and pod reference in the tick, its drain,
    the RayCluster write): unbounded, thousands of idle pods made a record too big for
    Temporal to take. A launch that fits under a maximum only because of a removal left
    out is cut to what fits without it (`launches_within_maxima`)."""
    if len(p.terminate) <= max_removals:
        return p
    kept, later = p.terminate[:max_removals], len(p.terminate) - max_removals
    note = f"{later} more removal(s) wait for the next tick: at most {max_removals} a tick"
    return p.model_copy(
        update={
            "terminate": kept,
            "launch": launches_within_maxima(p.launch, snapshot, kept),
            "notes": (*p.notes, note),
        }
    )


def launches_within_maxima(
    launches: Sequence[LaunchAction], snapshot: ClusterSnapshot, removed: Sequence[TerminateAction]
) -> tuple[LaunchAction, ...]:
    """`launches`, each cut to what fits under its group's `max_workers` and the cluster's,
    counting the snapshot's workers less `removed`."""
    workers = Counter(
        x.group
        for x in snapshot.pods
        if x.group in snapshot.groups and not snapshot.groups[x.group].is_head
    )
    workers.subtract(Counter(t.group for t in removed))
    total = sum(workers.values())
    cluster_max = snapshot.settings.max_workers
    out: list[LaunchAction] = []
    for a in launches:
        g = snapshot.groups.get(a.group)
        n = a.count
        if g is not None and g.max_workers is not None:
            n = min(n, g.max_workers - workers[a.group])
        if cluster_max is not None:
            n = min(n, cluster_max - total)
        if n > 0:
            out.append(a.model_copy(update={"count": n}))
            workers[a.group] += n
            total += n
    return tuple(out)


def _facts(obs: Observation, memory: Memory) -> Tick:
    """What the read says, as the tick carries it (`ClusterRead`), and the pods' names."""
    read = {name: getattr(obs, name) for name in ClusterRead.model_fields}
    snap = obs.snapshot
    pods = tuple(x.name for x in snap.pods) if snap is not None else None
    return Tick(
        **{
            **read,
            # the flag already says Ray's autoscaler owns the cluster: no sidecar to name
            "ray_autoscaler_pod": "" if obs.in_tree_autoscaling else obs.ray_autoscaler_pod,
        },
        read_ray=snap is not None,
        pod_count=len(pods or ()),
        pods=pods if pods is not None and len(pods) <= MAX_NAMED_PODS else None,
        memory=memory,
    )


def _refs(snapshot: ClusterSnapshot, names: Iterable[str]) -> dict[str, PodRef]:
    wanted = set(names)
    return {
        x.name: PodRef(group=x.group, uid=x.uid, raylet_id=x.raylet_id or "")
        for x in snapshot.pods
        if x.name in wanted
    }


def _groups(snapshot: ClusterSnapshot) -> dict[str, GroupRef]:
    count: dict[str, int] = {}
    for x in snapshot.pods:
        count[x.group] = count.get(x.group, 0) + 1
    return {
        name: GroupRef(
            pods=count.get(name, 0),
            max_workers=g.max_workers,
            resize_timeout_s=resize_timeout_s(g),
        )
        for name, g in snapshot.groups.items()
    }


def merge_settings(base: PlannerSettings, cluster: PlannerSettings) -> PlannerSettings:
    """The cluster's own autoscalerOptions win over the worker's defaults."""
    return base.model_copy(
        update={
            "idle_timeout_s": cluster.idle_timeout_s,
            "upscaling_mode": cluster.upscaling_mode,
            "max_workers": cluster.max_workers
            if cluster.max_workers is not None
            else base.max_workers,
        }
    )


def demand_seen_at(previous: float | None, snapshot: ClusterSnapshot, now: float) -> float | None:
    """Since when (epoch seconds, workflow time) Ray has reported pending demand: kept
    while any is pending, None once none is. Per cluster, not per demand: while demands
    overlap, a later one is dated from the first (the latency metric then errs long)."""
    if not (snapshot.demands or snapshot.gangs or snapshot.constraints):
        return None
    return previous if previous is not None else now
