"""One RayCluster of 5,000 pods on the real control plane: `python -m bench.scale_bench`.

    python -m bench.scale_bench [--pods 5000] [--quiet-ticks 3] [--grow 10] [--remove 10]

The real control plane (kube-apiserver + etcd + KubeRay, the kubelet simulated: pods run
no processes), one RayCluster whose worker group has `--pods` replicas (KubeRay creates
the pods; the time it took is printed), the GCS stand-in (`sandbox/ray_standin.py`) behind
it with a Raylet per running pod, a real Temporal dev server and a real `raysize worker`
process. Measured (issue #30 item 4, targets on a 2-core machine):

- per tick, from the reconcile workflow's history: the observe (a local activity: the
  workflow task it ran in, started → completed, the pods from the pod watch's cache and
  Ray's state read, the plan made; and how long that task was queued),
  the plan's own wall time (the tick's `plan_s`), the act (observe completed → the
  workflow waits again: its drain, RayCluster write, events and resize sagas started),
  and the history bytes the tick added (each event's protobuf size, as
  `bench.history_bench`): observe + act < 2 s, ≤ 64 KB;
- `--quiet-ticks` quiet ticks (the stand-in's state version bumped, nothing to do) and
  one busy tick: `--grow` tasks of {CPU: 2} that fit no 1-CPU pod (pods to grow) and
  `--remove` pods idle for longer than the cluster's idle timeout (pods to remove);
- the worker's RSS: peak (VmHWM) and steady (after the quiet ticks): < 600 MB; and the
  memory per pod: steady RSS minus that of the same worker watching an empty namespace,
  divided by the pods.

Each figure is printed beside its target, `met` or `MISSED`; exit status 1 if any is
missed. Every process started is stopped by its process group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench.clusters import small_raycluster
from bench.histories import local_activity, local_result, task_of
from bench.history_bench import TARGET_BYTES, _chain, _size
from bench.idle_bench import rss_mib
from bench.procs import (
    ONE_PARTITION,
    start_dev_server,
    start_raysize_worker,
    stop_on_sigterm,
    until,
)
from raysize.sandbox.cluster import SandboxConfig
from raysize.sandbox.errors import ApiError
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.localray import stop_group
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.realworld import RealControlPlane, RealSandbox
from raysize.workflows.contracts import Act
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow

GIB = 1024**3
NS = "default"
NAME = "big"
PODS_PER_NODE = 250
# targets (issue #30 item 4)
MAX_TICK_S = 2.0
MAX_RSS_MB = 600.0
MAX_TICK_BYTES = TARGET_BYTES  # 64 KB
_WAITS = (Act.WAIT_FOR_CHANGE,)
_ACTS = (Act.DRAIN, Act.SCALE)


# --- the pure part: arguments and figures ------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=5000, help="worker pods of the RayCluster")
    parser.add_argument("--quiet-ticks", type=int, default=3, help="quiet ticks measured")
    parser.add_argument("--grow", type=int, default=10, help="busy tick: {CPU: 2} tasks")
    parser.add_argument("--remove", type=int, default=10, help="busy tick: idle pods to remove")
    parser.add_argument(
        "--up-timeout", type=float, default=480.0, help="seconds for KubeRay's pods to run"
    )
    parser.add_argument("--log", type=Path, help="keep the raysize worker's log at this path")
    args = parser.parse_args(argv)
    if args.pods < 1:
        parser.error("--pods must be ≥ 1")
    if args.quiet_ticks < 1:
        parser.error("--quiet-ticks must be ≥ 1")
    if args.grow < 0 or args.remove < 0 or args.grow + args.remove < 1:
        parser.error("--grow and --remove must be ≥ 0, and one of them ≥ 1 (a busy tick)")
    if args.grow + args.remove > args.pods:
        parser.error(f"--grow + --remove ({args.grow + args.remove}) is over --pods")
    return args


@dataclass
class TickFigures:
    """One tick of the reconcile loop, from its history (seconds, bytes)."""

    observe_s: float  # the workflow task that observed: started → completed (read + plan)
    queued_s: float  # that task scheduled → started: before the worker ran it
    plan_s: float  # the plan's own wall time, inside the observe
    act_s: float  # that task completed → the loop waits again (or the next observe)
    bytes: int  # every event from the observing task's scheduling to the next's
    resizes: int = 0  # the plan's
    terminates: int = 0
    launches: int = 0
    # activity → scheduled → completed (an Event is a local activity: inside the act)
    acts: dict[str, float] = field(default_factory=dict)
    sagas: int = 0  # resize child workflows started

    @property
    def tick_s(self) -> float:
        return self.observe_s + self.act_s

    @property
    def busy(self) -> bool:
        """The tick planned or did something (a quiet one only observes)."""
        return bool(self.resizes or self.terminates or self.launches or self.acts or self.sagas)


def _at(e: HistoryEvent) -> float:
    return float(e.event_time.ToMicroseconds()) / 1e6


def _activity(e: HistoryEvent) -> str:
    if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return ""
    return str(e.activity_task_scheduled_event_attributes.activity_type.name)


def _plan_of(tick: Any) -> tuple[float, int, int, int]:
    """(plan_s, resizes, terminates, launches) of an observe's Tick result."""
    if not isinstance(tick, dict):
        return 0.0, 0, 0, 0
    plan = tick.get("plan") or {}
    launches = sum(int(a.get("count", 1)) for a in plan.get("launch") or ())
    return (
        float(tick.get("plan_s", 0.0)),
        len(plan.get("resize") or ()),
        len(plan.get("terminate") or ()),
        launches,
    )


def tick_figures(events: Sequence[HistoryEvent]) -> list[TickFigures]:
    """The figures of every whole tick in `events` (a workflow's history, its runs in
    order). The observe is a local activity: a tick runs from the scheduling of the
    workflow task that observed (its marker) to the next such task's, so the last one
    (not over yet) is left out, and so is a failed observe (no plan, nothing acted)."""
    observes = [i for i, e in enumerate(events) if local_activity(e) == Act.OBSERVE]
    tasks = [task_of(events, i) for i in observes]
    out: list[TickFigures] = []
    for (marker, (a, started_at, done_at)), (_, (b, _, _)) in itertools.pairwise(
        zip(observes, tasks, strict=True)
    ):
        segment = events[a:b]
        tick = local_result(events[marker])
        if tick is None:
            continue
        scheduled: dict[int, HistoryEvent] = {}
        done: dict[int, HistoryEvent] = {}
        for e in segment:
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[e.event_id] = e
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                done[e.activity_task_completed_event_attributes.scheduled_event_id] = e
        completed = events[done_at]
        end = next(
            (
                e
                for e in segment
                if e.event_id > completed.event_id
                and (_activity(e) in _WAITS or e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)
            ),
            events[b],
        )
        plan_s, resizes, terminates, launches = _plan_of(tick)
        acts: dict[str, float] = {}
        for sid, e in scheduled.items():
            name = _activity(e)
            if name in _ACTS and sid in done:
                acts[name] = acts.get(name, 0.0) + _at(done[sid]) - _at(e)
        out.append(
            TickFigures(
                observe_s=_at(completed) - _at(events[started_at]),
                queued_s=_at(events[started_at]) - _at(events[a]),
                plan_s=plan_s,
                act_s=max(0.0, _at(end) - _at(completed)),
                bytes=sum(_size(e) for e in segment),
                resizes=resizes,
                terminates=terminates,
                launches=launches,
                acts=acts,
                sagas=sum(
                    1
                    for e in segment
                    if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
                ),
            )
        )
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def mb(mib: float) -> float:
    return mib * 1024 * 1024 / 1e6


@dataclass
class Memory:
    peak_mib: float  # VmHWM of the worker
    steady_mib: float  # after the quiet ticks
    empty_mib: float  # the same worker, watching an empty namespace

    def per_pod_bytes(self, pods: int) -> float:
        return (self.steady_mib - self.empty_mib) * 1024 * 1024 / pods


def report(
    pods: int, ticks: Sequence[TickFigures], memory: Memory, *, skip_first: bool = True
) -> tuple[list[str], bool]:
    """The lines to print and whether every target was met. The loop's first tick (the
    pod watch's first LIST, the Raylets' first read) is shown apart and not judged."""
    lines: list[str] = []
    ok = True
    if skip_first and ticks:
        t = ticks[0]
        lines.append(
            f"first tick (the watch's first list; not judged): observe {t.observe_s:.3f}s "
            f"(plan {t.plan_s:.3f}s), act {t.act_s:.3f}s, {t.bytes} bytes"
        )
        ticks = ticks[1:]
    quiet = [t for t in ticks if not t.busy]
    busy = [t for t in ticks if t.busy]
    for label, group in (("quiet", quiet), ("busy", busy)):
        if not group:
            lines.append(f"{label} ticks: none measured MISSED")
            ok = False
            continue
        worst = max(group, key=lambda t: t.tick_s)
        biggest = max(t.bytes for t in group)
        tick_ok = worst.tick_s < MAX_TICK_S
        bytes_ok = biggest <= MAX_TICK_BYTES
        ok &= tick_ok and bytes_ok
        acts = ", ".join(f"{k} {v:.3f}s" for k, v in sorted(worst.acts.items()))
        what = (
            f"; plan: {worst.resizes} resizes, {worst.terminates} removals, "
            f"{worst.launches} launches, {worst.sagas} sagas started"
            if label == "busy"
            else ""
        )
        lines.append(
            f"{label} ticks ({len(group)}): slowest observe {worst.observe_s:.3f}s (queued "
            f"{worst.queued_s:.3f}s, plan {worst.plan_s:.3f}s) + act {worst.act_s:.3f}s = "
            f"{worst.tick_s:.3f}s "
            f"(target < {MAX_TICK_S:g}s) {verdict(tick_ok)}" + (f" [{acts}]" if acts else "") + what
        )
        lines.append(
            f"{label} ticks: history added per tick ≤ {biggest} bytes (median "
            f"{statistics.median(t.bytes for t in group):.0f}; target ≤ {MAX_TICK_BYTES}) "
            f"{verdict(bytes_ok)}"
        )
    peak, steady = mb(memory.peak_mib), mb(memory.steady_mib)
    rss_ok = peak < MAX_RSS_MB and steady < MAX_RSS_MB
    ok &= rss_ok
    lines.append(
        f"worker RSS: peak {peak:.0f} MB, steady {steady:.0f} MB (target < {MAX_RSS_MB:g} MB) "
        f"{verdict(rss_ok)}; with no cluster {mb(memory.empty_mib):.0f} MB: "
        f"{memory.per_pod_bytes(pods) / 1024:.1f} KiB per pod"
    )
    return lines, ok


# --- the run -----------------------------------------------------------------------------
def raycluster(pods: int) -> dict[str, Any]:
    """`pods` 1-CPU workers (minReplicas 0, so idle ones may go; maxReplicas `pods`, so
    demand is met by growing in place); grown or idle pods stay for an hour."""
    rc = small_raycluster(NAME, workers=pods, idle_timeout_s=3600)
    group = rc["spec"]["workerGroupSpecs"][0]
    group["minReplicas"] = 0
    return rc


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def running_pods(cp: RealControlPlane) -> list[tuple[str, bool]]:
    """(name, is the head) of the cluster's running pods (raw JSON: the Python client's
    models of 5,000 pods take longer than the listing)."""
    selector = urllib.parse.quote(f"ray.io/cluster={NAME}")
    running = "fieldSelector=status.phase%3DRunning"
    path = f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}&{running}"
    items = cp.request("GET", path)["items"]
    return [
        (p["metadata"]["name"], p["metadata"]["labels"].get("ray.io/node-type") == "head")
        for p in items
        if not p["metadata"].get("deletionTimestamp")
    ]


def pod_gone(cp: RealControlPlane, pod: str) -> bool:
    """The pod is deleted, or being deleted."""
    try:
        found = cp.request("GET", f"/api/v1/namespaces/{NS}/pods/{pod}")
    except ApiError as err:
        if err.code == 404:
            return True
        raise
    return bool(found["metadata"].get("deletionTimestamp"))


async def ticks_of(temporal: Client) -> int:
    handle = temporal.get_workflow_handle(reconcile_workflow_id(NS, NAME))
    with contextlib.suppress(Exception):  # not started yet
        return (await handle.query(ReconcileWorkflow.status)).ticks
    return -1


async def next_tick(temporal: Client, after: int, timeout: float) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        n = await ticks_of(temporal)
        if n > after:
            return n
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the reconcile loop did not tick past {after} in {timeout:.0f} s")


def poke(cp: RealControlPlane, pod: str, n: int) -> None:
    """A change that asks for nothing (an annotation on one pod): the loop's wait sees
    the cluster's pods change, and it observes again."""
    cp.request(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/{pod}",
        {"metadata": {"annotations": {"bench.raysize.io/poke": str(n)}}},
        content_type="application/merge-patch+json",
    )


def expire_idle(ray: RayStandIn, n: int) -> list[str]:
    """`n` worker Raylets idle for two hours (past the cluster's idle timeout)."""
    with ray.model.lock:
        nodes = [node for node in ray.model.nodes.values() if node.group != "headgroup"][-n:]
        for node in nodes:
            node.idle_since = time.monotonic() - 7200
        ray.model.version += 1
    return [node.pod for node in nodes]


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic(), rss_mib(self.pid)))

    def since(self, t0: float) -> list[float]:
        return [v for t, v in self.samples if t >= t0]

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


async def run(args: argparse.Namespace, tmp: Path) -> int:
    env = await start_dev_server(*ONE_PARTITION)
    nodes = math.ceil((args.pods + 1) / PODS_PER_NODE)
    sandbox = RealSandbox(
        SandboxConfig(
            node_specs=[
                NodeSpec(f"node-{i:03d}", 1_000_000, 4096 * GIB, max_pods=PODS_PER_NODE + 10)
                for i in range(nodes)
            ],
            timing=KubeletTiming(actuation_delay_s=0.0),
        )
    )
    ray = RayStandIn(threads=4)
    worker: subprocess.Popen[bytes] | None = None
    empty: subprocess.Popen[bytes] | None = None
    temporal = env.client.service_client.config.target_host
    queue = f"scale-{uuid.uuid4().hex[:6]}"
    log = tmp / "worker.log"
    t0 = time.monotonic()
    try:
        await asyncio.to_thread(sandbox.start)
        cp = sandbox.control_plane
        print(f"control plane up in {time.monotonic() - t0:.0f}s", flush=True)
        kubeconfig = cp.write_kubeconfig(tmp / "admin")
        ray.__enter__()
        # the same worker on an empty namespace: what the worker costs without a cluster
        empty = start_raysize_worker(
            tmp / "empty.log",
            temporal,
            f"{queue}-empty",
            kubeconfig,
            namespaces="empty",
            discovery_interval_s="1",
            log_level="WARNING",
        )
        t1 = time.monotonic()
        cp.request("POST", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters", raycluster(args.pods))
        registered: set[str] = set()

        def register() -> bool:
            for pod, head in running_pods(cp):
                if pod not in registered:
                    ray.add_node(pod, "headgroup" if head else "small", 0.0 if head else 1.0, GIB)
                    registered.add(pod)
            return len(registered) >= int(args.pods) + 1

        def progress() -> bool:
            done = register()
            print(f"  {time.monotonic() - t1:.0f}s: {len(registered)} pods running", flush=True)
            return done

        # a LIST of thousands of running pods is parsed in this process, beside the
        # kubelet simulator's threads: at 10 s a 5,000-pod bring-up slowed from 7 to 3 pods/s
        every = max(10.0, args.pods / 200)
        if not await until(progress, args.up_timeout, every=every):
            raise SystemExit(
                f"KubeRay's pods: {len(registered)} of {args.pods + 1} running after "
                f"{args.up_timeout:.0f} s (--up-timeout)"
            )
        up_s = time.monotonic() - t1
        print(
            f"KubeRay created the RayCluster's {args.pods} workers and the kubelet ran them "
            f"in {up_s:.0f}s; a Raylet registered for each in the GCS stand-in",
            flush=True,
        )
        head = next(pod for pod, is_head in running_pods(cp) if is_head)
        empty_mib = rss_mib(empty.pid)
        stop_group(empty)
        empty = None
        worker = start_raysize_worker(
            log,
            temporal,
            queue,
            kubeconfig,
            namespaces=NS,
            discovery_interval_s="1",
            gcs_address=ray.address,
            log_level="INFO",  # a slow observe says where its time went
        )
        with RssSampler(worker.pid) as rss:
            t2 = time.monotonic()
            n = await next_tick(env.client, 0, 300)
            print(f"worker up, first tick after {time.monotonic() - t2:.1f}s", flush=True)
            await asyncio.sleep(2)
            quiet_from = time.monotonic()
            for _ in range(args.quiet_ticks):
                await asyncio.to_thread(poke, cp, head, n)
                n = await next_tick(env.client, n, 60)
                await asyncio.sleep(1)
            steady_mib = statistics.median(rss.since(quiet_from) or [rss_mib(worker.pid)])
            expired = expire_idle(ray, args.remove)
            if args.grow:
                ray.add_demands({"CPU": 2.0}, args.grow)
            t3 = time.monotonic()
            n = await next_tick(env.client, n, 60)

            def served() -> bool:
                placed, waiting, _, _ = ray.counts()
                with ray.model.lock:  # drained (the stand-in forgot it): its pod must go
                    drained = {p for p in expired if p not in ray.model.nodes}
                if placed < args.grow or waiting or not drained:
                    return False
                # each drained pod read by itself: a LIST of 5,000 pods held this process
                # (the GCS stand-in the worker reads) for seconds, beside the tick measured
                return all(pod_gone(cp, pod) for pod in drained)

            done = await until(served, 120, every=1.0)
            print(
                f"busy: {ray.counts()[0]}/{args.grow} tasks placed, the drained of the "
                f"{args.remove} idle pods {'gone' if done else 'NOT all gone'} after "
                f"{time.monotonic() - t3:.1f}s",
                flush=True,
            )
            for _ in range(2):  # the busy tick ends when the next observe is scheduled
                await asyncio.to_thread(poke, cp, head, n)
                n = await next_tick(env.client, n, 60)
                await asyncio.sleep(1)
            peak_mib = hwm_mib(worker.pid)
        wf_id = reconcile_workflow_id(NS, NAME)
        events = await _chain(env.client, wf_id, await _first_run(env.client, wf_id))
        ticks = tick_figures(events)
        lines, ok = report(args.pods, ticks, Memory(peak_mib, steady_mib, empty_mib))
        for line in lines:
            print(line, flush=True)
        print("verdict:", "all targets met" if ok else "some targets MISSED", flush=True)
        return 0 if ok else 1
    finally:
        for proc in (worker, empty):
            if proc is not None:
                stop_group(proc)
        if args.log and log.exists():
            args.log.write_bytes(log.read_bytes())
        ray.__exit__()
        await asyncio.to_thread(sandbox.close)
        await env.shutdown()


async def _first_run(temporal: Client, wf_id: str) -> str:
    """The run id of the workflow's first run (its chain is followed from there)."""
    runs = [wf async for wf in temporal.list_workflows(f"WorkflowId = '{wf_id}'")]
    runs.sort(key=lambda wf: wf.start_time)
    return runs[0].run_id if runs else ""


def main() -> None:
    stop_on_sigterm()
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        sys.exit(asyncio.run(run(args, Path(tmp))))


if __name__ == "__main__":
    main()
