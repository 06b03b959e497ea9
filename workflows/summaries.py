"""What the Temporal UI shows of each workflow and activity (pure text).

Temporal's user metadata: a workflow's *static summary* is the line in the workflow
list, its *static details* the note on its page, its *current details* what it is doing
now, and an activity's *summary* the name its step gets in the event history. Without
them the list showed three identical `resize/default/demo-small-worker-dzh8p` rows, and
nothing said which grew, which shrank, or how it ended until each was opened.
"""

from __future__ import annotations

from raysize.workflows.contracts import ResizeRequest
from raysize.workflows.resources import CPU, size_text, units_to_float

MAX_SUMMARY = 200  # the UI shows one line; Temporal caps summaries at a few hundred bytes


def change_text(from_cpu: int, from_memory: int, cpu: int, memory: int) -> str:
    """`1 → 2 CPU` when only CPU changes, else both sizes in full."""
    if memory == from_memory:
        return f"{units_to_float(from_cpu, CPU):g} → {units_to_float(cpu, CPU):g} CPU"
    return f"{size_text(from_cpu, from_memory)} → {size_text(cpu, memory)}"


def why(reason: str) -> str:
    """The planner's reason without its own size arrow ("1 × {CPU: 2} pending task")."""
    return reason.split(" → ", 1)[0].strip()


def _clip(text: str) -> str:
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


def resize_verb(req: ResizeRequest) -> str:
    if (req.cpu, req.memory) == (req.from_cpu, req.from_memory):
        return "settle"  # a stuck resize taken back to the size the pod has
    return "shrink" if req.cpu <= req.from_cpu and req.memory <= req.from_memory else "grow"


def resize_change(req: ResizeRequest) -> str:
    """`grow 1 → 2 CPU`: what a resize sets out to do (its `ResizeChange` search attribute,
    a column the Temporal UI's workflow list can show)."""
    return _clip(
        f"{resize_verb(req)} {change_text(req.from_cpu, req.from_memory, req.cpu, req.memory)}"
    )


def resize_summary(req: ResizeRequest) -> str:
    """`grow 1 → 2 CPU for 1 × {CPU: 2} pending task` (the workflow page's title line)."""
    text = resize_change(req)
    reason = why(req.reason)
    return _clip(f"{text} for {reason}" if reason else text)


def resize_details(req: ResizeRequest) -> str:
    """The workflow page's note (markdown)."""
    return "\n".join(
        [
            f"**{resize_verb(req)}** pod `{req.pod}` of RayCluster "
            f"`{req.namespace}/{req.cluster}` (group `{req.group}`)",
            "",
            f"- from **{size_text(req.from_cpu, req.from_memory)}** to "
            f"**{size_text(req.cpu, req.memory)}**",
            f"- why: {req.reason or 'not given'}",
            f"- the kubelet gets {req.timeout_s}s per attempt, {req.max_attempts} attempts; "
            "then the pod and its Raylet are rolled back",
            f"- readable view: `raysize status {req.namespace}/{req.cluster}`",
        ]
    )


def outcome_details(outcome: str, cpu: int, memory: int, detail: str) -> str:
    """The saga's last current details: how it ended."""
    text = f"{outcome} at {size_text(cpu, memory)}"
    return f"{text}: {detail}" if detail else text


def reconcile_summary(namespace: str, cluster: str) -> str:
    return _clip(
        f"reconcile RayCluster {namespace}/{cluster}: observe → plan → act; readable view: "
        f"raysize status {namespace}/{cluster}"
    )


def reconcile_details(namespace: str, cluster: str) -> str:
    return "\n".join(
        [
            f"raysize's loop for RayCluster `{namespace}/{cluster}`: it reads the cluster and "
            "Ray's demands, plans, starts one `PodResizeWorkflow` per pod to resize, and "
            "scales worker groups through the RayCluster.",
            "",
            "Its history is long and repetitive; what it decided and why reads better as "
            f"`raysize status {namespace}/{cluster}` (or `--json`). Each resize is its own "
            f"workflow: `resize/{namespace}/<pod>`.",
        ]
    )
