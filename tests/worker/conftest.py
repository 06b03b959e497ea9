"""A Temporal dev server for the CLI tests that need one (the `temporal` tier files)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from tests.orchestration.temporal_env import start_dev_server


@pytest_asyncio.fixture(scope="module")
async def dev() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server()
    try:
        yield env
    finally:
        await env.shutdown()
