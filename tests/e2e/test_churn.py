"""Churn (issue #26): waves of short `{CPU: 1}` tasks with `max_retries=0`, the gaps
between them around the cluster's 2 s idle timeout, so raysize keeps removing and adding
workers while work arrives. Nothing raysize does may kill a task: a pod goes only after
Ray accepted to drain its Raylet, and KubeRay never deletes a pod raysize did not name.

In both worlds (the real one with the real KubeRay operator), once as is, and once with
RayCluster writes failing and the worker SIGKILLed between an accepted drain and the write
that names the pod."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes import watch
from temporalio.testing import WorkflowEnvironment

from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.faults import FaultRule
from raysize.sandbox.kubelet import KubeletTiming

from .conftest import (
    Stack,
    eventually,
    ippr_cluster,
    kill,
    process_world,
    start_worker,
    stop_driver,
)

IDLE_TIMEOUT_S = 2
# (tasks, seconds each task holds its CPU, seconds until the next wave): gaps just under,
# at and over the idle timeout, so an idle worker is drained as work comes back
WAVES = [
    (count, hold, gap)
    for count, hold, gap in zip(
        [2, 1, 3, 1, 2, 4, 1, 2, 1, 3, 2, 1],
        [0.5, 1.0, 0.3, 1.5, 0.5, 0.8, 0.3, 1.0, 0.5, 0.4, 1.2, 0.6],
        [1.5, 2.5, 1.8, 3.0, 2.2, 4.0, 1.9, 2.6, 3.5, 2.0, 2.4, 0.0],
        strict=True,
    )
]

CHURN = """
import json, sys, time
import ray

ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)

@ray.remote(num_cpus=1, max_retries=0)
def work(hold_s):
    time.sleep(hold_s)
    return ray.get_runtime_context().get_node_id()

ran, failed, errors, nodes = 0, 0, [], set()
for count, hold, gap in json.loads(sys.argv[2]):
    refs = [work.remote(hold) for _ in range(count)]
    for ref in refs:
        try:
            nodes.add(ray.get(ref, timeout=150))
            ran += 1
        except Exception as exc:  # NodeDiedError, WorkerCrashedError: what must not happen
            failed += 1
            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
    print(json.dumps({"ran": ran, "failed": failed}), flush=True)
    time.sleep(gap)
print(json.dumps({"ran": ran, "failed": failed, "errors": errors[:5], "nodes": len(nodes)}))
"""


@dataclass
class Watcher:
    """Every worker pod and every name the RayCluster's workersToDelete held, from a
    watch of each (so a name listed for a moment is not missed)."""

    stack: Stack
    name: str
    named: set[str] = field(default_factory=set)
    pods: dict[str, str] = field(default_factory=dict)  # every worker pod seen: name → uid
    stop: threading.Event = field(default_factory=threading.Event)

    def _raycluster(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                for ev in watch.Watch().stream(
                    self.stack.custom.list_namespaced_custom_object,
                    "ray.io",
                    "v1",
                    "default",
                    "rayclusters",
                    field_selector=f"metadata.name={self.name}",
                    timeout_seconds=5,
                ):
                    for g in ev["object"]["spec"].get("workerGroupSpecs") or []:
                        self.named |= set(
                            (g.get("scaleStrategy") or {}).get("workersToDelete") or []
                        )

    def _pods(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                for ev in watch.Watch().stream(
                    self.stack.core.list_namespaced_pod,
                    "default",
                    label_selector=f"ray.io/cluster={self.name},ray.io/node-type=worker",
                    timeout_seconds=5,
                ):
                    meta = ev["object"].metadata
                    self.pods.setdefault(meta.name, meta.uid)

    @contextlib.contextmanager
    def running(self) -> Iterator[Watcher]:
        threads = [threading.Thread(target=f, daemon=True) for f in (self._raycluster, self._pods)]
        for t in threads:
            t.start()
        try:
            yield self
        finally:
            self.stop.set()
            for t in threads:
                t.join(10)


def spec(stack: Stack, name: str) -> tuple[int, list[str]]:
    group = stack.raycluster(name)["spec"]["workerGroupSpecs"][0]
    return group["replicas"], list((group.get("scaleStrategy") or {}).get("workersToDelete") or [])


def settled(stack: Stack, name: str) -> bool:
    """`replicas` equals the pods KubeRay keeps (alive, not named), and no name in
    workersToDelete is of a pod that no longer exists."""
    replicas, listed = spec(stack, name)
    alive = {p.metadata.name for p in stack.workers(name)}
    every = {
        p.metadata.name
        for p in stack.core.list_namespaced_pod(
            "default", label_selector=f"ray.io/cluster={name},ray.io/node-type=worker"
        ).items
    }
    return replicas == len(alive - set(listed)) and set(listed) <= every


async def run_waves(stack: Stack, name: str, gcs: str, waves: list[Any]) -> dict[str, Any]:
    driver = stack.script(name, CHURN, gcs, json.dumps(waves))
    try:
        out, err = await asyncio.to_thread(driver.communicate, timeout=400)
    finally:
        stop_driver(driver)
    assert driver.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


async def check_the_cluster(stack: Stack, name: str, seen: Watcher, summary: dict[str, Any]) -> int:
    """No task failed, KubeRay deleted only pods raysize named, and the cluster settles
    with replicas equal to the pods kept and no stale names. Returns the pods removed."""
    assert summary["failed"] == 0, summary["errors"]
    assert summary["ran"] == sum(count for count, _, _ in WAVES)
    await eventually(lambda: settled(stack, name), 60)
    alive = {p.metadata.name for p in stack.workers(name)}
    removed = set(seen.pods) - alive
    assert removed, "the churn removed no worker: the test did not exercise scale-in"
    assert removed <= seen.named, f"pods deleted that raysize never named: {removed - seen.named}"
    return len(removed)


@pytest_asyncio.fixture(params=["embedded", "real"])
async def churn_world(
    request: pytest.FixtureRequest, dev_server: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    timing = KubeletTiming(actuation_delay_s=0.0)
    async with process_world(dev_server, tmp_path, str(request.param), timing) as world:
        yield world


async def test_churn_kills_no_task_and_removes_only_what_raysize_named(
    churn_world: tuple[Stack, dict[str, str]], tmp_path: Path
) -> None:
    stack, env = churn_world
    name = stack.unique("churn")
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        stack.create(ippr_cluster(name, idle_timeout_s=IDLE_TIMEOUT_S))
        gcs = await stack.gcs_address(name)
        await stack.raylet_joined(name)  # it may be drained at once: idle for 2 s
        with Watcher(stack, name).running() as seen:
            summary = await run_waves(stack, name, gcs, WAVES)
            removed = await check_the_cluster(stack, name, seen, summary)
        print(f"churn {name}: {summary['ran']} tasks ran, 0 failed, {removed} pods removed")
    finally:
        kill(worker)


def drained_not_removed(stack: Stack, name: str, gcs: str) -> str | None:
    """A worker pod whose Raylet Ray reports dead (drained: nothing else ends one here)
    while the pod is still there and not named."""
    _, listed = spec(stack, name)
    pods = {p.metadata.name for p in stack.workers(name)} - set(listed)
    with RayGcsClient(gcs, timeout=3) as ray:
        dead = {n.pod for n in ray.cluster_state().nodes if not n.alive}
    return next(iter(sorted(pods & dead)), None)


async def test_churn_with_failing_writes_and_a_worker_killed_after_a_drain(
    churn_world: tuple[Stack, dict[str, str]], tmp_path: Path
) -> None:
    """Every RayCluster write refused: an idle worker is drained, and its removal cannot
    be written. The worker is SIGKILLed then; a new one must still remove that pod (its
    Raylet is gone: a lost removal would strand it). Then churn with one RayCluster write
    in four failing."""
    stack, env = churn_world
    name = stack.unique("churn-kill")
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    try:
        # refused from the start: the first worker is drained 2 s after its Raylet joins,
        # which can come before the test has seen it join (it once did, at load 6), and
        # its removal must be refused. Only the worker's requests pass the fault proxy.
        refuse = FaultRule(verb="patch", resource="rayclusters", error_rate=1.0, codes=(500,))
        stack.sandbox.faults.add(refuse)
        stack.create(ippr_cluster(name, idle_timeout_s=IDLE_TIMEOUT_S))
        gcs = await stack.gcs_address(name)
        await stack.raylet_joined(name)
        with Watcher(stack, name).running() as seen:
            stranded = await eventually(lambda: drained_not_removed(stack, name, gcs), 90)
            await eventually(lambda: refuse.injected > 0, 30)  # its write was refused
            kill(worker)
            stack.sandbox.faults.clear()
            worker = start_worker(env, log)
            await eventually(
                lambda: stranded not in {p.metadata.name for p in stack.workers(name)}, 90
            )
            assert stranded in seen.named
            stack.sandbox.faults.add(
                FaultRule(verb="patch", resource="rayclusters", error_rate=0.25, codes=(409, 500))
            )
            summary = await run_waves(stack, name, gcs, WAVES)
            stack.sandbox.faults.clear()
            removed = await check_the_cluster(stack, name, seen, summary)
        print(
            f"churn {name}: {summary['ran']} tasks ran, 0 failed, {removed} pods removed "
            f"(a drained pod removed after the kill: {stranded})"
        )
    finally:
        kill(worker)
