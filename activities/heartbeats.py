"""An activity that heartbeats from a task of its own, whatever it awaits meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from temporalio import activity


@contextlib.contextmanager
def heartbeats(every_s: float) -> Iterator[None]:
    """The running activity heartbeats every `every_s` while the block runs. An activity
    that heartbeated only between its calls went quiet for as long as a slow call took:
    a GCS read that a loaded worker made slow, a Kubernetes call queued behind a
    saturated API server's calls in flight (up to its timeout) and then sent (as long
    again). Its heartbeat timed out, Temporal ran it again beside the first, and the
    second's calls added to the load that made the first slow. Heartbeats cross into the
    SDK's core, which throttles them to one per 80 % of the heartbeat timeout."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every_s)
            activity.heartbeat()  # what tells Temporal this worker still works on it

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        task.cancel()
