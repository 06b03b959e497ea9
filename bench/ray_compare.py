"""Our planner against Ray 2.60's autoscaler v2 scheduler (with IPPR), on the same scenarios.

    python -m bench.ray_compare                          # 10 seeds at 200 pods, 2 at 2,000
    python -m bench.ray_compare --sizes 200x10           # only the 200-pod seeds (~3 min)
    python -m bench.ray_compare --sizes 200x3,5000x1 --ray-timeout 1800
    python -m bench.ray_compare --scenario bench/examples/small.json --repeat 5
    python -m bench.ray_compare --shape wide --sizes 200x5  # six groups, fixed and growable

Generated scenarios are `bench.plan_bench.generate(pods, 10 × pods, seed)` for seeds
1, 2, … (`PODSxSEEDS`); with `--shape wide`, `bench.plan_bench.generate_wide`: small and
medium groups that grow in place beside a fixed-size 32-CPU group, a highmem group and
two GPU groups (issue #29). For each scenario it prints one line per planner (median wall time
per plan, demand units, gangs and `request_resources` bundles placed and left, pods
launched, resizes, terminations), then one line of figures and a verdict; at the end a
Markdown table of every scenario (the one in the README).

Figures, the same for both planners:

- *placed*: demand units, placement groups and requested bundles placed;
- *new pods*: pods launched;
- *resized*: pods grown in place;
- *added CPU / memory*: each launched pod at the size the plan fills it to (its group's
  size, or more where the plan puts more on it: both planners count a new pod of an IPPR
  group at its maximum while placing, and it is grown once it runs), plus each grow over
  the pod's size before it. A resize already in flight counts at its target capped by the
  kubelet's suggestion (Ray queues a follow-up resize to that size; raysize's saga asks
  again at it), so neither planner is charged for it. Shrinks are not subtracted.

Verdict: placed ≥ Ray (all three), new pods ≤ Ray, added CPU and memory ≤ Ray, and at
least 100× faster. When ours places more than Ray and so needs more pods or capacity,
the same figures are taken again for only the demand Ray placed, and the verdict says so.

Ray's `ResourceDemandScheduler.schedule()` runs in a child process (`bench.ray_scheduler`,
which explains the translation): Ray's protobuf modules and raysize's
`activities.ray_proto` both define `ray.rpc` and cannot share a process, and a child can
be stopped when it exceeds `--ray-timeout`. Only `schedule()` is timed on Ray's side and
only `plan()` on ours; parsing and translation are not. Ray's outcome is cached on disk
by the hash of the scenario, Ray's version and `bench/ray_scheduler.py`
(`~/.cache/raysize/ray_compare/`, `RAYSIZE_RAY_COMPARE_CACHE` to move it,
`--no-cache` to ignore it): a 2,000-pod schedule takes Ray 10 minutes or more.

Scenario features Ray's scheduler cannot be given are removed for *both* planners, and
the output says which (`dropped for both: ...`).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
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

from bench.procs import stop_on_sigterm
from raysize.worker.scenario import load_scenario
from raysize.workflows.model import ClusterSnapshot, Plan, PodView
from raysize.workflows.planner import NEW_POD, Trace, WorkKind, plan, plan_with_trace
from raysize.workflows.resources import CPU, GIB, units_to_float

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = ((200, 10), (2_000, 2))  # (pods, seeds)
UNITS_PER_POD = 10
SPEED_TARGET = 100.0


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
    # each launched pod's group and the CPU (cores) and memory (bytes) the plan puts on it
    # (tasks, actors and placement-group bundles)
    new_pod_use: list[tuple[str, float, int]] = field(default_factory=list)

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
        raw["new_pod_use"] = [tuple(u) for u in raw.get("new_pod_use", [])]
        return cls(**raw)


def scenario_totals(snap: ClusterSnapshot) -> tuple[int, int, int]:
    """Demand units, placement groups, `request_resources` bundles."""
    return (
        sum(d.count for d in snap.demands),
        sum(g.count for g in snap.gangs),
        sum(c.count for c in snap.constraints),
    )


@dataclass(frozen=True)
class Added:
    """What a plan adds to the cluster (the counting rule in the module docstring)."""

    new_pods: int
    resized: int  # pods grown in place
    cpu: float  # cores
    memory: int  # bytes


def size_before(p: PodView) -> tuple[float, int]:
    """The size a pod is counted at before the plan: a resize in flight at its target,
    capped by the kubelet's suggestion (never below the pod's size now)."""
    cpu, memory = p.total.cpu, p.total.memory
    r = p.resize
    if r is not None and r.state.in_flight:
        cpu, memory = r.cpu, r.memory
        if p.suggested_max_cpu is not None:
            cpu = min(cpu, max(p.suggested_max_cpu, p.total.cpu))
        if p.suggested_max_memory is not None:
            memory = min(memory, max(p.suggested_max_memory, p.total.memory))
    return units_to_float(cpu, CPU), memory


def added(snap: ClusterSnapshot, o: Outcome) -> Added:
    before = {p.name: size_before(p) for p in snap.pods}
    cpu = 0.0
    memory = 0
    used: dict[str, list[tuple[float, int]]] = {}
    for group, used_cpu, used_memory in o.new_pod_use:
        used.setdefault(group, []).append((used_cpu, used_memory))
    for group, n in o.launched.items():
        size = snap.groups[group].resources
        size_cpu = units_to_float(size.cpu, CPU)
        filled = used.get(group, [])[:n]
        filled += [(0.0, 0)] * (n - len(filled))  # launched for nothing placed (min_workers)
        for used_cpu, used_memory in filled:
            cpu += max(size_cpu, used_cpu)
            memory += max(size.memory, used_memory)
    resized = 0
    for r in o.resizes:
        was_cpu, was_memory = before.get(r.pod, (r.from_cpu, r.from_memory))
        more_cpu, more_memory = r.cpu - was_cpu, r.memory - was_memory
        if more_cpu > 0 or more_memory > 0:
            resized += 1
            cpu += max(0.0, more_cpu)
            memory += max(0, more_memory)
    return Added(new_pods=o.pods_launched, resized=resized, cpu=round(cpu, 3), memory=memory)


def new_pod_use(trace: Trace) -> list[tuple[str, float, int]]:
    """What our plan puts on each pod it launches (tasks, actors, bundles)."""
    use: dict[str, tuple[str, float, int]] = {}
    for p in trace.placements:
        if p.where != NEW_POD or p.kind == WorkKind.CONSTRAINT:
            continue
        group, cpu, memory = use.get(p.pod, (p.group, 0.0, 0))
        use[p.pod] = (
            group,
            cpu + units_to_float(p.shape.cpu, CPU) * p.count,
            memory + p.shape.memory * p.count,
        )
    return [use[k] for k in sorted(use)]


def our_outcome(
    snap: ClusterSnapshot, result: Plan, seconds: list[float], trace: Trace | None = None
) -> Outcome:
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
        new_pod_use=new_pod_use(trace) if trace is not None else [],
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
    traced, trace = plan_with_trace(snap)  # the same decision, and where it puts each unit
    assert traced == result
    return our_outcome(snap, result, samples, trace)


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
    over = over_maximum(doc)
    if over:
        dropped.append(
            f"{len(over)} pod(s) above their group's max_workers, which both remove (Ray "
            "also schedules work onto the pods it removes for that)"
        )
        doc["pods"] = [p for p in doc["pods"] if p["name"] not in over]
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


def over_maximum(doc: dict[str, Any]) -> set[str]:
    """The pods both planners remove because their group has more than `max_workers`:
    pending first, then the longest idle, by name; never a busy pod (the planner's rule,
    and the ones Ray picks on the generated scenarios)."""
    out: set[str] = set()
    for name, group in (doc.get("groups") or {}).items():
        cap = group.get("max_workers")
        if cap is None or name == "headgroup":
            continue
        pods = [p for p in doc.get("pods", []) if p.get("group") == name]
        removable = sorted(
            (p for p in pods if p.get("phase") == "pending" or p.get("idle_s", 0) > 0),
            key=lambda p: (p.get("phase") != "pending", -p.get("idle_s", 0), p["name"]),
        )
        out.update(p["name"] for p in removable[: max(0, len(pods) - cap)])
    return out


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


# --- Ray's outcomes, cached on disk -------------------------------------------------------


class RayCache:
    """Ray's outcome per scenario, keyed by the scenario, Ray's version and the translation
    (`bench/ray_scheduler.py`); a stopped (timed-out) schedule is not kept."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @staticmethod
    def default_root() -> Path:
        env = os.environ.get("RAYSIZE_RAY_COMPARE_CACHE")
        return Path(env) if env else Path.home() / ".cache" / "raysize" / "ray_compare"

    @staticmethod
    def key(doc: dict[str, Any], ray_repeat: int) -> str:
        try:
            ray_version = importlib.metadata.version("ray")
        except importlib.metadata.PackageNotFoundError:
            ray_version = "none"
        translation = (ROOT / "bench" / "ray_scheduler.py").read_bytes()
        blob = json.dumps(
            {
                "doc": doc,
                "ray": ray_version,
                "ray_repeat": ray_repeat,
                "translation": hashlib.sha256(translation).hexdigest(),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> Outcome | None:
        if self.root is None:
            return None
        path = self.root / f"{key}.json"
        try:
            return Outcome.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None  # absent, or written by another version: schedule again

    def put(self, key: str, outcome: Outcome) -> None:
        if self.root is None or outcome.seconds is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{key}.json.tmp"
        tmp.write_text(json.dumps(outcome.to_json()))
        tmp.replace(self.root / f"{key}.json")


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
    cache: RayCache | None = None,
) -> tuple[Outcome, Outcome, list[str]]:
    doc, dropped = comparable(doc)
    ours = run_ours(doc, repeat)
    cache = cache or RayCache(None)
    key = RayCache.key(doc, ray_repeat)
    theirs = cache.get(key)
    if theirs is None:
        theirs = ray.run(doc, ray_repeat, ray_timeout_s)
        cache.put(key, theirs)
    return ours, theirs, dropped


@dataclass(frozen=True)
class Row:
    """One scenario's figures for both planners, and whether ours met every target."""

    name: str
    pods: int
    seed: int | None
    ours: Outcome
    ray: Outcome
    ours_added: Added
    ray_added: Added
    # ours on only the demand Ray placed (None: ours placed no more than Ray)
    ours_on_rays: Added | None = None
    cached: bool = False

    @property
    def speed(self) -> float | None:
        if self.ray.median is None or self.ours.median is None:
            return None
        return self.ray.median / self.ours.median if self.ours.median > 0 else float("inf")

    @property
    def placed_ok(self) -> bool:
        o, r = self.ours, self.ray
        return (
            o.demand_placed >= r.demand_placed
            and o.gangs_placed >= r.gangs_placed
            and o.constraint_placed >= r.constraint_placed
        )

    @staticmethod
    def _no_more(ours: Added, ray: Added) -> list[str]:
        missed = []
        if ours.new_pods > ray.new_pods:
            missed.append("new pods")
        if ours.cpu > ray.cpu + 1e-9 or ours.memory > ray.memory:
            missed.append("added capacity")
        return missed

    def missed(self) -> list[str]:
        """The targets ours did not meet (empty: all met)."""
        if self.ray.seconds is None:
            return ["Ray stopped: not compared"]
        out = [] if self.placed_ok else ["placed"]
        more = self._no_more(self.ours_added, self.ray_added)
        if (
            more
            and self.ours_on_rays is not None
            and not self._no_more(self.ours_on_rays, self.ray_added)
        ):
            more = []  # the extra serves demand Ray left waiting
        out += more
        speed = self.speed
        if speed is None or speed < SPEED_TARGET:
            out.append(f"speed ≥ {SPEED_TARGET:g}×")
        return out

    def verdict(self) -> str:
        missed = self.missed()
        if missed:
            return "NOT met: " + ", ".join(missed)
        if self.ours_on_rays is not None and self._no_more(self.ours_added, self.ray_added):
            return "met (more placed; on what Ray placed: no more pods or capacity)"
        return "met"


def _placed(o: Outcome) -> str:
    return f"{o.demand_placed}/{o.gangs_placed}/{o.constraint_placed}"


def _gib(n: int) -> str:
    return f"{n / GIB:,.0f}"


def row_line(row: Row) -> str:
    o, r, oa, ra = row.ours, row.ray, row.ours_added, row.ray_added
    speed = row.speed
    ratio = f"{speed:,.0f}×" if speed is not None else "n/a"
    return (
        f"{row.name:<22} placed {_placed(o)} vs {_placed(r)} | new pods {oa.new_pods} vs "
        f"{ra.new_pods} | resized {oa.resized} vs {ra.resized} | added CPU {oa.cpu:g} vs "
        f"{ra.cpu:g} | added memory {_gib(oa.memory)} vs {_gib(ra.memory)} GiB | {ratio} | "
        f"{row.verdict()}"
    )


TABLE_HEAD = (
    "| pods | seed | placed (units/gangs/requested) ours · Ray | new pods ours · Ray | "
    "resized ours · Ray | added CPU ours · Ray | added memory GiB ours · Ray | "
    "plan time ours · Ray | speed | verdict |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def table_row(row: Row) -> str:
    o, r, oa, ra = row.ours, row.ray, row.ours_added, row.ray_added
    speed = row.speed
    ours_t = f"{o.median:.3f} s" if o.median is not None else "n/a"
    ray_t = f"{r.median:.1f} s" if r.median is not None else f"> {r.timeout_s:g} s"
    on = row.ours_on_rays
    # ours for only the demand Ray placed, in brackets (when ours placed more)
    pods, cpu, memory = (
        (f" ({on.new_pods})", f" ({on.cpu:g})", f" ({_gib(on.memory)})") if on else ("", "", "")
    )
    return (
        f"| {row.pods:,} | {row.seed if row.seed is not None else row.name} | "
        f"{_placed(o)} · {_placed(r)} | {oa.new_pods}{pods} · {ra.new_pods} | "
        f"{oa.resized} · {ra.resized} | {oa.cpu:g}{cpu} · {ra.cpu:g} | "
        f"{_gib(oa.memory)}{memory} · {_gib(ra.memory)} | {ours_t} · {ray_t} | "
        f"{f'{speed:,.0f}×' if speed is not None else 'n/a'} | {row.verdict()} |"
    )


def compare_row(
    name: str,
    doc: dict[str, Any],
    ray: RayScheduler,
    *,
    pods: int,
    seed: int | None,
    repeat: int,
    ray_repeat: int,
    ray_timeout_s: float,
    cache: RayCache,
) -> tuple[Row, list[str]]:
    cached = cache.get(RayCache.key(comparable(doc)[0], ray_repeat)) is not None
    ours, theirs, dropped = compare(
        doc, ray, repeat=repeat, ray_repeat=ray_repeat, ray_timeout_s=ray_timeout_s, cache=cache
    )
    doc = comparable(doc)[0]
    snap = load_scenario(doc)
    on_rays = None
    if ours.demand_placed > theirs.demand_placed:
        rest = only_what_ray_placed(doc, theirs)
        if rest is not None:
            on_rays = added(load_scenario(rest), run_ours(rest, 1))
    row = Row(
        name=name,
        pods=pods,
        seed=seed,
        ours=ours,
        ray=theirs,
        ours_added=added(snap, ours),
        ray_added=added(snap, theirs),
        ours_on_rays=on_rays,
        cached=cached,
    )
    return row, dropped


def runs(text: str) -> list[tuple[int, int]]:
    """`200x10,2000x2` → [(200, 10), (2000, 2)]: pods and seeds; `200` is one seed."""
    out = []
    for part in text.replace("_", "").split(","):
        part = part.strip()
        if not part:
            continue
        pods, _, seeds = part.partition("x")
        try:
            out.append((int(pods), int(seeds) if seeds else 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--sizes: {part!r} is not PODS or PODSxSEEDS (e.g. 200x10,2000x2)"
            ) from None
        if out[-1][0] < 1 or out[-1][1] < 1:
            raise argparse.ArgumentTypeError(f"--sizes: {part!r}: pods and seeds must be ≥ 1")
    return out


def shape_name(text: str) -> str:
    """`--shape`: one of `bench.plan_bench.SHAPES`."""
    from bench.plan_bench import SHAPES

    if text not in SHAPES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a generated shape; use one of {', '.join(SHAPES)} (default: default)"
        )
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=runs,
        default=None,
        help="generated scenarios as PODSxSEEDS, comma-separated (default 200x10,2000x2 "
        "unless --scenario is given); seeds are 1, 2, …; 10 demand units per pod",
    )
    parser.add_argument(
        "--shape",
        type=shape_name,
        default="default",
        help="the generated scenarios' shape: 'default' (small and medium groups that grow "
        "in place, one GPU group: bench.plan_bench.generate, the README's table) or 'wide' "
        "(six groups: small and medium growable CPU groups beside a fixed-size 32-CPU "
        "group, a fixed highmem group, a 1-GPU and a 4-GPU group; tasks of 0.5-16 CPU, "
        "highmem and GPU work, placement groups up to 32 CPU: "
        "bench.plan_bench.generate_wide). Deterministic by seed",
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
        default=1800.0,
        help="stop Ray's scheduler after this many seconds per schedule",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="schedule with Ray again, ignoring the cache"
    )
    args = parser.parse_args(argv)
    if args.shape != "default" and args.scenario and args.sizes is None:
        parser.error(
            f"--shape {args.shape} shapes generated scenarios: give --sizes too "
            "(e.g. --sizes 200x5), or leave --shape out with --scenario"
        )
    stop_on_sigterm()
    sizes = args.sizes if args.sizes is not None else ([] if args.scenario else DEFAULT_RUNS)
    cache = RayCache(None if args.no_cache else RayCache.default_root())

    from bench.plan_bench import generate_shape

    prefix = "bench" if args.shape == "default" else args.shape
    jobs: list[tuple[str, int, int | None, dict[str, Any]]] = []
    for pods, seeds in sizes:
        for seed in range(1, seeds + 1):
            doc = generate_shape(args.shape, pods, pods * UNITS_PER_POD, seed)
            jobs.append((f"{prefix}-{pods}-s{seed}", pods, seed, doc))
    for path in args.scenario:
        doc = json.loads(path.read_text())
        pods = sum(1 for p in doc.get("pods", []) if p.get("group") != "headgroup")
        jobs.append((str(doc.get("name") or path.stem), pods, None, doc))

    rows: list[Row] = []
    with RayScheduler() as ray:
        for name, pods, job_seed, doc in jobs:
            row, dropped = compare_row(
                name,
                doc,
                ray,
                pods=pods,
                seed=job_seed,
                repeat=args.repeat,
                ray_repeat=args.ray_repeat,
                ray_timeout_s=args.ray_timeout,
                cache=cache,
            )
            rows.append(row)
            if dropped:
                print(f"{name:<22} dropped for both: {'; '.join(dropped)}")
            note = " (Ray's outcome from the cache)" if row.cached else ""
            print(describe(name, row.ray) + note, flush=True)
            print(describe(name, row.ours))
            print(row_line(row), flush=True)
    print()
    if args.shape != "default" and sizes:
        print(f"generated shape: {args.shape}\n")
    print(TABLE_HEAD)
    for row in rows:
        print(table_row(row))
    met = sum(1 for row in rows if not row.missed())
    print(f"\ntargets met on {met} of {len(rows)} scenario(s)")


if __name__ == "__main__":
    main()
