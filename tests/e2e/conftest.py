"""The whole product end to end: a real Temporal dev server, the sandbox Kubernetes with
real Ray processes, and a raysize worker, all started here and all stopped here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes import client, config
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.clusters import KubeApis
from bench.clusters import ippr_cluster as ippr_cluster  # the tests' cluster
from raysize.activities.k8s_objects import gcs_address
from raysize.activities.ray_errors import RayError
from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox import reaper
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.realworld import RealSandbox
from raysize.worker.run import run_worker
from raysize.worker.settings import Settings
from tests.deploy.conftest import DEPLOY, run_kubectl
from tests.e2e.gcs_proxy import GcsProxy
from tests.orchestration.temporal_env import start_dev_server

GIB = 1024**3


@pytest_asyncio.fixture(scope="session")
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(
        "--dynamic-config-value",
        "matching.numTaskqueueReadPartitions=1",
        "--dynamic-config-value",
        "matching.numTaskqueueWritePartitions=1",
        # a worker's idle poll returns after 10 s (Temporal's default: 60 s), so a version
        # whose workers are gone shows sooner (worker/takeover.py, RAYSIZE_TAKEOVER_AFTER_S)
        "--dynamic-config-value",
        'matching.longPollExpirationInterval="10s"',
    )
    try:
        yield env
    finally:
        await env.shutdown()


@dataclass
class Stack(KubeApis):
    sandbox: Sandbox | RealSandbox
    api: client.ApiClient
    temporal: Client
    kubeconfig: Path
    namespace: str = "default"

    def create(self, rc: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            "ray.io", "v1", self.namespace, "rayclusters", rc
        )

    def raycluster(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            "ray.io", "v1", self.namespace, "rayclusters", name
        )

    def gcs(self, name: str) -> str:
        return gcs_address(self.raycluster(name))

    def workers(self, name: str) -> list[client.V1Pod]:
        return [
            p
            for p in self.core.list_namespaced_pod(
                self.namespace, label_selector=f"ray.io/cluster={name},ray.io/node-type=worker"
            ).items
            if not p.metadata.deletion_timestamp
        ]

    async def gcs_address(self, name: str) -> str:
        """The GCS address of a RayCluster, once the operator has published it."""
        return await eventually(lambda: self.gcs(name), 60)  # type: ignore[no-any-return]

    def unique(self, name: str) -> str:
        """A cluster name of this world's own: both worlds share one Temporal server, and a
        reconcile workflow (`reconcile/<ns>/<name>`) left running by one world's test would
        make the other's discovery think that cluster is managed already."""
        return name if isinstance(self.sandbox, Sandbox) else f"{name}-real"

    def driver(
        self, name: str, gcs: str, cpus: float | str, timeout_s: float = 120, hold_s: float = 0
    ) -> subprocess.Popen[str]:
        """A Ray driver that runs tasks of these CPU sizes on RayCluster `name`: on the host
        in the embedded world (its Ray nodes share the host's address), in the head pod's
        network namespace in the real one (what `kubectl exec` into the head would run)."""
        return self.script(name, DRIVER, gcs, str(cpus), str(timeout_s), str(hold_s))

    def script(self, name: str, source: str, *args: str) -> subprocess.Popen[str]:
        """A Python script (a Ray driver) run where a driver of RayCluster `name` runs: on
        the host in the embedded world, in the head pod's network namespace in the real
        one. Its own process group; `stop_driver` ends it."""
        if isinstance(self.sandbox, Sandbox):
            return start_script(source, *args)
        assert self.sandbox.runtime is not None, "the real world runs Ray with with_ray=True"
        heads = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"ray.io/cluster={name},ray.io/node-type=head"
        ).items
        return self.sandbox.runtime.exec(
            self.namespace,
            heads[0].metadata.name,
            ["python", "-c", source, *args],
            env={"RAY_USAGE_STATS_ENABLED": "0", "GRPC_DNS_RESOLVER": "native"},
        )

    async def crash(self, pod: client.V1Pod) -> None:
        """Kill the pod's Ray process group, as a crash or the node's OOM killer would: the
        kubelet sees its container exit (137) and restarts it (restartPolicy Always). In
        the real world the Ray container starts once KubeRay's init container has seen
        the GCS: wait for it."""

        def kill() -> bool:
            try:
                if isinstance(self.sandbox, Sandbox):
                    assert self.sandbox.ray is not None
                    self.sandbox.ray.kill(self.namespace, pod.metadata.name)
                else:
                    assert self.sandbox.runtime is not None
                    container = pod.spec.containers[0].name
                    self.sandbox.runtime.kill(self.namespace, pod.metadata.name, container)
            except LookupError:
                return False
            return True

        await eventually(kill, 60)

    async def running_workers(self, name: str) -> list[client.V1Pod]:
        """The Running worker pods of a RayCluster, once at least one of them has its
        Raylet registered with the GCS. A Running pod without its Raylet cannot take work
        yet: raysize plans it as a pending pod, so a demand sent then is met by a launch
        (seed case 2 once ended at 1 + 4 CPU that way, on a loaded machine)."""
        gcs = await self.gcs_address(name)

        def ready() -> list[client.V1Pod]:
            pods = [p for p in self.workers(name) if p.status.phase == "Running"]
            if not pods:
                return []
            try:
                with RayGcsClient(gcs, timeout=2) as ray:
                    registered = {n.pod for n in ray.cluster_state().nodes if n.alive}
            except RayError:
                return []
            return pods if any(p.metadata.name in registered for p in pods) else []

        # generous: on a loaded machine (load average 10 on 2 cores) Ray took over a
        # minute to start a node once
        return await eventually(ready, 180)  # type: ignore[no-any-return]

    async def raylet_joined(self, name: str) -> str:
        """The first worker pod whose Raylet registered with the GCS, alive or since gone.
        For a cluster whose idle timeout is a few seconds, raysize may drain that worker
        before the test looks: `running_workers` would then wait for a Raylet that is
        already dead, on a pod that is removed (the churn test once failed so, at load 6)."""
        gcs = await self.gcs_address(name)
        groups = {g["groupName"] for g in self.raycluster(name)["spec"]["workerGroupSpecs"]}

        def joined() -> str | None:
            try:
                with RayGcsClient(gcs, timeout=2) as ray:
                    nodes = ray.cluster_state().nodes
            except RayError:
                return None
            # Ray names a KubeRay node's type after its group; a drained node stays listed
            return next((n.pod for n in nodes if n.group in groups), None)

        return await eventually(joined, 180)  # type: ignore[no-any-return]


async def eventually(check: Callable[[], Any], timeout: float = 60, every: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"not reached in {timeout}s (last: {last!r})")


async def raylet_total_reaches(gcs: str, pod: str, cpu_m: int, timeout: float = 10) -> None:
    """Until the GCS's node table shows the pod's Raylet with `cpu_m` millicores in all. The
    table shows a Raylet's new total about a second after the Raylet took it (Ray's
    syncer), so a resize that has just ended may not be in it yet."""

    def reached() -> bool:
        with RayGcsClient(gcs) as ray:
            node = next(n for n in ray.cluster_state().nodes if n.pod == pod)
        return node.total.cpu == cpu_m

    await eventually(reached, timeout)


@pytest.fixture
def nodes() -> list[NodeSpec]:
    """The sandbox's nodes; a test overrides this fixture for another shape."""
    return [NodeSpec("node-a", 8000, 32 * GIB)]


@pytest.fixture
def kubelet_timing() -> KubeletTiming:
    """How fast the sandbox's kubelet actuates; a test overrides this fixture (or
    parametrizes it) for a slower one."""
    return KubeletTiming(actuation_delay_s=0.0)


@contextlib.asynccontextmanager
async def running_stack(
    dev_server: WorkflowEnvironment,
    tmp_path: Path,
    nodes: list[NodeSpec],
    timing: KubeletTiming,
    gcs_address: str | None = None,
    world: str = "embedded",
) -> AsyncIterator[Stack]:
    """A world with real Ray and an in-process raysize worker, both stopped at exit. In
    the real world (kube-apiserver v1.36, KubeRay, Ray in each pod's network namespace),
    deploy/ is applied and the worker runs with the raysize ServiceAccount's token."""
    cfg = SandboxConfig(node_specs=nodes, with_ray=True, timing=timing)
    sandbox = Sandbox(cfg) if world == "embedded" else RealSandbox(cfg)
    await asyncio.to_thread(sandbox.start)
    stop = asyncio.Event()
    worker: asyncio.Task[None] | None = None
    try:
        kubeconfig = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        as_worker = kubeconfig
        if isinstance(sandbox, RealSandbox):
            applied = run_kubectl("apply", "-k", str(DEPLOY), kubeconfig=kubeconfig)
            assert applied.returncode == 0, applied.stderr
            # the worker under test runs in this process, with the deployed ServiceAccount's
            # token: the Deployment's own pod, which the controller manager makes, would
            # only take room on a node
            scaled = run_kubectl(
                "scale", "deployment/raysize-worker", "-n", "raysize", "--replicas=0",
                kubeconfig=kubeconfig,
            )  # fmt: skip
            assert scaled.returncode == 0, scaled.stderr
            # through the sandbox's fault proxy, so `faults` reach the worker in both worlds
            as_worker = sandbox.service_account_kubeconfig(
                tmp_path / "worker-kubeconfig", "raysize", "raysize"
            )
        queue = f"raysize-{uuid.uuid4().hex[:8]}"
        settings = Settings(
            temporal_address=dev_server.client.service_client.config.target_host,
            task_queue=queue,
            kubeconfig=as_worker,
            namespaces="default",
            discovery_interval_s=1.0,
            gcs_address=gcs_address,
        )
        worker = asyncio.create_task(run_worker(settings, stop=stop))
        yield Stack(sandbox=sandbox, api=api, temporal=dev_server.client, kubeconfig=kubeconfig)
    finally:
        stop.set()
        if worker is not None:
            try:
                await asyncio.wait_for(worker, 30)
            except Exception:
                worker.cancel()
        await asyncio.to_thread(sandbox.close)


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`raysize worker` as its own process (in its own process group), so a test can
    SIGKILL it."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raysize.worker.cli", "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    reaper.guard(proc)  # stopped even if pytest is SIGKILLed (CI's timeout)
    return proc


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group: no cleanup, no goodbye."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@contextlib.asynccontextmanager
async def process_world(
    dev_server: WorkflowEnvironment, tmp_path: Path, world: str, timing: KubeletTiming
) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    """A world with real Ray and the environment of a `raysize worker` process for it
    (`start_worker`): the worker's API calls pass the world's fault injection (the
    embedded server's own; in the real world the fault proxy in front of the real
    server)."""
    cfg = SandboxConfig(
        node_specs=[NodeSpec("node-a", 8000, 32 * GIB)], with_ray=True, timing=timing
    )
    sandbox: Sandbox | RealSandbox = Sandbox(cfg) if world == "embedded" else RealSandbox(cfg)
    await asyncio.to_thread(sandbox.start)
    try:
        kubeconfig = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        as_worker = kubeconfig
        if isinstance(sandbox, RealSandbox):
            as_worker = sandbox.write_kubeconfig(tmp_path / "worker-kubeconfig", faults=True)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "RAYSIZE_TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "RAYSIZE_TASK_QUEUE": f"raysize-{uuid.uuid4().hex[:8]}",
            "RAYSIZE_KUBECONFIG": str(as_worker),
            "RAYSIZE_NAMESPACES": "default",
            "RAYSIZE_DISCOVERY_INTERVAL_S": "1",
        }
        yield (
            Stack(sandbox=sandbox, api=api, temporal=dev_server.client, kubeconfig=kubeconfig),
            env,
        )
    finally:
        await asyncio.to_thread(sandbox.close)


@pytest_asyncio.fixture
async def stack(
    dev_server: WorkflowEnvironment,
    tmp_path: Path,
    nodes: list[NodeSpec],
    kubelet_timing: KubeletTiming,
) -> AsyncIterator[Stack]:
    async with running_stack(dev_server, tmp_path, nodes, kubelet_timing) as s:
        yield s


@pytest_asyncio.fixture
async def real_stack(dev_server: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """`stack` in the real world only (what only the real world shows)."""
    nodes = [NodeSpec("node-a", 8000, 32 * GIB)]
    timing = KubeletTiming(actuation_delay_s=0.0)
    async with running_stack(dev_server, tmp_path, nodes, timing, world="real") as s:
        yield s


@pytest_asyncio.fixture(params=["embedded", "real"])
async def any_stack(
    request: pytest.FixtureRequest,
    dev_server: WorkflowEnvironment,
    tmp_path: Path,
    nodes: list[NodeSpec],
    kubelet_timing: KubeletTiming,
) -> AsyncIterator[Stack]:
    """`stack` in each world: the embedded sandbox, then the real control plane."""
    async with running_stack(
        dev_server, tmp_path, nodes, kubelet_timing, world=str(request.param)
    ) as s:
        yield s


@pytest.fixture
def gcs_proxy() -> Iterator[GcsProxy]:
    """A TCP proxy to a cluster's GCS (set its upstream once the head is up) that the
    test can cut; dark until then."""
    proxy = GcsProxy()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest_asyncio.fixture
async def proxied_stack(
    dev_server: WorkflowEnvironment,
    tmp_path: Path,
    nodes: list[NodeSpec],
    kubelet_timing: KubeletTiming,
    gcs_proxy: GcsProxy,
) -> AsyncIterator[Stack]:
    """`stack`, with raysize reaching every GCS only through `gcs_proxy`."""
    async with running_stack(
        dev_server, tmp_path, nodes, kubelet_timing, gcs_address=gcs_proxy.address
    ) as s:
        yield s


DRIVER = textwrap.dedent(
    """
    import sys, time, ray
    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)

    @ray.remote
    def work(cpus, hold_s):
        time.sleep(hold_s)  # hold the CPUs a while, like real work
        return f"ran with {cpus:g} CPU on {ray.get_runtime_context().get_node_id()}"

    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    hold, deadline = float(sys.argv[4]), time.monotonic() + float(sys.argv[3])
    # stages apart by ";", each waited for before the next: tasks "2,4", or a PACK group
    # "pg:2+2" (a bundle of {CPU: 2} each, a task in each bundle)
    for stage in sys.argv[2].split(";"):
        refs = []
        for item in stage.split(","):
            if item.startswith("pg:"):
                sizes = [float(c) for c in item[3:].split("+")]
                asked = time.monotonic()
                pg = placement_group([{"CPU": c} for c in sizes], strategy="PACK")
                ray.get(pg.ready(), timeout=deadline - time.monotonic())
                print(f"group ready after {time.monotonic() - asked:.2f} s", flush=True)
                refs += [
                    work.options(
                        num_cpus=c,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            pg, placement_group_bundle_index=i
                        ),
                    ).remote(c, hold)
                    for i, c in enumerate(sizes)
                ]
            else:
                refs.append(work.options(num_cpus=float(item)).remote(float(item), hold))
        for line in ray.get(refs, timeout=deadline - time.monotonic()):
            print(line, flush=True)
    """
)


def start_driver(
    gcs: str, cpus: float | str, timeout_s: float = 120, hold_s: float = 0
) -> subprocess.Popen[str]:
    """A Ray driver in its own process group that runs tasks of these CPU sizes ("2" or
    "4,2"), or placement groups ("pg:2+2"), in stages apart by ";" (see `DRIVER`), and
    waits for all of them."""
    return start_script(DRIVER, gcs, str(cpus), str(timeout_s), str(hold_s))


def start_script(source: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", source, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={"RAY_USAGE_STATS_ENABLED": "0", "PATH": str(Path(sys.executable).parent)},
    )
    reaper.guard(proc)
    return proc


def stop_driver(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


async def pending_activity(temporal: Client, workflow_id: str, name: str) -> tuple[int, str]:
    """(attempt, last failure message) of the workflow's pending activity of this type;
    (0, "") when it has none."""
    desc = await temporal.get_workflow_handle(workflow_id).describe()
    for act in desc.raw_description.pending_activities:
        if act.activity_type.name == name:
            return act.attempt, act.last_failure.message
    return 0, ""
