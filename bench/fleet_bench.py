"""A fleet of RayClusters on one raysize worker (or two): idle cost, reaction, a burst.

    python -m bench.fleet_bench [--clusters 100] [--workers 10] [--replicas 1|2]
                                [--idle-minutes 3] [--trials 10] [--kill-one]
    python -m bench.fleet_bench --clusters 1000 --workers 9 --replicas 2 --kill-one \
                                --idle-minutes 2 --trials 5 --warmup 30      # issue #30

A real Temporal dev server, the embedded sandbox Kubernetes (in this process: its API
server, kubelet simulator and KubeRay stand-in), and `--replicas` `raysize worker`
processes on one task queue. One RayCluster (`react`) runs real Ray; every other one
(`fleet-NNN`, a head and `--workers` 1-CPU workers that may grow to 4) is answered by a
GCS stand-in (`sandbox/ray_standin.py`, all of them served by one `StandInFleet`): a node
per running pod, demands that wait for room. The benchmark prints, beside issue #30's
targets (met / MISSED):

1. idle: the worker processes' CPU summed (% of one core) and each one's RSS while all
   loops wait;
2. reaction: on the real cluster, pending demand → Raylet resized, p50 (the workflow
   history's clock, as in `bench.reaction_bench`);
3. burst: every stand-in cluster gets `--workers` tasks of {CPU: 2} at once, so each of
   pods grow (1 → 2 CPU, or 1 → 4 for two tasks: the planner right-sizes): the time until
   every task runs, the pods' sizes in Kubernetes, and the resize workflows per pod (one
   each: none ran twice).

With `--replicas 2 --kill-one`, one worker is SIGKILLed two seconds into the burst:
the other must finish everything (nothing lost: every task runs and every reconcile loop
still runs; nothing resized twice). Every process started is stopped by its group.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.clusters import small_raycluster
from bench.histories import local_activity
from bench.idle_bench import cpu_seconds, metric_total, rss_mib, scrape
from bench.procs import ONE_PARTITION, start_dev_server, start_raysize_worker, stop_on_sigterm
from bench.reaction_bench import median, report, run_trials
from bench.reaction_bench import raycluster as real_raycluster
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.localray import stop_group
from raysize.sandbox.ports import free_port
from raysize.sandbox.ray_standin import RayStandIn, StandInFleet
from raysize.sandbox.store import Store
from raysize.worker.settings import Settings
from raysize.workflows.contracts import ReconcileStatus
from raysize.workflows.naming import RESIZE_OUTCOME, reconcile_workflow_id

GIB = 1024**3
NAMESPACE = "default"
REAL = "react"  # bench.reaction_bench's cluster name: its report() finds the resizes
# targets (issue #30: 1,000 clusters of 10 pods on two workers)
MAX_IDLE_CPU_PCT = 100.0  # all workers together, % of one core
MAX_RSS_MIB = 600.0  # each worker
MAX_REACTION_P50_S = 0.3
MAX_BURST_S = 300.0


def fleet_cluster(name: str, workers: int) -> dict[str, Any]:
    # grown pods stay grown while the benchmark runs
    return small_raycluster(name, workers=workers, idle_timeout_s=3600)


class Registrar:
    """Registers a stand-in node for every running pod of a stand-in cluster, as a
    Raylet registers when its container starts (and forgets deleted pods); it LISTs the
    pods through the API server (either world)."""

    def __init__(self, core: client.CoreV1Api, stand_ins: dict[str, RayStandIn]) -> None:
        self.core, self.stand_ins = core, stand_ins
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registrar", daemon=True)
        self.registered = 0

    def __enter__(self) -> Registrar:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def pods(self) -> list[dict[str, Any]] | None:
        """The pods (as the API server's JSON), or None while it cannot say."""
        try:
            items = self.core.list_namespaced_pod(NAMESPACE, label_selector="ray.io/cluster")
        except Exception:  # the API server is going away
            return None
        return [
            cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(p))
            for p in items.items
        ]

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            pods = self.pods()
            if pods is not None:
                self.sync(pods)

    def sync(self, pods: list[dict[str, Any]]) -> None:
        live: dict[str, set[str]] = {}
        for pod in pods:
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            ray = self.stand_ins.get(labels.get("ray.io/cluster", ""))
            if ray is None or meta.get("deletionTimestamp"):
                continue
            live.setdefault(labels["ray.io/cluster"], set()).add(meta["name"])
            self.register(ray, pod)
        for cluster, ray in self.stand_ins.items():
            for name in set(ray.model.nodes) - live.get(cluster, set()):
                ray.remove_node(name)

    def register(self, ray: RayStandIn, pod: dict[str, Any]) -> None:
        """A node for `pod` (of `ray`'s cluster, not being deleted), once it runs."""
        if (pod.get("status") or {}).get("phase") == "Running":
            head = pod["metadata"]["labels"].get("ray.io/node-type") == "head"
            group = "headgroup" if head else "small"
            if ray.add_node(pod["metadata"]["name"], group, 0.0 if head else 1.0, float(GIB)):
                self.registered += 1


class StoreRegistrar(Registrar):
    """The same, fed by the embedded sandbox's store in this process (every pod as it is
    written), as its kubelet simulator is. Looking over 10,000 pods twice a second took a
    sixth of a core from the process that answers every GCS read and, in the burst, every
    API call, and a LIST of them through the API server would cost more than the fleet."""

    def __init__(self, store: Store, stand_ins: dict[str, RayStandIn]) -> None:
        super().__init__(cast(client.CoreV1Api, None), stand_ins)
        self.store = store
        self._pods = store.watch("pods", None, lambda pod: True, None)  # each one, then news

    def __exit__(self, *exc: object) -> None:
        self.store.unwatch(self._pods)  # ends _run
        super().__exit__(*exc)

    def _run(self) -> None:
        while (event := self._pods.events.get()) is not None:
            kind, pod = event
            meta = pod["metadata"]
            ray = self.stand_ins.get((meta.get("labels") or {}).get("ray.io/cluster", ""))
            if ray is None:
                continue
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                ray.remove_node(meta["name"])
            else:
                self.register(ray, pod)


def api_requests(tally: Counter[tuple[str, str]], seconds: float) -> str:
    """The API requests the burst cost, by verb and resource, busiest first."""
    total = sum(tally.values())
    kinds = ", ".join(f"{n} {verb} {what}" for (verb, what), n in tally.most_common(8))
    return f"API requests in the burst: {total} ({total / max(seconds, 1e-9):.0f}/s): {kinds}"


def worker_sizes(store: Store) -> Counter[str]:
    """The stand-in clusters' worker pods by the CPU their container runs with."""
    sizes: Counter[str] = Counter()
    for pod in store.iter_all("pods"):
        labels = pod["metadata"].get("labels") or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if (
            labels.get("ray.io/cluster", "").startswith("fleet-")
            and labels.get("ray.io/node-type") != "head"
            and statuses
        ):
            limits = (statuses[0].get("resources") or {}).get("limits") or {}
            sizes[str(limits.get("cpu", "?"))] += 1
    return sizes


def start_workers(
    n: int,
    temporal: str,
    queue: str,
    kubeconfig: Path,
    tmp: Path,
    discovery_s: str,
    extra: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    settings = {"log_level": "WARNING", **(extra or {})}
    return [
        start_raysize_worker(
            tmp / f"worker-{i}.log",
            temporal,
            queue,
            kubeconfig,
            namespaces=NAMESPACE,
            discovery_interval_s=discovery_s,
            **settings,
        )
        for i in range(n)
    ]


def worker_setting(text: str) -> tuple[str, str]:
    """`--set NAME=VALUE`: a worker setting by its name in `raysize worker --help`
    (RAYSIZE_NAME), e.g. max_cached_workflows=500."""
    name, sep, value = text.partition("=")
    name = name.strip().lower().removeprefix("raysize_")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=VALUE, e.g. max_cached_workflows=500"
        )
    if name not in Settings.model_fields:
        # the worker ignores RAYSIZE_* variables it does not know: a typo would be lost
        raise argparse.ArgumentTypeError(
            f"{text!r}: {name!r} is no worker setting (see `raysize worker --help`)"
        )
    return name, value


def server_config_value(text: str) -> str:
    """`--server-config KEY=JSON`, checked before the dev server is started with it."""
    key, sep, value = text.partition("=")
    try:
        if not (key and sep):
            raise ValueError("no '='")
        json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=JSON (e.g. system.enableActivityEagerExecution=true; "
            f"a string value needs quotes): {exc}"
        ) from None
    return text


async def running_reconciles(temporal: Client, queue: str) -> int:
    query = (
        f"TaskQueue='{queue}' AND WorkflowType='ReconcileWorkflow' AND ExecutionStatus='Running'"
    )
    return (await temporal.count_workflows(query)).count


class CpuSplit:
    """Where the machine's CPU went between `__init__` and `line()`: the workers, this
    process, the dev server and the rest, as % of one core."""

    def __init__(self, workers: list[subprocess.Popen[bytes]]) -> None:
        self.workers = workers
        self.server = dev_server_pid()
        self.t0 = time.monotonic()
        self.cpu0 = {w.pid: cpu_seconds(w.pid) for w in workers}
        self.own0 = cpu_seconds(os.getpid())
        self.server0 = self._server_s()
        self.busy0 = machine_busy()

    def _server_s(self) -> float:
        return cpu_seconds(self.server) if self.server else 0.0

    def workers_pct(self) -> float:
        took = time.monotonic() - self.t0
        return sum(cpu_seconds(w.pid) - self.cpu0[w.pid] for w in self.workers) / took * 100

    def line(self) -> str:
        took = time.monotonic() - self.t0
        busy1 = machine_busy()
        machine = (busy1[0] - self.busy0[0]) / (busy1[1] - self.busy0[1]) * 100
        own = (cpu_seconds(os.getpid()) - self.own0) / took * 100
        server = (self._server_s() - self.server0) / took * 100
        workers = self.workers_pct()
        return (
            f"the machine's CPU meanwhile: {machine:.0f}% of one core busy of "
            f"{100 * (os.cpu_count() or 1)}%; this process (API server, kubelet simulator, "
            f"KubeRay and GCS stand-ins) {own:.0f}%, the Temporal dev server {server:.0f}%, "
            f"the workers {workers:.0f}%, the rest (real Ray, other) "
            f"{machine - own - server - workers:.0f}%"
        )


# events that wake a workflow task → how `loop_work` names them
WAKERS = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity failed",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: "saga started",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: "saga ended",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signal",
    # a signal the loop sent (a new target for a running resize) was delivered
    EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED: "signal sent",
    EventType.EVENT_TYPE_TIMER_FIRED: "timer",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "task timed out",
}


async def loop_work(temporal: Client, clusters: list[str], since: datetime) -> str:
    """What the reconcile loops of `clusters` did since `since` (their current runs):
    workflow tasks and activities per loop, by type, and the resize sagas they started."""
    tasks = 0
    acts: Counter[str] = Counter()
    woke: Counter[str] = Counter()  # what the events before each workflow task were
    sagas = 0
    for name in clusters:
        handle = temporal.get_workflow_handle(f"reconcile/{NAMESPACE}/{name}")
        kinds: set[str] = set()
        scheduled: dict[int, str] = {}  # activity's scheduled event id → its type
        async for e in handle.fetch_history_events():
            if e.event_time.ToDatetime(UTC) < since:
                continue
            if e.HasField("workflow_task_completed_event_attributes"):
                tasks += 1
                woke[" + ".join(sorted(kinds)) or "?"] += 1
                kinds = set()
            elif e.HasField("activity_task_scheduled_event_attributes"):
                kind = e.activity_task_scheduled_event_attributes.activity_type.name
                acts[kind] += 1
                scheduled[e.event_id] = kind
            elif e.HasField("start_child_workflow_execution_initiated_event_attributes"):
                sagas += 1
            elif local := local_activity(e):  # ran inside the task just completed
                acts[f"{local} (local)"] += 1
            elif e.HasField("activity_task_completed_event_attributes"):
                at = e.activity_task_completed_event_attributes
                kinds.add(scheduled.get(at.scheduled_event_id, "activity"))
            elif e.event_type in WAKERS:
                kinds.add(WAKERS[e.event_type])
    n = max(1, len(clusters))
    per = ", ".join(f"{k} {v / n:.1f}" for k, v in acts.most_common())
    by = ", ".join(f"{k} {v / n:.1f}" for k, v in woke.most_common(8))
    return (
        f"a reconcile loop in the burst (mean of {len(clusters)}): {tasks / n:.1f} workflow "
        f"tasks, {sagas / n:.1f} resizes started; activities: {per}; its workflow tasks "
        f"came after: {by}"
    )


def machine_busy() -> tuple[float, float]:
    """(CPU seconds busy, seconds elapsed) of all cores together, from /proc/stat."""
    fields = [float(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick / (os.cpu_count() or 1)


# what the dev server did, from its /metrics: (metric, labels every sample counted has)
HISTORY = 'service_name="history"'
TEMPORAL_COUNTS = {
    "workflow tasks": ("service_requests", ('"RespondWorkflowTaskCompleted"', HISTORY)),
    "activity heartbeats": ("service_requests", ('"RecordActivityTaskHeartbeat"', HISTORY)),
    "activities completed": ("service_requests", ('"RespondActivityTaskCompleted"', HISTORY)),
    "heartbeat timeouts": ("heartbeat_timeout", ()),
}  # fmt: skip


def temporal_counts(port: int) -> dict[str, float]:
    """The dev server's counters of TEMPORAL_COUNTS, now."""
    page = scrape(port)
    return {
        what: metric_total(page, metric, labels)
        for what, (metric, labels) in TEMPORAL_COUNTS.items()
    }


def temporal_rates(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    """`Temporal meanwhile: 70.0 workflow tasks/s, …` between two `temporal_counts`."""
    rates = [
        f"{(after[what] - before[what]) / seconds:.1f} {what}/s"
        for what in TEMPORAL_COUNTS
        if what != "heartbeat timeouts"
    ]
    timeouts = after["heartbeat timeouts"] - before["heartbeat timeouts"]
    return f"the Temporal dev server: {', '.join(rates)}; {timeouts:.0f} heartbeat timeouts"


def dev_server_pid() -> int | None:
    """The Temporal dev server this process started (its child named `temporal`)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        if comm.endswith("(temporal") and int(rest.split()[1]) == os.getpid():
            return int(stat.parent.name)
    return None


async def reaction(temporal: Client, gcs: str, trials: int) -> list[float]:
    """Demand → Raylet resized on the real cluster, per trial (seconds), each after six
    quiet seconds (raysize's wait has slowed its Ray reads by then); prints where each
    trial's time went."""
    seen = await run_trials(gcs, trials, quiet_s=6)
    await report(temporal, seen, timeline=True)
    return sorted(t.raylet_resized - t.demand_seen for t in seen if t.raylet_resized)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def against(figure: str, ok: bool, target: str) -> str:
    """`figure (target …) met|MISSED`: each figure beside its target."""
    return f"{figure} (target {target}) {verdict(ok)}"


async def run(args: argparse.Namespace, tmp: Path) -> int:
    metrics_port = free_port()
    server_config = [a for kv in args.server_config for a in ("--dynamic-config-value", kv)]
    env = await start_dev_server(
        *ONE_PARTITION, *server_config, "--metrics-port", str(metrics_port)
    )
    pods_total = args.clusters * (args.workers + 1)
    sandbox = Sandbox(
        SandboxConfig(
            nodes=max(1, -(-pods_total // 250)),
            node_cpu=1_000_000,
            node_memory=4096 * GIB,
            max_pods=250,
            with_ray=True,
            ray_clusters=(REAL,),
            timing=KubeletTiming(actuation_delay_s=0.0),
        )
    ).start()
    fleet = StandInFleet(args.clusters - 1)
    stand_ins = {f"fleet-{i:03d}": ray for i, ray in enumerate(fleet.stand_ins)}
    workers: list[subprocess.Popen[bytes]] = []
    ok = True
    try:
        fleet.__enter__()
        for name, ray in stand_ins.items():
            sandbox.serve_gcs(NAMESPACE, name, ray.port)
        kubeconfig = sandbox.write_kubeconfig(tmp / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        queue = f"fleet-{uuid.uuid4().hex[:6]}"
        temporal = env.client.service_client.config.target_host
        started = time.monotonic()
        for name in stand_ins:
            custom.create_namespaced_custom_object(
                "ray.io", "v1", NAMESPACE, "rayclusters", fleet_cluster(name, args.workers)
            )
        custom.create_namespaced_custom_object(
            "ray.io", "v1", NAMESPACE, "rayclusters", real_raycluster()
        )
        print(
            f"world: embedded sandbox (API server, kubelet simulator and KubeRay stand-in in "
            f"this process), {args.clusters} RayClusters created in "
            f"{time.monotonic() - started:.0f}s",
            flush=True,
        )
        with StoreRegistrar(sandbox.store, stand_ins) as registrar:
            logs = args.log_dir or tmp
            logs.mkdir(parents=True, exist_ok=True)
            workers = start_workers(
                args.replicas,
                temporal,
                queue,
                kubeconfig,
                logs,
                str(args.discovery_s),
                dict(args.worker_settings),
            )
            want_nodes = (args.clusters - 1) * (args.workers + 1)
            while (
                await running_reconciles(env.client, queue) < args.clusters
                or registrar.registered < want_nodes
            ):
                if time.monotonic() - started > args.start_timeout:
                    raise SystemExit(
                        f"the fleet did not come up in {args.start_timeout:.0f}s: "
                        f"{await running_reconciles(env.client, queue)}/{args.clusters} "
                        f"reconcile loops, {registrar.registered}/{want_nodes} Raylets"
                    )
                await asyncio.sleep(1)
            print(
                f"{args.clusters} clusters ({want_nodes} stand-in pods + 1 real Ray cluster) "
                f"managed by {args.replicas} worker(s) after "
                f"{time.monotonic() - started:.0f}s; warming up {args.warmup:.0f}s …",
                flush=True,
            )
            await asyncio.sleep(args.warmup)

            # 1. idle
            split = CpuSplit(workers)
            temporal0 = temporal_counts(metrics_port)
            reads0 = sum(r.counts()[3] for r in stand_ins.values())
            t0, load0 = time.monotonic(), os.getloadavg()[0]
            await asyncio.sleep(args.idle_minutes * 60)
            idle_s = time.monotonic() - t0
            cpu_pct = split.workers_pct()
            rss = [rss_mib(w.pid) for w in workers]
            reads = (sum(r.counts()[3] for r in stand_ins.values()) - reads0) / idle_s
            temporal1 = temporal_counts(metrics_port)
            print(
                f"idle {idle_s:.0f}s (load {load0:.1f} → {os.getloadavg()[0]:.1f}): "
                + against(
                    f"workers' CPU {cpu_pct:.1f}% of one core in all",
                    cpu_pct < MAX_IDLE_CPU_PCT,
                    f"< {MAX_IDLE_CPU_PCT:g}%",
                )
                + "; "
                + against(
                    "RSS " + ", ".join(f"{r:.0f}" for r in rss) + " MiB",
                    max(rss) < MAX_RSS_MIB,
                    f"< {MAX_RSS_MIB:g} each",
                )
                + f"; GCS state reads {reads / max(1, len(stand_ins)):.2f}/s per cluster",
                flush=True,
            )
            print(f"  {split.line()}; {temporal_rates(temporal0, temporal1, idle_s)}", flush=True)
            ok &= cpu_pct < MAX_IDLE_CPU_PCT and max(rss) < MAX_RSS_MIB

            # 2. reaction on the real cluster
            rc = cast(
                dict[str, Any],
                custom.get_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayclusters", REAL),
            )
            from raysize.activities.k8s_objects import gcs_address

            took = await reaction(env.client, gcs_address(rc), args.trials)
            p50 = median(took)
            print(
                against(
                    f"real cluster: demand → Raylet resized p50 {p50:.3f}s over {len(took)} trials",
                    p50 < MAX_REACTION_P50_S,
                    f"< {MAX_REACTION_P50_S:g}s",
                ),
                flush=True,
            )
            ok &= p50 < MAX_REACTION_P50_S

            # 3. the burst
            t0, began = time.monotonic(), datetime.now(UTC)
            temporal0 = temporal_counts(metrics_port)
            split = CpuSplit(workers[1:] if args.kill_one else workers)
            reads0 = sum(r.counts()[3] for r in stand_ins.values())
            tally0 = Counter(sandbox.api.tally)
            for ray in stand_ins.values():
                ray.add_demands({"CPU": 2.0}, args.workers)
            killed = None
            want = len(stand_ins) * args.workers
            told = 0  # progress, every 30 s: where a slow burst lost its time
            while (running := sum(r.counts()[0] for r in stand_ins.values())) < want:
                if time.monotonic() - t0 >= told + 30:
                    told += 30
                    print(f"  burst: {running}/{want} tasks running after {told}s", flush=True)
                if args.kill_one and killed is None and time.monotonic() - t0 > 2:
                    killed = workers[0]
                    os.killpg(killed.pid, 9)
                    print("killed worker 0 (SIGKILL) two seconds into the burst", flush=True)
                if time.monotonic() - t0 > args.burst_timeout:
                    break
                await asyncio.sleep(0.2)
            burst_s = time.monotonic() - t0
            temporal1 = temporal_counts(metrics_port)
            placed = sum(r.counts()[0] for r in stand_ins.values())
            sizes = worker_sizes(sandbox.store)
            grown = ", ".join(f"{n} at {cpu} CPU" for cpu, n in sorted(sizes.items()))
            # the same resize (pod, from, to) run twice would be a lost or doubled saga; a
            # pod grown again later for more tasks is a new resize, and fine
            listed: list[ResizeRun] = []
            async for wf in env.client.list_workflows(
                f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow' "
                "AND RayCluster STARTS_WITH 'fleet-'"
            ):
                memo = await wf.memo()
                listed.append(
                    ResizeRun(
                        workflow_id=wf.id,
                        run_id=wf.run_id,
                        was=str(memo.get("from")),
                        to=str(memo.get("to")),
                        started=f"{wf.start_time:%H:%M:%S.%f}",
                        status=wf.status.name.lower() if wf.status else "?",
                        outcome=str(wf.typed_search_attributes.get(RESIZE_OUTCOME) or "?"),
                        parent=(
                            wf.raw_info.parent_execution.workflow_id,
                            wf.raw_info.parent_execution.run_id,
                        ),
                    )
                )
            runs, status = resize_runs(listed)
            twice = sum(1 for n in runs.values() if len(n) > 1)
            for (pod, was, to), seen in [(k, v) for k, v in runs.items() if len(v) > 1][:5]:
                print(
                    f"  run twice: {pod} {was} → {to}: " + "; ".join(r.line() for r in seen),
                    flush=True,
                )
            if args.log_dir is not None:  # the loops that started them, to read
                await dump_parents(env.client, args.log_dir, runs)
            await tell_unplaced(env.client, stand_ins, args.workers, args.log_dir)
            loops = await running_reconciles(env.client, queue)
            print(
                against(
                    f"burst: {placed}/{want} tasks running after {burst_s:.1f}s",
                    placed == want and burst_s < MAX_BURST_S,
                    f"all < {MAX_BURST_S:g}s",
                )
                + f"; worker pods in Kubernetes: {grown}",
                flush=True,
            )
            reads = (sum(r.counts()[3] for r in stand_ins.values()) - reads0) / burst_s
            print(f"  {api_requests(Counter(sandbox.api.tally) - tally0, burst_s)}", flush=True)
            print(
                f"  GCS state reads {reads / max(1, len(stand_ins)):.2f}/s per cluster; "
                f"{split.line()} (the killed worker not counted); "
                f"{temporal_rates(temporal0, temporal1, burst_s)}"
                if args.kill_one
                else f"  GCS state reads {reads / max(1, len(stand_ins)):.2f}/s per cluster; "
                f"{split.line()}; {temporal_rates(temporal0, temporal1, burst_s)}",
                flush=True,
            )
            print(
                against(
                    f"{'after the SIGKILL: ' if killed else ''}{len(runs)} resize workflows "
                    f"({', '.join(f'{n} {k.lower()}' for k, n in sorted(status.items()))}), "
                    f"{twice} run twice (same pod, from and to)",
                    twice == 0,
                    "none twice",
                )
                + "; "
                + against(
                    f"nothing lost: {placed}/{want} tasks placed, {loops}/{args.clusters} "
                    "reconcile loops running",
                    placed == want and loops == args.clusters,
                    "all",
                ),
                flush=True,
            )
            sample = sorted(stand_ins)[:: max(1, len(stand_ins) // 10)]
            print(f"  {await loop_work(env.client, sample, began)}", flush=True)
            ok &= placed == want and burst_s < MAX_BURST_S and twice == 0
            ok &= loops == args.clusters
    finally:
        for w in workers:
            stop_group(w)
        fleet.__exit__()
        await asyncio.to_thread(sandbox.close)
        await env.shutdown()
    print("verdict:", "all targets met" if ok else "some targets MISSED")
    return 0 if ok else 1


@dataclass(frozen=True)
class ResizeRun:
    """One resize saga run as the visibility list showed it."""

    workflow_id: str
    run_id: str
    was: str
    to: str
    started: str
    status: str
    outcome: str
    parent: tuple[str, str]  # the loop run that started it

    def line(self) -> str:
        return (
            f"{self.started} {self.status} {self.outcome} (run {self.run_id[-8:]}, started by "
            f"loop run {self.parent[1][-8:] or '?'})"
        )


def resize_runs(
    listed: list[ResizeRun],
) -> tuple[dict[tuple[str, str, str], list[ResizeRun]], Counter[str]]:
    """The runs of each resize (pod, from, to), each run once, and the runs by status.
    A list of workflows taken while some close is paged over a set that changes: a run
    that closed between two pages was listed as running on one and as closed on the next
    (the dev server's visibility orders closed runs apart). Counted by workflow and run ID,
    it is one run, as it closed."""
    by_run: dict[tuple[str, str], ResizeRun] = {}
    for r in listed:
        seen = by_run.get((r.workflow_id, r.run_id))
        if seen is None or seen.status == "running":
            by_run[(r.workflow_id, r.run_id)] = r
    runs: dict[tuple[str, str, str], list[ResizeRun]] = {}
    for r in by_run.values():
        runs.setdefault((r.workflow_id, r.was, r.to), []).append(r)
    return runs, Counter(r.status.upper() for r in by_run.values())


async def tell_unplaced(
    temporal: Client, stand_ins: dict[str, RayStandIn], each: int, folder: Path | None
) -> None:
    """Each cluster (at most 3) with fewer than `each` tasks placed after the burst: its
    loop's last decisions (its `status` query), and with `folder` the loop's history
    there."""
    short = [(name, ray) for name, ray in stand_ins.items() if ray.counts()[0] < each][:3]
    for name, ray in short:
        wid = reconcile_workflow_id(NAMESPACE, name)
        handle = temporal.get_workflow_handle(wid)
        try:
            status = await handle.query("status", result_type=ReconcileStatus)
        except Exception as exc:  # a loop gone is news too
            print(f"  {name}: {ray.counts()[0]} tasks placed; its loop: {exc}", flush=True)
            continue
        print(
            f"  {name}: {ray.counts()[0]} tasks placed; its loop's last decisions: "
            + " | ".join(
                f"tick {d.tick}: {d.summary} ({'; '.join(d.reasons[:3])})"
                for d in status.decisions[-4:]
            )
            + f"; ticks {status.ticks}, last error: {status.last_error or 'none'}",
            flush=True,
        )
        if folder is not None:
            history = await handle.fetch_history()
            (folder / f"waiting-{name}.json").write_text(history.to_json())


async def dump_parents(
    temporal: Client, folder: Path, runs: dict[tuple[str, str, str], list[ResizeRun]]
) -> None:
    """The histories of the resizes run twice and of the loop runs that started them, as
    JSON in `folder` (at most 10 pairs)."""
    twice = [v for v in runs.values() if len(v) > 1][:10]
    for seen in twice:
        wanted = {r.parent for r in seen} | {(r.workflow_id, r.run_id) for r in seen}
        for wid, run in sorted(wanted):
            if not wid:
                continue
            history = await temporal.get_workflow_handle(wid, run_id=run).fetch_history()
            name = f"{wid.replace('/', '_')}-{run[-8:]}.json"  # reconcile_… and resize_…
            (folder / name).write_text(history.to_json())
    if twice:
        print(f"  their histories, and the loops': {folder}/re*.json", flush=True)


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description="raysize with a fleet of RayClusters")
    parser.add_argument("--clusters", type=int, default=100, help="RayClusters in all (≥ 2)")
    parser.add_argument("--workers", type=int, default=10, help="worker pods per stand-in")
    parser.add_argument("--replicas", type=int, default=1, help="raysize worker processes")
    parser.add_argument("--idle-minutes", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before measuring")
    parser.add_argument("--trials", type=int, default=10, help="reaction trials (real Ray)")
    parser.add_argument("--burst-timeout", type=float, default=MAX_BURST_S + 30)
    parser.add_argument(
        "--start-timeout", type=float, default=900.0, help="seconds for the fleet to come up"
    )
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep the workers' logs here (worker-N.log)"
    )
    parser.add_argument(
        "--discovery-s", type=float, default=15.0, help="RAYSIZE_DISCOVERY_INTERVAL_S"
    )
    parser.add_argument(
        "--kill-one", action="store_true", help="SIGKILL one worker during the burst"
    )
    repeatable: list[tuple[str, str, Any, str, str]] = [
        ("--set", "worker_settings", worker_setting, "NAME=VALUE",
         "a setting for every raysize worker (RAYSIZE_NAME), e.g. max_cached_workflows=500"),
        ("--server-config", "server_config", server_config_value, "KEY=JSON",
         "a dynamic config value of the Temporal dev server, e.g. "
         "system.enableActivityEagerExecution=true (README, *Temporal server*)"),
    ]  # fmt: skip
    for flag, dest, kind, metavar, what in repeatable:
        parser.add_argument(
            flag,
            dest=dest,
            type=kind,
            action="append",
            default=[],
            metavar=metavar,
            help=f"{what}; repeatable",
        )
    args = parser.parse_args()
    if args.clusters < 2 or args.workers < 1 or args.replicas < 1 or args.trials < 1:
        parser.error("need --clusters ≥ 2, --workers ≥ 1, --replicas ≥ 1, --trials ≥ 1")
    if args.kill_one and args.replicas < 2:
        parser.error("--kill-one needs --replicas 2 (someone must finish the work)")
    with tempfile.TemporaryDirectory(prefix="rsfleet") as tmp:
        sys.exit(asyncio.run(run(args, Path(tmp))))


if __name__ == "__main__":
    main()
