"""With Temporal stopped, `raysize worker` said nothing itself (only the core's retries):
now it says once that Temporal is unreachable and once that it is back, and the
readiness probe fails once the outage is longer than `--max-unreachable` (issue #28 item
3). The real dev server is stopped and started again on the same port under a real
`raysize worker` with RAYSIZE_LOG_FORMAT=json: every line it writes is JSON."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.orchestration.temporal_env import start_dev_server
from tests.orchestration.worker_process import Worker, probe, probe_until, worker_env

UNREACHABLE = "is unreachable: "
BACK = "is back after "


async def test_an_outage_is_one_line_going_and_one_coming_back(tmp_path: Path) -> None:
    env = await start_dev_server()
    address = str(env.client.service_client.config.target_host)
    port = int(address.rpartition(":")[2])
    worker_settings = worker_env(
        tmp_path, address, f"outage-{uuid.uuid4().hex[:6]}", RAYSIZE_LOG_FORMAT="json"
    )
    worker = Worker(worker_settings)
    running = True
    try:
        worker.wait_for("raysize worker polling")
        await env.shutdown()
        running = False
        went = json.loads(worker.wait_for(UNREACHABLE, timeout_s=30))
        # unreachable for longer than --max-unreachable: ready fails with the worker's
        # reason (checked before the probe's own TCP connect), and the outage has lasted
        # a few of the worker's checks (RAYSIZE_TEMPORAL_CHECK_S=1); live does not fail
        for _ in range(60):
            unready = probe(worker_settings, "ready", "--max-unreachable", "3")
            if "more than 3s" in unready.stderr:
                break
        assert unready.returncode == 1, unready.stderr
        assert unready.stderr.startswith(f"raysize ready: cannot reach Temporal at {address}"), (
            unready.stderr
        )
        assert probe(worker_settings, "live").returncode == 0

        env = await start_dev_server(port=port)
        running = True
        back = json.loads(worker.wait_for(BACK, timeout_s=30))
        probe_until(worker_settings, "ready", 0)
    finally:
        code = worker.stop()
        if running:
            await env.shutdown()
    assert code == 0, worker.lines[-10:]
    assert went["level"] == "WARNING" and went["msg"].startswith(f"Temporal at {address} "), went
    assert back["level"] == "INFO" and back["msg"].startswith(f"Temporal at {address} "), back
    not_json = []
    for line in worker.lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not_json == []
    ours = [ln for ln in worker.lines if '"raysize.temporal"' in ln]
    assert [UNREACHABLE in ln for ln in ours] == [True, False], ours
    assert [BACK in ln for ln in ours] == [False, True], ours
