"""deploy/ renders offline; its RBAC is exactly what raysize needs; the example validates."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.worker.settings import Settings
from raysize.workflows.ippr import IPPR_ANNOTATION
from raysize.workflows.raycluster_spec import read_group_specs
from tests.deploy.conftest import (
    ADMISSION_KINDS,
    DEPLOY,
    EXAMPLE,
    NAMESPACED,
    NODE_ROOM,
    NODE_ROOM_RULES,
    RAY_TOKEN_RULES,
    RAY_TOKENS,
    ROOT,
    TRIAL,
    commented_yaml,
    exact_rules,
    find,
    node_room_grant,
    one,
    overlay_of,
    ray_token_grant,
    render,
    rule_set,
)

OBSERVE_ONLY = DEPLOY / "overlays" / "observe-only"


# (apiGroup, resource, verb): the whole grant, and nothing else (issue 6).
EXPECTED_RULES = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "patch"),
    ("", "pods/resize", "patch"),
    ("", "events", "create"),
    ("ray.io", "rayclusters", "get"),
    ("ray.io", "rayclusters", "list"),
    ("ray.io", "rayclusters", "watch"),
    ("ray.io", "rayclusters", "patch"),
    # the size new pods start at (Kube.write_launch_sizes; get and patch by name only)
    ("", "configmaps", "create"),
    ("", "configmaps", "get"),
    ("", "configmaps", "patch"),
}

# Every kubernetes-client call raysize's code makes → what RBAC must allow for it, in each
# namespace raysize watches (its Role there, or the cluster-wide component's ClusterRole)...
CLIENT_CALLS = {
    "read_namespaced_pod": {("", "pods", "get")},
    "list_namespaced_pod": {("", "pods", "list")},
    "patch_namespaced_pod": {("", "pods", "patch")},
    "patch_namespaced_pod_resize": {("", "pods/resize", "patch")},
    "create_namespaced_event": {("", "events", "create")},
    "get_namespaced_custom_object": {("ray.io", "rayclusters", "get")},
    "list_namespaced_custom_object": {("ray.io", "rayclusters", "list")},
    "list_cluster_custom_object": {("ray.io", "rayclusters", "list")},
    "patch_namespaced_custom_object": {("ray.io", "rayclusters", "patch")},
    "read_namespaced_config_map": {("", "configmaps", "get")},
    "create_namespaced_config_map": {("", "configmaps", "create")},
    "patch_namespaced_config_map": {("", "configmaps", "patch")},
    # API discovery (`raysize doctor`): every authenticated user may (system:discovery)
    "get_api_resources": set(),
}
# ... and, where the install reads Ray token Secrets (deploy/components/ray-token-secrets,
# opt-in per namespace; cluster-wide, one ClusterRole), a Ray cluster's own token, by name
# (activities/ray_tokens.py)...
TOKEN_CALLS = {"read_namespaced_secret": {("", "secrets", "get")}}
# ... (observe-only: deploy/components/observe-only, the chart's observeOnly) all but the
# calls only the activities that write make (each asks `ObserveOnly.refuse` first: the
# resize, ray.io/ippr-status, scaling and the launch-sizes ConfigMap written with it)...
WRITE_CALLS = {
    "patch_namespaced_pod",
    "patch_namespaced_pod_resize",
    "patch_namespaced_custom_object",
    "read_namespaced_config_map",
    "create_namespaced_config_map",
    "patch_namespaced_config_map",
}
OBSERVE_ONLY_RULES = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "events", "create"),  # the Would* Events, the decisions
    ("ray.io", "rayclusters", "get"),
    ("ray.io", "rayclusters", "list"),
    ("ray.io", "rayclusters", "watch"),
}
# ... or in every namespace at once, whatever raysize watches: the node room's informers
# (activities/node_room.py; `raysize doctor` lists head pods this way too, when it watches
# every namespace), granted by deploy/components/node-room's ClusterRole.
CLUSTER_WIDE_CALLS = {
    "list_node": {("", "nodes", "list")},
    "list_pod_for_all_namespaces": {("", "pods", "list")},
}
# Granted by the node room though no call needs it: `list` already reads every Node whole,
# so `get` shows nothing more; the worker's 403 warning (activities/node_room.py) asks for
# get/list/watch on nodes, and the grant is what it asks for.
NODE_ROOM_UNCALLED = {("", "nodes", "get")}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(DEPLOY)


@pytest.fixture(scope="module")
def trial() -> list[dict[str, Any]]:
    return render(TRIAL)


def worker_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = one(docs, "Deployment", "raysize-worker")
    (container,) = [c for c in deploy["spec"]["template"]["spec"]["containers"]]
    assert container["name"] == "worker"
    return container


LAUNCH_SIZE = "raysize-launch-size"  # deploy/components/launch-size
CLUSTER_SCOPED = (
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    *ADMISSION_KINDS,
)


def test_base_renders_the_expected_objects(base):
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in base)
    configmaps = [n for k, n in kinds if k == "ConfigMap"]
    assert len(configmaps) == 1 and configmaps[0].startswith("raysize-config-")
    assert sorted(k for k in kinds if k[0] != "ConfigMap") == [
        ("ClusterRole", NODE_ROOM),
        ("ClusterRoleBinding", NODE_ROOM),
        ("Deployment", "raysize-worker"),
        ("MutatingAdmissionPolicy", "raysize-launch-size"),
        ("MutatingAdmissionPolicyBinding", "raysize-launch-size"),
        ("Namespace", "raysize"),
        ("PodDisruptionBudget", "raysize-worker"),
        ("Role", "raysize"),
        ("Role", RAY_TOKENS),
        ("RoleBinding", "raysize"),
        ("RoleBinding", RAY_TOKENS),
        ("ServiceAccount", "raysize"),
        ("ValidatingAdmissionPolicy", "raysize-ray-pods"),
        ("ValidatingAdmissionPolicy", "raysize-rayclusters"),
        ("ValidatingAdmissionPolicyBinding", "raysize-ray-pods"),
        ("ValidatingAdmissionPolicyBinding", "raysize-rayclusters"),
    ]
    for d in base:
        if d["kind"] in ("Role", "RoleBinding"):
            assert d["metadata"]["namespace"] == "default", d["kind"]  # the watched namespace
        elif d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"]["namespace"] == "raysize", d["kind"]


def watched_namespaces(docs: list[dict[str, Any]]) -> list[str]:
    (cm,) = find(docs, "ConfigMap")
    settings = Settings(**{k.removeprefix("RAYSIZE_").lower(): v for k, v in cm["data"].items()})
    return settings.namespace_list()


def grants(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Where the install grants raysize's rules: namespace → rules ("" for every namespace),
    checking each binding names the role and only raysize's ServiceAccount. The node-room
    grant and reading Ray token Secrets are not among them (`node_room_grant`,
    `ray_token_grant`)."""
    docs = [d for d in docs if d["metadata"]["name"] not in (NODE_ROOM, RAY_TOKENS)]
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, binding_kind in (("ClusterRole", "ClusterRoleBinding"), ("Role", "RoleBinding")):
        for role in find(docs, kind):
            ns = role["metadata"].get("namespace", "")
            (binding,) = [
                b for b in find(docs, binding_kind) if b["metadata"].get("namespace", "") == ns
            ]
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": kind,
                "name": role["metadata"]["name"],
            }
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "raysize", "namespace": "raysize"}
            ]
            assert ns not in out, f"two grants in {ns!r}"
            out[ns] = role["rules"]
    bindings = find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")
    assert len(bindings) == len(out), "a binding without its role"
    return out


def cluster_wide(tmp: Path) -> list[dict[str, Any]]:
    return render(overlay_of(tmp, ["base"], ["components/cluster-wide"]))


INSTALLS = ["base", "namespaced", "trial", "cluster-wide", "observe-only",
            "observe-only, cluster-wide"]  # fmt: skip


def install_docs(install: str, tmp: Path) -> list[dict[str, Any]]:
    return {
        "base": lambda: render(DEPLOY),
        "namespaced": lambda: render(NAMESPACED),
        "trial": lambda: render(TRIAL),
        "cluster-wide": lambda: cluster_wide(tmp),
        "observe-only": lambda: render(OBSERVE_ONLY),
        "observe-only, cluster-wide": lambda: render(
            overlay_of(tmp, ["base"], ["components/cluster-wide", "components/observe-only"])
        ),
    }[install]()


@pytest.mark.parametrize("install", INSTALLS)
def test_rbac_is_exactly_what_raysize_needs_where_it_watches(install, tmp_path):
    """Each install grants raysize's rules exactly in the namespaces the worker watches:
    a Role in each (the default install: "default"), or one ClusterRole when it watches
    every namespace (the cluster-wide component); observe-only, the read rules alone. And
    reading Ray token Secrets exactly there, as a grant of its own."""
    docs = install_docs(install, tmp_path)
    granted = grants(docs)
    namespaces = watched_namespaces(docs)
    assert sorted(granted) == (namespaces or [""])
    assert (
        namespaces
        == {
            "base": ["default"],
            "namespaced": ["team-a", "team-b"],
            "trial": ["default"],
            "cluster-wide": [],
            "observe-only": ["default"],
            "observe-only, cluster-wide": [],
        }[install]
    )
    observe_only = install.startswith("observe-only")
    for rules in granted.values():
        assert exact_rules(rules) == (OBSERVE_ONLY_RULES if observe_only else EXPECTED_RULES)
    (cm,) = find(docs, "ConfigMap")
    assert Settings(**{k.removeprefix("RAYSIZE_").lower(): v for k, v in cm["data"].items()}
                    ).observe_only is observe_only  # fmt: skip
    assert ray_token_grant(docs) == {ns: RAY_TOKEN_RULES for ns in namespaces or [""]}
    spec = one(docs, "Deployment", "raysize-worker")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "raysize"
    # every install keeps the admission policy, cluster-wide most of all; but the namespaced
    # overlay, which has nothing cluster-scoped (test_the_namespaced_overlay_needs_...)
    assert sorted(d["metadata"]["name"] for d in find(docs, "ValidatingAdmissionPolicy")) == (
        [] if install == "namespaced" else ["raysize-ray-pods", "raysize-rayclusters"]
    )


@pytest.mark.parametrize("install", INSTALLS)
def test_observe_only_grants_no_write_at_all(install, tmp_path):
    """Whatever grants raysize's ServiceAccount (its rules, the node room, the Ray token
    Secrets): in observe-only, no verb that writes but creating Events; otherwise the
    writes are exactly raysize's."""
    docs = install_docs(install, tmp_path)
    writes = {
        p
        for d in find(docs, "Role") + find(docs, "ClusterRole")
        for p in exact_rules(d["rules"])
        if p[2] not in ("get", "list", "watch")
    }
    if install.startswith("observe-only"):
        assert writes == {("", "events", "create")}
    else:
        assert writes == {p for p in EXPECTED_RULES if p[2] not in ("get", "list", "watch")}


def test_every_kubernetes_call_in_the_code_is_granted(tmp_path):
    """Scan the code for kubernetes-client calls: each must be known here and granted,
    in the watched namespaces by raysize's rules, in every namespace by the node room's
    ClusterRole of each install that has it."""
    sources = {
        p: p.read_text()
        for d in ("activities", "worker", "workflows")
        for p in (ROOT / d).glob("*.py")
    }
    needed: set[tuple[str, str, str]] = set()  # in each watched namespace
    observing: set[tuple[str, str, str]] = set()  # there, by an observe-only worker
    tokens: set[tuple[str, str, str]] = set()  # there, where Ray token Secrets are read
    everywhere: set[tuple[str, str, str]] = set()  # in every namespace
    for path, text in sources.items():
        for method in re.findall(r"\.(?:core|custom)\.(\w+)", text):
            known = method in CLIENT_CALLS or method in CLUSTER_WIDE_CALLS or method in TOKEN_CALLS
            assert known, f"{path.name}: new Kubernetes call {method}: update RBAC"
            needed |= CLIENT_CALLS.get(method, set())
            if method not in WRITE_CALLS:
                observing |= CLIENT_CALLS.get(method, set())
            tokens |= TOKEN_CALLS.get(method, set())
            everywhere |= CLUSTER_WIDE_CALLS.get(method, set())
        # a module that streams lists (a Watch, or pod_watch's own kind of one, _RawWatch):
        # which ones it watches
        if re.search(r"\b(?:watch\.Watch|_RawWatch)\b", text):
            if re.search(r"self\.core\.list_namespaced_pod\b", text):
                needed.add(("", "pods", "watch"))
            if re.search(r"self\.custom\.list_namespaced_custom_object\b", text) and (
                '"rayclusters"' in text
            ):
                needed.add(("ray.io", "rayclusters", "watch"))
            if re.search(r"self\.core\.list_node\b", text):
                everywhere.add(("", "nodes", "watch"))
            if re.search(r"self\.core\.list_pod_for_all_namespaces\b", text):
                everywhere.add(("", "pods", "watch"))
    assert ("", "pods", "watch") in needed  # the scan sees the pod watch
    assert ("ray.io", "rayclusters", "watch") in needed  # and the RayCluster watch
    assert needed == EXPECTED_RULES
    assert tokens == RAY_TOKEN_RULES
    # observe-only: the calls but the writes, and the watches (events: the Would* Events)
    assert observing | {p for p in needed if p[2] == "watch"} == OBSERVE_ONLY_RULES
    # the node room's two informers (activities/node_room.py): listed, then watched
    assert everywhere == {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
    }
    assert everywhere | NODE_ROOM_UNCALLED == NODE_ROOM_RULES
    # granted in every namespace where the install has the node room (deploy/overlays/
    # namespaced has not: there the worker plans without it, test_node_room_is_granted_...)
    for docs in (render(DEPLOY), render(TRIAL), cluster_wide(tmp_path)):
        granted = node_room_grant(docs)
        assert granted is not None and everywhere <= granted


def without_node_room(tmp: Path) -> list[dict[str, Any]]:
    """deploy/ with the node room turned off as components/node-room's comment says."""
    snippet = commented_yaml(DEPLOY / "components" / "node-room" / "kustomization.yaml", "patches:")
    return render(overlay_of(tmp, ["base"], [], **snippet))


def namespaced_with_node_room(tmp: Path) -> list[dict[str, Any]]:
    """deploy/overlays/namespaced with the node room added as its comment says."""
    shutil.copytree(DEPLOY, tmp / "deploy")
    overlay = tmp / "deploy" / "overlays" / "namespaced" / "kustomization.yaml"
    kustomization = yaml.safe_load(overlay.read_text())
    kustomization.update(commented_yaml(overlay, "components:"))
    overlay.write_text(yaml.safe_dump(kustomization))
    return render(overlay.parent)


@pytest.mark.parametrize(
    ("install", "has_it"),
    [
        ("base", True),
        ("trial", True),
        ("cluster-wide", True),
        ("namespaced", False),
        ("namespaced, the node room added", True),
        ("base, the node room turned off", False),
    ],
)
def test_node_room_is_granted_exactly_where_it_should_be(install, has_it, tmp_path):
    """The node room (deploy/components/node-room) grants exactly its five read
    permissions in every namespace, to raysize's ServiceAccount only: in the default install
    and those built on it, not in the namespaced overlay (nothing cluster-wide), and the
    comments' ways to add it there and to turn it off in an overlay of the base work.
    raysize's own grant is the same either way."""
    docs = {
        "base": lambda: render(DEPLOY),
        "trial": lambda: render(TRIAL),
        "cluster-wide": lambda: cluster_wide(tmp_path),
        "namespaced": lambda: render(NAMESPACED),
        "namespaced, the node room added": lambda: namespaced_with_node_room(tmp_path),
        "base, the node room turned off": lambda: without_node_room(tmp_path),
    }[install]()
    assert node_room_grant(docs) == (NODE_ROOM_RULES if has_it else None)
    for rules in grants(docs).values():
        assert exact_rules(rules) == EXPECTED_RULES
    # what a node-room object carries: the labels of every raysize object
    for d in find(docs, "ClusterRole", NODE_ROOM) + find(docs, "ClusterRoleBinding", NODE_ROOM):
        assert d["metadata"]["labels"] == {
            "app.kubernetes.io/name": "raysize",
            "app.kubernetes.io/part-of": "raysize",
        }
    # no other grant reads nodes
    others = [d for d in find(docs, "ClusterRole") + find(docs, "Role")
              if d["metadata"]["name"] != NODE_ROOM]  # fmt: skip
    assert not [d for d in others if ("", "nodes", "list") in rule_set(d["rules"])]


def test_worker_deployment(base):
    deploy = one(base, "Deployment", "raysize-worker")
    assert deploy["spec"]["replicas"] == 1
    pod = deploy["spec"]["template"]["spec"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    c = worker_container(base)
    assert c["image"] == "raysize:0.2.0"
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}
    assert c["livenessProbe"]["exec"]["command"][:4] == [
        "python",
        "-m",
        "raysize.worker.health",
        "live",
    ]
    assert c["readinessProbe"]["exec"]["command"][:4] == [
        "python",
        "-m",
        "raysize.worker.health",
        "ready",
    ]
    for probe in ("livenessProbe", "readinessProbe"):
        p = c[probe]
        assert p["timeoutSeconds"] >= 5 and p["periodSeconds"] >= 10
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # the heartbeat file is on a writable volume
    env = {e["name"]: e for e in c["env"]}
    health = env["RAYSIZE_HEALTH_FILE"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert any(health.startswith(path + "/") for path in mounts)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_secrets_are_optional_and_wired_to_the_settings(base):
    c = worker_container(base)
    pod = one(base, "Deployment", "raysize-worker")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in c["env"]}
    refs = {name: e["valueFrom"]["secretKeyRef"] for name, e in env.items() if "valueFrom" in e}
    assert refs == {
        "RAYSIZE_TEMPORAL_API_KEY": {
            "name": "raysize-temporal",
            "key": "api-key",
            "optional": True,
        },
        "RAY_AUTH_TOKEN": {"name": "raysize-ray-token", "key": "token", "optional": True},
    }
    assert "temporal_api_key" in Settings.model_fields
    secret_volumes = [v["secret"] for v in pod["volumes"] if "secret" in v]
    assert secret_volumes and all(s["optional"] is True for s in secret_volumes)
    assert [s["secretName"] for s in secret_volumes] == ["raysize-temporal-tls"]
    # TLS paths are not set by default: the files would not exist without the secret
    assert not {n for n in env if n.startswith("RAYSIZE_TEMPORAL_TLS_")}


def test_configmap_holds_valid_settings(base):
    (cm,) = find(base, "ConfigMap")
    c = worker_container(base)
    assert c["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    fields = {f"RAYSIZE_{name.upper()}" for name in Settings.model_fields}
    assert set(cm["data"]) <= fields, set(cm["data"]) - fields
    settings = Settings(**{k.removeprefix("RAYSIZE_").lower(): v for k, v in cm["data"].items()})
    assert settings.namespace_list() == ["default"]  # where the base's Role is


def test_mtls_component_points_the_worker_at_the_mounted_secret(tmp_path: Path):
    # an overlay of the user's, next to a copy of deploy/ (kustomize wants relative paths)
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    overlay = tmp_path / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../deploy/base"],
                "components": ["../deploy/components/temporal-mtls"],
            }
        )
    )
    docs = render(overlay)
    c = worker_container(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "temporal-tls")["mountPath"]
    for var, file in (
        ("RAYSIZE_TEMPORAL_TLS_CERT", "tls.crt"),
        ("RAYSIZE_TEMPORAL_TLS_KEY", "tls.key"),
        ("RAYSIZE_TEMPORAL_TLS_CA", "ca.crt"),
    ):
        assert env[var] == f"{mount}/{file}"
    pod = one(docs, "Deployment", "raysize-worker")["spec"]["template"]["spec"]
    tls = next(v for v in pod["volumes"] if v["name"] == "temporal-tls")
    assert tls["secret"] == {
        "secretName": "raysize-temporal-tls",
        "optional": False,
        "defaultMode": 0o440,
    }
    # the API key and Ray token stay where they were
    assert env.keys() >= {"RAYSIZE_TEMPORAL_API_KEY", "RAY_AUTH_TOKEN", "RAYSIZE_HEALTH_FILE"}


def test_trial_overlay_adds_a_temporal_dev_server_and_points_the_worker_at_it(base, trial):
    server = one(trial, "Deployment", "temporal-dev")
    service = one(trial, "Service", "temporal-dev")
    assert server["metadata"]["namespace"] == service["metadata"]["namespace"] == "raysize"
    (c,) = server["spec"]["template"]["spec"]["containers"]
    assert c["image"].startswith("temporalio/temporal:")
    args = c["args"]
    assert args[:2] == ["server", "start-dev"]
    assert args[args.index("--ip") + 1] == "0.0.0.0"
    assert (
        service["spec"]["selector"].items()
        <= server["spec"]["template"]["metadata"]["labels"].items()
    )
    assert server["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"grpc": 7233, "ui": 8233}

    (cm,) = find(trial, "ConfigMap")
    host, port = cm["data"]["RAYSIZE_TEMPORAL_ADDRESS"].rsplit(":", 1)
    assert host == "temporal-dev.raysize.svc" and int(port) == ports["grpc"]
    worker = one(trial, "Deployment", "raysize-worker")["spec"]["template"]["spec"]
    (init,) = worker["initContainers"]
    assert init["image"] == worker["containers"][0]["image"] == "raysize:0.2.0"
    assert init["command"][:4] == ["python", "-m", "raysize.worker.health", "ready"]
    assert init["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    # the overlay grants nothing more
    assert grants(trial) == grants(base)
    assert node_room_grant(trial) == node_room_grant(base) == NODE_ROOM_RULES


def test_example_raycluster_passes_raysize_validation():
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (rc,) = docs
    assert (rc["apiVersion"], rc["kind"]) == ("ray.io/v1", "RayCluster")
    assert IPPR_ANNOTATION in rc["metadata"]["annotations"]
    specs = read_group_specs(rc)
    assert specs.errors == ()
    assert specs.ippr_enabled
    managed = {name for name, g in specs.groups.items() if g.ippr is not None}
    assert managed == {"cpu"}
    limits = specs.groups["cpu"].ippr
    assert limits is not None and limits.max_cpu == 4000 and limits.resize_timeout_s == 60


@pytest.fixture(scope="module")
def namespaced() -> list[dict[str, Any]]:
    return render(NAMESPACED)


def test_namespaced_overlay_grants_raysizes_rules_in_each_watched_namespace_only(base, namespaced):
    (cm,) = find(namespaced, "ConfigMap")
    assert worker_container(namespaced)["envFrom"] == [
        {"configMapRef": {"name": cm["metadata"]["name"]}}
    ]
    settings = Settings(**{k.removeprefix("RAYSIZE_").lower(): v for k, v in cm["data"].items()})
    watched = settings.namespace_list()
    assert watched == ["team-a", "team-b"]
    # no cluster-wide grant at all
    assert find(namespaced, "ClusterRole") == find(namespaced, "ClusterRoleBinding") == []
    roles = {r["metadata"]["namespace"]: r for r in find(namespaced, "Role", "raysize")}
    bindings = {b["metadata"]["namespace"]: b for b in find(namespaced, "RoleBinding", "raysize")}
    assert sorted(roles) == sorted(bindings) == watched
    base_rules = one(base, "Role", "raysize")["rules"]
    for ns in watched:
        assert roles[ns]["rules"] == base_rules  # the same grant, in another namespace
        assert bindings[ns]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[ns]["metadata"]["name"],
        }
        assert bindings[ns]["subjects"] == [
            {"kind": "ServiceAccount", "name": "raysize", "namespace": "raysize"}
        ]
    # each namespace's folder opts in to reading its Ray token Secrets
    assert ray_token_grant(namespaced) == {ns: RAY_TOKEN_RULES for ns in watched}
    # everything else is the base's, in raysize's namespace, but what is cluster-scoped:
    # the Namespace, the admission policies, the node room and the launch-size policy
    others = [d for d in namespaced if d["kind"] not in ("Role", "RoleBinding")]
    for d in others:
        assert d["kind"] not in CLUSTER_SCOPED, d["kind"]
        assert d["metadata"]["namespace"] == "raysize", d["kind"]
    expected = [
        (d["kind"], d["metadata"]["name"])
        for d in base
        if d["kind"] not in ("Role", "RoleBinding", "ConfigMap", *CLUSTER_SCOPED)
    ]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in others) == sorted(
        [*expected, ("ConfigMap", cm["metadata"]["name"])]
    )


def test_the_namespaced_overlay_needs_no_cluster_scoped_object(namespaced):
    """Every object of deploy/overlays/namespaced is namespaced (a namespace admin can apply
    it), and its comment says what each cluster-scoped piece left out would have given."""
    assert {d["kind"] for d in namespaced} == {
        "ServiceAccount", "ConfigMap", "Deployment", "PodDisruptionBudget", "Role",
        "RoleBinding",
    }  # fmt: skip
    assert all(d["metadata"].get("namespace") for d in namespaced)
    comment = (NAMESPACED / "kustomization.yaml").read_text()
    for piece in ("the Namespace raysize", "the admission policies", "the node room",
                  "launching at size"):  # fmt: skip
        assert f"#   - {piece}" in comment, piece


def test_the_disruption_budget_never_blocks_a_drain(base):
    """One worker replica: a budget must let a node drain evict it (maxUnavailable ≥ 1, no
    minAvailable), and it covers exactly the worker's pods."""
    pdb = one(base, "PodDisruptionBudget", "raysize-worker")
    deploy = one(base, "Deployment", "raysize-worker")
    assert pdb["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    assert deploy["spec"]["replicas"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["maxUnavailable"] >= deploy["spec"]["replicas"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"]


def test_the_network_policy_allows_only_what_raysize_dials(tmp_path: Path):
    """The component's NetworkPolicy selects the worker's pods; ingress only to the metrics
    port; egress only to DNS, the API server's ports, Temporal's port (config.env) and the
    GCS port on Ray head pods."""
    docs = render(overlay_of(tmp_path, ["base"], ["components/network-policy"]))
    policy = one(docs, "NetworkPolicy", "raysize-worker")
    deploy = one(docs, "Deployment", "raysize-worker")
    assert policy["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["spec"]["ingress"]
    (port,) = ingress["ports"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert port["port"] in {p["name"] for p in container["ports"]} and "from" not in ingress
    egress = {
        (p["port"], p["protocol"]): rule["to"] for rule in policy["spec"]["egress"]
        for p in rule["ports"]
    }  # fmt: skip
    (cm,) = find(docs, "ConfigMap")
    temporal_port = int(cm["data"]["RAYSIZE_TEMPORAL_ADDRESS"].rsplit(":", 1)[1])
    assert sorted(egress) == sorted(
        [(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (temporal_port, "TCP"),
         (6379, "TCP")]
    )  # fmt: skip
    assert egress[(6379, "TCP")] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"ray.io/node-type": "head"}}}
    ]
    assert egress[(443, "TCP")] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    # the GCS port is the one KubeRay's head listens on (deploy/examples/raycluster-ippr.yaml)
    example = yaml.safe_load(EXAMPLE.read_text())
    assert "port" not in example["spec"]["headGroupSpec"].get("rayStartParams", {})


def documented_node_room(text: str, start: str) -> set[tuple[str, str, str]]:
    """The permissions of the first table after `start` in a document, whose rows are
    API group, resource (each in backticks), "verb, verb" (", in every namespace"), why."""
    after = text[text.index(start) :]
    table = after[after.index("| --- |") :].split("\n\n")[0]
    row = r"^ *\| `([^`]*)` \| `([^`]+)` \| ([a-z, ]+?)(?:, in every namespace)? \|"
    return {
        (group.strip('"'), resource, verb)
        for group, resource, verbs in re.findall(row, table, flags=re.MULTILINE)
        for verb in verbs.split(", ")
    }


def test_the_docs_list_the_node_room_grant_as_it_is():
    """docs/design/kubernetes-resize.md ("Node room") and the guide's RBAC list the grant the
    component makes, and name it."""
    doc = (ROOT / "docs" / "design" / "kubernetes-resize.md").read_text()
    readme = (ROOT / "docs" / "security.md").read_text()
    section = "## Node room: what raysize reads and why"
    assert documented_node_room(doc, section) == NODE_ROOM_RULES
    assert documented_node_room(readme, "And, cluster-wide, the node room") == NODE_ROOM_RULES
    body = doc[doc.index(section) : doc.index("\n## ", doc.index(section) + 1)]
    for named in (NODE_ROOM, "deploy/components/node-room", "nodeRoom.enabled"):
        assert named in body, named


RAY_TOKEN_SECRETS = DEPLOY / "components" / "ray-token-secrets" / "kustomization.yaml"
CLUSTER_WIDE = DEPLOY / "components" / "cluster-wide" / "kustomization.yaml"


def comment_blocks(path: Path, first: str) -> list[Any]:
    """Every block of `#   `-indented comment lines of a file that starts with `#   <first>`
    (`commented_yaml` reads the first), uncommented and loaded."""
    lines = path.read_text().splitlines()
    blocks = []
    for start in [i for i, line in enumerate(lines) if line == f"#   {first}"]:
        block = []
        for line in lines[start:]:
            if not line.startswith("#   "):
                break
            block.append(line.removeprefix("#   "))
        blocks.append(yaml.safe_load("\n".join(block)))
    return blocks


def test_reading_ray_token_secrets_is_a_grant_of_its_own_that_a_comment_turns_off_or_narrows(
    tmp_path,
):
    """deploy/components/ray-token-secrets, as its comments say: deleted in an overlay of the
    base, nothing reads Secrets and nothing else changes; narrowed, only the Secrets named.
    The same for the cluster-wide component's ClusterRole."""
    base = render(DEPLOY)
    turn_off, narrow = comment_blocks(RAY_TOKEN_SECRETS, "patches:")
    off = render(overlay_of(tmp_path / "off", ["base"], [], patches=turn_off["patches"]))
    assert ray_token_grant(off) == {}
    assert [d for d in base if d["metadata"]["name"] != RAY_TOKENS] == off
    assert not [d for d in off for p in exact_rules(d.get("rules", [])) if p[1] == "secrets"]
    # narrowed in a namespace's folder (here: deploy/base/default's, after the component)
    folder = yaml.safe_load((DEPLOY / "base" / "default" / "kustomization.yaml").read_text())
    assert folder["components"] == ["../../components/ray-token-secrets"]
    shutil.copytree(DEPLOY, tmp_path / "narrow" / "deploy")
    mine = tmp_path / "narrow" / "deploy" / "base" / "default" / "kustomization.yaml"
    mine.write_text(yaml.safe_dump({**folder, **narrow}))
    (role,) = find(render(mine.parent.parent), "Role", RAY_TOKENS)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
         "resourceNames": ["train-1", "train-2"]}
    ]  # fmt: skip
    # cluster-wide: a ClusterRole, which the comment's patches delete or narrow
    everywhere = cluster_wide(tmp_path / "cw")
    assert ray_token_grant(everywhere) == {"": RAY_TOKEN_RULES}
    (delete,) = comment_blocks(CLUSTER_WIDE, "patches:")
    off = render(overlay_of(tmp_path / "cw-off", ["base"], ["components/cluster-wide"], **delete))
    assert ray_token_grant(off) == {} and grants(off) == grants(everywhere)
    lines = CLUSTER_WIDE.read_text().splitlines()
    start = lines.index("#     - target:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line.removeprefix("#   "))
    narrowed = render(
        overlay_of(tmp_path / "cw-narrow", ["base"], ["components/cluster-wide"],
                   patches=yaml.safe_load("\n".join(block)))
    )  # fmt: skip
    (role,) = find(narrowed, "ClusterRole", RAY_TOKENS)
    assert role["rules"][0]["resourceNames"] == ["train-1", "train-2"]


def documented_rules(text: str, start: str) -> set[tuple[str, str, str]]:
    """The permissions of the first table after `start`: rows of API group, resource (the
    first backticked name of the cell), "verb, verb", why."""
    after = text[text.index(start) :]
    table = after[after.index("| --- |") :].split("\n\n")[0]
    out = set()
    for row in table.splitlines()[1:]:
        group, resource, verbs = (c.strip() for c in row.strip("| ").split(" | ")[:3])
        name = re.findall(r"`([^`]*)`", resource)[0]
        out |= {(group.strip('`"'), name, v) for v in verbs.split(", ")}
    return out


def test_the_security_page_lists_every_rule_as_it_is():
    """docs/security.md's tables are the grants: raysize's rules in each watched namespace,
    reading Ray token Secrets; and it names each profile's folder and Helm value."""
    page = (ROOT / "docs" / "security.md").read_text()
    assert documented_rules(page, "### In each watched namespace") == EXPECTED_RULES
    assert documented_rules(page, "### Ray token Secrets") == RAY_TOKEN_RULES
    for named in ("deploy/overlays/observe-only", "deploy/overlays/namespaced",
                  "deploy/components/ray-token-secrets", "deploy/components/observe-only",
                  "rayTokenSecrets.enabled", "rayTokenSecrets.names", "observeOnly=true",
                  "follow_token_file", "RAYSIZE_RAY_TOKEN_FOR"):  # fmt: skip
        assert named in page, named
    # the observe-only profile's row: OBSERVE_ONLY_RULES
    assert "read only: pods and RayClusters get, list, watch; Events create" in page
