"""The RayClusters the benchmarks (and the end-to-end tests) run: a CPU-less head and one
group `small` of 1-CPU/1Gi workers that may grow in place to 4 CPU/4Gi (`ray.io/ippr`)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from raysize.worker.demo_scenarios import ray_pod_template


def small_raycluster(
    name: str,
    *,
    workers: int = 1,
    max_workers: int | None = None,
    resize_timeout_s: int = 60,
    idle_timeout_s: int | None = None,
) -> dict[str, Any]:
    """`workers` pods (and at least that many: minReplicas), at most `max_workers`."""
    container = {
        "name": "ray-worker",
        "image": "rayproject/ray:2.60.0",
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
    }
    head = {**container, "resources": {"requests": {"cpu": "0", "memory": "1Gi"}}}
    ippr = {
        "groups": {
            "small": {"max-cpu": "4", "max-memory": "4Gi", "resize-timeout": resize_timeout_s}
        }
    }
    spec: dict[str, Any] = {
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [head]}}},
        "workerGroupSpecs": [
            {
                "groupName": "small",
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers if max_workers is None else max_workers,
                "rayStartParams": {},
                "template": {"spec": {"containers": [container]}},
            }
        ],
    }
    if idle_timeout_s is not None:
        spec["autoscalerOptions"] = {"idleTimeoutSeconds": idle_timeout_s}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "annotations": {"ray.io/ippr": json.dumps(ippr)}},
        "spec": spec,
    }


def ippr_cluster(
    name: str = "demo",
    *,
    replicas: int = 1,
    cpu: str = "1",
    memory: str = "1Gi",
    max_cpu: str = "4",
    max_memory: str = "4Gi",
    timeout_s: int = 30,
    max_replicas: int = 4,
    idle_timeout_s: int | None = None,
) -> dict[str, Any]:
    template = ray_pod_template
    options = {} if idle_timeout_s is None else {"idleTimeoutSeconds": idle_timeout_s}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "annotations": {
                "ray.io/ippr": json.dumps(
                    {
                        "groups": {
                            "small": {
                                "max-cpu": max_cpu,
                                "max-memory": max_memory,
                                "resize-timeout": timeout_s,
                            }
                        }
                    }
                )
            },
        },
        "spec": {
            "autoscalerOptions": options,
            # no tasks on the head: KubeRay passes num-cpus through, not a "0" CPU limit
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": template("0", "1Gi"),
            },
            "workerGroupSpecs": [
                {
                    "groupName": "small",
                    "replicas": replicas,
                    "minReplicas": 0,
                    "maxReplicas": max_replicas,
                    "rayStartParams": {},
                    "template": template(cpu, memory),
                    "scaleStrategy": {"workersToDelete": []},
                }
            ],
        },
    }


class KubeApis:
    """The typed clients of `api` (an API server's `ApiClient`, which a subclass has):
    for the benchmarks' and the end-to-end tests' worlds."""

    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)
