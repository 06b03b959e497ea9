"""`raysize cancel` against a real Temporal dev server: a running resize rolls back; one
that ended, or never was, is an error that says which, and exits 1."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from typer.testing import CliRunner

from raysize.worker.cli import app
from raysize.workflows.contracts import ResizeOutcome
from raysize.workflows.naming import resize_search_attributes, resize_workflow_id
from raysize.workflows.resize_workflow import PodResizeWorkflow
from tests.orchestration.fake_cluster import FakeCluster
from tests.orchestration.test_resize_workflow import GIB, pod, request

runner = CliRunner()


def cancel(env: WorkflowEnvironment, ns: str, name: str) -> tuple[int, str, str]:
    result = runner.invoke(
        app,
        ["cancel", f"{ns}/demo", "--pod", name],
        env={"RAYSIZE_TEMPORAL_ADDRESS": env.client.service_client.config.target_host},
    )
    return result.exit_code, result.stdout, result.stderr


async def test_cancel_of_a_resize_that_already_ended_says_so_and_fails(
    dev: WorkflowEnvironment,
) -> None:
    """It used to print "cancel requested: … rolls the pod back, then ends CANCELED" and
    exit 0, while nothing happened: the resize was over."""
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    req = request(namespace=ns)
    queue = f"cancel-{uuid.uuid4().hex[:6]}"
    async with Worker(
        dev.client,
        task_queue=queue,
        workflows=[PodResizeWorkflow],
        activities=FakeCluster(pod()).activities(),
    ):
        handle = await dev.client.start_workflow(
            PodResizeWorkflow.run,
            req,
            id=resize_workflow_id(ns, req.pod),
            task_queue=queue,
            search_attributes=resize_search_attributes(req),  # as the reconcile starts it
        )
        state = await asyncio.wait_for(handle.result(), 60)
    assert state.outcome == ResizeOutcome.SUCCEEDED
    code, out, err = await asyncio.to_thread(cancel, dev, ns, "w1")
    assert code == 1, out
    assert "cancel requested" not in out
    assert err.strip() == (
        f"error: the resize of pod {ns}/w1 (workflow resize/{ns}/w1) is not running: it "
        "ended COMPLETED, outcome Succeeded. Nothing to cancel: the pod keeps the size that "
        f"resize left it at (`raysize status {ns}/demo` shows its resizes)"
    )


async def test_cancel_of_a_resize_that_never_was_names_the_pod(dev: WorkflowEnvironment) -> None:
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    code, out, err = await asyncio.to_thread(cancel, dev, ns, "nope")
    assert code == 1, out
    assert err.strip() == (
        f"error: no resize of pod {ns}/nope to cancel (no workflow resize/{ns}/nope): check "
        f"the pod's name and namespace (`raysize status {ns}/demo` shows the cluster's "
        "resizes)"
    )


async def test_cancel_of_a_running_resize_rolls_it_back(dev: WorkflowEnvironment) -> None:
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    req = request(namespace=ns)
    cluster = FakeCluster(pod())
    cluster.mode = "hang"  # the kubelet never finishes: the resize runs until canceled
    queue = f"cancel-{uuid.uuid4().hex[:6]}"
    async with Worker(
        dev.client,
        task_queue=queue,
        workflows=[PodResizeWorkflow],
        activities=cluster.activities(),
    ):
        handle = await dev.client.start_workflow(
            PodResizeWorkflow.run, req, id=resize_workflow_id(ns, req.pod), task_queue=queue
        )
        await asyncio.wait_for(cluster.polls_started.wait(), 30)
        code, out, err = await asyncio.to_thread(cancel, dev, ns, "w1")
        assert code == 0, err
        assert out.strip() == (
            f"cancel requested: resize/{ns}/w1 rolls the pod back, then ends CANCELED"
        )
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
        state = await handle.query(PodResizeWorkflow.state)
    assert state.outcome == ResizeOutcome.CANCELED
    assert cluster.patches == [(4000, 2 * GIB), (1000, 2 * GIB)]
