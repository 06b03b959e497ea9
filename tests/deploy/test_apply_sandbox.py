"""`kubectl apply` of deploy/ to a fresh sandbox, and the service account's reach there."""

from __future__ import annotations

import json
import logging
import time

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from raysize.activities.discovery import list_rayclusters
from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import NotFound
from raysize.activities.node_room import UNFINISHED, NodeRooms
from raysize.sandbox.rbac import Authorizer
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.raycluster_spec import read_group_specs
from raysize.workflows.resources import GIB
from tests.deploy.conftest import DEPLOY, EXAMPLE, NODE_ROOM, RAY_TOKENS, SA_USER, TRIAL, render
from tests.sandbox.conftest import wait_for


def names(out: str) -> set[str]:
    return set(out.split())


def test_apply_base_then_trial_then_example(kubectl):
    first = kubectl("apply", "-k", str(DEPLOY))
    assert first.returncode == 0, first.stderr
    assert "deployment.apps/raysize-worker created" in first.stdout
    again = kubectl("apply", "-k", str(DEPLOY))
    assert again.returncode == 0, again.stderr
    # kubectl always sends a PodDisruptionBudget's selector (its patch strategy is
    # "replace"), so it says "configured" for an unchanged one, on a real server too
    lines = [line for line in again.stdout.splitlines() if not line.startswith("poddisruption")]
    assert "poddisruptionbudget.policy/raysize-worker configured" in again.stdout
    assert not [line for line in lines if not line.endswith(" unchanged")], again.stdout

    got = kubectl(
        "get",
        "namespace/raysize",
        "validatingadmissionpolicy/raysize-ray-pods",
        "validatingadmissionpolicybinding/raysize-rayclusters",
        "-o",
        "name",
    )
    assert got.returncode == 0, got.stderr
    assert names(got.stdout) == {
        "namespace/raysize",
        "validatingadmissionpolicy.admissionregistration.k8s.io/raysize-ray-pods",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/raysize-rayclusters",
    }
    got = kubectl("get", "role,rolebinding", "-n", "default", "-o", "name")
    assert names(got.stdout) == {  # raysize's rules, and reading Ray token Secrets
        "role.rbac.authorization.k8s.io/raysize",
        "rolebinding.rbac.authorization.k8s.io/raysize",
        f"role.rbac.authorization.k8s.io/{RAY_TOKENS}",
        f"rolebinding.rbac.authorization.k8s.io/{RAY_TOKENS}",
    }
    got = kubectl("get", "clusterrole,clusterrolebinding", "-o", "name")
    assert got.returncode == 0, got.stderr
    assert {n for n in names(got.stdout) if "raysize" in n} == {
        f"clusterrole.rbac.authorization.k8s.io/{NODE_ROOM}",
        f"clusterrolebinding.rbac.authorization.k8s.io/{NODE_ROOM}",
    }
    got = kubectl("get", "serviceaccount,configmap,deployment", "-n", "raysize", "-o", "name")
    assert got.returncode == 0, got.stderr
    (cm,) = [n for n in names(got.stdout) if n.startswith("configmap/")]
    assert names(got.stdout) == {"serviceaccount/raysize", cm, "deployment.apps/raysize-worker"}
    table = kubectl("get", "deployment", "raysize-worker", "-n", "raysize")
    assert table.returncode == 0 and "raysize-worker" in table.stdout, table.stderr

    # what the server stores is what was rendered
    stored = json.loads(
        kubectl("get", "role", "raysize", "-n", "default", "-o", "json").stdout or "{}"
    )
    rendered = {d["kind"]: d for d in render(DEPLOY) if d["metadata"]["name"] != RAY_TOKENS}
    assert stored["rules"] == rendered["Role"]["rules"]
    worker = json.loads(
        kubectl("get", "deploy/raysize-worker", "-n", "raysize", "-o", "json").stdout
    )
    assert worker["spec"] == rendered["Deployment"]["spec"]
    assert worker["metadata"]["generation"] == 1

    trial = kubectl("apply", "-k", str(TRIAL))
    assert trial.returncode == 0, trial.stderr
    assert "deployment.apps/temporal-dev created" in trial.stdout
    assert "service/temporal-dev created" in trial.stdout
    assert "deployment.apps/raysize-worker configured" in trial.stdout
    worker = json.loads(
        kubectl("get", "deploy/raysize-worker", "-n", "raysize", "-o", "json").stdout
    )
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in render(TRIAL)}
    assert worker["spec"] == rendered[("Deployment", "raysize-worker")]["spec"]
    assert worker["metadata"]["generation"] == 2
    svc = json.loads(kubectl("get", "svc/temporal-dev", "-n", "raysize", "-o", "json").stdout)
    assert svc["spec"]["clusterIP"] and svc["spec"]["type"] == "ClusterIP"

    example = kubectl("apply", "-f", str(EXAMPLE))
    assert example.returncode == 0, example.stderr
    assert "raycluster.ray.io/raysize-example created" in example.stdout
    rc = json.loads(kubectl("get", "raycluster/raysize-example", "-o", "json").stdout)
    assert read_group_specs(rc).errors == ()
    pods = wait_for(
        lambda: (
            kubectl(
                "get", "pods", "-l", "ray.io/cluster=raysize-example", "-o", "name"
            ).stdout.split()
            or None
        )
    )
    assert len(pods) == 2  # head + 1 worker


@pytest.fixture
def as_service_account(sandbox, kubectl):
    """deploy/ and the example applied as admin; then every request is the worker's."""
    sb, kubeconfig = sandbox
    for args in (("apply", "-k", str(DEPLOY)), ("apply", "-f", str(EXAMPLE))):
        out = kubectl(*args)
        assert out.returncode == 0, out.stderr
    api = config.new_client_from_config(config_file=str(kubeconfig))
    kube = Kube(api, timeout_s=5.0)
    wait_for(lambda: len(kube.read_cluster("default", "raysize-example").pods) == 2)
    sb.api.authorizer = Authorizer(sb.store, SA_USER)
    try:
        yield sb, kube
    finally:
        sb.api.authorizer = None
        api.close()


def does_what_raysize_does(
    kube: Kube, ns: str = "default", *, every_namespace: bool = True, node_room: bool = True
) -> None:
    """Every call raysize makes, on the example cluster in `ns`: each must be allowed.
    `every_namespace`: also list and watch the RayClusters of all namespaces (what the
    worker does when RAYSIZE_NAMESPACES is empty). `node_room`: also list and watch every
    node and every unfinished pod (deploy/components/node-room), and the node room's
    informers get the worker pod's node."""
    cluster = kube.read_cluster(ns, "raysize-example")  # get rayclusters, list pods
    assert cluster.groups.errors == ()
    worker = next(p for p in cluster.pods if p.group == "cpu")
    assert kube.patch_resize(ns, worker.name, 2000, 4 * GIB) >= 1  # pods/resize
    kube.set_ippr_status(ns, worker.name, IpprStatus(raylet_id="r1"))  # patch pods
    assert kube.scale(ns, "raysize-example", {"cpu": 2}, {}) is True  # patch rayclusters
    kube.record_event(ns, "Pod", worker.name, "RaysizeResize", "to 2 CPU")  # events
    kube.record_event(ns, "RayCluster", "raysize-example", "RaysizeScale", "+1")
    with pytest.raises(NotFound):  # get secrets: allowed (a Ray cluster's token), none here
        kube.read_secret(ns, "raysize-example-no-such-secret")
    if every_namespace:
        assert [rc["metadata"]["name"] for rc in list_rayclusters(kube, "")] == ["raysize-example"]
    assert [rc["metadata"]["name"] for rc in list_rayclusters(kube, ns)] == ["raysize-example"]
    # watch pods (what watch_pods_change streams; it swallows errors, so ask directly)
    pods = kube.core.list_namespaced_pod(
        ns,
        label_selector="ray.io/cluster=raysize-example",
        watch=True,
        timeout_seconds=1,
        _preload_content=False,
    )
    assert b'"ADDED"' in pods.read()
    if every_namespace:
        events = kube.custom.list_cluster_custom_object(
            "ray.io", "v1", "rayclusters", watch=True, timeout_seconds=1, _preload_content=False
        )
    else:
        events = kube.custom.list_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", watch=True, timeout_seconds=1,
            _preload_content=False,
        )  # fmt: skip
    assert b"raysize-example" in events.read()  # watch rayclusters
    if not node_room:
        return
    # list and watch nodes, and the unfinished pods of every namespace
    assert kube.core.list_node().items
    assert kube.core.list_pod_for_all_namespaces(field_selector=UNFINISHED).items
    for list_fn, kwargs in (
        (kube.core.list_node, {}),
        (kube.core.list_pod_for_all_namespaces, {"field_selector": UNFINISHED}),
    ):
        stream = list_fn(**kwargs, watch=True, timeout_seconds=1, _preload_content=False)
        assert b'"ADDED"' in stream.read()
    # and activities/node_room.py itself, with this token
    rooms = NodeRooms(kube.core, timeout_s=5)  # its first `rooms` starts the informers
    try:
        assert worker.node
        wait_for(lambda: worker.node in rooms.rooms([worker.node]), timeout=30)
        assert rooms.synced() and rooms.state()["node_room.pods"] >= 2  # the example's
    finally:
        rooms.close()


def test_service_account_can_do_what_raysize_does(as_service_account):
    _, kube = as_service_account
    does_what_raysize_does(kube, every_namespace=False)  # the base watches "default"


NOT_RAYSIZES_CALLS = [
    (
        "create pods",
        lambda c, r: c.create_namespaced_pod("default", {"metadata": {"name": "x"}}),
    ),
    ("delete pods", lambda c, r: c.delete_namespaced_pod("p", "default")),
    ("update pods", lambda c, r: c.replace_namespaced_pod("p", "default", {})),
    ("patch pods/status", lambda c, r: c.patch_namespaced_pod_status("p", "default", {})),
    ("list secrets", lambda c, r: c.list_namespaced_secret("raysize")),
    ("get configmaps", lambda c, r: c.list_namespaced_config_map("raysize")),
    # the node room reads nodes and lists pods everywhere (deploy/components/node-room),
    # and nothing more
    ("patch nodes", lambda c, r: c.patch_node("n", {"metadata": {"labels": {"a": "b"}}})),
    ("get pods outside the watched namespaces", lambda c, r: c.read_namespaced_pod("p", "raysize")),
    (
        "delete pods outside the watched namespaces",
        lambda c, r: c.delete_namespaced_pod("p", "raysize"),
    ),
    ("list events", lambda c, r: c.list_namespaced_event("default")),
    ("delete namespaces", lambda c, r: c.delete_namespace("default")),
    (
        "create rayclusters",
        lambda c, r: r.create_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", {"metadata": {"name": "x"}}
        ),
    ),
    (
        "delete rayclusters",
        lambda c, r: r.delete_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "raysize-example"
        ),
    ),
    (
        "patch rayclusters/status",
        lambda c, r: r.patch_namespaced_custom_object_status(
            "ray.io", "v1", "default", "rayclusters", "raysize-example", {}
        ),
    ),
]


@pytest.mark.parametrize(("what", "call"), NOT_RAYSIZES_CALLS)
def test_service_account_can_do_nothing_else(as_service_account, what, call):
    _, kube = as_service_account
    with pytest.raises(ApiException) as err:
        call(kube.core, kube.custom)
    assert err.value.status == 403, what
    assert SA_USER in json.loads(err.value.body)["message"]


def test_without_the_node_room_the_worker_plans_without_it_and_says_so_once(
    as_service_account, caplog: pytest.LogCaptureFixture
):
    """An install without deploy/components/node-room (here: its binding deleted): the
    informers are refused (403), the room is empty (grows are planned without it), one
    warning says what to grant and where it is explained; nothing is retried before
    FORBIDDEN_RETRY_S. The rest of what raysize does is not affected."""
    sb, kube = as_service_account
    authorizer, sb.api.authorizer = sb.api.authorizer, None  # the admin deletes it
    try:
        client.RbacAuthorizationV1Api(kube.api).delete_cluster_role_binding(NODE_ROOM)
    finally:
        sb.api.authorizer = authorizer
    with pytest.raises(ApiException) as refused:
        kube.core.list_node()
    assert refused.value.status == 403
    caplog.set_level(logging.INFO, logger="raysize.activities")
    rooms = NodeRooms(kube.core, timeout_s=5)
    try:
        assert rooms.rooms(["any"]) == {}

        def refusals() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "refused it (403" in r.getMessage()]

        wait_for(refusals, timeout=30)
        time.sleep(1.0)  # both informers have been refused by now
        said = refusals()
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        message = said[0].getMessage()
        assert "grows are planned without the nodes' room" in message
        assert "docs/design/kubernetes-resize.md" in message
        assert not rooms.synced() and rooms.rooms(["any"]) == {}
        assert rooms.state()["node_room.nodes"] == 0
    finally:
        rooms.close()
    does_what_raysize_does(kube, every_namespace=False, node_room=False)
