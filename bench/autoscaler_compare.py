"""Ray's own autoscaler against raysize, end to end, on the same kind of cluster.

    python -m bench.autoscaler_compare [--worlds embedded,real] [--rounds 2]
        [--workloads one,pg,three,churn] [--controllers ray,raysize]

Per world, round, workload and controller, one controller at a time: a fresh sandbox (two
8-CPU nodes, real Ray in every pod, the kubelet actuating a resize at once) and one
RayCluster whose workers are 1 CPU and may grow in place to 4 CPU (`ray.io/ippr`) and
scale out to 4 pods, idle timeout 10 s, at least as many workers as it starts with.

- **ray**: Ray 2.60's unmodified autoscaler (`ray kuberay-autoscaler`, v2, IPPR), with what
  KubeRay gives its sidecar (`enableInTreeAutoscaling: true`). In the real world KubeRay
  v1.6 adds the `autoscaler` sidecar to the head pod and it runs there with the head's
  ServiceAccount token. In the embedded world the benchmark runs the same command on the
  host, with KubeRay's sidecar environment and the embedded server behind an HTTPS front
  (`sandbox/faultproxy.py`, no faults): Ray's client speaks nothing but HTTPS.
- **raysize**: a `raysize worker` process of this checkout (a Temporal dev server shared
  by the runs), `enableInTreeAutoscaling: false`.

The workloads (a Ray driver, started once the cluster's workers have joined; in the real
world in the head pod's network namespace, as `kubectl exec` would run it):

- `one`: one worker, a `{CPU: 2}` task of 2 s;
- `pg`: the same, then a PACK placement group of 2 × `{CPU: 2}` running a 2 s task in each
  bundle;
- `three`: three workers, 12 × `{CPU: 2}` tasks of 2 s;
- `churn`: one worker, four waves of six `{CPU: 1}` tasks of 1 s, 5, 15 and 5 s apart
  (around the idle timeout: a grown pod is shrunk or kept, a launched one drained or not);
- `tight`: other workloads' pods (bound before the cluster comes) fill node-a but for 2
  of its 8 CPU once the three workers run there (the group prefers it), and leave 6 free
  on node-b; then 6 × `{CPU: 2}` tasks of 2 s, more than the room beside the pods.
- `newnode` (real world only: the embedded world has no node autoscaler): other workloads'
  pods fill both nodes but for 1–2 CPU each; one worker; then 2 × `{CPU: 4}` tasks of 2 s
  (the group's maximum): no node has room for either, and Karpenter (its kwok provider, a
  NodePool of 4-, 8- and 16-CPU instance types) can add nodes for pods that wait.

Per run it prints: first task start and all done (seconds from the driver's first
submission; churn's sleeps between waves not counted), group ready (from the group's
submission), resizes (changes of a worker's CPU in the pod spec), pods launched, CPU added
(what the resizes grew plus the launched pods' size; shrinks not subtracted), peak CPU
(the most the workers had at once), tasks failed, and grows deferred (a worker's resize
the kubelet marked Deferred or Infeasible: its node had no room), and the nodes Karpenter
made (`newnode`). Then, per workload, the
medians and raysize's all-done time against Ray's, and a verdict: the workloads where
Ray's autoscaler finished first, if any. Every process is stopped by its process group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

from bench.clusters import KubeApis, ippr_cluster
from bench.procs import start_dev_server, start_raysize_worker, stop_on_sigterm
from raysize.activities.k8s_objects import gcs_address
from raysize.sandbox import karpenter, reaper
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.faultproxy import FaultProxy
from raysize.sandbox.faults import Faults
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.localray import stop_group
from raysize.sandbox.realworld import RealSandbox
from raysize.workflows.resources import parse_quantity

GIB = 1024**3
LAUNCH_SIZE_POLICY = (
    Path(__file__).parents[1] / "deploy" / "components" / "launch-size" / "policy.yaml"
)
NS = "default"
WORLDS = ("embedded", "real")
CONTROLLERS = ("ray", "raysize")
IDLE_TIMEOUT_S = 10
CHURN_GAPS_S = (5, 15, 5)  # between the four waves: around the idle timeout
RUN_TIMEOUT_S = 300.0
# After the workers joined and before the first task: a controller in a real cluster runs
# long before work comes (Ray's autoscaler looks every 5 s; raysize's worker is up first)
SETTLE_S = 10.0


@dataclass(frozen=True)
class Workload:
    workers: int
    what: str
    # other workloads' pods, bound to a node before the cluster comes: (node, millicores)
    fillers: tuple[tuple[str, int], ...] = ()
    prefer: str = ""  # the node the worker group prefers (where there is room)
    karpenter: bool = False  # a node autoscaler runs (Karpenter: the real world only)
    worlds: tuple[str, ...] = ("embedded", "real")  # where it can run


WORKLOADS = {
    "one": Workload(1, "one worker, a {CPU: 2} task"),
    "pg": Workload(1, "the same, then a PACK group of 2 x {CPU: 2}"),
    "three": Workload(3, "three workers, 12 x {CPU: 2}"),
    "churn": Workload(1, "4 waves of 6 x {CPU: 1}, 5/15/5 s apart"),
    "tight": Workload(
        3,
        "three workers on a node other pods fill but 2 of 8 CPU (6 free on the other), "
        "6 x {CPU: 2}",
        fillers=(("node-a", 3000), ("node-b", 2000)),
        prefer="node-a",
    ),
    "newnode": Workload(
        1,
        "other pods fill both nodes but 1-2 CPU, 2 x {CPU: 4}: new nodes needed (Karpenter)",
        fillers=(("node-a", 6000), ("node-b", 6000)),
        karpenter=True,
        worlds=("real",),
    ),
}

# The workload's driver. argv: GCS address, workload, workers to wait for, churn gaps, the
# seconds to leave the controller after they joined (before the first submission).
# Prints one JSON line: t0 (first submission, host clock), the tasks' start times, the
# group's ready time, the end, and the tasks that failed.
DRIVER = textwrap.dedent(
    """
    import json, sys, time, ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    gcs, workload, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    gaps = [float(g) for g in sys.argv[4].split(",")]
    settle = float(sys.argv[5])
    ray.init(address=gcs, log_to_driver=False, configure_logging=False)
    joined_by = time.time() + 180
    while len([n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]) < workers:
        if time.time() > joined_by:
            print(json.dumps({"error": f"{workers} workers did not join in 180 s"}), flush=True)
            sys.exit(3)
        time.sleep(0.2)
    time.sleep(settle)

    @ray.remote(max_retries=0)
    def work(hold):
        started = time.time()
        time.sleep(hold)
        return started

    out = {"starts": [], "failed": 0, "errors": [], "slept": 0.0}

    def wait(refs):
        for ref in refs:
            try:
                out["starts"].append(ray.get(ref, timeout=240))
            except Exception as exc:
                out["failed"] += 1
                out["errors"].append(repr(exc)[:300])

    out["t0"] = time.time()
    if workload in ("one", "pg"):
        wait([work.options(num_cpus=2).remote(2)])
    if workload == "pg":
        asked = time.time()
        pg = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="PACK")
        ray.get(pg.ready(), timeout=240)
        out["group_ready"] = time.time() - asked
        bundle = lambda b: PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b)
        wait([work.options(num_cpus=2, scheduling_strategy=bundle(b)).remote(2) for b in range(2)])
        remove_placement_group(pg)
    if workload == "three":
        wait([work.options(num_cpus=2).remote(2) for _ in range(12)])
    if workload == "tight":
        wait([work.options(num_cpus=2).remote(2) for _ in range(6)])
    if workload == "newnode":
        wait([work.options(num_cpus=4).remote(2) for _ in range(2)])
    if workload == "churn":
        for wave in range(len(gaps) + 1):
            wait([work.options(num_cpus=1).remote(1) for _ in range(6)])
            if wave < len(gaps):
                time.sleep(gaps[wave])
                out["slept"] += gaps[wave]
    out["end"] = time.time()
    print(json.dumps(out), flush=True)
    """
)


@dataclass
class Result:
    world: str
    workload: str
    controller: str
    round: int
    first_start_s: float | None = None
    group_ready_s: float | None = None
    done_s: float | None = None
    resizes: int = 0
    launched: int = 0
    cpu_added: float = 0.0
    peak_cpu: float = 0.0
    failed: int = 0
    deferred: int = 0  # grows the kubelet deferred (or found infeasible): no room on the node
    new_nodes: int = 0  # nodes Karpenter made during the run
    error: str = ""


# --- what the pods did: from a watch started before the RayCluster exists ------------------
@dataclass
class PodEvents:
    """(host time, event type, pod name, CPU of its first container's spec) of every
    worker pod event, in the order the watch delivered them."""

    events: list[tuple[float, str, str, float]] = field(default_factory=list)
    # (host time, pod) of each time a worker's resize became Deferred or Infeasible
    deferred: list[tuple[float, str]] = field(default_factory=list)
    _pending: set[str] = field(default_factory=set)

    def record(self, kind: str, pod: Any) -> None:
        labels = pod.metadata.labels or {}
        if labels.get("ray.io/node-type") != "worker":
            return
        res = pod.spec.containers[0].resources
        cpu = (res.requests or {}).get("cpu") or (res.limits or {}).get("cpu") or "0"
        name = pod.metadata.name
        self.events.append((time.time(), kind, name, float(parse_quantity(cpu))))
        pending = any(
            c.type == "PodResizePending" and c.reason in ("Deferred", "Infeasible")
            for c in (pod.status.conditions if pod.status else None) or []
        )
        if pending and name not in self._pending:
            self.deferred.append((time.time(), name))
        self._pending = (self._pending | {name}) if pending else (self._pending - {name})


def account(
    events: list[tuple[float, str, str, float]], t0: float
) -> tuple[int, int, float, float]:
    """(resizes, pods launched, CPU added, peak CPU) from `t0` on: a change of a worker's
    CPU is a resize (what it grew counts as added); a worker first seen from `t0` on was
    launched (its size counts as added); the peak is the most CPU the workers had at once
    (what was bought, however often it was shrunk and grown again)."""
    size: dict[str, float] = {}
    resizes, launched, added, peak = 0, 0, 0.0, 0.0
    for at, kind, name, cpu in events:
        if kind == "DELETED":
            size.pop(name, None)
            continue
        before = size.get(name)
        size[name] = cpu
        if at < t0:
            continue
        if before is None:
            launched += 1
            added += cpu
        elif cpu != before:
            resizes += 1
            added += max(0.0, cpu - before)
        peak = max(peak, sum(size.values()))
    return resizes, launched, added, peak


def watch_pods(
    core: client.CoreV1Api, cluster: str, into: PodEvents, stop: threading.Event
) -> None:
    """Record the cluster's pod events until `stop` (a watch resumed from its last version
    when the server ends it)."""
    version = ""
    while not stop.is_set():
        w = watch.Watch()
        try:
            for event in w.stream(
                core.list_namespaced_pod,
                NS,
                label_selector=f"ray.io/cluster={cluster}",
                resource_version=version or None,
                timeout_seconds=5,
            ):
                pod = event["object"]
                version = pod.metadata.resource_version
                into.record(event["type"], pod)
                if stop.is_set():
                    break
        except Exception:  # an expired version (410), a dropped connection: from now
            version = ""
            time.sleep(0.2)
        finally:
            w.stop()


# --- a world, for one run -----------------------------------------------------------------
def sandbox_config() -> SandboxConfig:
    return SandboxConfig(
        node_specs=[NodeSpec(f"node-{c}", 8000, 32 * GIB) for c in "ab"],
        with_ray=True,
        timing=KubeletTiming(actuation_delay_s=0.0),
    )


class World(KubeApis):
    """A fresh sandbox of `kind` with real Ray; `https` an HTTPS front of the embedded
    server for Ray's autoscaler."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind, self.tmp = kind, tmp
        self.sandbox: Sandbox | RealSandbox = (
            Sandbox(sandbox_config()) if kind == "embedded" else RealSandbox(sandbox_config())
        )
        self.front: FaultProxy | None = None

    def __enter__(self) -> World:
        self.sandbox.start()
        try:
            self.kubeconfig = self.sandbox.write_kubeconfig(self.tmp / "kubeconfig")
            self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
            if isinstance(self.sandbox, Sandbox):
                self.front = FaultProxy(self.sandbox.url, None, Faults(), self.tmp).start()
            else:
                self.launch_size_policy()
        except BaseException:
            self.sandbox.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.front is not None:
            self.front.close()
        self.api.close()
        self.sandbox.close()

    def launch_size_policy(self) -> None:
        """deploy/'s launch-size admission policy, as a user's install has it (the embedded
        server applies it always): it changes only the pods of groups raysize wrote a size
        for, so Ray's autoscaler's runs are as they were. Active a moment after it is made:
        the first pods it matters for come after the cluster's start."""
        assert isinstance(self.sandbox, RealSandbox)
        cp = self.sandbox.control_plane
        for doc in yaml.safe_load_all(LAUNCH_SIZE_POLICY.read_text()):
            plural = (
                "mutatingadmissionpolicies"
                if doc["kind"].endswith("Policy")
                else ("mutatingadmissionpolicybindings")
            )
            cp.request("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", doc)

    def node_pool(self) -> None:
        """Karpenter (kwok provider) on this world, and a NodePool of its instance types,
        Ready (a pod pending before Karpenter judged its pool is passed over for 10 s)."""
        assert isinstance(self.sandbox, RealSandbox), "Karpenter runs in the real world only"
        self.sandbox.start_karpenter()
        self.custom.create_cluster_custom_object(
            "karpenter.sh", "v1", "nodepools", karpenter.node_pool("compare")
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pool: dict[str, Any] = self.custom.get_cluster_custom_object(  # type: ignore[assignment]
                "karpenter.sh", "v1", "nodepools", "compare"
            )
            conditions = (pool.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return
            time.sleep(0.2)
        raise TimeoutError("Karpenter's NodePool not Ready in 60 s")

    def karpenters_nodes(self) -> int:
        if (
            not isinstance(self.sandbox, RealSandbox)
            or self.sandbox.control_plane.karpenter is None
        ):
            return 0
        nodes = self.core.list_node().items
        return sum(1 for n in nodes if karpenter.made_by_karpenter(n.to_dict()))

    def head(self, cluster: str) -> str:
        pods: list[Any] = self.core.list_namespaced_pod(
            NS, label_selector=f"ray.io/cluster={cluster},ray.io/node-type=head"
        ).items
        running = [str(p.metadata.name) for p in pods if p.status.phase == "Running"]
        return running[0] if running else ""

    def gcs(self, cluster: str) -> str:
        rc = self.custom.get_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", cluster)
        return gcs_address(rc)  # type: ignore[arg-type]

    def driver(self, cluster: str, *args: str) -> subprocess.Popen[str]:
        """The workload's driver where a driver of `cluster` runs: on the host in the
        embedded world (its Ray nodes share the host's address), in the head pod's network
        namespace in the real one."""
        env = {"RAY_USAGE_STATS_ENABLED": "0", "PATH": str(Path(sys.executable).parent)}
        if isinstance(self.sandbox, Sandbox):
            proc = subprocess.Popen(
                [sys.executable, "-c", DRIVER, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env=env,
            )
            reaper.guard(proc)
            return proc
        assert self.sandbox.runtime is not None, "the real world runs Ray with with_ray=True"
        return self.sandbox.runtime.exec(
            NS,
            self.head(cluster),
            ["python", "-c", DRIVER, *args],
            env={"RAY_USAGE_STATS_ENABLED": "0", "GRPC_DNS_RESOLVER": "native"},
        )

    def ray_autoscaler(self, cluster: str, gcs: str, log: Path) -> subprocess.Popen[bytes] | None:
        """Ray's autoscaler for `cluster`: KubeRay's sidecar already runs it in the real
        world (None); in the embedded world this command, on the host, as the sidecar's
        (`ray kuberay-autoscaler`), with the environment KubeRay gives it and the embedded
        server's HTTPS front as the in-cluster API server."""
        if self.front is None:
            return None
        port = self.front.url.rsplit(":", 1)[1]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYSIZE_"))},
            "RAY_CLUSTER_NAME": cluster,
            "RAY_CLUSTER_NAMESPACE": NS,
            "RAY_HEAD_POD_NAME": self.head(cluster),
            "KUBERAY_CRD_VER": "v1",
            "RAY_USAGE_STATS_ENABLED": "0",
            # it runs `ray health-check` by name, as in the image
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            # no ServiceAccount token on the host: Ray's client-certificate option instead
            # (the front asks for none), and the front's CA
            "RAY_KUBERAY_CA_CERT_PATH": str(self.tmp / "fault-proxy.crt"),
            "RAY_KUBERAY_CLIENT_CERT_PATH": str(self.tmp / "fault-proxy.crt"),
            "RAY_KUBERAY_CLIENT_KEY_PATH": str(self.tmp / "fault-proxy.key"),
        }
        ray = str(Path(sys.executable).with_name("ray"))
        argv = [ray, "kuberay-autoscaler", "--cluster-name", cluster, "--cluster-namespace", NS]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [*argv, "--gcs-address", gcs],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        reaper.guard(proc)
        return proc


def compare_cluster(name: str, workload: str, controller: str) -> dict[str, Any]:
    workers = WORKLOADS[workload].workers
    rc = ippr_cluster(
        name, replicas=workers, max_replicas=4, idle_timeout_s=IDLE_TIMEOUT_S, timeout_s=30
    )
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = workers
    prefer = WORKLOADS[workload].prefer
    if prefer:  # where it fits, as a node pool's pods often share nodes with others
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}
        rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [term]}}
                ]
            }
        }
    if controller == "ray":
        rc["spec"]["enableInTreeAutoscaling"] = True
        rc["spec"]["autoscalerOptions"]["version"] = "v2"
    return rc


def filler(name: str, node: str, millicores: int) -> dict[str, Any]:
    """Another workload's pod, bound to `node`, asking for `millicores`."""
    resources = {"cpu": f"{millicores}m", "memory": "64Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "other-workload"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


async def until(check: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            got = await asyncio.to_thread(check)
            if got:
                return got
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not in {timeout:.0f} s")
        await asyncio.sleep(0.3)


def ray_autoscaler_ready(world: World, cluster: str, log: Path) -> bool:
    """Ray's autoscaler has listed the cluster's pods once (its first pass): in the
    embedded world from its log; in the real world its sidecar container is running (the
    settle time covers its first pass)."""
    if world.front is None:
        pods: list[Any] = world.core.list_namespaced_pod(
            NS, label_selector=f"ray.io/cluster={cluster},ray.io/node-type=head"
        ).items
        return any(
            cs.name == "autoscaler" and cs.state.running is not None
            for p in pods
            for cs in p.status.container_statuses or []
        )
    with contextlib.suppress(OSError):
        return "Fetched pod data" in log.read_text(errors="replace")
    return False


def last_line(log: Path) -> str:
    """The last line of a log that says something, for an error."""
    with contextlib.suppress(OSError):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else "(its log is empty)"
    return "(no log)"


def stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        stop_group(proc)


async def one_run(
    world_kind: str, workload: str, controller: str, number: int, temporal: str, tmp: Path
) -> Result:
    result = Result(world_kind, workload, controller, number)
    # unique in the whole benchmark: every run shares one Temporal server, and a reconcile
    # workflow left by a run (`reconcile/<ns>/<name>`) would make a later run's discovery
    # think its cluster is managed already (the real world's raysize run once never acted)
    name = f"{workload}-{controller}-{world_kind[0]}{number}"
    run_dir = tmp / world_kind / name
    run_dir.mkdir(parents=True)
    events, watching = PodEvents(), threading.Event()
    procs: list[subprocess.Popen[Any] | None] = []
    with World(world_kind, run_dir) as world:
        watcher = threading.Thread(
            target=watch_pods, args=(world.core, name, events, watching), daemon=True
        )
        watcher.start()
        try:
            if controller == "raysize":
                procs.append(
                    start_raysize_worker(
                        run_dir / "raysize.log",  # its own process group
                        temporal,
                        f"compare-{uuid.uuid4().hex[:8]}",
                        world.kubeconfig,
                        namespaces=NS,
                        discovery_interval_s="1",
                    )
                )
            core: Any = world.core  # the pods as the API's JSON
            for i, (node, cpu) in enumerate(WORKLOADS[workload].fillers):
                core.create_namespaced_pod(NS, filler(f"{name}-other-{i}", node, cpu))
            for i in range(len(WORKLOADS[workload].fillers)):
                await until(
                    lambda i=i: (
                        core.read_namespaced_pod(f"{name}-other-{i}", NS).status.phase == "Running"
                    ),
                    60,
                    "another workload's pod Running",
                )
            if WORKLOADS[workload].karpenter:
                await asyncio.to_thread(world.node_pool)
            world.custom.create_namespaced_custom_object(
                "ray.io", "v1", NS, "rayclusters", compare_cluster(name, workload, controller)
            )
            gcs = await until(lambda: world.gcs(name), 120, "the GCS address")
            await until(lambda: world.head(name), 120, "the head pod Running")
            controller_log = run_dir / ("raysize.log" if controller == "raysize" else "ray.log")
            if controller == "ray":
                procs.append(world.ray_autoscaler(name, gcs, controller_log))
            if controller == "ray":
                await until(
                    lambda: ray_autoscaler_ready(world, name, controller_log),
                    120,
                    "Ray's autoscaler",
                )
            gaps = ",".join(str(g) for g in CHURN_GAPS_S)
            workers = str(WORKLOADS[workload].workers)
            driver = world.driver(name, gcs, workload, workers, gaps, str(SETTLE_S))
            procs.append(driver)
            ended = asyncio.create_task(asyncio.to_thread(driver.communicate))
            started = time.monotonic()
            # the first submission, about (the driver prints its own once it ends)
            submitted = time.time() + SETTLE_S
            while not ended.done():
                gone = [p for p in procs[:-1] if p is not None and p.poll() is not None]
                late = time.monotonic() - started > RUN_TIMEOUT_S
                if gone or late:
                    stop(driver)
                    await ended
                    result.error = (
                        f"the workload did not end in {RUN_TIMEOUT_S:.0f} s"
                        if late
                        else f"the {controller} controller ended (exit {gone[0].returncode}): "
                        + last_line(controller_log)
                    )
                    # what it did meanwhile, from about the first submission
                    accounted = account(events.events, submitted)
                    result.resizes, result.launched, result.cpu_added, result.peak_cpu = accounted
                    result.deferred = sum(1 for at, _ in events.deferred if at >= submitted)
                    result.new_nodes = world.karpenters_nodes()
                    return result
                await asyncio.sleep(0.5)
            out, err = ended.result()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if driver.returncode != 0 or not lines:
                result.error = (lines[-1] if lines else err.strip().splitlines()[-1:] or ["?"])[0]
                result.error = f"driver exit {driver.returncode}: {result.error}"[:300]
                return result
            run = json.loads(lines[-1])
            t0 = float(run["t0"])
            result.first_start_s = min(run["starts"]) - t0 if run["starts"] else None
            result.group_ready_s = run.get("group_ready")
            result.done_s = float(run["end"]) - t0 - float(run["slept"])
            result.failed = int(run["failed"])
            if run["errors"]:
                result.error = run["errors"][0]
            await asyncio.sleep(1.0)  # the watch's last events
            accounted = account(events.events, t0)
            result.resizes, result.launched, result.cpu_added, result.peak_cpu = accounted
            result.deferred = sum(1 for at, _ in events.deferred if at >= t0)
            result.new_nodes = world.karpenters_nodes()
            return result
        finally:
            watching.set()
            for proc in reversed(procs):
                stop(proc)
            watcher.join(10)


# --- the report ---------------------------------------------------------------------------
def fmt(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.1f} {unit}".rstrip()


HEADER = (
    f"{'world':9} {'workload':8} {'controller':10} {'round':>5} {'first start':>11} "
    f"{'group ready':>11} {'all done':>9} {'resizes':>7} {'launched':>8} {'CPU added':>9} "
    f"{'peak CPU':>8} {'failed':>6} {'deferred':>8} {'new nodes':>9}"
)


def row(r: Result) -> str:
    if r.error and r.done_s is None:
        did = (
            f" (meanwhile: {r.resizes} resizes, {r.launched} launched, CPU added "
            f"{r.cpu_added:g}, {r.deferred} deferred, {r.new_nodes} new nodes)"
            if r.resizes or r.launched or r.deferred or r.new_nodes
            else ""
        )
        return f"{r.world:9} {r.workload:8} {r.controller:10} {r.round:>5} ERROR {r.error}{did}"
    return (
        f"{r.world:9} {r.workload:8} {r.controller:10} {r.round:>5} {fmt(r.first_start_s):>11} "
        f"{fmt(r.group_ready_s):>11} {fmt(r.done_s):>9} {r.resizes:>7} {r.launched:>8} "
        f"{r.cpu_added:>9g} {r.peak_cpu:>8g} {r.failed:>6} {r.deferred:>8} {r.new_nodes:>9}"
        + (f"  ({r.error})" if r.error else "")
    )


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summary(results: list[Result]) -> tuple[list[str], list[str]]:
    """Per world and workload, both controllers' medians and raysize's all-done time
    against Ray's; and the (world, workload)s where Ray's autoscaler finished first (or
    a controller failed a run)."""
    lines, behind = [], []
    keys = sorted({(r.world, r.workload) for r in results}, key=lambda k: (k[0], k[1]))
    for world, workload in keys:
        per = {
            c: [r for r in results if (r.world, r.workload, r.controller) == (world, workload, c)]
            for c in CONTROLLERS
        }
        done = {c: median([r.done_s for r in rs]) for c, rs in per.items()}
        parts = []
        for c, rs in per.items():
            if not rs:
                continue
            parts.append(
                f"{c}: first start {fmt(median([r.first_start_s for r in rs]))}, "
                + (
                    f"group ready {fmt(median([r.group_ready_s for r in rs]))}, "
                    if any(r.group_ready_s is not None for r in rs)
                    else ""
                )
                + f"all done {fmt(done[c])}, resizes {median([float(r.resizes) for r in rs]):g}, "
                f"launched {median([float(r.launched) for r in rs]):g}, "
                f"CPU added {median([r.cpu_added for r in rs]):g}, "
                f"peak CPU {median([r.peak_cpu for r in rs]):g}, "
                f"failed {sum(r.failed for r in rs)}, "
                f"grows deferred {sum(r.deferred for r in rs)}"
                + (
                    f", new nodes {median([float(r.new_nodes) for r in rs]):g}"
                    if WORKLOADS[workload].karpenter
                    else ""
                )
            )
        verdict = ""
        ours, theirs = done.get("raysize"), done.get("ray")
        if per["raysize"] and per["ray"]:
            failed = [r for rs in per.values() for r in rs if r.done_s is None or r.failed]
            if failed or ours is None or theirs is None:
                verdict = "a run failed"
                behind.append(f"{world}/{workload} (a run failed)")
            else:
                verdict = f"raysize {theirs / ours:.2f}x sooner" if ours else ""
                if ours > theirs:
                    verdict = f"raysize {ours / theirs:.2f}x LATER"
                    behind.append(f"{world}/{workload}")
        lines.append(
            f"{world}/{workload}: " + "; ".join(parts) + (f" -> {verdict}" if verdict else "")
        )
    return lines, behind


async def run_all(args: argparse.Namespace) -> list[Result]:
    """Every run `args` asks for, one at a time, each row printed as it ends."""
    worlds, workloads, controllers = args.worlds, args.workloads, args.controllers
    results: list[Result] = []
    env = await start_dev_server() if "raysize" in controllers else None
    try:
        temporal = env.client.service_client.config.target_host if env is not None else ""
        with tempfile.TemporaryDirectory(prefix="raysize-compare-") as removed:
            tmp_dir = tempfile.mkdtemp(prefix="raysize-compare-") if args.keep_logs else removed
            if args.keep_logs:
                print(f"logs (kept): {tmp_dir}", flush=True)
            print(HEADER, flush=True)
            for world in worlds:
                for number in range(1, args.rounds + 1):
                    for workload in workloads:
                        if world not in WORKLOADS[workload].worlds:
                            continue  # (`newnode` needs Karpenter: the real world's)
                        for controller in controllers:
                            r = await one_run(
                                world, workload, controller, number, temporal, Path(tmp_dir)
                            )
                            results.append(r)
                            print(row(r), flush=True)
    finally:
        if env is not None:
            await env.shutdown()
    return results


async def main_async(args: argparse.Namespace) -> int:
    results = await run_all(args)
    lines, behind = summary(results)
    print()
    for line in lines:
        print(line)
    load = os.getloadavg()[0]
    print(f"\nload average (1 min) at the end: {load:.1f}")
    if len(args.controllers) < 2:
        print("verdict: one controller only, nothing compared")
        return 0
    if behind:
        print("verdict: Ray's autoscaler finished first (or a run failed) on " + ", ".join(behind))
        return 1
    print("verdict: raysize finished first or level on every workload")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.autoscaler_compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--worlds", default="embedded,real", help="embedded, real or both (default)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each workload per controller")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="of: " + ", ".join(
        f"{k} ({w.what})" for k, w in WORKLOADS.items()))  # fmt: skip
    p.add_argument("--controllers", default="ray,raysize", help="ray, raysize or both")
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep each run's logs (raysize worker, Ray's autoscaler, kubeconfig) and say where",
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    for name, known in (
        ("worlds", WORLDS),
        ("workloads", tuple(WORKLOADS)),
        ("controllers", CONTROLLERS),
    ):
        given = [g.strip() for g in getattr(args, name).split(",") if g.strip()]
        unknown = [g for g in given if g not in known]
        if unknown or not given:
            p.error(
                f"--{name}: {', '.join(unknown) or 'none given'}; choose from {', '.join(known)}"
            )
        setattr(args, name, given)
    return args


def main() -> None:
    stop_on_sigterm()
    sys.exit(asyncio.run(main_async(parse_args())))


if __name__ == "__main__":
    main()
