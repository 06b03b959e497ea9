"""Recorded histories replay on today's workflow code: a change that would break
running workflows (non-determinism) fails here, not in production.

Re-record with `python -m tests.orchestration.record_histories` only when a change is
meant to alter what the workflows do.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from raysize.worker.run import workflow_runner
from raysize.workflows import deadlines
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
# histories recorded with a module constant shortened (the fake world ticks every 0.3 s,
# and a Raylet apart from its pod is settled only after RAYLET_DRIFT_S): replayed so too
RECORDED_WITH = {
    "reconcile_head_drift": {"RAYLET_DRIFT_S": 0.5},
    "reconcile_head_drift_before": {"RAYLET_DRIFT_S": 0.5},
}


def test_there_are_histories_of_both_workflows() -> None:
    names = {p.stem for p in HISTORIES}
    assert {"resize_happy", "resize_deferred", "resize_error_rollback", "reconcile_grow"} <= names
    # planner rules behind patches: a run from before each, and one after
    assert {"reconcile_pending_gpu_before", "reconcile_pending_gpu"} <= names
    assert {"reconcile_landing_before", "reconcile_landing"} <= names
    assert {"reconcile_just_grown_before", "reconcile_just_grown"} <= names
    assert {"resize_timeout_before", "resize_timeout"} <= names
    assert {"reconcile_head_drift_before", "reconcile_head_drift"} <= names
    assert {"reconcile_silent_pod_before", "reconcile_silent_pod"} <= names
    assert {"reconcile_scale_in_before", "reconcile_scale_in"} <= names


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
