"""A slow observe says where its time went, in both worlds: the Kubernetes read (pods
from the watch or listed), Ray's state, the plan. The scale benchmark's 5,000-pod quiet
ticks took up to 3 s with a plan of 0.4 s, and nothing said what the rest was."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from kubernetes import client
from temporalio.testing import ActivityEnvironment

from raysize.activities import cluster as cluster_activities
from raysize.activities.cluster import ClusterActivities
from raysize.activities.k8s import Kube
from raysize.sandbox import ray_standin
from raysize.sandbox.ray_standin import RayStandIn
from raysize.workflows.contracts import ObserveInput
from tests.sandbox.test_kubectl_and_operator import raycluster


def ippr_raycluster() -> dict[str, Any]:
    rc = raycluster("slow", replicas=0)
    rc["metadata"]["annotations"] = {
        "ray.io/ippr": json.dumps(
            {"groups": {"small": {"max-cpu": "2", "max-memory": "2Gi", "resize-timeout": 60}}}
        )
    }
    return rc


async def test_a_slow_observe_says_where_its_time_went(
    kube: client.ApiClient,
    ns: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", ippr_raycluster()
    )
    answer = ray_standin._Autoscaler.GetClusterResourceState
    delay = [0.0]

    def slow(self: Any, request: Any, context: Any) -> Any:
        time.sleep(delay[0])
        return answer(self, request, context)

    monkeypatch.setattr(ray_standin._Autoscaler, "GetClusterResourceState", slow)
    acts = ClusterActivities(kube=Kube(kube, timeout_s=10.0))
    try:
        with RayStandIn() as ray, caplog.at_level(logging.INFO, "raysize.activities"):
            inp = ObserveInput(namespace=ns, cluster="slow", gcs_address=ray.address)
            tick = await ActivityEnvironment().run(acts.observe_cluster, inp)
            assert tick.plan is not None  # Ray was read and a plan made
            fast = [r for r in caplog.records if "observe took" in r.getMessage()]
            assert fast == []  # a quick observe says nothing
            delay[0] = cluster_activities.SLOW_OBSERVE_S + 0.2
            await ActivityEnvironment().run(acts.observe_cluster, inp)
    finally:
        assert acts.pods is not None
        acts.pods.close()
        acts.targets.close()
    said = [r.getMessage() for r in caplog.records if "observe took" in r.getMessage()]
    assert len(said) == 1, said
    line = said[0]
    assert line.startswith(f"{ns}/slow: observe took "), line
    ray_s = float(line.split("Ray ")[1].split(" s")[0])
    assert ray_s >= delay[0], line  # the time is Ray's, and the line says so
    assert "Kubernetes " in line and "plan " in line
    assert "pods from the watch" in line or "pods listed" in line
