"""raysize against the real kube-apiserver's own 429s (issue #30 item 2): API Priority and
Fairness starves raysize's ServiceAccount, then lets it go.

    python -m bench.apf_bench [--workers 4]

The real control plane (kube-apiserver v1.36 + etcd + KubeRay, the kubelet simulated),
deploy/ applied, and a `raysize worker` process with the `raysize/raysize`
ServiceAccount's token (RBAC enforced). Ray is the GCS stand-in
(`sandbox/ray_standin.py`). One RayCluster of `--workers` 1-CPU workers (at most 4 CPU
each).

1. A PriorityLevelConfiguration `raysize-starved` (Limited, nominalConcurrencyShares 0,
   nothing lent or borrowed, limitResponse Reject) and a FlowSchema of the same name
   that puts every request of that ServiceAccount there (matchingPrecedence 100, before
   the built-in `service-accounts` at 9000). A level of zero seats admits a request only
   while none of its own executes (the queueSet's rule for a request wider than the
   limit): one at a time, every other at once 429 "Too many requests". Watches hold no
   seat once started.
2. Demand while starved: a `{CPU: 2}` task per worker (each pod to grow 1 → 2 CPU).
3. The FlowSchema and the level deleted; at once a `{CPU: 1}` task per worker more (2 →
   3 CPU). Recovery: from the deletion until every task runs.

It prints the 429s the server gave the ServiceAccount
(`apiserver_flowcontrol_rejected_requests_total`), what the worker's log called them,
the resize sagas per pod (none may run twice for the same change), the pods' sizes in
Kubernetes against their Raylets', and the recovery time (issue bound: < 30 s).
tests/e2e/test_apf.py runs the same and asserts each of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from temporalio.client import Client

from bench.clusters import small_raycluster
from bench.fleet_bench import Registrar
from bench.procs import ONE_PARTITION, start_dev_server, start_raysize_worker, until
from raysize.sandbox.apistore import KubeHttp
from raysize.sandbox.cluster import SandboxConfig
from raysize.sandbox.errors import ApiError
from raysize.sandbox.kubelet import KubeletTiming, NodeSpec
from raysize.sandbox.localray import stop_group
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.realworld import RealControlPlane, RealSandbox
from raysize.workflows.naming import RESIZE_CHANGE, RESIZE_OUTCOME, reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow

GIB = 1024**3
NS = "default"
ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
RAYSIZE_SA = ("raysize", "raysize")  # deploy/base's ServiceAccount: namespace, name
STARVED = "raysize-starved"  # raysize's FlowSchema and the PriorityLevelConfiguration
NEIGHBOUR = "apf-neighbour"  # the other client of that level: ServiceAccount, FlowSchema
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
MAX_RECOVERY_S = 30.0  # issue #30: the loops act again within 30 s
MIN_REJECTED = 5  # 429s the starved worker must have met before it is let go


def priority_level() -> dict[str, Any]:
    """Zero nominal seats, none borrowed (borrowingLimitPercent 0: else it borrows from the
    idle levels and nothing is rejected), none lent; over the limit: 429 at once."""
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": STARVED},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 0,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            },
        },
    }


def flow_schema(name: str, namespace: str, account: str) -> dict[str, Any]:
    """Every request (any verb, resource or URL) of ServiceAccount namespace/account to
    `STARVED`; precedence 100 wins over the built-in `service-accounts` (9000)."""
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": STARVED},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {"namespace": namespace, "name": account},
                        }
                    ],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "namespaces": ["*"],
                            "clusterScope": True,
                        }
                    ],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


def starve(cp: RealControlPlane) -> str:
    """Create the level and the two FlowSchemas (raysize's, the neighbour's); the UID of
    raysize's."""
    cp.request("POST", f"{FLOWCONTROL}/prioritylevelconfigurations", priority_level())
    cp.request("POST", f"{FLOWCONTROL}/flowschemas", flow_schema(NEIGHBOUR, NS, NEIGHBOUR))
    made = cp.request("POST", f"{FLOWCONTROL}/flowschemas", flow_schema(STARVED, *RAYSIZE_SA))
    return str(made["metadata"]["uid"])


def unstarve(cp: RealControlPlane) -> None:
    """Delete raysize's FlowSchema (its requests fall back to `service-accounts`), then
    the neighbour's and the level."""
    for path in (
        f"flowschemas/{STARVED}",
        f"flowschemas/{NEIGHBOUR}",
        f"prioritylevelconfigurations/{STARVED}",
    ):
        try:
            cp.request("DELETE", f"{FLOWCONTROL}/{path}")
        except ApiError as err:
            if err.code != 404:
                raise


class Neighbour:
    """Another client of the starved level (ServiceAccount default/`NEIGHBOUR`, its own
    FlowSchema): `threads` loops of LIST pods on kept-alive connections, so the level's
    one seat is mostly taken, as a busy controller sharing a level keeps it. Alone,
    raysize seldom has two requests in flight at once: it met three 429s in 60 s."""

    def __init__(self, cp: RealControlPlane, threads: int = 2) -> None:
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}"
        rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
        cp.request("POST", f"{rbac}/roles", {"metadata": {"name": NEIGHBOUR}, "rules": [rule]})
        cp.request(
            "POST",
            f"{rbac}/rolebindings",
            {
                "metadata": {"name": NEIGHBOUR},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": NEIGHBOUR,
                },
                "subjects": [{"kind": "ServiceAccount", "name": NEIGHBOUR, "namespace": NS}],
            },
        )
        self.token = cp.service_account_token(NS, NEIGHBOUR)
        self.port, self.ca_pem = cp.port, cp.ca_pem
        self.stop = threading.Event()
        self.calls: Counter[int] = Counter()  # HTTP status → count
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode())
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=10)
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        while not self.stop.is_set():
            try:
                conn.request("GET", f"/api/v1/namespaces/{NS}/pods", headers=headers)
                resp = conn.getresponse()
                resp.read()
                self.calls[resp.status] += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx)
        conn.close()

    def __enter__(self) -> Neighbour:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def classified_as(sa: KubeHttp, uid: str) -> bool:
    """Whether the server now puts the ServiceAccount's requests under FlowSchema `uid`
    (APF names the FlowSchema of every answer in X-Kubernetes-PF-FlowSchema-UID). A 429
    says so too: nothing else rejects here."""
    try:
        with sa.open("GET", f"/api/v1/namespaces/{NS}/pods?limit=1") as resp:
            return resp.headers.get("X-Kubernetes-PF-FlowSchema-UID") == uid
    except ApiError as err:
        return err.code == 429


_REJECTED = re.compile(
    r"^apiserver_flowcontrol_rejected_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$"
)


def rejected(cp: RealControlPlane) -> int:
    """The server's count of requests of `STARVED` it answered 429, from its /metrics
    (read as admin: exempt from APF)."""
    with cp.http.open("GET", "/metrics") as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = _REJECTED.match(line)
        if m and f'flow_schema="{STARVED}"' in m.group("labels"):
            total += float(m.group("value"))
    return int(total)


def log_says(log: str) -> dict[str, int]:
    """What the worker's log said of the 429s: lines with the server's words, the error
    types raysize gave them (`KubernetesThrottled`; `KubernetesUnavailable` before 0.2),
    and `episodes`: the lines that say a throttling began (one per episode, not per 429;
    activities/kube_limits.py)."""
    lines = [ln for ln in log.splitlines() if "Too many requests" in ln or " 429" in ln]
    kinds: Counter[str] = Counter()
    for ln in lines:
        for kind in re.findall(r"\b(Kubernetes[A-Z][A-Za-z]+)\b", ln):
            kinds[kind] += 1
    episodes = sum("is throttling raysize" in ln for ln in lines)
    return {"lines": len(lines), "episodes": episodes, **kinds}


@dataclass
class Outcome:
    rejected: int = 0  # 429s the server gave the ServiceAccount (its metric)
    said: dict[str, int] = field(default_factory=dict)  # log_says() of the worker's log
    neighbour: dict[int, int] = field(default_factory=dict)  # its answers: status → count
    starved_s: float = 0.0  # how long the FlowSchema held
    placed_starved: int = 0  # tasks running when the FlowSchema was deleted
    recovery_s: float | None = None  # deletion → every task running (None: not in time)
    wanted: int = 0
    placed: int = 0
    # (pod, change) → how many resize sagas ran it, and how many of those succeeded
    sagas: Counter[tuple[str, str]] = field(default_factory=Counter)
    succeeded: Counter[tuple[str, str]] = field(default_factory=Counter)
    phases: dict[str, float] = field(default_factory=dict)  # where the run's time went
    pod_cpu: dict[str, str] = field(default_factory=dict)  # Kubernetes: the container's limit
    raylet_cpu: dict[str, float] = field(default_factory=dict)  # the Raylet's CPU total

    @property
    def doubled(self) -> list[tuple[str, str]]:
        return sorted(k for k, n in self.succeeded.items() if n > 1)

    def lines(self) -> list[str]:
        rec = "not reached" if self.recovery_s is None else f"{self.recovery_s:.2f} s"
        return [
            f"starved {self.starved_s:.1f} s: the server answered raysize's ServiceAccount "
            f"429 {self.rejected} times (apiserver_flowcontrol_rejected_requests_total); "
            f"{self.placed_starved}/{self.wanted // 2} of the first tasks running by then; "
            f"the neighbour's answers {self.neighbour}",
            f"the worker's log: {self.said}",
            f"recovery (FlowSchema deleted → all {self.wanted} tasks running): {rec} "
            f"(bound < {MAX_RECOVERY_S:g} s)",
            f"resize sagas: {sum(self.sagas.values())} for {len(self.sagas)} changes "
            f"({sum(self.succeeded.values())} succeeded); run twice: {self.doubled or 'none'}: "
            + "; ".join(
                f"{w.rsplit('/', 1)[-1]} {c} ×{n}" for (w, c), n in sorted(self.sagas.items())
            ),
            f"pods' CPU in Kubernetes {self.pod_cpu}; their Raylets' {self.raylet_cpu} "
            f"(total {sum(self.raylet_cpu.values()):g}; the tasks need {self.wanted // 2 * 3})",
            "time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()),
        ]


async def resize_sagas(temporal: Client, queue: str) -> list[tuple[str, str, str]]:
    """(workflow id, ResizeChange, ResizeOutcome) of every resize saga of `queue`."""
    out = []
    query = f"TaskQueue='{queue}' AND WorkflowType='PodResizeWorkflow'"
    async for wf in temporal.list_workflows(query):
        attrs = wf.typed_search_attributes
        out.append((wf.id, attrs.get(RESIZE_CHANGE) or "", attrs.get(RESIZE_OUTCOME) or ""))
    return out


def kubectl(*args: str, kubeconfig: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kubectl")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)},
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")


async def run_apf(
    temporal: Client, tmp: Path, *, workers: int = 4, starve_timeout_s: float = 30.0
) -> Outcome:
    """The scenario of this module's docstring on `temporal` (a dev server with raysize's
    search attributes); every process it starts is stopped before it returns."""
    out = Outcome(wanted=2 * workers)
    sandbox = RealSandbox(
        SandboxConfig(
            node_specs=[NodeSpec("node-a", 64_000, 256 * GIB)],
            timing=KubeletTiming(actuation_delay_s=0.0),
        )
    )
    started = time.monotonic()

    def phase(name: str) -> None:
        out.phases[name] = time.monotonic() - started - sum(out.phases.values())

    await asyncio.to_thread(sandbox.start)
    phase("control plane")
    cp = sandbox.control_plane
    ray = RayStandIn()
    worker = None
    name = "apf"
    try:
        admin = cp.write_kubeconfig(tmp / "admin")
        api = config.new_client_from_config(config_file=str(admin))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        await asyncio.to_thread(kubectl, "apply", "-k", str(DEPLOY), kubeconfig=admin)
        as_worker = await asyncio.to_thread(
            cp.service_account_kubeconfig, tmp / "worker-kubeconfig", *RAYSIZE_SA
        )
        sa = KubeHttp(cp.url, cp.service_account_token(*RAYSIZE_SA), cp.ca_pem)
        queue = f"apf-{uuid.uuid4().hex[:6]}"
        ray.__enter__()
        rc = small_raycluster(name, workers=workers, idle_timeout_s=3600)
        custom.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)
        with Registrar(core, {name: ray}) as registrar:
            if not await until(lambda: registrar.registered >= workers + 1, 120):
                raise RuntimeError(f"the stand-in saw {registrar.registered} Raylets in 120 s")
            phase("deploy/ and the cluster's pods")
            log = tmp / "worker.log"
            worker = start_raysize_worker(
                log,
                temporal.service_client.config.target_host,
                queue,
                as_worker,
                namespaces=NS,
                discovery_interval_s="1",
                gcs_address=ray.address,
            )
            # the cluster's loop runs and has observed it before the server starves it
            if not await _ticked(temporal, name, 60):
                raise RuntimeError(f"no reconcile loop ticked for {name} in 60 s")

            phase("worker up")
            neighbour = await asyncio.to_thread(Neighbour, cp)
            uid = await asyncio.to_thread(starve, cp)
            if not await until(lambda: classified_as(sa, uid), 30):
                raise RuntimeError(f"FlowSchema {STARVED} not applied by the server in 30 s")
            before = await asyncio.to_thread(rejected, cp)  # the probe's own, if any
            with neighbour:
                t_starve = time.monotonic()
                ray.add_demands({"CPU": 2.0}, workers)
                await until(lambda: rejected(cp) - before >= MIN_REJECTED, starve_timeout_s, 0.5)
                out.placed_starved = ray.counts()[0]
                t0 = time.monotonic()  # the deletions' own time counts in the recovery
                await asyncio.to_thread(unstarve, cp)
            out.rejected = await asyncio.to_thread(rejected, cp) - before
            out.neighbour = dict(neighbour.calls)
            out.starved_s = t0 - t_starve
            ray.add_demands({"CPU": 1.0}, workers)
            if await until(lambda: ray.counts()[:2] == (out.wanted, 0), 120):
                out.recovery_s = time.monotonic() - t0
            out.placed = ray.counts()[0]
            phase("starved and recovered")
            await until(lambda: _pods_match(cp, ray, name, out), 30, 0.5)
            # a saga records its outcome a moment after the task it made room for runs
            end = time.monotonic() + 30
            while True:
                sagas = await resize_sagas(temporal, queue)
                if time.monotonic() > end or all(o != "Pending" for _, _, o in sagas):
                    break
                await asyncio.sleep(0.2)
            stop_group(worker, grace=0.5)  # its log is all that is read from it now
            worker = None
            out.said = log_says(log.read_text(errors="replace"))
            for wid, change, outcome in sagas:
                out.sagas[(wid, change)] += 1
                if outcome == "Succeeded":
                    out.succeeded[(wid, change)] += 1
            phase("checks")
    finally:
        if worker is not None:
            stop_group(worker)
        ray.__exit__()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(unstarve, cp)
        await asyncio.to_thread(sandbox.close)
        phase("stopping")
    return out


async def _ticked(temporal: Client, name: str, timeout: float) -> bool:
    handle = temporal.get_workflow_handle(reconcile_workflow_id(NS, name))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(Exception):  # not started yet
            if (await handle.query(ReconcileWorkflow.status)).ticks >= 1:
                return True
        await asyncio.sleep(0.2)
    return False


def _pods_match(cp: RealControlPlane, ray: RayStandIn, name: str, out: Outcome) -> bool:
    """Record each worker pod's CPU (Kubernetes' container limit) and its Raylet's; true
    once they agree for every pod."""
    selector = urllib.parse.quote(f"ray.io/cluster={name},ray.io/node-type=worker")
    pods = cp.request("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")["items"]
    out.pod_cpu = {
        p["metadata"]["name"]: p["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        for p in pods
    }
    out.raylet_cpu = {p: ray.totals(p).get("CPU", 0.0) for p in out.pod_cpu}
    return all(float(out.pod_cpu[p]) == out.raylet_cpu[p] for p in out.pod_cpu)


async def run(args: argparse.Namespace) -> int:
    env = await start_dev_server(*ONE_PARTITION)
    try:
        with tempfile.TemporaryDirectory(prefix="apf-bench-") as tmp:
            out = await run_apf(env.client, Path(tmp), workers=args.workers)
            if args.log:
                shutil.copy(Path(tmp) / "worker.log", args.log)
    finally:
        await env.shutdown()
    for line in out.lines():
        print(line, flush=True)
    ok = (
        out.rejected > 0
        and out.recovery_s is not None
        and out.recovery_s < MAX_RECOVERY_S
        and not out.doubled
    )
    print("verdict:", "met" if ok else "MISSED")
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker pods of the RayCluster")
    parser.add_argument("--log", type=Path, help="keep the raysize worker's log at this path")
    sys.exit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
