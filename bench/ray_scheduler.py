"""Ray 2.60's autoscaler v2 scheduler, with IPPR, on a scenario: outside any cluster.

`ResourceDemandScheduler.schedule(SchedulingRequest)` is pure Python over protobuf
messages, so a scenario is translated into the request the autoscaler's reconciler
would build from the GCS's `GetClusterResourceState` reply, the instance manager's
instances and the KubeRay IPPR provider's specs and statuses:

- groups → `NodeTypeConfig` (resources, min/max workers, labels; the head group gets
  `max_worker_nodes = 1` and `max_num_nodes = max_workers + 1`, as `AutoscalingConfig`
  does);
- running pods → `Instance(RAY_RUNNING)` + `NodeState` (total, available, idle duration,
  labels, node type); pending pods → `Instance(ALLOCATED)` with no Ray node;
- `ippr` → `IPPRGroupSpec`; every pod of an IPPR group → `IPPRStatus` (current = total,
  an in-flight resize as desired values with `resizing_at`, suggested caps, a past
  failure as `last_failed_at`), finished the way `KubeRayIPPRProvider` finishes it:
  Kubelet suggestions re-target a deferred/infeasible resize, and errors and timeouts
  are recorded and rolled back by Ray's own `_handle_failed_or_timed_out_ippr`;
- demands → `ResourceRequestByCount` (one empty `LabelSelector` when there is none, as
  the GCS sends; `!v` → NOT_IN, `in(a,b)` → IN); gangs → one `GangResourceRequest` per
  placement group (STRICT_PACK bundles carry an affinity, STRICT_SPREAD bundles an
  anti-affinity on `_PG_<id>`, as the GCS sends them); constraints → one
  `ClusterResourceConstraint` (Ray supports one; `request_resources` sends one).

Run as a child process of `bench.ray_compare` (`python -m bench.ray_scheduler`): Ray's
generated protobuf modules and raysize's `activities.ray_proto` both define the package
`ray.rpc`, so they must not meet in one process. The protocol is JSON lines: the child
says `{"ready": true}`, then for each job `{"doc", "repeat"}` answers one
`{"seconds"}` per schedule and finally `{"outcome"}`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from typing import Any

from ray.autoscaler.v2.instance_manager.cloud_providers.kuberay.ippr_provider import (
    _handle_failed_or_timed_out_ippr,
)
from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
from ray.autoscaler.v2.scheduler import (
    ResourceDemandScheduler,
    ResourceRequestSource,
    SchedulingNodeStatus,
    SchedulingReply,
    SchedulingRequest,
)
from ray.autoscaler.v2.schema import AutoscalerInstance, IPPRGroupSpec, IPPRSpecs, IPPRStatus
from ray.core.generated.autoscaler_pb2 import (
    AffinityConstraint,
    AntiAffinityConstraint,
    BundleSelector,
    ClusterResourceConstraint,
    GangResourceRequest,
    NodeState,
    NodeStatus,
    PlacementConstraint,
    ResourceRequest,
    ResourceRequestByCount,
)
from ray.core.generated.common_pb2 import (
    LabelSelector,
    LabelSelectorConstraint,
    LabelSelectorOperator,
)
from ray.core.generated.instance_manager_pb2 import Instance, NodeKind, TerminationRequest

from bench.ray_compare import Outcome, Resize, scenario_totals
from raysize.workflows.model import (
    ClusterSnapshot,
    Demand,
    GangStrategy,
    GroupSpec,
    KubeletResizeState,
    PodPhase,
    PodView,
)
from raysize.workflows.resources import CPU, Resources, units_to_float

# A group without max_workers: KubeRay always sets maxReplicas; any cap above the
# scenario's size behaves the same.
UNCAPPED = 1_000_000_000

# How the Kubelet's resize condition reads for each in-flight state.
K8S_RESIZE_STATUS = {
    KubeletResizeState.IN_PROGRESS: "inprogress",
    KubeletResizeState.DEFERRED: "deferred",
    KubeletResizeState.INFEASIBLE: "infeasible",
    KubeletResizeState.ERROR: "error",
    KubeletResizeState.TIMED_OUT: "inprogress",  # timed out = still in progress past the timeout
}


def ray_amounts(res: Resources) -> dict[str, float]:
    return {name: units_to_float(amount, name) for name, amount in res.items()}


def label_selector(selector: dict[str, str]) -> LabelSelector:
    """Ray's selector syntax (`v`, `!v`, `in(a,b)`, `!in(a,b)`) as the GCS encodes it."""
    out = LabelSelector()
    for key, expr in selector.items():
        negate = expr.startswith("!")
        body = expr[1:] if negate else expr
        if body.startswith("in(") and body.endswith(")"):
            values = [v.strip() for v in body[3:-1].split(",")]
        else:
            values = [body]
        op = (
            LabelSelectorOperator.LABEL_OPERATOR_NOT_IN
            if negate
            else LabelSelectorOperator.LABEL_OPERATOR_IN
        )
        out.label_constraints.append(
            LabelSelectorConstraint(label_key=key, operator=op, label_values=values)
        )
    return out


def demand_request(d: Demand) -> ResourceRequest:
    """One unit of a demand as the GCS sends it (one empty selector for a task or actor
    without one)."""
    return ResourceRequest(
        resources_bundle=ray_amounts(d.shape),
        label_selectors=[label_selector(dict(d.label_selector))],
    )


def node_type_config(g: GroupSpec) -> NodeTypeConfig:
    if g.is_head:
        # AutoscalingConfig.get_node_type_configs: the head type's max_workers + 1
        max_nodes = (g.max_workers or 0) + 1
    else:
        max_nodes = UNCAPPED if g.max_workers is None else g.max_workers
    return NodeTypeConfig(
        name=g.name,
        min_worker_nodes=0 if g.is_head else g.min_workers,
        max_worker_nodes=max_nodes,
        resources=ray_amounts(g.resources),
        labels=dict(g.labels),
    )


def ippr_group_spec(g: GroupSpec) -> IPPRGroupSpec | None:
    if g.ippr is None:
        return None
    return IPPRGroupSpec(
        min_cpu=units_to_float(g.resources.cpu, CPU),
        max_cpu=units_to_float(g.ippr.max_cpu, CPU),
        min_memory=g.resources.memory,
        max_memory=g.ippr.max_memory,
        resize_timeout=g.ippr.resize_timeout_s,
    )


def node_id_hex(p: PodView) -> str:
    assert p.raylet_id is not None
    return p.raylet_id


def ippr_status(p: PodView, spec: IPPRGroupSpec, now: int) -> IPPRStatus:
    """What `KubeRayIPPRProvider.sync_ippr_status_from_pods` makes of this pod."""
    cpu = units_to_float(p.total.cpu, CPU)
    mem = p.total.memory
    status = IPPRStatus(
        cloud_instance_id=p.name,
        spec=spec,
        current_cpu=cpu,
        current_memory=mem,
        desired_cpu=cpu,
        desired_memory=mem,
        suggested_max_cpu=(
            None if p.suggested_max_cpu is None else units_to_float(p.suggested_max_cpu, CPU)
        ),
        suggested_max_memory=p.suggested_max_memory,
    )
    if p.failed:
        status.last_failed_at = now - 1
        status.last_failed_reason = "failed before (scenario)"
    r = p.resize
    if r is not None:
        status.desired_cpu = units_to_float(r.cpu, CPU)
        status.desired_memory = r.memory
        status.resizing_at = now
        status.k8s_resize_status = K8S_RESIZE_STATUS[r.state]
        if r.state == KubeletResizeState.TIMED_OUT:
            status.resizing_at = now - spec.resize_timeout - 1
        if r.state in (KubeletResizeState.DEFERRED, KubeletResizeState.INFEASIBLE):
            # _apply_resize_suggestion: the Kubelet's report re-targets the resize
            if status.suggested_max_cpu is not None:
                status.queue_resize_request(desired_cpu=status.suggested_max_cpu)
            if status.suggested_max_memory is not None:
                status.queue_resize_request(desired_memory=status.suggested_max_memory)
    return _handle_failed_or_timed_out_ippr(status)


def instance(p: PodView, g: GroupSpec) -> AutoscalerInstance:
    kind = NodeKind.HEAD if g.is_head else NodeKind.WORKER
    if p.phase == PodPhase.PENDING:
        return AutoscalerInstance(
            cloud_instance_id=p.name,
            im_instance=Instance(
                instance_id=p.name,
                cloud_instance_id=p.name,
                status=Instance.ALLOCATED,
                instance_type=g.name,
                node_kind=kind,
            ),
        )
    node_id = node_id_hex(p)
    labels = {**g.labels, **p.labels}
    return AutoscalerInstance(
        cloud_instance_id=p.name,
        im_instance=Instance(
            instance_id=p.name,
            cloud_instance_id=p.name,
            node_id=node_id,
            status=Instance.RAY_RUNNING,
            instance_type=g.name,
            node_kind=kind,
        ),
        ray_node=NodeState(
            node_id=bytes.fromhex(node_id) if _is_hex(node_id) else node_id.encode(),
            instance_id=p.name,
            ray_node_type_name=g.name,
            total_resources=ray_amounts(p.total),
            available_resources=ray_amounts(p.available),
            status=NodeStatus.IDLE if p.idle_s > 0 else NodeStatus.RUNNING,
            idle_duration_ms=round(p.idle_s * 1000),
            labels=labels,
        ),
    )


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def gang_requests(snap: ClusterSnapshot) -> list[GangResourceRequest]:
    out = []
    for i, gang in enumerate(snap.gangs):
        for k in range(gang.count):
            pg_id = f"{i:012x}{k:012x}01000000"
            label = f"_PG_{pg_id}"
            bundles = []
            for j, bundle in enumerate(gang.bundles):
                req = ResourceRequest(resources_bundle=ray_amounts(bundle))
                if gang.strategy == GangStrategy.STRICT_PACK:
                    req.placement_constraints.append(
                        PlacementConstraint(affinity=AffinityConstraint(label_name=label))
                    )
                elif gang.strategy == GangStrategy.STRICT_SPREAD:
                    req.placement_constraints.append(
                        PlacementConstraint(anti_affinity=AntiAffinityConstraint(label_name=label))
                    )
                if j < len(gang.bundle_selectors) and gang.bundle_selectors[j]:
                    req.label_selectors.append(label_selector(gang.bundle_selectors[j]))
                bundles.append(req)
            out.append(
                GangResourceRequest(
                    requests=bundles,
                    details=f"{pg_id}:{gang.strategy.value}|PENDING",
                    bundle_selectors=[BundleSelector(resource_requests=bundles)],
                )
            )
    return out


def scheduling_request(snap: ClusterSnapshot, now: int) -> tuple[SchedulingRequest, set[str]]:
    """The request, and the pods whose resize the IPPR provider queued before scheduling
    (Kubelet suggestions, rollbacks): Ray sends those too, but no demand asked for them."""
    configs = {name: node_type_config(g) for name, g in snap.groups.items()}
    specs = {name: s for name, g in snap.groups.items() if (s := ippr_group_spec(g)) is not None}
    instances = []
    statuses: dict[str, IPPRStatus] = {}
    for p in snap.pods:
        g = snap.groups[p.group]
        instances.append(instance(p, g))
        if p.group in specs:
            statuses[p.name] = ippr_status(p, specs[p.group], now)
    queued_before = {n for n, s in statuses.items() if s.k8s_resize_status == "new"}
    demands = []
    for d in snap.demands:
        demands.append(ResourceRequestByCount(request=demand_request(d), count=d.count))
    constraints = []
    if snap.constraints:
        constraints.append(
            ClusterResourceConstraint(
                resource_requests=[
                    ResourceRequestByCount(
                        request=ResourceRequest(resources_bundle=ray_amounts(c.shape)),
                        count=c.count,
                    )
                    for c in snap.constraints
                ]
            )
        )
    has_head = any(snap.groups[p.group].is_head for p in snap.pods)
    max_workers = snap.settings.max_workers
    request = SchedulingRequest(
        disable_launch_config_check=True,
        node_type_configs=configs,
        max_num_nodes=None if max_workers is None else max_workers + int(has_head),
        idle_timeout_s=snap.settings.idle_timeout_s,
        resource_requests=demands,
        gang_resource_requests=gang_requests(snap),
        cluster_resource_constraints=constraints,
        current_instances=instances,
        ippr_specs=IPPRSpecs(groups=specs) if specs else None,
        ippr_statuses=statuses,
    )
    return request, queued_before


# What the last schedule() put on each node it launches: recorded when the scheduler
# reads its launch requests off its nodes (SchedulingReply has only counts per type).
# Ray places on a new node of an IPPR group up to the group's maximum, so a new node may
# carry more than it is launched with; the IPPR provider grows it once it runs.
_LAUNCHED: list[tuple[str, float, int]] = []
_get_launch_requests = ResourceDemandScheduler.ScheduleContext.get_launch_requests


def _recording_launches(ctx: Any) -> Any:
    _LAUNCHED.clear()
    for node in ctx._nodes:
        if node.status != SchedulingNodeStatus.TO_LAUNCH:
            continue
        cpu, memory = 0.0, 0.0
        for req in node.sched_requests.get(ResourceRequestSource.PENDING_DEMAND, []):
            cpu += req.resources_bundle.get("CPU", 0.0)
            memory += req.resources_bundle.get("memory", 0.0)
        _LAUNCHED.append((node.node_type, round(cpu, 3), int(memory)))
    return _get_launch_requests(ctx)


ResourceDemandScheduler.ScheduleContext.get_launch_requests = _recording_launches  # type: ignore[method-assign]


def outcome(
    snap: ClusterSnapshot, reply: SchedulingReply, queued_before: set[str], seconds: list[float]
) -> Outcome:
    demand_units, gangs, constraint_units = scenario_totals(snap)
    launched: Counter[str] = Counter()
    for launch in reply.to_launch:
        launched[launch.instance_type] += launch.count
    resizes = [
        Resize(
            pod=s.cloud_instance_id,
            cpu=float(s.desired_cpu),
            memory=int(s.desired_memory),
            from_cpu=float(s.current_cpu),
            from_memory=int(s.current_memory),
            for_demand=s.cloud_instance_id not in queued_before,
        )
        for s in reply.to_ippr
    ]
    terminated = {t.instance_id: TerminationRequest.Cause.Name(t.cause) for t in reply.to_terminate}
    # which demand each unplaced request came from: Ray hands back copies of our requests.
    # Entries with the same shape and selector send the same request: their unplaced
    # units fill them in order, none beyond its count.
    entries_of: dict[bytes, list[int]] = {}
    for i, d in enumerate(snap.demands):
        key = demand_request(d).SerializeToString(deterministic=True)
        entries_of.setdefault(key, []).append(i)
    left_by_entry = [0] * len(snap.demands)
    for req in reply.infeasible_resource_requests:
        for i in entries_of.get(req.SerializeToString(deterministic=True), []):
            if left_by_entry[i] < snap.demands[i].count:
                left_by_entry[i] += 1
                break
    known = sum(left_by_entry) == len(reply.infeasible_resource_requests)
    return Outcome(
        planner="ray",
        seconds=seconds,
        demand_units=demand_units,
        demand_left=len(reply.infeasible_resource_requests),
        gangs=gangs,
        gangs_left=len(reply.infeasible_gang_resource_requests),
        constraint_units=constraint_units,
        # Ray gives capacity to the whole request_resources() call or to none of it
        constraint_left=constraint_units if reply.infeasible_cluster_resource_constraints else 0,
        launched=dict(sorted(launched.items())),
        resizes=sorted(resizes, key=lambda r: r.pod),
        terminated=dict(sorted(terminated.items())),
        demand_left_by_entry=left_by_entry if known else None,
        new_pod_use=sorted(_LAUNCHED),
    )


def schedule(snap: ClusterSnapshot, repeat: int, report: Any = None) -> tuple[list[float], Outcome]:
    seconds: list[float] = []
    result: tuple[SchedulingReply, set[str]] | None = None
    for _ in range(max(1, repeat)):
        request, queued_before = scheduling_request(snap, int(time.time()))
        scheduler = ResourceDemandScheduler()
        t0 = time.perf_counter()
        reply = scheduler.schedule(request)
        seconds.append(time.perf_counter() - t0)
        if report is not None:
            report(seconds[-1])
        result = (reply, queued_before)
    assert result is not None
    return seconds, outcome(snap, result[0], result[1], seconds)


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    from raysize.worker.scenario import load_scenario

    # Ray's scheduler logs each min_workers launch and termination at INFO
    logging.getLogger("ray").setLevel(logging.ERROR)
    _send({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        snap = load_scenario(job["doc"])
        _, result = schedule(snap, int(job["repeat"]), report=lambda s: _send({"seconds": s}))
        _send({"outcome": result.to_json()})


if __name__ == "__main__":
    main()
