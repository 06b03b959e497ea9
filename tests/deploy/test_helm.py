"""deploy/helm/raysize: `helm lint` passes, `helm template` renders what kustomize renders
(deploy/, the namespaced overlay, the monitoring and mTLS components) with each value, and
the real API server accepts it (`helm template | kubectl apply --dry-run=server -f -`).
helm v3 is built from its Go module by scripts/build_control_plane.sh."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.sandbox.realworld import DEFAULT_KUBERNETES_VERSION, parts
from tests.deploy.conftest import (
    ADMISSION_KINDS,
    DEPLOY,
    KUBECTL,
    MONITORING,
    NAMESPACED,
    NODE_ROOM,
    NODE_ROOM_RULES,
    RAY_TOKEN_RULES,
    RAY_TOKENS,
    ROOT,
    exact_rules,
    find,
    node_room_grant,
    one,
    overlay_of,
    ray_token_grant,
    render,
    run_kubectl,
)

CHART = DEPLOY / "helm" / "raysize"
NAMESPACED_VALUES = ["--set", "watchNamespaces={team-a,team-b}"]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    # parts() builds helm on first use, like the control plane
    return subprocess.run(
        [str(parts().helm), *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"HOME": "/nonexistent", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def template(*values: str) -> str:
    out = helm(
        "template", "raysize", str(CHART), "--namespace", "raysize",
        "--kube-version", DEFAULT_KUBERNETES_VERSION, *values,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def docs_of(*values: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(template(*values)) if d]


def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] != "Namespace"  # helm install --create-namespace makes it
    }


def by_name(value: Any) -> Any:
    """Lists of named items (env, volumes, ports) in name order: kustomize's patches
    reorder them, and their order means nothing to Kubernetes."""
    if isinstance(value, dict):
        return {k: by_name(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [by_name(v) for v in value]
        if items and all(isinstance(v, dict) and "name" in v for v in items):
            return sorted(items, key=lambda v: v["name"])
        return items
    return value


def same_pod(helm_deploy: dict[str, Any], kustomize_deploy: dict[str, Any]) -> None:
    """The worker's pod is kustomize's, but for the ConfigMap's name (kustomize adds a hash
    suffix; the chart rolls the pod with a checksum annotation instead)."""
    h, k = helm_deploy["spec"]["template"], kustomize_deploy["spec"]["template"]
    assert h["metadata"]["labels"] == k["metadata"]["labels"]
    annotations = dict(h["metadata"]["annotations"])
    assert annotations.pop("checksum/config")
    assert annotations == k["metadata"]["annotations"]
    h_spec, k_spec = by_name(h["spec"]), by_name(k["spec"])
    for spec in (h_spec, k_spec):
        for c in spec.get("initContainers", []) + spec["containers"]:
            for source in c.get("envFrom", []):
                source["configMapRef"]["name"] = "raysize-config"
    assert h_spec == k_spec
    assert helm_deploy["spec"]["selector"] == kustomize_deploy["spec"]["selector"]
    assert helm_deploy["spec"]["replicas"] == kustomize_deploy["spec"]["replicas"]


def config_data(docs: list[dict[str, Any]]) -> dict[str, str]:
    (cm,) = [
        c for c in find(docs, "ConfigMap") if c["metadata"]["name"].startswith("raysize-config")
    ]
    return dict(cm["data"])


@pytest.mark.parametrize(
    "values",
    [
        [],
        [*NAMESPACED_VALUES, "--set", "monitoring.enabled=true,temporal.mtls=true"],
        [*NAMESPACED_VALUES, "--set", "nodeRoom.enabled=false"],
    ],
    ids=["defaults", "namespaced-monitoring-mtls", "namespaced-no-node-room"],
)
def test_helm_lint_passes(values):
    out = helm("lint", str(CHART), "--strict", *values)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_the_chart_renders_what_kustomize_renders_for_deploy():
    chart, base = by_key(docs_of()), by_key(render(DEPLOY))
    rename = {k: k for k in base}
    (cm_key,) = [k for k in base if k[0] == "ConfigMap"]
    rename[cm_key] = ("ConfigMap", "raysize", "raysize-config")
    assert sorted(chart) == sorted(rename.values())
    assert (
        chart[("Role", "default", "raysize")]["rules"]
        == base[("Role", "default", "raysize")]["rules"]
    )
    for key in (("RoleBinding", "default", "raysize"), ("ClusterRoleBinding", "", NODE_ROOM)):
        assert chart[key]["roleRef"] == base[key]["roleRef"]
        assert chart[key]["subjects"] == base[key]["subjects"]
    # nothing cluster-wide but the node room, the same as the base's
    assert sorted(k for k in chart if k[0].startswith("Cluster")) == [
        ("ClusterRole", "", NODE_ROOM),
        ("ClusterRoleBinding", "", NODE_ROOM),
    ]
    assert (
        chart[("ClusterRole", "", NODE_ROOM)]["rules"]
        == base[("ClusterRole", "", NODE_ROOM)]["rules"]
    )
    pdb = ("PodDisruptionBudget", "raysize", "raysize-worker")
    assert chart[pdb]["spec"] == base[pdb]["spec"]
    for kind in ADMISSION_KINDS:  # the same policies, for the release's ServiceAccount
        for name in ("raysize-ray-pods", "raysize-rayclusters"):
            assert chart[(kind, "", name)]["spec"] == base[(kind, "", name)]["spec"]
    assert config_data(docs_of()) == config_data(render(DEPLOY))
    key = ("Deployment", "raysize", "raysize-worker")
    same_pod(chart[key], base[key])
    for d in chart.values():  # the base's labels, and Helm's
        assert d["metadata"]["labels"]["app.kubernetes.io/name"] == "raysize"
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize("node_room", [False, True], ids=["no-node-room", "node-room"])
def test_watch_namespaces_renders_the_namespaced_overlay(node_room, tmp_path: Path):
    """watchNamespaces with nodeRoom.enabled=false is the namespaced overlay (nothing
    cluster-wide); with the node room (the chart's default), the overlay plus the node-room
    component."""
    values = [*NAMESPACED_VALUES, "--set", f"nodeRoom.enabled={str(node_room).lower()}"]
    chart = by_key(docs_of(*values))
    overlay = by_key(
        render(overlay_of(tmp_path, ["overlays/namespaced"], ["components/node-room"]))
        if node_room
        else render(NAMESPACED)
    )
    rbac = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    assert sorted(k for k in chart if k[0] in rbac) == sorted(k for k in overlay if k[0] in rbac)
    assert sorted(k for k in chart if k[0].startswith("Cluster")) == (
        [("ClusterRole", "", NODE_ROOM), ("ClusterRoleBinding", "", NODE_ROOM)] if node_room else []
    )
    for key, role in overlay.items():
        if key[0] in ("Role", "ClusterRole"):
            assert chart[key]["rules"] == role["rules"]
        if key[0] in ("RoleBinding", "ClusterRoleBinding"):
            assert chart[key]["roleRef"] == role["roleRef"]
            assert chart[key]["subjects"] == role["subjects"]
    assert config_data(docs_of(*values)) == config_data(render(NAMESPACED))


def test_cluster_wide_renders_the_cluster_wide_component(tmp_path: Path):
    chart = by_key(docs_of("--set", "clusterWide=true"))
    component = by_key(render(overlay_of(tmp_path, ["base"], ["components/cluster-wide"])))
    rbac = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    assert sorted(k for k in chart if k[0] in rbac) == sorted(k for k in component if k[0] in rbac)
    for name in ("raysize", NODE_ROOM):
        assert (
            chart[("ClusterRole", "", name)]["rules"]
            == component[("ClusterRole", "", name)]["rules"]
        )
        key = ("ClusterRoleBinding", "", name)
        assert chart[key]["roleRef"] == component[key]["roleRef"]
        assert chart[key]["subjects"] == component[key]["subjects"]
    assert config_data(list(chart.values())) == config_data(list(component.values()))
    assert config_data(list(chart.values()))["RAYSIZE_NAMESPACES"] == ""


@pytest.mark.parametrize("mode", [[], ["--set", "clusterWide=true"], NAMESPACED_VALUES],
                         ids=["defaults", "cluster-wide", "namespaced"])  # fmt: skip
def test_node_room_is_on_by_default_in_every_mode_and_can_be_turned_off(mode):
    """nodeRoom.enabled (default true) grants the node room's five read permissions, in
    every namespace, to the release's ServiceAccount only, whatever raysize watches; false
    renders nothing of it, and leaves raysize's own grant as it was."""
    on, off = docs_of(*mode), docs_of(*mode, "--set", "nodeRoom.enabled=false")
    assert node_room_grant(on) == NODE_ROOM_RULES
    assert node_room_grant(off) is None
    assert [d for d in off if "node-room" in d["metadata"]["name"]] == []
    assert [d for d in on if d["metadata"]["name"] != NODE_ROOM] == off
    for d in find(on, "ClusterRole", NODE_ROOM) + find(on, "ClusterRoleBinding", NODE_ROOM):
        assert d["metadata"]["labels"] == find(on, "ServiceAccount")[0]["metadata"]["labels"]
    # another release's, in its namespace, for its ServiceAccount
    other = release("team-b", "ops", *mode)
    assert node_room_grant(other, "team-b-raysize-node-room", "ops") == NODE_ROOM_RULES


@pytest.mark.parametrize("cluster_wide", [False, True], ids=["roles", "cluster-wide"])
def test_observe_only_renders_the_observe_only_component(cluster_wide, tmp_path: Path):
    """observeOnly=true is deploy/components/observe-only: the same read-only rules (a Role
    per watched namespace, or the ClusterRole), RAYSIZE_OBSERVE_ONLY, and the other grants
    (the node room, the Ray token Secrets) as they were."""
    mode = ["--set", "clusterWide=true"] if cluster_wide else []
    chart = by_key(docs_of(*mode, "--set", "observeOnly=true"))
    components = ["components/cluster-wide"] if cluster_wide else []
    overlay = by_key(
        render(overlay_of(tmp_path, ["base"], [*components, "components/observe-only"]))
    )
    rbac = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    assert sorted(k for k in chart if k[0] in rbac) == sorted(k for k in overlay if k[0] in rbac)
    for key, role in overlay.items():
        if key[0] in ("Role", "ClusterRole"):
            assert chart[key]["rules"] == role["rules"], key
    key = ("ClusterRole", "", "raysize") if cluster_wide else ("Role", "default", "raysize")
    assert {p[2] for p in exact_rules(chart[key]["rules"])} == {"get", "list", "watch", "create"}
    assert config_data(list(chart.values()))["RAYSIZE_OBSERVE_ONLY"] == "true"
    assert config_data(list(chart.values())) == config_data(list(overlay.values()))


@pytest.mark.parametrize("mode", [[], ["--set", "clusterWide=true"], NAMESPACED_VALUES],
                         ids=["defaults", "cluster-wide", "namespaced"])  # fmt: skip
def test_ray_token_secrets_are_a_grant_of_their_own_on_by_default(mode):
    """rayTokenSecrets.enabled (default true): `get` on Secrets in each watched namespace
    (cluster-wide: every namespace), as deploy/components/ray-token-secrets; false renders
    nothing of it and leaves the rest as it was; `names` narrows it to those Secrets."""
    on = docs_of(*mode)
    off = docs_of(*mode, "--set", "rayTokenSecrets.enabled=false")
    where = {"defaults": ["default"], "cluster-wide": [""], "namespaced": ["team-a", "team-b"]}[
        "cluster-wide" if "clusterWide=true" in mode else "namespaced" if mode else "defaults"
    ]
    assert ray_token_grant(on) == {ns: RAY_TOKEN_RULES for ns in where}
    assert ray_token_grant(off) == {}
    assert [d for d in on if d["metadata"]["name"] != RAY_TOKENS] == off
    assert not [d for d in off if "secrets" in json.dumps(d.get("rules", []))]
    narrowed = docs_of(*mode, "--set", "rayTokenSecrets.names={train-1,train-2}")
    for role in find(narrowed, "Role", RAY_TOKENS) + find(narrowed, "ClusterRole", RAY_TOKENS):
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
             "resourceNames": ["train-1", "train-2"]}
        ]  # fmt: skip
    assert ray_token_grant(narrowed).keys() == ray_token_grant(on).keys()


def test_the_policy_names_the_release_namespaces_service_account():
    out = helm(
        "template", "raysize", str(CHART), "--namespace", "ops",
        "--kube-version", DEFAULT_KUBERNETES_VERSION,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for policy in find(docs, "ValidatingAdmissionPolicy"):
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:ops:raysize'"
        )


def test_an_empty_namespace_list_is_refused_not_cluster_wide():
    out = helm(
        "template", "raysize", str(CHART), "--namespace", "raysize",
        "--kube-version", DEFAULT_KUBERNETES_VERSION, "--set", "watchNamespaces={}",
    )  # fmt: skip
    assert out.returncode != 0
    assert "watchNamespaces is empty: list the namespaces raysize watches, or set " in out.stderr
    assert "clusterWide=true" in out.stderr


def test_monitoring_renders_the_monitoring_component(tmp_path: Path):
    chart = docs_of("--set", "monitoring.enabled=true,monitoring.labels.release=kps")
    component = render(overlay_of(tmp_path, ["base"], ["components/monitoring"]))
    for kind, name in (("PodMonitor", "raysize-worker"), ("PrometheusRule", "raysize")):
        ours = one(chart, kind, name)
        assert ours["spec"] == one(component, kind, name)["spec"], kind
        assert ours["metadata"]["labels"]["release"] == "kps"
    dashboard = one(chart, "ConfigMap", "raysize-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["raysize-dashboard.json"]) == json.loads(
        (MONITORING / "raysize-dashboard.json").read_text()
    )
    assert not find(docs_of(), "PodMonitor") and not find(docs_of(), "PrometheusRule")


def test_mtls_and_image_values(tmp_path: Path):
    chart = docs_of(
        "--set", "temporal.mtls=true,image.repository=registry.example.com/ml/raysize",
        "--set", "image.tag=0.2.0,temporal.address=temporal.example.com:7233",
    )  # fmt: skip
    mtls = render(overlay_of(tmp_path, ["base"], ["components/temporal-mtls"]))
    key = ("Deployment", "raysize", "raysize-worker")
    ours, theirs = by_key(chart)[key], by_key(mtls)[key]
    (container,) = ours["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/ml/raysize:0.2.0"
    container["image"] = theirs["spec"]["template"]["spec"]["containers"][0]["image"]
    # the build ID follows the image tag (kustomize's is written beside its newTag)
    env = {e["name"]: e for e in container["env"]}
    assert env["RAYSIZE_BUILD_ID"]["value"] == "0.2.0"
    env["RAYSIZE_BUILD_ID"]["value"] = "0.2.0"
    same_pod(ours, theirs)
    assert config_data(chart)["RAYSIZE_TEMPORAL_ADDRESS"] == "temporal.example.com:7233"


@pytest.mark.parametrize(
    "values",
    [
        [],
        [*NAMESPACED_VALUES, "--set", "monitoring.enabled=true,temporal.mtls=true"],
        ["--set", "clusterWide=true"],
        ["--set", "temporal.apiKeyFile=true"],
        [*NAMESPACED_VALUES, "--set", "nodeRoom.enabled=false"],
    ],
    ids=["defaults", "namespaced-monitoring-mtls", "cluster-wide", "api-key-file", "no-node-room"],
)
def test_the_real_api_server_accepts_the_chart(dry_run_api, values):
    for ns in ("team-a", "team-b"):  # a namespaced install grants in existing namespaces
        made = run_kubectl("create", "namespace", ns, kubeconfig=dry_run_api)
        assert made.returncode == 0 or "AlreadyExists" in made.stderr, made.stderr
    rendered = template(*values)
    applied = subprocess.run(
        [KUBECTL, "apply", "--dry-run=server", "-f", "-"],
        input=rendered, capture_output=True, text=True, timeout=60,
        env={"HOME": str(dry_run_api.parent), "KUBECONFIG": str(dry_run_api)},
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert "deployment.apps/raysize-worker created (server dry run)" in lines
    assert len(lines) == len([d for d in yaml.safe_load_all(rendered) if d])
    assert (
        "validatingadmissionpolicy.admissionregistration.k8s.io/raysize-ray-pods created "
        "(server dry run)"
    ) in lines
    if "monitoring.enabled=true,temporal.mtls=true" in values:
        assert "podmonitor.monitoring.coreos.com/raysize-worker created (server dry run)" in lines
    role = "clusterrole" if "clusterWide=true" in values else "role"
    assert f"{role}.rbac.authorization.k8s.io/raysize created (server dry run)" in lines
    node_room = sorted(line for line in lines if NODE_ROOM in line)
    assert node_room == (
        []
        if "nodeRoom.enabled=false" in values
        else [
            f"clusterrole.rbac.authorization.k8s.io/{NODE_ROOM} created (server dry run)",
            f"clusterrolebinding.rbac.authorization.k8s.io/{NODE_ROOM} created (server dry run)",
        ]
    )


def test_the_version_of_the_worker_deployment():
    """Both installs run the worker as a version of deployment "raysize" whose build ID is
    the image's tag; an explicit build ID wins, an empty deployment name is unversioned."""
    kustomized = render(DEPLOY)
    for docs in (docs_of(), kustomized):
        assert config_data(docs)["RAYSIZE_DEPLOYMENT_NAME"] == "raysize"
        (deploy,) = find(docs, "Deployment")
        (container,) = deploy["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAYSIZE_BUILD_ID"] == container["image"].rsplit(":", 1)[1] == "0.2.0"
    chart = docs_of("--set", "versioning.buildId=0.2.0-hotfix1,versioning.deploymentName=")
    assert "RAYSIZE_DEPLOYMENT_NAME" not in config_data(chart)
    (deploy,) = find(chart, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]}["RAYSIZE_BUILD_ID"] == (
        "0.2.0-hotfix1"
    )


def scoped_names(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """What two releases could both claim: cluster-scoped objects, and the objects in the
    namespaces raysize watches (not its own)."""
    return {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for d in docs
        if d["metadata"].get("namespace", "") != "raysize" and d["kind"] != "Namespace"
    }


def release(name: str, namespace: str, *values: str) -> list[dict[str, Any]]:
    out = helm(
        "template", name, str(CHART), "--namespace", namespace,
        "--kube-version", DEFAULT_KUBERNETES_VERSION, *values,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("values", [[], ["--set", "clusterWide=true"]], ids=["roles", "cluster"])
def test_two_releases_share_no_cluster_scoped_name(values):
    """Release "raysize" keeps deploy/'s names; another release's cluster-scoped objects
    (ClusterRole, ClusterRoleBinding, admission policies) and its Roles in the watched
    namespaces are named after it, and its bindings and policies point at its own."""
    first = release("raysize", "raysize", *values)
    second = release("team-b", "ops", *values)
    other = {k for k in scoped_names(second) if k[1] != "ops"}
    assert other and not other & scoped_names(first)
    names = {d["metadata"]["name"] for d in second if d["metadata"].get("namespace") != "ops"}
    assert names == {
        "team-b-raysize",
        "team-b-raysize-ray-pods",
        "team-b-raysize-rayclusters",
        "team-b-raysize-node-room",
        "team-b-raysize-launch-size",
        "team-b-raysize-ray-tokens",
    }
    for binding in find(second, "ValidatingAdmissionPolicyBinding") + find(
        second, "MutatingAdmissionPolicyBinding"
    ):
        assert binding["spec"]["policyName"] == binding["metadata"]["name"]
    for binding in find(second, "RoleBinding") + find(second, "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]
        assert binding["roleRef"]["name"] in (
            "team-b-raysize", "team-b-raysize-node-room", "team-b-raysize-ray-tokens"
        )  # fmt: skip
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "raysize", "namespace": "ops"}
        ]
    # a release whose name holds the chart's is not suffixed again
    assert {d["metadata"]["name"] for d in find(release("raysize-b", "b", *values), "Role")} <= {
        "raysize-b", "raysize-b-ray-tokens"
    }  # fmt: skip


def test_the_network_policy_renders_the_component(tmp_path: Path):
    chart = docs_of("--set", "networkPolicy.enabled=true")
    component = render(overlay_of(tmp_path, ["base"], ["components/network-policy"]))
    ours = one(chart, "NetworkPolicy", "raysize-worker")
    assert ours["spec"] == one(component, "NetworkPolicy", "raysize-worker")["spec"]
    assert not find(docs_of(), "NetworkPolicy")
    # Temporal's port follows temporal.address; an external Temporal is a CIDR
    ours = one(
        docs_of(
            "--set", "networkPolicy.enabled=true,temporal.address=temporal.example.com:7234",
            "--set", "networkPolicy.temporal.cidr=203.0.113.0/24",
            "--set", "networkPolicy.gcsPorts={6379,6380}",
            "--set", "networkPolicy.apiServer.cidr=10.0.0.1/32,networkPolicy.apiServer.ports={6443}",
        ),
        "NetworkPolicy", "raysize-worker",
    )  # fmt: skip
    egress = {
        (p["port"], p["protocol"]): r["to"] for r in ours["spec"]["egress"] for p in r["ports"]
    }
    assert egress[(7234, "TCP")] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    assert egress[(6443, "TCP")] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    assert (443, "TCP") not in egress and (6380, "TCP") in egress


def test_pod_values_reach_the_workers_pod(tmp_path: Path):
    values = {
        "imagePullSecrets": [{"name": "my-registry"}],
        "podAnnotations": {"team": "ml-platform"},
        "extraEnv": [
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel:4317"},
            {"name": "RAYSIZE_EXTRA", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["system"]}]}]}}},
    }  # fmt: skip
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    (deploy,) = find(docs_of("--values", str(tmp_path / "values.yaml")), "Deployment")
    pod = deploy["spec"]["template"]
    assert pod["metadata"]["annotations"]["team"] == "ml-platform"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"  # kept
    spec = pod["spec"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert spec[key] == values[key], key
    (container,) = spec["containers"]
    assert container["env"][-2:] == values["extraEnv"]
    assert {e["name"] for e in container["env"]} >= {"RAYSIZE_BUILD_ID", "RAY_AUTH_TOKEN"}
    (default,) = find(docs_of(), "Deployment")
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert key not in default["spec"]["template"]["spec"], key


def test_a_budget_that_would_block_drains_is_refused():
    out = helm(
        "template", "raysize", str(CHART), "--namespace", "raysize",
        "--kube-version", DEFAULT_KUBERNETES_VERSION,
        "--set", "podDisruptionBudget.maxUnavailable=0",
    )  # fmt: skip
    assert out.returncode != 0
    assert "podDisruptionBudget.maxUnavailable must be 1 or more" in out.stderr
    assert not find(docs_of("--set", "podDisruptionBudget.enabled=false"), "PodDisruptionBudget")


def test_the_worker_alerts_name_the_releases_namespace():
    """The absent and polling alerts read `up` of the PodMonitor's job, which the
    Prometheus Operator names "<namespace>/<PodMonitor name>"."""
    docs = release("raysize", "ops", "--set", "monitoring.enabled=true")
    (monitor,) = find(docs, "PodMonitor")
    job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    assert job == "ops/raysize-worker"
    (rule,) = find(docs, "PrometheusRule")
    by_name = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert by_name["RaysizeWorkerAbsent"]["expr"].strip() == f'absent(up{{job="{job}"}} == 1)'
    assert f'up{{job="{job}"}} == 1' in by_name["RaysizeWorkerNotPolling"]["expr"]
    assert "kubectl -n ops get" in by_name["RaysizeWorkerAbsent"]["annotations"]["description"]


def test_a_cluster_name_scopes_the_task_queue_unless_one_is_given(monkeypatch):
    """`clusterName` (several Kubernetes clusters in one Temporal namespace) reaches the
    worker, whose default queue then follows it; a `temporal.taskQueue` given wins. The
    defaults leave the queue to the worker (raysize)."""
    from raysize.worker.settings import Settings

    def queue_of(*values: str) -> tuple[dict[str, str], str]:
        data = config_data(docs_of(*values))
        for key in ("RAYSIZE_CLUSTER_NAME", "RAYSIZE_TASK_QUEUE"):
            monkeypatch.delenv(key, raising=False)
        for key, value in data.items():
            if key in ("RAYSIZE_CLUSTER_NAME", "RAYSIZE_TASK_QUEUE"):
                monkeypatch.setenv(key, value)
        return data, Settings().task_queue

    data, queue = queue_of()
    assert "RAYSIZE_TASK_QUEUE" not in data and "RAYSIZE_CLUSTER_NAME" not in data
    assert queue == "raysize"
    data, queue = queue_of("--set", "clusterName=prod-eu1")
    assert data["RAYSIZE_CLUSTER_NAME"] == "prod-eu1" and queue == "raysize-prod-eu1"
    _, queue = queue_of("--set", "clusterName=prod-eu1,temporal.taskQueue=mine")
    assert queue == "mine"


def test_the_api_key_as_a_file_renders_the_component(tmp_path: Path):
    """`temporal.apiKeyFile` (Helm) and `components/temporal-api-key-file` (kustomize) mount
    the key the worker re-reads when it rotates, instead of the variable that cannot change;
    the pod waits for the secret, and the worker's settings take the path."""
    from raysize.worker.settings import Settings

    chart = docs_of("--set", "temporal.apiKeyFile=true")
    component = render(overlay_of(tmp_path, ["base"], ["components/temporal-api-key-file"]))
    key = ("Deployment", "raysize", "raysize-worker")
    ours, theirs = by_key(chart)[key], by_key(component)[key]
    same_pod(ours, theirs)
    pod = theirs["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "RAYSIZE_TEMPORAL_API_KEY" not in env
    path = env["RAYSIZE_TEMPORAL_API_KEY_FILE"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "temporal-api-key"]
    assert path == f"{mount['mountPath']}/api-key" and mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "temporal-api-key"]
    assert volume["secret"] == {"secretName": "raysize-temporal", "optional": False,
                                "defaultMode": 0o440}  # fmt: skip
    # the worker takes it as its key file (here, a file standing in for the mount)
    key_file = tmp_path / "api-key"
    key_file.write_text("k1\n")
    settings = Settings(temporal_api_key_file=key_file)
    assert settings.temporal_api_key_file == key_file and settings.temporal_api_key is None
    # the default keeps the optional variable
    (default,) = by_key(docs_of())[key]["spec"]["template"]["spec"]["containers"]
    assert "RAYSIZE_TEMPORAL_API_KEY" in {e["name"] for e in default["env"]}


def test_the_chart_installs_without_cluster_admin_with_the_values_the_docs_give():
    """docs/security.md's namespaced profile in Helm: these values render no cluster-scoped
    object (a namespace admin may install it), and the same Roles as the overlay."""
    values = "nodeRoom.enabled=false,admissionPolicy.enabled=false,launchAtSize.enabled=false"
    page = (ROOT / "docs" / "security.md").read_text()
    for value in values.split(","):
        assert f"`{value}`" in page, value
    docs = docs_of(*NAMESPACED_VALUES, "--set", values)
    assert all(d["metadata"].get("namespace") for d in docs), [
        (d["kind"], d["metadata"]["name"]) for d in docs if not d["metadata"].get("namespace")
    ]
    rbac = ("Role", "RoleBinding")
    overlay = render(NAMESPACED)
    assert sorted(k for k in by_key(docs) if k[0] in rbac) == sorted(
        k for k in by_key(overlay) if k[0] in rbac
    )
