"""RAYSIZE_CLUSTER_NAME: one Kubernetes cluster's workflows, queue and search attribute
apart from another's in one Temporal namespace (tests/e2e/test_two_kube_clusters.py runs
two of them)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from raysize.worker.run import reconcile_input
from raysize.worker.settings import Settings
from raysize.workflows.contracts import ResizeRequest
from raysize.workflows.naming import (
    KUBE_CLUSTER,
    SEARCH_ATTRIBUTES,
    kube_cluster_query,
    reconcile_search_attributes,
    reconcile_workflow_id,
    resize_search_attributes,
    resize_workflow_id,
)


def test_unnamed_keeps_the_ids_queue_and_attributes_of_0_1() -> None:
    settings = Settings()
    assert settings.cluster_name == "" and settings.task_queue == "raysize"
    inp = reconcile_input(settings)("ns", "demo")
    assert reconcile_workflow_id(inp.namespace, inp.cluster, inp.kube_cluster) == (
        "reconcile/ns/demo"
    )
    assert resize_workflow_id("ns", "pod-1", inp.kube_cluster) == "resize/ns/pod-1"
    assert reconcile_search_attributes("ns", "demo").get(KUBE_CLUSTER) is None
    assert kube_cluster_query("") == "KubeCluster IS NULL"


def test_a_named_cluster_scopes_ids_queue_and_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSIZE_CLUSTER_NAME", "prod-eu1")
    settings = Settings()
    assert settings.task_queue == "raysize-prod-eu1"  # activities run in their own cluster
    inp = reconcile_input(settings)("ns", "demo")
    assert inp.kube_cluster == "prod-eu1"
    assert reconcile_workflow_id("ns", "demo", "prod-eu1") == "reconcile/prod-eu1/ns/demo"
    assert resize_workflow_id("ns", "p", "prod-eu1") == "resize/prod-eu1/ns/p"
    attrs = reconcile_search_attributes("ns", "demo", "prod-eu1")
    assert attrs.get(KUBE_CLUSTER) == "prod-eu1"
    req = ResizeRequest(
        namespace="ns", cluster="demo", pod="p", group="g", node_id="n", from_cpu=1000,
        from_memory=1, cpu=2000, memory=1, timeout_s=60, kube_cluster="prod-eu1",
    )  # fmt: skip
    assert resize_search_attributes(req).get(KUBE_CLUSTER) == "prod-eu1"
    assert KUBE_CLUSTER in SEARCH_ATTRIBUTES  # registered by the worker at start
    assert kube_cluster_query("prod-eu1") == "KubeCluster = 'prod-eu1'"
    # an explicit queue wins
    monkeypatch.setenv("RAYSIZE_TASK_QUEUE", "mine")
    assert Settings().task_queue == "mine"


@pytest.mark.parametrize("bad", ["Prod", "a/b", "-x", "x-", "a b", "x" * 64, "it's"])
def test_a_cluster_name_that_is_no_dns_label_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(cluster_name=bad)
    text = str(err.value)
    assert "cluster_name" in text and "DNS label" in text and "prod-eu1" in text
