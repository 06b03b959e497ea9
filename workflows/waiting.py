"""Waiting on an activity while a signal may make it moot (workflow code only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import workflow


async def until_done_or(task: asyncio.Future[Any], condition: Callable[[], bool]) -> None:
    """Wait until `task` finishes or `condition()` holds; cancel whichever is left."""
    other = asyncio.ensure_future(workflow.wait_condition(condition))
    try:
        await workflow.wait([task, other], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, other):
            if not t.done():
                t.cancel()
