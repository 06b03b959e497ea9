"""What the workflows tell the outside: metrics, decision log lines, and decision spans.

Everything here is replay-safe and creates no workflow commands, so calling it never
changes a workflow's history:
- metrics go through `workflow.metric_meter()`, which emits nothing while replaying;
- log lines go through `workflow.logger`, which is silent while replaying;
- a decision span is made by the worker's tracing interceptor (an extern function, see
  worker/telemetry.py) and only when not replaying; without that interceptor it is a no-op.

Metric attributes: `cluster`, `k8s_namespace` (the RayCluster's namespace: Temporal's own
`namespace` attribute is already on every SDK metric), `group`, and `outcome`/`reason`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow

from raysize.workflows.contracts import PLAN_DURATION, FailureCause, ResizeOutcome, ResizeRequest
from raysize.workflows.model import Plan

# --- metric names ---------------------------------------------------------------------
RESIZES_STARTED = "raysize_resizes_started"
RESIZES_COMPLETED = "raysize_resizes_completed"
RESIZES_ROLLED_BACK = "raysize_resizes_rolled_back"
RESIZES_FAILED = "raysize_resizes_failed"
RESIZE_DURATION = "raysize_resize_duration_seconds"
RAYLET_SYNC_RETRIES = "raysize_raylet_sync_retries"
DEMAND_TO_RESIZE = "raysize_demand_to_resize_seconds"
# (raysize_ray_state_reads and raysize_plan_duration_seconds are recorded by the
# activities: workflows/contracts.py)

# histogram buckets (seconds), applied by the worker's Runtime
HISTOGRAM_BUCKETS: Mapping[str, tuple[float, ...]] = {
    RESIZE_DURATION: (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
    DEMAND_TO_RESIZE: (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
    PLAN_DURATION: (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
}

# the extern functions worker/telemetry.DecisionTracing provides to workflows
DECISION_SPAN_EXTERN = "__raysize_decision_span"
DECISION_SPAN_END_EXTERN = "__raysize_decision_span_end"
DECISION_SPAN = "ReconcileDecision"


def _resize_attrs(req: ResizeRequest) -> dict[str, str]:
    return {"cluster": req.cluster, "k8s_namespace": req.namespace, "group": req.group}


def _since(start: datetime) -> float:
    return max(0.0, (workflow.now() - start).total_seconds())


def logfmt(fields: Mapping[str, object]) -> str:
    """`key=value` pairs; values with spaces, quotes or `=` are quoted."""
    out = []
    for key, value in fields.items():
        if value is None:
            continue
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        if not text or any(c in text for c in ' "=\n\t'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'
        out.append(f"{key}={text}")
    return " ".join(out)


def log_event(event: str, fields: Mapping[str, object], *, warning: bool = False) -> None:
    """One structured line: `<event> k=v ...`; the fields also ride on the record as
    `raysize` (a dict) and `raysize_event`, for the JSON formatter."""
    clean = {k: v for k, v in fields.items() if v is not None}
    extra = {"raysize_event": event, "raysize": clean}
    log = workflow.logger.warning if warning else workflow.logger.info
    log("%s %s", event, logfmt(clean), extra=extra)


# --- the resize saga ----------------------------------------------------------------------
def resize_started(req: ResizeRequest) -> None:
    workflow.metric_meter().create_counter(RESIZES_STARTED, "pod resize sagas started").add(
        1, _resize_attrs(req)
    )
    log_event(
        "resize-start",
        {
            "cluster": req.cluster,
            "namespace": req.namespace,
            "pod": req.pod,
            "group": req.group,
            "from_cpu_m": req.from_cpu,
            "from_memory": req.from_memory,
            "cpu_m": req.cpu,
            "memory": req.memory,
            "reason": req.reason,
        },
    )


# outcomes that say why by themselves
_GONE: Mapping[str, FailureCause] = {
    ResizeOutcome.POD_GONE: FailureCause.POD_GONE,
    ResizeOutcome.RAYLET_GONE: FailureCause.RAYLET_GONE,
    ResizeOutcome.SUPERSEDED: FailureCause.SUPERSEDED,
}


def resize_finished(
    req: ResizeRequest,
    outcome: ResizeOutcome | str,
    cause: FailureCause,
    detail: str,
    cpu: int,
    memory: int,
) -> None:
    """Count the outcome with its cause (`reason`), record how long the saga took, log
    one line."""
    meter = workflow.metric_meter()
    attrs = _resize_attrs(req)
    outcome = str(outcome)
    reason = ""
    if outcome == ResizeOutcome.SUCCEEDED:
        meter.create_counter(RESIZES_COMPLETED, "pod resizes that took, Raylet included").add(
            1, attrs
        )
    elif outcome in (ResizeOutcome.ROLLED_BACK, ResizeOutcome.CANCELED):
        reason = cause.value
        meter.create_counter(
            RESIZES_ROLLED_BACK, "pod resizes rolled back to where they started, by reason"
        ).add(1, {**attrs, "reason": reason})
    else:
        reason = _GONE.get(outcome, cause).value
        meter.create_counter(RESIZES_FAILED, "pod resizes that ended otherwise, by reason").add(
            1, {**attrs, "reason": reason}
        )
    duration = _since(workflow.info().start_time)
    meter.create_histogram_float(
        RESIZE_DURATION, "time from a resize saga's start to its outcome", "s"
    ).record(duration, {**attrs, "outcome": outcome})
    log_event(
        "resize-outcome",
        {
            "cluster": req.cluster,
            "namespace": req.namespace,
            "pod": req.pod,
            "group": req.group,
            "outcome": outcome,
            "reason": reason or None,
            "cpu_m": cpu,
            "memory": memory,
            "duration_s": duration,
            "detail": detail or None,
        },
        warning=outcome not in (ResizeOutcome.SUCCEEDED, ResizeOutcome.CANCELED),
    )


def raylet_synced(req: ResizeRequest) -> None:
    """The Raylet has the pod's new size: the demand that asked for it can now be placed."""
    if req.demand_seen_at is None:
        return
    seen = datetime.fromtimestamp(req.demand_seen_at, tz=workflow.now().tzinfo)
    workflow.metric_meter().create_histogram_float(
        DEMAND_TO_RESIZE,
        "time from raysize first seeing pending demand to the Raylet holding the new size",
        "s",
    ).record(_since(seen), _resize_attrs(req))


# --- the reconcile loop -----------------------------------------------------------------------
def log_decisions(
    namespace: str, cluster: str, tick: int, p: Plan, *, scaled: bool, kept: Sequence[str] = ()
) -> None:
    """One line per decision: launch, grow, shrink, remove (launch and remove only when
    the scale patch went through), and each pod kept against the plan (`keep`: Ray
    refused its drain, say) with why."""
    base = {"cluster": cluster, "namespace": namespace, "tick": tick}
    if scaled:
        for a in p.launch:
            log_event(
                "decision",
                {
                    **base,
                    "action": "launch",
                    "group": a.group,
                    "count": a.count,
                    "reason": a.reason,
                },
            )
    for r in p.resize:
        log_event(
            "decision",
            {
                **base,
                "action": "shrink" if r.shrinks else "grow",
                "pod": r.pod,
                "group": r.group,
                "from_cpu_m": r.from_cpu,
                "from_memory": r.from_memory,
                "cpu_m": r.cpu,
                "memory": r.memory,
                "reason": r.reason,
            },
        )
    if scaled:
        for t in p.terminate:
            log_event(
                "decision",
                {**base, "action": "remove", "pod": t.pod, "group": t.group, "reason": t.reason},
            )
    for line in kept:
        log_event("decision", {**base, "action": "keep", "reason": line})


# --- the decision span ------------------------------------------------------------------------
_open_span: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "raysize_decision_span", default=None
)


def decision_span(namespace: str, cluster: str, tick: int, p: Plan) -> None:
    """Start this tick's trace: a root span the resize children, the scale activity and the
    event join, until `decision_scope` ends. No-op while replaying or without tracing."""
    begin = workflow.extern_functions().get(DECISION_SPAN_EXTERN)
    if begin is None or workflow.unsafe.is_replaying():
        return
    attributes: dict[str, Any] = {
        "raysize.cluster": cluster,
        "raysize.namespace": namespace,
        "raysize.tick": tick,
        "raysize.launches": sum(a.count for a in p.launch),
        "raysize.resizes": len(p.resize),
        "raysize.terminations": len(p.terminate),
    }
    token = begin(DECISION_SPAN, attributes, workflow.time_ns())
    if token is not None:
        _open_span.set(token)


@contextlib.contextmanager
def decision_scope() -> Iterator[None]:
    """Around one tick: ends the decision span `decision_span` may have opened, so the
    wait and continue-as-new that follow are not part of the tick's trace."""
    try:
        yield
    finally:
        token = _open_span.get()
        if token is not None:
            _open_span.set(None)
            # also reached when the worker evicts the run mid-tick: never fail on the way out
            with contextlib.suppress(Exception):
                end = workflow.extern_functions().get(DECISION_SPAN_END_EXTERN)
                if end is not None:
                    end(token)
