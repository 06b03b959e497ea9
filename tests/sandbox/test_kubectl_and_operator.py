"""kubectl flows, the KubeRay operator simulator, and fault injection."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from raysize.activities.k8s_objects import ray_autoscaler_running
from raysize.sandbox.faults import FaultRule
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.rayprocs import ray_start_resources
from tests.orchestration.temporal_env import venv_binary
from tests.sandbox.conftest import client_for, wait_for

KUBECTL = venv_binary("kubectl")


def worker_template(cpu: str = "1", memory: str = "2Gi") -> dict:
    return {
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "rayproject/ray:2.60.0",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": memory},
                        "limits": {"cpu": cpu, "memory": memory},
                    },
                }
            ]
        }
    }


def raycluster(name: str = "rc", replicas: int = 2) -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": worker_template("1", "2Gi")},
            "workerGroupSpecs": [
                {
                    "groupName": "small",
                    "replicas": replicas,
                    "minReplicas": 0,
                    "maxReplicas": 5,
                    "rayStartParams": {},
                    "template": worker_template("1", "1Gi"),
                    "scaleStrategy": {"workersToDelete": []},
                }
            ],
        },
    }


@pytest.fixture
def sb_client(make_sandbox, tmp_path):
    sb = make_sandbox(timing=KubeletTiming(actuation_delay_s=0.0))
    api = client_for(sb, tmp_path)
    yield sb, api, str(tmp_path / f"kc-{sb.server.port}")
    api.close()


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": kubeconfig, "HOME": os.path.dirname(kubeconfig)},
    )


def workers(core: client.CoreV1Api) -> list[client.V1Pod]:
    return [
        p
        for p in core.list_namespaced_pod(
            "default", label_selector="ray.io/cluster=rc,ray.io/node-type=worker"
        ).items
        if not p.metadata.deletion_timestamp
    ]


def test_kubectl_get_patch_resize_and_describe(sb_client):
    _sb, api, kc = sb_client
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "ray.io", "v1", "default", "rayclusters", raycluster(replicas=1)
    )
    core = client.CoreV1Api(api)
    pod = wait_for(lambda: [p for p in workers(core) if p.status.phase == "Running"])[0]
    name = pod.metadata.name

    out = kubectl(kc, "get", "pods")
    assert out.returncode == 0, out.stderr
    assert name in out.stdout and "Running" in out.stdout and "READY" in out.stdout
    wait_for(lambda: "ready" in kubectl(kc, "get", "raycluster").stdout)
    out = kubectl(kc, "get", "raycluster", "rc")
    assert out.returncode == 0 and "rc" in out.stdout and "DESIRED WORKERS" in out.stdout

    out = kubectl(
        kc,
        "patch",
        "pod",
        name,
        "--subresource",
        "resize",
        "-p",
        '{"spec":{"containers":[{"name":"ray-worker","resources":'
        '{"requests":{"cpu":"2"},"limits":{"cpu":"2"}}}]}}',
    )
    assert out.returncode == 0, out.stderr
    assert f"pod/{name} patched" in out.stdout
    wait_for(lambda: "ResizeCompleted" in kubectl(kc, "describe", "pod", name).stdout)
    described = kubectl(kc, "describe", "pod", name).stdout
    assert "ResizeStarted" in described and "Pod resize completed" in described

    bad = kubectl(
        kc,
        "patch",
        "pod",
        name,
        "--subresource",
        "resize",
        "-p",
        '{"spec":{"containers":[{"name":"ray-worker","resources":{"requests":{"cpu":"1"}}}]}}',
    )
    assert bad.returncode != 0
    assert "Pod QOS Class may not change as a result of resizing" in bad.stderr


def test_operator_creates_pods_with_kuberay_names_labels_and_sizes(sb_client):
    sb, api, _ = sb_client
    co = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    co.create_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", raycluster())
    pods = wait_for(lambda: len(workers(core)) == 2 and workers(core))
    head = core.list_namespaced_pod("default", label_selector="ray.io/node-type=head").items
    assert len(head) == 1 and head[0].metadata.name.startswith("rc-head-")
    for p in pods:
        assert p.metadata.name.startswith("rc-small-worker-")
        assert p.metadata.labels["ray.io/cluster"] == "rc"
        assert p.metadata.labels["ray.io/group"] == "small"
        assert p.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
        assert p.metadata.owner_references[0].kind == "RayCluster"
    status = wait_for(
        lambda: (
            (
                s := co.get_namespaced_custom_object(
                    "ray.io", "v1", "default", "rayclusters", "rc"
                ).get("status", {})
            ).get("state")
            == "ready"
            and s
        )
    )
    assert status["availableWorkerReplicas"] == 2
    assert status["head"]["podIP"] == head[0].status.pod_ip
    assert status["endpoints"]["gcs"] == "6379"

    victim = pods[0].metadata.name
    co.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        "default",
        "rayclusters",
        "rc",
        [
            {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
            {
                "op": "replace",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy/workersToDelete",
                "value": [victim],
            },
        ],
        _content_type="application/json-patch+json",
    )
    wait_for(lambda: [p.metadata.name for p in workers(core)] == [pods[1].metadata.name])
    spec = co.get_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", "rc")["spec"]
    # left as it is, as KubeRay v1.6 does (raysize's next write prunes it)
    assert spec["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == [victim]

    co.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        "default",
        "rayclusters",
        "rc",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3}],
        _content_type="application/json-patch+json",
    )
    wait_for(lambda: len(workers(core)) == 3)
    co.delete_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", "rc")
    wait_for(
        lambda: not core.list_namespaced_pod("default", label_selector="ray.io/cluster=rc").items
    )
    assert sb.operator.errors == [] and sb.kubelet.errors == []


def test_injected_errors_and_latency(sb_client):
    sb, api, _ = sb_client
    core = client.CoreV1Api(api)
    sb.faults.add(FaultRule(verb="list", resource="pods", error_rate=1.0, codes=(500,), times=1))
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default")
    assert exc.value.status == 500 and json.loads(exc.value.body)["reason"] == "InternalError"
    assert core.list_namespaced_pod("default").items == []  # `times=1`: the next one passes
    sb.faults.clear()
    sb.faults.add(FaultRule(verb="get", resource="nodes", error_rate=1.0, codes=(429,)))
    with pytest.raises(ApiException) as exc:
        core.read_node("sandbox-node-0")
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "1"
    sb.faults.clear()
    sb.faults.add(FaultRule(verb="*", resource="namespaces", latency_s=0.3))
    started = time.monotonic()
    core.read_namespace("default")
    assert time.monotonic() - started >= 0.3


def test_watch_disconnects_lose_nothing_when_resumed(sb_client):
    sb, api, _ = sb_client
    core = client.CoreV1Api(api)
    sb.faults.add(FaultRule(verb="watch", resource="pods", watch_disconnect_after_s=0.3))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    names = [f"p{i}" for i in range(6)]

    def create() -> None:
        for name in names:
            core.create_namespaced_pod(
                "default",
                {
                    "metadata": {"name": name},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            )
            time.sleep(0.25)

    creator = threading.Thread(target=create, daemon=True)
    creator.start()
    w = watch.Watch()
    guard = threading.Timer(20, w.stop)
    guard.start()
    seen: list[str] = []
    try:
        # The client re-watches from the last resourceVersion each time the server hangs up.
        for event in w.stream(core.list_namespaced_pod, "default", resource_version=rv):
            if event["type"] == "ADDED":
                seen.append(event["object"].metadata.name)
            if set(seen) >= set(names):
                w.stop()
    finally:
        guard.cancel()
        creator.join(10)
    assert sorted(seen) == names


def test_in_tree_autoscaling_runs_rays_autoscaler_beside_the_head_and_keeps_it(kube, ns):
    """KubeRay adds Ray's autoscaler as the head pod's `autoscaler` container while
    `enableInTreeAutoscaling` is true, and does not restart the head when it is turned
    off: the sidecar runs on (raysize reads it: `ray_autoscaler_running`)."""
    co = client.CustomObjectsApi(kube)
    core = client.CoreV1Api(kube)
    rc = raycluster(replicas=0)
    rc["spec"]["enableInTreeAutoscaling"] = True
    co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)

    def head_with_sidecar() -> dict | None:
        for p in core.list_namespaced_pod(ns, label_selector="ray.io/node-type=head").items:
            pod = kube.sanitize_for_serialization(p)
            if ray_autoscaler_running([pod]):
                return pod
        return None

    # KubeRay's first head pod came later than 60 s once, with CI's three parts running
    head = wait_for(head_with_sidecar, timeout=120)
    spec = head["spec"]
    ray, sidecar = spec["containers"]  # the Ray container first
    assert sidecar["name"] == "autoscaler" and sidecar["image"] == ray["image"]
    assert sidecar["resources"] == {
        "limits": {"cpu": "500m", "memory": "512Mi"},
        "requests": {"cpu": "500m", "memory": "512Mi"},
    }
    assert sidecar["args"] == [
        "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) "
        "--cluster-namespace $(RAY_CLUSTER_NAMESPACE)"
    ]
    assert {"mountPath": "/tmp/ray", "name": "ray-logs"} in ray["volumeMounts"]
    assert sidecar["volumeMounts"] == [{"mountPath": "/tmp/ray", "name": "ray-logs"}]
    assert {"emptyDir": {}, "name": "ray-logs"} in spec["volumes"]
    assert spec["serviceAccountName"] == "rc"
    # turned off: the head is not restarted, and Ray's autoscaler runs on beside it
    co.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        ns,
        "rayclusters",
        "rc",
        [{"op": "replace", "path": "/spec/enableInTreeAutoscaling", "value": False}],
        _content_type="application/json-patch+json",
    )
    time.sleep(3)  # a reconcile of the operator's (it runs on every change of the cluster)
    heads = core.list_namespaced_pod(ns, label_selector="ray.io/node-type=head").items
    assert [h.metadata.uid for h in heads] == [head["metadata"]["uid"]]
    assert ray_autoscaler_running([kube.sanitize_for_serialization(heads[0])])
    co.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "rc")


def test_autoscaler_v2_runs_the_gcs_as_v2_and_restarts_no_ray_node(kube, ns):
    """With `autoscalerOptions.version: v2` KubeRay sets `RAY_enable_autoscaler_v2` on the
    head's Ray container (its GCS then serves autoscaler v2; the embedded world's Raylet
    gets it too, `rayprocs.PASSED_ENV`) and `restartPolicy: Never` on every Ray pod. Ray's
    own autoscaler in the embedded world ran as v1 without it (bench.autoscaler_compare)."""
    co = client.CustomObjectsApi(kube)
    core = client.CoreV1Api(kube)
    rc = raycluster("v2", replicas=1)
    rc["spec"]["enableInTreeAutoscaling"] = True
    rc["spec"]["autoscalerOptions"] = {"version": "v2"}
    co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)
    try:
        pods = wait_for(
            lambda: (lambda ps: ps if len(ps) == 2 else None)(
                core.list_namespaced_pod(ns, label_selector="ray.io/cluster=v2").items
            ),
            timeout=60,
        )
        by_type = {p.metadata.labels["ray.io/node-type"]: p for p in pods}
        head, worker = by_type["head"], by_type["worker"]
        env = {e.name: e.value for e in head.spec.containers[0].env or []}
        assert env.get("RAY_enable_autoscaler_v2") == "true"
        assert head.spec.restart_policy == worker.spec.restart_policy == "Never"
        worker_env = {e.name for e in worker.spec.containers[0].env or []}
        assert "RAY_enable_autoscaler_v2" not in worker_env
        sidecar_env = {e.name for e in head.spec.containers[1].env or []}
        assert "RAY_enable_autoscaler_v2" not in sidecar_env
    finally:
        co.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "v2")


def test_the_ray_container_runs_kuberays_ray_start_line_with_the_groups_params(kube, ns):
    """KubeRay writes the Ray container's command: `/bin/bash -c --` and `ulimit -n 65536;
    ray start …` with the group's rayStartParams, and where they leave them out the
    container's CPU (rounded up) and memory. The embedded world's Raylets start with
    those flags (`ray_start_resources`), so a head with `num-cpus: "0"` registers 0 CPU
    there as it does in the real world."""
    co = client.CustomObjectsApi(kube)
    core = client.CoreV1Api(kube)
    rc = raycluster(replicas=1)
    rc["spec"]["headGroupSpec"]["rayStartParams"] = {"num-cpus": "0"}
    rc["spec"]["workerGroupSpecs"][0]["template"] = worker_template("1500m", "1Gi")
    co.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", rc)

    def pods() -> dict[str, dict] | None:
        found = {
            p.metadata.labels["ray.io/node-type"]: kube.sanitize_for_serialization(p)
            for p in core.list_namespaced_pod(ns, label_selector="ray.io/cluster=rc").items
        }
        return found if set(found) == {"head", "worker"} else None

    made = wait_for(pods, timeout=60)
    for pod in made.values():
        ray = pod["spec"]["containers"][0]
        assert ray["command"] == ["/bin/bash", "-c", "--"]
        assert ray["args"][0].startswith("ulimit -n 65536; ray start ")
    assert ray_start_resources(made["head"]) == {"num-cpus": "0", "memory": str(2 * 1024**3)}
    assert ray_start_resources(made["worker"]) == {"num-cpus": "2", "memory": str(1024**3)}
    co.delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "rc")
