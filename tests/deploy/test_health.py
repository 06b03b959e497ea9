"""worker/health.py: the exec probes of the Deployment."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from raysize.worker import health
from tests.deploy.conftest import ROOT


@pytest.fixture
def listener():
    """A TCP port that accepts (a stand-in for Temporal's frontend); closed after the test."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_split_address():
    assert health.split_address("temporal-dev.raysize.svc:7233") == (
        "temporal-dev.raysize.svc",
        7233,
    )
    assert health.split_address("[::1]:7000") == ("::1", 7000)
    assert health.split_address("localhost") == ("localhost", 7233)


def test_live_passes_without_a_heartbeat_and_fails_when_stale(tmp_path):
    beat = tmp_path / "hb" / "heartbeat"
    env = {health.HEALTH_FILE_ENV: str(beat)}
    assert health.main(["live"], env) == 0  # no file yet
    health.beat(beat)
    assert health.main(["live", "--max-age", "60"], env) == 0
    old = time.time() - 120
    os.utime(beat, (old, old))
    assert health.main(["live", "--max-age", "60"], env) == 1
    assert health.main(["live"], {}) == 0  # heartbeats off


def test_ready_needs_temporal_and_a_fresh_heartbeat(tmp_path, listener):
    beat = tmp_path / "heartbeat"
    env = {health.TEMPORAL_ADDRESS_ENV: listener, health.HEALTH_FILE_ENV: str(beat)}
    assert health.main(["ready"], env) == 0
    health.beat(beat)
    assert health.main(["ready"], env) == 0
    os.utime(beat, (time.time() - 600, time.time() - 600))
    assert health.main(["ready"], env) == 1
    down = {health.TEMPORAL_ADDRESS_ENV: closed_port()}
    assert health.main(["ready", "--timeout", "0.5"], down) == 1
    started = time.monotonic()
    assert health.main(["ready", "--timeout", "0.2", "--wait", "1"], down) == 1
    assert 0.9 < time.monotonic() - started < 5


def test_heartbeat_task_beats_and_cleans_up(tmp_path):
    beat = tmp_path / "heartbeat"

    async def scenario() -> None:
        task = asyncio.create_task(health.heartbeat(beat, interval_s=0.05))
        for _ in range(100):
            if beat.exists():
                break
            await asyncio.sleep(0.01)
        first = beat.stat().st_mtime_ns
        await asyncio.sleep(0.2)
        assert beat.stat().st_mtime_ns > first
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert not beat.exists()
    # off unless configured
    asyncio.run(asyncio.wait_for(health.heartbeat(None, 0.01), 1))


def test_probe_command_as_the_deployment_runs_it(listener, tmp_path):
    """`python -m worker.health ready`, in a fresh interpreter, with only the pod's env."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        health.TEMPORAL_ADDRESS_ENV: listener,
        health.HEALTH_FILE_ENV: str(tmp_path / "heartbeat"),
    }
    for check, code in (("ready", 0), ("live", 0)):
        out = subprocess.run(
            [sys.executable, "-m", "raysize.worker.health", check],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == code, out.stderr
    env[health.TEMPORAL_ADDRESS_ENV] = closed_port()
    out = subprocess.run(
        [sys.executable, "-m", "raysize.worker.health", "ready", "--timeout", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("raysize ready: Temporal at 127.0.0.1:")
