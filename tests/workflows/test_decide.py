"""`workflows/decide.py`: one tick's decision from a read and the loop's memory (pure)."""

from __future__ import annotations

from bench.plan_bench import generate
from raysize.worker.scenario import load_scenario
from raysize.workflows.contracts import (
    MAX_REMOVALS_PER_TICK,
    DrainedPod,
    Memory,
    Observation,
    ObserveInput,
)
from raysize.workflows.decide import (
    decide,
    launches_within_maxima,
    within_budget,
    within_removal_budget,
)
from raysize.workflows.model import (
    LaunchAction,
    Plan,
    PlannerSettings,
    ResizeAction,
    TerminateAction,
)
from tests.workflows.kit import group, pod, res, snapshot


def _inp(**kw: object) -> ObserveInput:
    return ObserveInput(namespace="ns", cluster="c", now=1000.0, **kw)  # type: ignore[arg-type]


def _grow(name: str, *, retarget: bool = False) -> ResizeAction:
    return ResizeAction(
        pod=name, group="g1", cpu=2000, memory=1, from_cpu=1000, from_memory=1, reason="r",
        retarget=retarget,
    )  # fmt: skip


def test_no_more_new_resizes_than_may_start_and_a_retarget_always() -> None:
    p = Plan(resize=(_grow("w0", retarget=True), *(_grow(f"w{i}") for i in range(1, 6))))
    kept, held = within_budget(p, ["w0"], 3)
    assert [r.pod for r in kept.resize] == ["w0", "w1", "w2"] and held == 3
    assert kept.notes == ("3 more resize(s) wait for room: 1 running, at most 3",)
    assert within_budget(p, ["w0"], None) == (p, 0)
    assert within_budget(p, [], 10) == (p, 0)


def test_a_thousands_of_pods_tick_records_what_it_acts_on_not_the_cluster() -> None:
    """5,000 pods with 50,000 units pending: the plan grows about 4,000 pods. The tick
    records the 100 the reconcile may start (1.6 MB in all would near Temporal's 2 MB
    payload limit) and the pods those name, never the snapshot."""
    snap = load_scenario(generate(5_000, 50_000))
    obs = Observation(snapshot=snap, gcs_address="h:6379")
    tick = decide(obs, _inp(max_resizes=100))
    assert tick.plan is not None and len(tick.plan.resize) == 100
    assert tick.held_resizes > 3_000
    assert set(tick.refs) == {r.pod for r in tick.plan.resize} | {
        t.pod for t in tick.plan.terminate
    }
    assert tick.pods is None and tick.pod_count == len(snap.pods)
    assert len(tick.model_dump_json()) < 64 * 1024


def test_a_drained_pod_leaves_the_plan_until_named_and_is_forgotten_once_replaced() -> None:
    snap = snapshot([group()], [pod("w1", idle_s=120), pod("w2", free_cpu=0)])
    snap = snap.model_copy(
        update={"pods": tuple(p.model_copy(update={"uid": f"u-{p.name}"}) for p in snap.pods)}
    )
    obs = Observation(snapshot=snap, gcs_address="h:6379")
    drained = DrainedPod(pod="w1", group="g1", uid="u-w1", reason="idle")
    tick = decide(obs, _inp(memory=Memory(drained=(drained,))))
    assert tick.plan is not None and tick.plan.terminate == ()  # not planned twice
    assert tick.memory.drained == (drained,) and tick.groups["g1"].pods == 1
    replaced = DrainedPod(pod="w1", group="g1", uid="u-old", reason="idle")
    tick = decide(obs, _inp(memory=Memory(drained=(replaced,))))
    assert tick.memory.drained == ()
    assert tick.plan is not None and [t.pod for t in tick.plan.terminate] == ["w1"]


def test_no_plan_while_ray_s_own_autoscaler_owns_the_cluster() -> None:
    snap = snapshot([group()], [pod("w1")], [(res(2), 1)])
    obs = Observation(snapshot=snap, in_tree_autoscaling=True, gcs_address="h:6379")
    memory = Memory(drift_since={"w1": 5.0})
    tick = decide(obs, _inp(memory=memory))
    assert tick.plan is None and tick.in_tree_autoscaling and tick.memory == memory
    tick = decide(obs.model_copy(update={"in_tree_autoscaling": False}), _inp(memory=memory))
    assert tick.plan is not None and [r.pod for r in tick.plan.resize] == ["w1"]
    assert tick.memory.demand_seen_at == 1000.0  # Ray reports demand: since now


def test_an_idle_cluster_s_removals_are_capped_per_tick() -> None:
    """Every removal is in the tick's records (its action, its pod's reference, its drain,
    the RayCluster write): 10,000 at once made a tick Temporal could not record. At most
    MAX_REMOVALS_PER_TICK go each tick; the rest are planned again next tick."""
    n = MAX_REMOVALS_PER_TICK + 20
    snap = snapshot([group(max_workers=2 * n)], [pod(f"w{i:04d}", idle_s=600) for i in range(n)])
    tick = decide(Observation(snapshot=snap, gcs_address="h:6379"), _inp())
    assert tick.plan is not None and len(tick.plan.terminate) == MAX_REMOVALS_PER_TICK
    assert set(tick.refs) == {t.pod for t in tick.plan.terminate}
    assert f"20 more removal(s) wait for the next tick: at most {MAX_REMOVALS_PER_TICK} a tick" in (
        tick.plan.notes
    )


def test_a_launch_that_needs_a_removal_left_out_is_cut_to_what_fits() -> None:
    """The cluster holds at most 10 workers, all 10 idle in g1; work waits for g2. The
    plan removes all 10 and launches 8 × g2. With 4 removals a tick, 6 stay: only 4
    launch (a launch that fits only because a removal goes must wait for it)."""
    pods = [pod(f"w{i}", idle_s=600) for i in range(10)]
    snap = snapshot(
        [group(max_workers=10), group("g2", max_workers=10)],
        pods,
        settings=PlannerSettings(max_workers=10),
    )
    p = Plan(
        launch=(LaunchAction(group="g2", count=8, reason="r"),),
        terminate=tuple(TerminateAction(pod=x.name, group="g1", reason="idle") for x in pods),
    )
    assert within_removal_budget(p, snap, 10) == p  # within the budget: as planned
    capped = within_removal_budget(p, snap, 4)
    assert [t.pod for t in capped.terminate] == ["w0", "w1", "w2", "w3"]
    assert capped.launch == (LaunchAction(group="g2", count=4, reason="r"),)
    # a group's own maximum likewise: g2 already holds 3 of its 5
    snap = snapshot(
        [group(max_workers=10), group("g2", max_workers=5)],
        [*pods, *(pod(f"v{i}", "g2") for i in range(3))],
    )
    assert launches_within_maxima(p.launch, snap, ()) == (
        LaunchAction(group="g2", count=2, reason="r"),
    )
