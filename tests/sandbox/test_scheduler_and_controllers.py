"""Who binds pods, and what the controllers do, in each world (issue #44 item 1).

The real world runs kube-scheduler and kube-controller-manager v1.36.3: a pod is bound by
the real scheduler (its `Scheduled` Event comes from `default-scheduler`), which charges a
pod being resized the larger of its desired and allocated requests (KEP-1287); a
Deployment's pods come from a real ReplicaSet; an owned object is garbage-collected once
its owner is gone; a PodDisruptionBudget gets its status, which the eviction API obeys.

The embedded world keeps its own binding, the kubelet simulator's scheduler stand-in (the
zero-dependency demo installs nothing), with the same charge for a pod being resized; it
runs no controllers: its Deployments and budgets are stored, never acted on, and it has
no eviction API (docs/design/test-worlds.md). So binding and the charge are tested in both
worlds, the controllers where they run."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.sandbox.conftest import PARKED_NODE, PAUSE_IMAGE, wait_for
from tests.sandbox.test_conformance_kubelet import (
    conditions,
    cpu_used,
    deferred,
    millis,
    pod,
    resize_cpu,
    start,
)


def kubelet_nodes(core: client.CoreV1Api) -> dict[str, int]:
    """The nodes a kubelet runs (Ready, schedulable), each with its allocatable cpu."""
    return {
        n.metadata.name: millis(n.status.allocatable["cpu"])
        for n in core.list_node().items
        if not n.spec.taints
        and not n.spec.unschedulable
        and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }


def fill(core: client.CoreV1Api, ns: str, node: str, cpu: int, leave: int) -> str:
    """A pod pinned to `node` that takes its free cpu but `leave` millicores: its name."""
    name = f"filler-{node}"
    free = cpu - cpu_used(core, node)
    assert free - leave > 0, f"node {node} has only {free}m free"
    start(core, ns, pod(name, f"{free - leave}m", node=node))
    return name


def pod_events(core: client.CoreV1Api, ns: str, name: str) -> list[client.CoreV1Event]:
    return list(core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items)


def running(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod | None:
    p = core.read_namespaced_pod(name, ns)
    return p if p.status.phase == "Running" else None


def unschedulable(core: client.CoreV1Api, ns: str, name: str) -> client.V1PodCondition | None:
    c = conditions(core.read_namespaced_pod(name, ns)).get("PodScheduled")
    return c if c is not None and (c.status, c.reason) == ("False", "Unschedulable") else None


# --- binding, in both worlds ------------------------------------------------------------------
def test_a_pod_is_bound_to_a_node_a_kubelet_runs(
    core: client.CoreV1Api, ns: str, world: str
) -> None:
    core.create_namespaced_pod(ns, pod("p", "100m"))
    p = wait_for(lambda: running(core, ns, "p"), 60)
    assert p.spec.node_name in kubelet_nodes(core)
    assert p.spec.node_name != PARKED_NODE  # tainted: no scheduler binds a pod there
    assert conditions(p)["PodScheduled"].status == "True"
    if world == "sandbox":
        return  # the kubelet simulator bound it, first fit, and posts no Event for that
    (scheduled,) = wait_for(
        lambda: [e for e in pod_events(core, ns, "p") if e.reason == "Scheduled"]
    )
    assert scheduled.reporting_component == "default-scheduler", scheduled
    assert scheduled.message == f"Successfully assigned {ns}/p to {p.spec.node_name}"


def test_a_pod_that_fits_no_node_waits_and_is_bound_once_room_frees(
    core: client.CoreV1Api, ns: str
) -> None:
    nodes = kubelet_nodes(core)
    fillers = {node: fill(core, ns, node, cpu, leave=500) for node, cpu in nodes.items()}
    core.create_namespaced_pod(ns, pod("big", "1000m"))
    waiting = wait_for(lambda: unschedulable(core, ns, "big"), 30)
    # "0/2 nodes are available: 2 Insufficient cpu." (the real scheduler names the parked
    # node's taint too, and what preemption would do)
    assert f"{len(nodes)} Insufficient cpu" in waiting.message, waiting.message
    freed = sorted(nodes)[0]
    core.delete_namespaced_pod(fillers[freed], ns, grace_period_seconds=0)
    p = wait_for(lambda: running(core, ns, "big"), 60)
    assert p.spec.node_name == freed


def test_a_deferred_grow_holds_its_room_until_it_is_reverted(
    core: client.CoreV1Api, ns: str
) -> None:
    """KEP-1287: the scheduler charges a pod being resized the larger of its desired and
    allocated requests. A grow the node has no room for is Deferred, and the room the
    node has left (300m by what the kubelet allocated) is not the scheduler's to give: a
    200m pod waits. Reverted, the grow's charge goes, and the pod is bound there."""
    nodes = kubelet_nodes(core)
    node = sorted(nodes)[0]
    start(core, ns, pod("grows", "500m", node=node))
    fill(core, ns, node, nodes[node], leave=300)
    for other, cpu in nodes.items():  # no room anywhere else
        if other != node:
            fill(core, ns, other, cpu, leave=0)
    resize_cpu(core, ns, "grows", "1500m")
    wait_for(lambda: deferred(core, ns, "grows"), 30)
    core.create_namespaced_pod(ns, pod("small", "200m"))
    wait_for(lambda: unschedulable(core, ns, "small"), 30)
    assert core.read_namespaced_pod("small", ns).spec.node_name is None

    resize_cpu(core, ns, "grows", "500m")  # the grow given up: its room is free again
    p = wait_for(lambda: running(core, ns, "small"), 60)
    assert p.spec.node_name == node
    # the kubelet may start `small` before it writes that the revert ended the deferral
    wait_for(lambda: deferred(core, ns, "grows") is None, 30)


# --- the controllers, where they run ----------------------------------------------------------
@pytest.fixture
def controllers(world: str) -> None:
    if world == "sandbox":
        pytest.skip("the embedded world runs no controller manager (docs/design/test-worlds.md)")


def deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c0",
                            "image": PAUSE_IMAGE,
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ],
                },
            },
        },
    }


def owners(obj: Any) -> list[tuple[str, str, bool]]:
    return [(o.kind, o.name, bool(o.controller)) for o in obj.metadata.owner_references or []]


def test_a_deployments_pods_come_from_its_replicaset_and_go_with_it(
    kube: client.ApiClient, core: client.CoreV1Api, ns: str, controllers: None
) -> None:
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(ns, deployment("web", replicas=2))

    def rolled_out() -> client.V1Deployment | None:
        d = apps.read_namespaced_deployment("web", ns)
        return d if d.status.available_replicas == 2 else None

    available = wait_for(rolled_out, 60)
    assert available.status.observed_generation == available.metadata.generation
    (rs,) = apps.list_namespaced_replica_set(ns).items
    assert owners(rs) == [("Deployment", "web", True)]
    assert rs.status.ready_replicas == 2
    pods = core.list_namespaced_pod(ns, label_selector="app=web").items
    assert len(pods) == 2
    for p in pods:
        assert owners(p) == [("ReplicaSet", rs.metadata.name, True)]
        assert p.metadata.name.startswith(f"{rs.metadata.name}-")
        assert p.status.phase == "Running" and p.spec.node_name in kubelet_nodes(core)

    apps.delete_namespaced_deployment("web", ns)  # background: the collector does the rest
    wait_for(lambda: not apps.list_namespaced_replica_set(ns).items, 60)
    wait_for(lambda: not core.list_namespaced_pod(ns, label_selector="app=web").items, 60)


def test_an_owned_object_is_garbage_collected_after_its_owner(
    core: client.CoreV1Api, ns: str, controllers: None
) -> None:
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "owned", "ownerReferences": [reference]}}
    )
    core.create_namespaced_config_map(ns, {"metadata": {"name": "unowned"}})
    core.delete_namespaced_config_map("owner", ns)

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("owned", ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 60)
    assert core.read_namespaced_config_map("unowned", ns).metadata.name == "unowned"


def test_a_pdb_gets_its_status_and_the_eviction_api_obeys_it(
    kube: client.ApiClient, core: client.CoreV1Api, ns: str, controllers: None
) -> None:
    """Two pods, a budget of `minAvailable: 1`: the disruption controller counts them
    (both healthy, one disruption allowed); one eviction goes through, and the next is
    refused (429) while only one is left."""
    policy = client.PolicyV1Api(kube)
    for name in ("a", "b"):
        start(core, ns, {**pod(name, "100m"), "metadata": {"name": name, "labels": {"app": "b"}}})
    policy.create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "budget"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "b"}}},
        },
    )

    def counted() -> Any:
        pdb = policy.read_namespaced_pod_disruption_budget("budget", ns)
        return pdb.status.observed_generation == pdb.metadata.generation and pdb

    status = wait_for(counted, 60).status
    assert (status.expected_pods, status.current_healthy, status.desired_healthy) == (2, 2, 1)
    assert status.disruptions_allowed == 1

    def evict(name: str) -> None:
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
        core.create_namespaced_pod_eviction(name, ns, eviction)

    evict("a")
    with pytest.raises(ApiException) as refused:
        evict("b")
    assert refused.value.status == 429
    assert "disruption budget" in str(refused.value.body)
    wait_for(lambda: not [p for p in core.list_namespaced_pod(ns).items if p.metadata.name == "a"])

    def one_healthy() -> Any:
        status = policy.read_namespaced_pod_disruption_budget("budget", ns).status
        return status.current_healthy == 1 and status

    assert wait_for(one_healthy, 60).disruptions_allowed == 0
