"""Waiting on an activity while a signal may make it moot (workflow code only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import is_cancelled_exception


async def until_done_or(task: asyncio.Future[Any], condition: Callable[[], bool]) -> None:
    """Wait until `task` finishes or `condition()` holds; cancel whichever is left."""
    other = asyncio.ensure_future(workflow.wait_condition(condition))
    try:
        await workflow.wait([task, other], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, other):
            if not t.done():
                t.cancel()


def raise_if_cancelled(exc: BaseException) -> None:
    """An activity that failed because the workflow is being canceled is not a failure to
    handle: re-raise it, so the cancel ends the workflow (`raysize stop`, `temporal
    workflow cancel`) instead of being taken for a failed read."""
    if is_cancelled_exception(exc):
        raise exc
