"""What the worker keeps per Ray cluster is freed when the cluster is deleted (#43 item 6b):
its GCS client (closed), its GCS address and token source, its Secret's cached token, the
pod watch's marks of it; a client replaced (the cluster's address or token changed) is
closed; a cluster no activity worked for in IDLE_FORGET_S is forgotten. The embedded
sandbox (its KubeRay stand-in makes the token Secret and deletes a deleted cluster's pods)
and a GCS stand-in per cluster."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from kubernetes import client
from temporalio.testing import ActivityEnvironment

from bench.clusters import small_raycluster
from raysize.activities.cluster import IDLE_FORGET_S, SWEEP_EVERY_S, ClusterActivities
from raysize.activities.k8s import Kube
from raysize.sandbox.gcs_standin import GcsStandIn
from raysize.workflows.contracts import ObserveInput, WaitInput

from .conftest import client_for, wait_for

NS = "tenants"


def per_cluster(acts: ClusterActivities) -> dict[str, int]:
    """Every per-cluster map of the worker, by its own name (each exists before the fix)."""
    assert acts.pods is not None and acts.tokens is not None
    return {
        "clients": len(acts._clients),
        "addresses": len(acts._addresses),
        "sources": len(acts._sources),
        "token cache": len(acts.tokens._cache),
        "RayCluster marks": len(acts.pods._cluster_marks),
        "pod changes": len(acts.pods._cluster_changes),
        "pods by cluster": len(acts.pods._by_cluster),
        "subscriptions": len(acts.pods._subs),
    }


@pytest.fixture
def world(make_sandbox, tmp_path) -> Iterator[tuple[client.ApiClient, ClusterActivities]]:
    sb = make_sandbox()
    api = client_for(sb, tmp_path)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
    acts = ClusterActivities(kube=Kube(api, timeout_s=5.0))
    try:
        yield api, acts
    finally:
        acts.close()
        acts.targets.close()
        api.close()


def observe(acts: ClusterActivities, cluster: str, address: str) -> Any:
    """The loop's observe activity (read and plan): its tick."""
    inp = ObserveInput(namespace=NS, cluster=cluster, gcs_address=address)
    return asyncio.run(ActivityEnvironment().run(acts.observe_cluster, inp))


def test_a_deleted_cluster_leaves_nothing_behind(world) -> None:
    api, acts = world
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    tokened = small_raycluster("t0")
    tokened["spec"]["rayVersion"] = "2.60.0"
    tokened["spec"]["authOptions"] = {"mode": "token"}  # KubeRay's Secret `t0`
    for rc in (tokened, small_raycluster("p1"), small_raycluster("p2")):
        custom.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)
    secret = wait_for(lambda: _secret(core, "t0"), 30)
    token = base64.b64decode(secret.data["auth_token"]).decode()
    wait_for(lambda: len(core.list_namespaced_pod(NS).items) == 6, 30)  # a head and a worker
    with ExitStack() as stack:
        gcs = {
            name: stack.enter_context(GcsStandIn(token=token if name == "t0" else None))
            for name in ("t0", "p1", "p2")
        }
        for name, stand_in in gcs.items():
            assert observe(acts, name, stand_in.address).found
        # a wait listens to a cluster's pods (and reads its GCS) meanwhile
        wait = WaitInput(
            namespace=NS, cluster="p1", gcs_address=gcs["p1"].address, gcs_version=0,
            pods_version="", timeout_s=0.5,
        )  # fmt: skip
        asyncio.run(ActivityEnvironment().run(acts.wait_for_change, wait))
        held = dict(acts._clients)
        assert per_cluster(acts)["clients"] == 3
        assert per_cluster(acts)["token cache"] == 1
        assert per_cluster(acts)["RayCluster marks"] == 3

        # deleted: the RayCluster watch tells the worker; the loop's observe finds it gone
        for name in ("t0", "p1"):
            custom.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", name)
        assert not observe(acts, "t0", gcs["t0"].address).found
        wait_for(lambda: per_cluster(acts)["pods by cluster"] == 1, 30)  # their pods gone too
        wait_for(lambda: per_cluster(acts)["clients"] == 1, 30)
        assert per_cluster(acts) == {
            "clients": 1,
            "addresses": 1,
            "sources": 1,
            "token cache": 0,
            "RayCluster marks": 1,
            "pod changes": 0,
            "pods by cluster": 1,
            "subscriptions": 0,
        }
        closed = {address for (address, _), c in held.items() if getattr(c, "closed", False)}
        assert closed == {gcs["t0"].address, gcs["p1"].address}

        # the last one: nothing at all is left
        custom.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", "p2")
        assert not observe(acts, "p2", gcs["p2"].address).found
        wait_for(lambda: per_cluster(acts)["pods by cluster"] == 0, 30)
        assert set(per_cluster(acts).values()) == {0}
        assert not getattr(acts, "_used", {})
        assert all(getattr(c, "closed", False) for c in held.values())


def test_a_replaced_client_is_closed(world) -> None:
    """The cluster's GCS moved (another address): a new client, and the old one closed."""
    api, acts = world
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "ray.io", "v1", NS, "rayclusters", small_raycluster("moves")
    )
    with GcsStandIn() as before, GcsStandIn() as after:
        assert observe(acts, "moves", before.address).found
        (old,) = acts._clients.values()
        assert observe(acts, "moves", after.address).found
        assert [address for address, _ in acts._clients] == [after.address]
        assert getattr(old, "closed", False)


def test_a_cluster_no_activity_works_for_is_forgotten(world) -> None:
    """The safety net: a cluster another worker saw deleted, or no longer managed, is
    forgotten once idle for IDLE_FORGET_S (a fake clock)."""
    api, acts = world
    now = [1000.0]
    acts.clock = lambda: now[0]
    acts._swept = now[0]
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "ray.io", "v1", NS, "rayclusters", small_raycluster("idle")
    )
    with GcsStandIn() as gcs:
        assert observe(acts, "idle", gcs.address).found
        (held,) = acts._clients.values()
        now[0] += IDLE_FORGET_S + SWEEP_EVERY_S
        # any activity for another cluster looks for idle ones
        assert not observe(acts, "never-made", gcs.address).found
    assert per_cluster(acts)["clients"] == 0
    assert per_cluster(acts)["addresses"] == per_cluster(acts)["sources"] == 0
    assert getattr(held, "closed", False)


def _secret(core: client.CoreV1Api, name: str) -> Any:
    try:
        return core.read_namespaced_secret(name, NS)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise
