"""A real node autoscaler in the real world (issue #44 item 2): Karpenter v1.15 with its
kwok cloud provider, built from its Go module, started once per world by the first test
that needs it (`RealControlPlane.start_karpenter`).

A pod that fits no node waits `Unschedulable` (kube-scheduler); Karpenter sees it, makes
a NodeClaim of the cheapest kwok instance type it fits, and creates its Node; the kubelet
simulator adopts the Node (Ready, allocatable as Karpenter set it); Karpenter registers
and initializes it (its `unregistered` taint lifted); kube-scheduler binds the pod there,
and the kubelet simulator runs it.

That test runs in the real world only: the embedded world has no node autoscaler, and
nothing there ever makes a node for a pod (docs/design/test-worlds.md). The kubelet simulator's
side (adopting such a Node, running it at Karpenter's size, letting it go) is also
checked on its own, on the embedded store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raysize.sandbox import karpenter
from raysize.sandbox.kubelet import Kubelet, KubeletTiming, NodeSpec
from raysize.sandbox.realworld import RealSandbox
from raysize.sandbox.store import Store
from tests.sandbox.conftest import wait_for
from tests.sandbox.test_conformance_kubelet import pod
from tests.sandbox.test_scheduler_and_controllers import kubelet_nodes, pod_events, running

KARPENTER = ("karpenter.sh", "v1")


@pytest.fixture
def started(world: str, world_sandbox: Any) -> RealSandbox:
    """Karpenter on the real world (started by the first test that asks; it runs until
    the world closes, stopped by its process group)."""
    if world != "real":
        pytest.skip("only the real world runs a node autoscaler (docs/design/test-worlds.md)")
    assert isinstance(world_sandbox, RealSandbox)
    world_sandbox.start_karpenter()
    return world_sandbox


def karpenters_nodes(core: client.CoreV1Api) -> list[client.V1Node]:
    return [n for n in core.list_node().items if karpenter.made_by_karpenter(n.to_dict())]


@pytest.fixture
def node_pool(kube: client.ApiClient, started: RealSandbox) -> Iterator[str]:
    """A NodePool of the kwok instance types for one test; deleted after it, with its
    nodes (Karpenter drains and deletes them; the kubelet simulator lets them go), so
    later tests' pending pods make no node."""
    co = client.CustomObjectsApi(kube)
    name = "test-pool"
    assert started.kubelet is not None
    errors = len(started.kubelet.errors)
    co.create_cluster_custom_object(*KARPENTER, "nodepools", karpenter.node_pool(name))
    try:
        # until Karpenter has judged it (its NodeClass found Ready): a pod pending before
        # that is passed over ("ignoring nodepool, not ready") and tried again 10 s later
        wait_for(
            lambda: (
                "Ready"
                in true_conditions(co.get_cluster_custom_object(*KARPENTER, "nodepools", name))
            ),
            30,
            interval=0.1,
        )
        yield name
    finally:
        # its NodeClaims first (Karpenter drains and deletes their nodes), then the pool:
        # a NodeClaim left without its NodePool is an error on every reconcile until gone
        co.delete_collection_cluster_custom_object(
            *KARPENTER, "nodeclaims", label_selector=f"karpenter.sh/nodepool={name}"
        )
        core = client.CoreV1Api(kube)
        wait_for(lambda: not karpenters_nodes(core), 60, interval=0.2)
        wait_for(lambda: not node_claims(kube), 60, interval=0.2)
        co.delete_cluster_custom_object(*KARPENTER, "nodepools", name)
        # the kubelet simulator adopted, ran and let go of the nodes without a fault
        assert started.kubelet.errors[errors:] == []

        def pool_gone() -> bool:
            try:
                co.get_cluster_custom_object(*KARPENTER, "nodepools", name)
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(pool_gone, 60, interval=0.2)


def node_claims(kube: client.ApiClient) -> list[dict[str, Any]]:
    co = client.CustomObjectsApi(kube)
    return list(co.list_cluster_custom_object(*KARPENTER, "nodeclaims")["items"])


def true_conditions(obj: dict[str, Any]) -> set[str]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return {c["type"] for c in conditions if c["status"] == "True"}


def test_a_pod_that_fits_no_node_gets_one_from_karpenter_and_runs_there(
    kube: client.ApiClient, core: client.CoreV1Api, node_pool: str, ns: str
) -> None:
    before = kubelet_nodes(core)  # 8 CPU each: a 10-CPU pod fits none of them
    assert before and max(before.values()) < 10_000, before
    big = pod("big", "10")
    core.create_namespaced_pod(ns, big)

    p = wait_for(lambda: running(core, ns, "big"), 60, interval=0.1)
    node = core.read_node(p.spec.node_name)
    assert node.metadata.name not in before
    assert karpenter.made_by_karpenter(node.to_dict())

    # Karpenter's cheapest instance type for 10 CPU of the three (4, 8 and 16 CPU)
    labels = node.metadata.labels
    assert labels["karpenter.sh/nodepool"] == node_pool
    assert labels["node.kubernetes.io/instance-type"] == "s-16x-amd64-linux"
    assert labels["karpenter.sh/registered"] == "true"
    assert labels["karpenter.sh/initialized"] == "true"
    (claim,) = [c for c in node_claims(kube) if c["status"].get("nodeName") == node.metadata.name]
    assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == node_pool
    assert {"Launched", "Registered", "Initialized"} <= true_conditions(claim), claim["status"]
    # the kubelet simulator's: Ready, at the allocatable Karpenter gave the Node (the
    # instance type's 16 CPU less its kube-reserved 100m), not a size of its own
    ready = {c.type: c for c in node.status.conditions}["Ready"]
    assert (ready.status, ready.reason) == ("True", "KubeletReady")
    assert node.status.allocatable["cpu"] == claim["status"]["allocatable"]["cpu"] == "15900m"
    assert node.status.allocatable["memory"] == claim["status"]["allocatable"]["memory"]
    assert not [t for t in node.spec.taints or [] if t.key == "karpenter.sh/unregistered"]

    # it waited for room first (kube-scheduler), and Karpenter nominated a node for it
    def told() -> set[tuple[str, str]]:
        seen = {
            (e.reason, e.reporting_component or (e.source and e.source.component) or "")
            for e in pod_events(core, ns, "big")
        }
        return (
            seen
            if {"FailedScheduling", "Nominated", "Scheduled"} <= {r for r, _ in seen}
            else set()
        )

    events = wait_for(told, 30)
    assert ("FailedScheduling", "default-scheduler") in events, events
    assert ("Scheduled", "default-scheduler") in events, events
    assert ("Nominated", "karpenter") in events, events


# --- the kubelet simulator's side, on its own (no world, no Karpenter) --------------------------
def kwok_node(name: str) -> dict[str, Any]:
    """A Node as Karpenter's kwok provider creates it (`toNode`): marked as kwok's,
    tainted `unregistered`, its capacity the NodeClaim's requests and its allocatable the
    instance type's, `Pending`."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {karpenter.KWOK_NODE_KEY: karpenter.KWOK_NODE_VALUE},
            "annotations": {karpenter.KWOK_NODE_KEY: karpenter.KWOK_NODE_VALUE},
        },
        "spec": {
            "providerID": f"kwok://{name}",
            "taints": [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}],
        },
        "status": {
            "capacity": {"cpu": "10", "memory": "64Mi", "pods": "1"},
            "allocatable": {"cpu": "3900m", "memory": "16374Mi", "pods": "110"},
            "phase": "Pending",
        },
    }


def bound_pod(name: str, node: str, cpu: str = "3") -> dict[str, Any]:
    body = pod(name, cpu, node=node)
    body["metadata"]["namespace"] = "default"
    body["status"] = {"phase": "Pending"}
    return body


def test_the_kubelet_simulator_runs_the_nodes_karpenter_makes_and_lets_them_go() -> None:
    """Adopted from the Node's first event, pods bound to it before included; its status
    posted (Ready, Karpenter's capacity and allocatable kept); its allocatable is what its
    pods are admitted against; deleted, it is let go. A Node that is not kwok's is not
    touched."""
    store = Store()
    kubelet = Kubelet(
        store,
        [NodeSpec("own", cpu=8000, memory=16 * 1024**3)],
        KubeletTiming(),
        schedules=False,
        adopts=karpenter.made_by_karpenter,
    ).start()
    try:
        store.create("pods", "default", bound_pod("early", "kwok-a"))  # bound first
        store.create("nodes", "", kwok_node("kwok-a"))
        other = {**kwok_node("other"), "metadata": {"name": "other"}}  # not kwok's
        store.create("nodes", "", other)

        def phase(name: str) -> str:
            return str(store.get("pods", "default", name)["status"]["phase"])

        wait_for(lambda: phase("early") == "Running")
        node = store.get("nodes", "", "kwok-a")
        (ready,) = node["status"]["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == (
            "Ready",
            "True",
            "KubeletReady",
        )
        assert node["status"]["capacity"] == kwok_node("kwok-a")["status"]["capacity"]
        assert node["status"]["allocatable"] == kwok_node("kwok-a")["status"]["allocatable"]
        assert node["status"]["phase"] == "Running"
        assert "conditions" not in store.get("nodes", "", "other")["status"]

        # sized by its allocatable: with 3 CPU of its 3900m taken, a grow of another pod
        # from 500m to 1 CPU waits for room
        store.create("pods", "default", bound_pod("late", "kwok-a", "500m"))
        wait_for(lambda: phase("late") == "Running")

        def grow(p: dict[str, Any]) -> dict[str, Any]:
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
            p["metadata"]["generation"] = p["metadata"].get("generation", 1) + 1
            return p

        store.update("pods", "default", "late", grow)

        def pending() -> Any:
            conditions = store.get("pods", "default", "late")["status"].get("conditions") or []
            return next((c for c in conditions if c["type"] == "PodResizePending"), None)

        deferred = wait_for(pending)
        assert deferred["reason"] == "Deferred", deferred
        assert deferred["message"].endswith("requested: 1000, used: 3000, capacity: 3900")

        store.remove("nodes", "", "kwok-a")
        wait_for(lambda: "kwok-a" not in kubelet.nodes)
        assert kubelet.errors == []
    finally:
        kubelet.stop()
