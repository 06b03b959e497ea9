"""raysize under faults: a real workload while everything around it breaks.

    python -m bench.chaos_bench [--runs 5] [--waves 2] [--seed 1]

Per run: a Temporal dev server whose state is on disk, the sandbox Kubernetes (four
8-CPU nodes) with real Ray processes, a `raysize worker` process, and a RayCluster of 3
workers of 1 CPU that may grow to 4 (and scale out to 6). A Ray driver runs `--waves`
waves of 12 tasks of {CPU: 2} and a SPREAD placement group of 2 × {CPU: 2}, with idle
time between waves (grown pods shrink back). Meanwhile:

- pods/resize patches fail 20 % of the time (409, 429, 500) and every API call is slowed;
- the worker is SIGKILLed at random moments (and started again at once);
- the Temporal server is stopped and started once (its state kept on disk);
- a pod's Raylet is killed while a resize of it runs.

Once the workload is done the faults stop, and the run checks, until all hold or three
minutes pass: every worker pod's spec == actuated size == its Raylet's total; nothing
above the group's maximum; no resize workflow left running; the workload finished. It
prints each violation, the resizes and scale-outs, and the time to converge after the
last fault. Target: 0 violations over 5 runs. Every process is stopped by its group.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.clusters import small_raycluster
from bench.procs import start_raysize_worker, stop_on_sigterm
from raysize.activities.k8s_objects import gcs_address
from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.faults import FaultRule
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.localray import stop_group
from raysize.sandbox.ports import free_port
from raysize.workflows.contracts import ResizeSagaState
from raysize.workflows.naming import RESIZE_OUTCOME, SEARCH_ATTRIBUTES

GIB = 1024**3
NAMESPACE = "default"
CLUSTER = "chaos"
MAX_CPU = 4000
CONVERGE_S = 180.0
DRIVER = textwrap.dedent(
    """
    import sys, time, ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)

    @ray.remote(num_cpus=2, max_retries=5)
    def work(i):
        time.sleep(2)
        return i

    for wave in range(int(sys.argv[2])):
        refs = [work.remote(i) for i in range(12)]
        pg = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="SPREAD")
        ray.get(pg.ready(), timeout=600)
        in_pg = [
            work.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=b
                )
            ).remote(100 + b)
            for b in range(2)
        ]
        done = ray.get(refs + in_pg, timeout=900)
        assert sorted(done) == list(range(12)) + [100, 101], done
        ray.util.remove_placement_group(pg)
        print(f"wave {wave} done", flush=True)
        time.sleep(15)  # idle: grown pods shrink back before the next wave
    print("workload done", flush=True)
    """
)


@dataclass
class Run:
    faults: list[str] = field(default_factory=list)
    last_fault: float = 0.0
    violations: list[str] = field(default_factory=list)
    resizes: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    converged_s: float | None = None
    notes: list[str] = field(default_factory=list)  # why resizes did not succeed

    def fault(self, what: str) -> None:
        self.faults.append(what)
        self.last_fault = time.monotonic()
        print(f"  fault: {what}", flush=True)


class TemporalServer:
    """`temporal server start-dev` with its state in a file, so a restart keeps it."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.db, self.tmp = free_port(), tmp / "temporal.db", tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        args = [
            str(Path(sys.executable).with_name("temporal")), "server", "start-dev",
            "--headless", "--ip", "127.0.0.1", "--port", str(self.port),
            "--db-filename", str(self.db), "--log-level", "error",
        ]  # fmt: skip
        for key in SEARCH_ATTRIBUTES:
            args += ["--search-attribute", f"{key.name}=Keyword"]
        log = (self.tmp / "temporal.log").open("ab")
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                await Client.connect(self.address, data_converter=pydantic_data_converter)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise SystemExit("the Temporal dev server did not start in 60 s") from None
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None


def start_worker(temporal: str, kubeconfig: Path, queue: str, tmp: Path) -> subprocess.Popen[bytes]:
    return start_raysize_worker(
        tmp / "worker.log",
        temporal,
        queue,
        kubeconfig,
        namespaces=NAMESPACE,
        discovery_interval_s="2",
        idle_timeout_s="5",
    )


def cpu_of(p: client.V1Pod) -> tuple[int, int | None]:
    """(spec CPU, actuated CPU) of the Ray container, in millicores."""

    def milli(q: str | None) -> int | None:
        if q is None:
            return None
        return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)

    assert p.spec is not None
    resources = p.spec.containers[0].resources
    assert resources is not None
    spec = milli((resources.limits or {}).get("cpu")) or 0
    statuses = (p.status.container_statuses or []) if p.status else []
    actual = None
    if statuses and statuses[0].resources is not None:
        actual = milli((statuses[0].resources.limits or {}).get("cpu"))
    return spec, actual


async def check(core: client.CoreV1Api, temporal: Client, queue: str, gcs: str) -> list[str]:
    """Every invariant that does not hold now."""
    out = []
    pods = core.list_namespaced_pod(
        NAMESPACE, label_selector=f"ray.io/cluster={CLUSTER},ray.io/node-type=worker"
    ).items
    try:
        with RayGcsClient(gcs, timeout=5) as ray:
            totals = {n.pod: n.total.cpu for n in ray.cluster_state().nodes if n.alive}
    except Exception as exc:
        return [f"Ray's GCS does not answer: {exc}"]
    for p in pods:
        assert p.metadata is not None
        if p.metadata.deletion_timestamp or (p.status and p.status.phase != "Running"):
            continue
        name = p.metadata.name
        assert name is not None  # the API server names every pod it lists
        spec, actual = cpu_of(p)
        raylet = totals.get(name)
        if not (spec == actual == raylet):
            out.append(f"{name}: spec {spec}m, actuated {actual}m, Raylet {raylet}m differ")
        if spec > MAX_CPU:
            out.append(f"{name}: spec {spec}m is above the maximum {MAX_CPU}m")
    running = [
        wf.id
        async for wf in temporal.list_workflows(
            f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow' "
            "AND ExecutionStatus='Running'"
        )
    ]
    if running:
        out.append(f"resize workflows still running with nothing to do: {sorted(running)}")
    return out


async def one_run(number: int, waves: int, rng: random.Random, tmp: Path) -> Run:
    run = Run()
    server = TemporalServer(tmp)
    await server.start()
    sandbox = Sandbox(
        SandboxConfig(
            node_specs=[NodeSpec(f"node-{i}", 8000, 32 * GIB) for i in range(4)],
            with_ray=True,
            timing=KubeletTiming(actuation_delay_s=0.2),
        )
    ).start()
    worker: subprocess.Popen[bytes] | None = None
    driver: subprocess.Popen[str] | None = None
    queue = f"chaos-{uuid.uuid4().hex[:6]}"
    try:
        kubeconfig = sandbox.write_kubeconfig(tmp / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        rc = small_raycluster(CLUSTER, workers=3, max_workers=6, resize_timeout_s=30)
        custom.create_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayclusters", rc)
        worker = start_worker(server.address, kubeconfig, queue, tmp)
        gcs = ""
        while not gcs:
            gcs = gcs_address(
                cast(
                    dict[str, Any],
                    custom.get_namespaced_custom_object(
                        "ray.io", "v1", NAMESPACE, "rayclusters", CLUSTER
                    ),
                )
            )
            await asyncio.sleep(0.5)
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, gcs, str(waves)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        faults = sandbox.faults.add(
            FaultRule(verb="patch", resource="pods/resize", error_rate=0.2, codes=(409, 429, 500))
        )
        slow = sandbox.faults.add(FaultRule(latency_s=0.05))
        temporal = await Client.connect(server.address, data_converter=pydantic_data_converter)
        started = time.monotonic()
        next_kill = started + rng.uniform(8, 20)
        restart_at = started + rng.uniform(25, 45)
        raylet_killed = False
        while driver.poll() is None:
            now = time.monotonic()
            if now - started > 900:
                run.violations.append("the workload did not finish in 15 minutes")
                break
            if now >= next_kill:
                assert worker is not None
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
                worker = start_worker(server.address, kubeconfig, queue, tmp)
                run.fault("worker SIGKILLed and started again")
                next_kill = now + rng.uniform(10, 30)
            if restart_at and now >= restart_at:
                server.stop()
                await asyncio.sleep(2)
                await server.start()
                temporal = await Client.connect(
                    server.address, data_converter=pydantic_data_converter
                )
                run.fault("Temporal server stopped and started (state on disk)")
                restart_at = 0
            if not raylet_killed:
                try:
                    busy = [
                        wf.id
                        async for wf in temporal.list_workflows(
                            f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow' "
                            "AND ExecutionStatus='Running'"
                        )
                    ]
                except Exception:
                    busy = []
                if busy:
                    pod = busy[0].rsplit("/", 1)[-1]
                    try:
                        assert sandbox.ray is not None
                        sandbox.ray.kill(NAMESPACE, pod)
                        raylet_killed = True
                        run.fault(f"the Raylet of {pod} killed while it was being resized")
                    except LookupError:
                        pass
            await asyncio.sleep(0.5)
        out, err = driver.communicate(timeout=30)
        if driver.returncode != 0 or "workload done" not in out:
            run.violations.append(f"the workload failed (rc {driver.returncode}): {err[-500:]}")
        sandbox.faults.clear()
        del faults, slow
        run.last_fault = max(run.last_fault, time.monotonic())
        problems: list[str] = []
        while time.monotonic() - run.last_fault < CONVERGE_S:
            problems = await check(core, temporal, queue, gcs)
            if not problems:
                run.converged_s = time.monotonic() - run.last_fault
                break
            await asyncio.sleep(2)
        run.violations += problems
        async for wf in temporal.list_workflows(
            f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow'"
        ):
            run.resizes += 1
            outcome = wf.typed_search_attributes.get(RESIZE_OUTCOME) or "?"
            run.outcomes[outcome] = run.outcomes.get(outcome, 0) + 1
            if outcome not in ("Succeeded", "?") and len(run.notes) < 8:
                try:
                    state = await temporal.get_workflow_handle(
                        wf.id, run_id=wf.run_id, result_type=ResizeSagaState
                    ).result()
                    run.notes.append(f"{wf.id} {outcome}: {state.detail}")
                except Exception as exc:
                    run.notes.append(f"{wf.id} {outcome}: {exc}")
        api.close()
    finally:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(10)
        if worker is not None:
            stop_group(worker)
        await asyncio.to_thread(sandbox.close)
        server.stop()
    return run


async def main_async(runs: int, waves: int, seed: int) -> int:
    total = 0
    for n in range(runs):
        rng = random.Random(seed + n)
        with tempfile.TemporaryDirectory(prefix="rschaos") as tmp:
            print(f"run {n + 1}/{runs} (seed {seed + n}):", flush=True)
            run = await one_run(n, waves, rng, Path(tmp))
        total += len(run.violations)
        took = f"{run.converged_s:.1f}s" if run.converged_s is not None else "did not converge"
        print(
            f"run {n + 1}: {len(run.faults)} faults, {run.resizes} resizes "
            f"{dict(sorted(run.outcomes.items()))}, converged {took} after the last fault, "
            f"{len(run.violations)} violations",
            flush=True,
        )
        for note in run.notes:
            print(f"  {note}", flush=True)
        for v in run.violations:
            print(f"  VIOLATION {v}", flush=True)
    print(f"verdict: {total} violations over {runs} runs (target 0)")
    return 0 if total == 0 else 1


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description="raysize under faults")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--waves", type=int, default=2, help="waves of the workload per run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.runs < 1 or args.waves < 1:
        parser.error("--runs and --waves must be ≥ 1")
    sys.exit(asyncio.run(main_async(args.runs, args.waves, args.seed)))


if __name__ == "__main__":
    main()
