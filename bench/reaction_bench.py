"""Reaction time: a pending Ray demand → its pod grown and the Raylet resized.

    python -m bench.reaction_bench [--trials 50] [--quiet 30]

A real Temporal dev server, the sandbox Kubernetes with real Ray processes (kubelet
actuating at once), and a raysize worker. One long-lived Ray driver submits, per trial, a
task that needs more CPUs than its pod has; the clock runs from the submission until the
GCS reports the Raylet at the new size. The pod is idle right after (idle timeout 1 s), so
raysize shrinks it back before the next trial.

Targets: p50 < 1 s, p99 < 3 s from the moment Ray reports the pending demand (before that
there is nothing to react to) to the Raylet resized — the Raylet's own reply to raysize's
resize, read from the workflow history. Printed apart: when the task starts running
(what a user sees), when the GCS's node table shows the new total (it lags by Ray's
~1 s resource pull period), and Ray's own delay from submission to reporting the demand
(the same ~1 s period: the GCS pulls resource loads from the Raylets once a second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from temporalio.api.common.v1 import Payloads
from temporalio.client import Client

from bench.clusters import small_raycluster
from bench.procs import start_dev_server, stop_on_sigterm
from raysize.activities.k8s_objects import gcs_address
from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.worker.run import run_worker
from raysize.worker.settings import Settings
from raysize.workflows.contracts import Act

GIB = 1024**3
DRIVER = textwrap.dedent(
    """
    import sys, time, ray
    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)

    @ray.remote
    def work():
        started = time.time()
        time.sleep(0.3)
        return started

    print("ready", flush=True)
    for line in sys.stdin:
        cpus = float(line)
        t = time.time()
        ref = work.options(num_cpus=cpus).remote()
        print(f"submitted {t}", flush=True)
        print(f"done {ray.get(ref)}", flush=True)
    """
)


def raycluster() -> dict[str, Any]:
    # the pod shrinks back a second after each trial, ready for the next
    return small_raycluster("react", resize_timeout_s=30, idle_timeout_s=1)


@dataclass
class Trial:
    cpus: int
    submitted: float  # wall-clock times
    demand_seen: float  # Ray's GCS first reports the pending demand
    total_in_gcs: float  # the GCS's node table shows the new total (it lags ~1 s)
    task_started: float  # the task runs (on the grown Raylet)
    raylet_resized: float = 0.0  # the Raylet's reply to raysize (from the history)
    steps: str = ""


async def report(temporal: Client, trials: list[Trial], timeline: bool) -> None:
    """Match each trial with its resize workflow run; print the figures (and, with
    --timeline, where each trial's time went)."""
    runs = []
    async for wf in temporal.list_workflows("RayCluster='react'"):
        if wf.id.startswith("resize/"):
            history = await temporal.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
            runs.append((wf.start_time.timestamp(), history))
    runs.sort(key=lambda r: r[0])
    for t in trials:
        for start, history in runs:
            if not t.demand_seen - 1 <= start <= t.total_in_gcs:
                continue
            names: dict[int, str] = {}
            steps = [f"started+{start - t.demand_seen:.2f}"]
            for e in history.events:
                at = e.event_time.ToDatetime().replace(tzinfo=UTC).timestamp()
                if e.HasField("activity_task_scheduled_event_attributes"):
                    names[e.event_id] = (
                        e.activity_task_scheduled_event_attributes.activity_type.name
                    )
                elif e.HasField("activity_task_completed_event_attributes"):
                    done = e.activity_task_completed_event_attributes
                    name = names[done.scheduled_event_id]
                    steps.append(f"{name}+{at - t.demand_seen:.2f}")
                    if not t.raylet_resized and brought_the_raylet_up(name, done.result):
                        t.raylet_resized = at
            t.steps = " ".join(steps)
            break
    resized = sorted(t.raylet_resized - t.demand_seen for t in trials if t.raylet_resized)
    ran = sorted(t.task_started - t.demand_seen for t in trials)
    gcs = sorted(t.total_in_gcs - t.demand_seen for t in trials)
    ray_report = sorted(t.demand_seen - t.submitted for t in trials)
    submission = sorted(t.task_started - t.submitted for t in trials)
    print(
        f"trials={len(trials)} matched={len(resized)} | demand reported → "
        f"Raylet resized p50={median(resized):.3f}s p99={p99(resized):.3f}s; "
        f"task running p50={median(ran):.3f}s p99={p99(ran):.3f}s; "
        f"new total in the GCS node table p50={median(gcs):.3f}s | "
        f"Ray's own submission → demand reported p50={median(ray_report):.3f}s; "
        f"submission → task running p50={median(submission):.3f}s p99={p99(submission):.3f}s"
    )
    if timeline:
        for t in trials:
            print(
                f"  {t.cpus} CPU: task running +{t.task_started - t.demand_seen:.2f}s | {t.steps}"
            )


def brought_the_raylet_up(activity: str, result: Payloads) -> bool:
    """Whether this completed activity is the one that resized the Raylet: finish_resize,
    or an apply that did its work (on the happy path: `ApplyResizeResult.finished`)."""
    if activity == Act.FINISH_RESIZE:
        return True
    if activity != Act.APPLY_RESIZE or not result.payloads:
        return False
    return json.loads(result.payloads[0].data).get("finished") is not None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def run(
    trials: int,
    tmp: Path,
    timeline: bool = False,
    quiet_s: float = 0.0,
    warmup: tuple[int, float] = (0, 0.0),
) -> None:
    env = await start_dev_server()
    sandbox = Sandbox(
        SandboxConfig(
            node_specs=[NodeSpec("node-a", 8000, 32 * GIB)],
            with_ray=True,
            timing=KubeletTiming(actuation_delay_s=0.0),
        )
    ).start()
    stop = asyncio.Event()
    worker: asyncio.Task[None] | None = None
    try:
        kubeconfig = sandbox.write_kubeconfig(tmp / "kubeconfig")
        custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
        settings = Settings(
            temporal_address=env.client.service_client.config.target_host,
            task_queue=f"react-{uuid.uuid4().hex[:6]}",
            kubeconfig=kubeconfig,
            namespaces="default",
            discovery_interval_s=0.5,
        )
        worker = asyncio.create_task(run_worker(settings, stop=stop))
        custom.create_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", raycluster()
        )
        gcs = ""
        while not gcs:
            rc = cast(
                dict[str, Any],
                custom.get_namespaced_custom_object(
                    "ray.io", "v1", "default", "rayclusters", "react"
                ),
            )
            gcs = gcs_address(rc)
            await asyncio.sleep(0.2)
        if warmup[0]:
            # a cluster that has worked before its quiet spell: raysize has seen Ray's
            # demand publications (gcs_cadence); these trials are not reported
            print(f"warm-up: {warmup[0]} trials, {warmup[1]:g} s apart …", flush=True)
            await run_trials(gcs, warmup[0], warmup[1])
        trials_seen = await run_trials(gcs, trials, quiet_s)
        await report(env.client, trials_seen, timeline)
    finally:
        stop.set()
        if worker is not None:
            try:
                await asyncio.wait_for(worker, 30)
            except Exception:
                worker.cancel()
        await asyncio.to_thread(sandbox.close)
        await env.shutdown()


async def run_trials(gcs: str, trials: int, quiet_s: float = 0.0) -> list[Trial]:
    """Per trial, a task of 2, 3 or 4 CPUs for the one 1-CPU worker (the driver runs
    `DRIVER`), timed from Ray's GCS; `quiet_s` of idleness before each."""
    ray = RayGcsClient(gcs, timeout=5)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, gcs],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )

    def observe() -> tuple[int, bool]:
        """(the worker Raylet's CPU total, whether Ray reports a pending demand)"""
        try:
            state = ray.cluster_state()
        except Exception:
            return 0, False
        cpu = max((n.total.cpu for n in state.nodes if n.group == "small"), default=0)
        return cpu, bool(state.demands)

    try:
        assert driver.stdin is not None and driver.stdout is not None
        while observe()[0] != 1000:
            await asyncio.sleep(0.2)
        assert (await asyncio.to_thread(driver.stdout.readline)).strip() == "ready"
        seen_trials: list[Trial] = []
        for trial in range(trials):
            cpus = 2 + trial % 3  # 2, 3 or 4 CPUs: always more than the pod has
            while observe()[0] != 1000:  # shrunk back after the last trial
                await asyncio.sleep(0.05)
            if quiet_s:  # the cluster idle first: raysize's wait has slowed its Ray reads
                await asyncio.sleep(quiet_s)
            driver.stdin.write(f"{cpus}\n")
            driver.stdin.flush()
            line = await asyncio.to_thread(driver.stdout.readline)
            submitted = float(line.split()[1])
            seen = None
            while True:
                cpu, pending = observe()
                if pending and seen is None:
                    seen = time.time()
                if cpu >= cpus * 1000:
                    break
                await asyncio.sleep(0.01)
            in_gcs = time.time()
            done = (await asyncio.to_thread(driver.stdout.readline)).split()
            assert done[0] == "done", done
            seen_trials.append(Trial(cpus, submitted, seen or in_gcs, in_gcs, float(done[1])))
        return seen_trials
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
        ray.close()


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description="raysize reaction time")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument(
        "--timeline", action="store_true", help="print where each trial's time went"
    )
    parser.add_argument(
        "--quiet",
        type=float,
        default=0.0,
        help="seconds the cluster stays idle before each trial (e.g. 30: once quiet for "
        "5 s, raysize's wait reads Ray once a second, just after the GCS publishes demands, "
        "or every 0.55 s until it has learned when; the default 0 measures a busy cluster)",
    )
    parser.add_argument(
        "--warmup-trials",
        type=int,
        default=0,
        help="unreported trials first, --warmup-quiet s apart: the cluster has worked "
        "before its quiet spells (with --quiet 600: idle ten minutes after some work)",
    )
    parser.add_argument("--warmup-quiet", type=float, default=20.0)
    args = parser.parse_args()
    if args.trials < 1 or args.quiet < 0 or args.warmup_trials < 0 or args.warmup_quiet < 0:
        parser.error("--trials must be ≥ 1, and --quiet, --warmup-trials, --warmup-quiet ≥ 0")
    with tempfile.TemporaryDirectory(prefix="rsreact") as tmp:
        asyncio.run(
            run(
                args.trials,
                Path(tmp),
                args.timeline,
                args.quiet,
                (args.warmup_trials, args.warmup_quiet),
            )
        )


if __name__ == "__main__":
    main()
