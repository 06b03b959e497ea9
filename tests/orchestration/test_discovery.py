"""Discovery starts a reconcile workflow per managed RayCluster — and leaves alone a
cluster an operator stopped."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

import raysize.activities.discovery as discovery_module
from raysize.activities.discovery import DiscoveryActivities
from raysize.workflows.contracts import ReconcileInput
from raysize.workflows.naming import RAY_CLUSTER, reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

from ..workflows.kit import group, pod, snapshot
from .fake_world import FakeWorld


async def test_a_stopped_cluster_stays_stopped_until_started_again(
    ts_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = FakeWorld(snapshot([group()], [pod("w1")], []))
    queue = f"q-{uuid.uuid4()}"
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    discovery = DiscoveryActivities(
        kube=None,  # type: ignore[arg-type]  # ensure_reconcilers only talks to Temporal
        temporal=ts_env.client,
        task_queue=queue,
        start_input=lambda n, c: ReconcileInput(namespace=n, cluster=c, tick_s=0.5),
    )
    ensure = ActivityEnvironment()
    async with Worker(
        ts_env.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow, PodResizeWorkflow],
        activities=world.activities(),
    ):
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "demo")]) == 1
        handle = ts_env.client.get_workflow_handle(reconcile_workflow_id(ns, "demo"))
        desc = await handle.describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING
        assert desc.typed_search_attributes.get(RAY_CLUSTER) == "demo"  # `RayCluster='demo'`
        # already running: nothing to do
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "demo")]) == 0

        await handle.cancel()  # what `raysize stop` does
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
        # the next discovery rounds respect the operator's decision
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "demo")]) == 0
        assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
        # ... while a reconcile that ended another way (here: terminated) is started anew
        other = ts_env.client.get_workflow_handle(reconcile_workflow_id(ns, "other"))
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "other")]) == 1
        await other.terminate("test")
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "other")]) == 1
        assert (await other.describe()).status == WorkflowExecutionStatus.RUNNING
        # a reconcile seen running is not described again every round (a hundred
        # clusters, every 15 s) ...
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "other")]) == 0
        await other.terminate("test")
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "other")]) == 0
        # ... but once RECHECK_AFTER_S has passed it is, and one that ended starts anew
        monkeypatch.setattr(discovery_module, "RECHECK_AFTER_S", 0.0)
        assert await ensure.run(discovery.ensure_reconcilers, [(ns, "other")]) == 1
        assert (await other.describe()).status == WorkflowExecutionStatus.RUNNING
        await other.terminate("test over")
