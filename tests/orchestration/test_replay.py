"""Recorded histories replay on today's workflow code: a change that would break
running workflows (non-determinism) fails here, not in production.

Re-record with `python -m tests.orchestration.record_histories` only when a change is
meant to alter what the workflows do.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from raysize.worker.run import workflow_runner
from raysize.workflows import (
    deadlines,
    decide,
    discovery_workflow,
    planner,
    reconcile_workflow,
    resize_workflow,
)
from raysize.workflows.model import Plan
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow
from tests.orchestration.record_histories import RECORDED_WITH

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
# The corpus was recorded anew for 0.2 (CHANGELOG.md): histories of 0.1 do not replay
# on it, and no `*_before` history of a retired `workflow.patched` gate is kept. From 0.2
# on, Worker Versioning carries changes: a new release never replays an older one's
# pinned sagas, and the reconcile loops move to it at a continue-as-new.


def test_there_are_histories_of_both_workflows() -> None:
    names = {p.stem for p in HISTORIES}
    assert {"resize_happy", "resize_deferred", "resize_error_rollback", "resize_timeout"} <= names
    assert {
        "reconcile_grow",
        "reconcile_pending_gpu",
        "reconcile_landing",
        "reconcile_just_grown",
        "reconcile_head_drift",
        "reconcile_silent_pod",
        "reconcile_scale_in",
    } <= names
    assert not [n for n in names if n.endswith("_before")]


def test_no_workflow_asks_for_a_patch() -> None:
    """Changes are carried by Worker Versioning, not `workflow.patched` gates (0.2)."""
    for module in (reconcile_workflow, resize_workflow, discovery_workflow):
        source = inspect.getsource(module)
        assert "workflow.patched(" not in source and "deprecate_patch(" not in source, module


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_without_nondeterminism(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in RECORDED_WITH.get(path.stem, {}).items():
        monkeypatch.setattr(deadlines, name, value)
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[PodResizeWorkflow, ReconcileWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),  # the worker's own sandbox configuration
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


RECONCILES = [p for p in HISTORIES if p.stem.startswith("reconcile_")]


@pytest.mark.parametrize("path", RECONCILES, ids=[p.stem for p in RECONCILES])
async def test_a_loop_replays_on_a_planner_that_decides_otherwise(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan is made in the observe activity and recorded in its result: a release
    whose planner decides otherwise (here: nothing at all) still replays every running
    loop's history, with no patch. (0.1 planned inside the workflow: each planner change
    needed a `workflow.patched` gate, or replays failed with a nondeterminism error.)"""
    for name, value in RECORDED_WITH.get(path.stem, {}).items():
        monkeypatch.setattr(deadlines, name, value)

    def nothing(*args: object, **kwargs: object) -> Plan:
        return Plan()

    monkeypatch.setattr(decide, "plan", nothing)
    monkeypatch.setattr(planner, "plan", nothing)
    # where 0.1's workflow held the planner: patched too, so this test fails on it
    monkeypatch.setattr(reconcile_workflow, "plan", nothing, raising=False)
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[PodResizeWorkflow, ReconcileWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),  # so the patched modules are the ones run
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
