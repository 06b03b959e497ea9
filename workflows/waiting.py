"""Waiting on an activity while a signal may make it moot (workflow code only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import is_cancelled_exception


def _seen(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def quietly(fut: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """Mark the future's outcome as read whatever happens to it: a watch abandoned by a
    signal, or torn down with the workflow when the worker stops or evicts it, must not
    log `exception was never retrieved` (60+ tracebacks at each worker restart). Code
    that awaits it still gets its result or exception."""
    fut.add_done_callback(_seen)
    return fut


async def until_done_or(task: asyncio.Future[Any], condition: Callable[[], bool]) -> None:
    """Wait until `task` finishes or `condition()` holds; cancel whichever is left."""
    quietly(task)
    other = quietly(asyncio.ensure_future(workflow.wait_condition(condition)))
    try:
        await workflow.wait([task, other], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, other):
            if not t.done():
                t.cancel()


def backoff_s(base_s: float, failures: int, cap_s: float, u: float) -> float:
    """The wait after `failures` failures in a row: `base_s` doubled after each failure
    past the first, at most `cap_s`, then jittered to between half and all of it by `u`
    (in [0, 1): `workflow.random().random()`, so a replay waits the same). Half of it at
    least, so the waits still grow; loops that failed together (one API server down for
    all of them) spread out instead of retrying in step."""
    nominal = min(cap_s, base_s * 2.0 ** min(max(failures, 1) - 1, 30))
    return nominal * (0.5 + 0.5 * u)


def raise_if_cancelled(exc: BaseException) -> None:
    """An activity that failed because the workflow is being canceled is not a failure to
    handle: re-raise it, so the cancel ends the workflow (`raysize stop`, `temporal
    workflow cancel`) instead of being taken for a failed read."""
    if is_cancelled_exception(exc):
        raise exc
