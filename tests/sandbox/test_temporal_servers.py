"""The Temporal servers the SDK starts for tests and benchmarks (`start_local`, the CLI
dev server; `start_time_skipping`, the test server) are stopped when the process that
started them dies by SIGKILL (`raysize.sandbox.temporal_servers`, issue #43 item 7).

The SDK's core starts them as children in the owner's process group and stops them at
`env.shutdown()`, which a SIGKILLed owner never reaches: they ran on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from raysize.sandbox import reaper
from tests.orchestration.temporal_env import venv_binary
from tests.sandbox.test_reaper import ROOT, wait_gone

# an owner: starts the server as the tests do, prints the PID of its child that runs the
# server's binary, then waits on stdin (it never shuts the server down itself)
OWNER = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from tests.orchestration.temporal_env import start_dev_server, start_time_skipping

    async def main() -> None:
        # kept: a dropped environment's server is stopped by the SDK's core
        env = await (start_dev_server() if sys.argv[1] == "dev" else start_time_skipping())
        binary = os.path.realpath(sys.argv[2])
        me = os.getpid()
        for task in Path(f"/proc/{me}/task").iterdir():
            for child in (task / "children").read_text().split():
                if os.path.realpath(f"/proc/{child}/exe") == binary:
                    print(child, flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await env.shutdown()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    ("kind", "binary"), [("dev", "temporal"), ("time-skipping", "temporal-test-server")]
)
def test_a_sigkilled_owner_s_temporal_server_is_stopped(kind: str, binary: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, kind, venv_binary(binary)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    server, start = 0, ""
    try:
        assert proc.stdout is not None
        server = int(proc.stdout.readline())
        start = reaper.start_time(server)
        assert start, "the server is not running"
        os.kill(proc.pid, signal.SIGKILL)  # the owner alone, as the OOM killer does
        proc.wait(10)
        assert wait_gone(server, start), f"the {kind} server outlived its SIGKILLed owner"
        # the reaper shares the owner's stderr: it ends when the reaper does
        assert proc.stderr is not None
        assert f"stopped process group(s) {server}" in proc.stderr.read()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # on the code before, the server ran on: stopped here, by its PID, if still ours
        if server and start and reaper.start_time(server) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGKILL)
