"""Orchestration throughput: N concurrent pod resizes through raysize's real saga.

    python -m bench.orchestration_bench [--resizes 1000]

A real Temporal dev server, the sandbox Kubernetes (its own process, kubelet actuating at
once), one `raysize worker` process, and — for this benchmark only — the GCS stand-in
(`sandbox/gcs_standin.py`) in place of a thousand Raylets. Prints the wall time from the
first start to the last result, the worker's peak RSS, and the history length of one
happy-path resize. Targets: 1,000 resizes < 60 s, RSS < 300 MB, ≤ 40 events.
Every process it starts is stopped by its own process group, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes import client, config
from temporalio.client import Client

from bench.procs import ONE_PARTITION, start_dev_server, stop_on_sigterm
from bench.sandbox_bench import raw
from raysize.sandbox.gcs_standin import GcsStandIn
from raysize.sandbox.ports import free_port
from raysize.workflows.contracts import ResizeOutcome, ResizeRequest
from raysize.workflows.naming import resize_search_attributes
from raysize.workflows.resize_workflow import PodResizeWorkflow

GIB = 1024**3


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> dict[str, float]:
    """CPU seconds of each direct child of this process, by program name."""
    out: dict[str, float] = {}
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if text.rsplit(")", 1)[1].split()[1] == me:
            pid = int(stat.parent.name)
            out[f"{name}[{pid}]"] = cpu_seconds(pid)
    return out


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def actuated_cpu(p: client.V1Pod) -> str | None:
    """The CPU limit the kubelet reports for the pod's container, None until it reports one."""
    statuses = p.status.container_statuses if p.status else None
    if not statuses:
        return None
    resources = statuses[0].resources
    if resources is None or not resources.limits:  # the head: no limits
        return None
    return resources.limits.get("cpu")


# only a head: the benchmark's own pods are not KubeRay's (no group of theirs is in it)
BENCH_CLUSTER = {
    "apiVersion": "ray.io/v1",
    "kind": "RayCluster",
    "metadata": {"name": "bench", "namespace": "default"},
    "spec": {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray-head",
                            "image": "rayproject/ray:2.60.0",
                            "resources": {"requests": {"cpu": "0", "memory": "1Gi"}},
                        }
                    ]
                }
            },
        },
    },
}


def pod(i: int) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"bench-{i:04d}",
            "labels": {"ray.io/cluster": "bench", "ray.io/group": "small"},
        },
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "rayproject/ray:2.60.0",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                    "resizePolicy": [
                        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                        {"resourceName": "memory", "restartPolicy": "NotRequired"},
                    ],
                }
            ]
        },
    }


async def run(n: int, tmp: Path) -> None:
    kubeconfig = tmp / "kubeconfig"
    sandbox = subprocess.Popen(
        # 250 pods per node, each node with room for all of them to double
        [sys.executable, "-m", "raysize.worker.cli", "sandbox", "up", "--nodes", str(-(-n // 250)),
         "--node-cpu", "1000", "--node-memory", "4Ti", "--max-pods", "250",
         "--actuation-delay", "0",
         "--port", str(free_port()), "--kubeconfig", str(kubeconfig)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    worker: subprocess.Popen[bytes] | None = None
    env = await start_dev_server(
        *ONE_PARTITION,
        # an activity scheduled by a workflow task goes straight back to that worker
        "--dynamic-config-value", "system.enableActivityEagerExecution=true",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            if sandbox.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the sandbox did not start")
            await asyncio.sleep(0.05)
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        # the pods' RayCluster: a saga reads it for the cluster's GCS address and Ray token
        # (a resize of a cluster that is gone ends PodGone, as every one here did without it)
        client.CustomObjectsApi(core.api_client).create_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", BENCH_CLUSTER
        )
        for i in range(n):
            # the V1Pod the client's argument validation would build from the dict anyway
            body = client.V1Pod.model_validate(pod(i))
            raw(core.create_namespaced_pod("default", body, _preload_content=False))
        while (
            sum(
                1
                for p in core.list_namespaced_pod("default").items
                if p.status and p.status.phase == "Running"
            )
            < n
        ):
            await asyncio.sleep(0.2)

        with GcsStandIn() as gcs:
            queue = f"bench-{uuid.uuid4().hex[:6]}"
            log = (tmp / "worker.log").open("wb")
            worker = subprocess.Popen(
                [sys.executable, "-m", "raysize.worker.cli", "worker", "--log-level", "WARNING"],
                env={
                    **os.environ,
                    "RAYSIZE_TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                    "RAYSIZE_TASK_QUEUE": queue,
                    "RAYSIZE_KUBECONFIG": str(kubeconfig),
                    "RAYSIZE_DISCOVER": "false",
                    "RAYSIZE_GCS_ADDRESS": gcs.address,
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            profiler = None
            if os.environ.get("BENCH_PROFILE_WORKER"):  # py-spy collapsed stacks of the worker
                profiler = subprocess.Popen(
                    ["py-spy", "record", "--pid", str(worker.pid), "--format", "raw",
                     "--rate", "200", "-o", os.environ["BENCH_PROFILE_WORKER"]],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            requests = [
                ResizeRequest(
                    namespace="default",
                    cluster="bench",
                    pod=f"bench-{i:04d}",
                    group="small",
                    node_id=f"{i + 1:056x}",
                    from_cpu=1000,
                    from_memory=GIB,
                    cpu=2000,
                    memory=2 * GIB,
                    timeout_s=120,
                    reason="benchmark",
                )
                for i in range(n)
            ]
            started = time.perf_counter()
            limit = asyncio.Semaphore(100)

            async def start(req: ResizeRequest) -> None:
                # started as the reconcile workflow starts them: who it is about is set
                async with limit:
                    await env.client.start_workflow(
                        PodResizeWorkflow.run,
                        req,
                        id=f"resize/default/{req.pod}",
                        task_queue=queue,
                        search_attributes=resize_search_attributes(req),
                    )

            await asyncio.gather(*(start(r) for r in requests))
            # like an operator, watch the count (a result long-poll per workflow would
            # load the server more than raysize itself does)
            query = f"TaskQueue='{queue}' AND ExecutionStatus!='Running'"
            while (await env.client.count_workflows(query)).count < n:
                await asyncio.sleep(0.25)
            elapsed = time.perf_counter() - started
            rss = peak_rss_mb(worker.pid)
            cpu = children_cpu()
            if profiler is not None:
                stop(profiler)
            cpu["bench"] = cpu_seconds(os.getpid())
            history = await env.client.get_workflow_handle(
                "resize/default/bench-0000"
            ).fetch_history()
            ok = (
                await env.client.count_workflows(
                    f"TaskQueue='{queue}' AND ResizeOutcome='{ResizeOutcome.SUCCEEDED.value}'"
                )
            ).count
            took = sorted(
                [
                    (w.close_time - w.start_time).total_seconds()
                    async for w in env.client.list_workflows(f"TaskQueue='{queue}'")
                    if w.close_time is not None
                ]
            )
            if took:
                print(
                    f"resize_seconds p50={took[len(took) // 2]:.1f} "
                    f"p90={took[len(took) * 9 // 10]:.1f} max={took[-1]:.1f}"
                )
            print(await first_resize_steps(env.client))
            resized = sum(
                1 for p in core.list_namespaced_pod("default").items if actuated_cpu(p) == "2"
            )
            print(
                f"resizes={n} succeeded={ok} seconds={elapsed:.1f} per_second={n / elapsed:.1f} "
                f"worker_peak_rss_mb={rss:.0f} events_per_resize={len(history.events)} "
                f"pods_resized={resized} raylets_resized={gcs.resizes}"
            )
            print("cpu_seconds " + " ".join(f"{k}={v:.1f}" for k, v in sorted(cpu.items())))
    finally:
        if worker is not None:
            stop(worker)
        stop(sandbox)
        await env.shutdown()


async def first_resize_steps(temporal: Client) -> str:
    """How long each activity of the first resize waited to start and ran."""
    history = await temporal.get_workflow_handle("resize/default/bench-0000").fetch_history()
    scheduled: dict[int, tuple[str, float]] = {}
    started: dict[int, float] = {}
    steps = []
    for e in history.events:
        t = e.event_time.ToDatetime().timestamp()
        if e.HasField("activity_task_scheduled_event_attributes"):
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = (name, t)
        elif e.HasField("activity_task_started_event_attributes"):
            started[e.activity_task_started_event_attributes.scheduled_event_id] = t
        elif e.HasField("activity_task_completed_event_attributes"):
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            name, at = scheduled[sid]
            steps.append(f"{name}: queued {started[sid] - at:.2f}s ran {t - started[sid]:.2f}s")
    return "first resize: " + "; ".join(steps)


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description="raysize orchestration throughput")
    parser.add_argument("--resizes", type=int, default=1000, help="concurrent pod resizes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rsbench") as tmp:
        asyncio.run(run(args.resizes, Path(tmp)))


if __name__ == "__main__":
    main()
