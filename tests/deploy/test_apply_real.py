"""deploy/ on the real world: kube-apiserver v1.36 with RBAC enforced, the real KubeRay
operator, and the worker's own ServiceAccount token. The real server is the judge of what
the rules in deploy/base/rbac.yaml allow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from activities.k8s import Kube
from activities.k8s_errors import Forbidden
from sandbox.cluster import SandboxConfig
from sandbox.kubelet import KubeletTiming
from sandbox.realworld import RealSandbox
from tests.deploy.conftest import DEPLOY, EXAMPLE, SA_USER, render, run_kubectl
from tests.deploy.test_apply_sandbox import NOT_RAYSIZES_CALLS, does_what_raysize_does
from tests.sandbox.conftest import wait_for
from workflows.resources import GIB


class World:
    def __init__(self, sb: RealSandbox, admin: Path, worker: Path) -> None:
        self.sb, self.admin, self.worker = sb, admin, worker

    def kubectl(self, *args: str) -> Any:
        return run_kubectl(*args, kubeconfig=self.admin)

    def worker_kube(self) -> Kube:
        return Kube(config.new_client_from_config(config_file=str(self.worker)), timeout_s=5.0)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """deploy/ and the example RayCluster applied as admin; KubeRay made the pods and the
    kubelet runs them. `worker` is a kubeconfig with the raysize ServiceAccount's token."""
    tmp = tmp_path_factory.mktemp("real")
    sb = RealSandbox(SandboxConfig(nodes=1, timing=KubeletTiming(actuation_delay_s=0.0))).start()
    try:
        admin = sb.write_kubeconfig(tmp / "admin")
        w = World(sb, admin, tmp / "worker")
        applied = w.kubectl("apply", "-k", str(DEPLOY))
        assert applied.returncode == 0, applied.stderr
        assert "clusterrole.rbac.authorization.k8s.io/raysize created" in applied.stdout
        example = w.kubectl("apply", "-f", str(EXAMPLE))
        assert example.returncode == 0, example.stderr
        sb.control_plane.service_account_kubeconfig(w.worker, "raysize", "raysize")
        yield w
    finally:
        sb.close()


def running_pods(w: World) -> list[str]:
    out = w.kubectl(
        "get", "pods", "-l", "ray.io/cluster=raysize-example", "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}",
    )  # fmt: skip
    return [p for p in out.stdout.split() if p.endswith("=Running")]


def test_kuberay_makes_the_example_clusters_pods_and_the_kubelet_runs_them(world):
    pods = wait_for(lambda: len(running_pods(world)) == 2 and running_pods(world), timeout=60)
    assert sorted(p.split("-")[2] for p in pods) == ["cpu", "head"]  # raysize-example-<group>
    rc = json.loads(world.kubectl("get", "raycluster/raysize-example", "-o", "json").stdout)
    assert rc["status"]["state"] == "ready"
    # raysize finds the GCS where the real KubeRay says it is
    head_ip = rc["status"]["head"]["podIP"]
    assert world.worker_kube().read_cluster("default", "raysize-example").gcs_address == (
        f"{head_ip}:6379"
    )


def test_the_stored_install_is_what_was_rendered(world):
    """The server keeps the rules as rendered; it defaults many Deployment fields, so the
    fields deploy/ sets are compared, not whole specs."""
    rendered = {d["kind"]: d for d in render(DEPLOY)}
    stored = json.loads(world.kubectl("get", "clusterrole", "raysize", "-o", "json").stdout)
    assert stored["rules"] == rendered["ClusterRole"]["rules"]
    worker = json.loads(
        world.kubectl("get", "deploy/raysize-worker", "-n", "raysize", "-o", "json").stdout
    )
    assert contains(worker["spec"], rendered["Deployment"]["spec"])
    assert worker["spec"]["progressDeadlineSeconds"] == 600  # defaulted by the real server


def contains(stored: Any, rendered: Any) -> bool:
    """Every field set in `rendered` has that value in `stored` (lists item by item)."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(
            k in stored and contains(stored[k], v) for k, v in rendered.items()
        )
    if isinstance(rendered, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(rendered)
            and all(contains(a, b) for a, b in zip(stored, rendered, strict=True))
        )
    return bool(stored == rendered)


def test_the_service_account_can_do_what_raysize_does(world):
    wait_for(lambda: len(running_pods(world)) >= 2, timeout=60)  # another test scales up
    does_what_raysize_does(world.worker_kube())


@pytest.mark.parametrize(("what", "call"), NOT_RAYSIZES_CALLS)
def test_the_service_account_can_do_nothing_else(world, what, call):
    kube = world.worker_kube()
    with pytest.raises(ApiException) as err:
        call(kube.core, kube.custom)
    assert err.value.status == 403, what
    assert SA_USER in json.loads(err.value.body)["message"]


def test_a_rule_removed_from_the_role_fails_that_call_with_the_missing_rule(world):
    """Without the pods/resize rule, a resize is refused with the rule to add, not retried."""
    wait_for(lambda: len(running_pods(world)) >= 2, timeout=60)  # another test scales up
    rbac = client.RbacAuthorizationV1Api(config.new_client_from_config(str(world.admin)))
    rules = {d["kind"]: d for d in render(DEPLOY)}["ClusterRole"]["rules"]
    kept = [r for r in rules if r["resources"] != ["pods/resize"]]
    assert len(kept) == len(rules) - 1
    rbac.patch_cluster_role("raysize", {"rules": kept})
    try:
        kube = world.worker_kube()
        worker = next(
            p for p in kube.read_cluster("default", "raysize-example").pods if p.group == "cpu"
        )
        with pytest.raises(Forbidden) as refused:
            kube.patch_resize("default", worker.name, 3000, 4 * GIB)
        assert refused.value.rule == {
            "apiGroups": [""],
            "resources": ["pods/resize"],
            "verbs": ["patch"],
            "namespace": "default",
        }
        assert refused.value.message.endswith(
            '(missing RBAC rule: apiGroups: [""], resources: ["pods/resize"], verbs: ["patch"] '
            'in namespace "default")'
        )
        assert not refused.value.retryable
    finally:
        applied = world.kubectl("apply", "-k", str(DEPLOY))
        assert applied.returncode == 0, applied.stderr
