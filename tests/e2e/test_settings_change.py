"""A setting changed in the worker's configuration reaches the running loops (#43 item 5),
in both worlds: the embedded API server, and the real kube-apiserver with KubeRay.

`helm upgrade --set config.RAYSIZE_…=…` restarts the worker with the new value; the
reconcile loops it serves keep running. A raysize worker (in this process, on the real
dev server) grows a pod right-sized (`RAYSIZE_RESIZE_POLICY=right-size`); it is stopped
and a worker with `RAYSIZE_RESIZE_POLICY=max` and another tick takes its place. The same
loop's next grow goes to the group's maximum, and `raysize status` shows the values in
force. Before, the loop kept the values it was started with until someone restarted it:
the second grow was right-sized too (1 → 2 → 3 CPU)."""

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
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from bench.clusters import small_raycluster
from bench.fleet_bench import Registrar
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.realworld import RealSandbox
from raysize.worker.cli import app
from raysize.worker.run import discovery_id
from raysize.worker.settings import Settings
from raysize.workflows.discovery_workflow import DiscoveryWorkflow
from raysize.workflows.model import ResizePolicy
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from tests.e2e.conftest import GIB, eventually
from tests.e2e.test_observe_only import worker

NS = "default"


@pytest_asyncio.fixture(params=["embedded", "real"])
async def world(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, Path, RayStandIn]]:
    cfg = SandboxConfig(
        node_specs=[NodeSpec("node-a", 16000, 64 * GIB)],
        timing=KubeletTiming(actuation_delay_s=0.0),
    )
    kind = str(request.param)
    sandbox: Sandbox | RealSandbox = Sandbox(cfg) if kind == "embedded" else RealSandbox(cfg)
    await asyncio.to_thread(sandbox.start)
    try:
        with RayStandIn() as ray:
            yield kind, sandbox.write_kubeconfig(tmp_path / "kubeconfig"), ray
    finally:
        await asyncio.to_thread(sandbox.close)


async def eventually_async(check: Any, ok: Any, timeout: float = 30) -> Any:
    end = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < end:
        last = await check()
        if last is not None and ok(last):
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"not reached in {timeout}s (last: {last!r})")


async def test_a_changed_setting_reaches_the_running_loop(
    dev_server: WorkflowEnvironment,
    world: tuple[str, Path, RayStandIn],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kind, kubeconfig, ray = world
    name = f"settings-{kind}"  # both worlds share the session's dev server
    api = config.new_client_from_config(config_file=str(kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        "ray.io", "v1", NS, "rayclusters", small_raycluster(name, workers=1, max_workers=1)
    )
    temporal = dev_server.client
    queue = f"raysize-{uuid.uuid4().hex[:8]}"
    before = Settings(
        temporal_address=temporal.service_client.config.target_host,
        task_queue=queue,
        kubeconfig=kubeconfig,
        namespaces=NS,
        discovery_interval_s=1.0,
        gcs_address=ray.address,  # the stand-in GCS: no head Service to reach
        resize_policy=ResizePolicy.RIGHT_SIZE,
        tick_s=300.0,
    )
    after = before.model_copy(
        update={
            "resize_policy": ResizePolicy.MAX,
            "tick_s": 7.0,
            "namespaces": f"{NS},team-y",
            "discovery_interval_s": 2.0,
        }
    )

    def cpu() -> str:
        pods = core.list_namespaced_pod(
            NS, label_selector=f"ray.io/cluster={name},ray.io/node-type=worker"
        ).items
        return ",".join(str(p.spec.containers[0].resources.limits["cpu"]) for p in pods)

    handle = temporal.get_workflow_handle(reconcile_workflow_id(NS, name))
    try:
        with Registrar(core, {name: ray}):
            await eventually(lambda: any(n.startswith(f"{name}-") for n in ray.model.nodes), 60)
            async with worker(before):
                ray.add_demands({"CPU": 2.0}, 1)
                await eventually(lambda: cpu() == "2" and not ray.model.waiting, 60)
                status = await handle.query(ReconcileWorkflow.status)
                assert status.in_force is not None
                assert status.in_force.settings.resize_policy == ResizePolicy.RIGHT_SIZE
            # the worker restarted with a new configuration; the loop runs on
            async with worker(after):
                ray.add_demands({"CPU": 1.0}, 1)  # right-size: 3 CPU; max: 4
                await eventually(lambda: cpu() in ("3", "4") and not ray.model.waiting, 60)
                assert cpu() == "4", "the loop grew with the policy it was started with"
                status = await handle.query(ReconcileWorkflow.status)
                discovery = temporal.get_workflow_handle(discovery_id(after))
                found = await eventually_async(
                    lambda: discovery.query(DiscoveryWorkflow.settings),
                    lambda d: d.interval_s == 2.0,
                )
                # `raysize status` says what is in force
                monkeypatch.setenv(
                    "RAYSIZE_TEMPORAL_ADDRESS", temporal.service_client.config.target_host
                )
                shown = await asyncio.to_thread(CliRunner().invoke, app, ["status", f"{NS}/{name}"])
        assert status.in_force is not None
        assert status.in_force.settings.resize_policy == ResizePolicy.MAX
        assert status.in_force.tick_s == 7.0
        assert shown.exit_code == 0, shown.output
        assert "in force: tick 7 s" in shown.output, shown.output
        assert "resize policy max" in shown.output, shown.output
        # and the discovery loop runs with the new worker's namespaces and interval
        assert found.namespaces == (NS, "team-y")
    finally:
        with contextlib.suppress(Exception):
            await handle.terminate("test over")
