"""`bench.ray_compare`: Ray 2.60's scheduler gets a faithful translation, and ours does no worse.

Ray's scheduler runs in one child process for the whole module (`ray` and raysize's
`activities.ray_proto` cannot share this process). The seed cases are those of Ray's
IPPR pull request (ray-project/ray#55961): a head with no CPUs and
one worker group of 1 CPU that may grow in place to 4.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from bench.plan_bench import SHAPES, generate, generate_shape, generate_wide
from bench.ray_compare import (
    Added,
    Outcome,
    RayCache,
    RayScheduler,
    Resize,
    Row,
    added,
    comparable,
    compare,
    describe,
    main,
    only_what_ray_placed,
    over_maximum,
    run_ours,
    runs,
    shape_name,
    table_row,
    verdict,
)
from raysize.worker.scenario import load_scenario

GIB = 1024**3
IPPR = {"max_cpu": 4, "max_memory": 8 * GIB, "resize_timeout_s": 60}


@pytest.fixture(scope="module")
def ray() -> Iterator[RayScheduler]:
    with RayScheduler() as scheduler:
        yield scheduler


def both(ray: RayScheduler, doc: dict[str, Any]) -> tuple[Outcome, Outcome]:
    ours, theirs, dropped = compare(doc, ray, repeat=1, ray_repeat=1, ray_timeout_s=60)
    assert dropped == []
    assert theirs.seconds is not None
    return ours, theirs


def head() -> dict[str, Any]:
    return {
        "name": "head",
        "group": "headgroup",
        "raylet_id": "00" * 28,
        "total": {"CPU": 0, "memory": 2 * GIB},
    }


def worker(
    name: str, cpu: float = 1, free: float | None = None, *, idle_s: float = 5, **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "group": "workergroup1",
        "phase": "running",
        "raylet_id": f"{len(name):02x}" * 28,
        "total": {"CPU": cpu, "memory": 2 * GIB},
        "available": {"CPU": cpu if free is None else free, "memory": 2 * GIB},
        "idle_s": idle_s,
        **extra,
    }


def seed(pods: list[dict[str, Any]], demands: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "seed",
        "max_workers": 10,
        "idle_timeout_s": 60,
        "groups": {
            "workergroup1": {
                "resources": {"CPU": 1, "memory": 2 * GIB},
                "min_workers": 0,
                "max_workers": 10,
                "labels": {"ray.io/node-group": "workergroup1"},
                "ippr": IPPR,
            }
        },
        "pods": [head(), *pods],
        "demands": [{"shape": d, "count": 1} for d in demands],
    }


def grown(o: Outcome) -> list[tuple[str, float]]:
    return [(r.pod, r.cpu) for r in o.resizes if r.for_demand and r.grows]


def assert_ours_no_worse(ours: Outcome, theirs: Outcome) -> None:
    assert ours.demand_placed >= theirs.demand_placed
    assert ours.gangs_placed >= theirs.gangs_placed
    assert ours.constraint_placed >= theirs.constraint_placed
    assert ours.pods_launched <= theirs.pods_launched


# --- the seed pull request's cases ------------------------------------------------------


def test_case1_ray_resizes_the_idle_worker_to_4_cpus_and_launches_nothing(ray):
    ours, theirs = both(ray, seed([worker("w1")], [{"CPU": 2}]))

    assert grown(theirs) == [("w1", 4.0)]
    assert theirs.resizes[0].memory == 8 * GIB  # Ray goes to both maximums in one step
    assert theirs.launched == {}
    assert theirs.demand_left == 0
    assert [pod for pod, _ in grown(ours)] == ["w1"]
    assert_ours_no_worse(ours, theirs)


def test_case2_ray_resizes_the_worker_and_launches_one_for_the_rest(ray):
    ours, theirs = both(ray, seed([worker("w1")], [{"CPU": 2}, {"CPU": 4}]))

    assert grown(theirs) == [("w1", 4.0)]
    assert theirs.launched == {"workergroup1": 1}
    assert theirs.demand_left == 0
    assert_ours_no_worse(ours, theirs)


def test_case3_with_no_worker_ray_launches_one_counted_at_its_ippr_maximum(ray):
    ours, theirs = both(ray, seed([], [{"CPU": 2}]))

    assert theirs.launched == {"workergroup1": 1}
    assert theirs.demand_left == 0
    assert theirs.resizes == []
    assert_ours_no_worse(ours, theirs)


def test_a_new_pod_counts_at_what_each_planner_puts_on_it(ray):
    # no worker; tasks of 3 CPU and 1 CPU: both launch one pod of the 1-CPU group and fill
    # it to 4 CPU (its IPPR maximum), so it counts at 4 CPU, not at its launch size of 1
    doc = seed([], [{"CPU": 3}, {"CPU": 1}])
    ours, theirs = both(ray, doc)
    snap = load_scenario(doc)
    for o in (ours, theirs):
        assert o.launched == {"workergroup1": 1}
        assert [(g, cpu) for g, cpu, _ in o.new_pod_use] == [("workergroup1", 4.0)]
        assert added(snap, o).cpu == 4.0
    # a pod launched with nothing on it (min_workers) counts at its launch size
    idle = Outcome(**{**ours.to_json(), "new_pod_use": []})
    assert added(snap, idle).cpu == 1.0


def test_case4_a_timed_out_resize_is_rolled_back_and_ray_scales_out(ray):
    stuck = worker(
        "w1",
        resize={"cpu": 4, "memory": 8 * GIB, "state": "timed_out"},
    )
    ours, theirs = both(ray, seed([stuck], [{"CPU": 2}]))

    # Ray's IPPR provider queues the rollback to where the pod is (1 CPU), not a demand
    assert [(r.pod, r.cpu, r.for_demand) for r in theirs.resizes] == [("w1", 1.0, False)]
    assert theirs.launched == {"workergroup1": 1}
    assert theirs.demand_left == 0
    assert grown(ours) == []
    assert_ours_no_worse(ours, theirs)


def test_case2_t2_the_second_worker_is_resized_once_the_first_is_full(ray):
    full = worker("w1", cpu=4, free=0, idle_s=0)
    ours, theirs = both(ray, seed([full, worker("w2")], [{"CPU": 2}]))

    assert grown(theirs) == [("w2", 4.0)]
    assert theirs.launched == {}
    assert_ours_no_worse(ours, theirs)


def test_an_in_flight_resize_counts_at_its_target_for_ray(ray):
    resizing = worker("w1", resize={"cpu": 4, "memory": 8 * GIB, "state": "in_progress"})
    ours, theirs = both(ray, seed([resizing], [{"CPU": 2}]))

    assert theirs.resizes == []  # nothing new to send: the resize is under way
    assert theirs.launched == {}
    assert theirs.demand_left == 0
    assert_ours_no_worse(ours, theirs)


def test_a_deferred_resize_is_retargeted_to_the_kubelets_suggestion(ray):
    deferred = worker(
        "w1",
        resize={"cpu": 4, "memory": 8 * GIB, "state": "deferred", "suggested_max_cpu": 3},
    )
    ours, theirs = both(ray, seed([deferred], [{"CPU": 2}]))

    assert [(r.pod, r.cpu, r.for_demand) for r in theirs.resizes] == [("w1", 3.0, False)]
    assert theirs.launched == {}
    assert_ours_no_worse(ours, theirs)


def test_a_pod_that_failed_to_resize_before_is_not_resized_again(ray):
    failed = worker("w1", resize={"state": "error", "failed": True})
    ours, theirs = both(ray, seed([failed], [{"CPU": 2}]))

    assert grown(theirs) == []
    assert theirs.launched == {"workergroup1": 1}
    assert_ours_no_worse(ours, theirs)


def test_a_pending_pod_is_a_node_without_a_raylet_and_is_not_resized(ray):
    pending = {
        "name": "p1",
        "group": "workergroup1",
        "phase": "pending",
        "raylet_id": None,
        "total": {"CPU": 1, "memory": 2 * GIB},
    }
    ours, theirs = both(ray, seed([pending], [{"CPU": 2}]))

    assert theirs.resizes == []  # no Raylet yet: nothing Ray can send
    assert theirs.launched == {}
    assert theirs.demand_left == 0
    assert_ours_no_worse(ours, theirs)


# --- labels, gangs, constraints, caps -----------------------------------------------------


def zones() -> dict[str, Any]:
    doc = seed([], [])
    doc["groups"] = {
        "small": {
            "resources": {"CPU": 1, "memory": 2 * GIB},
            "max_workers": 10,
            "labels": {"ray.io/node-group": "small", "zone": "a"},
            "ippr": IPPR,
        },
        "medium": {
            "resources": {"CPU": 4, "memory": 8 * GIB},
            "max_workers": 10,
            "labels": {"ray.io/node-group": "medium", "zone": "b"},
            "ippr": None,
        },
    }
    return doc


@pytest.mark.parametrize(
    ("selector", "group"),
    [
        ({"zone": "b"}, "medium"),
        ({"zone": "!b"}, "small"),
        ({"ray.io/node-group": "in(small,other)"}, "small"),
        ({"zone": "!in(a,c)"}, "medium"),
    ],
)
def test_label_selectors_reach_ray_in_its_syntax(ray, selector, group):
    doc = zones()
    doc["demands"] = [{"shape": {"CPU": 1}, "count": 1, "label_selector": selector}]
    ours, theirs = both(ray, doc)

    assert theirs.launched == {group: 1}
    assert ours.launched == {group: 1}


@pytest.mark.parametrize(
    ("strategy", "ray_pods"),
    [("STRICT_SPREAD", 3), ("STRICT_PACK", 1), ("PACK", 1), ("SPREAD", 1)],
)
def test_gang_strategies_reach_ray_as_the_gcs_sends_them(ray, strategy, ray_pods):
    doc = seed([], [])
    doc["gangs"] = [{"bundles": [{"CPU": 1}] * 3, "strategy": strategy, "count": 1}]
    ours, theirs = both(ray, doc)

    assert theirs.gangs_placed == 1
    assert theirs.pods_launched == ray_pods
    assert_ours_no_worse(ours, theirs)


def test_constraints_and_the_global_cap_reach_ray(ray):
    doc = seed([], [])
    doc["max_workers"] = 2
    doc["constraints"] = [{"shape": {"CPU": 4}, "count": 3}]
    ours, theirs = both(ray, doc)

    # three 4-CPU bundles need three pods; two are allowed: Ray gives none of it
    assert theirs.constraint_placed == 0
    assert theirs.pods_launched == 0
    assert ours.pods_launched <= 2
    assert ours.constraint_placed >= theirs.constraint_placed

    doc["max_workers"] = 3
    ours, theirs = both(ray, doc)
    assert theirs.constraint_placed == 3
    assert theirs.launched == {"workergroup1": 3}
    assert_ours_no_worse(ours, theirs)


def test_idle_workers_past_the_timeout_are_terminated_by_both(ray):
    doc = seed([worker("w1", idle_s=600), worker("w2", idle_s=5)], [])
    ours, theirs = both(ray, doc)

    assert set(theirs.terminated) == {"w1"}
    assert set(ours.terminated) == {"w1"}


# --- a generated scenario -----------------------------------------------------------------


@pytest.fixture(scope="module")
def generated(ray: RayScheduler) -> tuple[dict[str, Any], Outcome, Outcome]:
    doc = generate(20, 100)
    ours, theirs = both(ray, doc)
    return doc, ours, theirs


def test_generated_scenario_is_translated_faithfully(generated):
    doc, _, theirs = generated
    pods = {p["name"]: p for p in doc["pods"]}
    assert theirs.demand_units == sum(d["count"] for d in doc["demands"])
    assert theirs.gangs == sum(g["count"] for g in doc["gangs"])
    # Ray resizes only registered pods of IPPR groups, to their group's maximums
    assert theirs.resizes
    for r in theirs.resizes:
        p = pods[r.pod]
        ippr = doc["groups"][p["group"]]["ippr"]
        assert p["phase"] == "running" and p["raylet_id"]
        assert (r.cpu, r.memory) == (ippr["max_cpu"], ippr["max_memory"])
        assert (r.from_cpu, r.from_memory) == (p["total"]["CPU"], p["total"]["memory"])
    # and terminates only pods idle past the timeout
    for name in theirs.terminated:
        assert pods[name]["idle_s"] > doc["idle_timeout_s"]


def test_generated_scenario_ours_places_at_least_as_much(generated):
    _, ours, theirs = generated
    assert ours.demand_placed >= theirs.demand_placed
    assert ours.gangs_placed >= theirs.gangs_placed
    assert ours.constraint_placed >= theirs.constraint_placed


# Found by this comparison and fixed in the planner: leftovers of several shapes share
# new pods (the group whose pod takes the most of everything left), and demands with
# label selectors are placed before unconstrained ones.
def test_generated_scenario_ours_launches_no_more_pods(generated):
    _, ours, theirs = generated
    assert ours.pods_launched <= theirs.pods_launched


def test_minimal_case_ours_launches_no_more_pods(ray):
    doc = zones()
    doc["groups"]["medium"]["ippr"] = {
        "max_cpu": 16,
        "max_memory": 32 * GIB,
        "resize_timeout_s": 60,
    }
    doc["pods"] = [
        head(),
        {**worker("s1", free=0.5, idle_s=0), "group": "small"},
    ]
    doc["demands"] = [
        {"shape": {"CPU": 2}, "count": 3},
        {"shape": {"CPU": 3}, "count": 1},
        {"shape": {"CPU": 2}, "count": 1, "label_selector": {"zone": "!b"}},
    ]
    ours, theirs = both(ray, doc)
    assert theirs.launched == {"medium": 1}
    assert ours.demand_placed == theirs.demand_placed == 5
    assert ours.pods_launched <= theirs.pods_launched


def test_ray_says_which_demand_it_left_and_ours_is_compared_on_the_rest(ray):
    doc = seed([worker("w1", cpu=4, free=4)], [{"CPU": 1}, {"CPU": 64}, {"CPU": 2}])
    doc["demands"][0]["count"] = 3
    _, theirs = both(ray, doc)

    assert theirs.demand_left_by_entry == [0, 1, 0]  # 64 CPUs fit no pod of the group
    rest = only_what_ray_placed(doc, theirs)
    assert rest is not None
    assert [(d["shape"], d["count"]) for d in rest["demands"]] == [({"CPU": 1}, 3), ({"CPU": 2}, 1)]
    assert doc["demands"][1]["count"] == 1  # the input is untouched


def test_unplaced_units_of_entries_alike_are_shared_out_in_order_within_their_counts(ray):
    # the first and last entries send Ray the same request: its 3 unplaced units are
    # theirs, 1 and 2, not all 3 charged to the last entry
    doc = seed([worker("w1", cpu=4, free=4)], [{"CPU": 64}, {"CPU": 1}, {"CPU": 64}])
    doc["demands"][2]["count"] = 2
    _, theirs = both(ray, doc)

    assert theirs.demand_left_by_entry == [1, 0, 2]
    rest = only_what_ray_placed(doc, theirs)
    assert rest is not None
    assert [(d["shape"], d["count"]) for d in rest["demands"]] == [({"CPU": 1}, 1)]


def _outcome(planner: str, placed: int, launched: int) -> Outcome:
    return Outcome(
        planner=planner,
        seconds=[1.0 if planner == "ray" else 0.001],
        demand_units=10,
        demand_left=10 - placed,
        gangs=0,
        gangs_left=0,
        constraint_units=0,
        constraint_left=0,
        launched={"g": launched} if launched else {},
    )


def test_an_extra_pod_for_demand_ray_left_waiting_is_not_counted_against_ours():
    ray, ours = _outcome("ray", 8, 2), _outcome("ours", 10, 3)
    assert "launched no more pods: NO (3 vs 2)" in verdict("s", ours, ray)
    # on only what Ray placed, ours launches 2: the third pod serves the 2 units Ray left
    same = _outcome("ours", 8, 2)
    text = verdict("s", ours, ray, same)
    assert "launched no more pods: yes (3 vs 2; ours places 2 more demand units, " in text
    assert text.endswith("for only the demand Ray placed launches 2)")
    worse = _outcome("ours", 8, 3)
    assert "launched no more pods: NO" in verdict("s", ours, ray, worse)


def test_the_200_pod_scenario_needs_no_more_pods_than_ray_for_what_ray_placed():
    """Measured with Ray's scheduler (16 s, `python -m bench.ray_compare --sizes 200`): Ray
    leaves all 18 {CPU: 1, GPU: 1} units unplaced, places 1,982 and launches 96 pods."""
    doc, _ = comparable(generate(200, 2_000))
    gpu = next(i for i, d in enumerate(doc["demands"]) if d["shape"] == {"CPU": 1, "GPU": 1})
    left = [0] * len(doc["demands"])
    left[gpu] = 18
    rays = _outcome("ray", 0, 0)
    rays = Outcome(**{**rays.to_json(), "demand_left_by_entry": left})
    rest = only_what_ray_placed(doc, rays)
    assert rest is not None
    ours = run_ours(rest, 1)
    assert ours.demand_left == 0
    assert ours.pods_launched <= 96


# --- the report ---------------------------------------------------------------------------


def test_features_ray_cannot_express_are_dropped_for_both():
    doc = seed([], [{"CPU": 1}])
    doc["settings"] = {"upscaling_mode": "Conservative"}
    doc["pods"].append(
        {"name": "p", "group": "workergroup1", "phase": "pending", "labels": {"x": "y"}}
    )
    out, dropped = comparable(doc)

    assert "upscaling_mode" not in out["settings"]
    assert out["pods"][-1]["labels"] == {}
    assert len(dropped) == 2
    assert doc["settings"] == {"upscaling_mode": "Conservative"}  # the input is untouched


def test_a_slow_ray_is_reported_as_more_than_the_timeout():
    with RayScheduler() as slow:
        _, theirs, _ = compare(
            generate(200, 2_000), slow, repeat=1, ray_repeat=1, ray_timeout_s=0.2
        )
        assert theirs.seconds is None
        assert "> 0.2 s" in describe("bench", theirs)
        # the child was stopped; the next job starts a new one
        ours, fast, _ = compare(
            seed([], [{"CPU": 1}]), slow, repeat=1, ray_repeat=1, ray_timeout_s=60
        )
        assert fast.seconds is not None
        assert "faster" in verdict("seed", ours, fast)


# --- seeds, the cache, the counting rule and the verdict -------------------------------------


def test_sizes_are_pods_times_seeds():
    assert runs("200x10,2_000x2") == [(200, 10), (2000, 2)]
    assert runs("200") == [(200, 1)]
    with pytest.raises(argparse.ArgumentTypeError, match=r"--sizes: '200y3' is not PODS"):
        runs("200y3")


def test_a_deferred_resize_in_flight_costs_neither_planner_anything():
    # w1 is 1 CPU, its resize to 4 was deferred and the kubelet suggests 2: both count it
    # at 2, so Ray's follow-up resize to 2 adds nothing and a grow to 3 adds 1
    w1 = worker(
        "w1", resize={"cpu": 4, "memory": 2 * GIB, "state": "deferred", "suggested_max_cpu": 2}
    )
    doc = seed([w1], [])
    snap = load_scenario(doc)
    ray = _outcome("ray", 0, 1)
    ray = Outcome(**{**ray.to_json(), "launched": {"workergroup1": 1}})
    ray.resizes.append(Resize("w1", 2.0, 2 * GIB, 1.0, 2 * GIB, for_demand=False))
    assert added(snap, ray) == Added(new_pods=1, resized=0, cpu=1.0, memory=2 * GIB)
    ours = Outcome(**{**_outcome("ours", 0, 0).to_json(), "launched": {}})
    ours.resizes.append(Resize("w1", 3.0, 2 * GIB, 1.0, 2 * GIB))
    assert added(snap, ours) == Added(new_pods=0, resized=1, cpu=1.0, memory=0)


def test_pods_above_their_groups_maximum_are_dropped_for_both():
    doc = seed([worker("busy", idle_s=0), worker("old", idle_s=600), worker("new", idle_s=5)], [])
    doc["groups"]["workergroup1"]["max_workers"] = 2
    doc["pods"].append({"name": "starting", "group": "workergroup1", "phase": "pending"})
    assert over_maximum(doc) == {"starting", "old"}  # pending first, then the longest idle
    out, dropped = comparable(doc)
    assert {p["name"] for p in out["pods"]} == {"head", "busy", "new"}
    assert "2 pod(s) above their group's max_workers" in dropped[0]


class CountingRay:
    """Stands in for Ray's scheduler process: counts the schedules asked of it."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.calls = 0

    def run(self, doc: dict[str, Any], repeat: int, timeout_s: float) -> Outcome:
        self.calls += 1
        return self.outcome


def test_rays_outcome_is_cached_by_scenario_and_a_stopped_one_is_not(tmp_path):
    doc = seed([worker("w1")], [{"CPU": 2}])
    cache = RayCache(tmp_path)
    fake = CountingRay(_outcome("ray", 1, 0))
    for _ in range(2):
        _, theirs, _ = compare(
            doc,
            fake,
            repeat=1,
            ray_repeat=1,
            ray_timeout_s=60,
            cache=cache,  # type: ignore[arg-type]
        )
    assert fake.calls == 1 and theirs == fake.outcome
    other = seed([worker("w1")], [{"CPU": 3}])
    compare(other, fake, repeat=1, ray_repeat=1, ray_timeout_s=60, cache=cache)  # type: ignore[arg-type]
    assert fake.calls == 2  # another scenario is another key
    stopped = Outcome(**{**_outcome("ray", 0, 0).to_json(), "seconds": None, "timeout_s": 1.0})
    slow = CountingRay(stopped)
    third = seed([worker("w1")], [{"CPU": 4}])
    for _ in range(2):
        compare(third, slow, repeat=1, ray_repeat=1, ray_timeout_s=1, cache=cache)  # type: ignore[arg-type]
    assert slow.calls == 2


def _row(ours: Added, ray: Added, on_rays: Added | None = None, placed: int = 10) -> Row:
    return Row(
        name="s",
        pods=200,
        seed=1,
        ours=_outcome("ours", placed, ours.new_pods),
        ray=_outcome("ray", 8, ray.new_pods),
        ours_added=ours,
        ray_added=ray,
        ours_on_rays=on_rays,
    )


def test_the_verdict_names_each_target_missed():
    ray = Added(new_pods=3, resized=2, cpu=10.0, memory=8 * GIB)
    assert _row(Added(3, 2, 10.0, 8 * GIB), ray).verdict() == "met"
    assert _row(Added(4, 2, 11.0, 8 * GIB), ray).verdict() == "NOT met: new pods, added capacity"
    assert _row(Added(3, 2, 10.0, 8 * GIB), ray, placed=7).verdict() == "NOT met: placed"
    # more placed than Ray, and on only what Ray placed no more pods or capacity
    fair = _row(Added(4, 2, 11.0, 8 * GIB), ray, on_rays=Added(3, 2, 10.0, 8 * GIB))
    assert fair.verdict().startswith("met (more placed")
    # the table shows ours on only what Ray placed in brackets: pods, CPU, memory
    assert "| 4 (3) · 3 | 2 · 2 | 11 (10) · 10 | 8 (8) · 8 |" in table_row(fair)
    missed = _row(Added(4, 2, 11.0, 8 * GIB), ray, on_rays=Added(3, 2, 10.5, 8 * GIB))
    assert missed.verdict() == "NOT met: new pods, added capacity"
    assert "| 4 (3) · 3 | 2 · 2 | 11 (10.5) · 10 |" in table_row(missed)


# --- the wide shape (issue #29, item 3) ------------------------------------------------------


def test_the_wide_shape_has_fixed_groups_beside_growable_ones_and_is_deterministic():
    doc = generate_wide(200, 2_000, 3)
    groups = doc["groups"]
    growable = {n for n, g in groups.items() if g["ippr"] is not None}
    assert growable == {"small", "medium"}
    assert groups["large"]["resources"]["CPU"] == 32
    assert {n for n, g in groups.items() if g["resources"].get("GPU")} == {"gpu-a10", "gpu-a100"}
    assert groups["highmem"]["resources"]["memory"] == 256 * GIB
    # every group has pods, and load_scenario takes it
    assert {p["group"] for p in doc["pods"]} == {"headgroup", *groups}
    snap = load_scenario(doc)
    assert sum(d.count for d in snap.demands) == 2_000
    assert generate_wide(200, 2_000, 3) == doc
    assert generate_wide(200, 2_000, 4) != doc
    # the default shape is what it was: the README's table stays valid
    assert generate_shape("default", 200, 2_000, 3) == generate(200, 2_000, 3)
    assert SHAPES == ("default", "wide")


def test_a_shape_not_known_is_refused_naming_the_option(capsys):
    assert shape_name("wide") == "wide"
    with pytest.raises(
        argparse.ArgumentTypeError,
        match=r"'huge' is not a generated shape; use one of default, wide",
    ):
        shape_name("huge")
    with pytest.raises(SystemExit):
        main(["--shape", "huge"])
    assert "argument --shape: 'huge' is not a generated shape" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--shape", "wide", "--scenario", "x.json"])
    assert "--shape wide shapes generated scenarios: give --sizes too" in capsys.readouterr().err
    with pytest.raises(ValueError, match="shape 'huge' is not one of default, wide"):
        generate_shape("huge", 10, 100)


def wide_mini(demands: list[dict[str, Any]]) -> dict[str, Any]:
    """The wide shape in small: small and medium groups that grow in place, a fixed
    32-CPU group, a fixed GPU group; no pods but the head."""
    full = generate_wide(20, 0, 1)
    groups = {n: full["groups"][n] for n in ("small", "medium", "large", "gpu-a10")}
    return {**seed([], []), "groups": groups, "demands": demands}


@pytest.mark.parametrize(
    "demands",
    [
        # the last 24 CPUs of work: Ray buys a medium and two small pods (ours two medium
        # ones), not a large one
        [{"shape": {"CPU": 1}, "count": 24}],
        # CPU work beside a GPU task: Ray puts it on the GPU pod it launches for the task
        [{"shape": {"CPU": 1}, "count": 4}, {"shape": {"CPU": 4, "GPU": 1}, "count": 1}],
    ],
    ids=["tail", "gpu-spare"],
)
def test_the_wide_shape_in_small_costs_ours_no_more_than_ray(ray, demands):
    doc = wide_mini(demands)
    ours, theirs = both(ray, doc)
    snap = load_scenario(doc)
    assert "large" not in theirs.launched and "large" not in ours.launched
    assert_ours_no_worse(ours, theirs)
    mine, rays = added(snap, ours), added(snap, theirs)
    assert mine.cpu <= rays.cpu
    # memory is not compared here: on the tail case ours' two medium pods bring their
    # 16 GiB templates (32 GiB) where Ray's medium and two small pods bring 20 GiB, one
    # pod more. On the generated wide seeds ours adds far less memory than Ray.
