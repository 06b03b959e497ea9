"""Pods as a container runtime would run them, for the real test world: each pod gets its
own network namespace on a bridge (its own IP, so two Ray heads both listen on 6379), and
its containers' own `command`, `args` and `env` run there as host processes.

What KubeRay generates is what runs: `ulimit -n 65536; ray start --head --num-cpus=0 …`
with the pod's `rayStartParams`, under `bash -c`, with the env KubeRay sets (field refs
such as `metadata.name` and `status.podIP` resolved as the kubelet does). `ray` is the
one installed beside this Python (the image is not pulled). Cluster DNS is a hosts file per
pod (`ip netns exec` mounts /etc/netns/<netns>/hosts over /etc/hosts), refreshed every
second from the Services and Pods of the pod's namespace: a headless Service's name
resolves to the IPs of the pods it selects, any other to its ClusterIP (gRPC is told to
use the system resolver, `GRPC_DNS_RESOLVER=native`, so Ray's C++ reads that file too).

    net = PodNetwork().start()                 # a bridge with the host's address on it
    runtime = ContainerRuntime(net, lookup)    # lookup(namespace) → Services and Pods
    ip = runtime.start(pod)                    # netns, veth, hosts file, processes
    runtime.stop_all([pod]); runtime.close(); net.close()

Needs root and iproute2 (`ip`), as a CNI plugin does. Every process runs in its own
process group and is stopped by it; every namespace, link and file made is removed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysize.sandbox import reaper
from raysize.sandbox.rayprocs import exit_code, stop_process_groups

if TYPE_CHECKING:
    from raysize.sandbox.kubelet import ExitReport, InitReport

log = logging.getLogger(__name__)

Obj = dict[str, Any]
NETNS_ETC = Path("/etc/netns")
HOSTS_REFRESH_S = 1.0
# a failed init container runs again after this, doubled each time (the kubelet's back-off)
INIT_BACKOFF_S = 10.0
INIT_BACKOFF_MAX_S = 300.0
CLUSTER_DOMAIN = "cluster.local"
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


class PodNetworkError(RuntimeError):
    """The host cannot give pods their own network (not root, no iproute2, ...)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


class PodNetwork:
    """A bridge `rsz<id>` holding 10.<n>.0.1/16 on the host; one netns + veth per pod."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(3)
        self.bridge = f"rsz{self.id}"
        self.subnet = ipaddress.ip_network(self._free_subnet())
        self.gateway = str(self.subnet.network_address + 1)
        self._next = 2
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, str]] = {}  # pod uid → (netns, ip)

    @staticmethod
    def _free_subnet() -> str:
        """A 10.x.0.0/16 no route on this host uses yet."""
        if shutil.which("ip") is None:
            raise PodNetworkError("iproute2's `ip` is not on PATH (pods need their own network)")
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        used = {int(m) for m in re.findall(r"\b10\.(\d+)\.", routes)}
        for _ in range(50):
            second = 100 + secrets.randbelow(150)
            if second not in used:
                return f"10.{second}.0.0/16"
        raise PodNetworkError("no free 10.x.0.0/16 for the pod network")

    def start(self) -> PodNetwork:
        if os.geteuid() != 0:
            raise PodNetworkError("pods get their own network namespace: run as root")
        _ip("link", "add", self.bridge, "type", "bridge")
        reaper.on_exit(self.bridge, ["ip", "link", "del", self.bridge])
        try:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def add(self, uid: str) -> tuple[str, str]:
        """(netns, ip) of a new pod: its namespace, a veth to the bridge, a default route."""
        with self._lock:
            ip = str(self.subnet.network_address + self._next)
            self._next += 1
            tag = secrets.token_hex(3)
            netns = f"rsz{self.id}-{tag}"
            self._pods[uid] = (netns, ip)
        host_end, pod_end = f"rszh{tag}", f"rszp{tag}"
        _ip("netns", "add", netns)
        reaper.on_exit(netns, ["ip", "netns", "del", netns])  # takes its veth pair along
        reaper.on_exit(f"{netns}-etc", ["rm", "-rf", "--", str(NETNS_ETC / netns)])
        _ip("link", "add", host_end, "type", "veth", "peer", "name", pod_end)
        _ip("link", "set", host_end, "master", self.bridge)
        _ip("link", "set", host_end, "up")
        _ip("link", "set", pod_end, "netns", netns)
        run = ("netns", "exec", netns, "ip")
        _ip(*run, "link", "set", pod_end, "name", "eth0")
        _ip(*run, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip(*run, "link", "set", "eth0", "up")
        _ip(*run, "link", "set", "lo", "up")
        _ip(*run, "route", "add", "default", "via", self.gateway)
        (NETNS_ETC / netns).mkdir(parents=True, exist_ok=True)
        return netns, ip

    def remove(self, uid: str) -> None:
        with self._lock:
            found = self._pods.pop(uid, None)
        if found is None:
            return
        netns, _ = found
        with contextlib.suppress(PodNetworkError):
            _ip("netns", "del", netns)  # takes the veth pair with it
        shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
        reaper.drop(netns)
        reaper.drop(f"{netns}-etc")

    def close(self) -> None:
        for uid in list(self._pods):
            self.remove(uid)
        with contextlib.suppress(PodNetworkError):
            _ip("link", "del", self.bridge)
        reaper.drop(self.bridge)


class ServiceProxy:
    """What kube-proxy does for the `kubernetes` Service: pods connect to an address on
    the bridge, the connection is relayed to the API server on the host's loopback (the
    API server itself listens on 127.0.0.1 only). One thread per direction per
    connection: the pods' API clients are few."""

    def __init__(self, listen_ip: str, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server((listen_ip, 0))
        self.ip, self.port = self._server.getsockname()[:2]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="service-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError as exc:
                log.warning("service proxy: %s:%d unreachable: %s", *self.target, exc)
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                for sock in (src, dst):
                    if sock in self._conns:
                        self._conns.discard(sock)
                        sock.close()

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass
class _Pod:
    uid: str
    name: str
    namespace: str
    netns: str
    ip: str
    spec: Obj
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by container
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    secrets_dir: Path | None = None


# lookup(namespace) → (services, pods) of that namespace, as the API serves them
Lookup = Callable[[str], tuple[list[Obj], list[Obj]]]
# token(namespace, service account, pod) → a token of that account bound to the pod
TokenSource = Callable[[str, str, Obj], str]


@dataclass(frozen=True)
class ApiAccess:
    """How a pod's processes reach the API server, as the kubelet tells them: the
    `KUBERNETES_SERVICE_*` env, a hosts-file name the serving certificate covers, and for
    a pod with a `serviceAccountName` its token and the cluster's CA in
    /var/run/secrets/kubernetes.io/serviceaccount (what the projected volume holds)."""

    host: str  # a name in the serving certificate, e.g. kubernetes.default.svc
    ip: str  # where pods reach it (the bridge's address: see ServiceProxy)
    port: int
    ca_pem: bytes
    token: TokenSource


class ContainerRuntime:
    """A `PodRuntime` that runs each pod's containers in the pod's network namespace."""

    def __init__(
        self,
        network: PodNetwork,
        lookup: Lookup,
        bin_dir: str | None = None,
        api: ApiAccess | None = None,
    ) -> None:
        self.network = network
        self.lookup = lookup
        self.api = api
        self._report: ExitReport | None = None
        self._init_report: InitReport | None = None
        self.bin_dir = bin_dir or str(Path(sys.executable).parent)
        self.root = reaper.temp_dir("rsz-")  # short: Ray's socket paths
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._hosts = threading.Thread(target=self._refresh_hosts, daemon=True)
        self._hosts.start()

    # --- PodRuntime ----------------------------------------------------------------------
    def start(self, pod: Obj) -> str | None:
        meta = pod["metadata"]
        netns, ip = self.network.add(meta["uid"])
        p = _Pod(meta["uid"], meta["name"], meta.get("namespace", ""), netns, ip, pod)
        with self._lock:
            self._pods[p.uid] = p
        self._write_hosts(p)
        self._project_service_account(p, pod)
        p.thread = threading.Thread(
            target=self._run, args=(p, pod), name=f"pod-{p.name}", daemon=True
        )
        p.thread.start()
        return ip

    def stop_all(self, pods: list[Obj]) -> None:
        with self._lock:
            stopping = [
                self._pods.pop(uid)
                for uid in (pod["metadata"]["uid"] for pod in pods)
                if uid in self._pods
            ]
        for p in stopping:
            p.stopping.set()
        stop_process_groups([proc for p in stopping for proc in p.procs])
        for p in stopping:
            if p.thread is not None:
                p.thread.join(timeout=10)
            self.network.remove(p.uid)

    def on_exit(self, report: ExitReport) -> None:
        self._report = report

    def restart(self, pod: Obj, container: str) -> None:
        with self._lock:
            p = self._pods.get(pod["metadata"]["uid"])
        spec = next(
            (c for c in (pod.get("spec") or {}).get("containers") or [] if c["name"] == container),
            None,
        )
        if p is None or spec is None or p.stopping.is_set():
            return
        self._exec(p, pod, spec)

    def kill(self, namespace: str, pod: str, container: str, sig: int = signal.SIGKILL) -> None:
        """Kill one container's process group, as the node's OOM killer or a crash would
        (for tests): the kubelet sees it exit and acts on the pod's restartPolicy."""
        p = self._find(namespace, pod)
        with self._lock:
            proc = p.running.get(container)
        if proc is None:
            raise LookupError(f"container {container} of pod {namespace}/{pod} is not running")
        os.killpg(proc.pid, sig)

    def _find(self, namespace: str, pod: str) -> _Pod:
        with self._lock:
            found = [p for p in self._pods.values() if (p.namespace, p.name) == (namespace, pod)]
        if not found:
            raise LookupError(f"pod {namespace}/{pod} does not run here")
        return found[0]

    def close(self) -> None:
        with self._lock:
            uids = list(self._pods)
        self.stop_all([{"metadata": {"uid": uid}} for uid in uids])
        self._stop.set()
        reaper.remove_dir(self.root)

    def exec(
        self,
        namespace: str,
        pod: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        container: str | None = None,
    ) -> subprocess.Popen[str]:
        """Run a command in a running pod, as `kubectl exec` would: in its network
        namespace, and with `container` given in that container's env and with its
        service-account token mounted; in its own process group (the caller stops it by
        that group); output piped."""
        found = self._find(namespace, pod)
        base = {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        if container is not None:
            spec = next(
                (c for c in found.spec["spec"]["containers"] if c["name"] == container), None
            )
            if spec is None:
                raise LookupError(f"pod {namespace}/{pod} has no container {container}")
            base = self._env(found, found.spec, spec)
            argv = self._with_token(found, argv)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", found.netns, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, **(env or {})},
            start_new_session=True,
            cwd=self.root,
        )
        reaper.guard(proc)
        return proc

    # --- containers ----------------------------------------------------------------------
    def init_containers(self, pod: Obj) -> list[str]:
        """The init containers this runtime runs to completion and reports (`on_init`)."""
        return [
            c["name"]
            for c in (pod.get("spec") or {}).get("initContainers") or []
            if c.get("restartPolicy") != "Always" and (c.get("command") or c.get("args"))
        ]

    def on_init(self, report: InitReport) -> None:
        self._init_report = report

    def _run(self, p: _Pod, pod: Obj) -> None:
        """Init containers one after the other, each to its end (a failed one again after
        a back-off, unless the pod never restarts); then the containers."""
        spec = pod.get("spec") or {}
        never = (spec.get("restartPolicy") or "Always") == "Never"
        for c in spec.get("initContainers") or []:
            if c.get("restartPolicy") == "Always":
                self._exec(p, pod, c)  # a sidecar keeps running beside the containers
                continue
            failures = 0
            while not p.stopping.is_set():
                proc = self._exec(p, pod, c, watch=False)
                if proc is None:
                    break  # the image's entrypoint: nothing of ours to run
                code = exit_code(proc.wait())
                if p.stopping.is_set():
                    return
                if self._init_report is not None:
                    self._init_report(p.namespace, p.name, p.uid, c["name"], code)
                if code == 0:
                    break
                log.warning("pod %s: init container %s exited %d", p.name, c["name"], code)
                if never:
                    return
                failures += 1
                p.stopping.wait(min(INIT_BACKOFF_MAX_S, INIT_BACKOFF_S * 2 ** (failures - 1)))
        for c in spec.get("containers") or []:
            if p.stopping.is_set():
                return
            self._exec(p, pod, c)

    def _exec(
        self, p: _Pod, pod: Obj, c: Obj, *, watch: bool = True
    ) -> subprocess.Popen[bytes] | None:
        argv = [*(c.get("command") or []), *(c.get("args") or [])]
        if not argv:
            return None  # the image's entrypoint: nothing of ours to run
        env = self._env(p, pod, c)
        argv = self._with_token(p, [expand(a, env) for a in argv])
        log_path = self.root / f"{p.name}.{c['name']}.log"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", p.netns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=self.root,
            )
        reaper.guard(proc)
        with self._lock:
            p.procs.append(proc)
            if watch:
                p.running[c["name"]] = proc
        log.info("pod %s: container %s started (pid %d) in %s", p.name, c["name"], proc.pid, p.ip)
        if watch:  # an init container's end is waited for by `_run` and reported as such
            threading.Thread(target=self._watch, args=(p, c["name"], proc), daemon=True).start()
        return proc

    def _env(self, p: _Pod, pod: Obj, c: Obj) -> dict[str, str]:
        """A container's environment, as the kubelet makes it."""
        env: dict[str, str] = {
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.root),
            "HOSTNAME": p.name,
            # Ray's temp dir per pod, as each pod has its own /tmp
            "RAY_TMPDIR": str(self.root / p.uid[:8]),
            "RAY_USAGE_STATS_ENABLED": "0",
            # cluster DNS is the hosts file: gRPC (Ray's C++) must resolve through the
            # system's resolver, not its own DNS client, to read it
            "GRPC_DNS_RESOLVER": "native",
        }
        if self.api is not None:  # the `kubernetes` Service's variables, as the kubelet sets
            port = str(self.api.port)
            env.update(
                KUBERNETES_SERVICE_HOST=self.api.host,
                KUBERNETES_SERVICE_PORT=port,
                KUBERNETES_SERVICE_PORT_HTTPS=port,
            )
        for var in c.get("env") or []:
            # a later variable may use an earlier one: $(NAME), as the kubelet expands it
            env[var["name"]] = expand(_env_value(var, pod, p.ip), env)
        Path(env["RAY_TMPDIR"]).mkdir(parents=True, exist_ok=True)
        return env

    @staticmethod
    def _with_token(p: _Pod, argv: list[str]) -> list[str]:
        """argv, run with the pod's token volume bound over the well-known path in the
        process's own mount namespace (`ip netns exec` made one; nothing leaks out)."""
        if p.secrets_dir is None:
            return argv
        script = f'mkdir -p {SA_PATH} && mount --bind "$0" {SA_PATH} && exec "$@"'
        return ["sh", "-c", script, str(p.secrets_dir), *argv]

    def _watch(self, p: _Pod, container: str, proc: subprocess.Popen[bytes]) -> None:
        """Tell the kubelet when a container's process ends by itself (not stopped)."""
        code = proc.wait()
        with self._lock:
            mine = p.running.get(container) is proc and not p.stopping.is_set()
            if mine:
                del p.running[container]
        if mine and self._report is not None:
            log.info("pod %s: container %s exited %d", p.name, container, exit_code(code))
            self._report(p.namespace, p.name, p.uid, container, exit_code(code))

    # --- the service account token (what the projected volume holds) ----------------------
    def _project_service_account(self, p: _Pod, pod: Obj) -> None:
        spec = pod.get("spec") or {}
        account = spec.get("serviceAccountName") or ""
        if self.api is None or not account or spec.get("automountServiceAccountToken") is False:
            return
        try:
            token = self.api.token(p.namespace, account, pod)
        except Exception as exc:  # no such account: the pod runs, its API calls fail 401
            log.warning("pod %s: no token for service account %s: %s", p.name, account, exc)
            return
        path = self.root / p.uid[:8] / "serviceaccount"
        path.mkdir(parents=True, exist_ok=True)
        (path / "token").write_text(token)
        (path / "ca.crt").write_bytes(self.api.ca_pem)
        (path / "namespace").write_text(p.namespace)
        p.secrets_dir = path

    # --- cluster DNS -----------------------------------------------------------------------
    def _write_hosts(self, p: _Pod) -> None:
        lines = ["127.0.0.1 localhost", f"{p.ip} {p.name}"]
        if self.api is not None:
            lines.append(f"{self.api.ip} {self.api.host}")
        try:
            services, pods = self.lookup(p.namespace)
        except Exception as exc:  # the API is away: keep the last file
            log.debug("hosts for %s: %s", p.name, exc)
            return
        for svc in services:
            name = svc["metadata"]["name"]
            names = f"{name} {name}.{p.namespace} {name}.{p.namespace}.svc.{CLUSTER_DOMAIN}"
            spec = svc.get("spec") or {}
            cluster_ip = spec.get("clusterIP")
            if cluster_ip and cluster_ip != "None":
                lines.append(f"{cluster_ip} {names}")
                continue
            selector = spec.get("selector") or {}
            for other in pods:
                labels = other["metadata"].get("labels") or {}
                ip = (other.get("status") or {}).get("podIP")
                if selector and ip and all(labels.get(k) == v for k, v in selector.items()):
                    lines.append(f"{ip} {names}")
        path = NETNS_ETC / p.netns / "hosts"
        text = "\n".join(lines) + "\n"
        # in place: `ip netns exec` bind-mounted this very file over /etc/hosts
        with contextlib.suppress(OSError), path.open("a+") as f:
            f.seek(0)
            if f.read() != text:
                f.seek(0)
                f.truncate()
                f.write(text)

    def _refresh_hosts(self) -> None:
        while not self._stop.wait(HOSTS_REFRESH_S):
            with self._lock:
                pods = list(self._pods.values())
            for p in pods:
                self._write_hosts(p)


_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(NAME)` expansion in command, args and env values: a defined
    variable is replaced, an undefined reference stays as written, `$$` is one `$`."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        return env.get(m.group(2), m.group(0))

    return _VAR_REF.sub(one, text)


_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def _env_value(var: Obj, pod: Obj, ip: str) -> str:
    """An env var's value: literal, or what the kubelet resolves a fieldRef to."""
    if "value" in var:
        return str(var["value"])
    ref = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
    meta, spec = pod["metadata"], pod.get("spec") or {}
    if m := _LABEL_REF.fullmatch(ref):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    fields: dict[str, Any] = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ip,
        "status.hostIP": "",
    }
    return str(fields.get(ref, ""))
