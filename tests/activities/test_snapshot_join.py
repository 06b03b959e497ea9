"""Kubernetes and Ray joined into the planner's snapshot (`activities/snapshot.join`), and
what the planner and the deadlines then decide on it: the level at which a pod's Raylet is
judged in or out of step, and a pod without a Raylet running or starting."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from raysize.activities.k8s_objects import KubeCluster, gcs_address, pod_view
from raysize.activities.ray_state import ClusterState, NodeStatus, RayNode
from raysize.activities.snapshot import join
from raysize.workflows.deadlines import (
    MARGIN_S,
    RAYLET_DRIFT_S,
    drifting,
    next_decision_in,
    stuck_resizes,
)
from raysize.workflows.model import ClusterSnapshot, Demand, PlannerSettings, PodPhase
from raysize.workflows.planner import landing_grows, plan
from raysize.workflows.raycluster_spec import read_group_specs
from raysize.workflows.resources import CPU, GIB, MEMORY, Resources

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "raycluster-ippr.yaml"
NOW = datetime(2026, 11, 24, 6, 0, 0, tzinfo=UTC).timestamp()
HEAD, WORKER = "raysize-example-head-x7k2p", "raysize-example-cpu-worker-q9m4t"


def example() -> dict[str, Any]:
    """deploy/examples/raycluster-ippr.yaml: a 1 CPU/2Gi head with `num-cpus: "0"` (not in
    ray.io/ippr), and group "cpu" (1 CPU/2Gi, up to 4 CPU/8Gi) in it."""
    loaded = yaml.safe_load(EXAMPLE.read_text())
    assert loaded["spec"]["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    return dict(loaded)


def k8s_pod(
    rc: dict[str, Any], name: str, group: str, *, started: str = "2026-11-24T05:59:00Z"
) -> dict[str, Any]:
    """A Running pod of the group as KubeRay makes it (the template's container)."""
    spec = rc["spec"]
    raw = (
        spec["headGroupSpec"]
        if group == "headgroup"
        else next(g for g in spec["workerGroupSpecs"] if g["groupName"] == group)
    )
    return {
        "metadata": {
            "name": name,
            "labels": {
                "ray.io/cluster": rc["metadata"]["name"],
                "ray.io/group": group,
                "ray.io/node-type": "head" if group == "headgroup" else "worker",
            },
        },
        "spec": copy.deepcopy(raw["template"]["spec"]),
        "status": {"phase": "Running", "startTime": started},
    }


def raylet(pod: str, group: str, cpu: int, memory: int, *, idle_ms: int = 0) -> RayNode:
    return RayNode(
        node_id=f"{abs(hash(pod)):056x}"[:56],
        pod=pod,
        group=group,
        status=NodeStatus.IDLE if idle_ms else NodeStatus.RUNNING,
        total=Resources.of(cpu=cpu, memory=memory),
        available=Resources.of(cpu=cpu, memory=memory),
        idle_ms=idle_ms,
    )


def res_cpu(cores: int) -> Resources:
    return Resources.of(cpu=cores * 1000)


def kube(rc: dict[str, Any], pods: list[dict[str, Any]]) -> KubeCluster:
    views = tuple(pod_view(p, now=NOW) for p in pods)
    return KubeCluster(
        namespace="default",
        name=rc["metadata"]["name"],
        raycluster=rc,
        groups=read_group_specs(rc),
        pods=views,
        replicas={g["groupName"]: int(g["replicas"]) for g in rc["spec"]["workerGroupSpecs"]},
        workers_to_delete=(),
        resource_version="1",
        pods_version="1",
        resizing=tuple(v.name for v in views if v.resize is not None),
        gcs_address=gcs_address(rc),
    )


def observed(
    rc: dict[str, Any], pods: list[dict[str, Any]], nodes: list[RayNode]
) -> ClusterSnapshot:
    return join(kube(rc, pods), ClusterState(version=1, nodes=tuple(nodes)), PlannerSettings())


def test_a_head_registered_as_its_ray_start_params_pin_it_is_in_step() -> None:
    """Seen on the real control plane with deploy/examples/raycluster-ippr.yaml: the head
    pod has 1 CPU/2Gi, KubeRay starts its Raylet with `--num-cpus=0` (the user's
    rayStartParams), and it registers 0 CPU/2Gi. That is what the user set, not a Raylet
    out of step: no resize on it, nothing drifting, nothing to settle however long it
    stays so, no deadline, and no grow "landing" on it that would hold launches back."""
    rc = example()
    snap = observed(
        rc,
        [k8s_pod(rc, HEAD, "headgroup"), k8s_pod(rc, WORKER, "cpu")],
        [raylet(HEAD, "headgroup", 0, 2 * GIB), raylet(WORKER, "cpu", 1000, 2 * GIB)],
    )
    head = next(p for p in snap.pods if p.name == HEAD)
    assert head.resize is None
    assert head.total.get_units(CPU) == 0 and head.total.get_units(MEMORY) == 2 * GIB
    long_ago = {HEAD: 10 * RAYLET_DRIFT_S}
    assert drifting(snap) == ()
    assert stuck_resizes(snap, long_ago) == ()
    assert next_decision_in(snap, long_ago) is None
    assert landing_grows(snap) == []
    # two 1-CPU tasks wait: the worker grows (nothing lands on the head, nothing is held)
    p = plan(snap.model_copy(update={"demands": (Demand(shape=res_cpu(1), count=2),)}))
    assert [(r.pod, r.cpu) for r in p.resize] == [(WORKER, 2000)]


def test_a_worker_raylet_behind_its_pod_is_still_out_of_step() -> None:
    """What the drift rule is for stays: a Raylet of a group raysize resizes that came back
    at its start-up size while its pod kept 3 CPU is out of step, and settled."""
    rc = example()
    grown = k8s_pod(rc, WORKER, "cpu")
    for kind in ("requests", "limits"):
        grown["spec"]["containers"][0]["resources"][kind]["cpu"] = "3"
    snap = observed(
        rc,
        [k8s_pod(rc, HEAD, "headgroup"), grown],
        [raylet(HEAD, "headgroup", 0, 2 * GIB), raylet(WORKER, "cpu", 1000, 2 * GIB)],
    )
    assert drifting(snap) == (WORKER,)
    (settle,) = stuck_resizes(snap, {WORKER: RAYLET_DRIFT_S + 1})
    assert (settle.pod, settle.cpu) == (WORKER, 3000)


def test_a_pod_running_past_the_raylet_start_timeout_without_a_raylet_is_replaced() -> None:
    """RAYSIZE_RAYLET_START_TIMEOUT_S (README): a running worker pod whose Raylet has not
    registered after this long is removed and replaced. Kubernetes says the pod is Running
    (since 11 minutes, the limit is 10); Ray has no node for it. The plan removes it with
    the documented reason, launches its replacement (the group's minimum is 1), and before
    that the reconcile's wait ends when the timeout falls due."""
    rc = example()
    silent = k8s_pod(rc, WORKER, "cpu", started="2026-11-24T05:49:00Z")  # 660 s before NOW
    head = k8s_pod(rc, HEAD, "headgroup")
    snap = observed(rc, [head, silent], [raylet(HEAD, "headgroup", 0, 2 * GIB)])
    p = plan(snap)
    assert [(t.pod, t.group) for t in p.terminate] == [(WORKER, "cpu")]
    assert p.terminate[0].reason == (
        "its Raylet has not registered 660s after the pod started (limit 600s): replaced"
    )
    assert p.launch_by_group == {"cpu": 1}
    # 9 minutes in: waited on (room that is coming), and due in a minute
    starting = k8s_pod(rc, WORKER, "cpu", started="2026-11-24T05:51:00Z")  # 540 s
    snap = observed(rc, [head, starting], [raylet(HEAD, "headgroup", 0, 2 * GIB)])
    assert plan(snap).is_empty
    assert next_decision_in(snap) == 60 + MARGIN_S
    # a pod Kubernetes has not started yet is waited on without a deadline: its start
    # is a pod change, which wakes the loop
    pending = k8s_pod(rc, WORKER, "cpu")
    pending["status"] = {"phase": "Pending"}
    snap = observed(rc, [head, pending], [raylet(HEAD, "headgroup", 0, 2 * GIB)])
    assert [p.phase for p in snap.pods if p.name == WORKER] == [PodPhase.PENDING]
    assert plan(snap).is_empty and next_decision_in(snap) is None
