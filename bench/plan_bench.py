"""Planner benchmark: `python -m bench.plan_bench` (or `make bench`).

Generates scenarios of 200 pods / 2,000 demand units, 2,000 / 20,000 and 5,000 / 50,000
(identical shapes grouped with `count`, as Ray reports them), writes them to
bench/scenarios/, plans each several times and prints the median plan time and what the
plan did. Targets on a 2-core machine: < 50 ms, < 0.5 s, < 2 s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raysize.worker.scenario import load_scenario, plan_to_json
from raysize.workflows.planner import plan

GIB = 1024**3
SIZES = [(200, 2_000), (2_000, 20_000), (5_000, 50_000)]
TARGETS = {200: 0.05, 2_000: 0.5, 5_000: 2.0}


def _group(
    cpu: float,
    memory: int,
    max_workers: int,
    labels: dict[str, str],
    ippr: tuple[float, int] | None = None,
    gpu: int = 0,
) -> dict[str, Any]:
    """A generated worker group; `ippr`: (max CPU, max memory) if it grows in place."""
    resources: dict[str, Any] = {"CPU": cpu, "memory": memory}
    if gpu:
        resources["GPU"] = gpu
    return {
        "resources": resources,
        "min_workers": 0,
        "max_workers": max_workers,
        "labels": labels,
        "ippr": None
        if ippr is None
        else {"max_cpu": ippr[0], "max_memory": ippr[1], "resize_timeout_s": 60},
    }


def _head() -> dict[str, Any]:
    """The generated cluster's head pod: no CPU for work."""
    return {
        "name": "c-head",
        "group": "headgroup",
        "phase": "running",
        "raylet_id": "00" * 28,
        "total": {"CPU": 0, "memory": 4 * GIB},
        "available": {"CPU": 0, "memory": 4 * GIB},
        "idle_s": 0,
    }


def _demands(
    rng: random.Random,
    units: int,
    shapes: Sequence[tuple[object, dict[str, str]]],
    weights: Sequence[float],
) -> list[dict[str, Any]]:
    """`units` demand units drawn among `shapes` (shape, label selector) by `weights`."""
    counts = [0] * len(shapes)
    for _ in range(units):
        counts[rng.choices(range(len(shapes)), weights=weights)[0]] += 1
    return [
        {"shape": s, "count": c, "label_selector": sel}
        for (s, sel), c in zip(shapes, counts, strict=True)
        if c
    ]


def generate(pods: int, units: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    groups: dict[str, dict[str, Any]] = {
        "small": _group(
            1, 2 * GIB, pods, {"ray.io/node-group": "small", "zone": "a"}, (4, 8 * GIB)
        ),
        "medium": _group(
            4, 8 * GIB, pods, {"ray.io/node-group": "medium", "zone": "b"}, (16, 32 * GIB)
        ),
        "gpu": _group(
            8, 32 * GIB, max(1, pods // 10), {"ray.io/node-group": "gpu", "accel": "a100"}, gpu=1
        ),
    }
    pod_list: list[dict[str, Any]] = [_head()]
    names = ["small", "medium", "gpu"]
    for i in range(pods):
        g = rng.choices(names, weights=[6, 3, 1])[0]
        res = dict(groups[g]["resources"])
        pending = rng.random() < 0.05
        busy = rng.random() < 0.7
        total = dict(res)
        if g != "gpu" and not pending and rng.random() < 0.2:
            total["CPU"] = res["CPU"] * 2
            total["memory"] = res["memory"] * 2
        avail = {k: (0 if busy and k == "CPU" else v) for k, v in total.items()}
        if busy and rng.random() < 0.5:
            avail["CPU"] = total["CPU"] / 2
        pod: dict[str, Any] = {
            "name": f"c-{g}-{i:05d}",
            "group": g,
            "phase": "pending" if pending else "running",
            "raylet_id": None if pending else f"{i:056x}",
            "total": total,
            "available": avail,
            "idle_s": 0 if busy else rng.choice([5, 30, 120, 600]),
            "resize": None,
        }
        if g != "gpu" and not pending and rng.random() < 0.03:
            pod["resize"] = {
                "cpu": groups[g]["ippr"]["max_cpu"],
                "memory": groups[g]["ippr"]["max_memory"],
                "state": rng.choice(["in_progress", "deferred"]),
                "suggested_max_cpu": None,
                "suggested_max_memory": None,
                "failed": False,
            }
        pod_list.append(pod)
    shapes = [
        ({"CPU": 0.5}, {}),
        ({"CPU": 1}, {}),
        ({"CPU": 1, "memory": GIB}, {}),
        ({"CPU": 2}, {}),
        ({"CPU": 2, "memory": 4 * GIB}, {}),
        ({"CPU": 3}, {}),
        ({"CPU": 4}, {}),
        ({"CPU": 4, "memory": 16 * GIB}, {}),
        ({"CPU": 8}, {}),
        ({"CPU": 1}, {"zone": "b"}),
        ({"CPU": 2}, {"zone": "!b"}),
        ({"CPU": 1, "GPU": 1}, {}),
        ({"CPU": 0.25, "memory": 512 * 1024**2}, {}),
        ({"memory": 2 * GIB}, {}),
        ({"CPU": 6, "memory": 12 * GIB}, {}),
        ({"CPU": 1.5}, {"ray.io/node-group": "in(small,medium)"}),
    ]
    weights = [30, 25, 10, 10, 5, 3, 4, 2, 1, 3, 2, 1, 2, 1, 1, 0]
    weights[-1] = 2
    demands = _demands(rng, units, shapes, weights)
    gangs = [
        {"bundles": [{"CPU": 1}] * 4, "strategy": "PACK", "count": max(1, pods // 100)},
        {"bundles": [{"CPU": 2}] * 2, "strategy": "STRICT_PACK", "count": max(1, pods // 200)},
        {"bundles": [{"CPU": 1}] * 3, "strategy": "STRICT_SPREAD", "count": max(1, pods // 200)},
        {"bundles": [{"CPU": 1}] * 2, "strategy": "SPREAD", "count": max(1, pods // 200)},
    ]
    constraints = [{"shape": {"CPU": 1}, "count": pods // 2}] if pods >= 2 else []
    return {
        "version": 1,
        "name": f"bench-{pods}-{units}",
        "max_workers": pods * 2,
        "idle_timeout_s": 60,
        "groups": groups,
        "pods": pod_list,
        "demands": demands,
        "gangs": gangs,
        "constraints": constraints,
    }


# The shapes `generate_shape` (and `python -m bench.ray_compare --shape`) knows.
SHAPES = ("default", "wide")


def generate_shape(shape: str, pods: int, units: int, seed: int = 7) -> dict[str, Any]:
    """A generated scenario of the named shape (`SHAPES`): `default` is `generate`,
    `wide` is `generate_wide`."""
    if shape == "default":
        return generate(pods, units, seed)
    if shape == "wide":
        return generate_wide(pods, units, seed)
    raise ValueError(f"shape {shape!r} is not one of {', '.join(SHAPES)}")


def generate_wide(pods: int, units: int, seed: int = 7) -> dict[str, Any]:
    """Six groups, as a user's large cluster (issue #29, item 3): small and medium CPU
    groups that grow in place (IPPR, 1 → 4 and 4 → 16 CPU), a *fixed-size* large group of
    32 CPU beside them, a fixed highmem group (16 CPU, 256 GiB) and two GPU groups
    (8 CPU + 1 GPU, 32 CPU + 4 GPU, no IPPR). Demand is weighted to medium and large
    tasks (2-16 CPU), a few highmem ones, GPU work of 1 and 2 GPUs (some for one
    accelerator by label), placement groups of 16 and 32 CPU, a GPU gang, and
    `request_resources`. Deterministic by seed; `generate`'s shape is unchanged."""
    rng = random.Random(seed)
    tenth, twentieth = max(1, pods // 10), max(1, pods // 20)
    groups: dict[str, dict[str, Any]] = {
        "small": _group(
            1, 2 * GIB, pods, {"ray.io/node-group": "small", "zone": "a"}, (4, 8 * GIB)
        ),
        "medium": _group(
            4, 16 * GIB, pods, {"ray.io/node-group": "medium", "zone": "b"}, (16, 64 * GIB)
        ),
        "large": _group(32, 128 * GIB, pods, {"ray.io/node-group": "large", "zone": "b"}),
        "highmem": _group(16, 256 * GIB, tenth, {"ray.io/node-group": "highmem", "zone": "c"}),
        "gpu-a10": _group(
            8, 32 * GIB, tenth, {"ray.io/node-group": "gpu-a10", "accel": "a10"}, gpu=1
        ),
        "gpu-a100": _group(
            32, 256 * GIB, twentieth, {"ray.io/node-group": "gpu-a100", "accel": "a100"}, gpu=4
        ),
    }
    pod_list: list[dict[str, Any]] = [_head()]
    names = list(groups)
    for i in range(pods):
        g = rng.choices(names, weights=[30, 30, 20, 6, 8, 6])[0]
        spec = groups[g]
        res = dict(spec["resources"])
        pending = rng.random() < 0.05
        busy = rng.random() < 0.75
        total = dict(res)
        if spec["ippr"] is not None and not pending and rng.random() < 0.25:
            total["CPU"] = res["CPU"] * 2
            total["memory"] = res["memory"] * 2
        avail = {k: (0 if busy and k in ("CPU", "GPU") else v) for k, v in total.items()}
        if busy and rng.random() < 0.4:
            avail["CPU"] = total["CPU"] / 4
        pod: dict[str, Any] = {
            "name": f"c-{g}-{i:05d}",
            "group": g,
            "phase": "pending" if pending else "running",
            "raylet_id": None if pending else f"{i:056x}",
            "total": total,
            "available": avail,
            "idle_s": 0 if busy else rng.choice([5, 30, 120, 600]),
            "resize": None,
        }
        pod_list.append(pod)
    shapes = [
        ({"CPU": 0.5}, {}),
        ({"CPU": 1}, {}),
        ({"CPU": 1, "memory": 4 * GIB}, {}),
        ({"CPU": 2}, {}),
        ({"CPU": 2, "memory": 8 * GIB}, {}),
        ({"CPU": 4}, {}),
        ({"CPU": 4, "memory": 16 * GIB}, {}),
        ({"CPU": 6}, {}),
        ({"CPU": 8}, {}),
        ({"CPU": 8, "memory": 32 * GIB}, {}),
        ({"CPU": 12}, {}),
        ({"CPU": 16}, {}),
        ({"CPU": 4}, {"zone": "b"}),
        ({"CPU": 2, "memory": 64 * GIB}, {}),
        ({"CPU": 8, "memory": 128 * GIB}, {}),
        ({"CPU": 1, "GPU": 1}, {}),
        ({"CPU": 4, "memory": 16 * GIB, "GPU": 1}, {"accel": "a10"}),
        ({"CPU": 8, "GPU": 2}, {}),
    ]
    weights = [20, 30, 10, 15, 6, 6, 3, 2, 2, 1, 1, 1, 3, 1, 0.5, 2, 1, 0.5]
    demands = _demands(rng, units, shapes, weights)
    gangs = [
        {"bundles": [{"CPU": 4}] * 4, "strategy": "PACK", "count": max(1, pods // 100)},
        {"bundles": [{"CPU": 8}] * 4, "strategy": "STRICT_PACK", "count": max(1, pods // 200)},
        {"bundles": [{"CPU": 2}] * 3, "strategy": "STRICT_SPREAD", "count": max(1, pods // 200)},
        {
            "bundles": [{"CPU": 4, "GPU": 1}] * 2,
            "strategy": "STRICT_SPREAD",
            "count": max(1, pods // 200),
        },
    ]
    constraints = [{"shape": {"CPU": 4}, "count": pods // 4}] if pods >= 4 else []
    return {
        "version": 1,
        "name": f"wide-{pods}-{units}",
        "max_workers": pods * 2,
        "idle_timeout_s": 60,
        "groups": groups,
        "pods": pod_list,
        "demands": demands,
        "gangs": gangs,
        "constraints": constraints,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="plans per size (median shown)")
    parser.add_argument("--out", type=Path, default=Path("bench/scenarios"), help="write here")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for pods, units in SIZES:
        doc = generate(pods, units)
        (args.out / f"bench-{pods}-{units}.json").write_text(json.dumps(doc))
        samples = []
        result = None
        for _ in range(args.repeat):
            snap = load_scenario(doc)
            t0 = time.perf_counter()
            result = plan(snap)
            samples.append(time.perf_counter() - t0)
        assert result is not None
        out = plan_to_json(result)
        median = statistics.median(samples)
        verdict = "ok" if median < TARGETS[pods] else "SLOW"
        print(
            f"pods={pods} demand_units={units} plan_seconds={median:.4f} "
            f"target<{TARGETS[pods]}s {verdict} launch={sum(out['launch'].values())} "
            f"resize={len(out['resize'])} terminate={len(out['terminate'])} "
            f"unplaced={out['infeasible']}"
        )


if __name__ == "__main__":
    main()
