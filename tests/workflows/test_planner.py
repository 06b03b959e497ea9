"""The planner's decisions, starting with the seed pull request's four example cases.

Cluster shape of the seed: a head with CPU=0 and WorkerGroup1 of 1 CPU pods that can be
resized to 4 CPU. Ray's one-step-to-max behaviour is the `max` policy; raysize's default
right-sizes (the smallest whole-core size that fits).
"""

from __future__ import annotations

import pytest

from raysize.workflows.model import (
    Constraint,
    Demand,
    Gang,
    GangStrategy,
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    ResizePolicy,
    UpscalingMode,
)
from raysize.workflows.planner import LANDING_S, plan
from raysize.workflows.resources import GIB, Resources

from .kit import cores, group, pod, res, snapshot

RAY = PlannerSettings(resize_policy=ResizePolicy.MAX)


def sizes(p) -> dict[str, tuple[float, float]]:
    return {r.pod: (r.cpu / 1000, r.memory / GIB) for r in p.resize}


# --- the seed's example cases --------------------------------------------------------------


def test_case_1_resizing_an_existing_node() -> None:
    # T1: one idle 1-CPU worker, a pending {CPU: 2}
    snap = snapshot([group()], [pod("w1", idle_s=5)], [(res(2), 1)], settings=RAY)
    p = plan(snap)
    assert sizes(p) == {"w1": (4, 8)}  # Ray: one step to the max
    assert p.launch == ()
    assert "1 × {CPU: 2} pending → grow 1 CPU/2Gi → 4 CPU/8Gi" in p.resize[0].reason
    # raysize's default: only what the demand needs, in whole cores
    right = plan(snapshot([group()], [pod("w1", idle_s=5)], [(res(2), 1)]))
    assert sizes(right) == {"w1": (2, 2)}
    assert right.launch == ()
    # T2: resized, the request is consumed: nothing more to do
    t2 = plan(snapshot([group()], [pod("w1", cpu=4, mem_gib=8, free_cpu=2)], [], settings=RAY))
    assert t2.is_empty


def test_case_2_resizing_an_existing_worker_and_scaling_out_a_new_worker() -> None:
    snap = snapshot([group()], [pod("w1", idle_s=5)], [(res(2), 1), (res(4), 1)], settings=RAY)
    p = plan(snap)
    assert sizes(p) == {"w1": (4, 8)}
    assert p.launch_by_group == {"g1": 1}
    # T2: w1 is at 4 and busy with the 4-CPU task; the new worker runs at 1 CPU
    t2 = plan(
        snapshot(
            [group()],
            [pod("w1", cpu=4, mem_gib=8, free_cpu=0), pod("w2", idle_s=1)],
            [(res(2), 1)],
            settings=RAY,
        )
    )
    assert sizes(t2) == {"w2": (4, 8)}
    assert t2.launch == ()
    # T3: w2 resized, the remaining request consumed: nothing more to do
    t3 = plan(
        snapshot(
            [group()],
            [pod("w1", cpu=4, mem_gib=8, free_cpu=0), pod("w2", cpu=4, mem_gib=8, free_cpu=2)],
            [],
            settings=RAY,
        )
    )
    assert t3.is_empty


def test_case_3_scaling_out_with_ippr_capacity_considerations() -> None:
    p = plan(snapshot([group()], [], [(res(2), 1)], settings=RAY))
    assert p.launch_by_group == {"g1": 1}  # one 1-CPU pod: it can grow to 4
    assert p.resize == ()
    # T2: it registered; now it is case 1
    t2 = plan(snapshot([group()], [pod("w1", idle_s=1)], [(res(2), 1)], settings=RAY))
    assert sizes(t2) == {"w1": (4, 8)} and t2.launch == ()


def test_case_4_ippr_timeout() -> None:
    # T1: resize w1
    assert sizes(plan(snapshot([group()], [pod("w1")], [(res(2), 1)], settings=RAY))) == {
        "w1": (4, 8)
    }
    # T2: the resize timed out: it is rolled back and the plan scales out
    timed_out = PodResize(cpu=cores(4), memory=8 * GIB, state=KubeletResizeState.TIMED_OUT)
    t2 = plan(
        snapshot([group()], [pod("w1", resize=timed_out, failed=True)], [(res(2), 1)], settings=RAY)
    )
    assert t2.resize == ()
    assert t2.launch_by_group == {"g1": 1}
    # T3: w1 is marked failed and never resized again; w2 grows
    t3 = plan(snapshot([group()], [pod("w1", failed=True), pod("w2")], [(res(2), 1)], settings=RAY))
    assert sizes(t3) == {"w2": (4, 8)}
    assert t3.launch == ()
    # T4: w2 resized and running the request; w1 stays as it is
    t4 = plan(
        snapshot(
            [group()],
            [pod("w1", failed=True), pod("w2", cpu=4, mem_gib=8, free_cpu=2)],
            [],
            settings=RAY,
        )
    )
    assert t4.is_empty


# --- resize eligibility -------------------------------------------------------------------


def test_deferred_suggestion_caps_the_next_target() -> None:
    p = plan(snapshot([group()], [pod("w1", suggested_cpu=3)], [(res(4), 1)]))
    assert sizes(p) == {}  # 4 CPU can't fit a pod capped at 3
    assert p.launch_by_group == {"g1": 1}
    p = plan(snapshot([group()], [pod("w1", suggested_cpu=3)], [(res(3), 1)], settings=RAY))
    assert sizes(p) == {"w1": (3, 8)}


def test_failed_pod_is_never_resized_again() -> None:
    p = plan(snapshot([group()], [pod("w1", failed=True)], [(res(2), 1)]))
    assert p.resize == ()
    assert p.launch_by_group == {"g1": 1}


def test_in_flight_resize_counts_at_its_target() -> None:
    inflight = PodResize(
        cpu=cores(4), memory=8 * GIB, state=KubeletResizeState.IN_PROGRESS, asked_s=0.5
    )
    p = plan(snapshot([group()], [pod("w1", resize=inflight)], [(res(2), 1)]))
    assert p.is_empty  # the 2 CPUs fit the 4 it is growing to
    more = [(res(2), 2), (res(1), 1)]  # 5 CPUs: more than the pod's maximum of 4
    p = plan(snapshot([group()], [pod("w1", resize=inflight)], more))
    assert p.resize == ()  # no second resize while one is in flight
    # ... and no launch while it lands: Ray may still report the work it is for as pending
    assert p.launch == ()
    assert any("while the grow of w1 lands" in n for n in p.notes)
    # landed: what is still pending gets its pod
    p = plan(snapshot([group()], [pod("w1", cpu=4, mem_gib=8)], more))
    assert p.launch_by_group == {"g1": 1}
    # the pod has its size and only its Raylet lags: landing too
    raylet = inflight.model_copy(update={"asked_s": None, "raylet_only": True})
    assert plan(snapshot([group()], [pod("w1", resize=raylet)], more)).launch == ()
    # a grow asked for long ago is stuck, not landing (nor one raysize did not ask for,
    # of which it cannot tell): launches go ahead
    for other in (LANDING_S + 1, None):
        stuck = inflight.model_copy(update={"asked_s": other})
        p = plan(snapshot([group()], [pod("w1", resize=stuck)], more))
        assert p.launch_by_group == {"g1": 1}


def test_no_launch_just_after_a_grow_landed() -> None:
    # w1 grew to 4 CPU a moment ago and runs the task it grew for; Ray still reports it
    more = [(res(2), 2)]
    grown = pod("w1", cpu=4, mem_gib=8).model_copy(update={"available": res(cpu=2, mem_gib=8)})
    p = plan(snapshot([group()], [grown], more), just_grown=["w1"])
    assert p.launch == ()
    assert any("2 × {CPU: 2} held just after the grow of w1 landed" in n for n in p.notes), p.notes
    # nor grown: another pod that could grow for it waits too
    busy = pod("w2", free_cpu=0)
    p = plan(snapshot([group()], [grown, busy], more), just_grown=["w1"])
    assert p.is_empty
    assert sizes(plan(snapshot([group()], [grown, busy], more))) == {"w2": (3, 2)}
    # what the grown pod's room takes is placed there all the same
    assert plan(snapshot([group()], [grown], [(res(1), 1)]), just_grown=["w1"]).is_empty
    # the hold over (not named any more), or gone with its pod: the pod is launched
    assert plan(snapshot([group()], [grown], more)).launch_by_group == {"g1": 1}
    other = grown.model_copy(update={"name": "w2"})
    p = plan(snapshot([group()], [other], more), just_grown=["w1"])
    assert p.launch_by_group == {"g1": 1}


def test_deferred_resize_counts_at_the_suggested_size() -> None:
    deferred = PodResize(cpu=cores(4), memory=8 * GIB, state=KubeletResizeState.DEFERRED)
    p = plan(snapshot([group()], [pod("w1", resize=deferred, suggested_cpu=2)], [(res(3), 1)]))
    assert p.launch_by_group == {"g1": 1}  # counted at 2, not 4


def test_pending_pod_with_ippr_headroom_prevents_an_extra_launch() -> None:
    p = plan(snapshot([group()], [pod("w1", phase=PodPhase.PENDING)], [(res(3), 1)]))
    assert p.is_empty
    # without IPPR a pending 1-CPU pod can't take it: launch is needed (and fits nowhere)
    no_ippr = plan(
        snapshot([group(max_cpu=None)], [pod("w1", phase=PodPhase.PENDING)], [(res(3), 1)])
    )
    assert no_ippr.launch == ()
    assert no_ippr.infeasible.demands == 1


def test_launches_no_more_pods_than_the_demands_need() -> None:
    # 6 × 2 CPU: pods of 1 CPU growable to 4 each hold two → 3 pods, not 12 or 6
    p = plan(snapshot([group()], [], [(res(2), 6)]))
    assert p.launch_by_group == {"g1": 3}


def test_pods_not_running_or_without_raylet_are_not_resized() -> None:
    p = plan(snapshot([group()], [pod("w1", raylet_id=None)], [(res(2), 1)]))
    assert p.resize == ()


def test_group_without_ippr_scales_out_only() -> None:
    p = plan(snapshot([group(max_cpu=None, cpu=2)], [pod("w1", cpu=2, free_cpu=0)], [(res(2), 2)]))
    assert p.resize == ()
    assert p.launch_by_group == {"g1": 2}


# --- right-sizing ---------------------------------------------------------------------------


def test_right_size_grows_only_what_is_needed_rounded_to_the_step() -> None:
    p = plan(snapshot([group()], [pod("w1", free_cpu=0.5)], [(res(1.2), 1)]))
    assert sizes(p) == {"w1": (2, 2)}  # 0.5 free + 0.7 more → 1.7 → rounded to 2 cores
    p = plan(snapshot([group()], [pod("w1")], [(res(0, 3), 1)]))
    assert sizes(p) == {"w1": (1, 3)}  # memory only, rounded to 1 GiB, CPU untouched
    fine = PlannerSettings(cpu_step=250)
    p = plan(snapshot([group()], [pod("w1", free_cpu=0.5)], [(res(1.2), 1)], settings=fine))
    assert sizes(p) == {"w1": (1.75, 2)}


def test_right_size_never_exceeds_the_maximum() -> None:
    p = plan(snapshot([group(max_cpu=3.5)], [pod("w1")], [(res(3.2), 1)]))
    assert sizes(p) == {"w1": (3.5, 2)}


def test_several_demands_share_one_growth() -> None:
    p = plan(snapshot([group()], [pod("w1")], [(res(1), 3)]))
    assert sizes(p) == {"w1": (3, 2)}
    # one fits the free CPU it has; the other two are why it grows
    assert p.resize[0].reason == "2 × {CPU: 1} pending → grow 1 CPU/2Gi → 3 CPU/2Gi"


# --- caps -------------------------------------------------------------------------------


def test_min_workers_are_launched() -> None:
    p = plan(snapshot([group(min_workers=2)], [pod("w1")]))
    assert p.launch_by_group == {"g1": 1}
    assert "min_workers=2" in p.launch[0].reason


def test_min_workers_never_break_the_cluster_maximum() -> None:
    p = plan(snapshot([group(min_workers=3)], [], settings=PlannerSettings(max_workers=2)))
    assert p.launch_by_group == {"g1": 2}
    assert "1 pod(s) short of min_workers=3, held back by max_workers" in p.notes[0]


def test_group_max_removes_pending_then_idle_never_busy() -> None:
    pods = [
        pod("busy1", idle_s=0, free_cpu=0),
        pod("busy2", idle_s=0, free_cpu=0),
        pod("idle", idle_s=5),
        pod("pend", phase=PodPhase.PENDING),
    ]
    p = plan(snapshot([group(max_workers=1)], pods))
    assert [t.pod for t in p.terminate] == ["idle", "pend"]
    assert all("max_workers=1" in t.reason for t in p.terminate)


def test_group_max_caps_launches() -> None:
    p = plan(snapshot([group(max_workers=2, max_cpu=None)], [pod("w1", free_cpu=0)], [(res(1), 5)]))
    assert p.launch_by_group == {"g1": 1}
    assert p.infeasible.demands == 4


def test_cluster_max_caps_launches_across_groups() -> None:
    groups = [group("a", max_cpu=None), group("b", max_cpu=None)]
    p = plan(snapshot(groups, [], [(res(1), 5)], settings=PlannerSettings(max_workers=3)))
    assert sum(p.launch_by_group.values()) == 3
    assert p.infeasible.demands == 2


def test_cluster_max_removes_idle_pods() -> None:
    pods = [pod("a1", "a", idle_s=100), pod("b1", "b", idle_s=3), pod("b2", "b", free_cpu=0)]
    p = plan(snapshot([group("a"), group("b")], pods, settings=PlannerSettings(max_workers=1)))
    assert [t.pod for t in p.terminate] == ["a1", "b1"]


# --- request_resources -----------------------------------------------------------------------


def test_constraints_count_capacity_not_usage() -> None:
    busy = pod("w1", cpu=4, mem_gib=8, free_cpu=0)
    p = plan(
        snapshot(
            [group(max_cpu=None, cpu=4, mem_gib=8)],
            [busy],
            constraints=(Constraint(shape=res(1), count=4),),
        )
    )
    assert p.is_empty  # 4 CPUs exist, even if busy
    p = plan(
        snapshot(
            [group(max_cpu=None, cpu=4, mem_gib=8)],
            [busy],
            constraints=(Constraint(shape=res(1), count=6),),
        )
    )
    assert p.launch_by_group == {"g1": 1}


def test_constraints_can_be_met_by_growing_and_keep_pods_from_idling_out() -> None:
    p = plan(
        snapshot(
            [group()], [pod("w1", idle_s=1000)], constraints=(Constraint(shape=res(3), count=1),)
        )
    )
    assert sizes(p) == {"w1": (3, 2)}
    assert p.terminate == ()
    grown = pod("w1", cpu=3, idle_s=1000)
    p = plan(snapshot([group()], [grown], constraints=(Constraint(shape=res(3), count=1),)))
    assert p.is_empty  # not shrunk back, not removed: the constraint needs it


# --- gangs ------------------------------------------------------------------------------


def gang(strategy: GangStrategy, *bundles, count: int = 1) -> Gang:
    return Gang(bundles=tuple(bundles), strategy=strategy, count=count)


def test_strict_pack_needs_one_pod_for_every_bundle() -> None:
    pods = [pod("w1", cpu=2, free_cpu=2), pod("w2", cpu=2, free_cpu=2)]
    g = gang(GangStrategy.STRICT_PACK, res(1), res(1), res(1))
    p = plan(snapshot([group(max_cpu=None, cpu=2)], pods, gangs=(g,)))
    assert p.resize == () and p.launch == ()  # does not fit on one pod, no pod can hold 3
    assert p.infeasible.gangs == 1
    p = plan(snapshot([group(cpu=2)], pods, gangs=(g,)))
    # fits no registered pod's total, so Ray would only retry it when a node registers:
    # a new pod (it can grow to 4 CPUs), not an in-place resize
    assert p.resize == () and p.launch_by_group == {"g1": 1}
    busy = [pod("w1", cpu=4, free_cpu=1), pod("w2", cpu=2, free_cpu=2)]
    p = plan(snapshot([group(cpu=2, max_cpu=6)], busy, gangs=(g,)))
    assert sizes(p) == {"w1": (6, 2)}  # w1 is 4 CPUs when empty: growing it works


def test_pack_prefers_one_pod_but_may_split() -> None:
    pods = [pod("w1", cpu=2, free_cpu=2), pod("w2", cpu=2, free_cpu=2)]
    g = gang(GangStrategy.PACK, res(1), res(1), res(1))
    p = plan(snapshot([group(max_cpu=None, cpu=2)], pods, gangs=(g,)))
    assert p.is_empty and p.infeasible.gangs == 0


def test_strict_spread_needs_distinct_pods() -> None:
    pods = [pod("w1", cpu=4, free_cpu=4)]
    g = gang(GangStrategy.STRICT_SPREAD, res(1), res(1))
    p = plan(snapshot([group(max_cpu=None, cpu=4)], pods, gangs=(g,)))
    assert p.launch_by_group == {"g1": 1}  # second bundle needs a second pod
    p = plan(snapshot([group(max_cpu=None, cpu=4, max_workers=1)], pods, gangs=(g,)))
    assert p.launch == () and p.infeasible.gangs == 1


def test_spread_falls_back_to_sharing_a_pod() -> None:
    pods = [pod("w1", cpu=4, free_cpu=4)]
    g = gang(GangStrategy.SPREAD, res(1), res(1))
    p = plan(snapshot([group(max_cpu=None, cpu=4, max_workers=1)], pods, gangs=(g,)))
    assert p.is_empty and p.infeasible.gangs == 0


def test_gang_is_all_or_nothing() -> None:
    # 2 free CPUs on w1, no room anywhere else: a 3-bundle gang places nothing at all
    pods = [pod("w1", cpu=2, free_cpu=2)]
    g = gang(GangStrategy.STRICT_SPREAD, res(1), res(1), res(1))
    p = plan(snapshot([group(max_cpu=None, cpu=2, max_workers=2)], pods, [(res(2), 1)], gangs=(g,)))
    # the gang failed as a whole, so its bundles did not take w1's room: the task gets it
    assert p.infeasible.gangs == 1
    assert p.infeasible.demands == 0
    assert p.launch == ()


def test_gang_grows_a_pod_in_place_before_launching() -> None:
    g = gang(GangStrategy.PACK, res(1), res(1))
    p = plan(snapshot([group()], [pod("w1", cpu=2, free_cpu=1)], gangs=(g,)))
    assert sizes(p) == {"w1": (3, 2)} and p.launch == ()


def test_room_left_by_rounding_a_gangs_growth_up_takes_waiting_tasks() -> None:
    # found by property (d): the placement group grows w1 to its maximum (the max policy),
    # which leaves 2.5 CPUs free; the {CPU: 2} task goes there, not unplaced
    g = gang(GangStrategy.PACK, res(1))
    one = group(max_workers=1)
    p = plan(snapshot([one], [pod("w1", free_cpu=0.5)], [(res(2), 1)], gangs=(g,), settings=RAY))
    assert sizes(p) == {"w1": (4, 8)}
    assert p.infeasible.demands == 0 and p.infeasible.gangs == 0


def test_gang_that_fits_no_registered_node_gets_a_new_pod_not_a_resize() -> None:
    # Ray only retries such a placement group when a node registers: growing w1 to 3
    # CPUs would leave it pending forever (docs/design/ray-infeasible-pg.md)
    g = gang(GangStrategy.STRICT_PACK, res(1.5), res(1.5))
    p = plan(snapshot([group()], [pod("w1")], gangs=(g,)))
    assert p.resize == ()
    assert p.launch_by_group == {"g1": 1}
    # a gang that fits a node's total, once that node is empty, may use growth
    small = gang(GangStrategy.STRICT_PACK, res(0.5), res(0.5))
    p = plan(snapshot([group()], [pod("w1", free_cpu=0.5)], gangs=(small,)))
    assert sizes(p) == {"w1": (2, 2)} and p.launch == ()


def test_gang_count_places_each_copy() -> None:
    g = gang(GangStrategy.STRICT_PACK, res(2), res(2), count=3)
    p = plan(snapshot([group()], [], gangs=(g,)))
    assert p.launch_by_group == {"g1": 3}


# --- label selectors --------------------------------------------------------------------------


def test_label_selectors_pick_matching_pods_and_groups() -> None:
    groups = [
        group("cpu"),
        group("gpu", GPU=1, labels={"ray.io/node-group": "gpu", "accel": "a100"}),
    ]
    pods = [pod("c1", "cpu", cpu=4, mem_gib=8)]
    sel = Demand(shape=res(1), count=1, label_selector={"accel": "a100"})
    p = plan(snapshot(groups, pods, demands=None).model_copy(update={"demands": (sel,)}))
    assert p.launch_by_group == {"gpu": 1}
    neg = Demand(shape=res(1), count=1, label_selector={"accel": "!a100"})
    p = plan(snapshot(groups, pods).model_copy(update={"demands": (neg,)}))
    assert p.is_empty
    in_ = Demand(shape=res(1), count=1, label_selector={"ray.io/node-group": "in(gpu,tpu)"})
    p = plan(snapshot(groups, pods).model_copy(update={"demands": (in_,)}))
    assert p.launch_by_group == {"gpu": 1}


def test_cpu_work_avoids_gpu_groups() -> None:
    groups = [group("cpu", max_cpu=None), group("gpu", GPU=1, max_cpu=None)]
    p = plan(snapshot(groups, [], [(res(1), 1)]))
    assert p.launch_by_group == {"cpu": 1}


# --- GPU pods are kept for GPU work (Ray's RAY_scheduler_avoid_gpu_nodes) ----------------------

CPU_AND_GPU = [group("cpu"), group("gpu", cpu=8, mem_gib=32, GPU=1, max_cpu=None, max_workers=1)]


def gpu_pod(name: str = "gpu1", free_cpu: float = 8, **kw: object) -> object:
    p = pod(name, g="gpu", cpu=8, mem_gib=32, free_cpu=free_cpu, **kw)
    return p.model_copy(
        update={"total": p.total + res(GPU=1), "available": p.available + res(GPU=1)}
    )


def test_cpu_tasks_grow_a_cpu_pod_rather_than_fill_a_gpu_pod() -> None:
    # the GPU pod has 8 free CPUs; the CPU pod can grow to 4: the CPU tasks go there, and
    # the GPU task still finds its CPU on the GPU pod
    pods = [gpu_pod(free_cpu=2), pod("c1", g="cpu", free_cpu=0)]
    p = plan(snapshot(CPU_AND_GPU, pods, [(res(1), 2), (res(2, GPU=1), 1)]))
    assert sizes(p) == {"c1": (3, 2)}
    assert p.launch == () and p.infeasible.demands == 0


def test_cpu_tasks_fill_a_pending_gpu_pods_spare_room_unless_gpu_work_waits() -> None:
    # a pending GPU pod counts empty at its full size; once GPU work has had its pick,
    # CPU tasks use its spare CPUs rather than buy a CPU pod (as Ray does)
    pending = gpu_pod(phase=PodPhase.PENDING)
    p = plan(snapshot(CPU_AND_GPU, [pending], [(res(1), 3)]))
    assert p.is_empty and p.infeasible.demands == 0
    p = plan(snapshot(CPU_AND_GPU, [pending], [(res(1), 3), (res(2, GPU=1), 1)]))
    assert p.is_empty and p.infeasible.demands == 0
    # a GPU task waits (it needs 2 GPUs on a pod: only gpu2 has them, and it is at its
    # maximum): while GPU work waits, a GPU pod the plan leaves unused and that is
    # pending is kept out of CPU work's reach; the CPU tasks launch a CPU pod
    waiting = [(res(1), 3), (res(2, GPU=2), 1)]
    two_gpus = group("gpu2", cpu=8, mem_gib=32, GPU=2, max_cpu=None, max_workers=0)
    p = plan(snapshot([*CPU_AND_GPU, two_gpus], [pending], waiting))
    assert p.launch_by_group == {"cpu": 1} and p.infeasible.demands == 1


# the wide shape of `bench.ray_compare --shape wide` in small (issue #29, item 3): a
# growable medium group beside a fixed 32-CPU one, and a fixed GPU group
WIDE = [
    group("medium", cpu=4, mem_gib=16, max_cpu=16, max_mem_gib=64),
    group("large", cpu=32, mem_gib=128, max_cpu=None),
    group("gpu", cpu=8, mem_gib=32, GPU=1, max_cpu=None, max_workers=2),
]


def test_cpu_tasks_fill_the_spare_room_of_a_gpu_pod_the_plan_launches() -> None:
    # the GPU task launches a GPU pod (8 CPU); it takes 4, and the 4 CPU tasks take the
    # other 4 once GPU work has had its pick, as Ray does, rather than buy a medium pod
    # (before: 2 pods, 12 CPU more, where Ray launches the GPU pod alone)
    p = plan(snapshot(WIDE, [], [(res(1), 4), (res(4, 16, GPU=1), 1)]))
    assert p.launch_by_group == {"gpu": 1} and p.infeasible.demands == 0
    # two GPU tasks, two GPU pods: the CPU tasks share what both have spare
    p = plan(snapshot(WIDE, [], [(res(2), 4), (res(4, 16, GPU=1), 2)]))
    assert p.launch_by_group == {"gpu": 2} and p.infeasible.demands == 0
    # GPU work still has the first pick: a third GPU task finds no GPU pod left under
    # the maximum and waits; the CPU work still uses only the spare room, and launches
    # the rest (12 CPU) on a medium pod
    p = plan(snapshot(WIDE, [], [(res(4), 5), (res(4, 16, GPU=1), 3)]))
    assert p.launch_by_group == {"gpu": 2, "medium": 1}
    assert p.infeasible.demands == 1  # the third GPU task
    # no GPU work at all: CPU work never launches a GPU pod while a CPU group fits it
    p = plan(snapshot(WIDE, [], [(res(1), 4)]))
    assert p.launch_by_group == {"medium": 1}


def test_a_big_fixed_pod_is_launched_only_for_work_that_fills_most_of_it() -> None:
    # 24 × 1 CPU: a fixed 32-CPU pod would sit a quarter idle. Ray launches a medium pod
    # (16 at its maximum) and two small ones (4 each): 24 CPU; ours two medium pods that
    # grow to 16 and 8 CPU: 24 CPU on one pod fewer (before: one large pod, 32 CPU)
    groups = [group("small", max_cpu=4), *WIDE[:2]]
    p = plan(snapshot(groups, [], [(res(1), 24)]))
    assert p.launch_by_group == {"medium": 2} and p.infeasible.demands == 0
    # 30 × 1 CPU fill most of one large pod: one pod, not a medium and four small ones
    p = plan(snapshot(groups, [], [(res(1), 30)]))
    assert p.launch_by_group == {"large": 1}
    # 64 × 1 CPU: two full large pods, never four medium ones
    p = plan(snapshot(groups, [], [(res(1), 64)]))
    assert p.launch_by_group == {"large": 2}


def test_gpu_work_has_the_first_pick_of_a_running_gpu_pods_room() -> None:
    # 2 free CPUs on the GPU pod: the GPU task takes them, the CPU tasks launch a CPU pod;
    # without the GPU task the CPU tasks use the GPU pod's spare CPUs (as Ray does)
    pods = [gpu_pod(free_cpu=2)]
    p = plan(snapshot(CPU_AND_GPU, pods, [(res(2), 1), (res(2, GPU=1), 1)]))
    assert p.launch_by_group == {"cpu": 1} and p.infeasible.demands == 0
    p = plan(snapshot(CPU_AND_GPU, pods, [(res(2), 1)]))
    assert p.is_empty and p.infeasible.demands == 0


def test_cpu_work_takes_a_gpu_pod_only_when_nothing_else_fits() -> None:
    groups = [group("cpu", max_workers=0), CPU_AND_GPU[1]]
    p = plan(snapshot(groups, [gpu_pod()], [(res(1), 3)]))
    assert p.is_empty and p.infeasible.demands == 0  # on the GPU pod's free room
    # no GPU pod running either: a GPU pod is launched as the last resort
    p = plan(snapshot(groups, [], [(res(1), 3)]))
    assert p.launch_by_group == {"gpu": 1}


@pytest.mark.parametrize("strategy", list(GangStrategy))
def test_cpu_placement_groups_keep_off_gpu_pods_for_every_strategy(
    strategy: GangStrategy,
) -> None:
    # 1 GPU pod with 2 free CPUs and a GPU waiting for a {CPU: 2, GPU: 1} task; two
    # CPU pods that can grow. Whatever the strategy, the CPU bundles grow the CPU pods
    # and the GPU task gets the GPU pod.
    pods = [gpu_pod(free_cpu=2), pod("c1", g="cpu", free_cpu=0), pod("c2", g="cpu", free_cpu=0)]
    g = gang(strategy, res(1), res(1))
    p = plan(snapshot(CPU_AND_GPU, pods, [(res(2, GPU=1), 1)], gangs=(g,)))
    assert p.infeasible.gangs == 0 and p.infeasible.demands == 0
    assert set(sizes(p)) <= {"c1", "c2"} and sizes(p)
    assert "gpu" not in p.launch_by_group


def test_request_resources_counts_pending_gpu_pods_last() -> None:
    # a CPU pod that may grow holds the request before the GPU pods do; a pending GPU
    # pod's capacity is never what a CPU request is counted on while a CPU pod can be
    request = (Constraint(shape=res(4), count=1),)
    pods = [gpu_pod(phase=PodPhase.PENDING), pod("c1", g="cpu")]
    p = plan(snapshot(CPU_AND_GPU, pods, constraints=request))
    assert sizes(p) == {"c1": (4, 2)} and p.launch == ()
    p = plan(snapshot(CPU_AND_GPU, [gpu_pod(phase=PodPhase.PENDING)], constraints=request))
    assert p.launch_by_group == {"cpu": 1}
    full = [group("cpu", max_workers=0), CPU_AND_GPU[1]]
    p = plan(snapshot(full, [gpu_pod(phase=PodPhase.PENDING)], constraints=request))
    assert p.is_empty and p.infeasible.constraints == 0


# --- a grow in flight is used before a pod is launched -------------------------------------------


def test_a_grow_in_progress_is_retargeted_before_a_pod_is_launched() -> None:
    # w1 is growing 1 → 2 CPUs; a {CPU: 3} task arrives: the grow goes on to 3, no new pod
    inflight = PodResize(cpu=cores(2), memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS)
    p = plan(snapshot([group()], [pod("w1", resize=inflight)], [(res(3), 1)]))
    assert p.launch == ()
    (r,) = p.resize
    assert (r.pod, r.cpu, r.from_cpu, r.retarget) == ("w1", cores(3), cores(1), True)
    assert "retarget the grow in flight" in r.reason


def test_the_demo_placement_group_takes_the_grow_that_is_finishing() -> None:
    # issue 13: one worker that may grow to 4 CPUs has grown to 2 for a task (the pod and
    # its Raylet have 2 CPUs; the saga is still finishing); a PACK group of 2 × {CPU: 2}
    # arrives. Ray grows the pod to 4 and places the group on it; so does the plan.
    finishing = PodResize(cpu=cores(2), memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS)
    w1 = pod("w1", cpu=2, resize=finishing)
    g = gang(GangStrategy.PACK, res(2), res(2))
    p = plan(snapshot([group()], [w1], gangs=(g,)))
    assert p.launch == () and p.infeasible.gangs == 0
    assert sizes(p) == {"w1": (4, 2)} and p.resize[0].retarget


def test_a_deferred_or_failed_grow_is_not_retargeted() -> None:
    deferred = PodResize(cpu=cores(2), memory=2 * GIB, state=KubeletResizeState.DEFERRED)
    p = plan(snapshot([group()], [pod("w1", resize=deferred)], [(res(3), 1)]))
    assert p.resize == () and p.launch_by_group == {"g1": 1}
    inflight = PodResize(cpu=cores(2), memory=2 * GIB, state=KubeletResizeState.IN_PROGRESS)
    p = plan(snapshot([group()], [pod("w1", resize=inflight, failed=True)], [(res(3), 1)]))
    assert p.resize == () and p.launch_by_group == {"g1": 1}


# --- tasks waiting inside a placement group ------------------------------------------------------

PG = "6f1b4a2de0c3417a9b2c8d7e5f60718293a4"  # a placement group id as Ray writes it (hex)


@pytest.mark.parametrize(
    "shape",
    [
        {f"CPU_group_0_{PG}": 10_000},
        {f"CPU_group_{PG}": 10_000},
        {f"bundle_group_{PG}": 10, f"bundle_group_1_{PG}": 10},
        {f"GPU_group_2_{PG}": 10_000, f"CPU_group_2_{PG}": 10_000},
    ],
)
def test_tasks_waiting_inside_a_placement_group_are_left_to_it(shape: dict[str, int]) -> None:
    waiting = Demand(shape=Resources(shape), count=3)
    p = plan(snapshot([group()], [pod("w1")]).model_copy(update={"demands": (waiting,)}))
    assert p.is_empty
    assert p.infeasible.demands == 0
    assert not any("cannot place" in n for n in p.notes)
    assert any("3 task/actor unit(s) wait inside their placement group" in n for n in p.notes)


def test_a_custom_resource_that_only_looks_like_a_group_is_still_planned() -> None:
    ours = Demand(shape=Resources({"my_group_a": 10_000}), count=1)
    p = plan(snapshot([group()], [pod("w1")]).model_copy(update={"demands": (ours,)}))
    assert p.infeasible.demands == 1 and any("cannot place" in n for n in p.notes)


# --- idle --------------------------------------------------------------------------------------


def test_idle_pod_past_timeout_is_removed() -> None:
    p = plan(snapshot([group()], [pod("w1", idle_s=61), pod("w2", idle_s=59)]))
    assert [t.pod for t in p.terminate] == ["w1"]
    assert "idle 61s ≥ 60s" in p.terminate[0].reason


def test_idle_removal_respects_min_workers() -> None:
    p = plan(snapshot([group(min_workers=1)], [pod("w1", idle_s=100), pod("w2", idle_s=200)]))
    assert len(p.terminate) == 1


def test_idle_grown_pod_shrinks_back_to_its_template_first() -> None:
    p = plan(snapshot([group()], [pod("w1", cpu=4, mem_gib=8, idle_s=100)]))
    assert p.terminate == ()
    assert sizes(p) == {"w1": (1, 2)}
    assert p.resize[0].shrinks
    assert "shrink 4 CPU/8Gi → 1 CPU/2Gi" in p.resize[0].reason
    # next tick, back at template size and still idle: removed
    p = plan(snapshot([group()], [pod("w1", idle_s=130)]))
    assert [t.pod for t in p.terminate] == ["w1"]


def test_a_failure_record_blocks_growing_not_shrinking_back() -> None:
    """A pod that grew once and whose later resize failed still shrinks back to its
    template when idle (minReplicas keeps it: it would hold the grown size for good); a
    failure just now (perhaps that very shrink) waits an idle timeout before a new try."""
    keep = group(min_workers=1)
    failed_long_ago = pod("w1", cpu=2, mem_gib=2, idle_s=100, failed=True, failed_age_s=300)
    p = plan(snapshot([keep], [failed_long_ago]))
    assert sizes(p) == {"w1": (1, 2)} and p.resize[0].shrinks
    failed_just_now = pod("w1", cpu=2, mem_gib=2, idle_s=100, failed=True, failed_age_s=5)
    assert plan(snapshot([keep], [failed_just_now])).is_empty
    # growing stays blocked
    p = plan(snapshot([keep], [pod("w1", failed=True, failed_age_s=300)], [(res(2), 1)]))
    assert p.resize == () and p.launch_by_group == {"g1": 1}


def test_a_pod_whose_raylet_never_registers_is_replaced_not_waited_on() -> None:
    """Running for longer than raylet_start_timeout_s with no Raylet: it will not bring
    one. It is removed and its room is not counted as coming: the minimum and the waiting
    work get a new pod in the same plan."""
    keep = group(min_workers=1)
    silent = pod("w1", raylet_id=None, running_s=700)
    p = plan(snapshot([keep], [silent], [(res(1), 1)]))
    assert [t.pod for t in p.terminate] == ["w1"]
    assert "its Raylet has not registered 700s after the pod started (limit 600s)" in (
        p.terminate[0].reason
    )
    assert p.launch_by_group == {"g1": 1}
    # still inside the limit: waited on, and counted as the room that is coming
    starting = pod("w1", raylet_id=None, running_s=30)
    assert plan(snapshot([keep], [starting], [(res(1), 1)])).is_empty


def test_a_running_pod_the_snapshot_has_pending_for_want_of_a_raylet_is_replaced() -> None:
    """As `join` gives it: a pod with no Raylet is PENDING whatever Kubernetes says, and
    `running_s` is how long Kubernetes has run it. RAYSIZE_RAYLET_START_TIMEOUT_S never
    fired when only a RUNNING pod without a Raylet counted: there is no such pod."""
    keep = group(min_workers=1)
    silent = pod("w1", phase=PodPhase.PENDING, running_s=700)
    p = plan(snapshot([keep], [silent], [(res(1), 1)]))
    assert [t.pod for t in p.terminate] == ["w1"]
    assert p.launch_by_group == {"g1": 1}
    # not yet started by Kubernetes (running_s 0): waited on, as the room that is coming
    launched = pod("w1", phase=PodPhase.PENDING)
    assert plan(snapshot([keep], [launched], [(res(1), 1)])).is_empty


def test_idle_pod_with_work_to_take_is_kept() -> None:
    p = plan(snapshot([group()], [pod("w1", idle_s=100)], [(res(1), 1)]))
    assert p.is_empty


def test_room_freed_by_an_idle_removal_is_used_in_the_same_plan() -> None:
    """The cluster is at max_workers; its idle 1-CPU pod cannot take the 2-CPU demand
    (no IPPR), a pod of the other group can: remove the idle one and launch that one now,
    not a tick later."""
    small = group("small", max_cpu=None)
    big = group("big", max_cpu=None, cpu=2, mem_gib=4)
    capped = PlannerSettings(max_workers=1)
    p = plan(
        snapshot([small, big], [pod("s0", "small", idle_s=100)], [(res(2), 1)], settings=capped)
    )
    assert [t.pod for t in p.terminate] == ["s0"]
    assert p.launch_by_group == {"big": 1}
    assert p.infeasible.demands == 0
    # a pod the plan removes never takes work: a gang is planned on the new pod alone
    gang = Gang(bundles=(res(1), res(1)), strategy=GangStrategy.PACK)
    snap = snapshot([small, big], [pod("s0", "small", idle_s=100)], settings=capped)
    p = plan(snap.model_copy(update={"gangs": (gang,)}))
    assert [t.pod for t in p.terminate] == ["s0"]
    assert p.launch_by_group == {"big": 1}
    assert p.infeasible.gangs == 0


# --- a launch moved to a smaller group (smaller_launches) -----------------------------------


def test_a_gang_alike_in_two_groups_launches_the_smaller_and_leaves_the_capped_one() -> None:
    """A GPU placement group fits new pods of two GPU groups alike; g0 (one pod at most)
    grows to more memory, so its pod is the bigger. The group's pods go to the smaller
    group, and the task that names g0 still finds room under g0's maximum. (Found by a
    planner property: the group's pod took g0's one place and was then moved to the
    smaller group, and the task was reported as unplaceable.)"""
    g0 = group("g0", cpu=1, mem_gib=2, max_cpu=1, max_mem_gib=3, max_workers=1, GPU=2)
    g1 = group("g1", cpu=1, mem_gib=2, max_cpu=None, max_workers=None, GPU=2)
    gang = Gang(bundles=(res(0.5, GPU=0.5),), strategy=GangStrategy.PACK, count=2)
    named = Demand(shape=res(0.25), count=1, label_selector={"ray.io/node-group": "g0"})
    snap = snapshot([g0, g1], [], [(res(0.25), 2)])
    p = plan(snap.model_copy(update={"gangs": (gang,), "demands": (*snap.demands, named)}))
    assert p.launch_by_group == {"g0": 1, "g1": 1}
    assert p.infeasible.demands == 0 and p.infeasible.gangs == 0


def test_work_left_takes_the_room_a_launch_moved_to_a_smaller_group_has() -> None:
    """Conservative mode, nothing running: one pod may be launched. The placement group
    (3 × 0.5 CPU) fills g0's pod best (2 CPU), which is then moved to g2, the smaller pod
    (g0 grows to 10 GiB); g2 grows to 3 CPU, so its pod also holds both waiting tasks.
    They go on it in the same plan, not reported as unplaceable."""
    g0 = group("g0", cpu=2, mem_gib=4, max_cpu=2, max_mem_gib=10, max_workers=None)
    g2 = group("g2", cpu=2, mem_gib=4, max_cpu=3, max_mem_gib=4, max_workers=None)
    gang = Gang(bundles=(res(0.5), res(0.5), res(0.5)), strategy=GangStrategy.PACK)
    cons = PlannerSettings(upscaling_mode=UpscalingMode.CONSERVATIVE)
    snap = snapshot([g0, g2], [], [(res(0.5), 2)], settings=cons)
    p = plan(snap.model_copy(update={"gangs": (gang,)}))
    assert p.launch_by_group == {"g2": 1}
    assert p.infeasible.demands == 0 and p.infeasible.gangs == 0
    assert not [n for n in p.notes if "cannot place" in n]


# --- upscaling modes -----------------------------------------------------------------------


def test_conservative_mode_limits_pending_pods_to_running_ones() -> None:
    cons = PlannerSettings(upscaling_mode=UpscalingMode.CONSERVATIVE)
    demand = [(res(4), 10)]
    g = group(max_cpu=None, cpu=4, mem_gib=8, max_workers=100)
    busy = [pod("w1", cpu=4, mem_gib=8, free_cpu=0), pod("w2", cpu=4, mem_gib=8, free_cpu=0)]
    assert plan(snapshot([g], busy, demand, settings=cons)).launch_by_group == {"g1": 2}
    assert plan(snapshot([g], busy, demand)).launch_by_group == {"g1": 10}
    aggressive = PlannerSettings(upscaling_mode=UpscalingMode.AGGRESSIVE)
    assert plan(snapshot([g], busy, demand, settings=aggressive)).launch_by_group == {"g1": 10}
    # nothing running yet: one at a time
    assert plan(snapshot([g], [], demand, settings=cons)).launch_by_group == {"g1": 1}


def test_conservative_mode_counts_pending_pods_across_groups() -> None:
    """KubeRay: pending worker pods ≤ worker pods connected to the cluster, all groups."""
    cons = PlannerSettings(upscaling_mode=UpscalingMode.CONSERVATIVE)
    a = group("a", max_cpu=None, cpu=4, mem_gib=8, max_workers=100)
    b = group("b", max_cpu=None, cpu=4, mem_gib=8, max_workers=100)
    pods = [
        pod("a1", "a", cpu=4, mem_gib=8, free_cpu=0),
        pod("a2", "a", cpu=4, mem_gib=8, free_cpu=0),
        pod("a3", "a", cpu=4, mem_gib=8, free_cpu=0),
        pod("b1", "b", cpu=4, mem_gib=8, phase=PodPhase.PENDING),
    ]
    # 3 connected, 1 pending (in b, already holding 4 CPUs of the demand): 2 more at most
    p = plan(snapshot([a, b], pods, [(res(4), 10)], settings=cons))
    assert sum(p.launch_by_group.values()) == 2
    # a running pod whose Raylet has not registered is not connected yet
    pods[0] = pod("a1", "a", cpu=4, mem_gib=8, free_cpu=0, raylet_id=None)
    p = plan(snapshot([a, b], pods, [(res(4), 10)], settings=cons))
    assert sum(p.launch_by_group.values()) == 0


def test_plan_is_deterministic() -> None:
    snap = snapshot(
        [group("a"), group("b")], [pod("a1", "a"), pod("b1", "b")], [(res(2), 5), (res(0.5), 7)]
    )
    assert plan(snap) == plan(snap)


def test_one_plan_places_at_most_the_limit_and_says_what_waits():
    """Ray may report any number of tasks; a plan takes the first MAX_PLAN_UNITS (tasks,
    then placement groups) so planning stays about a second, and says the rest waits."""
    from raysize.workflows.model import MAX_PLAN_UNITS, Gang

    snap = snapshot(
        [group(max_cpu=None, max_workers=None)],
        [],
        [(res(1), 10**9)],
    ).model_copy(update={"gangs": (Gang(bundles=(res(1), res(1)), count=5),)})
    p = plan(snap)
    assert sum(a.count for a in p.launch) == MAX_PLAN_UNITS
    assert p.notes[0] == (
        f"{10**9 + 10 - MAX_PLAN_UNITS} of {10**9 + 10} pending units wait for the next plan: "
        f"one plan places at most {MAX_PLAN_UNITS} (tasks first, then placement groups, then "
        "request_resources)"
    )
