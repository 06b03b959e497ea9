"""Two Kubernetes clusters, one Temporal namespace (RAYSIZE_CLUSTER_NAME).

Two API servers — the embedded one and the real kube-apiserver with KubeRay — each with a
RayCluster `default/demo` (a GCS stand-in answers for each: no Ray processes), and a
`raysize worker` for each, both on one dev server. Without a cluster name both workers
would start `reconcile/default/demo` (one of them would find it running and keep the
other's) and poll the same task queue, so one cluster's pod reads and resizes would run
against the other's API server. With one, each loop, saga, search attribute and task queue
is its cluster's own, and `raysize status` shows only its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from kubernetes import client, config
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from bench.clusters import small_raycluster
from bench.fleet_bench import Registrar
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.realworld import RealSandbox
from raysize.workflows.naming import KUBE_CLUSTER, RAY_CLUSTER, reconcile_workflow_id
from tests.e2e.conftest import GIB, eventually, kill, start_worker

NAME = "demo"


@contextlib.contextmanager
def kube_world(kind: str, tmp: Path) -> Iterator[tuple[client.CoreV1Api, RayStandIn, Path]]:
    """An API server of `kind` with `default/demo` (one 1-CPU worker pod) and its GCS
    stand-in, which registers each running pod as a Raylet."""
    cfg = SandboxConfig(
        node_specs=[NodeSpec("node-a", 8000, 32 * GIB)],
        timing=KubeletTiming(actuation_delay_s=0.0),
    )
    world: Sandbox | RealSandbox = Sandbox(cfg) if kind == "embedded" else RealSandbox(cfg)
    world.start()
    try:
        with RayStandIn() as ray:
            kubeconfig = world.write_kubeconfig(tmp / f"{kind}.kubeconfig")
            api = config.new_client_from_config(config_file=str(kubeconfig))
            core = client.CoreV1Api(api)
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "ray.io", "v1", "default", "rayclusters", small_raycluster(NAME, workers=1)
            )
            with Registrar(core, {NAME: ray}):
                yield core, ray, kubeconfig
    finally:
        world.close()


def worker_env(dev_server: WorkflowEnvironment, kube: str, kubeconfig: Path, ray: RayStandIn,
               tmp: Path) -> dict[str, str]:  # fmt: skip
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "RAYSIZE_TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
        "RAYSIZE_CLUSTER_NAME": kube,  # and no RAYSIZE_TASK_QUEUE: raysize-<name>
        "RAYSIZE_KUBECONFIG": str(kubeconfig),
        "RAYSIZE_NAMESPACES": "default",
        "RAYSIZE_DISCOVERY_INTERVAL_S": "1",
        "RAYSIZE_GCS_ADDRESS": ray.address,
    }


def worker_cpu(core: client.CoreV1Api) -> list[str]:
    pods = core.list_namespaced_pod("default", label_selector="ray.io/node-type=worker").items
    return sorted(
        str((c.resources.requests or {}).get("cpu")) for p in pods for c in p.spec.containers
    )


async def running_loops(temporal: Client, kube: str) -> list[str]:
    query = (
        f"KubeCluster = '{kube}' AND WorkflowType = 'ReconcileWorkflow' "
        "AND ExecutionStatus = 'Running'"
    )
    return [w.id async for w in temporal.list_workflows(query)]


def status(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "raysize.worker.cli", "status", f"default/{NAME}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_two_kubernetes_clusters_share_one_temporal_namespace(
    dev_server: WorkflowEnvironment, tmp_path: Path
) -> None:
    temporal = dev_server.client
    run = uuid.uuid4().hex[:6]  # one dev server serves the whole session
    east, west = f"east-{run}", f"west-{run}"
    procs: list[subprocess.Popen[bytes]] = []
    with (
        kube_world("embedded", tmp_path) as (east_core, east_ray, east_kc),
        kube_world("real", tmp_path) as (west_core, west_ray, west_kc),
    ):
        envs = {
            east: worker_env(dev_server, east, east_kc, east_ray, tmp_path),
            west: worker_env(dev_server, west, west_kc, west_ray, tmp_path),
        }
        try:
            for kube, env in envs.items():
                procs.append(start_worker(env, tmp_path / f"{kube}.log"))
            # each worker manages its own default/demo, under its own id and attribute
            for kube in (east, west):
                wf_id = reconcile_workflow_id("default", NAME, kube)
                assert wf_id == f"reconcile/{kube}/default/{NAME}"
                await eventually_loops(temporal, kube, [wf_id])
                desc = await temporal.get_workflow_handle(wf_id).describe()
                assert desc.typed_search_attributes.get(KUBE_CLUSTER) == kube
                assert desc.typed_search_attributes.get(RAY_CLUSTER) == NAME
                assert desc.raw_description.execution_config.task_queue.name == f"raysize-{kube}"
            await eventually(
                lambda: len(east_ray.model.nodes) == 2 and len(west_ray.model.nodes) == 2
            )

            # a demand in the east grows the east's pod, and nothing in the west
            east_ray.add_demands({"CPU": 2.0}, 1)
            await eventually(lambda: worker_cpu(east_core) == ["2"], 60)
            assert worker_cpu(west_core) == ["1"]
            # then the west's own demand grows the west's pod
            west_ray.add_demands({"CPU": 3.0}, 1)
            await eventually(lambda: worker_cpu(west_core) == ["3"], 60)
            assert worker_cpu(east_core) == ["2"]

            # one resize saga each, named and tagged by its own cluster
            for kube in (east, west):
                query = f"KubeCluster = '{kube}' AND WorkflowType = 'PodResizeWorkflow'"
                sagas = [w async for w in temporal.list_workflows(query)]
                assert len(sagas) == 1, [w.id for w in sagas]
                assert sagas[0].id.startswith(f"resize/{kube}/default/")
                await temporal.get_workflow_handle(sagas[0].id).result()
                assert (await temporal.get_workflow_handle(sagas[0].id).describe()).status == (
                    WorkflowExecutionStatus.COMPLETED
                )
            # `raysize status` with the cluster name shows that cluster's resize only
            east_status = await asyncio.to_thread(status, envs[east])
            west_status = await asyncio.to_thread(status, envs[west])
            grew_east, grew_west = "1 CPU, 1Gi → 2 CPU, 1Gi", "1 CPU, 1Gi → 3 CPU, 1Gi"
            assert grew_east in east_status and grew_west not in east_status, east_status
            assert grew_west in west_status and grew_east not in west_status, west_status
        finally:
            for p in procs:
                kill(p)


async def eventually_loops(temporal: Client, kube: str, want: list[str]) -> None:
    end = asyncio.get_running_loop().time() + 60
    got: list[str] = []
    while asyncio.get_running_loop().time() < end:
        got = await running_loops(temporal, kube)
        if got == want:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"running loops of {kube}: {got}, wanted {want}")
