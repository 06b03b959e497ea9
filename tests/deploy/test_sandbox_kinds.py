"""The sandbox's plain stored kinds (sandbox/generic.py) and its RBAC (sandbox/rbac.py)."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from raysize.sandbox import generic, store
from raysize.sandbox.errors import ApiError
from raysize.sandbox.rbac import Authorizer, Request, rule_allows, service_account_user
from raysize.sandbox.resources import ALL, GROUP_VERSIONS, RAYCLUSTERS, strategic_merge_allowed
from raysize.sandbox.store import Store


@pytest.fixture
def api(sandbox):
    _, kubeconfig = sandbox
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


def test_groups_and_discovery_know_every_kind(kubectl):
    for r in ALL:
        assert store._group_of(r.name) == r.group, r.name
        assert GROUP_VERSIONS[r.group] == r.version
    assert generic.GROUP_OF.items() <= store._GROUPS.items()
    out = kubectl("api-resources", "-o", "name")
    assert out.returncode == 0, out.stderr
    listed = set(out.stdout.split())
    assert {
        "serviceaccounts",
        "configmaps",
        "secrets",
        "services",
        "deployments.apps",
        "roles.rbac.authorization.k8s.io",
        "rolebindings.rbac.authorization.k8s.io",
        "clusterroles.rbac.authorization.k8s.io",
        "clusterrolebindings.rbac.authorization.k8s.io",
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
        "rayclusters.ray.io",
    } <= listed
    assert strategic_merge_allowed(generic.DEPLOYMENTS)
    assert not strategic_merge_allowed(RAYCLUSTERS)


def test_configmap_crud_with_resource_versions_and_watch(api):
    core = client.CoreV1Api(api)
    created = core.create_namespaced_config_map(
        "default", {"metadata": {"name": "c"}, "data": {"a": "1"}}
    )
    rv = created.metadata.resource_version
    assert created.metadata.uid and rv
    patched = core.patch_namespaced_config_map("c", "default", {"data": {"b": "2"}})
    assert patched.data == {"a": "1", "b": "2"}
    assert int(patched.metadata.resource_version) > int(rv)
    stale = {"metadata": {"name": "c", "resourceVersion": rv}, "data": {}}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("c", "default", stale)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
    assert err.value.status == 409
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert seen == [("MODIFIED", "c")]
    core.delete_namespaced_config_map("c", "default")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("c", "default")
    assert err.value.status == 404
    assert json.loads(err.value.body)["message"] == 'configmaps "c" not found'


def test_secret_string_data_service_ip_and_deployment_generation(api):
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    secret = core.create_namespaced_secret(
        "default", {"metadata": {"name": "s"}, "stringData": {"token": "abc"}}
    )
    assert secret.data == {"token": base64.b64encode(b"abc").decode()}
    assert secret.type == "Opaque"

    svc = core.create_namespaced_service(
        "default", {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}
    )
    ip = svc.spec.cluster_ip
    assert ip.startswith("10.96.") and svc.spec.type == "ClusterIP"
    again = core.patch_namespaced_service("svc", "default", {"spec": {"ports": [{"port": 81}]}})
    assert again.spec.cluster_ip == ip
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_service("svc", "default", {"spec": {"clusterIP": "10.0.0.1"}})
    assert err.value.status == 422

    body = {
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    d = apps.create_namespaced_deployment("default", body)
    assert d.metadata.generation == 1
    d = apps.patch_namespaced_deployment("d", "default", {"metadata": {"labels": {"x": "y"}}})
    assert d.metadata.generation == 1  # metadata only
    d = apps.patch_namespaced_deployment("d", "default", {"spec": {"replicas": 2}})
    assert d.metadata.generation == 2
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_deployment("nope", "default")
    assert json.loads(err.value.body)["message"] == 'deployments.apps "nope" not found'


def test_bindings_need_an_unchanging_role_ref(sandbox, api):
    sb, _ = sandbox
    rbac = client.RbacAuthorizationV1Api(api)
    with pytest.raises(ApiError) as err:  # the client refuses to send this itself
        sb.api.internal(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {"metadata": {"name": "b"}, "subjects": []},
        )
    assert err.value.code == 422
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "r"}
    rbac.create_cluster_role_binding({"metadata": {"name": "b"}, "roleRef": ref})
    with pytest.raises(ApiException) as err2:
        rbac.patch_cluster_role_binding("b", {"roleRef": {**ref, "name": "other"}})
    assert err2.value.status == 422


def test_deleting_a_namespace_deletes_its_new_kinds(api):
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "gone"}})
    core.create_namespaced_config_map("gone", {"metadata": {"name": "c"}})
    core.create_namespaced_service_account("gone", {"metadata": {"name": "sa"}})
    core.delete_namespace("gone")
    assert core.list_config_map_for_all_namespaces().items == []
    assert core.list_service_account_for_all_namespaces().items == []


# --- RBAC --------------------------------------------------------------------------------
RULE = {"apiGroups": [""], "resources": ["pods", "pods/resize"], "verbs": ["get", "patch"]}


def test_rule_matching():
    def req(verb, resource, group="", name=""):
        return Request(verb, group, resource, "ns", name)

    assert rule_allows(RULE, req("get", "pods"))
    assert rule_allows(RULE, req("patch", "pods/resize"))
    assert not rule_allows(RULE, req("patch", "pods/status"))
    assert not rule_allows(RULE, req("list", "pods"))
    assert not rule_allows(RULE, req("get", "pods", group="apps"))
    star = {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}
    assert rule_allows(star, req("delete", "rayclusters", group="ray.io"))
    named = {**RULE, "resourceNames": ["a"]}
    assert rule_allows(named, req("get", "pods", name="a"))
    assert not rule_allows(named, req("get", "pods", name="b"))


def test_role_bindings_grant_only_in_their_namespace():
    s = Store()
    user = service_account_user("raysize", "raysize")
    s.create("roles", "team-a", {"metadata": {"name": "r"}, "rules": [RULE]})
    s.create("roles", "team-b", {"metadata": {"name": "r"}, "rules": [RULE]})
    subject = {"kind": "ServiceAccount", "name": "raysize", "namespace": "raysize"}
    s.create(
        "rolebindings",
        "team-a",
        {
            "metadata": {"name": "b"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [subject],
        },
    )
    s.create(
        "rolebindings",
        "team-b",
        {
            "metadata": {"name": "b"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{**subject, "name": "someone-else"}],
        },
    )
    authz = Authorizer(s, user)
    assert authz.allows(Request("get", "", "pods", "team-a", "p"))
    assert not authz.allows(Request("get", "", "pods", "team-b", "p"))
    assert not authz.allows(Request("get", "", "pods", "", ""))  # cluster scope: no
    s.create(
        "clusterroles",
        "",
        {
            "metadata": {"name": "lister"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    s.create(
        "clusterrolebindings",
        "",
        {
            "metadata": {"name": "all-sa"},
            "roleRef": {"kind": "ClusterRole", "name": "lister"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:raysize"}],
        },
    )
    assert authz.allows(Request("list", "", "pods", "", ""))
    assert authz.allows(Request("list", "", "pods", "team-b", ""))
    assert not Authorizer(s, "system:serviceaccount:other:x").allows(
        Request("list", "", "pods", "", "")
    )
