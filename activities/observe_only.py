"""Observe-only (RAYSIZE_OBSERVE_ONLY): the activities' own refusal to write.

The reconcile loop acts on nothing while the worker observes only (`workflows/decide.py`
gives it no plan). This is the second line: every activity that would write to a pod, a
Raylet or a RayCluster asks `ObserveOnly.refuse` first, so a bug in a workflow cannot
write either. A refusal is a non-retryable `ApplicationError` of type `ObserveOnly`.

One exception keeps a resize whole: a resize saga that started before this worker came up
in observe-only (a worker restarted with the setting while a resize was in flight) goes
on to its end, or its rollback, as it would have; a saga started later is refused at its
first write, so it writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from raysize.workflows.contracts import OBSERVE_ONLY_VAR, Err
from raysize.workflows.naming import RESIZE_WORKFLOW

log = logging.getLogger("raysize.activities")


@dataclass
class ObserveOnly:
    """The worker's observe-only switch, shared by its activities."""

    on: bool = False
    # when this worker began to observe only: resize sagas started before may finish
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    # resize saga run id → whether it started before `since` (a saga asks many times)
    _before: dict[str, bool] = field(default_factory=dict)

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
        run, wf = info.workflow_run_id, info.workflow_id
        if run is None or wf is None:
            return False  # not run by a workflow: no saga to let finish
        before = self._before.get(run)
        if before is None:
            try:
                desc = await activity.client().get_workflow_handle(wf, run_id=run).describe()
            except Exception as exc:  # unknown: not refused for good; Temporal tries again
                raise ApplicationError(
                    f"{OBSERVE_ONLY_VAR}: cannot tell whether {wf} started "
                    f"before observe-only began: {exc}",
                    type="ObserveOnlyUnknown",
                ) from None
            before = desc.start_time < self.since
            self._before[run] = before
            if before:
                log.warning(
                    "observe-only: %s started before this worker observed only (%s): it "
                    "finishes or rolls back as it would have",
                    wf,
                    self.since.isoformat(timespec="seconds"),
                )
        return before
