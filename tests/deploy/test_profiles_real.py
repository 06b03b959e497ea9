"""Each RBAC profile of deploy/ on the real kube-apiserver v1.36 (RBAC enforced; no KubeRay
operator, no kubelet: nothing needs to run for a grant to be judged). For each profile the
worker's ServiceAccount token is allowed exactly what raysize's calls need in that profile
(test_manifests.py: EXPECTED_RULES, OBSERVE_ONLY_RULES, RAY_TOKEN_RULES, NODE_ROOM_RULES)
and refused everything else, as the server's own authorizer answers
(SelfSubjectAccessReview with that token, `kubectl auth can-i`'s question), in the watched
namespaces, raysize's own, one it does not watch and kube-system. And real calls with the
token: the observe-only worker reads and records Events but cannot resize, annotate or
scale; without the Ray token grant a cluster's Secret is refused and said once; the
namespaced overlay is applied by a user who is not cluster-admin.

The profiles (docs/security.md, "RBAC profiles"):
  default         deploy/                          (Role in "default", node room, Ray token Secrets)
  no-secrets      deploy/ without ray-token-secrets (its comment's patches)
  narrowed        deploy/ with the Secrets narrowed to train-1 (its comment's patch)
  observe-only    deploy/overlays/observe-only
  namespaced      deploy/overlays/namespaced       (team-a, team-b; nothing cluster-scoped)
  cluster-wide    deploy/ + components/cluster-wide
  observe-wide    deploy/ + components/cluster-wide + components/observe-only
"""

from __future__ import annotations

import base64
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from raysize.activities.discovery import list_rayclusters
from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import Forbidden
from raysize.activities.ray_errors import RayAuthUnavailable
from raysize.activities.ray_tokens import RayTokens, token_source
from raysize.sandbox.realworld import RealControlPlane
from raysize.worker.run import namespace_problem
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.resources import GIB
from tests.deploy.conftest import (
    DEPLOY,
    EXAMPLE,
    NAMESPACED,
    NODE_ROOM_RULES,
    RAY_TOKEN_RULES,
    SA_USER,
    commented_yaml,
    overlay_of,
    run_kubectl,
)
from tests.deploy.test_manifests import (
    EXPECTED_RULES,
    OBSERVE_ONLY,
    OBSERVE_ONLY_RULES,
    RAY_TOKEN_SECRETS,
    comment_blocks,
)
from tests.sandbox.conftest import wait_for

Perm = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
LAUNCH_SIZES = "raysize-launch-sizes"
# what no profile grants, in any namespace: each a call a stolen token would like to make
NEVER: set[Perm] = {
    ("", "pods", "create"),
    ("", "pods", "delete"),
    ("", "pods", "update"),
    ("", "pods/status", "patch"),
    ("", "pods/exec", "create"),
    ("", "pods/eviction", "create"),
    ("", "secrets", "list"),
    ("", "secrets", "watch"),
    ("", "secrets", "create"),
    ("", "configmaps", "list"),
    ("", "configmaps", "delete"),
    ("", "configmaps", "update"),
    ("", "events", "list"),
    ("", "events", "delete"),
    ("", "serviceaccounts/token", "create"),
    ("ray.io", "rayclusters", "create"),
    ("ray.io", "rayclusters", "delete"),
    ("ray.io", "rayclusters", "update"),
    ("ray.io", "rayclusters/status", "patch"),
    ("rbac.authorization.k8s.io", "roles", "create"),
    ("rbac.authorization.k8s.io", "rolebindings", "create"),
    ("apps", "deployments", "patch"),
}
UNIVERSE: set[Perm] = (
    EXPECTED_RULES
    | OBSERVE_ONLY_RULES
    | RAY_TOKEN_RULES
    | NEVER
    | {p for p in NODE_ROOM_RULES if p[1] == "pods"}
)
NAMESPACES = ("default", "team-a", "team-b", "raysize", "kube-system")


@dataclass(frozen=True)
class Profile:
    name: str
    rules: set[Perm]  # raysize's rules where it watches
    watched: tuple[str, ...]  # () : every namespace (a ClusterRole)
    tokens: bool = True  # ray-token-secrets
    secrets: tuple[str, ...] = ()  # the Secrets it is narrowed to; (): any
    node_room: bool = True

    def allowed(self, perm: Perm, ns: str, name: str = "") -> bool:
        """Whether the profile lets the worker do `perm` on object `name` in `ns`: the
        rules exactly, no more."""
        here = not self.watched or ns in self.watched
        if perm in RAY_TOKEN_RULES:
            return here and self.tokens and (not self.secrets or name in self.secrets)
        if self.node_room and perm in NODE_ROOM_RULES:
            return True  # list/watch pods in every namespace
        if perm[1] == "configmaps" and perm[2] in ("get", "patch") and name != LAUNCH_SIZES:
            return False  # only raysize's own ConfigMap, by name
        return here and perm in self.rules


PROFILES = {
    p.name: p
    for p in (
        Profile("default", EXPECTED_RULES, ("default",)),
        Profile("no-secrets", EXPECTED_RULES, ("default",), tokens=False),
        Profile("narrowed", EXPECTED_RULES, ("default",), secrets=("train-1", "train-2")),
        Profile("observe-only", OBSERVE_ONLY_RULES, ("default",)),
        Profile("namespaced", EXPECTED_RULES, ("team-a", "team-b"), node_room=False),
        Profile("cluster-wide", EXPECTED_RULES, ()),
        Profile("observe-wide", OBSERVE_ONLY_RULES, ()),
    )
}


def kustomization(name: str, tmp: Path) -> Path:
    """The folder `kubectl apply -k` applies for the profile."""
    if name == "default":
        return DEPLOY
    if name == "observe-only":
        return OBSERVE_ONLY
    if name == "namespaced":
        return NAMESPACED
    if name == "no-secrets":
        off = commented_yaml(RAY_TOKEN_SECRETS, "patches:")
        return overlay_of(tmp, ["base"], [], **off)
    if name == "narrowed":  # in deploy/base/default's folder, as the comment says
        shutil.copytree(DEPLOY, tmp / "deploy")
        folder = tmp / "deploy" / "base" / "default" / "kustomization.yaml"
        _, narrow = comment_blocks(RAY_TOKEN_SECRETS, "patches:")
        folder.write_text(yaml.safe_dump({**yaml.safe_load(folder.read_text()), **narrow}))
        return tmp / "deploy"
    components = {
        "cluster-wide": ["components/cluster-wide"],
        "observe-wide": ["components/cluster-wide", "components/observe-only"],
    }[name]
    return overlay_of(tmp, ["base"], components)


class World:
    def __init__(self, cp: RealControlPlane, tmp: Path) -> None:
        self.cp, self.tmp = cp, tmp
        self.admin = cp.write_kubeconfig(tmp / "admin")
        self._worker: Path | None = None

    def kubectl(self, *args: str, kubeconfig: Path | None = None) -> Any:
        return run_kubectl(*args, kubeconfig=kubeconfig or self.admin)

    def worker(self) -> Kube:
        if self._worker is None:
            self._worker = self.cp.service_account_kubeconfig(
                self.tmp / "worker", "raysize", "raysize"
            )
        return Kube(config.new_client_from_config(config_file=str(self._worker)), timeout_s=5.0)

    def admin_api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.admin))

    def remove_grants(self) -> None:
        """Every raysize Role, ClusterRole and binding, so that the next profile starts
        from none (the other objects stay: applying again updates them)."""
        for kinds in ("roles,rolebindings", "clusterroles,clusterrolebindings"):
            out = self.kubectl(
                "delete", kinds, "-A", "-l", "app.kubernetes.io/part-of=raysize", "--wait"
            )
            assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A real API server with KubeRay's CRDs; the namespaces every profile uses; the example
    RayCluster (no operator: nothing runs, the object is what raysize reads) and a Ray
    pod in namespaces default and team-a, and a Secret named like a token in each namespace."""
    tmp = tmp_path_factory.mktemp("profiles")
    cp = RealControlPlane(operator=False).start()
    try:
        w = World(cp, tmp)
        for ns in ("raysize", "team-a", "team-b"):
            made = w.kubectl("create", "namespace", ns)
            assert made.returncode == 0, made.stderr
        core = client.CoreV1Api(w.admin_api())
        custom = client.CustomObjectsApi(w.admin_api())
        for ns in ("default", "team-a"):  # the first namespace of each profile
            rc = yaml.safe_load(EXAMPLE.read_text())
            rc["metadata"]["namespace"] = ns
            custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)
            core.create_namespaced_pod(ns, ray_pod())
        for ns in NAMESPACES:
            for name in ("train-1", "other"):
                core.create_namespaced_secret(ns, token_secret(name))
        yield w
    finally:
        cp.close()


def ray_pod() -> dict[str, Any]:
    """A worker pod as KubeRay makes them (its labels: what the admission policy allows)."""
    return {
        "metadata": {
            "name": "raysize-example-cpu-worker-x",
            "labels": {
                "ray.io/cluster": "raysize-example",
                "ray.io/group": "cpu",
                "ray.io/node-type": "worker",
                "app.kubernetes.io/created-by": "kuberay-operator",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "rayproject/ray:2.60.0",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "2Gi"},
                        "limits": {"cpu": "1", "memory": "2Gi"},
                    },
                }
            ]
        },
    }


def token_secret(name: str) -> dict[str, Any]:
    token = base64.b64encode(f"token-of-{name}".encode()).decode()
    return {"metadata": {"name": name}, "data": {"auth_token": token}}


def can(kube: Kube, perm: Perm, ns: str, name: str = "") -> bool:
    """The real authorizer's answer for the worker's token (a SelfSubjectAccessReview: what
    `kubectl auth can-i` asks); ns "" for every namespace."""
    group, resource, verb = perm
    resource, _, sub = resource.partition("/")
    attrs = {"group": group, "resource": resource, "verb": verb, "namespace": ns}
    if sub:
        attrs["subresource"] = sub
    if name:
        attrs["name"] = name
    review = client.AuthorizationV1Api(kube.api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": attrs}}
    )
    return bool(review.status.allowed)


def probes() -> list[tuple[Perm, str]]:
    """Each permission of UNIVERSE, on an object of no name and, for the rules limited to
    names, on the name granted and on another."""
    out: list[tuple[Perm, str]] = []
    for perm in sorted(UNIVERSE):
        if perm[1] == "configmaps" and perm[2] in ("get", "patch"):
            out += [(perm, LAUNCH_SIZES), (perm, "someone-elses")]
        elif perm[1] == "secrets" and perm[2] == "get":
            out += [(perm, "train-1"), (perm, "other")]
        else:
            out.append((perm, ""))
    return out


@pytest.fixture(params=list(PROFILES))
def applied(request: pytest.FixtureRequest, world: World, tmp_path: Path) -> Iterator[Profile]:
    """The profile applied by the admin (but namespaced: by a namespace admin,
    test_the_namespaced_profile_needs_no_cluster_admin); its grants removed after."""
    profile = PROFILES[request.param]
    try:
        out = world.kubectl("apply", "-k", str(kustomization(profile.name, tmp_path)))
        assert out.returncode == 0, out.stderr
        kube = world.worker()
        # RBAC's cache follows the new objects within moments
        watched = profile.watched[0] if profile.watched else "team-b"
        wait_for(lambda: can(kube, ("", "events", "create"), watched), timeout=30)
        yield profile
    finally:
        world.remove_grants()
        wait_for(lambda: not can(world.worker(), ("", "events", "create"), "default"), timeout=30)


def test_the_worker_may_do_exactly_what_its_profile_needs(applied: Profile, world: World) -> None:
    """In every namespace, every permission raysize's code needs in the profile is allowed,
    and every other one (NEVER, the writes in observe-only, Secrets without the grant or
    outside the names, anything outside the watched namespaces) is refused."""
    kube = world.worker()
    wrong = [
        f"{'may' if got else 'may not'} {perm[2]} {perm[1]}{'/' + name if name else ''} in {ns}"
        for ns in NAMESPACES
        for perm, name in probes()
        if (got := can(kube, perm, ns, name)) != applied.allowed(perm, ns, name)
    ]
    assert not wrong, f"{applied.name}: " + "; ".join(wrong)
    # cluster-scoped: the node room's nodes, and nothing that writes them
    assert can(kube, ("", "nodes", "list"), "") is applied.node_room
    assert can(kube, ("", "nodes", "watch"), "") is applied.node_room
    assert not can(kube, ("", "nodes", "patch"), "")
    assert not can(kube, ("", "namespaces", "delete"), "")
    # every namespace at once: discovery's list of every RayCluster, a ClusterRole's only
    every = can(kube, ("ray.io", "rayclusters", "list"), "")
    assert every is (not applied.watched)


def test_in_its_profile_the_worker_does_what_it_does_and_no_write_beyond(
    applied: Profile, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Real calls with the worker's token, in its first watched namespace: what raysize's
    code does in the profile passes; a write the profile does not grant is refused (403,
    naming raysize's user) and leaves the object as it was; a Ray token Secret is read
    where the profile grants it, else refused, said once, never crashing."""
    kube, ns = world.worker(), (applied.watched or ("default",))[0]
    assert namespace_problem(kube, ns) is None  # the worker's start-up check
    cluster = kube.read_cluster(ns, "raysize-example")  # get rayclusters, list pods
    assert cluster.groups.errors == ()
    assert [rc["metadata"]["name"] for rc in list_rayclusters(kube, ns)] == ["raysize-example"]
    kube.record_event(ns, "RayCluster", "raysize-example", "WouldResize", "a test")
    pod = "raysize-example-cpu-worker-x"
    admin = Kube(world.admin_api(), timeout_s=5.0)
    writes: dict[Perm, Any] = {
        ("", "pods/resize", "patch"): lambda: kube.patch_resize(ns, pod, 2000, 4 * GIB),
        ("", "pods", "patch"): lambda: kube.set_ippr_status(ns, pod, IpprStatus(raylet_id="r1")),
        ("ray.io", "rayclusters", "patch"): lambda: kube.scale(
            ns, "raysize-example", {"cpu": 2}, {}
        ),
        ("", "configmaps", "create"): lambda: kube.core.create_namespaced_config_map(
            ns, {"metadata": {"name": LAUNCH_SIZES}}, dry_run="All"
        ),
    }
    for perm, write in writes.items():
        before = admin.get_pod(ns, pod)
        if applied.allowed(perm, ns):
            write()
            continue
        with pytest.raises((ApiException, Forbidden)) as refused:
            write()
        assert getattr(refused.value, "status", None) == 403, perm
        assert SA_USER in str(getattr(refused.value, "body", "") or refused.value), perm
        after = admin.get_pod(ns, pod)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    if applied.allowed(("", "pods/resize", "patch"), ns):
        admin.patch_resize(ns, pod, 1000, 2 * GIB)  # back, for the next profile
    if applied.allowed(("ray.io", "rayclusters", "patch"), ns):
        admin.scale(ns, "raysize-example", {"cpu": 1}, {})
    # the cluster's Ray token, from its Secret
    caplog.set_level(logging.INFO, logger="raysize.activities")
    tokens = RayTokens(kube.read_secret)
    rc = {"metadata": {"namespace": ns, "name": "train-1"},
          "spec": {"authOptions": {"mode": "token"}}}  # fmt: skip
    source = token_source(rc)
    if applied.tokens:
        assert tokens.token(source) == "token-of-train-1"
        return
    for _ in range(2):
        with pytest.raises(RayAuthUnavailable) as refused:
            tokens.token(source)
        assert refused.value.retryable is False
    said = [r.getMessage() for r in caplog.records if "uses Ray token auth" in r.getMessage()]
    assert len(said) == 1, said
    assert f"RayCluster {ns}/train-1" in said[0] and f"Secret {ns}/train-1" in said[0]
    assert "deploy/components/ray-token-secrets" in said[0]


# What applying deploy/overlays/namespaced takes (docs/security.md, "A namespaced install
# without cluster-admin"): in raysize's namespace, its objects; in each watched namespace,
# the Roles and bindings, and every permission they grant (Kubernetes lets a user grant
# only what they hold). `kubectl apply` reads each object first, then creates or patches.
APPLY = ["get", "create", "patch"]
INSTALLER = {
    "raysize": [
        {"apiGroups": [""], "resources": ["serviceaccounts", "configmaps"], "verbs": APPLY},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": APPLY},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": APPLY},
    ],
    "watched": [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
         "verbs": APPLY},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"],
         "verbs": ["get", "list", "watch", "patch"]},
    ],
}  # fmt: skip


def test_the_namespaced_profile_needs_no_cluster_admin(world: World, tmp_path: Path) -> None:
    """deploy/overlays/namespaced, applied by a user who holds only INSTALLER, by Roles in
    raysize's namespace and the watched ones (no ClusterRole, no cluster-scoped right): it
    applies, creates nothing cluster-scoped, and the worker may act in team-a and not in
    default. One permission less in a watched namespace and the apply is refused."""
    rbac = client.RbacAuthorizationV1Api(world.admin_api())
    installer = "installer"
    where = {"raysize": "raysize", "team-a": "watched", "team-b": "watched"}

    def grant(rules_of: dict[str, list[dict[str, Any]]]) -> None:
        for ns, which in where.items():
            rbac.create_namespaced_role(
                ns, {"metadata": {"name": installer}, "rules": rules_of[which]}
            )
            rbac.create_namespaced_role_binding(
                ns,
                {
                    "metadata": {"name": installer},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": installer},
                    "subjects": [{"kind": "ServiceAccount", "name": installer,
                                  "namespace": "raysize"}],
                },
            )  # fmt: skip

    def revoke() -> None:
        for ns in where:
            rbac.delete_namespaced_role_binding(installer, ns)
            rbac.delete_namespaced_role(installer, ns)

    user = world.cp.service_account_kubeconfig(tmp_path / "installer", "raysize", installer)
    try:
        # one permission short (pods/resize): Kubernetes refuses to let it grant that
        short = [r for r in INSTALLER["watched"] if r["resources"] != ["pods/resize"]]
        grant({**INSTALLER, "watched": short})
        wait_for(lambda: world.kubectl("auth", "can-i", "create", "roles", "-n", "team-a",
                                       kubeconfig=user).stdout.strip() == "yes", timeout=30)  # fmt: skip
        refused = world.kubectl("apply", "-k", str(NAMESPACED), kubeconfig=user)
        assert refused.returncode != 0
        assert "attempting to grant RBAC permissions not currently held" in refused.stderr
        revoke()
        world.remove_grants()
        grant(INSTALLER)
        # not a cluster admin: it may not make anything cluster-scoped
        for kind in ("clusterroles", "validatingadmissionpolicies", "namespaces"):
            denied = world.kubectl("auth", "can-i", "create", kind, kubeconfig=user)
            assert denied.stdout.strip() == "no", kind
        applied = world.kubectl("apply", "-k", str(NAMESPACED), kubeconfig=user)
        assert applied.returncode == 0, applied.stderr
        assert "role.rbac.authorization.k8s.io/raysize created" in applied.stdout
        assert "raysize-ray-tokens created" in applied.stdout
        assert not [line for line in applied.stdout.splitlines() if "cluster" in line.split("/")[0]]
        kube = world.worker()
        wait_for(lambda: can(kube, ("", "pods/resize", "patch"), "team-a"), timeout=30)
        assert namespace_problem(kube, "team-a") is None
        assert "may not act" in str(namespace_problem(kube, "default"))
        with pytest.raises((ApiException, Forbidden)) as denied_list:
            list_rayclusters(kube, "default")
        assert getattr(denied_list.value, "status", None) == 403
    finally:
        world.remove_grants()
        for ns in where:
            for delete in (rbac.delete_namespaced_role_binding, rbac.delete_namespaced_role):
                try:
                    delete(installer, ns)
                except ApiException as exc:
                    assert exc.status == 404


def test_cluster_wide_secret_reads_reach_every_namespace(world: World, tmp_path: Path) -> None:
    """What the docs say cluster-wide mode means for Secrets: with the cluster-wide
    component, the worker's token reads any Secret of the cluster by name, kube-system's
    too; narrowed by the comment's patch, only the names listed."""
    try:
        out = world.kubectl("apply", "-k", str(kustomization("cluster-wide", tmp_path / "a")))
        assert out.returncode == 0, out.stderr
        kube = world.worker()
        wait_for(lambda: can(kube, ("", "secrets", "get"), "kube-system", "other"), timeout=30)
        assert kube.read_secret("kube-system", "other")["data"]["auth_token"]
    finally:
        world.remove_grants()
