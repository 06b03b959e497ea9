"""One sha256 over what the planner decides on many generated scenarios: a refactoring of
`raysize.workflows.planner` that changes no decision leaves it as it was.

    PYTHONPATH=. .venv/bin/python scripts/planner_fingerprint.py [--cases FILE]

For each scenario it records `plan(s)`, `plan(s, just_grown=...)` (some running pods named
as just grown) and `plan_with_trace(s)` (the plan and where each unit goes), serialised as
JSON, and prints the sha256 of them all (and the number of scenarios). `--cases FILE`
writes one digest a scenario, to find the first that differs.

The scenarios:

- `bench.plan_bench.generate(pods, 10 × pods, seed)` at several sizes and seeds, each
  also varied at random: other settings (policy, upscaling mode, caps, timeouts, steps),
  grows landing or stuck (`asked_s`, `raylet_only`), failures on record, kubelet
  suggestions, pending pods Kubernetes has run past the Raylet start timeout (silent),
  GPU and custom-resource bundles, bundle selectors, tasks inside a placement group
  (`CPU_group_<id>`), request_resources with GPUs, and more units than one plan places;
- the hypothesis strategy of tests/workflows/test_planner_properties.py (`scenarios`),
  drawn derandomized (the same draws every run of the same hypothesis version);
- bench/examples/*.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
from enum import Enum
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from bench.plan_bench import generate
from raysize.worker.scenario import load_scenario
from raysize.workflows.model import (
    ClusterSnapshot,
    Constraint,
    Demand,
    Gang,
    GangStrategy,
    GroupSpec,
    IpprLimits,
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
    ResizePolicy,
    UpscalingMode,
)
from raysize.workflows.planner import plan, plan_with_trace
from raysize.workflows.resources import GIB, Resources
from tests.workflows.test_planner_properties import scenarios

ROOT = Path(__file__).resolve().parents[1]
SIZES = [(3, 30), (8, 80), (20, 200), (50, 500), (150, 1500)]
SEEDS_PER_SIZE = {3: 40, 8: 40, 20: 30, 50: 16, 150: 5}
HYPOTHESIS_EXAMPLES = 1500
U = 10_000  # units of one GPU


def jsonable(value: object) -> Any:
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(mode="json"))
    if isinstance(value, Resources):
        return {k: value[k] for k in sorted(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def decisions(snap: ClusterSnapshot, rng: random.Random) -> Any:
    running = sorted(p.name for p in snap.pods if p.phase == PodPhase.RUNNING)
    just_grown = sorted(rng.sample(running, min(len(running), rng.choice([1, 1, 2]))))
    just_grown.append("gone-pod")  # a name the snapshot no longer has
    with_trace = plan_with_trace(snap)
    return {
        "plan": jsonable(plan(snap)),
        "just_grown": just_grown,
        "plan_just_grown": jsonable(plan(snap, just_grown=just_grown)),
        "trace": jsonable(with_trace),
    }


# --- variations of the benchmark's scenarios ---------------------------------------------


def vary_pod(p: PodView, g: GroupSpec, rng: random.Random) -> PodView:
    update: dict[str, Any] = {}
    r = rng.random()
    if p.phase == PodPhase.PENDING and not g.is_head:
        if r < 0.3:
            update["running_s"] = rng.choice([30.0, 599.0, 600.0, 900.0])
        elif r < 0.4:
            update["raylet_id"] = None
    elif p.phase == PodPhase.RUNNING and not g.is_head:
        if p.raylet_id is not None and r < 0.02:
            update["raylet_id"] = None
            update["running_s"] = rng.choice([30.0, 700.0])
        if g.ippr is not None and rng.random() < 0.06:
            up = rng.choice([g.ippr.max_cpu, p.total.cpu + 1000, p.total.cpu])
            update["resize"] = PodResize(
                cpu=up,
                memory=rng.choice([g.ippr.max_memory, p.total.memory]),
                state=rng.choice(list(KubeletResizeState)),
                asked_s=rng.choice([None, 1.0, 10.0, 11.0, 300.0]),
                raylet_only=rng.random() < 0.2,
            )
        if rng.random() < 0.04:
            update["failed"] = True
            update["failed_age_s"] = rng.choice([0.0, 30.0, 3600.0])
        if rng.random() < 0.04:
            update["suggested_max_cpu"] = rng.choice([1500, 2000, 3000])
        if rng.random() < 0.03:
            update["suggested_max_memory"] = rng.choice([3 * GIB, 6 * GIB])
        if rng.random() < 0.05:
            update["labels"] = {"rack": rng.choice(["r1", "r2"])}
    return p.model_copy(update=update) if update else p


def vary(snap: ClusterSnapshot, rng: random.Random) -> ClusterSnapshot:
    groups = dict(snap.groups)
    if rng.random() < 0.4:
        groups["acc"] = GroupSpec(
            name="acc",
            resources=Resources.of(cpu=4000, memory=16 * GIB, acc=4 * U),
            min_workers=rng.choice([0, 0, 1]),
            max_workers=rng.choice([None, 0, 2, 5]),
            labels={"ray.io/node-group": "acc", "zone": "c"},
            ippr=IpprLimits(max_cpu=8000, max_memory=32 * GIB, resize_timeout_s=60)
            if rng.random() < 0.5
            else None,
        )
    if rng.random() < 0.3:
        groups["gpu2"] = GroupSpec(
            name="gpu2",
            resources=Resources.of(cpu=16000, memory=64 * GIB, GPU=2 * U),
            min_workers=0,
            max_workers=rng.choice([0, 1, 3]),
            labels={"ray.io/node-group": "gpu2", "accel": "h100"},
            ippr=IpprLimits(max_cpu=32000, max_memory=128 * GIB, resize_timeout_s=60)
            if rng.random() < 0.5
            else None,
        )
    pods = [vary_pod(p, groups[p.group], rng) for p in snap.pods]
    workers = [i for i, p in enumerate(pods) if not groups[p.group].is_head]
    if workers and rng.random() < 0.3:  # a grow landing
        i = rng.choice(workers)
        g, p = groups[pods[i].group], pods[i]
        if g.ippr is not None and p.phase == PodPhase.RUNNING and g.ippr.max_cpu > p.total.cpu:
            landing = PodResize(
                cpu=g.ippr.max_cpu, memory=p.total.memory, asked_s=rng.choice([None, 2.0])
            )
            if landing.asked_s is None:
                landing = landing.model_copy(update={"raylet_only": True})
            pods[i] = p.model_copy(update={"resize": landing, "failed": False})
    if workers and rng.random() < 0.3:  # a pod Kubernetes runs whose Raylet never came
        i = rng.choice(workers)
        pods[i] = pods[i].model_copy(
            update={"phase": PodPhase.PENDING, "raylet_id": None, "running_s": 1e4}
        )
    demands = list(snap.demands)
    if rng.random() < 0.3:
        pg = f"{rng.getrandbits(128):032x}"
        demands.append(
            Demand(shape=Resources({"CPU": 1000, f"CPU_group_{pg}": 1000}), count=rng.randint(1, 9))
        )
        demands.append(Demand(shape=Resources({f"bundle_group_0_{pg}": 1}), count=2))
    if rng.random() < 0.3:
        demands.append(Demand(shape=Resources.of(cpu=2000, GPU=2 * U), count=rng.randint(1, 4)))
    if rng.random() < 0.2:
        demands.append(Demand(shape=Resources.of(cpu=1000, acc=U), count=rng.randint(1, 6)))
    if rng.random() < 0.1:
        demands.append(Demand(shape=Resources.of(cpu=64000), count=1))  # fits no pod
    if rng.random() < 0.03:
        demands.append(Demand(shape=Resources.of(cpu=250), count=120_000))  # over one plan
    gangs = list(snap.gangs)
    for _ in range(rng.choice([0, 0, 1, 2])):
        n = rng.randint(1, 4)
        bundles = tuple(
            Resources.of(cpu=rng.choice([500, 1000, 2000]))
            + rng.choice([Resources(), Resources(), Resources.of(GPU=U // 2), Resources.of(GPU=U)])
            for _ in range(n)
        )
        selectors: tuple[dict[str, str], ...] = ()
        if rng.random() < 0.3:
            options = [{}, {"zone": "a"}, {"zone": "!b"}, {"ray.io/node-group": "in(small,gpu)"}]
            selectors = tuple(rng.choice(options) for _ in range(n))
        gangs.append(
            Gang(
                bundles=bundles,
                strategy=rng.choice(list(GangStrategy)),
                count=rng.randint(1, 3),
                bundle_selectors=selectors,
            )
        )
    constraints = list(snap.constraints)
    if rng.random() < 0.3:
        constraints.append(
            Constraint(shape=Resources.of(cpu=rng.choice([1000, 4000]), GPU=U), count=2)
        )
    if rng.random() < 0.2:
        constraints.append(Constraint(shape=Resources.of(cpu=8000, memory=8 * GIB), count=3))
    s = snap.settings
    settings_ = PlannerSettings(
        idle_timeout_s=rng.choice([0.0, 30.0, 60.0, 600.0]),
        max_workers=rng.choice([s.max_workers, None, len(pods) // 2, len(pods) + 3]),
        upscaling_mode=rng.choice(list(UpscalingMode)),
        resize_policy=rng.choice(list(ResizePolicy)),
        cpu_step=rng.choice([500, 1000, 2000]),
        memory_step=rng.choice([GIB // 2, GIB, 2 * GIB]),
        raylet_start_timeout_s=rng.choice([600.0, 600.0, 60.0]),
    )
    return snap.model_copy(
        update={
            "groups": groups,
            "pods": tuple(pods),
            "demands": tuple(demands),
            "gangs": tuple(gangs),
            "constraints": tuple(constraints),
            "settings": settings_,
        }
    )


def bench_scenarios() -> list[ClusterSnapshot]:
    out = []
    for pods, units in SIZES:
        for seed in range(1, SEEDS_PER_SIZE[pods] + 1):
            snap = load_scenario(generate(pods, units, seed))
            out.append(snap)
            out.append(vary(snap, random.Random(f"{pods}/{seed}")))
    return out


def hypothesis_scenarios() -> list[ClusterSnapshot]:
    drawn: list[ClusterSnapshot] = []

    @settings(
        derandomize=True,
        max_examples=HYPOTHESIS_EXAMPLES,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(scenarios(), scenarios(caps=False)))
    def draw(snap: ClusterSnapshot) -> None:
        drawn.append(snap)

    draw()
    return drawn


def example_scenarios() -> list[ClusterSnapshot]:
    return [
        load_scenario(json.loads(path.read_text()))
        for path in sorted((ROOT / "bench" / "examples").glob("*.json"))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, help="write one digest a scenario here")
    args = parser.parse_args()
    snaps = [*example_scenarios(), *bench_scenarios(), *hypothesis_scenarios()]
    total = hashlib.sha256()
    lines = []
    for i, snap in enumerate(snaps):
        doc = json.dumps(
            {"snapshot": jsonable(snap), "decisions": decisions(snap, random.Random(i))},
            sort_keys=True,
            ensure_ascii=False,
        ).encode()
        total.update(hashlib.sha256(doc).digest())
        lines.append(f"{i} {hashlib.sha256(doc).hexdigest()}")
    if args.cases:
        args.cases.write_text("\n".join(lines) + "\n")
    print(f"{total.hexdigest()}  ({len(snaps)} scenarios)")


if __name__ == "__main__":
    main()
