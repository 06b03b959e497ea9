"""Real Ray processes behind sandbox pods (`--with-ray`).

The head pod runs a Ray head, each worker pod a `ray start` Raylet that joins it, with
`RAY_CLOUD_INSTANCE_ID=<pod name>` and `RAY_NODE_TYPE_NAME=<group>`, with the resources of
the pod's own `ray start` line as KubeRay writes it (`--num-cpus`, `--num-gpus`,
`--memory`, `--resources`: the group's `rayStartParams`, else the template's size; see
`sandbox/operator.py`), so a head with `num-cpus: "0"` registers 0 CPU as in the real
world, and a restarted Raylet comes back at that size, not the pod's. A pod without such a
line (made without the operator) is sized from the pod.
Every `ray start --block` runs in its own session and is stopped by its process group,
never by name. Ports are free ports; the temp dir is short (Unix socket paths are
limited to ~107 characters); the dashboard is off and the object store small.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysize.sandbox import reaper
from raysize.sandbox.ports import free_port
from raysize.workflows.resources import CPU, MEMORY, quantity_to_units

if TYPE_CHECKING:
    from raysize.sandbox.kubelet import ExitReport

log = logging.getLogger(__name__)


def exit_code(returncode: int) -> int:
    """A process's end as a container runtime reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


Obj = dict[str, Any]
OBJECT_STORE_BYTES = 80 * 1024 * 1024
STOP_GRACE_S = 10.0
GCS_WAIT_S = 60.0


def wait_for_port(port: int, timeout_s: float) -> bool:
    """True once 127.0.0.1:port accepts connections; False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def pod_size(pod: Obj) -> tuple[int, int]:
    """(millicores, bytes) of the Ray container, as Ray reads it: limit if set, else request."""
    container = (pod.get("spec") or {}).get("containers", [{}])[0]
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    cpu = limits.get("cpu") or requests.get("cpu") or "1"
    memory = limits.get("memory") or requests.get("memory") or "1Gi"
    return quantity_to_units(cpu, CPU), quantity_to_units(memory, MEMORY)


# the flags of a pod's `ray start` line that say what its Raylet registers
RESOURCE_FLAGS = ("num-cpus", "num-gpus", "memory", "resources")


def ray_start_resources(pod: Obj) -> dict[str, str]:
    """The resource flags of the Ray container's `ray start` line (`--num-cpus=0` →
    {"num-cpus": "0"}), as the shell would split it; {} when it runs no `ray start`."""
    container = (pod.get("spec") or {}).get("containers", [{}])[0]
    script = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
    if "ray start" not in script:
        return {}
    lexer = shlex.shlex(script[script.index("ray start") :], posix=True, punctuation_chars=True)
    try:
        words = list(lexer)
    except ValueError:
        return {}
    out: dict[str, str] = {}
    for word in words[2:]:
        if word and word[0] in ";&|":
            break  # the end of the `ray start` command
        if not word.startswith("--"):
            continue
        key, _, value = word[2:].partition("=")
        if key in RESOURCE_FLAGS and value:
            out[key] = value
    return out


# What of the Ray container's env reaches its process here: what changes what Ray is (the
# GCS runs autoscaler v2: KubeRay sets it on the head). The rest of a pod's env is not
# passed on (the host's processes share one network and no Secrets are resolved).
PASSED_ENV = ("RAY_enable_autoscaler_v2",)


def passed_env(container: Obj) -> dict[str, str]:
    """The container's literal values of `PASSED_ENV`."""
    return {
        str(e["name"]): str(e["value"])
        for e in container.get("env") or []
        if e.get("name") in PASSED_ENV and "value" in e
    }


@dataclass
class RayProcess:
    pod: str
    group: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    namespace: str = ""
    uid: str = ""
    container: str = ""


class RayRuntime:
    """Starts and stops one `ray start --block` per pod."""

    def __init__(self, ray_bin: str | None = None, temp_root: str | None = None) -> None:
        self.ray_bin = ray_bin or str(Path(sys.executable).with_name("ray"))
        self.root = reaper.temp_dir("rs", temp_root or "/tmp")
        self._lock = threading.Lock()
        self._procs: dict[str, RayProcess] = {}  # pod uid → process
        self._gcs: dict[tuple[str, str], int] = {}  # (namespace, cluster) → GCS port
        self._nodes = 0
        self._report: ExitReport | None = None

    def on_exit(self, report: ExitReport) -> None:
        self._report = report

    def restart(self, pod: Obj, container: str) -> None:
        """Run the pod's Ray process again (a new Raylet: Ray gives it a new node id)."""
        with self._lock:
            self._procs.pop(pod["metadata"]["uid"], None)
        self.start(pod)

    def kill(self, namespace: str, pod: str, sig: int = signal.SIGKILL) -> None:
        """Kill a pod's Ray process group, as the node's OOM killer or a crash would (for
        tests): the kubelet sees the container exit and acts on the pod's restartPolicy."""
        with self._lock:
            found = [
                rp for rp in self._procs.values() if (rp.namespace, rp.pod) == (namespace, pod)
            ]
        if not found:
            raise LookupError(f"pod {namespace}/{pod} runs no Ray process here")
        os.killpg(found[0].proc.pid, sig)

    def _watch(self, rp: RayProcess) -> None:
        code = rp.proc.wait()
        with self._lock:
            mine = self._procs.get(rp.uid) is rp  # still ours: it ended by itself
            if mine:
                del self._procs[rp.uid]
        if mine and self._report is not None:
            self._report(rp.namespace, rp.pod, rp.uid, rp.container, exit_code(code))

    def keep_logs(self, dest: Path) -> int:
        """Copy what explains a failure out of this runtime's temp dir (removed on close):
        each pod's `ray start` output and every node's Ray logs. Returns the files copied."""
        copied = 0
        for path in sorted(self.root.rglob("*")):
            try:
                if not path.is_file() or path.is_symlink():
                    continue  # sockets, pipes, and session_latest (a link to a session)
                if path.suffix not in (".log", ".out", ".err", ".txt"):
                    continue
                if path.stat().st_size > 50 * 1024 * 1024:
                    continue
                target = dest / path.relative_to(self.root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
                copied += 1
            except OSError:
                continue  # a file Ray removed meanwhile
        return copied

    def _node_dir(self) -> Path:
        """A short private temp dir per Ray node: Raylets on one host must not share one."""
        with self._lock:
            self._nodes += 1
            path = self.root / f"n{self._nodes}"
        path.mkdir()
        return path

    def gcs_port(self, namespace: str, cluster: str) -> int | None:
        with self._lock:
            return self._gcs.get((namespace, cluster))

    def processes(self) -> dict[str, RayProcess]:
        with self._lock:
            return dict(self._procs)

    def start(self, pod: Obj) -> str | None:
        """Start the pod's Ray process; the pod shares the host's address (None)."""
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        cluster = labels.get("ray.io/cluster")
        if not cluster:
            return None  # not a Ray pod: nothing to run
        namespace = meta.get("namespace", "")
        is_head = labels.get("ray.io/node-type") == "head"
        group = labels.get("ray.io/group", "headgroup" if is_head else "")
        millicores, memory = pod_size(pod)
        sized = {"num-cpus": str(math.ceil(millicores / 1000)), "memory": str(memory)}
        sized.update(ray_start_resources(pod))  # what KubeRay's line says wins
        args = [
            self.ray_bin,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            *(f"--{key}={sized[key]}" for key in RESOURCE_FLAGS if key in sized),
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={self._node_dir()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
        with self._lock:
            if is_head:
                port = free_port()
                self._gcs[(namespace, cluster)] = port
                args += [
                    "--head",
                    f"--port={port}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}",
                ]
            else:
                port_or_none = self._gcs.get((namespace, cluster))
                if port_or_none is None:
                    log.warning(
                        "no head for %s/%s: pod %s runs without a Raylet",
                        namespace,
                        cluster,
                        meta["name"],
                    )
                    return None
                args.append(f"--address=127.0.0.1:{port_or_none}")
        if not is_head:
            # A Raylet that starts before its GCS answers can hang in `ray start`; KubeRay's
            # worker init container waits for the GCS the same way.
            wait_for_port(int(args[-1].rsplit(":", 1)[1]), GCS_WAIT_S)
        env = dict(os.environ)
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        env.update(passed_env(containers[0]))
        env.update(
            {
                "RAY_CLOUD_INSTANCE_ID": meta["name"],
                "RAY_NODE_TYPE_NAME": group,
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_ADDRESS": "",
            }
        )
        log_path = self.root / f"{meta['name']}.log"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=self.root,
            )
        reaper.guard(proc)
        rp = RayProcess(
            meta["name"],
            group,
            proc,
            log_path,
            namespace,
            meta["uid"],
            containers[0].get("name", "ray"),
        )
        with self._lock:
            self._procs[meta["uid"]] = rp
        threading.Thread(target=self._watch, args=(rp,), daemon=True).start()
        log.info(
            "pod %s: started %s (pid %d)",
            meta["name"],
            "Ray head" if is_head else "Raylet",
            proc.pid,
        )
        return None

    def stop_all(self, pods: list[Obj]) -> None:
        """Stop these pods' Ray processes: all signalled first, one shared grace period."""
        stopping: list[RayProcess] = []
        with self._lock:
            for pod in pods:
                meta = pod["metadata"]
                rp = self._procs.pop(meta["uid"], None)
                labels = meta.get("labels") or {}
                if labels.get("ray.io/node-type") == "head":
                    key = (meta.get("namespace", ""), labels.get("ray.io/cluster", ""))
                    self._gcs.pop(key, None)
                if rp is not None:
                    stopping.append(rp)
        _stop_workers_first(stopping)

    def close(self) -> None:
        with self._lock:
            procs = list(self._procs.values())
            self._procs.clear()
            self._gcs.clear()
        _stop_workers_first(procs)
        reaper.remove_dir(self.root)


def _stop_workers_first(procs: list[RayProcess]) -> None:
    """Workers are signalled first, then heads, so Raylets do not spin on a vanished GCS;
    all are signalled before any is waited for, and all share one grace period."""
    stop_process_groups([rp.proc for rp in sorted(procs, key=lambda p: p.group == "headgroup")])


def stop_process_groups(
    procs: list[subprocess.Popen[bytes]], grace_s: float = STOP_GRACE_S
) -> None:
    """SIGTERM each process group in order (each process leads its own group,
    start_new_session=True), wait for all of them against one deadline, then SIGKILL
    each group that is left and every group's stragglers that outlived their leader, and
    return once no process of any group runs (a SIGKILLed process ends when the kernel next
    schedules it, which on a loaded machine is not at once)."""
    alive: list[subprocess.Popen[bytes]] = []
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
            alive.append(proc)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.poll() is None or reaper.group_alive(p.pid)]
        if alive:
            time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left, and stragglers
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            log.error("process %d did not exit", proc.pid)
    deadline = time.monotonic() + 5
    while any(reaper.group_alive(p.pid) for p in procs):
        if time.monotonic() > deadline:  # pragma: no cover - SIGKILL cannot be ignored
            log.error("process groups %s still run after SIGKILL", [p.pid for p in procs])
            break
        time.sleep(0.02)
