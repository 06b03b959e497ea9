"""`raysize worker` in a process of its own, as a Deployment runs it: its log lines read
as they come, its exec probes run as the kubelet runs them."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from raysize.sandbox import reaper
from raysize.sandbox.kubeconfig import write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
RAYSIZE = str(Path(sys.executable).with_name("raysize"))


class Worker:
    """`raysize worker` in a process of its own, its log lines read as they come."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [RAYSIZE, "worker"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            text=True, start_new_session=True,
        )  # fmt: skip
        reaper.guard(self.proc)  # stopped even if pytest is SIGKILLed (CI's timeout)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout_s: float = 60) -> str:
        end = time.monotonic() + timeout_s
        for line in self.lines:
            if text in line:
                return line
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"the worker never said {text!r}:\n" + "\n".join(self.lines[-20:]))

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def worker_env(tmp_path: Path, address: str, queue_name: str, **settings: str) -> dict[str, str]:
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, "http://127.0.0.1:9")  # never called: discovery is off
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYSIZE_", "RAY_"))}
    env.update(
        {
            "HOME": str(tmp_path),
            "RAYSIZE_KUBECONFIG": str(kubeconfig),
            "RAYSIZE_TEMPORAL_ADDRESS": address,
            "RAYSIZE_TASK_QUEUE": queue_name,
            "RAYSIZE_DISCOVER": "false",
            "RAYSIZE_HEALTH_FILE": str(tmp_path / "health" / "heartbeat"),
            "RAYSIZE_TEMPORAL_CHECK_S": "1",
            **settings,
        }
    )
    return env


def probe(env: dict[str, str], check: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The Deployment's exec probe, in a fresh interpreter with the pod's env."""
    return subprocess.run(
        [sys.executable, "-m", "raysize.worker.health", check, "--timeout", "2", *args],
        env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def probe_until(env: dict[str, str], check: str, code: int, timeout_s: float = 30) -> str:
    end = time.monotonic() + timeout_s
    while True:
        done = probe(env, check)
        if done.returncode == code or time.monotonic() > end:
            assert done.returncode == code, done.stderr
            return done.stderr
        time.sleep(0.5)
