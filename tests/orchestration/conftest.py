from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from .temporal_env import start_time_skipping


@pytest_asyncio.fixture
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """A fresh time-skipping server per test: one test's running activities must never
    hold back another test's clock (the server skips time only when nothing runs)."""
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()
