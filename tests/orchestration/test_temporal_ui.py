"""What an operator sees in the Temporal UI (issue #15), in a real browser: Debian's
headless Chromium on the web UI the `temporal` CLI's dev server serves (UI 2.54.1).

The workflow list used to show one pod's resizes as identical `resize/ns/pod` rows. Its
columns can show search attributes but not the static summary, so each resize carries
`ResizeChange` (`grow 1 → 2 CPU`) next to `ResizeOutcome`; with those two columns added
(the gear at the table's right, or the `namespace-workflow-table-columns` setting this
test writes) the rows tell the resizes apart. A resize's own page shows its summary.

The screenshots are written to $RAYSIZE_UI_SCREENSHOTS when it is set (look at them),
else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest
import pytest_asyncio
from temporalio.client import WorkflowExecution
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from raysize.sandbox.ports import free_port
from raysize.workflows.contracts import ReconcileInput
from raysize.workflows.naming import RESIZE_CHANGE, RESIZE_OUTCOME, RESIZE_WORKFLOW
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow
from tests.orchestration.browser import Browser
from tests.orchestration.fake_world import FakeWorld
from tests.orchestration.temporal_env import start_dev_server
from tests.orchestration.test_reconcile_workflow import ResizeRecorder, until
from tests.workflows.kit import group, pod, res, snapshot

COLUMNS_SETTING = "namespace-workflow-table-columns"  # the UI's local-storage key
# the list's columns as a user would set them: the two pinned defaults, then what each
# resize did and how it ended, then the rest of the defaults
COLUMNS = [
    {"label": "Status", "pinned": True},
    {"label": "Workflow ID", "pinned": True},
    {"label": RESIZE_CHANGE.name, "pinned": False},
    {"label": RESIZE_OUTCOME.name, "pinned": False},
    {"label": "Type", "pinned": False},
    {"label": "Start", "pinned": False},
    {"label": "End", "pinned": False},
]


async def resizes(dev: WorkflowEnvironment, outcome: str, count: int) -> list[WorkflowExecution]:
    """The resize workflows whose outcome is `outcome`, once there are `count` (the
    visibility index lags the workflows by a moment)."""
    query = f"WorkflowType='{RESIZE_WORKFLOW}' AND {RESIZE_OUTCOME.name}='{outcome}'"
    runs: list[WorkflowExecution] = []
    for _ in range(150):
        runs = [wf async for wf in dev.client.list_workflows(query)]
        if len(runs) >= count:
            break
        await asyncio.sleep(0.2)
    assert len(runs) == count, f"{len(runs)} resizes {outcome}, not {count}"
    return runs


@pytest_asyncio.fixture
async def dev_with_ui() -> AsyncIterator[tuple[WorkflowEnvironment, int]]:
    port = free_port()
    env = await start_dev_server(ui_port=port)
    try:
        yield env, port
    finally:
        await env.shutdown()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("RAYSIZE_UI_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


async def test_the_ui_tells_one_pods_resizes_apart(
    dev_with_ui: tuple[WorkflowEnvironment, int], shots: Path
) -> None:
    dev, ui_port = dev_with_ui
    world = FakeWorld(snapshot([group()], [pod("w1")], [(res(2), 1)]))
    recorder = ResizeRecorder(world)
    queue = f"ui-{uuid.uuid4().hex[:6]}"
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    async with Worker(
        dev.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        activities=[*world.activities(), *recorder.workflow_activities()],
    ):
        handle = await dev.client.start_workflow(
            ReconcileWorkflow.run,
            ReconcileInput(namespace=ns, cluster="demo", tick_s=0.5),
            id=f"reconcile/{ns}/demo",
            task_queue=queue,
        )
        try:
            # the same pod grows twice: 1 → 2 CPU for a {CPU: 2} task, which lands; then
            # 2 → 3 CPU, held at the kubelet while the browser looks
            await until(lambda: world.started == ["w1"])
            await resizes(dev, "Succeeded", count=1)
            recorder.hold = True
            world.set_demands((res(3), 1))
            await until(lambda: world.started == ["w1", "w1"])
            (running,) = await resizes(dev, "Pending", count=1)
            desc = await dev.client.get_workflow_handle(
                running.id, run_id=running.run_id
            ).describe()
            summary = await desc.static_summary()
            assert summary == "grow 2 → 3 CPU for 1 × {CPU: 3} pending"
            # a blocking browser: the worker must go on answering the UI's queries
            await asyncio.to_thread(look, ui_port, running, summary, shots)
            recorder.hold = False
            await resizes(dev, "Succeeded", count=2)
        finally:
            await handle.terminate("test over")


def look(ui_port: int, running: WorkflowExecution, summary: str, shots: Path) -> None:
    base = f"http://127.0.0.1:{ui_port}/namespaces/default/workflows"
    with Browser() as browser:
        # the column setting lives in the UI's local storage, per Temporal namespace
        browser.open(base)
        browser.wait_for_text("Workflow ID")
        columns = json.dumps({"default": COLUMNS})
        browser.evaluate(f"localStorage.setItem('{COLUMNS_SETTING}', JSON.stringify({columns}))")
        browser.open(f"{base}?query={quote(f'WorkflowType={chr(39)}{RESIZE_WORKFLOW}{chr(39)}')}")
        listed = browser.wait_for_text(RESIZE_CHANGE.name, RESIZE_OUTCOME.name, "grow 2 → 3 CPU")
        browser.screenshot(shots / "list.png")
        rows = [line for line in listed.splitlines() if running.id in line]
        # one row per resize: the one that landed and the one still at the kubelet
        assert len(rows) == 2, listed
        assert "grow 1 → 2 CPU\tSucceeded" in rows[1], rows
        assert "grow 2 → 3 CPU\tPending" in rows[0], rows

        # the running resize's page: its summary, its note and what it waits for now
        browser.open(f"{base}/{quote(running.id, safe='')}/{running.run_id}/user-metadata")
        browser.wait_for_text(
            summary,
            "from 2 CPU/2Gi to 3 CPU/2Gi",
            "asked the kubelet for 3 CPU/2Gi; waiting for it to act",
        )
        browser.screenshot(shots / "resize.png")
