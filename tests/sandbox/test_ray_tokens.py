"""One worker, three Ray clusters, each with its own token (#28 item 2): two with token
auth (KubeRay's `authOptions` Secret; a Secret of the user's named by the head's
`secretKeyRef`) and one without, which gets the worker's own token. In both worlds: the
real KubeRay makes the `authOptions` Secret in the real one, its stand-in in the sandbox.
Each GCS is a stand-in that checks tokens as Ray does (`sandbox/gcs_standin.py`)."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.k8s import Kube
from raysize.activities.ray_tokens import FallbackScope
from raysize.sandbox.cluster import Sandbox
from raysize.sandbox.gcs_standin import GcsStandIn
from raysize.sandbox.rbac import Authorizer, service_account_user
from raysize.sandbox.realworld import RealSandbox
from raysize.workflows.contracts import (
    DrainInput,
    DrainTarget,
    Err,
    Observation,
    ObserveInput,
    RayletResizeInput,
)
from raysize.workflows.resources import GIB

from .conftest import wait_for
from .test_kubectl_and_operator import raycluster

ROLE = Path(__file__).parents[2] / "deploy" / "watched-namespace" / "role.yaml"
TOKENS_ROLE = (
    Path(__file__).parents[2] / "deploy" / "components" / "ray-token-secrets" / "role.yaml"
)
GLOBAL = "the-workers-own-token"  # RAYSIZE_RAY_TOKEN: for clusters without a token of their own
IPPR = json.dumps(
    {"groups": {"small": {"max-cpu": "2", "max-memory": "4Gi", "resize-timeout": 60}}}
)


def token_cluster(name: str, *, auth: dict[str, Any] | None = None, env: Any = None) -> dict:
    rc = raycluster(name, replicas=0)
    rc["metadata"]["annotations"] = {"ray.io/ippr": IPPR}
    rc["spec"]["rayVersion"] = "2.60.0"  # KubeRay requires ≥ 2.52.0 for authOptions
    if auth is not None:
        rc["spec"]["authOptions"] = auth
    if env is not None:
        groups = rc["spec"]["workerGroupSpecs"]
        for template in (rc["spec"]["headGroupSpec"]["template"], *(g["template"] for g in groups)):
            template["spec"]["containers"][0]["env"] = env
    return rc


def token_in(core: client.CoreV1Api, ns: str, name: str, key: str = "auth_token") -> str:
    data = core.read_namespaced_secret(name, ns).data or {}
    return base64.b64decode(data[key]).decode()


@pytest.fixture
def three(kube: client.ApiClient, ns: str) -> Iterator[tuple[dict[str, GcsStandIn], str]]:
    """RayClusters `ta` (authOptions: KubeRay's Secret), `tb` (the head's RAY_AUTH_TOKEN
    from the user's Secret `b-token`, key `token`) and `tc` (no auth), each with a GCS
    stand-in that wants its token; yields them and the `ta` Secret's token."""
    core = client.CoreV1Api(kube)
    b_token = secrets.token_hex(16)
    core.create_namespaced_secret(
        ns, {"metadata": {"name": "b-token"}, "stringData": {"token": b_token}}
    )
    ref = {"secretKeyRef": {"name": "b-token", "key": "token"}}
    manual = [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": ref},
    ]
    custom = client.CustomObjectsApi(kube)
    for rc in (
        token_cluster("ta", auth={"mode": "token"}),
        token_cluster("tb", env=manual),
        token_cluster("tc"),
    ):
        custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)
    # KubeRay makes ta's Secret before its pods; the pods get its token as RAY_AUTH_TOKEN
    a_token = wait_for(lambda: _maybe(lambda: token_in(core, ns, "ta")), timeout=30)
    head = wait_for(
        lambda: core.list_namespaced_pod(ns, label_selector="ray.io/cluster=ta").items, timeout=30
    )[0]
    env = {e.name: e for e in head.spec.containers[0].env}
    assert env["RAY_AUTH_MODE"].value == "token"
    assert env["RAY_AUTH_TOKEN"].value_from.secret_key_ref.to_dict() == {
        "key": "auth_token",
        "name": "ta",
        "optional": None,
    }
    secret = core.read_namespaced_secret("ta", ns)
    assert secret.metadata.labels["ray.io/cluster"] == "ta"
    assert [(o.kind, o.name, o.controller) for o in secret.metadata.owner_references] == [
        ("RayCluster", "ta", True)
    ]
    with ExitStack() as stack:
        gcs = {
            name: stack.enter_context(GcsStandIn(token=token))
            for name, token in (("ta", a_token), ("tb", b_token), ("tc", GLOBAL))
        }
        yield gcs, a_token


def _maybe(read: Any) -> Any:
    try:
        return read()
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def observe(acts: ClusterActivities, ns: str, cluster: str, gcs: GcsStandIn) -> Observation:
    inp = ObserveInput(namespace=ns, cluster=cluster, gcs_address=gcs.address)
    return asyncio.run(ActivityEnvironment().run(acts.observe, inp))


def test_the_workers_own_token_goes_only_to_the_clusters_named_for_it(
    kube: client.ApiClient, ns: str, three: tuple[dict[str, GcsStandIn], str]
) -> None:
    """#43 item 6: `tc` has no token of its own and RAYSIZE_RAY_TOKEN_FOR does not name it:
    its GCS (a tenant's, say) sees no token at all, and the refusal says why; named, it
    gets the worker's own token. The clusters with their own never see the fallback."""
    gcs, _ = three
    acts = ClusterActivities(kube=Kube(kube, timeout_s=5.0), ray=RaySettings(token=GLOBAL))
    named = ClusterActivities(
        kube=Kube(kube, timeout_s=5.0),
        ray=RaySettings(token=GLOBAL, token_for=FallbackScope((ns,))),
    )
    try:
        with pytest.raises(ApplicationError) as refused:
            observe(acts, ns, "tc", gcs["tc"])
        assert gcs["tc"].presented == {None}  # nothing to capture
        assert "no token was sent: the worker's own token (RAYSIZE_RAY_TOKEN) goes only" in str(
            refused.value
        )
        assert "RAYSIZE_RAY_TOKEN_FOR names (none)" in str(refused.value)
        assert observe(named, ns, "tc", gcs["tc"]).snapshot is not None
        assert gcs["tc"].presented == {None, f"Bearer {GLOBAL}"}
        for own in ("ta", "tb"):
            assert observe(named, ns, own, gcs[own]).snapshot is not None
            assert f"Bearer {GLOBAL}" not in gcs[own].presented, own
    finally:
        acts.close()
        named.close()


def test_one_worker_reads_each_cluster_with_its_own_token_and_follows_a_rotation(
    kube: client.ApiClient, ns: str, three: tuple[dict[str, GcsStandIn], str]
) -> None:
    gcs, a_token = three
    acts = ClusterActivities(
        kube=Kube(kube, timeout_s=5.0),
        ray=RaySettings(token=GLOBAL, token_for=FallbackScope((f"{ns}/tc",))),
    )
    try:
        for name in ("ta", "tb", "tc"):
            assert observe(acts, ns, name, gcs[name]).snapshot is not None, name
            assert (gcs[name].state_reads, gcs[name].refused) == (1, 0), name
        assert acts.tokens is not None and acts.tokens.reads == 2  # ta's and tb's Secrets

        # ta's Secret rotated: Ray keeps the token it started with until its pods
        # restart, so raysize goes on with the one it holds, reading nothing new
        new = base64.b64encode(secrets.token_bytes(32)).decode()  # as KubeRay makes them
        client.CoreV1Api(kube).patch_namespaced_secret(
            "ta", ns, {"stringData": {"auth_token": new}}
        )
        assert token_in(client.CoreV1Api(kube), ns, "ta") == new
        assert observe(acts, ns, "ta", gcs["ta"]).snapshot is not None
        assert (gcs["ta"].refused, acts.tokens.reads) == (0, 2)
        # ta's Ray restarted with the new token: refused once, the Secret read again
        # (a new resourceVersion), asked again with it
        gcs["ta"].token = new
        assert observe(acts, ns, "ta", gcs["ta"]).snapshot is not None
        assert (gcs["ta"].refused, acts.tokens.reads) == (1, 3)
        assert observe(acts, ns, "ta", gcs["ta"]).snapshot is not None
        assert (gcs["ta"].refused, acts.tokens.reads) == (1, 3)  # cached again
        # the saga's Raylet resize and the drain ask ta's Ray with ta's token too (a
        # worker that restarted reads the cluster's RayCluster to know where it is)
        fresh = ClusterActivities(
            kube=Kube(kube, timeout_s=5.0),
            ray=RaySettings(gcs_override=gcs["ta"].address, token=GLOBAL),
        )
        try:
            node = "ab" * 28
            resize = RayletResizeInput(
                namespace=ns, cluster="ta", pod="p", node_id=node, cpu=1500, memory=2 * GIB
            )
            done = asyncio.run(ActivityEnvironment().run(fresh.resize_raylet, resize))
            assert (done.cpu, done.memory) == (1500, 2 * GIB)
            drain = DrainInput(
                namespace=ns,
                cluster="ta",
                gcs_address=gcs["ta"].address,
                targets=(DrainTarget(pod="p", node_id=node, reason="idle"),),
            )
            drained = asyncio.run(ActivityEnvironment().run(fresh.drain_raylets, drain))
            assert drained.accepted == ("p",)
            assert gcs["ta"].refused == 1  # nothing refused since the rotation
        finally:
            fresh.close()

        # a Ray on a token no Secret holds: refused, the Secret unchanged, the error
        # names where the token came from (never the token), and only that cluster fails
        gcs["tb"].token = "a-token-nobody-has"
        with pytest.raises(ApplicationError) as refused:
            observe(acts, ns, "tb", gcs["tb"])
        assert refused.value.type == Err.RAY_AUTH and refused.value.non_retryable
        text = str(refused.value)
        assert f"Secret {ns}/b-token, key token" in text and "restart its pods" in text
        assert "a-token-nobody-has" not in text and a_token not in text
        for name in ("ta", "tc"):
            assert observe(acts, ns, name, gcs[name]).snapshot is not None
    finally:
        acts.close()


@contextmanager
def as_raysize(
    world_sandbox: Sandbox | RealSandbox | None, kube: client.ApiClient, ns: str, tmp_path: Path
) -> Iterator[client.ApiClient]:
    """A client as the ServiceAccount ns/raysize: the real server checks its token; the
    embedded one answers every client as that user meanwhile (`sandbox/rbac.py`)."""
    client.CoreV1Api(kube).create_namespaced_service_account(ns, {"metadata": {"name": "raysize"}})
    if isinstance(world_sandbox, RealSandbox):
        path = world_sandbox.service_account_kubeconfig(tmp_path / "raysize", ns, "raysize")
        api = config.new_client_from_config(config_file=str(path))
        try:
            yield api
        finally:
            api.close()
        return
    assert isinstance(world_sandbox, Sandbox)
    world_sandbox.api.authorizer = Authorizer(
        world_sandbox.store, service_account_user(ns, "raysize")
    )
    try:
        yield kube
    finally:
        world_sandbox.api.authorizer = None


def test_a_secret_raysize_may_not_read_fails_its_cluster_only_and_says_what_to_grant(
    kube: client.ApiClient,
    ns: str,
    world_sandbox: Sandbox | RealSandbox | None,
    three: tuple[dict[str, GcsStandIn], str],
    tmp_path: Path,
) -> None:
    """deploy/'s Role, with deploy/components/ray-token-secrets' rule narrowed to
    `b-token` (an install that does not grant `ta`'s Secret): `ta` cannot be read, and says
    so; `tb` and `tc` go on."""
    gcs, _ = three
    role = next(d for d in yaml.safe_load_all(ROLE.read_text()) if d["kind"] == "Role")
    tokens = next(d for d in yaml.safe_load_all(TOKENS_ROLE.read_text()) if d["kind"] == "Role")
    (rule,) = tokens["rules"]
    role["rules"].append({**rule, "resourceNames": ["b-token"]})
    rbac = client.RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "raysize"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "raysize"},
            "subjects": [{"kind": "ServiceAccount", "name": "raysize", "namespace": ns}],
        },
    )
    with as_raysize(world_sandbox, kube, ns, tmp_path) as api:
        acts = ClusterActivities(
            kube=Kube(api, timeout_s=5.0),
            ray=RaySettings(token=GLOBAL, token_for=FallbackScope((f"{ns}/tc",))),
        )
        try:
            with pytest.raises(ApplicationError) as refused:
                wait_for(lambda: observe_or_not_yet(acts, ns, "ta", gcs["ta"]), timeout=30)
            assert refused.value.type == Err.RAY_AUTH and refused.value.non_retryable
            text = str(refused.value)
            assert f"may not `get secrets` in namespace {ns}" in text, text
            assert f"Secret {ns}/ta, key auth_token" in text
            assert "deploy/watched-namespace/role.yaml" in text
            assert gcs["ta"].state_reads == 0  # Ray was not asked without its token
            for name in ("tb", "tc"):
                assert observe(acts, ns, name, gcs[name]).snapshot is not None, name
        finally:
            acts.close()


def observe_or_not_yet(
    acts: ClusterActivities, ns: str, cluster: str, gcs: GcsStandIn
) -> Observation | None:
    """An observe; None while the new Role is not in force yet (the RayCluster refused)."""
    try:
        return observe(acts, ns, cluster, gcs)
    except ApplicationError as exc:
        if exc.type == Err.FORBIDDEN:
            return None
        raise
