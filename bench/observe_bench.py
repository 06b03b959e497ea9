"""The Kubernetes half of an observe at size, from the pod watch's cache and from a LIST:
`python -m bench.observe_bench [--sizes 2000,5000]`.

Runs the embedded API server (`sandbox/server.py`, in this process, without the kubelet
or the KubeRay stand-in, so nothing rewrites the pods) and fills it with a RayCluster and
N generated worker pods shaped as KubeRay 1.6 makes them and the real kube-apiserver
stores them (`kuberay_pod`: managedFields, env, probes, volumes, the kubelet's status;
about 7 KB of JSON each). For each size it prints:

- `list`: `Kube.read_cluster` as every observe did before 0.2 (GET the RayCluster, LIST
  its pods, build the views): wall time (median of 5), and the bytes per pod the LIST's
  objects hold in Python (tracemalloc, the parsed items kept as `read_cluster` keeps
  them) next to the JSON's bytes per pod;
- `cache`: the same read from a synced `PodWatch` (`read_cluster(..., cached=True)`):
  wall time (median of 5), and the bytes per pod the cache keeps (tracemalloc: what is
  still allocated after the watch's first list, divided by the pods), and the peak of
  that first list (it parses the whole list once, as the LIST path does every observe).

The wall times are on the embedded server over HTTP on 127.0.0.1: the real server's LIST
costs more (etcd, a quorum read), the cache the same. No target is checked here; the
issue's target (a 5,000-pod tick < 2 s, RSS < 600 MB) is the whole tick's.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import config

from raysize.activities.k8s import Kube
from raysize.activities.pod_watch import PodWatch
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubeconfig import write_kubeconfig

SIZES = (2_000, 5_000)
NS, CLUSTER, GROUP = "bench", "big", "cpu"
Obj = dict[str, Any]

_PROBE = (
    "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success && "
    "wget -T 2 -q -O- http://localhost:8265/api/gcs_healthz | grep success"
)


def kuberay_pod(cluster: str, group: str, i: int, *, node: str = "bench-node") -> Obj:
    """A Ray worker pod as KubeRay 1.6 creates it and the real kube-apiserver stores it,
    running, with the kubelet's status (a resize-capable container status)."""
    name = f"{cluster}-{group}-worker-{i:05d}"
    labels = {
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
        "ray.io/cluster": cluster,
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster}-worker",
        "ray.io/is-ray-node": "yes",
        "ray.io/node-type": "worker",
    }
    at = "2026-11-27T20:00:00Z"
    env: list[Obj] = [
        {"name": "FQ_RAY_IP", "value": f"{cluster}-head-svc.{NS}.svc.cluster.local"},
        {"name": "RAY_IP", "value": f"{cluster}-head-svc"},
        {
            "name": "RAY_CLUSTER_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}},
        },
        {
            "name": "RAY_CLOUD_INSTANCE_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
        {
            "name": "RAY_NODE_TYPE_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}},
        },
        {
            "name": "KUBERAY_GEN_RAY_START_CMD",
            "value": f"ray start  --address={cluster}-head-svc.{NS}.svc.cluster.local:6379  "
            "--block  --dashboard-agent-listen-port=52365  --memory=4294967296  "
            "--metrics-export-port=8080  --num-cpus=2 ",
        },
        {"name": "RAY_PORT", "value": "6379"},
        {"name": "RAY_ADDRESS", "value": f"{cluster}-head-svc.{NS}.svc.cluster.local:6379"},
        {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"},
        {"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "value": "1"},
    ]
    resources = {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "2", "memory": "4Gi"}}
    probe = {
        "exec": {"command": ["bash", "-c", _PROBE]},
        "failureThreshold": 120,
        "initialDelaySeconds": 30,
        "periodSeconds": 5,
        "successThreshold": 1,
        "timeoutSeconds": 2,
    }
    fields: Obj = {
        "f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}, "f:ownerReferences": {}},
        "f:spec": {
            "f:containers": {
                'k:{"name":"ray-worker"}': {
                    "f:env": {f'k:{{"name":"{e["name"]}"}}': {} for e in env},
                    "f:resources": {"f:limits": {}, "f:requests": {}},
                    "f:livenessProbe": {},
                    "f:readinessProbe": {},
                }
            },
            "f:initContainers": {'k:{"name":"wait-gcs-ready"}': {}},
            "f:volumes": {'k:{"name":"shared-mem"}': {}},
        },
    }
    status_fields: Obj = {
        "f:status": {
            "f:conditions": {},
            "f:containerStatuses": {},
            "f:hostIP": {},
            "f:phase": {},
            "f:podIP": {},
            "f:podIPs": {},
            "f:startTime": {},
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{cluster}-{group}-worker-",
            "namespace": NS,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(1000 + i),
            "generation": 1,
            "creationTimestamp": at,
            "labels": labels,
            "annotations": {
                "ray.io/ft-enabled": "false",
                "ray.io/ippr-status": json.dumps({"raylet-id": uuid.uuid4().hex * 2}),
            },
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "RayCluster",
                    "name": cluster,
                    "uid": "0f3c1a52-7c1e-4d7e-9d7b-3b1e2f4a5c6d",
                }
            ],
            "managedFields": [
                {
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields,
                    "manager": "kuberay-operator",
                    "operation": "Update",
                    "time": at,
                },
                {
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": status_fields,
                    "manager": "kubelet",
                    "operation": "Update",
                    "subresource": "status",
                    "time": at,
                },
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "ray-worker",
                    "image": "rayproject/ray:2.60.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/bash", "-c", "--"],
                    "args": ["ulimit -n 65536; $KUBERAY_GEN_RAY_START_CMD"],
                    "env": env,
                    "ports": [{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}],
                    "resources": resources,
                    "livenessProbe": probe,
                    "readinessProbe": {**probe, "failureThreshold": 10},
                    "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
                    "volumeMounts": [
                        {"mountPath": "/dev/shm", "name": "shared-mem"},
                        {
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "name": "kube-api-access",
                            "readOnly": True,
                        },
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                }
            ],
            "initContainers": [
                {
                    "name": "wait-gcs-ready",
                    "image": "rayproject/ray:2.60.0",
                    "command": ["/bin/bash", "-lc", "--"],
                    "args": [
                        "until ray health-check --address "
                        f"{cluster}-head-svc.{NS}.svc.cluster.local:6379 > /dev/null 2>&1; "
                        "do echo wait for GCS; sleep 5; done"
                    ],
                    "resources": {
                        "limits": {"cpu": "200m", "memory": "256Mi"},
                        "requests": {"cpu": "200m", "memory": "256Mi"},
                    },
                }
            ],
            "volumes": [
                {"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}},
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                        ],
                    },
                },
            ],
            "nodeName": node,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "securityContext": {},
            "tolerations": [
                {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "tolerationSeconds": 300,
                },
                {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "tolerationSeconds": 300,
                },
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "hostIPs": [{"ip": "10.0.0.1"}],
            "podIP": f"10.1.{i // 250}.{i % 250}",
            "podIPs": [{"ip": f"10.1.{i // 250}.{i % 250}"}],
            "qosClass": "Guaranteed",
            "startTime": at,
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": t,
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": at,
                    "observedGeneration": 1,
                }
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "initContainerStatuses": [
                {
                    "name": "wait-gcs-ready",
                    "image": "rayproject/ray:2.60.0",
                    "imageID": "docker.io/rayproject/ray@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + uuid.uuid4().hex * 2,
                    "ready": True,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": at,
                            "finishedAt": at,
                            "containerID": "containerd://" + "cd" * 32,
                        }
                    },
                    "lastState": {},
                }
            ],
            "containerStatuses": [
                {
                    "name": "ray-worker",
                    "image": "docker.io/rayproject/ray:2.60.0",
                    "imageID": "docker.io/rayproject/ray@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + uuid.uuid4().hex * 2,
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": at}},
                    "lastState": {},
                    "allocatedResources": {"cpu": "2", "memory": "4Gi"},
                    "resources": resources,
                    "volumeMounts": [{"mountPath": "/dev/shm", "name": "shared-mem"}],
                }
            ],
        },
    }


def raycluster(cluster: str, pods: int) -> Obj:
    template = kuberay_pod(cluster, GROUP, 0)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": cluster,
            "namespace": NS,
            "annotations": {
                "ray.io/ippr": json.dumps(
                    {"groups": {GROUP: {"max-cpu": "8", "max-memory": "16Gi"}}}
                )
            },
        },
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [template["spec"]["containers"][0]]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": GROUP,
                    "replicas": pods,
                    "minReplicas": 0,
                    "maxReplicas": pods,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [template["spec"]["containers"][0]]}},
                }
            ],
        },
    }


def median_s(fn: Callable[[], object], n: int = 5) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def retained(fn: Callable[[], object]) -> tuple[object, int, int]:
    """What `fn` returns, the bytes still allocated after it (what it keeps, with its
    result), and its peak."""
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = fn()
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, after - before, peak - before


def fill(sb: Sandbox, pods: int) -> int:
    """The RayCluster and its pods, straight into the server's store; the JSON bytes of
    one pod as the server sends it."""
    sb.store.create("rayclusters", NS, raycluster(CLUSTER, pods))
    size = 0
    for i in range(pods):
        created = sb.store.create("pods", NS, kuberay_pod(CLUSTER, GROUP, i))
        size = size or len(json.dumps(created, separators=(",", ":")))
    return size


def measure(pods: int, workdir: Path) -> dict[str, float]:
    sb = Sandbox(SandboxConfig(watch_history=100_000))
    sb.server.start()  # the API server alone: no kubelet, no operator
    try:
        json_bytes = fill(sb, pods)
        path = write_kubeconfig(workdir / f"kubeconfig-{pods}", sb.url)
        kube = Kube(config.new_client_from_config(config_file=str(path)), timeout_s=120)
        listed, list_bytes, _ = retained(lambda: kube.list_cluster_pods(NS, CLUSTER))
        assert len(listed[0]) == pods  # type: ignore[index]
        del listed
        list_s = median_s(lambda: kube.read_cluster(NS, CLUSTER))

        def synced_watch() -> PodWatch:
            watch = PodWatch(kube.core)
            watch.cluster_pods(NS, CLUSTER, wait_s=0)  # starts the namespace's watch
            deadline = time.monotonic() + 300
            while not watch.synced(NS):
                if time.monotonic() > deadline:
                    raise SystemExit("the pod watch did not sync within 300 s")
                time.sleep(0.01)
            return watch

        watch, cache_bytes, cache_peak = retained(synced_watch)
        assert isinstance(watch, PodWatch)
        try:
            kube.pod_watch = watch
            view = kube.read_cluster(NS, CLUSTER, cached=True)
            assert len(view.pods) == pods and watch.cached_reads == 1
            cache_s = median_s(lambda: kube.read_cluster(NS, CLUSTER, cached=True))
        finally:
            watch.close()
            kube.api.close()
    finally:
        sb.server.stop()
    return {
        "json_bytes_per_pod": json_bytes,
        "list_bytes_per_pod": list_bytes / pods,
        "list_s": list_s,
        "cache_bytes_per_pod": cache_bytes / pods,
        "cache_first_list_peak_mb": cache_peak / 1e6,
        "cache_s": cache_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for pods in (int(x) for x in args.sizes.split(",")):
            m = measure(pods, Path(tmp))
            print(
                f"pods={pods} json_bytes_per_pod={m['json_bytes_per_pod']:.0f} "
                f"list: observe_s={m['list_s']:.3f} bytes_per_pod={m['list_bytes_per_pod']:.0f} "
                f"cache: observe_s={m['cache_s']:.3f} bytes_per_pod={m['cache_bytes_per_pod']:.0f} "
                f"(first list peak {m['cache_first_list_peak_mb']:.0f} MB)",
                flush=True,
            )


if __name__ == "__main__":
    main()
