"""A workflow task is held for as long as a local activity in it runs: each loop's observe
holds its loop's task. The worker's slots (`worker_slots`, RAYSIZE_MAX_CONCURRENT_WORKFLOW_
TASKS) must let more loops than Temporal's default of 100 hold theirs at once: with that
default, a 1,000-cluster burst kept every slot in observes that waited seconds on the API
server, and new resizes' first workflow tasks waited 100 s in the queue behind them
(`bench.fleet_bench`, 2026-12-06; docs/design/temporal-notes.md)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.worker import Worker

from raysize.worker.run import worker_slots
from raysize.worker.settings import Settings

from .temporal_env import start_dev_server

LOOPS = 150  # more than Temporal's default of 100 workflow tasks at once


class Held:
    """How many `hold` calls run at once, and the most that ever did."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.all_in = asyncio.Event()


HELD = Held()


@activity.defn
async def hold() -> None:
    """Held until every loop's task holds one (or 10 s pass: then fewer could)."""
    HELD.now += 1
    HELD.peak = max(HELD.peak, HELD.now)
    if HELD.now >= LOOPS:
        HELD.all_in.set()
    try:
        await asyncio.wait_for(HELD.all_in.wait(), 10)
    except TimeoutError:
        pass
    finally:
        HELD.now -= 1


@workflow.defn(sandboxed=False)
class Observing:
    """A loop's tick: its read is a local activity, inside the workflow task."""

    @workflow.run
    async def run(self) -> None:
        await workflow.execute_local_activity(hold, start_to_close_timeout=timedelta(seconds=30))


async def test_every_loop_of_a_fleet_can_hold_its_workflow_task_through_its_observe() -> None:
    env = await start_dev_server()
    try:
        queue = f"slots-{uuid.uuid4().hex[:6]}"
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[Observing],
            activities=[hold],
            **worker_slots(Settings()),
        ):
            handles = await asyncio.gather(
                *(
                    env.client.start_workflow(
                        Observing.run, id=f"loop-{i}-{queue}", task_queue=queue
                    )
                    for i in range(LOOPS)
                )
            )
            await asyncio.gather(*(h.result() for h in handles))
        assert HELD.peak == LOOPS, f"only {HELD.peak} of {LOOPS} loops held their task at once"
    finally:
        await env.shutdown()
