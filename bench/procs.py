"""What the benchmarks start: the Temporal dev server, and a `raysize worker` process of
this checkout in a session of its own (stopped by its process group:
`sandbox.localray.stop_group`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from raysize.sandbox import temporal_servers
from raysize.workflows.naming import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent


def stop_on_sigterm() -> None:
    """A SIGTERM (`kill`, a CI job's timeout) ends a benchmark the way Ctrl-C does: through
    its `finally` blocks, which stop every process it started by its group. Python's
    default would end it at once and leave its Ray nodes and servers running."""

    def exit_now(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)


def start_raysize_worker(
    log_path: Path, temporal: str, queue: str, kubeconfig: Path, **settings: str
) -> subprocess.Popen[bytes]:
    """`raysize worker` against `temporal`, polling `queue`, with `settings` as
    RAYSIZE_<NAME> variables (none of this shell's RAYSIZE_* leak in); its output is
    appended to `log_path`."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAYSIZE_")},
        "PYTHONPATH": str(ROOT),
        "RAYSIZE_TEMPORAL_ADDRESS": temporal,
        "RAYSIZE_TASK_QUEUE": queue,
        "RAYSIZE_KUBECONFIG": str(kubeconfig),
        **{f"RAYSIZE_{name.upper()}": value for name, value in settings.items()},
    }
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "raysize.worker.cli", "worker"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# one task-queue partition: a queue's first tasks are not spread thin (docs/design/temporal-notes)
ONE_PARTITION = (
    "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
    "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
)  # fmt: skip


async def start_dev_server(*extra_args: str) -> WorkflowEnvironment:
    """The Temporal CLI dev server of this venv (in memory), with raysize's search
    attributes; the caller shuts it down (`await env.shutdown()`; guarded by the reaper
    should the benchmark be killed first)."""
    return await temporal_servers.start_local(
        dev_server_existing_path=str(Path(sys.executable).with_name("temporal")),
        # the SDK's 5 s default was too short for a loaded 2-core machine (a benchmark run
        # beside CI: "did not start within 5s"); a server that never starts still fails
        dev_server_startup_timeout=timedelta(seconds=60),
        data_converter=pydantic_data_converter,
        search_attributes=list(SEARCH_ATTRIBUTES),
        dev_server_log_level="error",
        dev_server_extra_args=list(extra_args),
    )


async def until(check: Any, timeout: float, every: float = 0.1) -> bool:
    """Whether `check()` (blocking: run in a thread) came true within `timeout` seconds,
    asked every `every` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(every)
    return False
