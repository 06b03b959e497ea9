"""Observe-only (RAYSIZE_OBSERVE_ONLY): the activities' own refusal to write.

The reconcile loop acts on nothing while the worker observes only (`workflows/decide.py`
gives it no plan). This is the second line: every activity that would write to a pod, a
Raylet or a RayCluster asks `ObserveOnly.refuse` first, so a bug in a workflow cannot
write either. A refusal is a non-retryable `ApplicationError` of type `ObserveOnly`.

One exception keeps a resize whole: a resize saga that started before this worker came up
in observe-only (a worker restarted with the setting while a resize was in flight), or
that has written already (started by a worker that still acts, during a rolling
restart), goes on to its end, or its rollback, as it would have; any other saga is
refused at its first write, so it writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError

from raysize.workflows.contracts import OBSERVE_ONLY_VAR, Act, Err
from raysize.workflows.naming import RESIZE_WORKFLOW

log = logging.getLogger("raysize.activities")


@dataclass
class ObserveOnly:
    """The worker's observe-only switch, shared by its activities."""

    on: bool = False
    # when this worker began to observe only: resize sagas started before may finish
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    # resize saga runs let go on (a saga asks at each of its writes)
    _let: set[str] = field(default_factory=set)

    async def refuse(self, what: str) -> None:
        """Raise `ObserveOnly` (non-retryable) when this worker observes only, unless the
        caller is a resize saga that was in flight before (`_let_finish`)."""
        if not self.on:
            return
        info = activity.info()
        if info.workflow_type == RESIZE_WORKFLOW and await self._let_finish(info):
            return
        raise ApplicationError(
            f"{what} refused: this worker runs with {OBSERVE_ONLY_VAR}=true, so it writes "
            "to no pod, Raylet or RayCluster (unset it and restart the worker to let "
            "raysize act)",
            type=Err.OBSERVE_ONLY,
            non_retryable=True,
        )

    async def _let_finish(self, info: activity.Info) -> bool:
        """A saga that began before this worker observed only, or that has already
        written (started by a worker that still acts, beside this one during a rolling
        restart), goes on: refusing it now would leave its resize half-done. Any other
        is refused at its first write, so it writes nothing."""
        run, wf = info.workflow_run_id, info.workflow_id
        if run is None or wf is None:
            return False  # not run by a workflow: no saga to let finish
        if run in self._let:
            return True
        try:
            handle = activity.client().get_workflow_handle(wf, run_id=run)
            desc = await handle.describe()
            why = ""
            if desc.start_time < self.since:
                why = "began before this worker observed only"
            elif await _has_written(handle, info.activity_id):
                why = "has written already (a worker that acts ran it)"
        except Exception as exc:  # unknown: not refused for good; Temporal tries again
            raise ApplicationError(
                f"{OBSERVE_ONLY_VAR}: cannot tell whether {wf} may go on: {exc}",
                type="ObserveOnlyUnknown",
            ) from None
        if not why:
            return False
        self._let.add(run)
        log.warning(
            "observe-only: %s %s (%s): it finishes or rolls back as it would have",
            wf,
            why,
            self.since.isoformat(timespec="seconds"),
        )
        return True


# the activities that write: one of a saga's that ran (even if it then failed: its write
# may have landed) means the resize has begun
WRITES = frozenset(
    {Act.APPLY_RESIZE, Act.SET_STATUS, Act.RESIZE_RAYLET, Act.FINISH_RESIZE, Act.SCALE, Act.DRAIN}
)


async def _has_written(handle: WorkflowHandle[Any, Any], current: str) -> bool:
    """Has a writing activity of this run, other than `current`, been run (closed; one
    refused by observe-only wrote nothing)?"""
    writes: set[int] = set()
    async for e in handle.fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            if a.activity_type.name in WRITES and a.activity_id != current:
                writes.add(e.event_id)
            continue
        failed = e.activity_task_failed_event_attributes
        if failed.failure.application_failure_info.type == Err.OBSERVE_ONLY:
            continue  # refused here: it wrote nothing
        for closed in (
            e.activity_task_completed_event_attributes,
            failed,
            e.activity_task_timed_out_event_attributes,
            e.activity_task_canceled_event_attributes,
        ):
            if closed.scheduled_event_id in writes:
                return True
    return False
