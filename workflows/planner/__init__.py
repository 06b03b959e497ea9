"""`plan(snapshot) -> Plan`: what to resize, launch and remove. Pure and deterministic.

The order of decisions:

1. launch pods to reach each group's `min_workers`;
2. remove pods above a group's or the cluster's maximum (pending first, then idle; never
   a busy pod);
3. `request_resources` constraints, bin-packed on pod *capacity*;
4. gangs (placement groups), then task/actor demands, bin-packed on *free* capacity.

Constraints, gangs and demands are each placed in three passes: on the room pods have
now (a resize in flight counts at its target, a pending pod at its IPPR maximum), then on
the headroom of pods that may grow in place, then on new pods (counted at their IPPR
maximum so no more are launched than needed). Finally idle pods are shrunk back to
their template size if they were grown, else removed.

GPU pods are kept for GPU work (Ray's `RAY_scheduler_avoid_gpu_nodes`): each of those
steps runs in up to three stages (`gpu_stages`). GPU work may use any pod from the first.
Work that needs no GPU uses, in turn, (1) the free room and growth of pods without GPUs,
(2) the spare room of GPU pods, running, pending (a pending pod counts empty at its
maximum) or launched by the plan, once GPU work has had its pick, and new pods without
GPUs (as Ray, which fills the nodes it has, and the GPU node it launches for GPU work,
before it launches another), (3) new GPU pods. While GPU work waits, a GPU
pod the plan does not use that is pending or idle past the timeout is kept to stage 3: it
will go, and make room under its group's maximum for a GPU pod that the waiting work fits.

A pod whose grow is in flight (`in_progress`) counts at its target and may grow further up
to its group's IPPR maximum: the plan then retargets the running resize (`ResizeAction.
retarget`) rather than launching a pod. While such a grow lands (`landing_grows`), no pod
is launched for demand at all: Ray publishes its demand list once a second, so the work
the grow is for may still be reported pending beside new work that the grown pod could
take once that work has run (issue #13: a task, then a placement group).

Task and actor demands that name a placement group's own resources (`CPU_group_<id>`,
`CPU_group_<i>_<id>`, `bundle_group_<id>`, ...) wait for a bundle of that group, which
already holds their room: they are dropped, as Ray's autoscaler drops them.

Amounts are integer vectors indexed by resource name; a shape is stored sparsely as
((index, amount), ...) because Ray shapes name one to three resources.

The modules: `passes` (`plan()`: the passes in order, over one `context.PlanContext`
and its `work.Ledger`), one module a pass or two (`replace_silent`, `min_max`,
`constraints`, `demands`, `grows`, `idle`, `smaller_launches`, `outcome`), what they
share (`vectors`, `selectors`, `work`, `bins`, `gpu_stages`, `packing`: tasks and
requests by shape, `gangs`: placement groups, `landing`), and `trace`
(`plan_with_trace`).
"""

from raysize.workflows.planner.gpu_stages import GpuGate, GpuStage
from raysize.workflows.planner.landing import (
    JUST_GROWN_S,
    LANDING_S,
    PUBLICATION_WAIT_S,
    landing_grows,
)
from raysize.workflows.planner.passes import plan
from raysize.workflows.planner.replace_silent import silent
from raysize.workflows.planner.selectors import (
    Selector,
    is_placement_group_resource,
    selector_matches,
)
from raysize.workflows.planner.trace import (
    FREE_ROOM,
    GROWN,
    NEW_POD,
    PENDING_POD,
    Left,
    Placement,
    Trace,
    plan_with_trace,
)
from raysize.workflows.planner.vectors import GPU, Shape
from raysize.workflows.planner.work import WorkKind

__all__ = [
    "FREE_ROOM",
    "GPU",
    "GROWN",
    "JUST_GROWN_S",
    "LANDING_S",
    "NEW_POD",
    "PENDING_POD",
    "PUBLICATION_WAIT_S",
    "GpuGate",
    "GpuStage",
    "Left",
    "Placement",
    "Selector",
    "Shape",
    "Trace",
    "WorkKind",
    "is_placement_group_resource",
    "landing_grows",
    "plan",
    "plan_with_trace",
    "selector_matches",
    "silent",
]
