"""deploy/ on the real world: kube-apiserver v1.36 with RBAC and admission policies
enforced, the real KubeRay operator, and the worker's own ServiceAccount token. The real
server is the judge of what the Role (deploy/watched-namespace/role.yaml, in namespace
default), the node room's ClusterRole (deploy/components/node-room) and the admission
policy (deploy/worker/admission-policy.yaml) allow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import Forbidden, KubeError
from raysize.sandbox.cluster import SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.realworld import RealSandbox
from raysize.worker.run import namespace_problem
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.resources import GIB
from tests.deploy.conftest import (
    DEPLOY,
    EXAMPLE,
    NODE_ROOM,
    RAY_TOKENS,
    SA_USER,
    find,
    one,
    render,
    run_kubectl,
)
from tests.deploy.test_apply_sandbox import NOT_RAYSIZES_CALLS, does_what_raysize_does
from tests.sandbox.conftest import wait_for


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
        assert "role.rbac.authorization.k8s.io/raysize created" in applied.stdout
        # nothing cluster-wide but the node room's read access (deploy/components/node-room)
        assert sorted(line for line in applied.stdout.splitlines() if "clusterrole" in line) == [
            f"clusterrole.rbac.authorization.k8s.io/{NODE_ROOM} created",
            f"clusterrolebinding.rbac.authorization.k8s.io/{NODE_ROOM} created",
        ]
        example = w.kubectl("apply", "-f", str(EXAMPLE))
        assert example.returncode == 0, example.stderr
        sb.control_plane.service_account_kubeconfig(w.worker, "raysize", "raysize")
        wait_for(lambda: policies_enforced(w), timeout=60)
        yield w
    finally:
        sb.close()


def policies_enforced(w: World) -> bool:
    """The API server loads new admission policies in the background: both are in force
    once a forbidden dry run by raysize's token is refused by each."""
    pods = running_pods(w)
    if not pods:
        return False
    kube, pod = w.worker_kube(), pods[0].split("=")[0]
    for forbidden in (
        lambda: kube.core.patch_namespaced_pod(
            pod, "default", {"metadata": {"labels": {"probe": "1"}}}, dry_run="All"
        ),
        lambda: kube.custom.patch_namespaced_custom_object(
            "ray.io",
            "v1",
            "default",
            "rayclusters",
            "raysize-example",
            {"spec": {"rayVersion": "0.0.1"}},
            dry_run="All",
            _content_type="application/merge-patch+json",
        ),
    ):
        try:
            forbidden()
        except ApiException as exc:
            if "ValidatingAdmissionPolicy" not in str(exc.body):
                return False
        else:
            return False
    return True


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
    rendered = {d["kind"]: d for d in render(DEPLOY) if d["metadata"]["name"] != RAY_TOKENS}
    stored = json.loads(
        world.kubectl("get", "role", "raysize", "-n", "default", "-o", "json").stdout
    )
    assert stored["rules"] == rendered["Role"]["rules"]
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
    # the base watches namespace "default": its Role is there; cluster-wide, only the node
    # room's reads of nodes and pods
    does_what_raysize_does(world.worker_kube(), every_namespace=False)


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
    rules = one(render(DEPLOY), "Role", "raysize")["rules"]
    kept = [r for r in rules if r["resources"] != ["pods/resize"]]
    assert len(kept) == len(rules) - 1
    rbac.patch_namespaced_role("raysize", "default", {"rules": kept})
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


# --- the admission policy: what RBAC cannot say ---------------------------------------

JSON_PATCH = "application/json-patch+json"


def policy_message(policy: str, fragment: str) -> str:
    """The message of the policy's validation whose message contains `fragment`, as
    rendered from deploy/ (so the test checks the server says what the file says)."""
    (vap,) = [d for d in find(render(DEPLOY), "ValidatingAdmissionPolicy", policy)]
    (message,) = [
        " ".join(v["message"].split())
        for v in vap["spec"]["validations"]
        if fragment in v["message"]
    ]
    return message


def plain_pod(w: World) -> str:
    """A pod KubeRay did not make (no Ray labels), running in the watched namespace."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-ray", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "containers": [
                {
                    "name": "web",
                    "image": "nginx",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "256Mi"},
                        "limits": {"cpu": "500m", "memory": "256Mi"},
                    },
                }
            ]
        },
    }
    core = client.CoreV1Api(config.new_client_from_config(str(w.admin)))
    try:
        core.create_namespaced_pod("default", body)
    except ApiException as exc:
        assert exc.status == 409, exc.body  # another test made it
    return "not-ray"


def ray_worker_pod(w: World) -> str:
    wait_for(lambda: len(running_pods(w)) >= 2, timeout=60)
    kube = w.worker_kube()
    return next(
        p for p in kube.read_cluster("default", "raysize-example").pods if p.group == "cpu"
    ).name


def patch_pod(body: Any, patch_type: str = "application/merge-patch+json") -> Any:
    return lambda kube, pod: kube.core.patch_namespaced_pod(
        pod, "default", body, dry_run="All", _content_type=patch_type
    )


def patch_cluster(ops: list[dict[str, Any]]) -> Any:
    return lambda kube, pod: kube.custom.patch_namespaced_custom_object(
        "ray.io", "v1", "default", "rayclusters", "raysize-example", ops,
        dry_run="All", _content_type=JSON_PATCH,
    )  # fmt: skip


FORBIDDEN_PATCHES = [
    # (what a stolen token tries, the call, the policy, a fragment of its refusal)
    (
        "relabel a Ray pod",
        patch_pod({"metadata": {"labels": {"ray.io/group": "other"}}}),
        "raysize-ray-pods",
        "ippr-status annotation",
    ),
    (
        "annotate a Ray pod with anything but ray.io/ippr-status",
        patch_pod({"metadata": {"annotations": {"prometheus.io/scrape": "false"}}}),
        "raysize-ray-pods",
        "ippr-status annotation",
    ),
    (
        "change a Ray pod's image",
        patch_pod(
            [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil:latest"}],
            JSON_PATCH,
        ),
        "raysize-ray-pods",
        "spec but through the resize",
    ),
    (
        "write ray.io/ippr-status on a pod KubeRay did not make",
        lambda kube, pod: kube.set_ippr_status("default", "not-ray", IpprStatus(raylet_id="x")),
        "raysize-ray-pods",
        "only Ray pods",
    ),
    (
        "resize a pod KubeRay did not make",
        lambda kube, pod: kube.patch_resize("default", "not-ray", 2000, 2 * GIB),
        "raysize-ray-pods",
        "only Ray pods",
    ),
    (
        "raise a RayCluster's own limits (its ray.io/ippr annotation)",
        lambda kube, pod: kube.custom.patch_namespaced_custom_object(
            "ray.io",
            "v1",
            "default",
            "rayclusters",
            "raysize-example",
            {
                "metadata": {
                    "annotations": {"ray.io/ippr": '{"groups": {"cpu": {"max-cpu": "64"}}}'}
                }
            },
            dry_run="All",
            _content_type="application/merge-patch+json",
        ),
        "raysize-rayclusters",
        "labels, annotations",
    ),
    (
        "change a RayCluster's rayVersion",
        patch_cluster([{"op": "replace", "path": "/spec/rayVersion", "value": "2.0.0"}]),
        "raysize-rayclusters",
        "not the rest of its spec",
    ),
    (
        "change the head group's image",
        patch_cluster(
            [
                {
                    "op": "replace",
                    "path": "/spec/headGroupSpec/template/spec/containers/0/image",
                    "value": "evil:latest",
                }
            ]
        ),
        "raysize-rayclusters",
        "not the rest of its spec",
    ),
    (
        "change a worker group's template",
        patch_cluster(
            [
                {
                    "op": "replace",
                    "path": "/spec/workerGroupSpecs/0/template/spec/containers/0/image",
                    "value": "evil:latest",
                }
            ]
        ),
        "raysize-rayclusters",
        "not their other fields",
    ),
    (
        "raise a worker group's maxReplicas",
        patch_cluster(
            [{"op": "replace", "path": "/spec/workerGroupSpecs/0/maxReplicas", "value": 1000}]
        ),
        "raysize-rayclusters",
        "not their other fields",
    ),
    (
        "remove a worker group",
        patch_cluster([{"op": "remove", "path": "/spec/workerGroupSpecs/0"}]),
        "raysize-rayclusters",
        "not their other fields",
    ),
]


@pytest.mark.parametrize(
    ("what", "call", "policy", "fragment"), FORBIDDEN_PATCHES, ids=[c[0] for c in FORBIDDEN_PATCHES]
)
def test_the_admission_policy_refuses_what_raysize_never_does(world, what, call, policy, fragment):
    """RBAC lets the token patch pods and RayClusters in the watched namespace; the policy
    refuses every patch raysize does not make, with its own message."""
    pod = ray_worker_pod(world)
    plain_pod(world)
    with pytest.raises((ApiException, KubeError)) as refused:
        call(world.worker_kube(), pod)
    status = getattr(refused.value, "status", 0)
    message = (
        json.loads(refused.value.body)["message"]
        if isinstance(refused.value, ApiException)
        else refused.value.message
    )
    assert status == 403, (what, message)
    assert (
        f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: "
        f"{policy_message(policy, fragment)}"
    ) in message, message


def test_the_admission_policy_leaves_everyone_else_alone(world):
    """The policy applies to raysize's ServiceAccount only: the admin (and so KubeRay, the
    kubelet, users) may still relabel a Ray pod or change a RayCluster."""
    pod = ray_worker_pod(world)
    admin = Kube(config.new_client_from_config(config_file=str(world.admin)), timeout_s=5.0)
    for what, call, _, _ in FORBIDDEN_PATCHES:
        if "KubeRay did not make" in what:
            continue  # not dry runs
        call(admin, pod)  # dry runs: accepted, nothing changes


def test_a_resize_changes_nothing_but_resources(world):
    """Through pods/resize, raysize's token changes only the container's resources: the
    labels sent with it do not land (the server's resize strategy drops them; the policy
    checks the same)."""
    pod = ray_worker_pod(world)
    kube = world.worker_kube()
    before = kube.get_pod("default", pod)
    after = kube.core.patch_namespaced_pod_resize(
        pod, "default",
        {"metadata": {"labels": {"ray.io/group": "other"}},
         "spec": {"containers": [{"name": before["spec"]["containers"][0]["name"],
                                  "image": "evil:latest"}]}},
        dry_run="All",
    )  # fmt: skip
    assert after.metadata.labels == before["metadata"]["labels"]
    assert after.spec.containers[0].image == before["spec"]["containers"][0]["image"]


def test_the_worker_names_a_watched_namespace_it_cannot_act_in(world):
    """The worker's start-up check (worker/run.py namespace_problem), on the real server:
    its dry-run Event is valid where raysize has its Role, refused (403) where it has none,
    and 404 for a namespace that does not exist when the grant is cluster-wide (here: the
    admin, whom RBAC lets do anything)."""
    kube = world.worker_kube()
    assert namespace_problem(kube, "default") is None
    assert "raysize may not act in namespace 'no-such-ns'" in str(
        namespace_problem(kube, "no-such-ns")
    )
    admin = Kube(config.new_client_from_config(config_file=str(world.admin)), timeout_s=5.0)
    assert "namespace 'no-such-ns' does not exist" in str(namespace_problem(admin, "no-such-ns"))
    assert namespace_problem(admin, "default") is None
    events = admin.core.list_namespaced_event("default").items
    assert not [e for e in events if e.metadata.name == "raysize-namespace-check"]  # dry runs
