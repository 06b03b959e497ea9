"""Our planner against Ray 2.60's autoscaler v2 scheduler (with IPPR), on the same scenarios.

    python -m bench.ray_compare                          # generated 200 and 2,000 pods
    python -m bench.ray_compare --sizes 200,2000,5000 --ray-timeout 600
    python -m bench.ray_compare --scenario bench/scenarios/x.json --repeat 5

For each scenario it prints one line per planner: median wall time per plan, demand
units placed and left, gangs (placement groups) placed and left, `request_resources`
bundles given capacity, pods launched, in-place resizes and terminations; then a verdict:
how much faster ours is, whether ours placed at least as much and launched no more pods.

Ray's `ResourceDemandScheduler.schedule()` runs in a child process (`bench.ray_scheduler`,
which explains the translation): Ray's protobuf modules and raysize's
`activities.ray_proto` both define `ray.rpc` and cannot share a process, and a child can
be stopped when it exceeds `--ray-timeout`. Only `schedule()` is timed on Ray's side and
only `plan()` on ours; parsing and translation are not. Sizes are pods; each gets
10 demand units per pod, as in `bench.plan_bench`.

Scenario features Ray's scheduler cannot be given are removed for *both* planners, and
the output says which (`dropped for both: ...`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workflows.model import ClusterSnapshot, Plan
from workflows.planner import plan
from workflows.resources import CPU, units_to_float
from workflows.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = (200, 2_000)
UNITS_PER_POD = 10


# --- what a planner did, in the same terms for both -------------------------------------


@dataclass(frozen=True)
class Resize:
    pod: str
    cpu: float  # cores
    memory: int  # bytes
    from_cpu: float
    from_memory: int
    # False: Ray's IPPR provider queued it before scheduling (a Kubelet suggestion or a
    # rollback), not a placement
    for_demand: bool = True

    @property
    def grows(self) -> bool:
        return self.cpu > self.from_cpu or self.memory > self.from_memory


@dataclass(frozen=True)
class Outcome:
    planner: str
    seconds: list[float] | None  # None: stopped after `timeout_s`
    demand_units: int
    demand_left: int
    gangs: int
    gangs_left: int
    constraint_units: int
    constraint_left: int
    launched: dict[str, int] = field(default_factory=dict)
    resizes: list[Resize] = field(default_factory=list)
    terminated: dict[str, str] = field(default_factory=dict)  # pod → reason
    timeout_s: float | None = None
    # units left of each entry of the scenario's `demands`, in order (None: not known)
    demand_left_by_entry: list[int] | None = None

    @property
    def demand_placed(self) -> int:
        return self.demand_units - self.demand_left

    @property
    def gangs_placed(self) -> int:
        return self.gangs - self.gangs_left

    @property
    def constraint_placed(self) -> int:
        return self.constraint_units - self.constraint_left

    @property
    def pods_launched(self) -> int:
        return sum(self.launched.values())

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Outcome:
        raw = dict(raw)
        raw["resizes"] = [Resize(**r) for r in raw.get("resizes", [])]
        return cls(**raw)


def scenario_totals(snap: ClusterSnapshot) -> tuple[int, int, int]:
    """Demand units, placement groups, `request_resources` bundles."""
    return (
        sum(d.count for d in snap.demands),
        sum(g.count for g in snap.gangs),
        sum(c.count for c in snap.constraints),
    )


def our_outcome(snap: ClusterSnapshot, result: Plan, seconds: list[float]) -> Outcome:
    demand_units, gangs, constraint_units = scenario_totals(snap)
    return Outcome(
        planner="ours",
        seconds=seconds,
        demand_units=demand_units,
        demand_left=result.infeasible.demands,
        gangs=gangs,
        gangs_left=result.infeasible.gangs,
        constraint_units=constraint_units,
        constraint_left=result.infeasible.constraints,
        launched=dict(sorted(result.launch_by_group.items())),
        resizes=[
            Resize(
                pod=r.pod,
                cpu=units_to_float(r.cpu, CPU),
                memory=r.memory,
                from_cpu=units_to_float(r.from_cpu, CPU),
                from_memory=r.from_memory,
            )
            for r in result.resize
        ],
        terminated={t.pod: t.reason for t in result.terminate},
    )


def run_ours(doc: dict[str, Any], repeat: int) -> Outcome:
    samples = []
    result = None
    snap = load_scenario(doc)
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        result = plan(snap)
        samples.append(time.perf_counter() - t0)
    assert result is not None
    return our_outcome(snap, result, samples)


# --- what Ray cannot be given ----------------------------------------------------------


def comparable(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The scenario both planners get: without what Ray's scheduler cannot express."""
    doc = copy.deepcopy(doc)
    dropped: list[str] = []
    settings = doc.get("settings") or {}
    if settings.get("upscaling_mode", "Default") != "Default":
        dropped.append(
            f"settings.upscaling_mode={settings['upscaling_mode']} "
            "(Ray's v2 scheduler has no upscaling rate limit)"
        )
        del settings["upscaling_mode"]
    pending_labels = [
        p["name"] for p in doc.get("pods", []) if p.get("phase") == "pending" and p.get("labels")
    ]
    if pending_labels:
        dropped.append(
            f"labels of {len(pending_labels)} pending pod(s) (Ray gives a pod with no Raylet "
            "its group's labels)"
        )
        for p in doc["pods"]:
            if p["name"] in pending_labels:
                p["labels"] = {}
    no_raylet = [
        p
        for p in doc.get("pods", [])
        if p.get("phase", "running") == "running" and not p.get("raylet_id")
    ]
    if no_raylet:
        dropped.append(
            f"missing raylet_id of {len(no_raylet)} running pod(s) (given one: a running "
            "Ray node always has an id)"
        )
        for i, p in enumerate(no_raylet):
            p["raylet_id"] = f"{0xFFFF0000 + i:056x}"
    return doc, dropped


# --- Ray's scheduler, in a child process -----------------------------------------------


class RayScheduler:
    """A child process that runs Ray's scheduler; restarted after a timeout."""

    def __init__(self, ready_timeout_s: float = 120.0) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.ray_scheduler"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(proc, self.lines), daemon=True).start()
        self.proc = proc
        self._expect("ready", self.ready_timeout_s)
        return proc

    @staticmethod
    def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _expect(self, key: str, timeout_s: float) -> Any:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(key) from None
        if line is None:
            code = self.proc.wait() if self.proc else None
            raise RuntimeError(f"Ray's scheduler process exited ({code}) before {key!r}")
        message = json.loads(line)
        if key not in message:
            raise RuntimeError(f"expected {key!r} from Ray's scheduler process, got {line!r}")
        return message[key]

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def run(self, doc: dict[str, Any], repeat: int, timeout_s: float) -> Outcome:
        """Schedule `repeat` times; each schedule may take up to `timeout_s`."""
        proc = self.proc or self._start()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"doc": doc, "repeat": repeat}) + "\n")
        proc.stdin.flush()
        seconds = []
        try:
            for _ in range(max(1, repeat)):
                seconds.append(float(self._expect("seconds", timeout_s)))
            return Outcome.from_json(self._expect("outcome", max(60.0, timeout_s)))
        except TimeoutError:
            proc.kill()
            proc.wait()
            self.proc = None
            snap = load_scenario(doc)
            demand_units, gangs, constraint_units = scenario_totals(snap)
            return Outcome(
                planner="ray",
                seconds=None,
                demand_units=demand_units,
                demand_left=0,
                gangs=gangs,
                gangs_left=0,
                constraint_units=constraint_units,
                constraint_left=0,
                timeout_s=timeout_s,
            )

    def __enter__(self) -> RayScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- report ------------------------------------------------------------------------------


def _time_text(o: Outcome) -> str:
    if o.seconds is None:
        return f"> {o.timeout_s:g} s (stopped)"
    runs = len(o.seconds)
    return f"{o.median:.4f} s (median of {runs})" if runs > 1 else f"{o.median:.4f} s (1 run)"


def describe(name: str, o: Outcome) -> str:
    head = f"{name:<22} {o.planner:<4} plan {_time_text(o):<26}"
    if o.seconds is None:
        return head + " no result"
    grown = sum(1 for r in o.resizes if r.for_demand and r.grows)
    shrunk = sum(1 for r in o.resizes if r.for_demand and not r.grows)
    other = sum(1 for r in o.resizes if not r.for_demand)
    resizes = f"resized {grown} up"
    if shrunk:
        resizes += f" + {shrunk} down"
    if other:
        resizes += f" (+{other} queued by the IPPR provider)"
    return (
        f"{head} demands placed {o.demand_placed}/{o.demand_units} left {o.demand_left}"
        f" | gangs placed {o.gangs_placed}/{o.gangs} left {o.gangs_left}"
        f" | constraints {o.constraint_placed}/{o.constraint_units}"
        f" | launched {o.pods_launched} {o.launched or ''}".rstrip()
        + f" | {resizes} | terminated {len(o.terminated)}"
    )


def only_what_ray_placed(doc: dict[str, Any], ray: Outcome) -> dict[str, Any] | None:
    """The scenario without the demand units Ray left unplaced (None: not known)."""
    left = ray.demand_left_by_entry
    if left is None or len(left) != len(doc.get("demands", [])):
        return None
    doc = copy.deepcopy(doc)
    for entry, n in zip(doc["demands"], left, strict=True):
        entry["count"] -= n
    doc["demands"] = [d for d in doc["demands"] if d["count"] > 0]
    return doc


def verdict(name: str, ours: Outcome, ray: Outcome, ours_on_rays: Outcome | None = None) -> str:
    """Faster, placed at least as much, launched no more pods. When ours placed more
    demand than Ray, the pod count is also compared on what Ray placed (`ours_on_rays`):
    extra pods that serve demand Ray left waiting are not waste."""
    assert ours.median is not None
    if ray.seconds is None or ray.median is None:
        assert ray.timeout_s is not None
        return (
            f"{name:<22} verdict: ours > {ray.timeout_s / ours.median:,.0f}x faster "
            "(Ray stopped); placement not compared"
        )
    speed = ray.median / ours.median if ours.median > 0 else float("inf")
    placed = (
        ours.demand_placed >= ray.demand_placed
        and ours.gangs_placed >= ray.gangs_placed
        and ours.constraint_placed >= ray.constraint_placed
    )
    launched = f"{ours.pods_launched} vs {ray.pods_launched}"
    fewer = ours.pods_launched <= ray.pods_launched
    if not fewer and ours_on_rays is not None:
        fewer = ours_on_rays.pods_launched <= ray.pods_launched
        launched += (
            f"; ours places {ours.demand_placed - ray.demand_placed} more demand units, "
            f"and for only the demand Ray placed launches {ours_on_rays.pods_launched}"
        )
    return (
        f"{name:<22} verdict: ours {speed:,.1f}x faster; placed at least as much: "
        f"{'yes' if placed else 'NO'} (demands {ours.demand_placed} vs {ray.demand_placed}, "
        f"gangs {ours.gangs_placed} vs {ray.gangs_placed}, constraints "
        f"{ours.constraint_placed} vs {ray.constraint_placed}); launched no more pods: "
        f"{'yes' if fewer else 'NO'} ({launched})"
    )


def compare(
    doc: dict[str, Any],
    ray: RayScheduler,
    *,
    repeat: int,
    ray_repeat: int,
    ray_timeout_s: float,
) -> tuple[Outcome, Outcome, list[str]]:
    doc, dropped = comparable(doc)
    ours = run_ours(doc, repeat)
    theirs = ray.run(doc, ray_repeat, ray_timeout_s)
    return ours, theirs, dropped


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.replace("_", "").split(",") if s.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help="generated scenarios, in pods, comma-separated (default 200,2000 unless "
        "--scenario is given); each has 10 demand units per pod",
    )
    parser.add_argument(
        "--scenario", type=Path, nargs="*", default=[], metavar="FILE", help="scenario JSON"
    )
    parser.add_argument("--repeat", type=int, default=5, help="plans per scenario for ours")
    parser.add_argument(
        "--ray-repeat", type=int, default=1, help="schedules per scenario for Ray (slow)"
    )
    parser.add_argument(
        "--ray-timeout",
        type=float,
        default=600.0,
        help="stop Ray's scheduler after this many seconds per schedule",
    )
    args = parser.parse_args(argv)
    sizes = args.sizes if args.sizes is not None else ([] if args.scenario else DEFAULT_SIZES)

    from bench.plan_bench import generate

    jobs: list[tuple[str, dict[str, Any]]] = [
        (f"bench-{n}-{n * UNITS_PER_POD}", generate(n, n * UNITS_PER_POD)) for n in sizes
    ]
    for path in args.scenario:
        doc = json.loads(path.read_text())
        jobs.append((str(doc.get("name") or path.stem), doc))

    with RayScheduler() as ray:
        for name, doc in jobs:
            ours, theirs, dropped = compare(
                doc,
                ray,
                repeat=args.repeat,
                ray_repeat=args.ray_repeat,
                ray_timeout_s=args.ray_timeout,
            )
            if dropped:
                print(f"{name:<22} dropped for both: {'; '.join(dropped)}")
            print(describe(name, theirs), flush=True)
            print(describe(name, ours))
            ours_on_rays = None
            if ours.demand_placed > theirs.demand_placed:
                rays = only_what_ray_placed(comparable(doc)[0], theirs)
                if rays is not None:
                    ours_on_rays = run_ours(rays, args.repeat)
                    print(describe(f"{name} (Ray's placed)", ours_on_rays))
            print(verdict(name, ours, theirs, ours_on_rays), flush=True)


if __name__ == "__main__":
    main()
