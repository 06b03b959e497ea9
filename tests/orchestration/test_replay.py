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
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_there_are_histories_of_both_workflows() -> None:
    names = {p.stem for p in HISTORIES}
    assert {"resize_happy", "resize_deferred", "resize_error_rollback", "reconcile_grow"} <= names
    # planner rules behind patches: a run from before each, and one after
    assert {"reconcile_pending_gpu_before", "reconcile_pending_gpu"} <= names
    assert {"reconcile_landing_before", "reconcile_landing"} <= names
    assert {"reconcile_just_grown_before", "reconcile_just_grown"} <= names
    assert {"resize_timeout_before", "resize_timeout"} <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_without_nondeterminism(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[PodResizeWorkflow, ReconcileWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),  # the worker's own sandbox configuration
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
