"""worker/takeover.py on the real dev server: a build whose workers still poll is never
taken over; once its last worker is gone, a newer build makes itself current and moves
the workflows pinned to the old build that replay on its code, and leaves (and names) the
one that does not. The end-to-end roll of the deployed worker is
tests/e2e/test_deployed_worker.py (`test_a_rolling_update_strands_nothing`).

The two builds are two in-process workers with two versions of the same workflow types:
`Waits` replays on b2's code, `Changed` does not (b2 starts an activity where b1 started a
timer)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import pytest_asyncio
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import VersioningBehavior
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig

from raysize.worker.deployment import describe_routing, settle_current_version
from raysize.worker.settings import Settings
from raysize.worker.takeover import Takeover
from tests.orchestration.temporal_env import start_dev_server

LONG_POLL_S = 5  # the server's long poll here: a live idle worker polls at least this often
TAKEOVER_AFTER_S = 8.0


@workflow.defn(name="Waits")
class WaitsB1:
    def __init__(self) -> None:
        self.go = False

    @workflow.signal
    def release(self) -> None:
        self.go = True

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.go)
        return "b1"


@workflow.defn(name="Waits")
class WaitsB2(WaitsB1):
    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.go)
        return "b2"


@workflow.defn(name="Changed")
class ChangedB1:
    @workflow.run
    async def run(self) -> None:
        await workflow.sleep(timedelta(hours=1))


@workflow.defn(name="Changed")
class ChangedB2:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(
            "nothing", start_to_close_timeout=timedelta(seconds=5)
        )  # not what b1 recorded


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(
        "--dynamic-config-value", f'matching.longPollExpirationInterval="{LONG_POLL_S}s"'
    )
    try:
        yield env
    finally:
        await env.shutdown()


def settings(queue: str, deployment: str, build: str) -> Settings:
    return Settings(
        task_queue=queue,
        deployment_name=deployment,
        build_id=build,
        takeover_after_s=TAKEOVER_AFTER_S,
        make_current="if-none",
    )


def worker(client: Client, s: Settings, workflows: list[type]) -> Worker:
    version = s.deployment_version()
    assert version is not None
    return Worker(
        client,
        task_queue=s.task_queue,
        workflows=workflows,
        workflow_runner=UnsandboxedWorkflowRunner(),
        deployment_config=WorkerDeploymentConfig(
            version=version,
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.PINNED,
        ),
    )


async def pinned_to(client: Client, workflow_id: str) -> str:
    desc = await client.get_workflow_handle(workflow_id).describe()
    info = desc.raw_description.workflow_execution_info.versioning_info
    return info.deployment_version.build_id


async def override_of(client: Client, workflow_id: str) -> str:
    """The build a versioning override pins the run to ("" without one)."""
    desc = await client.get_workflow_handle(workflow_id).describe()
    info = desc.raw_description.workflow_execution_info.versioning_info
    return info.versioning_override.pinned.version.build_id


async def step(client: Client, takeover: Takeover) -> str:
    routing = await describe_routing(client, takeover.version)
    assert routing is not None
    return await takeover.step(client, routing.current, routing.manager) or ""


async def test_a_gone_build_is_taken_over_and_a_live_one_never(
    server: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    client = server.client
    queue = f"takeover-{uuid.uuid4().hex[:8]}"
    deployment = f"d{uuid.uuid4().hex[:6]}"
    s1, s2 = settings(queue, deployment, "b1"), settings(queue, deployment, "b2")
    b1 = worker(client, s1, [WaitsB1, ChangedB1])
    b1_run = asyncio.create_task(b1.run())
    b2: Worker | None = None
    b2_run: asyncio.Task[None] | None = None
    try:
        assert "made" in await settle_current_version(client, s1)  # a first install
        waits = await client.start_workflow(WaitsB1.run, id=f"waits-{queue}", task_queue=queue)
        changed = await client.start_workflow(
            ChangedB1.run, id=f"changed-{queue}", task_queue=queue
        )
        for wid in (waits.id, changed.id):
            assert await until(lambda w=wid: pinned_to(client, w), "b1", 20)

        b2 = worker(client, s2, [WaitsB2, ChangedB2])
        b2_run = asyncio.create_task(b2.run())
        version = s2.deployment_version()
        assert version is not None
        takeover = Takeover(
            s2,
            version,
            Replayer(workflows=[WaitsB2, ChangedB2], workflow_runner=UnsandboxedWorkflowRunner()),
        )
        # b1 still polls, idle: never taken over, for longer than the bound and a long poll
        end = time.monotonic() + TAKEOVER_AFTER_S + 2 * LONG_POLL_S
        while time.monotonic() < end:
            assert await step(client, takeover) == "b1"
            await asyncio.sleep(1)
        assert await pinned_to(client, waits.id) == "b1"

        # b1's last worker goes (a rolling update stopped its pod)
        await b1.shutdown()
        b1_run = None
        gone_at = time.monotonic()
        with caplog.at_level(logging.INFO, logger="raysize.worker"):
            assert await until(lambda: step(client, takeover), "b2", TAKEOVER_AFTER_S + 30)
        print(f"taken over {time.monotonic() - gone_at:.1f} s after b1's worker stopped")
        text = caplog.text
        assert f"made {deployment}.b2 current in place of {deployment}.b1" in text, text
        assert "moved 1 of 2 workflow(s) pinned to b1" in text, text
        assert f"{changed.id} (run {changed.result_run_id}) is pinned to" in text, text
        assert "does not replay" in text, text

        # the moved run is served by b2 from its next task; the other stays on b1
        assert await override_of(client, waits.id) == "b2"
        assert await override_of(client, changed.id) == ""
        await waits.signal(WaitsB1.release)
        assert await asyncio.wait_for(waits.result(), 20) == "b2"
        assert await pinned_to(client, waits.id) == "b2"
        assert await pinned_to(client, changed.id) == "b1"
        assert (await changed.describe()).status == WorkflowExecutionStatus.RUNNING
        # its override is gone once it ended; the refused run is not tried again
        await step(client, takeover)
        assert not takeover.moved
        assert {k[0] for k in takeover.refused} == {changed.id}
        await changed.terminate("test over")
    finally:
        for w, t in ((b1, b1_run), (b2, b2_run)):
            if w is not None and t is not None:
                await w.shutdown()


async def until(check, want, timeout: float):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = await check()
        if last == want:
            return True
        await asyncio.sleep(0.5)
    raise AssertionError(f"not reached in {timeout}s (last: {last!r}, wanted {want!r})")
