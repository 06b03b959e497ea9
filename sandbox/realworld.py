"""The real control plane for the test world: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and the KubeRay operator; and Karpenter, for the tests that need
nodes made on demand (`start_karpenter()`, sandbox/karpenter.py).

    with RealControlPlane() as cp:            # builds the parts on first use (cached)
        cp.write_kubeconfig(path)             # admin (system:masters) over HTTPS
        cp.service_account_kubeconfig(path, "raysize", "raysize")   # RBAC applies

The binaries come from `scripts/build_control_plane.sh`, which builds them from published
Go modules into the user's cache directory (keyed by version, so only the first run on a
machine pays). kube-apiserver runs with HTTPS (a self-signed serving certificate it makes
itself), RBAC, a service-account issuer and signing key, and a static admin token.
kube-scheduler binds pods; kube-controller-manager runs the controllers of `CONTROLLERS`
(Deployments through ReplicaSets, garbage collection, PDB status, namespaces). Each runs
as its own user (`system:kube-scheduler`, `system:kube-controller-manager`, its
controllers with their own ServiceAccounts), so the bootstrap RBAC of a real cluster is
what lets them act. There is no kubelet: a virtual kubelet (a client of the API, like any
other) runs the pods bound to its nodes, and tests that need it start it.

Every process is started in its own process group and stopped by it (`close()`), also when
starting fails halfway.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from raysize.sandbox import karpenter, reaper
from raysize.sandbox.apistore import ApiStore, KubeHttp
from raysize.sandbox.cluster import SandboxConfig
from raysize.sandbox.errors import ApiError
from raysize.sandbox.faultproxy import FaultProxy
from raysize.sandbox.faults import Faults
from raysize.sandbox.kubeconfig import write_kubeconfig
from raysize.sandbox.kubelet import Kubelet
from raysize.sandbox.podnet import ApiAccess, ContainerRuntime, PodNetwork, ServiceProxy
from raysize.sandbox.ports import free_port
from raysize.sandbox.rayprocs import stop_process_groups, wait_for_port

log = logging.getLogger(__name__)

Obj = dict[str, Any]

DEFAULT_KUBERNETES_VERSION = "v1.36.3"
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_S = 90.0
# What kube-controller-manager runs (--controllers): Deployments through ReplicaSets to
# pods, the garbage collector (owned objects go with their owner), PDBs' status, a deleted
# namespace emptied and removed, and each namespace's `default` ServiceAccount (and the
# legacy token Secrets some charts still make). Left out, each for a reason:
# - node-lifecycle and taint-eviction: they judge the kubelet simulator's nodes by their
#   heartbeats, and a heartbeat late on a busy 2-core machine would taint its nodes and
#   mark their pods not Ready mid-test; a Node no kubelet runs (the conformance suite's
#   parked one) carries its own NoSchedule taint instead;
# - pod-garbage-collector: it deletes pods bound to a Node that does not exist, which the
#   conformance suite makes on purpose (1.36 refuses their resizes);
# - node-ipam, cloud and volume controllers: no pod CIDRs, no cloud, no volumes to bind;
# - the rest (jobs, endpoints, certificates, ...): nothing here uses them, and each costs
#   watches and CPU on a 2-core machine.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "disruption-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
)
REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "scripts" / "build_control_plane.sh"


class ControlPlaneError(RuntimeError):
    """A part of the real control plane is missing or did not start (the message says which)."""


@dataclass(frozen=True)
class Parts:
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubernetes_version: str
    etcd: Path
    ray_operator: Path
    kuberay_version: str
    kuberay_crds: Path
    helm: Path  # the helm CLI, for the tests of deploy/helm
    karpenter: Path  # Karpenter with its kwok cloud provider
    karpenter_version: str
    karpenter_crds: Path  # NodePool, NodeClaim, KWOKNodeClass, ...
    prometheus_operator_version: str
    prometheus_operator_crds: Path  # ServiceMonitor, PodMonitor, PrometheusRule


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "raysize" / "control-plane"


def parts(version: str = DEFAULT_KUBERNETES_VERSION, *, build: bool = True) -> Parts:
    """The built parts for this Kubernetes version; built first if `build` and missing."""
    env_file = cache_dir() / f"env-{version}"
    found = _read_env(env_file)
    needed = (
        "kube_apiserver",
        "kube_scheduler",
        "kube_controller_manager",
        "etcd",
        "helm",
        "prometheus_operator_crds",
        "karpenter",
        "karpenter_crds",
    )
    if found is None or not all(k in found and Path(found[k]).exists() for k in needed):
        if not build:
            raise ControlPlaneError(
                f"the real control plane for Kubernetes {version} is not built: "
                f"run {BUILD_SCRIPT.relative_to(REPO)} {version} (or `make control-plane`)"
            )
        if not BUILD_SCRIPT.exists():
            raise ControlPlaneError(f"{BUILD_SCRIPT} is missing: the real world needs the repo")
        returncode, said = _run_build(version)
        if returncode != 0:
            raise ControlPlaneError(
                f"building the control plane failed (exit {returncode}): {said.strip()[-2000:]}"
            )
        found = _read_env(env_file)
        if found is None:
            raise ControlPlaneError(f"{BUILD_SCRIPT.name} wrote no {env_file}")
    return Parts(
        kube_apiserver=Path(found["kube_apiserver"]),
        kube_scheduler=Path(found["kube_scheduler"]),
        kube_controller_manager=Path(found["kube_controller_manager"]),
        kubernetes_version=found["kubernetes_version"],
        etcd=Path(found["etcd"]),
        ray_operator=Path(found["ray_operator"]),
        kuberay_version=found["kuberay_version"],
        kuberay_crds=Path(found["kuberay_crds"]),
        helm=Path(found["helm"]),
        karpenter=Path(found["karpenter"]),
        karpenter_version=found["karpenter_version"],
        karpenter_crds=Path(found["karpenter_crds"]),
        prometheus_operator_version=found["prometheus_operator_version"],
        prometheus_operator_crds=Path(found["prometheus_operator_crds"]),
    )


def _run_build(version: str) -> tuple[int, str]:
    """Run the build script, passing on its progress lines (a line per part as it starts
    and ends, with its time: a cold build takes minutes) to stderr as they come; its exit
    code and the tail of what it said, for the error."""
    proc = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT), version],
        stdout=subprocess.DEVNULL,  # the `name=path` lines: read from the env file
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=200)
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)
    return proc.wait(), "".join(tail)


def _read_env(path: Path) -> dict[str, str] | None:
    if not path.exists():
        return None
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


class RealControlPlane:
    """etcd + kube-apiserver (+ the KubeRay operator unless `operator=False`).

    `watch_cache=False` starts kube-apiserver with `--watch-cache=false`: every watch is
    then served from etcd itself, so a watch from a resourceVersion etcd has compacted
    (every 10 s here) is answered 410 Gone at once. With the cache (the default) the
    server replays old versions from memory long after etcd let them go, as a quiet
    cluster does; a long-lived, busy cluster's cache moves on and answers 410 too. The
    tests of the 410 path (`tests/sandbox/test_pod_watch_real.py`) turn it off to meet the
    real server's own 410 within seconds."""

    def __init__(
        self,
        version: str = DEFAULT_KUBERNETES_VERSION,
        *,
        operator: bool = True,
        watch_cache: bool = True,
        workdir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.parts = parts(version)
        self.with_operator = operator
        self.watch_cache = watch_cache
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="raysize-cp-"))
        self.admin_token = secrets.token_hex(16)
        # the tokens of the scheduler's and the controller manager's users (tokens.csv)
        self.scheduler_token = secrets.token_hex(16)
        self.controller_manager_token = secrets.token_hex(16)
        self.port = 0
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self.ca_pem = b""
        # Karpenter's process once started (`start_karpenter`), and the seconds it took
        self.karpenter: subprocess.Popen[bytes] | None = None
        self.karpenter_start_s = 0.0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def _removes_workdir(self) -> bool:
        return self._own_workdir and not os.environ.get("RAYSIZE_KEEP_CONTROL_PLANE_LOGS")

    @property
    def version(self) -> str:
        return self.parts.kubernetes_version

    # --- starting ------------------------------------------------------------------------
    def start(self) -> RealControlPlane:
        if self._removes_workdir:  # etcd's data: gone with us however we go
            reaper.keep_removed(self.workdir)
        try:
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            # both start while the CRDs go in; each is waited for once it had the time
            scheduler = self._start_scheduler()
            controller_manager = self._start_controller_manager()
            self._install_crds()
            if self.with_operator:
                self._start_operator()
            self._wait_healthy("kube-scheduler", *scheduler)
            self._wait_healthy("kube-controller-manager", *controller_manager)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = (self.workdir / f"{name}.log").open("ab")
        self._logs.append(out)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        reaper.guard(proc)  # stopped even if this process is SIGKILLed
        self._procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _start_etcd(self) -> str:
        client_port, peer_port = free_port(), free_port()
        url = f"http://127.0.0.1:{client_port}"
        self._spawn(
            "etcd",
            [
                str(self.parts.etcd),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            ],
        )
        if not wait_for_port(client_port, START_TIMEOUT_S):
            raise ControlPlaneError(f"etcd did not listen on {url}: {self.log_tail('etcd')}")
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        sa_key = certs / "sa.key"
        _rsa_key(sa_key)
        # the admin, and the users the bootstrap RBAC grants the scheduler's and the
        # controller manager's rights to (what their client certificates name elsewhere)
        (self.workdir / "tokens.csv").write_text(
            f'{self.admin_token},raysize-admin,raysize-admin,"system:masters"\n'
            f"{self.scheduler_token},system:kube-scheduler,system:kube-scheduler\n"
            f"{self.controller_manager_token},system:kube-controller-manager,"
            "system:kube-controller-manager\n"
        )
        self.port = free_port()
        self._spawn(
            "kube-apiserver",
            [
                str(self.parts.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={certs}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # no node lifecycle controller (CONTROLLERS) lifts the not-ready taint that
                # TaintNodesByCondition puts on every new Node; the ServiceAccount plugin
                # would give every pod a token volume and refuse a namespace's pods until
                # the controller manager made its `default` ServiceAccount
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                "--profiling=false",
                # compact etcd every 10 s (default 5 min): old resourceVersions expire in the
                # tests as they do in a long-lived cluster, so 410 Gone paths are exercised
                "--etcd-compaction-interval=10s",
                *([] if self.watch_cache else ["--watch-cache=false"]),
                "--v=1",
            ],
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if self._procs[-1].poll() is not None:
                raise ControlPlaneError(
                    f"kube-apiserver exited ({self._procs[-1].returncode}): "
                    f"{self.log_tail('kube-apiserver')}"
                )
            crt = certs / "apiserver.crt"
            if crt.exists():
                self.ca_pem = crt.read_bytes()
                try:
                    with self.http.open("GET", "/readyz", timeout=5) as resp:
                        if resp.read() == b"ok":
                            return
                except (OSError, ApiError) as err:
                    last = str(err)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready on {self.url} in {START_TIMEOUT_S:.0f}s ({last}): "
            f"{self.log_tail('kube-apiserver')}"
        )

    def _start_component(
        self, name: str, binary: Path, token: str, args: list[str]
    ) -> tuple[subprocess.Popen[bytes], int]:
        """Start a control-plane component as its user (`token`), without leader election,
        serving its health on a free port of its own (several worlds run at once)."""
        path = self.workdir / f"{name}.kubeconfig"
        kubeconfig = write_kubeconfig(path, self.url, token=token, ca_pem=self.ca_pem, name=name)
        port = free_port()
        proc = self._spawn(
            name,
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / name}",  # its self-signed serving certificate
                "--profiling=false",
                *args,
                "--v=1",
            ],
        )
        return proc, port

    def _start_scheduler(self) -> tuple[subprocess.Popen[bytes], int]:
        """kube-scheduler with its default profile: pods are bound as a real cluster binds
        them, a resized pod charged the larger of its desired, allocated and actual
        requests (KEP-1287)."""
        return self._start_component(
            "kube-scheduler", self.parts.kube_scheduler, self.scheduler_token, []
        )

    def _start_controller_manager(self) -> tuple[subprocess.Popen[bytes], int]:
        certs = self.workdir / "certs"
        return self._start_component(
            "kube-controller-manager",
            self.parts.kube_controller_manager,
            self.controller_manager_token,
            [
                f"--controllers={','.join(CONTROLLERS)}",
                # each controller as its own ServiceAccount in kube-system (a token from the
                # TokenRequest API), held to its own bootstrap ClusterRole, as kubeadm runs it
                "--use-service-account-credentials=true",
                # the key the API server checks tokens with (the legacy token Secrets)
                f"--service-account-private-key-file={certs / 'sa.key'}",
                f"--root-ca-file={certs / 'apiserver.crt'}",
            ],
        )

    def _wait_healthy(self, name: str, proc: subprocess.Popen[bytes], port: int) -> None:
        """Until the component's /healthz says ok (its own self-signed certificate: the
        check is that it runs, not who it is)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited ({proc.returncode}): {self.log_tail(name)}")
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/healthz", context=context, timeout=5
                ) as resp:
                    if resp.read() == b"ok":
                        return
            except OSError as err:  # not listening yet, or not healthy yet (HTTPError)
                last = str(err)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{name} not healthy in {START_TIMEOUT_S:.0f}s ({last}): {self.log_tail(name)}"
        )

    @property
    def http(self) -> KubeHttp:
        """Admin calls to the API (group system:masters); errors are `ApiError`s."""
        return KubeHttp(self.url, self.admin_token, self.ca_pem)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        """One admin call to the API, JSON in and out; raises `ApiError`."""
        return self.http.call(method, path, body, content_type=content_type or "application/json")

    def _install_crds(self) -> None:
        self.install_crds(sorted(self.parts.kuberay_crds.glob("ray.io_*.yaml")))

    def install_crds(self, paths: list[Path]) -> None:
        """CRDs from YAML files (KubeRay's at start; the tests add others), with
        server-side apply: RayCluster's is too large for the last-applied annotation of a
        client-side apply. Returns once each is Established."""
        names = []
        for path in paths:
            body = _yaml_to_json(path)
            name = body["metadata"]["name"]
            names.append(name)
            self.request(
                "PATCH",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                f"{name}?fieldManager=raysize-test-world&force=true",
                body,
                content_type="application/apply-patch+yaml",
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        for name in names:
            while True:
                crd = self.request(
                    "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
                listed = (crd.get("status") or {}).get("conditions") or []
                conds = {c["type"]: c["status"] for c in listed}
                if conds.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"CRD {name} not Established: {conds}")
                time.sleep(0.1)

    def _start_operator(self) -> None:
        path = self.write_kubeconfig(self.workdir / "operator.kubeconfig")
        self._spawn(
            "ray-operator",
            [
                str(self.parts.ray_operator),
                "--metrics-addr=0",
                "--health-probe-bind-address=0",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
            env={"KUBECONFIG": str(path)},
        )

    def start_karpenter(self) -> subprocess.Popen[bytes]:
        """Karpenter with its kwok provider (sandbox/karpenter.py), once: later calls
        return the running one. Its CRDs and the KWOKNodeClass `default` go in first;
        returns once its /readyz says its caches are synced. It runs as the admin (the
        rights its chart's ClusterRoles give it are not what is tested here) and stops
        with the rest, by its process group."""
        if self.karpenter is not None:
            return self.karpenter
        t0 = time.monotonic()
        self.install_crds(sorted(self.parts.karpenter_crds.glob("*.yaml")))
        try:
            self.request(
                "POST",
                f"/apis/{karpenter.KWOK_API_GROUP}/v1alpha1/kwoknodeclasses",
                karpenter.node_class(),
            )
        except ApiError as err:
            if err.code != 409:  # there already
                raise
        types = self.workdir / "karpenter-instance-types.json"
        types.write_text(karpenter.instance_types_file())
        health = free_port()
        env = karpenter.environment(
            instance_types=str(types),
            metrics_port=free_port(),
            health_port=health,
            kubeconfig=str(self.write_kubeconfig(self.workdir / "karpenter.kubeconfig")),
        )
        proc = self._spawn("karpenter", [str(self.parts.karpenter)], env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"karpenter exited ({proc.returncode}): {self.log_tail('karpenter')}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        self.karpenter = proc
                        self.karpenter_start_s = time.monotonic() - t0
                        return proc
            except OSError as err:  # not listening yet, or not ready yet (HTTPError)
                last = str(err)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"karpenter not ready in {START_TIMEOUT_S:.0f}s ({last}): {self.log_tail('karpenter')}"
        )

    # --- access --------------------------------------------------------------------------
    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> Path:
        """An admin kubeconfig (group system:masters: RBAC lets it do anything)."""
        return write_kubeconfig(
            path, self.url, namespace, token=self.admin_token, ca_pem=self.ca_pem
        )

    def service_account_token(self, namespace: str, name: str, seconds: int = 86400) -> str:
        """A token of ServiceAccount namespace/name (created if missing), via TokenRequest."""
        try:
            self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"metadata": {"name": name}},
            )
        except ApiError as err:
            if err.code != 409:  # already there
                raise
        reply = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return str(reply["status"]["token"])

    def pod_token(self, namespace: str, account: str, pod: Obj) -> str:
        """A token of ServiceAccount namespace/account bound to the pod (it dies with the
        pod), as the kubelet requests for a pod's projected token volume."""
        meta = pod["metadata"]
        reply = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 86400,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            },
        )
        return str(reply["status"]["token"])

    def service_account_kubeconfig(
        self, path: str | os.PathLike[str], namespace: str, name: str
    ) -> Path:
        token = self.service_account_token(namespace, name)
        return write_kubeconfig(
            path, self.url, namespace, token=token, ca_pem=self.ca_pem, name=name
        )

    # --- stopping ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop Karpenter (if started), the operator, the controller manager, the
        scheduler, the API server, then etcd, each by its own process group before the next
        (safe to call more than once): an API server whose etcd is gone hangs on SIGTERM
        until it is killed after the grace period, 10 s every time; before etcd it exits in
        ~1 s."""
        procs, self._procs = list(reversed(self._procs)), []
        self.karpenter = None
        try:
            failed: list[BaseException] = []
            for proc in procs:  # each is tried, whatever the one before did
                try:
                    stop_process_groups([proc])
                except Exception as exc:  # pragma: no cover - it only signals and waits
                    failed.append(exc)
            if failed:
                raise failed[0]
        finally:
            for f in self._logs:
                f.close()
            self._logs.clear()
            if self._removes_workdir:
                reaper.remove_dir(self.workdir)

    def __enter__(self) -> RealControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _rsa_key(path: Path) -> None:
    """A 2048-bit RSA key for signing service-account tokens (openssl, from Debian)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ControlPlaneError("openssl is not on PATH (it makes the service-account key)")
    subprocess.run([openssl, "genrsa", "-out", str(path), "2048"], check=True, capture_output=True)


def _yaml_to_json(path: Path) -> dict[str, Any]:
    import yaml  # PyYAML comes with the kubernetes client

    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ControlPlaneError(f"{path}: not one YAML object")
    return loaded


class RealSandbox:
    """The real world for the tests and `raysize sandbox up --control-plane real`: the real
    control plane plus the kubelet simulator as an API client (it runs the pods
    kube-scheduler binds to its nodes, reports its nodes' status and actuates resizes).
    With `with_ray`, each pod's own containers run in the pod's own network namespace
    (sandbox/podnet.py): KubeRay's `ray start` is what runs."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        version: str = DEFAULT_KUBERNETES_VERSION,
        operator: bool = True,
    ) -> None:
        self.config = config or SandboxConfig()
        self.control_plane = RealControlPlane(version, operator=operator)
        # with Ray: each pod in its own network namespace, running its own containers
        # (KubeRay's `ray start …`), as a container runtime and a CNI plugin would
        self.network: PodNetwork | None = None
        self.runtime: ContainerRuntime | None = None
        self.proxy: ServiceProxy | None = None
        self.kubelet: Kubelet | None = None
        # API faults for raysize's own connection, as the embedded server injects them:
        # clients of `service_account_kubeconfig` reach the API server through this proxy
        self.faults = Faults(self.config.fault_seed)
        self.fault_proxy: FaultProxy | None = None

    @property
    def url(self) -> str:
        return self.control_plane.url

    def service_account_kubeconfig(
        self, path: str | os.PathLike[str], namespace: str, name: str
    ) -> Path:
        """A kubeconfig with a token of ServiceAccount namespace/name (RBAC applies), to
        the API server through the fault proxy (`faults`; none by default)."""
        assert self.fault_proxy is not None, "start() the sandbox first"
        token = self.control_plane.service_account_token(namespace, name)
        return write_kubeconfig(
            path,
            self.fault_proxy.url,
            namespace,
            token=token,
            ca_pem=self.fault_proxy.ca_pem,
            name=name,
        )

    def start(self) -> RealSandbox:
        try:
            self.control_plane.start()
            cp = self.control_plane
            self.fault_proxy = FaultProxy(cp.url, cp.ca_pem, self.faults, cp.workdir).start()
            path = self.control_plane.write_kubeconfig(
                self.control_plane.workdir / "kubelet.kubeconfig"
            )
            store = ApiStore(path)
            if self.config.with_ray:
                self.network = PodNetwork().start()
                cp = self.control_plane
                self.proxy = ServiceProxy(self.network.gateway, ("127.0.0.1", cp.port))
                api = ApiAccess(
                    host="kubernetes.default.svc",  # in the API server's own certificate
                    ip=self.proxy.ip,
                    port=self.proxy.port,
                    ca_pem=cp.ca_pem,
                    token=cp.pod_token,
                )
                self.runtime = ContainerRuntime(self.network, store.services_and_pods, api=api)
            self.kubelet = Kubelet(
                store,
                self.config.node_list(),
                self.config.timing,
                runtime=self.runtime,
                schedules=False,  # kube-scheduler binds
                # and runs the Nodes Karpenter's kwok provider makes, as kwok would
                adopts=karpenter.made_by_karpenter,
            ).start()
        except BaseException:
            self.close()
            raise
        return self

    def start_karpenter(self) -> subprocess.Popen[bytes]:
        """Karpenter on this world's control plane (once; see
        `RealControlPlane.start_karpenter`): the kubelet adopts the nodes it makes."""
        return self.control_plane.start_karpenter()

    def close(self) -> None:
        """Stop the kubelet (and its pods' Ray processes), then the control plane."""
        try:
            if self.kubelet is not None:
                self.kubelet.stop()
        finally:
            try:
                if self.runtime is not None:
                    self.runtime.close()
            finally:
                try:
                    if self.proxy is not None:
                        self.proxy.close()
                    if self.fault_proxy is not None:
                        self.fault_proxy.close()
                    if self.network is not None:
                        self.network.close()
                finally:
                    self.control_plane.close()

    def write_kubeconfig(self, path: str | os.PathLike[str], *, faults: bool = False) -> Path:
        """An admin kubeconfig; `faults`: through the fault proxy (`self.faults` apply)."""
        if not faults:
            return self.control_plane.write_kubeconfig(path)
        assert self.fault_proxy is not None, "start() the sandbox first"
        cp = self.control_plane
        return write_kubeconfig(
            path,
            self.fault_proxy.url,
            "default",
            token=cp.admin_token,
            ca_pem=self.fault_proxy.ca_pem,
        )

    def __enter__(self) -> RealSandbox:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
