"""With RAYSIZE_LOG_FORMAT=json, every line `raysize worker` writes is JSON, the last one
too: a worker that cannot reach Temporal at start-up wrote its fatal error as a plain
`error: …` line (issue #43 item 7), which a log collector files as noise."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

from raysize.sandbox import reaper
from tests.orchestration.worker_process import RAYSIZE, worker_env


def _closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_worker(env: dict[str, str]) -> tuple[int, list[str]]:
    """`raysize worker` to its end (it cannot start): its exit code and every line of its
    stdout and stderr."""
    proc = subprocess.Popen(
        [RAYSIZE, "worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    reaper.guard(proc)  # stopped even if pytest is SIGKILLed
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out.splitlines()


def test_a_worker_that_cannot_reach_temporal_says_so_in_json(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    env = worker_env(tmp_path, address, f"fatal-{uuid.uuid4().hex[:6]}", RAYSIZE_LOG_FORMAT="json")
    code, lines = _run_worker(env)
    assert code == 1, lines
    assert lines, "the worker said nothing"
    docs = []
    for line in lines:
        try:
            docs.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not JSON: {line!r}\nall lines:\n" + "\n".join(lines)) from None
    last = docs[-1]
    assert last["level"] == "CRITICAL", last
    assert address in last["msg"], last
