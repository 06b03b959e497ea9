"""Install, upgrade to a new build, uninstall, on the real kube-apiserver (no KubeRay, no
kubelet: the worker does not run here; the API objects are the judge).

- Helm: two releases in two namespaces, both watching namespace default, and two
  cluster-wide ones, install side by side (their cluster-scoped objects and Roles are named
  after the release); `helm upgrade` to a new image tag changes the build ID; a new build
  installed beside the old one (Worker Versioning's way) survives the old one's uninstall;
  after `helm uninstall` nothing labelled raysize is left, of any kind, cluster-scoped
  included.
- kustomize: `kubectl apply -k`, then the next build's overlay with `--prune` (the old
  ConfigMap, whose hash name changed, goes), then `kubectl delete -k`: nothing is left.

The README's "Deploy" steps for upgrading and uninstalling are these commands."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.sandbox.realworld import RealControlPlane, parts
from tests.deploy.conftest import DEPLOY, ROOT, render, run_kubectl

CHART = DEPLOY / "helm" / "raysize"
PART_OF = "app.kubernetes.io/part-of=raysize"
KUSTOMIZED = f"{PART_OF},app.kubernetes.io/managed-by!=Helm"
# what `kubectl apply --prune` may delete: every kind a raysize install has
PRUNE_ALLOWLIST = (
    "core/v1/ConfigMap",
    "core/v1/ServiceAccount",
    "core/v1/Service",
    "apps/v1/Deployment",
    "policy/v1/PodDisruptionBudget",
    "networking.k8s.io/v1/NetworkPolicy",
    "rbac.authorization.k8s.io/v1/Role",
    "rbac.authorization.k8s.io/v1/RoleBinding",
    "rbac.authorization.k8s.io/v1/ClusterRole",
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding",
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real kube-apiserver of its own (objects are really created here, unlike the
    shared dry-run server) with the Prometheus Operator's CRDs; its admin kubeconfig."""
    cp = RealControlPlane(operator=False).start()
    try:
        cp.install_crds(sorted(cp.parts.prometheus_operator_crds.glob("*.yaml")))
        yield cp.write_kubeconfig(tmp_path_factory.mktemp("lifecycle") / "admin")
    finally:
        cp.close()


def helm(admin: Path, *args: str) -> str:
    done = subprocess.run(
        [str(parts().helm), *args, "--kubeconfig", str(admin)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={"HOME": str(admin.parent), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def kubectl(admin: Path, *args: str) -> str:
    done = run_kubectl(*args, kubeconfig=admin)
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def labelled(admin: Path, selector: str) -> set[str]:
    """Every object with these labels, of every kind the server lists (cluster-scoped ones
    too), as "<resource>/<name>" (namespaced: "<namespace>:<resource>/<name>")."""
    kinds = kubectl(admin, "api-resources", "--verbs=list", "-o", "name").split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
    out = json.loads(kubectl(admin, "get", ",".join(kinds), "-A", "-l", selector, "-o", "json"))
    found = set()
    for item in out["items"]:
        meta = item["metadata"]
        if item["kind"] == "Namespace" and meta.get("deletionTimestamp"):
            continue  # being deleted: the namespace controller (not run here) finishes it
        prefix = f"{meta['namespace']}:" if meta.get("namespace") else ""
        found.add(f"{prefix}{item['kind']}/{meta['name']}")
    return found


def worker(admin: Path, namespace: str, name: str = "raysize-worker") -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        kubectl(admin, "get", "deployment", name, "-n", namespace, "-o", "json")
    )
    return out


def image_and_build(deploy: dict[str, Any]) -> tuple[str, str]:
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return container["image"], env["RAYSIZE_BUILD_ID"]


def test_helm_releases_side_by_side_upgrade_and_uninstall(api):
    releases = {  # release → (namespace, values)
        "raysize": ("raysize", ["--set", "monitoring.enabled=true,networkPolicy.enabled=true"]),
        "team-b": ("ops", ["--set", "monitoring.enabled=true"]),
        "wide-c": ("wide-c", ["--set", "clusterWide=true"]),
        "wide-d": ("wide-d", ["--set", "clusterWide=true"]),
    }
    for name, (namespace, values) in releases.items():
        helm(api, "install", name, str(CHART), "-n", namespace, "--create-namespace", *values)
    roles = kubectl(api, "get", "roles,rolebindings", "-n", "default", "-o", "name").split()
    assert sorted(roles) == sorted(
        f"{kind}.rbac.authorization.k8s.io/{name}"
        for kind in ("role", "rolebinding")
        for name in ("raysize", "team-b-raysize", "raysize-ray-tokens", "team-b-raysize-ray-tokens")
    )
    cluster = labelled(api, f"{PART_OF},app.kubernetes.io/instance in (wide-c,wide-d)")
    assert {o for o in cluster if ":" not in o} == {
        f"{kind}/{release}-raysize{suffix}"
        for release in ("wide-c", "wide-d")
        for kind, suffixes in (
            ("ClusterRole", ["", "-node-room", "-ray-tokens"]),
            ("ClusterRoleBinding", ["", "-node-room", "-ray-tokens"]),
            ("ValidatingAdmissionPolicy", ["-ray-pods", "-rayclusters"]),
            ("ValidatingAdmissionPolicyBinding", ["-ray-pods", "-rayclusters"]),
            ("MutatingAdmissionPolicy", ["-launch-size"]),
            ("MutatingAdmissionPolicyBinding", ["-launch-size"]),
        )
        for suffix in suffixes
    }
    assert "raysize:NetworkPolicy/raysize-worker" in labelled(
        api, "app.kubernetes.io/instance=raysize"
    )

    # upgrade in place to a new build: the image tag, and with it the build ID
    assert image_and_build(worker(api, "raysize")) == ("raysize:0.2.0", "0.2.0")
    helm(
        api, "upgrade", "raysize", str(CHART), "-n", "raysize", "--reuse-values",
        "--set", "image.tag=0.3.0",
    )  # fmt: skip
    upgraded = worker(api, "raysize")
    assert image_and_build(upgraded) == ("raysize:0.3.0", "0.3.0")
    assert upgraded["metadata"]["generation"] == 2
    status = json.loads(helm(api, "status", "raysize", "-n", "raysize", "-o", "json"))
    assert (status["version"], status["info"]["status"]) == (2, "deployed")
    # --reuse-values kept the monitoring objects
    assert "raysize:PrometheusRule/raysize" in labelled(api, "app.kubernetes.io/instance=raysize")

    # the next build beside it (Worker Versioning), then the old release goes: the new
    # one keeps its grants in the watched namespace and its admission policies
    helm(
        api, "install", "raysize-0-4-0", str(CHART), "-n", "raysize-0-4-0",
        "--create-namespace", "--set", "image.tag=0.4.0",
    )  # fmt: skip
    new = labelled(api, "app.kubernetes.io/instance=raysize-0-4-0")
    for name, (namespace, _) in releases.items():
        helm(api, "uninstall", name, "-n", namespace, "--wait")
        assert not labelled(api, f"app.kubernetes.io/instance={name}"), name
    assert labelled(api, PART_OF) == new
    assert image_and_build(worker(api, "raysize-0-4-0")) == ("raysize:0.4.0", "0.4.0")
    assert "default:Role/raysize-0-4-0" in new
    assert "ValidatingAdmissionPolicy/raysize-0-4-0-ray-pods" in new

    helm(api, "uninstall", "raysize-0-4-0", "-n", "raysize-0-4-0", "--wait")
    assert labelled(api, PART_OF) == set()
    # nor Helm's own records (a release is a Secret in its namespace)
    assert labelled(api, "owner=helm") == set()


def overlay(tmp: Path, name: str, tag: str, log_level: str) -> Path:
    """The user's overlay of deploy/ with the monitoring and network-policy components,
    at one build: the image tag, the build ID beside it, and a setting."""
    shutil.copytree(DEPLOY, tmp / "deploy", dirs_exist_ok=True)
    folder = tmp / name
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../deploy"],
                "components": [
                    "../deploy/components/monitoring",
                    "../deploy/components/network-policy",
                ],
                "images": [{"name": "raysize", "newTag": tag}],
                "configMapGenerator": [
                    {
                        "name": "raysize-config",
                        "namespace": "raysize",
                        "behavior": "merge",
                        "literals": [f"RAYSIZE_LOG_LEVEL={log_level}"],
                    }
                ],
                "patches": [
                    {
                        "target": {"kind": "Deployment", "name": "raysize-worker"},
                        "patch": json.dumps(
                            [
                                {
                                    "op": "replace",
                                    "path": "/spec/template/spec/containers/0/env/0",
                                    "value": {"name": "RAYSIZE_BUILD_ID", "value": tag},
                                }
                            ]
                        ),
                    }
                ],
            }
        )
    )
    return folder


def test_kustomize_install_upgrade_with_prune_and_delete(api, tmp_path: Path):
    first = overlay(tmp_path, "v1", "0.2.0", "INFO")
    second = overlay(tmp_path, "v2", "0.3.0", "DEBUG")
    rendered = {
        (f"{d['metadata']['namespace']}:" if "namespace" in d["metadata"] else "")
        + f"{d['kind']}/{d['metadata']['name']}"
        for d in render(first)
    }
    kubectl(api, "apply", "-k", str(first))
    assert labelled(api, KUSTOMIZED) == rendered  # every object carries the label
    assert image_and_build(worker(api, "raysize")) == ("raysize:0.2.0", "0.2.0")
    (old_config,) = [o for o in rendered if "ConfigMap/raysize-config-" in o]

    prune = [f"--prune-allowlist={kind}" for kind in PRUNE_ALLOWLIST]
    out = kubectl(api, "apply", "-k", str(second), "--prune", "-l", KUSTOMIZED, *prune)
    assert f"configmap/{old_config.split('/')[1]} pruned" in out
    assert image_and_build(worker(api, "raysize")) == ("raysize:0.3.0", "0.3.0")
    (new_config,) = [o for o in labelled(api, KUSTOMIZED) if "ConfigMap/raysize-config-" in o]
    assert new_config != old_config
    (container,) = worker(api, "raysize")["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"configMapRef": {"name": new_config.split("/")[1]}}]

    kubectl(api, "delete", "-k", str(second), "--wait=false")
    assert labelled(api, KUSTOMIZED) == set()


def test_kustomize_installs_into_another_namespace_from_one_line(api, tmp_path: Path):
    """The install's namespace is written once, deploy/worker/kustomization.yaml's
    `namespace:`: changed to "ops", everything follows it (the worker's objects, the
    bindings' subjects, the admission policies' ServiceAccount), and the real server grants
    that ServiceAccount what raysize does in the watched namespace, and nothing to
    raysize:raysize."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    worker_kustomization = tmp_path / "deploy" / "worker" / "kustomization.yaml"
    text = worker_kustomization.read_text()
    assert text.count("\nnamespace: raysize\n") == 1
    worker_kustomization.write_text(text.replace("\nnamespace: raysize\n", "\nnamespace: ops\n"))
    docs = render(tmp_path / "deploy")
    assert "raysize:raysize" not in yaml.safe_dump_all(docs)
    assert {d["metadata"].get("namespace") for d in docs} == {None, "ops", "default"}
    kubectl(api, "apply", "-k", str(tmp_path / "deploy"))
    assert image_and_build(worker(api, "ops"))[0] == "raysize:0.2.0"
    account = "system:serviceaccount:ops:raysize"
    for verb, resource in (("patch", "pods"), ("patch", "pods/resize"), ("list", "rayclusters")):
        allowed = run_kubectl("auth", "can-i", verb, resource, "-n", "default", "--as", account,
                              kubeconfig=api)  # fmt: skip
        assert allowed.stdout.strip() == "yes", (verb, resource, allowed.stderr)
        stale = run_kubectl("auth", "can-i", verb, resource, "-n", "default", "--as",
                            "system:serviceaccount:raysize:raysize", kubeconfig=api)  # fmt: skip
        assert stale.stdout.strip() == "no"
    nodes = run_kubectl("auth", "can-i", "list", "nodes", "--as", account, kubeconfig=api)
    assert nodes.stdout.strip() == "yes"  # the node room's binding follows too
    policies = json.loads(kubectl(api, "get", "validatingadmissionpolicies", "-o", "json"))
    expressions = [
        c["expression"] for p in policies["items"] for c in p["spec"].get("matchConditions", [])
    ]
    assert expressions == [f"request.userInfo.username == '{account}'"] * 2
    kubectl(api, "delete", "-k", str(tmp_path / "deploy"), "--wait=false")
