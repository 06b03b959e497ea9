from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from .temporal_env import start_time_skipping


@pytest_asyncio.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()
