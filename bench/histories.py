"""Reading a reconcile loop's history, whose observe and Events are local activities.

A local activity has no events of its own: it runs inside a workflow task, and its end is
a marker (`core_local_activity`) recorded with that task's completion, its type in the
marker's `data` and its result in `result`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory

LOCAL_ACTIVITY_MARKER = "core_local_activity"


def local_activity(e: HistoryEvent) -> str:
    """The activity type of a local activity's marker; "" for any other event."""
    if e.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return ""
    marker = e.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in marker.details:
        return ""
    payloads = marker.details["data"].payloads
    return str(json.loads(payloads[0].data).get("activity_type", "")) if payloads else ""


def local_result(e: HistoryEvent) -> Any:
    """The result of a local activity's marker, parsed (None: it failed, or returned
    nothing)."""
    marker = e.marker_recorded_event_attributes
    if marker.HasField("failure") or "result" not in marker.details:
        return None
    payloads = marker.details["result"].payloads
    return json.loads(payloads[0].data) if payloads and payloads[0].data else None


def task_of(events: Sequence[HistoryEvent], marker: int) -> tuple[int, int, int]:
    """Indexes of the workflow task (scheduled, started, completed) whose completion
    recorded the marker at `marker`: the task the local activity ran in."""
    at = marker
    found: list[int] = []
    for kind in (
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    ):
        at = next(i for i in range(at, -1, -1) if events[i].event_type == kind)
        found.append(at)
    done, started, scheduled = found
    return scheduled, started, done


async def runs(client: Client, wf_id: str, run_id: str) -> list[WorkflowHistory]:
    """The history of every run of the workflow, from `run_id` on through its
    continue-as-new."""
    out: list[WorkflowHistory] = []
    while run_id:
        history = await client.get_workflow_handle(wf_id, run_id=run_id).fetch_history()
        out.append(history)
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else ""
        )
    return out
