"""deploy/ runs in the real world (#28 item 1): the kustomize install (and the Helm chart)
applied to the real kube-apiserver, its Deployment's pod made by the real controller
manager's ReplicaSet and bound by kube-scheduler, and run by the kubelet simulator as a
real `raysize worker` process (sandbox/podprocs.py): the env from the ConfigMap and
Secrets, `KUBERNETES_SERVICE_HOST/PORT`, and the ServiceAccount's token from the
TokenRequest API at the path a pod has, rotated by the kubelet. The worker uses in-cluster
config, nothing else. The exec probes run; a failing liveness probe restarts the container.

Ray is the GCS stand-in (sandbox/ray_standin.py: a node per running pod, demands that wait
for room, over real gRPC): what is under test is the deployed worker, not Ray (the real
Ray path is tests/e2e/test_real_world.py). The worker reaches it through
RAYSIZE_GCS_ADDRESS, set in the test's overlay like the Temporal address."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes import client, config
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from bench.clusters import KubeApis
from bench.fleet_bench import Registrar
from raysize.sandbox.apistore import ApiStore, KubeHttp
from raysize.sandbox.errors import ApiError
from raysize.sandbox.kubelet import Kubelet, KubeletTiming, NodeSpec
from raysize.sandbox.podnet import SA_PATH
from raysize.sandbox.podprocs import ProcessRuntime
from raysize.sandbox.ports import free_port
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.realworld import RealControlPlane
from raysize.worker.health import DEFAULT_INTERVAL_S
from raysize.workflows.contracts import ResizeOutcome, ResizeSagaState
from raysize.workflows.naming import reconcile_workflow_id
from tests.deploy.conftest import DEPLOY, run_kubectl
from tests.e2e.conftest import eventually, ippr_cluster
from tests.e2e.test_upgrade import build_of, eventually_async, running_resize

pytestmark = pytest.mark.real

GIB = 1024**3
TOKEN_LIFE_S = 30.0  # rewritten at 24 s, refused by the server from 30 s
OTHER_NS = "team-x"  # watched, but the deployed Role is not there
ROLLED_BUILD = "0.2.1"  # the build a rolling update brings
TAKEOVER_AFTER_S = 15  # above the session dev server's long poll (10 s: tests/e2e/conftest.py)


@dataclass
class World(KubeApis):
    cp: RealControlPlane
    runtime: ProcessRuntime
    kubelet: Kubelet
    rays: dict[str, RayStandIn]  # by RayCluster
    admin: Path
    tmp: Path
    temporal: str
    queue: str

    @property
    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.admin))

    def kubectl(self, *args: str) -> Any:
        return run_kubectl(*args, kubeconfig=self.admin)

    def overlay(self, name: str, base: Path, literals: dict[str, str]) -> Path:
        """A kustomize overlay of `base` that merges `literals` into raysize-config."""
        folder = self.tmp / name
        folder.mkdir(exist_ok=True)
        lines = "".join(f"      - {k}={v}\n" for k, v in literals.items())
        (folder / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {os.path.relpath(base, folder)}\n"
            "configMapGenerator:\n  - name: raysize-config\n    namespace: raysize\n"
            f"    behavior: merge\n    literals:\n{lines}"
        )
        return folder

    def settings(self, cluster: str) -> dict[str, str]:
        """What the test's install sets: this test's Temporal, GCS and task queue."""
        return {
            "RAYSIZE_TEMPORAL_ADDRESS": self.temporal,
            "RAYSIZE_TASK_QUEUE": self.queue,
            "RAYSIZE_DEPLOYMENT_NAME": f"raysize-{self.queue}",
            "RAYSIZE_GCS_ADDRESS": self.rays[cluster].address,
            "RAYSIZE_DISCOVERY_INTERVAL_S": "1",
            "RAYSIZE_UPGRADE_CHECK_S": "2",
            "RAYSIZE_TAKEOVER_AFTER_S": str(TAKEOVER_AFTER_S),
            # the pod shares the host's network: no fixed port
            "RAYSIZE_PROMETHEUS_BIND": f"127.0.0.1:{free_port()}",
        }

    def pod(self, namespace: str, label: str) -> client.V1Pod:
        pods = self.core.list_namespaced_pod(namespace, label_selector=label).items
        assert len(pods) == 1, [p.metadata.name for p in pods]
        return pods[0]

    def ready(self, namespace: str, label: str) -> bool:
        pods = self.core.list_namespaced_pod(namespace, label_selector=label).items
        return len(pods) == 1 and any(
            c.type == "Ready" and c.status == "True" for c in pods[0].status.conditions or []
        )

    def log(self, namespace: str, pod: str) -> str:
        return self.runtime.log_path(namespace, pod, "worker").read_text(errors="replace")

    def worker_cpu(self, cluster: str) -> str:
        pods = self.core.list_namespaced_pod(
            "default", label_selector=f"ray.io/cluster={cluster},ray.io/node-type=worker"
        ).items
        return ",".join(sorted(p.spec.containers[0].resources.limits["cpu"] for p in pods))


@pytest_asyncio.fixture(scope="module")
async def world(
    dev_server: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    """One real control plane for the module, the kubelet simulator running raysize pods
    as processes, and a GCS stand-in for the RayClusters of namespace default."""
    tmp = tmp_path_factory.mktemp("deployed")
    cp = RealControlPlane()
    await asyncio.to_thread(cp.start)
    kubelet: Kubelet | None = None
    runtime: ProcessRuntime | None = None
    try:
        admin = cp.write_kubeconfig(tmp / "admin")
        runtime = ProcessRuntime(
            cp.http, "127.0.0.1", cp.port, cp.ca_pem, token_life_s=TOKEN_LIFE_S
        )
        nodes = [NodeSpec("node-a", 16000, 64 * GIB)]
        kubelet = Kubelet(
            ApiStore(admin),
            nodes,
            KubeletTiming(actuation_delay_s=0.0),
            runtime=runtime,
            schedules=False,  # kube-scheduler binds
        ).start()
        # a GCS stand-in for the RayCluster of each install
        with RayStandIn() as ray, RayStandIn() as helm_ray:
            core = client.CoreV1Api(config.new_client_from_config(config_file=str(admin)))
            with Registrar(core, {"deployed": ray, "helmed": helm_ray}):
                yield World(
                    cp,
                    runtime,
                    kubelet,
                    {"deployed": ray, "helmed": helm_ray},
                    admin,
                    tmp,
                    dev_server.client.service_client.config.target_host,
                    f"deployed-{uuid.uuid4().hex[:8]}",
                )
    finally:
        if kubelet is not None:
            await asyncio.to_thread(kubelet.stop)
        if runtime is not None:
            await asyncio.to_thread(runtime.close)
        await asyncio.to_thread(cp.close)


WORKER = "app.kubernetes.io/component=worker"


def deployment_pod(w: World, namespace: str, deployment: str) -> str | None:
    """The pod of the Deployment's current ReplicaSet (the one of its revision), made by
    the real controllers; None until there is exactly one, not being deleted."""
    apps = client.AppsV1Api(w.api)
    deploy = apps.read_namespaced_deployment(deployment, namespace)
    revision = (deploy.metadata.annotations or {}).get("deployment.kubernetes.io/revision")
    current = [
        rs.metadata.uid
        for rs in apps.list_namespaced_replica_set(namespace).items
        if any(o.uid == deploy.metadata.uid for o in rs.metadata.owner_references or [])
        and (rs.metadata.annotations or {}).get("deployment.kubernetes.io/revision") == revision
    ]
    pods = [
        p.metadata.name
        for p in w.core.list_namespaced_pod(namespace).items
        if not p.metadata.deletion_timestamp
        and any(o.uid in current for o in p.metadata.owner_references or [])
    ]
    return pods[0] if revision and len(pods) == 1 else None


@pytest_asyncio.fixture(scope="module")
async def kustomized(world: World) -> AsyncIterator[str]:
    """deploy/base applied (with the test's settings, watching also OTHER_NS, where it
    has no Role) and its Deployment's pod made by its ReplicaSet: the worker pod's name."""
    w = world
    w.core.create_namespace({"metadata": {"name": OTHER_NS}})
    overlay = w.overlay(
        "kustomize",
        DEPLOY / "base",
        {**w.settings("deployed"), "RAYSIZE_NAMESPACES": f"default,{OTHER_NS}"},
    )
    started = time.monotonic()
    applied = w.kubectl("apply", "-k", str(overlay))
    assert applied.returncode == 0, applied.stderr
    name = await eventually(lambda: deployment_pod(w, "raysize", "raysize-worker"), 60)
    w.started = started  # type: ignore[attr-defined]
    yield name


async def registered(w: World, cluster: str) -> None:
    """Until the cluster's worker pod runs and its stand-in Raylet is registered."""
    try:
        await eventually(
            lambda: any(n.startswith(f"{cluster}-small-") for n in w.rays[cluster].model.nodes), 90
        )
    except AssertionError:
        pods = w.core.list_namespaced_pod("default").items
        raise AssertionError(
            f"nodes {list(w.rays[cluster].model.nodes)}; pods "
            f"{[(p.metadata.name, p.status.phase) for p in pods]}; kubelet {w.kubelet.errors}; "
            f"operator: {w.cp.log_tail('ray-operator', 10)}"
        ) from None


def refused(w: World, token: str) -> bool:
    try:
        KubeHttp(w.cp.url, token, w.cp.ca_pem).call("GET", "/api/v1/namespaces/raysize/pods")
    except ApiError as err:
        return err.code == 401
    return False


def in_container(pid: int, path: str) -> str:
    """A file as the container's process sees it (its own mount namespace)."""
    done = subprocess.run(
        ["nsenter", f"--target={pid}", "--mount", "cat", path],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return done.stdout


def token_now(w: World, pod: str) -> str:
    return (w.runtime.token_dir("raysize", pod) / "token").read_text()


async def test_the_deployed_worker_grows_a_raycluster_and_outlives_its_token(
    world: World, kustomized: str
) -> None:
    w, pod = world, kustomized
    started: float = w.started  # type: ignore[attr-defined]
    await eventually(lambda: w.ready("raysize", WORKER), 60)
    print(f"worker pod Ready {time.monotonic() - started:.1f} s after kubectl apply")
    first_token = token_now(w, pod)
    # in-cluster config, nothing else: no kubeconfig in its env, the token at the pod's path
    pid = w.runtime.pid("raysize", pod, "worker")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    assert "KUBECONFIG" not in env and "RAYSIZE_KUBECONFIG" not in env
    assert env["KUBERNETES_SERVICE_PORT"] == str(w.cp.port)
    assert env["RAYSIZE_TASK_QUEUE"] == w.queue  # from the ConfigMap (envFrom)
    assert in_container(pid, f"{SA_PATH}/token") == first_token
    assert in_container(pid, f"{SA_PATH}/namespace") == "raysize"

    w.custom.create_namespaced_custom_object(
        "ray.io", "v1", "default", "rayclusters",
        # a resize-timeout longer than the rolling-update test's hold at the kubelet: with
        # the tests' 30 s, a roll slower than that (CI's load) timed the held resize out and
        # rolled it back on the old build before the roll was over
        ippr_cluster("deployed", replicas=1, cpu="1", memory="1Gi", max_cpu="4", timeout_s=600),
    )  # fmt: skip
    await registered(w, "deployed")
    w.rays["deployed"].add_demands({"CPU": 2.0}, 1)
    await eventually(lambda: w.worker_cpu("deployed") == "2", 90)
    print(f"first resize {time.monotonic() - started:.1f} s after kubectl apply")

    # the kubelet rewrites the token at 80 % of its life and the server refuses the old
    # one at its end: the worker keeps working with the new one
    first = w.runtime.rotations[0]
    await eventually(lambda: first.revoked is not None, 2 * TOKEN_LIFE_S)
    # the server caches a token's authentication for a few seconds: wait until it
    # refuses the old token itself
    await eventually(lambda: refused(w, first.token), 30)
    assert token_now(w, pod) != first_token
    w.rays["deployed"].add_demands(
        {"CPU": 2.0}, 1
    )  # 2 CPU placed, 2 more wanted: the pod grows to 4
    await eventually(lambda: w.worker_cpu("deployed") == "4", 90)
    log = w.log("raysize", pod)
    assert "Unauthorized" not in log, log[-3000:]  # the real server refused no token
    assert len([r for r in w.runtime.rotations if r.pod == pod]) >= 2


async def test_rbac_refusals_come_from_the_real_server_with_the_deployed_role(
    world: World, kustomized: str
) -> None:
    """The install watches OTHER_NS but grants nothing there: the real server refuses,
    and the worker says which permission is missing."""
    w, pod = world, kustomized
    await eventually(lambda: w.ready("raysize", WORKER), 60)
    cluster = ippr_cluster("elsewhere", replicas=1)
    w.custom.create_namespaced_custom_object("ray.io", "v1", OTHER_NS, "rayclusters", cluster)

    def said() -> list[str]:
        return [m for m in messages(w.log("raysize", pod)) if repr(OTHER_NS) in m]

    lines = await eventually(lambda: len(said()) >= 2 and said(), 30)
    text = "\n".join(lines)
    # at start: the dry-run Event the real server refused (403)
    assert f"raysize may not act in namespace '{OTHER_NS}'" in text, text
    # every discovery round: the real server's refusal, with the rule the Role lacks
    assert f"discovery skips namespace '{OTHER_NS}'" in text, text
    assert "system:serviceaccount:raysize:raysize" in text, text
    assert (
        'missing RBAC rule: apiGroups: ["ray.io"], resources: ["rayclusters"], '
        f'verbs: ["list"] in namespace "{OTHER_NS}"'
    ) in text, text


def messages(log: str) -> list[str]:
    """The messages of the worker's JSON log lines (RAYSIZE_LOG_FORMAT=json)."""
    out = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(" ".join(str(v) for v in record.values()))
    return out


async def test_a_rolling_update_strands_nothing(
    world: World, kustomized: str, dev_server: WorkflowEnvironment
) -> None:
    """#43 item 1: the image tag changed and the Deployment rolled, as `helm upgrade --set
    image.tag=…` does, with a resize held at the kubelet. The old build's worker is gone;
    the new one takes its version over (worker/takeover.py): the held resize ends, on the
    new build, the reconcile loop moves there, and new work is served, with no command
    beyond the roll."""
    w, old = world, kustomized
    temporal = dev_server.client
    await eventually(lambda: w.ready("raysize", WORKER), 60)
    ray = w.rays["deployed"]
    await eventually(lambda: w.worker_cpu("deployed") == "4", 90)  # the first test's pod
    # a demand for 2 CPU more: a new pod, launched at 2 CPU (deploy/'s launch-size policy);
    # its Raylet is brought to 2 CPU by a saga of its own, which ends at once
    ray.add_demands({"CPU": 2.0}, 1)
    await eventually(lambda: w.worker_cpu("deployed") == "2,4", 90)
    (launched,) = [
        p.metadata.name
        for p in w.core.list_namespaced_pod("default", label_selector=DEPLOYED_WORKERS).items
        if p.spec.containers[0].resources.limits["cpu"] == "2"
    ]
    settled = await eventually_async(lambda: ended_resize(temporal, launched), None, 60)
    assert settled == "launched at size", settled
    await no_resize_running(temporal, w.queue, 60)
    # and 2 CPU more: that pod grows 2 → 4 CPU, held at the kubelet until the roll is over
    # (a fixed 60 s hold ran out before a slow roll ended, and the resize ended on the old
    # build: seen in CI)
    w.kubelet.timing.actuation_delay_s = 900.0
    try:
        ray.add_demands({"CPU": 2.0}, 1)
        held = await eventually_async(lambda: running_resize(temporal, w.queue), None, 90)
        before = await build_of(temporal, *held)
        assert before == "0.2.0", before

        # the roll, one change as `helm upgrade` makes it: a new image tag and build ID in
        # the template. The Deployment controller's new ReplicaSet makes the new pod, and
        # once it is Ready the old pod is deleted (SIGTERM). Pods share the host's network
        # here, so the new one gets a metrics port of its own
        rolled = w.kubectl(
            "patch", "deployment/raysize-worker", "-n", "raysize", "--type=strategic",
            "-p", json.dumps(roll_to(ROLLED_BUILD, {"image": f"raysize:{ROLLED_BUILD}"})),
        )  # fmt: skip
        assert rolled.returncode == 0, rolled.stderr
        new = await eventually(lambda: rolled_from(w, old), 60)
        try:
            await eventually(lambda: ready_pod(w, new), 60)
        except AssertionError:
            raise AssertionError(w.log("raysize", new)[-3000:]) from None
        await eventually(lambda: not any(p.metadata.name == old for p in worker_pods(w)), 90)

        # the held resize ends, moved to the new build
        w.kubelet.timing.actuation_delay_s = 0.0
        w.kubelet.actuate_held_now()
        handle = temporal.get_workflow_handle(held[0], run_id=held[1], result_type=ResizeSagaState)
        ended = await asyncio.wait_for(handle.result(), 120)
        # it finished, not timed out and rolled back on whichever build ran its timer
        assert ended.outcome == ResizeOutcome.SUCCEEDED, ended
        assert await build_of(temporal, *held) == ROLLED_BUILD
    finally:
        w.kubelet.timing.actuation_delay_s = 0.0
    await eventually(lambda: w.worker_cpu("deployed") == "4,4", 60)
    # the loop runs on the new build, and new work is served there
    reconcile = reconcile_workflow_id("default", "deployed")
    await eventually_async(lambda: build_of(temporal, reconcile), ROLLED_BUILD, 60)
    ray.add_demands({"CPU": 2.0}, 1)
    await eventually(lambda: w.worker_cpu("deployed") == "2,4,4", 90)

    # the worker says what it did; its summary of the moves comes once every move is done,
    # which may be after the moved loop has served the new work (seen: 0.2 s after)
    def said() -> str:
        return "\n".join(messages(w.log("raysize", new)))

    try:
        await eventually(lambda: "after replaying their histories" in said(), 30)
    except AssertionError:
        raise AssertionError(said()[-3000:]) from None
    assert f"current in place of raysize-{w.queue}.0.2.0" in said(), said()[-3000:]


DEPLOYED_WORKERS = "ray.io/cluster=deployed,ray.io/node-type=worker"


async def ended_resize(temporal: Client, pod: str) -> str | None:
    """How the pod's resize saga began its decision ("launched at size", …) once it has
    ended Succeeded; None before."""
    try:
        handle = temporal.get_workflow_handle(f"resize/default/{pod}", result_type=ResizeSagaState)
        desc = await handle.describe()
    except RPCError:
        return None
    if desc.status != WorkflowExecutionStatus.COMPLETED:
        return None
    state = await handle.result()
    assert state.outcome == ResizeOutcome.SUCCEEDED, state
    memo = await desc.memo_value("reason", "")
    return str(memo).split(":")[0] or "ended"


async def no_resize_running(temporal: Client, queue: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while (running := await running_resize(temporal, queue)) is not None:
        assert time.monotonic() < end, f"a resize still runs after {timeout}s: {running}"
        await asyncio.sleep(0.2)


def roll_to(build: str | None, container: dict[str, Any]) -> dict[str, Any]:
    """A strategic-merge patch of the worker's pod template: `container`'s fields, the
    build ID `build` (None: as it is), and a metrics port of its own (the old and the new
    pod run side by side on the host's network while the Deployment rolls)."""
    env = [{"name": "RAYSIZE_PROMETHEUS_BIND", "value": f"127.0.0.1:{free_port()}"}]
    if build is not None:
        env.append({"name": "RAYSIZE_BUILD_ID", "value": build})
    worker = {"name": "worker", **container, "env": env}
    return {"spec": {"template": {"spec": {"containers": [worker]}}}}


def rolled_from(w: World, old: str) -> str | None:
    """The Deployment's new pod once the roll away from pod `old` has made it."""
    new = deployment_pod(w, "raysize", "raysize-worker")
    return new if new != old else None


def worker_pods(w: World) -> list[client.V1Pod]:
    return list(w.core.list_namespaced_pod("raysize", label_selector=WORKER).items)


def ready_pod(w: World, name: str) -> bool:
    for p in worker_pods(w):
        if p.metadata.name == name:
            conditions = p.status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)
    return False


async def test_a_failing_liveness_probe_restarts_the_container(
    world: World, kustomized: str
) -> None:
    """The worker stops (SIGSTOP: a hung worker, its heartbeat goes stale); the liveness
    probe (the deployed one, with a shorter period and max-age) fails and the kubelet
    restarts the container. The max-age stays above the worker's beat (every 10 s): at 3 s the
    probe failed a running worker 3 s after each beat, and the test passed only when its
    SIGSTOP came first (CI once saw the healthy worker stopped by SIGTERM, exit 0)."""
    w = world
    await eventually(lambda: w.ready("raysize", WORKER), 60)
    old = w.pod("raysize", WORKER).metadata.name
    probe = {
        "exec": {"command": ["python", "-m", "raysize.worker.health", "live",
                             "--max-age", str(DEFAULT_INTERVAL_S + 2)]},
        "initialDelaySeconds": 2, "periodSeconds": 1, "failureThreshold": 2, "timeoutSeconds": 5,
    }  # fmt: skip
    patch = roll_to(None, {"livenessProbe": probe})
    patch["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2
    patched = w.kubectl(
        "patch", "deployment/raysize-worker", "-n", "raysize", "--type=strategic",
        "-p", json.dumps(patch),
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr
    # the Deployment rolls to the patched template: its new pod, then the old one deleted
    name = await eventually(lambda: rolled_from(w, old), 60)
    await eventually(lambda: not any(p.metadata.name == old for p in worker_pods(w)), 90)
    await eventually(lambda: w.ready("raysize", WORKER), 60)
    os.kill(w.runtime.pid("raysize", name, "worker"), signal.SIGSTOP)

    def restarted() -> Any:
        cs = w.pod("raysize", WORKER).status.container_statuses[0]
        return cs.restart_count >= 1 and cs

    cs = await eventually(restarted, 60)
    assert cs.last_state.terminated.exit_code == 137, cs
    await eventually(lambda: w.ready("raysize", WORKER), 60)  # the new container is Ready


HELM_NS = "raysize-helm"  # "raysize" is still being emptied and deleted meanwhile


@pytest_asyncio.fixture
async def no_kustomize_install(world: World) -> AsyncIterator[None]:
    """The chart's cluster-scoped objects have the kustomize install's names: one at a
    time. The kustomize install is deleted, and its worker pod goes with it, as the
    garbage collector (the Deployment's ReplicaSet and its pod) and the namespace
    controller remove it; the chart is installed once no old worker runs."""
    w = world
    deleted = w.kubectl("delete", "-k", str(w.tmp / "kustomize"), "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    await eventually(lambda: not w.core.list_namespaced_pod("raysize").items, 90)
    yield


async def test_the_helm_chart_runs_too(world: World, no_kustomize_install: None) -> None:
    """The chart's install, a shorter smoke: the worker goes Ready and resizes a pod."""
    w = world
    args = [
        str(w.cp.parts.helm), "install", "raysize", str(DEPLOY / "helm" / "raysize"),
        "--namespace", HELM_NS, "--create-namespace", "--kubeconfig", str(w.admin),
    ]  # fmt: skip
    done = await asyncio.to_thread(_run, args, w.settings("helmed"))
    assert done.returncode == 0, done.stderr
    name = await eventually(lambda: deployment_pod(w, HELM_NS, _helm_deployment(w)), 60)
    await eventually(lambda: w.ready(HELM_NS, "app.kubernetes.io/name=raysize"), 60)
    w.custom.create_namespaced_custom_object(
        "ray.io", "v1", "default", "rayclusters", ippr_cluster("helmed", replicas=1, cpu="1"),
    )  # fmt: skip
    await registered(w, "helmed")
    w.rays["helmed"].add_demands({"CPU": 2.0}, 1)
    await eventually(lambda: w.worker_cpu("helmed") == "2", 90)
    assert "Unauthorized" not in w.log(HELM_NS, name)


def _helm_deployment(w: World) -> str:
    deploys = client.AppsV1Api(w.api).list_namespaced_deployment(HELM_NS).items
    (d,) = deploys
    return str(d.metadata.name)


def _run(args: list[str], settings: dict[str, str]) -> Any:
    values = {
        "temporal.address": settings["RAYSIZE_TEMPORAL_ADDRESS"],
        "temporal.taskQueue": settings["RAYSIZE_TASK_QUEUE"],
        "versioning.deploymentName": settings["RAYSIZE_DEPLOYMENT_NAME"],
        "config.RAYSIZE_GCS_ADDRESS": settings["RAYSIZE_GCS_ADDRESS"],
        "config.RAYSIZE_DISCOVERY_INTERVAL_S": "1",
    }
    flags = [x for k, v in values.items() for x in ("--set-string", f"{k}={v}")]
    # a number (values.schema.json refuses the port as a string)
    flags += ["--set", f"metrics.port={settings['RAYSIZE_PROMETHEUS_BIND'].rsplit(':', 1)[1]}"]
    return subprocess.run([*args, *flags], capture_output=True, text=True, timeout=120)
