"""`raysize doctor` (#28 item 4), run as an operator runs it (its own process, the RAYSIZE_*
settings the worker reads), in both worlds: the embedded sandbox, and the real
kube-apiserver with KubeRay's CRDs, where the RBAC answers come from the real server's
authorizer for raysize's own ServiceAccount token. Temporal is the real dev server; the
GCS of a managed cluster is the Ray stand-in, and a GCS that never answers is a socket
that accepts connections and says nothing."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from raysize.activities.cluster import RaySettings
from raysize.activities.ray_tokens import RayTokens
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.gcs_standin import GcsStandIn
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.ray_standin import RayStandIn
from raysize.sandbox.rbac import Authorizer, service_account_user
from raysize.sandbox.realworld import RealControlPlane
from raysize.worker.cli import app
from raysize.worker.cli_doctor import (
    LAUNCH_SIZE_PERMISSIONS,
    NODE_ROOM_PERMISSIONS,
    RAY_TOKEN_PERMISSIONS,
    WORKER_PERMISSIONS,
    Doctor,
    Permission,
    resize_policy_check,
)
from raysize.worker.cli_doctor import (
    doctor as run_doctor,
)
from raysize.worker.settings import Settings
from tests.deploy.conftest import DEPLOY, EXAMPLE
from tests.sandbox.conftest import wait_for

RAYSIZE = [sys.executable, "-m", "raysize.worker.cli"]
NOWHERE = "127.0.0.1:9"  # nothing listens
WORLDS = tuple(os.environ.get("RAYSIZE_TEST_WORLDS", "sandbox,real").split(","))
FULL, NO_RESIZE, SILENT = "team-a", "team-b", "team-s"  # namespaces, with their Role
ROLE = DEPLOY / "watched-namespace" / "role.yaml"
CLUSTER_ROLE = DEPLOY / "components" / "cluster-wide" / "clusterrole.yaml"
NODE_ROOM_ROLE = DEPLOY / "components" / "node-room" / "clusterrole.yaml"
TOKEN_ROLE = DEPLOY / "components" / "ray-token-secrets" / "role.yaml"
TOKEN_CLUSTER_ROLE = DEPLOY / "components" / "cluster-wide" / "ray-token-secrets.yaml"


def rules_of(path: Path, kind: str) -> list[dict[str, Any]]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return list(doc["rules"])


def granted(rules: list[dict[str, Any]]) -> set[Permission]:
    return {
        Permission(group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def test_the_permissions_checked_are_what_deploy_grants() -> None:
    """The list doctor reviews is the Role's and the ClusterRole's rules, no more, no less:
    a rule added to deploy/ (or to the list) alone fails here."""
    every = set(WORKER_PERMISSIONS) | set(LAUNCH_SIZE_PERMISSIONS)
    assert granted(rules_of(ROLE, "Role")) == every
    assert granted(rules_of(CLUSTER_ROLE, "ClusterRole")) == every
    # reading Ray token Secrets: a grant of its own, in each mode
    assert granted(rules_of(TOKEN_ROLE, "Role")) == set(RAY_TOKEN_PERMISSIONS)
    assert granted(rules_of(TOKEN_CLUSTER_ROLE, "ClusterRole")) == set(RAY_TOKEN_PERMISSIONS)
    assert len(set(WORKER_PERMISSIONS)) == len(WORKER_PERMISSIONS)
    # the nodes' room (activities/node_room.py): what its informers call, all granted
    assert set(NODE_ROOM_PERMISSIONS) <= granted(rules_of(NODE_ROOM_ROLE, "ClusterRole"))


def test_a_container_that_restarts_on_resize_is_a_warning() -> None:
    rc = yaml.safe_load(EXAMPLE.read_text())
    assert resize_policy_check("default/x", rc).detail == "cpu and memory resize in place (cpu)"
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["resizePolicy"][1]["restartPolicy"] = "RestartContainer"
    check = resize_policy_check("default/x", rc)
    assert check.status == "warn"
    assert "group cpu container ray-worker memory (RestartContainer)" in check.detail
    assert "NotRequired" in check.detail
    del worker["resizePolicy"]  # left out: Kubernetes' default, NotRequired
    assert resize_policy_check("default/x", rc).status == "ok"
    # a group the annotation does not name is never resized: its policy does not matter
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["resizePolicy"] = [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]
    assert resize_policy_check("default/x", rc).status == "ok"
    rc["metadata"]["annotations"]["ray.io/ippr"] = "not json"  # then every group is looked at
    assert "group headgroup container ray-head cpu" in resize_policy_check("default/x", rc).detail


async def test_a_ray_older_than_2_60_fails_and_an_unknown_one_warns() -> None:
    """The version is the one the head recorded in the GCS; a GCS that does not say falls
    back on spec.rayVersion, and with neither, doctor cannot tell (a warning)."""
    rc = yaml.safe_load(EXAMPLE.read_text())
    doctor = Doctor(Settings(), timeout_s=5.0)
    with RayStandIn(ray_version="2.59.0") as old:
        check = await doctor.gcs("default/x", rc, old.address, RaySettings())
    assert check.status == "FAIL", check
    assert check.detail.endswith(
        "but Ray 2.59.0 is older than 2.60, which raysize needs: upgrade the cluster's Ray"
    )
    with GcsStandIn() as silent_on_version:  # answers the state, not the version
        check = await doctor.gcs("default/x", rc, silent_on_version.address, RaySettings())
        assert check.status == "ok"
        assert check.detail.endswith("Ray 2.60.0 (spec.rayVersion; the GCS did not say)")
        del rc["spec"]["rayVersion"]
        check = await doctor.gcs("default/x", rc, silent_on_version.address, RaySettings())
    assert check.status == "warn" and "Ray version unknown" in check.detail


async def test_a_cluster_with_its_own_token_is_read_with_it() -> None:
    """A RayCluster with KubeRay's token auth (`authOptions.mode: token`) is read with the
    token in its Secret, as the worker reads it (activities/ray_tokens.py), not with the
    worker's own: doctor said FAIL (RayUnauthenticated) for a cluster the worker reads."""
    rc = yaml.safe_load(EXAMPLE.read_text())
    rc["metadata"].update(name="x", namespace="default")
    rc["spec"]["authOptions"] = {"mode": "token"}
    secret = {"metadata": {"resourceVersion": "1"}, "data": {"auth_token": "b3du"}}  # "own"
    read: list[tuple[str, str]] = []

    def read_secret(ns: str, name: str) -> dict[str, Any]:
        read.append((ns, name))
        return secret

    doctor = Doctor(Settings(), timeout_s=5.0)
    with GcsStandIn(token="own") as gcs:
        ray = RaySettings(gcs_override=gcs.address, token="the-workers")
        gcs_check, _ = await doctor.cluster(rc, ray, RayTokens(read_secret, ray.token))
        assert gcs_check.status == "ok", gcs_check
        assert read == [("default", "x")]  # KubeRay's Secret, named after the cluster
        # the worker's own token is refused by that Ray, and doctor says whose token it was
        secret["data"] = {"auth_token": "d3Jvbmc="}  # "wrong"
        refused, _ = await doctor.cluster(rc, ray, RayTokens(read_secret, ray.token))
    assert refused.status == "FAIL" and "Secret default/x, key auth_token" in refused.detail


def test_help_explains_the_checks() -> None:
    out = subprocess.run(
        [*RAYSIZE, "doctor", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for words in ("pods/resize", "SelfSubjectAccessReview", "search attributes", "GCS", "FAIL"):
        assert words in " ".join(out.split()), words
    listed = CliRunner().invoke(app, ["--help"])
    assert listed.exit_code == 0 and "doctor" in listed.stdout


# --- the worlds ---------------------------------------------------------------------------


@dataclass
class World:
    name: str
    worker_kubeconfig: Path
    gcs: RayStandIn
    temporal: str


def raycluster(namespace: str, name: str) -> dict[str, Any]:
    rc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    rc["metadata"].update(name=name, namespace=namespace)
    rc["spec"]["workerGroupSpecs"][0].update(replicas=0, minReplicas=0)
    return rc


def grant(api: client.ApiClient, namespace: str, rules: list[dict[str, Any]]) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "raysize"}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "raysize"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "raysize"},
            "subjects": [{"kind": "ServiceAccount", "name": "raysize", "namespace": "raysize"}],
        },
    )


def populate(api: client.ApiClient, gcs_port: int, silent_port: int, *, status: bool) -> None:
    """Three watched namespaces: team-a with the whole Role and a cluster whose GCS answers,
    team-b whose Role lacks pods/resize, team-s with a cluster whose GCS never answers.
    `status`: write each cluster's status as KubeRay would (no operator runs)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    full = rules_of(ROLE, "Role")
    for ns in ("raysize", FULL, NO_RESIZE, SILENT):
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account("raysize", {"metadata": {"name": "raysize"}})
    grant(api, FULL, full)
    grant(api, SILENT, full)
    grant(api, NO_RESIZE, [r for r in full if r["resources"] != ["pods/resize"]])
    for ns, name, port in ((FULL, "answers", gcs_port), (SILENT, "silent", silent_port)):
        rc = raycluster(ns, name)
        if ns == FULL:  # as KubeRay marks a RayService's clusters
            rc["metadata"]["annotations"]["ray.io/kuberay-version"] = "v1.6.1"
        custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)
        if status:
            custom.patch_namespaced_custom_object_status(
                "ray.io", "v1", ns, "rayclusters", name,
                {"status": {"head": {"serviceIP": "127.0.0.1"}, "endpoints": {"gcs": str(port)}}},
            )  # fmt: skip


def gcs_of(api: client.ApiClient, ns: str, name: str) -> str:
    rc = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", name
    )
    status = rc.get("status") or {}
    return f"{(status.get('head') or {}).get('serviceIP')}:{(status.get('endpoints') or {}).get('gcs')}"


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """Accepts connections (the kernel does, into the backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture(scope="module")
def gcs() -> Iterator[RayStandIn]:
    # the head says 2.60.1, the RayCluster 2.60.0: doctor reports what the GCS says
    with RayStandIn(ray_version="2.60.1") as ray:
        ray.add_node("answers-head", "headgroup", 1.0, 2 * 1024**3)
        yield ray


@pytest.fixture(scope="module", params=WORLDS)
def world(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    dev: WorkflowEnvironment,
    gcs: RayStandIn,
    silent_port: int,
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp(f"doctor-{request.param}")
    temporal = dev.client.service_client.config.target_host
    if request.param == "sandbox":
        sb = Sandbox(
            SandboxConfig(nodes=1, timing=KubeletTiming(actuation_delay_s=0.0), kubernetes_minor=36)
        ).start()
        try:
            kubeconfig = sb.write_kubeconfig(tmp / "kubeconfig")
            api = config.new_client_from_config(config_file=str(kubeconfig))
            for ns, name, port in ((FULL, "answers", gcs.port), (SILENT, "silent", silent_port)):
                sb.serve_gcs(ns, name, port)
            populate(api, gcs.port, silent_port, status=False)
            # KubeRay's stand-in reports the head's address once the head pod runs
            for ns, name, port in ((FULL, "answers", gcs.port), (SILENT, "silent", silent_port)):
                wanted = (ns, name, f"127.0.0.1:{port}")
                wait_for(lambda w=wanted: gcs_of(api, w[0], w[1]) == w[2], timeout=30)
            # from here on every client is raysize's ServiceAccount, as RBAC sees it
            sb.api.authorizer = Authorizer(sb.store, service_account_user("raysize", "raysize"))
            yield World("sandbox", kubeconfig, gcs, temporal)
        finally:
            sb.close()
        return
    cp = RealControlPlane(operator=False).start()
    try:
        admin = cp.write_kubeconfig(tmp / "admin")
        api = config.new_client_from_config(config_file=str(admin))
        populate(api, gcs.port, silent_port, status=True)
        worker = cp.service_account_kubeconfig(tmp / "worker", "raysize", "raysize")
        yield World("real", worker, gcs, temporal)
    finally:
        cp.close()


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def doctor(w: World, *args: str, process: bool = False, **settings: str) -> Ran:
    """`raysize doctor --timeout 1 …` with these settings: in a process of its own as an
    operator runs it, or in this one (the same command, without the interpreter's start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYSIZE_", "RAY_"))}
    env.update(
        {
            "RAYSIZE_KUBECONFIG": str(w.worker_kubeconfig),
            "RAYSIZE_TEMPORAL_ADDRESS": w.temporal,
            "RAYSIZE_NAMESPACES": FULL,
            **settings,
        }
    )
    argv = ["doctor", "--timeout", "1", *args]
    if process:
        done = subprocess.run(
            [*RAYSIZE, *argv], capture_output=True, text=True, timeout=60, env=env
        )
        return Ran(done.returncode, done.stdout, done.stderr)
    unset = {k: None for k in os.environ if k.startswith(("RAYSIZE_", "RAY_")) and k not in env}
    result = CliRunner().invoke(app, argv, env={**unset, **env})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def lines(out: str) -> dict[str, tuple[str, str]]:
    """check → (status, detail), from `ok    check: detail` lines."""
    found = {}
    for line in out.splitlines():
        status, _, rest = line.partition("  ")
        check, _, detail = rest.strip().partition(": ")
        found[check] = (status.strip(), detail)
    return found


def test_all_green_exits_0(world: World) -> None:
    done = doctor(world, process=True)
    assert done.returncode == 0, done.stdout + done.stderr
    got = lines(done.stdout)
    assert got["kubernetes"][0] == "ok" and "pods/resize served" in got["kubernetes"][1]
    assert "v1.36" in got["kubernetes"][1]
    assert got["kuberay"] == ("ok", "rayclusters.ray.io/v1 served, operator v1.6.1")
    assert got["rbac"] == ("ok", f"namespace {FULL}: all 10 permissions the worker needs")
    # this world grants no node room (deploy/components/node-room): a warning, exit 0
    status, detail = got["node room"]
    assert status == "warn" and detail.startswith("may not list nodes, watch nodes, list pods")
    assert "apply deploy/components/node-room" in detail
    # the grants raysize works without: the launch size's, and the Ray tokens'
    assert got["launch size"] == ("ok", f"namespace {FULL}: may write the size new pods start at")
    # (this world's namespace has the Role of deploy/watched-namespace only)
    status, detail = got["ray tokens"]
    assert status == "warn" and detail.startswith(f"namespace {FULL}: may not get secrets: ")
    assert "apply deploy/components/ray-token-secrets" in detail
    assert got["temporal"][0] == "ok" and world.temporal in got["temporal"][1]
    assert got["search attributes"][0] == "ok"
    assert got["ray client"] == ("ok", "each GCS: no token, TLS off")
    status, detail = got[f"cluster {FULL}/answers"]
    assert status == "ok", detail
    assert f"GCS 127.0.0.1:{world.gcs.port} answers, 1 Raylet alive, Ray 2.60.1" == detail
    assert got[f"resize policy {FULL}/answers"][0] == "ok"
    assert not [c for c in got if c.startswith(("cluster ", "resize policy ")) and "silent" in c]
    # and for machines
    done = doctor(world, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True
    assert {c["check"] for c in doc["checks"]} >= {"kubernetes", "rbac", "temporal"}


def test_a_missing_permission_is_named_and_fails(world: World) -> None:
    done = doctor(world, RAYSIZE_NAMESPACES=f"{FULL},{NO_RESIZE}")
    assert done.returncode == 1, done.stdout + done.stderr
    rbac = [line for line in done.stdout.splitlines() if " rbac: " in line]
    assert rbac == [
        f"ok    rbac: namespace {FULL}: all 10 permissions the worker needs",
        f"FAIL  rbac: namespace {NO_RESIZE}: may not patch pods/resize: apply "
        f"deploy/watched-namespace in {NO_RESIZE} (or a Role with these rules)",
    ]


def test_temporal_down_fails_naming_the_address(world: World) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{s.getsockname()[1]}"
    done = doctor(world, RAYSIZE_TEMPORAL_ADDRESS=nowhere)
    assert done.returncode == 1, done.stdout + done.stderr
    status, detail = lines(done.stdout)["temporal"]
    assert status == "FAIL" and f"Temporal at {nowhere}" in detail, detail
    assert "search attributes" not in lines(done.stdout)
    assert lines(done.stdout)["kubernetes"][0] == "ok"  # the other checks still ran


def test_a_temporal_namespace_that_does_not_exist_fails_naming_the_fix(world: World) -> None:
    done = doctor(world, RAYSIZE_TEMPORAL_NAMESPACE="nope")
    assert done.returncode == 1, done.stdout + done.stderr
    status, detail = lines(done.stdout)["temporal"]
    assert status == "FAIL", detail
    assert "namespace 'nope' does not exist" in detail
    assert "temporal operator namespace create --namespace nope" in detail


def test_a_gcs_that_does_not_answer_fails_that_cluster_only(world: World) -> None:
    done = doctor(world, RAYSIZE_NAMESPACES=f"{FULL},{SILENT}")
    assert done.returncode == 1, done.stdout + done.stderr
    got = lines(done.stdout)
    assert got[f"cluster {FULL}/answers"][0] == "ok"
    status, detail = got[f"cluster {SILENT}/silent"]
    assert status == "FAIL"
    assert detail.startswith("GCS 127.0.0.1:") and "did not answer within 1 s" in detail, detail
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, done.stdout
    # nothing in team-s says which KubeRay made it: the version is unknown, a warning
    assert got["kuberay"][0] == "ok"  # team-a's cluster says it
    done = doctor(world, RAYSIZE_NAMESPACES=SILENT)
    status, detail = lines(done.stdout)["kuberay"]
    assert status == "warn" and "the operator's version is unknown" in detail, detail


def test_an_api_server_older_than_1_33_fails_naming_the_upgrade(tmp_path: Path) -> None:
    """The sandbox told to answer /version as 1.32 (the last without pods/resize)."""
    sb = Sandbox(SandboxConfig(nodes=1)).start()
    try:
        sb.api.version = {**sb.api.version, "minor": "32", "gitVersion": "v1.32.9"}
        kubeconfig = sb.write_kubeconfig(tmp_path / "kubeconfig")
        checks = run_doctor(
            Settings(kubeconfig=kubeconfig, temporal_address=NOWHERE, namespaces="default"),
            timeout_s=1.0,
        )
    finally:
        sb.close()
    (kubernetes,) = [c for c in checks if c.check == "kubernetes"]
    assert kubernetes.status == "FAIL"
    assert kubernetes.detail == (
        f"v1.32.9 at {sb.url} is older than 1.33: raysize resizes pods in place through "
        "pods/resize, which needs Kubernetes 1.33 or newer (upgrade the cluster)"
    )
