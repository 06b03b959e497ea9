"""Launching at size (issue #44 item 3): the `raysize-launch-size` MutatingAdmissionPolicy
(deploy/components/launch-size) sets a new KubeRay worker pod's Ray container to the size
raysize wrote for its cluster and group (`Kube.write_launch_sizes`), as the API server
admits the pod. In the real world the API server runs the policy's CEL; the embedded
server does what it says (sandbox/launch_size.py). Both must agree, on the same pods."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raysize.activities.k8s import Kube
from raysize.activities.k8s_objects import LAUNCH_SIZES_CONFIGMAP, launch_size_entries
from raysize.workflows.resources import GIB
from tests.deploy.conftest import DEPLOY, run_kubectl
from tests.sandbox.conftest import pod_body, wait_for

POLICY = DEPLOY / "components" / "launch-size" / "policy.yaml"
RAY = {"app.kubernetes.io/created-by": "kuberay-operator"}
TEMPLATE = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def ray_pod(name: str, cluster: str, group: str = "small", node_type: str = "worker") -> Any:
    labels = {**RAY, "ray.io/cluster": cluster, "ray.io/group": group}
    labels["ray.io/node-type"] = node_type
    return pod_body(name, labels=labels, **TEMPLATE)


def sized(core: client.CoreV1Api, ns: str, body: Any) -> dict[str, dict[str, str]]:
    made = core.create_namespaced_pod(ns, body)
    res = made.spec.containers[0].resources
    return {"requests": dict(res.requests or {}), "limits": dict(res.limits or {})}


@pytest.fixture(scope="package")
def policy(world: str, kubeconfig: str) -> Iterator[None]:
    """deploy/'s policy, in the real world (the embedded server always applies it)."""
    if world == "sandbox":
        yield
        return
    applied = run_kubectl("apply", "-f", str(POLICY), kubeconfig=Path(kubeconfig))
    assert applied.returncode == 0, applied.stderr
    yield


@pytest.fixture
def raysize_kube(kubeconfig: str) -> Kube:
    return Kube.from_kubeconfig(kubeconfig)


def test_a_new_worker_pod_starts_at_the_size_raysize_wrote_for_its_group(
    core: client.CoreV1Api, ns: str, policy: None, raysize_kube: Kube
) -> None:
    template = {"spec": {"containers": [{"name": "ray-worker", "resources": TEMPLATE}]}}
    raysize_kube.write_launch_sizes(ns, "c1", {"small": (template, (3000, 2 * GIB))})
    want = {
        "requests": {"cpu": "3", "memory": "2Gi"},
        "limits": {"cpu": "3", "memory": "2Gi"},
    }

    # the real server's policy is in force a moment after it is created: probe until then
    def probe() -> bool:
        name = f"probe-{uuid.uuid4().hex[:6]}"
        got = sized(core, ns, ray_pod(name, "c1"))
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        return got == want

    wait_for(probe, timeout=30, interval=0.5)
    assert sized(core, ns, ray_pod("w1", "c1")) == want
    # another cluster, another group, a head pod, a pod KubeRay did not make: as they are
    template_size = {k: dict(v) for k, v in TEMPLATE.items()}
    assert sized(core, ns, ray_pod("w2", "c2")) == template_size
    assert sized(core, ns, ray_pod("w3", "c1", group="big")) == template_size
    assert sized(core, ns, ray_pod("h1", "c1", node_type="head")) == template_size
    other = ray_pod("x1", "c1")
    del other["metadata"]["labels"]["app.kubernetes.io/created-by"]
    assert sized(core, ns, other) == template_size
    # back to the template: the keys go, and so does the size
    raysize_kube.write_launch_sizes(ns, "c1", {"small": (template, None)})
    cm = core.read_namespaced_config_map(LAUNCH_SIZES_CONFIGMAP, ns)
    assert not cm.data, cm.data
    assert sized(core, ns, ray_pod("w4", "c1")) == template_size


def test_a_namespace_without_sizes_is_left_alone(
    core: client.CoreV1Api, ns: str, policy: None
) -> None:
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map(LAUNCH_SIZES_CONFIGMAP, ns)
    assert err.value.status == 404
    assert sized(core, ns, ray_pod("w1", "c1")) == {k: dict(v) for k, v in TEMPLATE.items()}


def test_launch_entries_keep_the_limit_request_gap() -> None:
    # a template with a 500m CPU gap between limit and request, memory requested only
    template = {
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"cpu": "1500m"},
                    },
                }
            ]
        }
    }
    got = launch_size_entries("c", "g", template, (3000, 2 * GIB))
    assert got == {
        "c.g.requests.cpu": "2500m",
        "c.g.limits.cpu": "3",
        "c.g.requests.memory": "2Gi",
        "c.g.limits.memory": None,
    }
    assert set(launch_size_entries("c", "g", template, None).values()) == {None}


def test_the_chart_ships_the_same_policy_file() -> None:
    chart_copy = DEPLOY / "helm" / "raysize" / "files" / "launch-size-policy.yaml"
    assert chart_copy.read_text() == POLICY.read_text()
