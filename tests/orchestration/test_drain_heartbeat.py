"""A drain on a worker that died (issue #43 item 4): the loop notices within the drain's
heartbeat timeout and drains again, instead of waiting out its start-to-close (30 s +
10 s a pod: 17 minutes at 100 pods, during which the loop neither grew nor paused).

The time-skipping server's clock: the first drain attempt never heartbeats nor ends (as
on a worker that was SIGKILLed), and the test skips 20 s of the server's time."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio.testing import WorkflowEnvironment

from raysize.workflows.contracts import HEARTBEAT_TIMEOUT, DrainInput

from ..workflows.kit import group, pod, snapshot
from .fake_world import FakeWorld
from .test_reconcile_workflow import reconciling, until

PODS = 100  # a start-to-close of 30 + 10 × 100 s


async def test_a_drain_on_a_dead_worker_runs_again_within_the_heartbeat_timeout(
    ts_env: WorkflowEnvironment,
) -> None:
    idle = [pod(f"w{i:03d}", idle_s=600) for i in range(PODS)]
    world = FakeWorld(snapshot([group(max_workers=PODS)], idle))
    started: list[datetime] = []  # each drain attempt, in the server's time
    dead = asyncio.Event()  # never set: the first attempt's worker is gone

    async def first_on_a_dead_worker(inp: DrainInput) -> None:
        started.append(await ts_env.get_current_time())
        if len(started) == 1:
            await dead.wait()  # no heartbeat, no answer

    world.on_drain = first_on_a_dead_worker
    async with reconciling(ts_env, world):
        await until(lambda: world.drains)
        assert len(world.drains[0].targets) == PODS
        # longer than the heartbeat timeout and its retry's backoff (1 s), far shorter
        # than the drain's start-to-close
        await ts_env.sleep(HEARTBEAT_TIMEOUT + timedelta(seconds=5))
        await until(lambda: world.scales)
    assert len(started) >= 2, "the drain was not run again"
    assert started[1] - started[0] < HEARTBEAT_TIMEOUT + timedelta(seconds=5)
    # the second attempt drained them all, and the pods went
    assert world.drains[1].targets == world.drains[0].targets
    assert sum(len(n) for n in world.scales[0].workers_to_delete.values()) == PODS
