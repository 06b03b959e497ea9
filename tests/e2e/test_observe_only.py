"""Observe-only (RAYSIZE_OBSERVE_ONLY) writes nothing, in both worlds: the embedded API
server, and the real kube-apiserver with KubeRay. A raysize worker (in this process, on
the real dev server) manages a RayCluster whose Ray (`RayStandIn`: a GCS over real gRPC,
no Ray processes, a node per running pod) reports demand that needs two grows and a new
pod. In observe-only it plans every tick, records its decisions and says what it would
do in Events, and changes nothing: no pod written, created or deleted, the RayCluster's
spec as it was, no Raylet resized or drained, no resize saga. Restarted without it, the
worker acts on the next tick and the cluster grows."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes import client, config
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from bench.clusters import small_raycluster
from bench.fleet_bench import Registrar
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.realworld import RealSandbox
from raysize.worker.run import run_worker
from raysize.worker.settings import Settings
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from tests.e2e.conftest import GIB, eventually
from tests.orchestration.test_observe_only import observed_ticks

NS = "default"


class World:
    def __init__(self, kind: str, sandbox: Sandbox | RealSandbox, ray: RayStandIn, kc: Path):
        self.kind, self.sandbox, self.ray, self.kubeconfig = kind, sandbox, ray, kc
        api = config.new_client_from_config(config_file=str(kc))
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        # both worlds share the session's dev server: a cluster name of this world's own
        self.name = f"observe-{kind}"

    def raycluster(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            "ray.io", "v1", NS, "rayclusters", self.name
        )

    def pods(self) -> dict[str, dict[str, Any]]:
        """Every pod of the cluster, by UID: what any write to it would change."""
        out = {}
        for p in self.core.list_namespaced_pod(
            NS, label_selector=f"ray.io/cluster={self.name}"
        ).items:
            m = p.metadata
            out[m.uid] = {
                "name": m.name,
                "resourceVersion": m.resource_version,
                "annotations": m.annotations or {},
                "labels": m.labels or {},
                "resources": [c.resources.to_dict() for c in p.spec.containers],
                "deleting": bool(m.deletion_timestamp),
            }
        return out

    def settled(self) -> dict[str, dict[str, Any]] | None:
        """The pods once every one is Running and Ready with its Raylet registered."""
        pods = self.core.list_namespaced_pod(NS, label_selector=f"ray.io/cluster={self.name}")
        ready = [
            p
            for p in pods.items
            if p.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
            and p.metadata.name in self.ray.model.nodes
        ]
        return self.pods() if len(ready) == 3 == len(pods.items) else None

    def events(self) -> list[tuple[str, str]]:
        """raysize's Events on the RayCluster, oldest first."""
        items = self.core.list_namespaced_event(NS).items
        return [
            (e.reason, e.message)
            for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)
            if e.involved_object.name == self.name
            and e.involved_object.kind == "RayCluster"
            and e.source is not None
            and e.source.component == "raysize"  # not KubeRay's own
        ]


@pytest_asyncio.fixture(params=["embedded", "real"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    cfg = SandboxConfig(
        node_specs=[NodeSpec("node-a", 16000, 64 * GIB)],
        timing=KubeletTiming(actuation_delay_s=0.0),
    )
    kind = str(request.param)
    sandbox: Sandbox | RealSandbox = Sandbox(cfg) if kind == "embedded" else RealSandbox(cfg)
    await asyncio.to_thread(sandbox.start)
    ray = RayStandIn()
    try:
        with ray:
            yield World(kind, sandbox, ray, sandbox.write_kubeconfig(tmp_path / "kubeconfig"))
    finally:
        await asyncio.to_thread(sandbox.close)


@contextlib.asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(settings, stop=stop))
    try:
        yield
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 30)
        except Exception:
            task.cancel()


async def resize_sagas(temporal: Client, queue: str) -> list[str]:
    query = f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow'"
    return [w.id async for w in temporal.list_workflows(query)]


async def ticks(handle: WorkflowHandle) -> int:
    try:
        return (await handle.query(ReconcileWorkflow.status)).ticks
    except Exception:  # not started yet, or between two runs
        return 0


async def eventually_async(check: Any, timeout: float) -> Any:
    end = asyncio.get_running_loop().time() + timeout
    while True:
        last = await check()
        if last:
            return last
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"not reached in {timeout}s (last: {last!r})")
        await asyncio.sleep(0.2)


async def test_observe_only_writes_nothing_then_acts_once_off(
    dev_server: WorkflowEnvironment, world: World
) -> None:
    temporal = dev_server.client
    rc = small_raycluster(world.name, workers=2, max_workers=3)
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = 0
    world.custom.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)
    queue = f"raysize-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        temporal_address=temporal.service_client.config.target_host,
        task_queue=queue,
        kubeconfig=world.kubeconfig,
        namespaces=NS,
        discovery_interval_s=1.0,
        gcs_address=world.ray.address,  # the stand-in GCS: no head Service to reach
        tick_s=1.0,  # a tick a second with nothing changing: many ticks, each to say it again
        observe_only=True,
    )
    handle = temporal.get_workflow_handle(reconcile_workflow_id(NS, world.name))
    try:
        with Registrar(world.core, {world.name: world.ray}):
            before = await eventually(world.settled, 60)
            spec = world.raycluster()
            # three tasks of 4 CPU: two 1-CPU pods would grow to 4 CPU, and one more pod
            world.ray.add_demands({"CPU": 4.0}, 3)

            async with worker(settings):
                await eventually_async(lambda: _ticks_at_least(handle, 6), 30)
                status = await handle.query(ReconcileWorkflow.status)
                events = world.events()
            # nothing written: every pod as it was, none created or deleted
            assert world.pods() == before
            after = world.raycluster()
            assert after["metadata"]["generation"] == spec["metadata"]["generation"]
            assert after["spec"] == spec["spec"]
            assert after["metadata"].get("annotations") == spec["metadata"].get("annotations")
            # no Raylet resized or drained, no resize saga started
            assert (world.ray.model.resizes, world.ray.model.drains) == (0, 0)
            assert await resize_sagas(temporal, queue) == []
            # what it would have done: said once each, though it planned it every tick
            reasons = [r for r, _ in events]
            assert sorted(reasons) == ["ObserveOnly", "WouldResize", "WouldScaleOut"], events
            said = dict(events)
            assert said["WouldResize"].startswith("observe-only, nothing was changed: would grow")
            assert said["WouldResize"].count("1 → 4 CPU") == 2
            assert said["WouldScaleOut"].startswith(
                "observe-only, nothing was changed: would launch 1 × small"
            )
            # `raysize status`: the mode and the plan; the history: every tick's decision
            assert status.observe_only and status.resizes_started == 0
            assert [line.split(" ")[1] for line in status.would] == ["launch", "grow", "grow"]
            recorded = await observed_ticks(handle)
            assert len(recorded) >= 6
            assert all(t["observe_only"] and t["plan"] is None for t in recorded)
            assert all(t["would"]["lines"] == list(status.would) for t in recorded[-3:])  # type: ignore[index]

            # restarted without observe-only: the next tick acts, and the cluster grows
            async with worker(settings.model_copy(update={"observe_only": False})):
                await eventually(lambda: world.ray.counts()[:2] == (3, 0), 60)
                status = await handle.query(ReconcileWorkflow.status)
            assert not status.observe_only and status.resizes_started >= 2
            assert world.raycluster()["spec"]["workerGroupSpecs"][0]["replicas"] == 3
            assert world.ray.model.resizes >= 3  # two grows, then the new pod's
            assert "ObserveOnlyEnded" in [r for r, _ in world.events()]
    finally:
        with contextlib.suppress(Exception):
            await handle.terminate("test over")


async def _ticks_at_least(handle: WorkflowHandle, n: int) -> bool:
    return await ticks(handle) >= n
