"""Real Ray processes for the tests and the benchmarks: a local cluster and driver scripts.

Every process is started here with its own process group (`start_new_session=True`)
and stopped through that group: `ray start --block` keeps the GCS, the Raylet and their
helpers in its group, so killing the group stops exactly this node and nothing else.
Nothing here calls `ray stop`.

The test process never imports `ray`: it has raysize's own protos loaded, and Ray's
generated modules register the same full names. Drivers run as subprocesses.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from raysize.activities.ray_gcs import RayError, RayGcsClient
from raysize.activities.ray_state import ClusterState
from raysize.sandbox import reaper
from raysize.sandbox.ports import free_port

RAY = str(Path(sys.executable).with_name("ray"))
T = TypeVar("T")

# Each environment variable Ray reads that could leak in from the outside world.
_SCRUB = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_USE_TLS")


def wait_for(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except RayError as exc:  # the cluster may still be settling
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {last_error}")
        time.sleep(interval)


def stop_group(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """Stop a process we started and everything in its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # `ray start --block` may exit before its children: finish the whole group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@dataclass
class RayNodeProcess:
    pod: str
    group: str
    proc: subprocess.Popen[bytes]
    log: Path
    killed: bool = False

    def kill(self, timeout: float = 10.0) -> None:
        """Hard-kill the node (Raylet and helpers), like a pod deleted without notice.

        Never raises for a slow death: if `ray start` outlives its group's SIGKILL by
        `timeout` (it may have left the group), it is SIGKILLed by pid and waited for
        once more; if even that does not end it, a warning says so."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            warnings.warn(
                f"ray start for {self.pod} (pid {self.proc.pid}) still runs after SIGKILL",
                stacklevel=2,
            )


@dataclass
class LocalRayCluster:
    """A head and worker Raylets on this machine, each a `ray start --block` process.

    The head has no CPUs (`--num-cpus=0`): work lands on the workers, where the tests
    expect it. Ports are free ports, the temp dir and HOME are private (no token from
    ~/.ray leaks in), the dashboard is off.
    """

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    port: int = field(default_factory=free_port)
    nodes: list[RayNodeProcess] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        env.update(
            HOME=str(self.root / "home"),
            RAY_USAGE_STATS_ENABLED="0",
            RAY_enable_autoscaler_v2="1",
            RAY_AUTH_MODE="token" if self.token else "disabled",
        )
        if self.token:
            env["RAY_AUTH_TOKEN"] = self.token
        env.update(self.env)
        return env

    def _start(
        self,
        pod: str,
        group: str,
        args: list[str],
        *,
        cpus: int,
        memory: int,
        labels: Mapping[str, str] | None,
        resources: Mapping[str, float] | None,
    ) -> RayNodeProcess:
        (self.root / "home").mkdir(parents=True, exist_ok=True)
        env = self.base_env()
        env.update(RAY_CLOUD_INSTANCE_ID=pod, RAY_NODE_TYPE_NAME=group)
        log = self.root / f"{pod}.log"
        cmd = [
            RAY,
            "start",
            "--block",
            *args,
            f"--num-cpus={cpus}",
            f"--memory={memory}",
            "--object-store-memory=80000000",
            # One temp dir per node: nodes started at once on one host would otherwise
            # race for the same socket names.
            f"--temp-dir={self.root / f'n{len(self.nodes)}'}",
            "--include-log-monitor=false",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            "--disable-usage-stats",
        ]
        if labels:
            cmd.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        if resources:
            cmd.append("--resources=" + json.dumps(dict(resources)))
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        reaper.guard(proc)
        node = RayNodeProcess(pod=pod, group=group, proc=proc, log=log)
        self.nodes.append(node)
        return node

    def start_head(self, pod: str = "head-0", group: str = "headgroup") -> RayNodeProcess:
        return self._start(
            pod,
            group,
            [
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-port={free_port()}",
                "--include-dashboard=false",
            ],
            cpus=0,
            memory=500_000_000,
            labels=None,
            resources=None,
        )

    def add_worker(
        self,
        pod: str,
        group: str,
        *,
        cpus: int = 1,
        memory: int = 1_000_000_000,
        labels: Mapping[str, str] | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> RayNodeProcess:
        return self._start(
            pod,
            group,
            [f"--address={self.address}"],
            cpus=cpus,
            memory=memory,
            labels=labels,
            resources=resources,
        )

    def client(self, **kwargs: Any) -> RayGcsClient:
        kwargs.setdefault("token", self.token)
        return RayGcsClient(self.address, **kwargs)

    def wait_alive(self, pods: list[str], timeout: float = 90.0) -> ClusterState:
        """Wait until every pod in `pods` has a live Raylet registered."""
        with self.client(timeout=2.0) as client:

            def probe() -> ClusterState | None:
                self.check_running()
                state = client.cluster_state()
                alive = {n.pod for n in state.alive_nodes}
                return state if set(pods) <= alive else None

            return wait_for(probe, timeout=timeout, what=f"Raylets of {pods}")

    def check_running(self) -> None:
        for node in self.nodes:
            code = node.proc.poll()
            if code is not None and not node.killed:
                tail = node.log.read_text(errors="replace")[-2000:]
                raise AssertionError(f"ray start for {node.pod} exited with {code}:\n{tail}")

    def stop(self) -> None:
        """Stop every node, even when stopping one fails; then raise what failed."""
        errors: list[BaseException] = []
        # Workers first, so no Raylet spends its last seconds looking for the GCS.
        for node in reversed(self.nodes):
            try:
                stop_group(node.proc)
            except BaseException as exc:  # Ctrl-C too: the other nodes still stop
                exc.add_note(f"while stopping Ray node {node.pod} (pid {node.proc.pid})")
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise BaseExceptionGroup(f"stopping {len(errors)} Ray nodes failed", errors)


class Driver:
    """A Ray driver script run in its own process group.

    The script talks back with JSON lines on stdout; `expect()` waits for one.
    """

    def __init__(
        self,
        cluster: LocalRayCluster,
        script: str,
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        full_env = cluster.base_env()
        full_env.update(env or {})
        full_env["RAY_ADDRESS"] = cluster.address
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", script, *args],
            env=full_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        reaper.guard(self.proc)
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("{"):
                self._lines.put(json.loads(line))
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw)
            del self._stderr[:-200]

    def expect(self, event: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"driver sent no {event!r} in {timeout} s; stderr:\n{self.stderr_tail()}"
                ) from None
            if message is None:
                raise AssertionError(
                    f"driver exited ({self.proc.wait()}) before {event!r}; "
                    f"stderr:\n{self.stderr_tail()}"
                )
            if message.get("event") == event:
                return message

    def send(self, command: str) -> None:
        """One line on the driver's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_group(self.proc, grace=5.0)

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# A task that holds 1 CPU and 600 MB of the node given as its argument until stdin closes.
HOLD_ONE_CPU = """
import json, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()

@ray.remote(num_cpus=1, memory=600_000_000)
def hold():
    time.sleep(3600)

pinned = NodeAffinitySchedulingStrategy(sys.argv[1], soft=False)
ref = hold.options(scheduling_strategy=pinned).remote()
print(json.dumps({"event": "submitted"}))
input()
"""


@contextlib.contextmanager
def holding_one_cpu(cluster: LocalRayCluster, gcs: RayGcsClient, node_id: str) -> Iterator[Driver]:
    """A driver whose task holds 1 CPU and 600 MB of `node_id`, once the GCS shows the
    node's CPU taken; the driver and its task end with the block."""
    with Driver(cluster, HOLD_ONE_CPU, args=(node_id,)) as driver:
        driver.expect("submitted")
        wait_for(
            lambda: (
                next(n for n in gcs.cluster_state().nodes if n.node_id == node_id).available.cpu
                == 0
            ),
            timeout=30,
            what=f"a task to hold the CPU of {node_id[:12]}",
        )
        yield driver
