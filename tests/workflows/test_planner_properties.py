"""Properties of the planner over random scenarios (hypothesis)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workflows.model import (
    ClusterSnapshot,
    Demand,
    Gang,
    GangStrategy,
    GroupSpec,
    IpprLimits,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
    ResizePolicy,
    ResizeState,
)
from workflows.planner import _Planner, plan
from workflows.resources import CPU, GIB, MEMORY, Resources

CPU_CHOICES = [250, 500, 1000, 1500, 2000, 3000, 4000]
MEM_CHOICES = [0, GIB // 2, GIB, 2 * GIB, 3 * GIB]


@st.composite
def scenarios(draw: st.DrawFn, *, caps: bool = True) -> ClusterSnapshot:
    n_groups = draw(st.integers(1, 3))
    groups: dict[str, GroupSpec] = {}
    for gi in range(n_groups):
        cpu = draw(st.sampled_from([1000, 2000, 4000]))
        mem = draw(st.sampled_from([2 * GIB, 4 * GIB]))
        ippr = None
        if draw(st.booleans()):
            ippr = IpprLimits(
                max_cpu=cpu + draw(st.sampled_from([0, 1000, 3000, 4500])),
                max_memory=mem + draw(st.sampled_from([0, GIB, 6 * GIB])),
                resize_timeout_s=60,
            )
        groups[f"g{gi}"] = GroupSpec(
            name=f"g{gi}",
            resources=Resources.of(cpu=cpu, memory=mem),
            min_workers=draw(st.integers(0, 2)) if caps else 0,
            max_workers=draw(st.one_of(st.none(), st.integers(2, 8))) if caps else None,
            labels={"ray.io/node-group": f"g{gi}", "zone": draw(st.sampled_from(["a", "b"]))},
            ippr=ippr,
        )
    pods: list[PodView] = []
    for i in range(draw(st.integers(0, 8))):
        gname = draw(st.sampled_from(sorted(groups)))
        g = groups[gname]
        grow = draw(st.sampled_from([0, 1000]))
        total = g.resources + Resources.of(cpu=grow)
        if g.ippr is not None:
            total = Resources.of(cpu=min(total.cpu, g.ippr.max_cpu), memory=total.memory)
        phase = draw(st.sampled_from([PodPhase.RUNNING, PodPhase.RUNNING, PodPhase.PENDING]))
        used_cpu = draw(st.integers(0, total.cpu // 250)) * 250
        resize = None
        if g.ippr is not None and phase == PodPhase.RUNNING and draw(st.integers(0, 4)) == 0:
            resize = PodResize(
                cpu=g.ippr.max_cpu,
                memory=g.ippr.max_memory,
                state=draw(st.sampled_from(list(ResizeState))),
            )
        suggested = draw(st.one_of(st.none(), st.sampled_from([1500, 2500, 3000])))
        pods.append(
            PodView(
                name=f"p{i}",
                group=gname,
                phase=phase,
                raylet_id=None if phase == PodPhase.PENDING else f"r{i}",
                total=total,
                available=total - Resources.of(cpu=used_cpu),
                idle_s=0 if used_cpu else draw(st.sampled_from([0.0, 10.0, 100.0])),
                resize=resize,
                suggested_max_cpu=suggested,
                failed=draw(st.integers(0, 5)) == 0,
            )
        )
    demands = tuple(
        Demand(
            shape=Resources.of(
                cpu=draw(st.sampled_from(CPU_CHOICES)), memory=draw(st.sampled_from(MEM_CHOICES))
            ),
            count=draw(st.integers(1, 6)),
            label_selector=draw(st.sampled_from([{}, {}, {"zone": "a"}, {"zone": "!a"}])),
        )
        for _ in range(draw(st.integers(0, 4)))
    )
    gangs = tuple(
        Gang(
            bundles=tuple(
                Resources.of(cpu=draw(st.sampled_from([500, 1000, 2000])))
                for _ in range(draw(st.integers(1, 3)))
            ),
            strategy=draw(st.sampled_from(list(GangStrategy))),
            count=draw(st.integers(1, 2)),
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    return ClusterSnapshot(
        groups=groups,
        pods=tuple(pods),
        demands=demands,
        gangs=gangs,
        settings=PlannerSettings(
            max_workers=draw(st.one_of(st.none(), st.integers(3, 12))) if caps else None,
            resize_policy=draw(st.sampled_from(list(ResizePolicy))),
        ),
    )


PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(scenarios())
def test_never_above_a_group_global_or_ippr_maximum(snap: ClusterSnapshot) -> None:
    p = plan(snap)
    pods = {x.name: x for x in snap.pods}
    for r in p.resize:
        pod = pods[r.pod]
        g = snap.groups[r.group]
        assert g.ippr is not None
        if r.shrinks:
            assert (r.cpu, r.memory) == (
                min(pod.total.cpu, g.resources.cpu),
                min(pod.total.memory, g.resources.memory),
            )
            continue
        assert pod.resize is None and not pod.failed and pod.phase == PodPhase.RUNNING
        assert r.cpu <= max(g.ippr.max_cpu, pod.total.cpu)
        assert r.memory <= max(g.ippr.max_memory, pod.total.memory)
        if pod.suggested_max_cpu is not None:
            assert r.cpu <= max(pod.suggested_max_cpu, pod.total.cpu)
        assert r.cpu >= pod.total.cpu and r.memory >= pod.total.memory
    terminated = {t.pod for t in p.terminate}
    for g in snap.groups.values():
        if g.is_head or g.max_workers is None:
            continue
        before = sum(1 for x in snap.pods if x.group == g.name)
        after = before - sum(1 for x in snap.pods if x.group == g.name and x.name in terminated)
        after += p.launch_by_group.get(g.name, 0)
        assert after <= max(g.max_workers, before)
        if p.launch_by_group.get(g.name):
            assert after <= g.max_workers
    cap = snap.settings.max_workers
    if cap is not None and p.launch:
        workers = sum(1 for x in snap.pods if not snap.groups[x.group].is_head)
        assert workers - len(terminated) + sum(p.launch_by_group.values()) <= cap
    for t in p.terminate:
        pod = pods[t.pod]
        assert pod.phase == PodPhase.PENDING or pod.idle_s > 0, "a busy pod was removed"


@PROPS
@given(scenarios())
def test_never_more_placed_on_a_pod_than_it_holds(snap: ClusterSnapshot) -> None:
    planner = _Planner(snap)
    p = planner.run()
    resized = {r.pod: r for r in p.resize}
    groups = snap.groups
    for b in planner.free_bins:
        placed: dict[str, int] = {}
        for (_, shape), n in b.placed.items():
            for i, a in shape:
                name = planner.names[i]
                placed[name] = placed.get(name, 0) + a * n
        if b.pod is None or b.pod.phase == PodPhase.PENDING:
            g = groups[b.group.name]
            room = dict(g.resources)
            if g.ippr is not None:
                room[CPU] = max(room.get(CPU, 0), g.ippr.max_cpu)
                room[MEMORY] = max(room.get(MEMORY, 0), g.ippr.max_memory)
        else:
            pod = b.pod
            room = dict(pod.available)
            target = resized.get(pod.name)
            if target is not None and not target.shrinks:
                room[CPU] = room.get(CPU, 0) + target.cpu - pod.total.cpu
                room[MEMORY] = room.get(MEMORY, 0) + target.memory - pod.total.memory
            elif pod.resize is not None and pod.resize.state.in_flight:
                cpu = pod.resize.cpu
                if pod.suggested_max_cpu is not None:
                    cpu = min(cpu, max(pod.suggested_max_cpu, pod.total.cpu))
                room[CPU] = max(0, room.get(CPU, 0) + cpu - pod.total.cpu)
                room[MEMORY] = max(0, room.get(MEMORY, 0) + pod.resize.memory - pod.total.memory)
        for name, amount in placed.items():
            assert amount <= room.get(name, 0), (b.key, name, amount, room)


@PROPS
@given(scenarios(), st.randoms(use_true_random=False))
def test_same_input_gives_the_same_plan_whatever_the_order(
    snap: ClusterSnapshot, rnd: random.Random
) -> None:
    pods = list(snap.pods)
    demands = list(snap.demands)
    rnd.shuffle(pods)
    rnd.shuffle(demands)
    shuffled = snap.model_copy(update={"pods": tuple(pods), "demands": tuple(demands)})
    assert plan(snap) == plan(snap)
    assert plan(shuffled) == plan(snap)


@PROPS
@given(scenarios(caps=False))
def test_every_satisfiable_demand_is_satisfied_by_the_plans_capacity(
    snap: ClusterSnapshot,
) -> None:
    """With no caps, a demand that fits some group's pod at its maximum is never left."""

    def fits_some_group(shape: Resources, selector: dict[str, str]) -> bool:
        from workflows.planner import selector_matches

        for g in snap.groups.values():
            room = dict(g.resources)
            if g.ippr is not None:
                room[CPU] = max(room.get(CPU, 0), g.ippr.max_cpu)
                room[MEMORY] = max(room.get(MEMORY, 0), g.ippr.max_memory)
            if shape.fits(room) and selector_matches(selector, g.labels):
                return True
        return False

    feasible = all(fits_some_group(d.shape, d.label_selector) for d in snap.demands)
    p = plan(snap)
    if feasible:
        assert p.infeasible.demands == 0, p.notes
    gangs_ok = all(
        fits_some_group(Resources(sum((b for b in gang.bundles), Resources())), {})
        for gang in snap.gangs
    )
    if gangs_ok:
        assert p.infeasible.gangs == 0, p.notes
