"""A RayCluster's pods (Kubernetes) and its nodes, demands, gangs and constraints (the
Ray GCS), joined by pod name (Ray's `instance_id`) into the planner's `ClusterSnapshot`.
Pure translation: the reads are the activities' (`activities/cluster.py`)."""

from __future__ import annotations

from typing import Any

from raysize.activities.k8s_objects import KubeCluster
from raysize.activities.ray_state import ClusterState, LabelOperator, LabelSelector, RayNode
from raysize.workflows.model import (
    ClusterSnapshot,
    Constraint,
    Demand,
    Gang,
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
)
from raysize.workflows.resources import CPU, MEMORY


def selector_text(selectors: tuple[LabelSelector, ...]) -> dict[str, str]:
    """Ray's label selector → the planner's syntax ("v", "!v", "in(a,b)", "!in(a,b)")."""
    if not selectors:
        return {}
    out: dict[str, str] = {}
    for c in selectors[0].constraints:
        neg = "!" if c.operator == LabelOperator.NOT_IN else ""
        body = c.values[0] if len(c.values) == 1 else f"in({','.join(c.values)})"
        out[c.key] = neg + body
    return out


def _newest_node(nodes: list[RayNode], recorded: str | None) -> RayNode | None:
    """The pod's Raylet. A restarted Raylet registers anew while Ray may still list the
    old one as alive (until its health checks fail): prefer the one the pod's
    ray.io/ippr-status does not name (that one was recorded before the restart)."""
    if len(nodes) > 1:
        fresh = [n for n in nodes if n.node_id != recorded]
        nodes = fresh or nodes
    return nodes[-1] if nodes else None


def _resizable(kube: KubeCluster, view: PodView) -> bool:
    """Of a group `ray.io/ippr` names: raysize keeps its Raylet in step with the pod. Any
    other pod's Raylet (the head's, unless named there) registers what KubeRay's `ray
    start` line gives it, and raysize never changes it: its totals are taken as they are."""
    group = kube.groups.groups.get(view.group)
    return group is not None and group.ippr is not None


def _raylet_size(kube: KubeCluster, view: PodView) -> tuple[int, int]:
    """(millicores, bytes) the pod's Raylet should report: what the group's
    `rayStartParams` set (`num-cpus`, `memory`), else the pod's size, which follows the
    resizes raysize made. (`ray.io/ippr` refuses those two parameters in the groups it
    names, so there it is the pod's size.)"""
    pinned = kube.groups.pinned.get(view.group, {})
    return pinned.get(CPU, view.total.cpu), pinned.get(MEMORY, view.total.memory)


def join(kube: KubeCluster, ray: ClusterState, settings: PlannerSettings) -> ClusterSnapshot:
    """One snapshot from both sides. Pods whose Raylet has not registered are pending;
    replicas asked for but not yet created count as pending pods too, so a slow operator
    never makes the planner launch twice."""
    by_pod: dict[str, list[RayNode]] = {}
    for n in ray.nodes:
        if n.alive:  # a dead Raylet is no pod's: the pod waits for its next one
            by_pod.setdefault(n.pod, []).append(n)
    deleting = set(kube.workers_to_delete)
    resizing = set(kube.resizing)
    pods: list[PodView] = []
    for view in kube.pods:
        if view.name in deleting:
            continue
        node = _newest_node(by_pod.get(view.name, []), view.raylet_id)
        if node is None:
            pods.append(view.model_copy(update={"phase": PodPhase.PENDING, "raylet_id": None}))
            continue
        update: dict[str, Any] = {
            "phase": PodPhase.RUNNING if view.phase == PodPhase.RUNNING else PodPhase.PENDING,
            "raylet_id": node.node_id,
            "total": node.total,
            "available": node.available,
            "idle_s": node.idle_ms / 1000.0,
            "labels": {**view.labels, **node.labels},
        }
        cpu, memory = _raylet_size(kube, view)
        if view.resize is None and view.name in resizing:
            update["resize"] = PodResize(
                cpu=view.total.cpu, memory=view.total.memory, state=KubeletResizeState.IN_PROGRESS
            )
        elif (
            view.resize is None
            and _resizable(kube, view)
            and (node.total.get_units(CPU), node.total.get_units(MEMORY)) != (cpu, memory)
        ):
            # the pod has its new size and the Raylet not (yet): a resize is finishing, a
            # restarted Raylet came back at its start-up size (KubeRay's `ray start`
            # line keeps the template's CPUs), or the pod was launched at size (never
            # resized: its Raylet started at that line's size)
            update["resize"] = PodResize(
                cpu=cpu,
                memory=memory,
                state=KubeletResizeState.IN_PROGRESS,
                raylet_only=True,
                launched=not view.resized,
            )
        pods.append(view.model_copy(update=update))
    have: dict[str, int] = {}
    for p in pods:
        have[p.group] = have.get(p.group, 0) + 1
    for group, wanted in sorted(kube.replicas.items()):
        spec = kube.groups.groups.get(group)
        for i in range(max(0, wanted - have.get(group, 0))):
            if spec is None:
                break
            pods.append(
                PodView(
                    name=f"{kube.name}-{group}-not-created-{i}",
                    group=group,
                    phase=PodPhase.PENDING,
                    total=spec.resources,
                    available=spec.resources,
                )
            )
    base = kube.snapshot(settings)
    return base.model_copy(
        update={
            "pods": tuple(pods),
            "demands": tuple(
                Demand(
                    shape=d.shape, count=d.count, label_selector=selector_text(d.label_selectors)
                )
                for d in ray.demands
            ),
            "gangs": tuple(
                Gang(
                    bundles=tuple(b.shape for b in g.bundles),
                    strategy=g.strategy,
                    bundle_selectors=tuple(selector_text(b.label_selectors) for b in g.bundles),
                )
                for g in ray.gangs
            ),
            "constraints": tuple(Constraint(shape=c.shape, count=c.count) for c in ray.constraints),
        }
    )
