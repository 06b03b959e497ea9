"""`raysize status`: each resize in a row of its own — pod, from → to, phase, outcome,
age — newest first, and only the cluster's live pods unless --all.

It used to list past resizes as identical `COMPLETED` lines with no sizes or outcome,
and kept pods from a previous sandbox."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from typer.testing import CliRunner

from raysize.worker.cli import app
from raysize.workflows.contracts import ReconcileInput
from raysize.workflows.model import NodeRoom
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.resources import GIB
from tests.orchestration.fake_world import FakeWorld
from tests.orchestration.test_reconcile_workflow import ResizeRecorder, until
from tests.workflows.kit import group, pod, res, snapshot


@asynccontextmanager
async def reconciling(env: WorkflowEnvironment, world: FakeWorld) -> AsyncIterator[str]:
    """A reconcile loop on `world` (the dev server: what `raysize status` reads), until
    the block ends; yields the namespace."""
    queue = f"status-{uuid.uuid4().hex[:6]}"
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        activities=[*world.activities(), *ResizeRecorder(world).workflow_activities()],
    ):
        handle = await env.client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(namespace=ns, cluster="demo", tick_s=0.5),
            id=f"reconcile/{ns}/demo",
            task_queue=queue,
        )
        try:
            yield ns
        finally:
            await handle.terminate("test over")


def status(env: WorkflowEnvironment, ref: str, *flags: str) -> str:
    result = CliRunner().invoke(
        app,
        ["status", ref, *flags],
        env={"RAYSIZE_TEMPORAL_ADDRESS": env.client.service_client.config.target_host},
    )
    assert result.exit_code == 0, result.output
    return result.stdout


async def test_status_shows_each_resize_with_sizes_and_outcome(dev: WorkflowEnvironment) -> None:
    # w2's node says how much room it has: its row says it (issue #44 item 3)
    world = FakeWorld(
        snapshot(
            [group()],
            [pod("w1"), pod("w2", node="n1")],
            [(res(2), 1)],
            nodes={"n1": NodeRoom(cpu=6000, memory=8 * GIB)},
        )
    )
    async with reconciling(dev, world) as ns:
        await until(lambda: world.started == ["w1"])
        await until(lambda: not world.resizing)
        # w1 leaves the cluster (a previous sandbox's pod, say); then w2 grows
        world.snapshot = world.snapshot.model_copy(
            update={"pods": tuple(p for p in world.snapshot.pods if p.name != "w1")}
        )
        await asyncio.sleep(1)  # so the resize of w2 is the newer one
        world.set_demands((res(3), 1))
        await until(lambda: len(world.started) == 2)
        await until(lambda: not world.resizing)
        ref = f"{ns}/demo"
        out = ""
        for _ in range(100):  # the index lags the workflows by a moment
            out = await asyncio.to_thread(status, dev, ref)
            if "w2" in out and "Done" in out and "no longer has" in out:
                break
            await asyncio.sleep(0.2)
        everything = await asyncio.to_thread(status, dev, ref, "--all")
    assert "resizes (newest first):" in out
    header = next(line for line in out.splitlines() if "FROM → TO" in line)
    assert header.split() == [
        *("POD", "FROM", "→", "TO", "PHASE", "OUTCOME", "AGE"),
        *("NODE", "(ROOM", "WHEN", "DECIDED)"),
    ]
    w2 = next(line for line in out.splitlines() if line.strip().startswith("w2"))
    assert "1 CPU, 2Gi → 3 CPU, 2Gi" in w2 and "Done" in w2 and "Succeeded" in w2
    assert w2.rstrip().endswith("n1 (6 CPU/8Gi free)"), w2
    table = out.split("resizes (newest first):", 1)[1]
    assert "w1" not in table  # not a live pod any more (the decisions above name it)
    assert "… and 1 of pods the cluster no longer has (--all shows them)" in out
    rows = [line.split()[0] for line in everything.splitlines() if line.startswith("  w")]
    assert rows == ["w2", "w1"]  # newest first
    w1 = next(line for line in everything.splitlines() if line.strip().startswith("w1"))
    assert "1 CPU, 2Gi → 2 CPU, 2Gi" in w1 and "Succeeded" in w1
    assert w1.rstrip().endswith(" -")  # its node's room was not known


async def test_status_says_what_the_last_plan_left_waiting_and_why(
    dev: WorkflowEnvironment,
) -> None:
    # a task that asks for a GPU, in a cluster with no GPU group: nothing to decide, so
    # no decision line, but the user sees why it waits
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(1, GPU=1), 1)]))
    async with reconciling(dev, world) as ns:
        await until(lambda: world.waits)
        out = await asyncio.to_thread(status, dev, f"{ns}/demo")
    assert "  last plan: cannot place: 1 × {CPU: 1, GPU: 1}" in out.splitlines()
    assert world.started == [] and world.scales == []


async def test_status_says_observe_only_and_what_it_would_do(dev: WorkflowEnvironment) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    world.observe_only = True
    async with reconciling(dev, world) as ns:
        await until(lambda: len(world.events) >= 2)  # ObserveOnly, WouldResize
        out = await asyncio.to_thread(status, dev, f"{ns}/demo")
    lines = out.splitlines()
    assert lines[0].startswith(
        f"{ns}/demo: active, observe-only (RAYSIZE_OBSERVE_ONLY: nothing is changed), "
    )
    assert any(line.startswith("  now would grow w1 1 → 2 CPU: ") for line in lines), out
    assert world.started == [] and world.scales == []
