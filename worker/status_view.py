"""`raysize status`: the resizes of one RayCluster, one readable row each.

Finished resizes are read from Temporal's index, not from their histories: the memo the
reconcile wrote at the start (from, to, why) and the `ResizePhase`/`ResizeOutcome` search
attributes the saga keeps. A running one is asked for its state (what it waits for).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError

from raysize.workflows.contracts import LoopSettings, ResizePhase, ResizeSagaState
from raysize.workflows.naming import POD_NAME, RESIZE_OUTCOME, RESIZE_PHASE, kube_cluster_query
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.resources import size_text

QUERY_TIMEOUT = timedelta(seconds=10)
LIMIT = 200  # resizes read per cluster, newest first


@dataclass(frozen=True)
class ResizeRow:
    workflow_id: str
    pod: str
    change: str  # "1 CPU, 1Gi → 2 CPU, 1Gi"
    phase: str
    outcome: str
    age_s: float  # since it ended (or started, while running)
    running: bool
    detail: str = ""
    node: str = ""  # a grow's node and the room it had when it was decided

    def to_json(self) -> dict[str, object]:
        return asdict(self)


async def _row(client: Client, wf: WorkflowExecution, now: datetime) -> ResizeRow:
    memo = await wf.memo()
    attrs = wf.typed_search_attributes
    pod = attrs.get(POD_NAME) or wf.id.rsplit("/", 1)[-1]
    change = f"{memo.get('from', '?')} → {memo.get('to', '?')}"
    phase = attrs.get(RESIZE_PHASE) or "?"
    outcome = attrs.get(RESIZE_OUTCOME) or "?"
    running = wf.status == WorkflowExecutionStatus.RUNNING
    detail = ""
    if running:
        try:
            state: ResizeSagaState = await client.get_workflow_handle_for(
                PodResizeWorkflow.run, wf.id, run_id=wf.run_id
            ).query(PodResizeWorkflow.state, rpc_timeout=QUERY_TIMEOUT)
            phase = state.phase.value + (" (paused)" if state.paused else "")
            detail = state.detail
            if state.phase == ResizePhase.ROLLING_BACK:
                detail = f"rolling back: {detail}" if detail else "rolling back"
        except RPCError as exc:
            detail = f"no answer to the state query: {exc.message}"
    elif wf.status is not None and wf.status != WorkflowExecutionStatus.COMPLETED:
        outcome = f"{outcome} ({wf.status.name.lower()})"
    since = wf.close_time if (wf.close_time and not running) else wf.start_time
    return ResizeRow(
        workflow_id=wf.id,
        pod=pod,
        change=change,
        phase=phase,
        outcome=outcome,
        age_s=max(0.0, (now - since).total_seconds()),
        running=running,
        detail=detail,
        node=str(memo.get("node") or ""),
    )


async def resize_rows(
    client: Client,
    namespace: str,
    cluster: str,
    now: datetime,
    live: set[str] | None,
    *,
    kube_cluster: str = "",
) -> tuple[list[ResizeRow], int]:
    """This cluster's resizes, newest first; with `live`, only those pods' (and how many
    rows were left out). Only those of `kube_cluster` (RAYSIZE_CLUSTER_NAME): another
    Kubernetes cluster may have a RayCluster of the same name in the same namespace."""
    query = (
        f"RayCluster='{cluster}' AND RayNamespace='{namespace}' "
        f"AND WorkflowType='PodResizeWorkflow' AND {kube_cluster_query(kube_cluster)}"
    )
    found = [wf async for wf in client.list_workflows(query, limit=LIMIT)]
    rows = await asyncio.gather(*(_row(client, wf, now) for wf in found))
    rows_sorted = sorted(rows, key=lambda r: (not r.running, r.age_s))
    if live is None:
        return rows_sorted, 0
    kept = [r for r in rows_sorted if r.pod in live]
    return kept, len(rows_sorted) - len(kept)


def age_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h"
    return f"{seconds // 86400:.0f}d"


def render_rows(rows: list[ResizeRow]) -> list[str]:
    """An aligned table: pod, from → to, phase, outcome, age (and what a running one
    waits for, under it)."""
    if not rows:
        return []
    header = ("POD", "FROM → TO", "PHASE", "OUTCOME", "AGE", "NODE (ROOM WHEN DECIDED)")
    cells = [(r.pod, r.change, r.phase, r.outcome, age_text(r.age_s), r.node or "-") for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]

    def line(c: tuple[str, ...]) -> str:
        return "  " + "  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip()

    out = [line(header)]
    for r, c in zip(rows, cells, strict=True):
        out.append(line(c))
        if r.running and r.detail:
            out.append(f"    ↳ {r.detail}")
    return out


def in_force_text(loop: LoopSettings) -> str:
    """The settings a loop decides with, as `raysize status` shows them."""
    p = loop.settings
    cap = "" if p.max_workers is None else f", at most {p.max_workers} workers"
    return (
        f"tick {loop.tick_s:g} s, up to {loop.max_concurrent_resizes} resizes at once, "
        f"resize policy {p.resize_policy.value}, steps {size_text(p.cpu_step, p.memory_step)}, "
        f"idle timeout {p.idle_timeout_s:g} s, Raylet start timeout "
        f"{p.raylet_start_timeout_s:g} s{cap}"
    )
