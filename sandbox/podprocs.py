"""The raysize worker's own pod, run as a kubelet runs it, for the real test world.

A pod whose container image is `raysize` (any registry, any tag) runs the local install:
the container's command and args, or the image's entrypoint `raysize worker`
(deploy/Dockerfile), with `raysize` and `python` from beside this Python and the
repository this sandbox is in on PYTHONPATH, as a real process in its own process group.
Other pods go to the `inner` runtime (none by default: they only "run").

What the kubelet gives the container, it gets here:
- its env: `envFrom` (ConfigMaps and Secrets, `optional` honoured, `prefix`), then `env`
  (`value`, `$(NAME)` expansion, `valueFrom` of a ConfigMap or Secret key, and the
  downward API's `fieldRef`s), read from the API server when the container starts;
  `KUBERNETES_SERVICE_HOST`/`_PORT` point at the real API server;
- its ServiceAccount's token, minted through the TokenRequest API, with ca.crt and
  namespace, at /var/run/secrets/kubernetes.io/serviceaccount: the process runs in a
  mount namespace of its own (`unshare --mount --propagation private`) where the pod's
  folder is bound over that path, so the product reads the path a real pod has;
- its volumes (emptyDir, and Secret and ConfigMap volumes from the API server; an
  optional one that is missing is left out) bound over their mount paths the same way.

The token is rewritten before 80 % of its life, as the kubelet does (atomically: a reader
sees the old token or the new one). The API server will not mint a token shorter than 10
minutes (TokenRequest validation), too long for a test, so with `token_life_s` shorter the
runtime makes that life real itself: each token is bound to a Secret of its own
(`boundObjectRef`) and the Secret is deleted when the token's life is over, so the real
server refuses the old token from then on (401), as it would an expired one.

Exec probes (liveness and readiness) run in the container's environment and mount
namespace (`nsenter --mount`) at their periods, with their thresholds and timeouts:
readiness is reported to the kubelet (`on_ready`: the pod's Ready condition); a liveness
probe failing `failureThreshold` times in a row kills the container's process group, and
the kubelet restarts it (restartCount + 1, lastState terminated 137), as a real kubelet
does. The kubelet simulator (sandbox/kubelet.py) does the pod status; this does the
processes.

The processes share the host's network (as with hostNetwork: Temporal, the API server and
a GCS stand-in are on 127.0.0.1) and run as root (`mount` needs it; the Deployment's
runAsUser is not applied)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysize.sandbox import reaper
from raysize.sandbox.apistore import KubeHttp
from raysize.sandbox.errors import ApiError
from raysize.sandbox.podnet import SA_PATH, _env_value, expand
from raysize.sandbox.rayprocs import exit_code, stop_process_groups

if TYPE_CHECKING:
    from raysize.sandbox.kubelet import ExitReport, PodRuntime

log = logging.getLogger(__name__)

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parent.parent
IMAGE = "raysize"
ENTRYPOINT = ["raysize", "worker"]  # deploy/Dockerfile
MIN_TOKEN_S = 600  # the API server's minimum expirationSeconds
ROTATE_AT = 0.8  # the kubelet rewrites a token at 80 % of its life
# (namespace, pod, uid, container, ready)
ReadyReport = Callable[[str, str, str, str, bool], None]


def is_raysize_image(image: str) -> bool:
    """`raysize`, `raysize:0.2.0`, `registry.example/team/raysize@sha256:…`."""
    name = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return name == IMAGE


@dataclass
class Rotation:
    """One token the runtime wrote for a pod (for tests: what was written and when)."""

    pod: str
    token: str
    secret: str  # the Secret it is bound to ("" when it lives its own life)
    minted: float  # time.monotonic()
    revoked: float | None = None


@dataclass
class _Container:
    spec: Obj
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    generation: int = 0  # bumped at every (re)start: the probes start over


@dataclass
class _Pod:
    obj: Obj
    root: Path
    containers: dict[str, _Container] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def key(self) -> tuple[str, str]:
        meta = self.obj["metadata"]
        return meta.get("namespace", ""), meta["name"]

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])


class ProcessRuntime:
    """A `PodRuntime`: pods of image `raysize` as real processes (see the module)."""

    def __init__(
        self,
        admin: KubeHttp,
        api_host: str,
        api_port: int,
        ca_pem: bytes,
        *,
        inner: PodRuntime | None = None,
        token_life_s: float = 3600.0,
        bin_dir: str | None = None,
    ) -> None:
        self.admin = admin
        self.api_host, self.api_port, self.ca_pem = api_host, api_port, ca_pem
        self.inner = inner
        self.token_life_s = token_life_s
        self.bin_dir = bin_dir or str(Path(sys.executable).parent)
        self.root = reaper.temp_dir("rsz-pods-")
        self.rotations: list[Rotation] = []
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.Lock()
        self._report: ExitReport | None = None
        self._ready: ReadyReport | None = None
        self._seq = itertools.count(1)

    # --- PodRuntime ----------------------------------------------------------------------
    def start(self, pod: Obj) -> str | None:
        if not self._ours(pod):
            return self.inner.start(pod) if self.inner is not None else None
        p = _Pod(pod, self.root / pod["metadata"]["uid"][:8])
        p.root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._pods[p.uid] = p
        self._project_token(p)
        for c in pod["spec"].get("containers") or []:
            p.containers[c["name"]] = _Container(c)
            self._run(p, c["name"])
            t = threading.Thread(target=self._probe_loop, args=(p, c["name"]), daemon=True)
            t.start()
            p.threads.append(t)
        return None

    def stop_all(self, pods: list[Obj]) -> None:
        with self._lock:
            ours = [
                self._pods.pop(uid)
                for uid in (o["metadata"]["uid"] for o in pods)
                if uid in self._pods
            ]
        others = [o for o in pods if o["metadata"]["uid"] not in {p.uid for p in ours}]
        if others and self.inner is not None:
            self.inner.stop_all(others)
        for p in ours:
            p.stopping.set()
        procs = [c.proc for p in ours for c in p.containers.values() if c.proc is not None]
        grace = min(
            [float(p.obj["spec"].get("terminationGracePeriodSeconds", 30)) for p in ours] or [30]
        )
        stop_process_groups(procs, grace_s=min(grace, 10.0))
        for p in ours:
            for t in p.threads:
                t.join(timeout=10)
            for r in self.rotations:
                if r.pod == p.obj["metadata"]["name"] and r.revoked is None and r.secret:
                    self._revoke(p, r)

    def on_exit(self, report: ExitReport) -> None:
        self._report = report
        if self.inner is not None:
            self.inner.on_exit(report)

    def on_ready(self, report: ReadyReport) -> None:
        """Readiness probe results, for the pod's Ready condition."""
        self._ready = report

    def probes_readiness(self, pod: Obj, container: str) -> bool:
        """The container starts unready and its readiness probe says when it is ready."""
        if not self._ours(pod):
            return False
        containers: list[Obj] = pod["spec"].get("containers") or []
        spec: Obj = next((c for c in containers if c["name"] == container), {})
        return bool((spec.get("readinessProbe") or {}).get("exec"))

    def restart(self, pod: Obj, container: str) -> None:
        with self._lock:
            p = self._pods.get(pod["metadata"]["uid"])
        if p is None:
            if self.inner is not None and not self._ours(pod):
                self.inner.restart(pod, container)
            return
        if not p.stopping.is_set():
            self._run(p, container)

    def init_containers(self, pod: Obj) -> list[str]:
        commands = getattr(self.inner, "init_containers", None)
        return list(commands(pod)) if commands is not None and not self._ours(pod) else []

    def on_init(self, report: Any) -> None:
        on_init = getattr(self.inner, "on_init", None)
        if on_init is not None:
            on_init(report)

    def close(self) -> None:
        with self._lock:
            uids = list(self._pods)
        self.stop_all([self._pods[u].obj for u in uids if u in self._pods])
        reaper.remove_dir(self.root)

    # --- for tests -------------------------------------------------------------------------
    def pid(self, namespace: str, pod: str, container: str) -> int:
        """The process id of a running container (LookupError: none runs)."""
        with self._lock:
            found = [p for p in self._pods.values() if p.key == (namespace, pod)]
        proc = (
            found[0].containers[container].proc
            if found and container in found[0].containers
            else None
        )
        if proc is None or proc.poll() is not None:
            raise LookupError(f"container {container} of pod {namespace}/{pod} is not running")
        return proc.pid

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        with self._lock:
            found = [p for p in self._pods.values() if p.key == (namespace, pod)]
        if not found:
            raise LookupError(f"pod {namespace}/{pod} does not run here")
        return found[0].root / f"{container}.log"

    def token_dir(self, namespace: str, pod: str) -> Path:
        with self._lock:
            found = [p for p in self._pods.values() if p.key == (namespace, pod)]
        if not found:
            raise LookupError(f"pod {namespace}/{pod} does not run here")
        return found[0].root / "serviceaccount"

    # --- containers ----------------------------------------------------------------------
    def _ours(self, pod: Obj) -> bool:
        containers = (pod.get("spec") or {}).get("containers") or []
        return bool(containers) and all(is_raysize_image(c.get("image", "")) for c in containers)

    def _run(self, p: _Pod, name: str) -> None:
        c = p.containers[name]
        env = self._env(p, c.spec)
        argv = [
            expand(a, env)
            for a in [*(c.spec.get("command") or ENTRYPOINT), *(c.spec.get("args") or [])]
        ]
        mounts = self._mounts(p, c.spec)
        with (p.root / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                [*_in_own_mounts(mounts), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=p.root,
            )
        reaper.guard(proc)
        with p.lock:
            c.proc, c.started, c.generation = proc, time.monotonic(), c.generation + 1
        log.info("pod %s/%s: container %s started (pid %d)", *p.key, name, proc.pid)
        t = threading.Thread(target=self._watch, args=(p, name, proc), daemon=True)
        t.start()

    def _watch(self, p: _Pod, name: str, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        c = p.containers[name]
        with p.lock:
            mine = c.proc is proc and not p.stopping.is_set()
        if mine and self._report is not None:
            log.info("pod %s/%s: container %s exited %d", *p.key, name, exit_code(code))
            self._report(*p.key, p.uid, name, exit_code(code))

    def _env(self, p: _Pod, c: Obj) -> dict[str, str]:
        """The container's environment, as the kubelet makes it."""
        ns, name = p.key
        port = str(self.api_port)
        env: dict[str, str] = {
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(p.root),
            "HOSTNAME": name,
            "PYTHONPATH": str(REPO),  # the image is the local install: this repository
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
        }
        for source in c.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, ref in (
                ("configmaps", source.get("configMapRef")),
                ("secrets", source.get("secretRef")),
            ):
                if ref is None:
                    continue
                data = self._data(ns, kind, ref["name"], bool(ref.get("optional")))
                env.update({prefix + k: v for k, v in (data or {}).items()})
        for var in c.get("env") or []:
            source = var.get("valueFrom") or {}
            for kind, key in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
                ref = source.get(key)
                if ref is None:
                    continue
                data = self._data(ns, kind, ref["name"], bool(ref.get("optional")))
                if data is None or ref["key"] not in data:
                    if not ref.get("optional"):
                        raise RuntimeError(
                            f"pod {ns}/{name}: {kind[:-1]} {ref['name']} has no key {ref['key']}"
                        )
                    break
                env[var["name"]] = data[ref["key"]]
                break
            else:
                env[var["name"]] = expand(_env_value(var, p.obj, ""), env)
        return env

    def _data(self, namespace: str, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        """A ConfigMap's or Secret's data (decoded), None if optional and missing."""
        try:
            obj = self.admin.call("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as err:
            if err.code == 404 and optional:
                return None
            raise
        data = dict(obj.get("data") or {})
        if kind == "secrets":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return data

    def _mounts(self, p: _Pod, c: Obj) -> list[tuple[Path, str]]:
        """(folder on the host, path in the container): the token, then the volumes."""
        mounts: list[tuple[Path, str]] = []
        if (p.root / "serviceaccount").exists():
            mounts.append((p.root / "serviceaccount", SA_PATH))
        volumes = {v["name"]: v for v in p.obj["spec"].get("volumes") or []}
        ns = p.key[0]
        for m in c.get("volumeMounts") or []:
            v = volumes.get(m["name"]) or {}
            where = p.root / "volumes" / m["name"]
            if "emptyDir" in v:
                where.mkdir(parents=True, exist_ok=True)
            elif "secret" in v or "configMap" in v:
                kind, ref = (
                    ("secrets", v["secret"]) if "secret" in v else ("configmaps", v["configMap"])
                )
                ref_name = ref.get("secretName") or ref.get("name")
                data = self._data(ns, kind, ref_name, bool(ref.get("optional")))
                if data is None:
                    continue  # optional and missing: nothing to see there
                where.mkdir(parents=True, exist_ok=True)
                for k, value in data.items():
                    (where / k).write_text(value)
            else:
                continue  # a kind of volume the deploy/ manifests do not use
            mounts.append((where, m["mountPath"]))
        return mounts

    # --- the ServiceAccount token ----------------------------------------------------------
    def _project_token(self, p: _Pod) -> None:
        spec = p.obj["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return
        folder = p.root / "serviceaccount"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ca.crt").write_bytes(self.ca_pem)
        (folder / "namespace").write_text(p.key[0])
        self._rotate(p)
        t = threading.Thread(target=self._token_loop, args=(p,), daemon=True)
        t.start()
        p.threads.append(t)

    def _rotate(self, p: _Pod) -> None:
        """Mint a token for the pod's ServiceAccount and write it (atomically)."""
        ns, name = p.key
        account = p.obj["spec"].get("serviceAccountName") or "default"
        short = self.token_life_s < MIN_TOKEN_S
        secret = f"{name}-token-{next(self._seq)}" if short else ""
        if short:  # the token's own life: it dies with this Secret (see the module)
            made = self.admin.call(
                "POST",
                f"/api/v1/namespaces/{ns}/secrets",
                {"metadata": {"name": secret, "labels": {"sandbox.raysize.io/token-of": name}}},
            )
            bound = {
                "apiVersion": "v1",
                "kind": "Secret",
                "name": secret,
                "uid": made["metadata"]["uid"],
            }
        else:
            bound = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": p.uid}
        reply = self.admin.call(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": max(MIN_TOKEN_S, int(self.token_life_s)),
                    "boundObjectRef": bound,
                },
            },
        )
        token = str(reply["status"]["token"])
        path = p.root / "serviceaccount" / "token"
        tmp = path.with_name(".token.tmp")
        tmp.write_text(token)
        os.replace(tmp, path)
        with self._lock:
            self.rotations.append(Rotation(name, token, secret, time.monotonic()))
        log.info(
            "pod %s/%s: service account token written (%s)", ns, name, secret or "bound to the pod"
        )

    def _revoke(self, p: _Pod, r: Rotation) -> None:
        with contextlib.suppress(ApiError):
            self.admin.call("DELETE", f"/api/v1/namespaces/{p.key[0]}/secrets/{r.secret}")
        r.revoked = time.monotonic()
        log.info("pod %s/%s: token of %s revoked (its life is over)", *p.key, r.secret)

    def _token_loop(self, p: _Pod) -> None:
        life = self.token_life_s
        while True:
            with self._lock:
                mine = [r for r in self.rotations if r.pod == p.key[1]]
            now = time.monotonic()
            rotate_at = mine[-1].minted + ROTATE_AT * life
            due = [r for r in mine if r.secret and r.revoked is None and r.minted + life <= now]
            for r in due:
                self._revoke(p, r)
            if now >= rotate_at:
                try:
                    self._rotate(p)
                except Exception as exc:  # the API away a moment: try again soon
                    log.warning("pod %s/%s: token rotation failed: %s", *p.key, exc)
                    rotate_at = now + 1.0
                continue
            waits = [rotate_at] + [r.minted + life for r in mine if r.secret and r.revoked is None]
            if p.stopping.wait(max(0.05, min(waits) - now)):
                return

    # --- exec probes -------------------------------------------------------------------------
    def _probe_loop(self, p: _Pod, name: str) -> None:
        c = p.containers[name]
        live = (
            (c.spec.get("livenessProbe") or {})
            if (c.spec.get("livenessProbe") or {}).get("exec")
            else None
        )
        ready = (
            (c.spec.get("readinessProbe") or {})
            if (c.spec.get("readinessProbe") or {}).get("exec")
            else None
        )
        probes = [
            (kind, probe) for kind, probe in (("liveness", live), ("readiness", ready)) if probe
        ]
        if not probes:
            return
        state: dict[str, tuple[int, float, int, int, bool | None]] = {}
        # kind → (container generation, next run, failures, successes, last reported)
        while not p.stopping.is_set():
            now = time.monotonic()
            with p.lock:
                gen, started, proc = c.generation, c.started, c.proc
            waits = []
            for kind, probe in probes:
                s = state.get(kind)
                if s is None or s[0] != gen:  # a new container: its initial delay again
                    s = (gen, started + float(probe.get("initialDelaySeconds", 0)), 0, 0, None)
                g, at, fails, oks, reported = s
                if now >= at and proc is not None and proc.poll() is None:
                    ok = self._exec_probe(p, name, proc.pid, probe)
                    fails, oks = (0, oks + 1) if ok else (fails + 1, 0)
                    at = now + float(probe.get("periodSeconds", 10))
                    if kind == "readiness":
                        threshold_ok = oks >= int(probe.get("successThreshold", 1))
                        threshold_bad = fails >= int(probe.get("failureThreshold", 3))
                        value = True if threshold_ok else (False if threshold_bad else reported)
                        if value is not None and value != reported and self._ready is not None:
                            self._ready(*p.key, p.uid, name, value)
                            reported = value
                    elif fails >= int(probe.get("failureThreshold", 3)):
                        log.warning(
                            "pod %s/%s: container %s failed its liveness probe %d times: killed",
                            *p.key,
                            name,
                            fails,
                        )
                        grace = float(p.obj["spec"].get("terminationGracePeriodSeconds", 30))
                        stop_process_groups([proc], grace_s=min(grace, 10.0))
                        fails = 0
                state[kind] = (g, at, fails, oks, reported)
                waits.append(at)
            p.stopping.wait(max(0.05, min(waits) - time.monotonic()) if waits else 0.5)

    def _exec_probe(self, p: _Pod, name: str, pid: int, probe: Obj) -> bool:
        """Run the probe's command in the container (its env, its mounts); exit 0 passes."""
        argv = list(probe["exec"].get("command") or [])
        env = self._env(p, p.containers[name].spec)
        try:
            done = subprocess.run(
                ["nsenter", f"--target={pid}", "--mount", "--", *argv],
                env=env,
                capture_output=True,
                timeout=float(probe.get("timeoutSeconds", 1)),
                cwd=p.root,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        except OSError as exc:
            log.warning("pod %s/%s: probe %s: %s", *p.key, argv, exc)
            return False
        return done.returncode == 0


def image_paths() -> list[Path]:
    """What stands for the container image here: the install (`sys.prefix`) and the
    checkout it runs from (an editable install). A volume mounted over a folder above
    them (the Deployment's emptyDir at /tmp, with a checkout under /tmp) must not hide
    them, as a real volume never hides the image's own files."""
    import raysize

    return [Path(sys.prefix).resolve(), Path(raysize.__file__).resolve().parent.parent]


def _in_own_mounts(mounts: list[tuple[Path, str]], keep: list[Path] | None = None) -> list[str]:
    """A command prefix: a mount namespace of its own with each folder bound over its
    path (the mount points made if missing), then exec the command.

    Every source, and every path of `keep` that a mount would hide, is first bound into
    a staging tmpfs private to the namespace (at /mnt): a mount over /tmp would otherwise
    hide the sources that live under /tmp, and the install if it lives there too; the
    kept paths are bound back on top afterwards."""
    if not mounts:
        return []
    keep = keep if keep is not None else image_paths()
    targets = [Path(path) for _, path in mounts]
    hidden = [k for k in keep if any(k == t or t in k.parents for t in targets)]
    q = shlex.quote
    steps = ["mount -t tmpfs rsz-stage /mnt"]
    steps += [f"mkdir /mnt/s{i} && mount --bind {q(str(src))} /mnt/s{i}" for i, (src, _) in
              enumerate(mounts)]  # fmt: skip
    steps += [f"mkdir /mnt/k{i} && mount --bind {q(str(k))} /mnt/k{i}" for i, k in
              enumerate(hidden)]  # fmt: skip
    steps += [f"mkdir -p {q(path)} && mount --bind /mnt/s{i} {q(path)}" for i, (_, path) in
              enumerate(mounts)]  # fmt: skip
    steps += [f"mkdir -p {q(str(k))} && mount --bind /mnt/k{i} {q(str(k))}" for i, k in
              enumerate(hidden)]  # fmt: skip
    script = " && ".join(steps) + ' || exit 125; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
