"""Helpers for the deploy/ tests: render with kubectl's kustomize, run kubectl on a sandbox."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.realworld import RealControlPlane
from tests.orchestration.temporal_env import venv_binary

KUBECTL = venv_binary("kubectl")
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TRIAL = DEPLOY / "overlays" / "trial"
NAMESPACED = DEPLOY / "overlays" / "namespaced"
EXAMPLE = DEPLOY / "examples" / "raycluster-ippr.yaml"
SA_USER = "system:serviceaccount:raysize:raysize"
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def dockerignore_patterns() -> list[str]:
    """deploy/Dockerfile.dockerignore's patterns, in order (comments and blanks dropped)."""
    return [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def run_kubectl(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    home = str(kubeconfig.parent) if kubeconfig else os.environ.get("HOME", "/tmp")
    env = {**os.environ, "HOME": home}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [KUBECTL, *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )


def render(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <path>`: offline, no cluster."""
    out = run_kubectl("kustomize", str(path))
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# deploy/components/node-room (in deploy/base; the chart's nodeRoom.enabled): the room of
# the nodes Ray pods run on (activities/node_room.py), read in every namespace.
NODE_ROOM = "raysize-node-room"
# (apiGroup, resource, verb): the whole node-room grant, and nothing else
NODE_ROOM_RULES = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
}


# deploy/components/ray-token-secrets (the chart's rayTokenSecrets): reading a Ray
# cluster's own token Secret (activities/ray_tokens.py), a Role per namespace that opts in
# (cluster-wide: a ClusterRole)
RAY_TOKENS = "raysize-ray-tokens"
RAY_TOKEN_RULES = {("", "secrets", "get")}


def ray_token_grant(
    docs: list[dict[str, Any]], name: str = RAY_TOKENS, namespace: str = "raysize"
) -> dict[str, set[tuple[str, str, str]]]:
    """Where an install lets raysize read Ray token Secrets: namespace ("" for every
    namespace) → the permissions, each a Role (ClusterRole) bound by its own RoleBinding
    (ClusterRoleBinding) of the same name to raysize's ServiceAccount (in `namespace`)
    only, and no other binding of it."""
    out: dict[str, set[tuple[str, str, str]]] = {}
    for kind, binding_kind in (("ClusterRole", "ClusterRoleBinding"), ("Role", "RoleBinding")):
        for role in find(docs, kind, name):
            ns = role["metadata"].get("namespace", "")
            (binding,) = [
                b
                for b in find(docs, binding_kind, name)
                if b["metadata"].get("namespace", "") == ns
            ]
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": kind,
                "name": name,
            }
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "raysize", "namespace": namespace}
            ]
            assert ns not in out, f"two {name} grants in {ns!r}"
            out[ns] = exact_rules(role["rules"])
    bindings = find(docs, "RoleBinding", name) + find(docs, "ClusterRoleBinding", name)
    assert len(bindings) == len(out), "a binding without its role"
    others = [
        b["metadata"]["name"]
        for b in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")
        if b["roleRef"]["name"] == name and b["metadata"]["name"] != name
    ]
    assert not others, f"{name} is bound again by {others}"
    return out


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule.get("apiGroups", [])
        for r in rule.get("resources", [])
        for v in rule.get("verbs", [])
    }


# the objects a grant is limited to by name: (apiGroup, resource) → resourceNames (None:
# any the user lists: the Ray token Secrets, when narrowed to their names)
LIMITED_BY_NAME: dict[tuple[str, str], list[str] | None] = {
    ("", "configmaps"): ["raysize-launch-sizes"],
    ("", "secrets"): None,
}


def exact_rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """`rule_set` of rules that name what they grant: no nonResourceURLs, no wildcard, no
    permission listed twice, and no resourceNames but the launch-sizes ConfigMap's (the one
    object raysize writes by a name of its own) or the Secrets a user narrows the Ray token
    grant to (`LIMITED_BY_NAME`)."""
    for rule in rules:
        if "resourceNames" in rule:
            limited = {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
            assert len(limited) == 1, rule
            named = LIMITED_BY_NAME.get(next(iter(limited)), [])
            assert rule["resourceNames"] == named or (named is None and rule["resourceNames"])
            rule = {k: v for k, v in rule.items() if k != "resourceNames"}
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
    granted = rule_set(rules)
    assert len(granted) == sum(
        len(r["apiGroups"]) * len(r["resources"]) * len(r["verbs"]) for r in rules
    ), "a permission is listed twice"
    return granted


def node_room_grant(
    docs: list[dict[str, Any]], name: str = NODE_ROOM, namespace: str = "raysize"
) -> set[tuple[str, str, str]] | None:
    """The permissions an install's node-room grant gives (None: it has none): one
    ClusterRole bound by one ClusterRoleBinding, in every namespace, to raysize's
    ServiceAccount (in `namespace`) only; no Role or RoleBinding of that name, and no other
    binding of that ClusterRole."""
    assert not find(docs, "Role", name) and not find(docs, "RoleBinding", name)
    roles, bindings = find(docs, "ClusterRole", name), find(docs, "ClusterRoleBinding", name)
    others = [
        b["metadata"]["name"]
        for b in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")
        if b["roleRef"]["name"] == name and b["metadata"]["name"] != name
    ]
    assert not others, f"{name} is bound again by {others}"
    if not roles and not bindings:
        return None
    (role,), (binding,) = roles, bindings
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": name,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "raysize", "namespace": namespace}
    ]
    return exact_rules(role["rules"])


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[tuple[Sandbox, Path]]:
    """A fresh sandbox and its kubeconfig; closed after the test."""
    sb = Sandbox(SandboxConfig(nodes=1, timing=KubeletTiming(actuation_delay_s=0.0))).start()
    try:
        yield sb, sb.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        sb.close()


@pytest.fixture
def kubectl(sandbox: tuple[Sandbox, Path]) -> Callable[..., subprocess.CompletedProcess[str]]:
    _, kubeconfig = sandbox

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return run_kubectl(*args, kubeconfig=kubeconfig)

    return call


MONITORING = DEPLOY / "components" / "monitoring"


def overlay_of(tmp: Path, resources: list[str], components: list[str], **more: Any) -> Path:
    """A user's overlay next to a copy of deploy/ (kustomize wants relative paths):
    `resources` and `components` are paths inside deploy/; `more`, more fields of its
    kustomization.yaml (`patches`)."""
    shutil.copytree(DEPLOY, tmp / "deploy", dirs_exist_ok=True)
    overlay = tmp / "mine"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"../deploy/{r}" for r in resources],
                "components": [f"../deploy/{c}" for c in components],
                **more,
            }
        )
    )
    return overlay


def commented_yaml(path: Path, first: str) -> dict[str, Any]:
    """The YAML a file shows in its comments, as a user would paste it: the block of
    `#   `-indented comment lines that starts with `#   <first>`, uncommented."""
    lines = path.read_text().splitlines()
    start = lines.index(f"#   {first}")
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line.removeprefix("#   "))
    loaded: dict[str, Any] = yaml.safe_load("\n".join(block))
    return loaded


@pytest.fixture(scope="session")
def dry_run_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real kube-apiserver (no KubeRay operator, no kubelet: nothing runs) with the
    Prometheus Operator's CRDs and namespace raysize, for `--dry-run=server`; its admin
    kubeconfig."""
    cp = RealControlPlane(operator=False).start()
    try:
        cp.install_crds(sorted(cp.parts.prometheus_operator_crds.glob("*.yaml")))
        admin = cp.write_kubeconfig(tmp_path_factory.mktemp("dry-run") / "admin")
        made = run_kubectl("create", "namespace", "raysize", kubeconfig=admin)
        assert made.returncode == 0, made.stderr
        yield admin
    finally:
        cp.close()
