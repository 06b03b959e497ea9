"""What an idle RayCluster costs: Temporal history, activities, GCS reads, worker CPU.

    python -m bench.idle_bench [--minutes 10] [--warmup 60]

A real Temporal dev server, the sandbox Kubernetes with real Ray processes (a head and
one worker that may grow), and a `raysize worker` process. Nothing is pending: after the
warm-up the cluster is left alone for `--minutes`, and the benchmark counts what raysize
did meanwhile: the reconcile workflow's history events (every run of it, so a
continue-as-new counts), its activities, timers and signals, its continue-as-new, the
reads of Ray's cluster state (`raysize_ray_state_reads`, scraped from the worker's
/metrics) and the worker process's CPU and memory. Each figure is printed per idle
cluster-hour beside its target (issue #12), with the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.clusters import small_raycluster
from bench.procs import start_dev_server, start_raysize_worker, stop_on_sigterm
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import NodeSpec
from raysize.sandbox.localray import stop_group
from raysize.sandbox.ports import free_port
from raysize.workflows.contracts import RAY_STATE_READS, ReconcileStatus
from raysize.workflows.naming import reconcile_workflow_id

GIB = 1024**3
CLUSTER = "idle"
NAMESPACE = "default"
# targets per idle cluster-hour (issue #12)
MAX_EVENTS_PER_HOUR = 400
MAX_ACTIONS_PER_HOUR = 60  # activities + timers + signals
MAX_CONTINUES_PER_HOUR = 1
MAX_STATE_READS_PER_S = 2.0


def raycluster() -> dict[str, Any]:
    return small_raycluster(CLUSTER, workers=1, max_workers=2)


@dataclass
class HistoryCount:
    events: int = 0
    activities: int = 0
    timers: int = 0
    signals: int = 0
    continues: int = 0

    @property
    def actions(self) -> int:
        return self.activities + self.timers + self.signals


async def count_history(temporal: Client, wf_id: str, since: float, until: float) -> HistoryCount:
    """Events of every run of `wf_id` stamped in [since, until] (epoch seconds)."""
    out = HistoryCount()
    async for wf in temporal.list_workflows(f"WorkflowId = '{wf_id}'"):
        history = await temporal.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for e in history.events:
            at = e.event_time.ToMicroseconds() / 1e6
            if not since <= at <= until:
                continue
            out.events += 1
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                out.activities += 1
            elif e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
                out.timers += 1
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                out.signals += 1
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                out.continues += 1
    return out


def metric_total(text: str, name: str, labels: tuple[str, ...] = ()) -> float:
    """Sum of a Prometheus counter's samples in a /metrics page: every label set, or only
    those whose labels hold each of `labels` (text such as 'service_name="history"')."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric in (name, f"{name}_total") and all(label in head for label in labels):
            total += float(value)
    return total


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "MISSED"


async def run(minutes: float, warmup_s: float, tmp: Path) -> int:
    env = await start_dev_server()
    sandbox = Sandbox(
        SandboxConfig(node_specs=[NodeSpec("node-a", 8000, 32 * GIB)], with_ray=True)
    ).start()
    worker: subprocess.Popen[bytes] | None = None
    try:
        kubeconfig = sandbox.write_kubeconfig(tmp / "kubeconfig")
        metrics_port = free_port()
        worker = start_raysize_worker(
            tmp / "worker.log",
            env.client.service_client.config.target_host,
            f"idle-{uuid.uuid4().hex[:6]}",
            kubeconfig,
            namespaces=NAMESPACE,
            prometheus_bind=f"127.0.0.1:{metrics_port}",
        )
        create_raycluster(kubeconfig)
        wf_id = reconcile_workflow_id(NAMESPACE, CLUSTER)
        print(f"waiting for {wf_id} and Ray, then {warmup_s:.0f}s of warm-up …", flush=True)
        await _until_running(env.client, wf_id)
        await asyncio.sleep(warmup_s)
        await check_managed(env.client, wf_id)
        since, reads0, cpu0 = (
            time.time(),
            metric_total(scrape(metrics_port), RAY_STATE_READS),
            (cpu_seconds(worker.pid)),
        )
        load0 = os.getloadavg()[0]
        print(f"idle for {minutes:g} min …", flush=True)
        await asyncio.sleep(minutes * 60)
        until = time.time()
        reads1 = metric_total(scrape(metrics_port), RAY_STATE_READS)
        cpu1, rss = cpu_seconds(worker.pid), rss_mib(worker.pid)
        load1 = os.getloadavg()[0]
        count = await count_history(env.client, wf_id, since, until)
    finally:
        if worker is not None:
            stop_group(worker)
        await asyncio.to_thread(sandbox.close)
        await env.shutdown()
    hours = (until - since) / 3600
    per_hour = {
        "history events": (count.events / hours, MAX_EVENTS_PER_HOUR),
        "activities + timers + signals": (count.actions / hours, MAX_ACTIONS_PER_HOUR),
        "continue-as-new": (count.continues / hours, MAX_CONTINUES_PER_HOUR),
    }
    reads_s = (reads1 - reads0) / (until - since)
    print(
        f"idle {until - since:.0f}s, load average {load0:.2f} → {load1:.2f} "
        f"({os.cpu_count()} cores); counted: {count.events} events, {count.activities} "
        f"activities, {count.timers} timers, {count.signals} signals, {count.continues} "
        f"continue-as-new, {reads1 - reads0:.0f} GCS state reads"
    )
    ok = True
    for what, (value, target) in per_hour.items():
        print(
            f"  {what} per idle cluster-hour: {value:.0f} (target ≤ {target}) "
            f"{verdict(value, target)}"
        )
        ok &= value <= target
    print(
        f"  GCS state reads per second: {reads_s:.2f} (target ≤ {MAX_STATE_READS_PER_S}) "
        f"{verdict(reads_s, MAX_STATE_READS_PER_S)}"
    )
    ok &= reads_s <= MAX_STATE_READS_PER_S
    print(
        f"  worker CPU while idle: {100 * (cpu1 - cpu0) / (until - since):.2f}% of one core; "
        f"RSS {rss:.0f} MiB"
    )
    print("verdict:", "all targets met" if ok else "some targets MISSED")
    return 0 if ok else 1


def create_raycluster(kubeconfig: Path) -> None:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "ray.io", "v1", NAMESPACE, "rayclusters", raycluster()
    )
    api.close()


async def check_managed(temporal: Client, wf_id: str) -> None:
    """The figures are those of a cluster raysize acts on: not one it stands by for (a
    config error, Ray's own autoscaler), which reads nothing from Ray at all."""
    status = await temporal.get_workflow_handle(wf_id).query("status", result_type=ReconcileStatus)
    if status.config_errors or status.stood_down or status.last_error:
        raise SystemExit(
            f"{wf_id} is not acting: config errors {status.config_errors}, stood down "
            f"{status.stood_down}, last error {status.last_error!r}"
        )


async def _until_running(temporal: Client, wf_id: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            desc = await temporal.get_workflow_handle(wf_id).describe()
            if desc.status is not None and desc.status.name == "RUNNING":
                return
        except Exception:
            pass
        await asyncio.sleep(1)
    raise SystemExit(f"{wf_id} did not start within {timeout_s:.0f}s: is the worker up?")


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description="what an idle RayCluster costs raysize")
    parser.add_argument("--minutes", type=float, default=10.0, help="idle time measured")
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="seconds to settle before measuring"
    )
    args = parser.parse_args()
    if args.minutes <= 0 or args.warmup < 0:
        parser.error("--minutes must be > 0 and --warmup ≥ 0")
    with tempfile.TemporaryDirectory(prefix="rsidle") as tmp:
        sys.exit(asyncio.run(run(args.minutes, args.warmup, Path(tmp))))


if __name__ == "__main__":
    main()
