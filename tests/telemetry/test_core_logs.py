"""With RAYSIZE_LOG_FORMAT=json every line the worker writes is JSON, the Temporal core's
own included: it wrote its gRPC retries as coloured text (`temporalio_client::retry …
retried 6 times`) when Temporal went away, in the middle of the JSON (issue #28).

The worker's logging and the core run in a process of their own, so that everything
written to its stderr (fd 2, where the core wrote directly) is read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.orchestration.temporal_env import start_dev_server

# what `raysize worker` sets up (configure_logging, setup_telemetry), a worker polling,
# then: wait until the core has said something (Temporal is stopped meanwhile)
PROCESS = r"""
import asyncio, logging, sys, time, uuid
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from raysize.worker.settings import Settings
from raysize.worker.telemetry import CORE_LOGGER, configure_logging, setup_telemetry

@workflow.defn(name="CoreLogsNoop")
class Noop:
    @workflow.run
    async def run(self) -> None:
        return None

heard = []
class Heard(logging.Handler):
    def emit(self, record):
        heard.append(record)

async def main():
    configure_logging("INFO", "json")
    logging.getLogger(CORE_LOGGER).addHandler(Heard())
    telemetry = setup_telemetry(Settings(log_format="json"), environ={})
    client = await Client.connect(sys.argv[1], runtime=telemetry.runtime)
    async with Worker(client, task_queue=f"q-{uuid.uuid4()}", workflows=[Noop],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        print("polling", flush=True)
        end = time.monotonic() + 60
        while not heard and time.monotonic() < end:
            await asyncio.sleep(0.2)
        # (the test stops this process: a worker without its server does not end by itself)
        print("heard" if heard else "silent", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_the_core_s_lines_are_json_when_temporal_goes_away(tmp_path: Path) -> None:
    env = await start_dev_server()
    stopped = False
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", PROCESS, env.client.service_client.config.target_host],
            stdout=subprocess.PIPE,
            stderr=sink,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"polling", err.read_text()[-2000:]
        await env.shutdown()  # Temporal goes away: the core retries, and says so
        stopped = True
        said = proc.stdout.readline().strip()  # within the process's 60 s
    finally:
        if not stopped:
            await env.shutdown()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = [ln for ln in err.read_text().splitlines() if ln.strip()]
    assert said == b"heard", (
        f"the core said nothing through logging in 60 s: {said[:200]!r} {lines[-3:]}"
    )
    not_json, docs = [], []
    for ln in lines:
        try:
            docs.append(json.loads(ln))
        except ValueError:
            not_json.append(ln)
    assert not not_json, not_json[:3]
    core = [d for d in docs if str(d.get("logger", "")).startswith("temporalio.core")]
    assert core and core[0]["level"] == "WARNING" and "retried" in core[0]["msg"], docs[-3:]
    assert {d["logger"] for d in core} == {"temporalio.core"}
