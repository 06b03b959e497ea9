"""The KubeRay operator simulator: RayCluster → pods, and the RayCluster's `status`.

Like KubeRay: one head pod from `headGroupSpec.template` (`<cluster>-head-xxxxx`), and per
worker group `replicas` pods from its template (`<cluster>-<group>-worker-xxxxx`), with
KubeRay's labels and its Ray container command (`ulimit -n 65536; ray start …` from the
group's `rayStartParams` and the container's size: `ray_start_line`), the flags the
embedded world's Raylets start with (`sandbox/rayprocs.py`). Pods named in
`scaleStrategy.workersToDelete` are deleted, on every reconcile, and the list is left as
it is (KubeRay v1.6 does not empty it: tests/sandbox/test_exact_scale.py checks both
worlds); surplus pods are deleted only when in-tree autoscaling is off (with it on,
KubeRay leaves scale-in to the
autoscaler's `workersToDelete`). The status carries `state`, `head.podIP`,
`head.serviceIP` and `endpoints` (`gcs` → the head's GCS port, the real one with
`--with-ray`).

`spec.authOptions.mode: token` (KubeRay 1.5+, `reconcileAuthSecret` and
`SetContainerTokenAuthEnvVars`): before the pods, a Secret named after the cluster (as
`utils.CheckName` clips it) with a random token under `auth_token`, owned by the
RayCluster and labelled `ray.io/cluster`, unless `authOptions.secretName` names the
user's own; every Ray container gets `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` from that
Secret (`secretKeyRef`), where it does not set them itself. docs/design/ray-protocol.md §3(e).
"""

from __future__ import annotations

import base64
import copy
import logging
import math
import queue
import secrets
import threading
from collections.abc import Callable

from raysize.activities.ray_tokens import SECRET_KEY, kuberay_secret_name
from raysize.sandbox.errors import ApiError
from raysize.sandbox.server import Api
from raysize.sandbox.store import Obj, Watcher, now_rfc3339
from raysize.workflows.resources import CPU, MEMORY, quantity_to_units, units_to_quantity

log = logging.getLogger(__name__)

HEAD_GROUP = "headgroup"
DEFAULT_ENDPOINTS = {
    "client": "10001",
    "dashboard": "8265",
    "gcs": "6379",  # KubeRay 1.6 names the head's ports client, dashboard, gcs, metrics
    "metrics": "8080",
}


class RayOperator:
    def __init__(
        self,
        api: Api,
        gcs_port: Callable[[str, str], int | None] | None = None,
        service_ip: Callable[[str, str], str | None] | None = None,
    ) -> None:
        self.api = api
        self.store = api.store
        self._gcs_port = gcs_port or (lambda ns, name: None)
        self._service_ip = service_ip
        self._services: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._clusters: Watcher | None = None
        self._pods: Watcher | None = None
        self._wake: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self.errors: list[str] = []

    def start(self) -> RayOperator:
        self._clusters = self.store.watch("rayclusters", None, lambda o: True, None)
        self._pods = self.store.watch(
            "pods", None, lambda o: "ray.io/cluster" in (o["metadata"].get("labels") or {}), None
        )
        for w, kind in ((self._clusters, "cluster"), (self._pods, "pod")):
            threading.Thread(
                target=self._pump, args=(w, kind), daemon=True, name=f"sandbox-operator-{kind}s"
            ).start()
        self._thread = threading.Thread(target=self._run, name="sandbox-operator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in (self._clusters, self._pods):
            if w is not None:
                self.store.unwatch(w)
        self._wake.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _pump(self, watcher: Watcher, kind: str) -> None:
        while not self._stop.is_set():
            item = watcher.events.get()
            if item is None:
                return
            event, obj = item
            meta = obj["metadata"]
            if kind == "cluster":
                key = (meta.get("namespace", ""), meta["name"])
                if event == "DELETED":
                    self._wake.put(("deleted:" + key[0], key[1]))
                    continue
            else:
                key = (meta.get("namespace", ""), (meta.get("labels") or {})["ray.io/cluster"])
            self._wake.put(key)

    def _run(self) -> None:
        while not self._stop.is_set():
            key = self._wake.get()
            if key is None:
                return
            pending = {key}
            while True:  # coalesce a burst of events into one reconcile per cluster
                try:
                    more = self._wake.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    return
                pending.add(more)
            for ns, name in sorted(pending):
                try:
                    if ns.startswith("deleted:"):
                        self._collect(ns[len("deleted:") :], name)
                    else:
                        self.reconcile(ns, name)
                except ApiError as exc:
                    log.debug("reconcile %s/%s: %s", ns, name, exc)
                    self._wake.put((ns, name))  # conflicts and races: try again
                except Exception as exc:
                    log.exception("operator simulator error")
                    self.errors.append(repr(exc))

    # --- reconcile --------------------------------------------------------------------
    def _cluster_pods(self, ns: str, name: str) -> list[Obj]:
        return self.store.labelled("pods", ns, "ray.io/cluster", name)

    def _collect(self, ns: str, name: str) -> None:
        """Owner-reference garbage collection of a deleted RayCluster's pods."""
        for pod in self._cluster_pods(ns, name):
            self._delete_pod(ns, pod["metadata"]["name"])
        secret = self.store.find("secrets", ns, kuberay_secret_name(name))
        owners = (secret or {}).get("metadata", {}).get("ownerReferences") or []
        if any(o.get("kind") == "RayCluster" and o.get("name") == name for o in owners):
            try:
                self.api.internal(
                    "DELETE", f"/api/v1/namespaces/{ns}/secrets/{kuberay_secret_name(name)}"
                )
            except ApiError as exc:
                if exc.code != 404:
                    raise
        self._services.pop((ns, name), None)

    def reconcile(self, ns: str, name: str) -> None:
        cluster = self.store.find("rayclusters", ns, name)
        if cluster is None:
            return
        spec = cluster.get("spec") or {}
        if spec.get("suspend"):
            for pod in self._cluster_pods(ns, name):
                self._delete_pod(ns, pod["metadata"]["name"])
            self._write_status(cluster, self._cluster_pods(ns, name))
            return
        self._auth_secret(cluster)
        pods = [
            p for p in self._cluster_pods(ns, name) if not p["metadata"].get("deletionTimestamp")
        ]
        heads = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "head"]
        if not heads:
            self._create_pod(cluster, "head", HEAD_GROUP, spec.get("headGroupSpec") or {})
        autoscaling = bool(spec.get("enableInTreeAutoscaling"))
        groups = spec.get("workerGroupSpecs") or []
        for group in groups:
            gname = group.get("groupName", "")
            members = [
                p
                for p in pods
                if p["metadata"]["labels"].get("ray.io/node-type") == "worker"
                and p["metadata"]["labels"].get("ray.io/group") == gname
            ]
            to_delete = set((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
            if to_delete:
                for pod in members:
                    if pod["metadata"]["name"] in to_delete:
                        self._delete_pod(ns, pod["metadata"]["name"])
                members = [p for p in members if p["metadata"]["name"] not in to_delete]
            replicas = 0 if group.get("suspend") else int(group.get("replicas") or 0)
            diff = replicas - len(members)
            for _ in range(max(0, diff)):
                self._create_pod(cluster, "worker", gname, group)
            if diff < 0 and not autoscaling:
                for pod in sorted(members, key=lambda p: p["metadata"]["creationTimestamp"])[diff:]:
                    self._delete_pod(ns, pod["metadata"]["name"])
        self._write_status(self.store.get("rayclusters", ns, name), self._cluster_pods(ns, name))

    def _auth_secret(self, cluster: Obj) -> None:
        """KubeRay's `reconcileAuthSecret`: the cluster's token Secret, made once."""
        auth = (cluster.get("spec") or {}).get("authOptions") or {}
        if auth.get("mode") != "token" or auth.get("enableK8sTokenAuth") or auth.get("secretName"):
            return
        meta = cluster["metadata"]
        ns, secret = meta.get("namespace", "default"), kuberay_secret_name(meta["name"])
        if self.store.find("secrets", ns, secret) is not None:
            return
        # KubeRay's generateRandomToken(32): base64 of 32 random bytes, as the token's text
        token = base64.b64encode(secrets.token_bytes(32)).decode()
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret,
                "namespace": ns,
                "labels": {"ray.io/cluster": meta["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayCluster",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "type": "Opaque",
            "data": {SECRET_KEY: base64.b64encode(token.encode()).decode()},
        }
        self.api.internal("POST", f"/api/v1/namespaces/{ns}/secrets", body)

    def _create_pod(self, cluster: Obj, node_type: str, group: str, group_spec: Obj) -> None:
        meta = cluster["metadata"]
        ns, name = meta.get("namespace", "default"), meta["name"]
        template = copy.deepcopy(group_spec.get("template") or {})
        pod_meta = template.get("metadata") or {}
        labels = dict(pod_meta.get("labels") or {})
        labels.update(
            {
                "ray.io/cluster": name,
                "ray.io/node-type": node_type,
                "ray.io/group": group,
                "ray.io/identifier": f"{name}-{node_type}",
                "ray.io/is-ray-node": "yes",
                "app.kubernetes.io/name": "kuberay",
                "app.kubernetes.io/created-by": "kuberay-operator",
            }
        )
        prefix = f"{name}-head-" if node_type == "head" else f"{name}-{group}-worker-"
        spec = template.get("spec") or {}
        containers = spec.get("containers") or []
        if containers:
            _set_ray_start(containers[0], node_type, group_spec, f"{name}-head-svc.{ns}")
            env = [
                e
                for e in containers[0].get("env") or []
                if e.get("name")
                not in ("RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME", "RAY_CLUSTER_NAME")
            ]
            env += [
                {"name": "RAY_CLUSTER_NAME", "value": name},
                {
                    "name": "RAY_CLOUD_INSTANCE_ID",
                    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
                },
                {"name": "RAY_NODE_TYPE_NAME", "value": group},
            ]
            if node_type == "worker":
                env.append(
                    {"name": "RAY_ADDRESS", "value": f"{name}-head-svc.{ns}.svc.cluster.local:6379"}
                )
            containers[0]["env"] = env
            in_tree = bool((cluster.get("spec") or {}).get("enableInTreeAutoscaling"))
            v2 = (
                in_tree
                and ((cluster["spec"].get("autoscalerOptions") or {}).get("version")) == "v2"
            )
            if node_type == "head" and in_tree:
                _add_autoscaler(spec, containers, name, cluster["spec"].get("autoscalerOptions"))
                _set_token_env(containers[-1], name, cluster["spec"].get("authOptions"))
                if v2:  # KubeRay's setAutoscalerV2EnvVars: the GCS runs autoscaler v2
                    env.append({"name": "RAY_enable_autoscaler_v2", "value": "true"})
            if v2:  # head and workers alike: a Ray node that ends is not restarted
                spec["restartPolicy"] = "Never"
            _set_token_env(containers[0], name, (cluster.get("spec") or {}).get("authOptions"))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": prefix,
                "namespace": ns,
                "labels": labels,
                "annotations": dict(pod_meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayCluster",
                        "name": name,
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        self.api.internal("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def _delete_pod(self, ns: str, pod: str) -> None:
        try:
            self.api.internal("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}")
        except ApiError as exc:
            if exc.code != 404:
                raise

    # --- status -----------------------------------------------------------------------
    def _write_status(self, cluster: Obj, pods: list[Obj]) -> None:
        meta = cluster["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        spec = cluster.get("spec") or {}
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        head = next(
            (p for p in live if p["metadata"]["labels"].get("ray.io/node-type") == "head"), None
        )
        workers = [p for p in live if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
        running = [p for p in workers if (p.get("status") or {}).get("phase") == "Running"]
        groups = spec.get("workerGroupSpecs") or []
        desired = sum(int(g.get("replicas") or 0) for g in groups if not g.get("suspend"))
        cpu, memory = self._desired_size(spec)
        head_running = head is not None and (head.get("status") or {}).get("phase") == "Running"
        status: Obj = dict(cluster.get("status") or {})
        new: Obj = {
            "state": "suspended"
            if spec.get("suspend")
            else ("ready" if head_running and len(running) >= desired else status.get("state", "")),
            "desiredWorkerReplicas": desired,
            "availableWorkerReplicas": len(running),
            "readyWorkerReplicas": len(running),
            "minWorkerReplicas": sum(int(g.get("minReplicas") or 0) for g in groups),
            "maxWorkerReplicas": sum(int(g.get("maxReplicas") or 0) for g in groups),
            "desiredCPU": units_to_quantity(cpu, CPU),
            "desiredMemory": units_to_quantity(memory, MEMORY),
            "desiredGPU": "0",
            "desiredTPU": "0",
            "observedGeneration": meta.get("generation", 1),
        }
        if not new["state"]:
            new.pop("state")
        endpoints = dict(DEFAULT_ENDPOINTS)
        port = self._gcs_port(ns, name)
        if port is not None:
            endpoints["gcs"] = str(port)
        new["endpoints"] = endpoints
        if head is not None and head_running:
            new["head"] = {
                "podIP": head["status"].get("podIP", ""),
                "podName": head["metadata"]["name"],
                "serviceIP": self._service(ns, name),
                "serviceName": f"{name}-head-svc",
            }
        merged = {**status, **new}
        if "head" not in new:
            merged.pop("head", None)
        if merged == status:
            return
        merged["lastUpdateTime"] = now_rfc3339()
        body = copy.deepcopy(cluster)
        body["status"] = merged
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
        self.api.internal("PUT", f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}/status", body)

    def _service(self, ns: str, name: str) -> str:
        ip = self._service_ip(ns, name) if self._service_ip is not None else None
        if ip:
            return ip
        key = (ns, name)
        if key not in self._services:
            self._services[key] = f"10.96.0.{10 + len(self._services)}"
        return self._services[key]

    @staticmethod
    def _desired_size(spec: Obj) -> tuple[int, int]:
        def size(template: Obj) -> tuple[int, int]:
            cpu = mem = 0
            for c in (template.get("spec") or {}).get("containers") or []:
                res = c.get("resources") or {}
                lim, req = res.get("limits") or {}, res.get("requests") or {}
                cpu += quantity_to_units(lim.get("cpu") or req.get("cpu") or 0, CPU)
                mem += quantity_to_units(lim.get("memory") or req.get("memory") or 0, MEMORY)
            return cpu, mem

        cpu, mem = size((spec.get("headGroupSpec") or {}).get("template") or {})
        for g in spec.get("workerGroupSpecs") or []:
            c, m = size(g.get("template") or {})
            n = int(g.get("replicas") or 0)
            cpu, mem = cpu + c * n, mem + m * n
        return cpu, mem


__all__ = ["RayOperator", "ray_start_line"]

# KubeRay v1.6's defaults in every `ray start` line (utils.DefaultMetricsPort, …)
METRICS_PORT, DASHBOARD_AGENT_PORT, GCS_PORT = "8080", "52365", "6379"


def ray_start_line(node_type: str, params: Obj, resources: Obj, head_service: str) -> str:
    """The shell line KubeRay v1.6 runs in a group's Ray container (`generateRayStartCommand`
    with `setMissingRayStartParams`): the group's `rayStartParams`, and where they leave
    `num-cpus`, `memory` or `num-gpus` out, the container's CPU limit (else request) and
    memory and GPU limits, each rounded up to a whole number as `Quantity.Value()` does.
    Flags in name order; "true" is a bare flag, "false" none."""
    flags = {str(k): str(v) for k, v in (params or {}).items()}
    if node_type == "worker":
        flags.setdefault("address", f"{head_service}.svc.cluster.local:{GCS_PORT}")
    else:
        flags.setdefault("dashboard-host", "0.0.0.0")
    flags.setdefault("metrics-export-port", METRICS_PORT)
    flags["block"] = "true"
    flags.setdefault("dashboard-agent-listen-port", DASHBOARD_AGENT_PORT)
    limits = (resources or {}).get("limits") or {}
    requests = (resources or {}).get("requests") or {}
    cpu = quantity_to_units(limits.get("cpu") or 0, CPU) or quantity_to_units(
        requests.get("cpu") or 0, CPU
    )
    if "num-cpus" not in flags and cpu:
        flags["num-cpus"] = str(math.ceil(cpu / 1000))
    memory = quantity_to_units(limits.get("memory") or 0, MEMORY)
    if "memory" not in flags and memory:
        flags["memory"] = str(memory)
    for key in sorted(limits):
        if "num-gpus" not in flags and key.endswith("gpu"):
            gpus = quantity_to_units(limits[key], "GPU")
            if gpus:
                flags["num-gpus"] = str(math.ceil(gpus / 10_000))
    parts = []
    for key in sorted(flags):
        value = flags[key]
        if value.lower() in ("true", "false") and key not in ("log-color", "include-dashboard"):
            if value.lower() == "true":
                parts.append(f"--{key}")
        else:
            parts.append(f"--{key}={value}")
    head = "ray start --head" if node_type == "head" else "ray start"
    return f"ulimit -n 65536; {head} {' '.join(parts)}"


def _set_ray_start(container: Obj, node_type: str, group_spec: Obj, head_service: str) -> None:
    """KubeRay's command for the Ray container (`BuildPod`): `/bin/bash -c --` and the
    `ray start` line, after the container's own command and args if it has any; left as it
    is when those already run `ray start`."""
    own = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
    if "ray start" in own:
        return
    line = ray_start_line(
        node_type,
        group_spec.get("rayStartParams") or {},
        container.get("resources") or {},
        head_service,
    )
    container["command"] = ["/bin/bash", "-c", "--"]
    container["args"] = [f"{own} && {line}" if own else line]


def _set_token_env(container: Obj, cluster: str, auth: Obj | None) -> None:
    """KubeRay's `SetContainerTokenAuthEnvVars` (token mode, without Kubernetes-delegated
    auth): RAY_AUTH_MODE and RAY_AUTH_TOKEN from the Secret, unless already set."""
    if not auth or auth.get("mode") != "token" or auth.get("enableK8sTokenAuth"):
        return
    env = container.setdefault("env", [])
    names = {e.get("name") for e in env}
    if "RAY_AUTH_MODE" not in names:
        env.append({"name": "RAY_AUTH_MODE", "value": "token"})
    if "RAY_AUTH_TOKEN" not in names:
        secret = auth.get("secretName") or kuberay_secret_name(cluster)
        ref = {"key": SECRET_KEY, "name": secret}
        env.append({"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": ref}})


def _add_autoscaler(spec: Obj, containers: list[Obj], cluster: str, options: Obj | None) -> None:
    """What KubeRay v1.6 adds to the head pod with `enableInTreeAutoscaling`: Ray's
    autoscaler as the container `autoscaler` (the Ray container's image, 500m/512Mi unless
    `autoscalerOptions` says otherwise), a `ray-logs` volume both mount at /tmp/ray, and
    the cluster's ServiceAccount (KubeRay also makes it and its Role; the stand-in does
    not: nothing here checks them). The embedded kubelet runs no process for it: it
    reports it running, which is what raysize reads (`ray_autoscaler_running`)."""
    options = options or {}
    default = {"cpu": "500m", "memory": "512Mi"}
    field_env = (
        ("RAY_CLUSTER_NAME", "metadata.labels['ray.io/cluster']"),
        ("RAY_CLUSTER_NAMESPACE", "metadata.namespace"),
        ("RAY_HEAD_POD_NAME", "metadata.name"),
    )
    logs = {"mountPath": "/tmp/ray", "name": "ray-logs"}
    containers.append(
        {
            "name": "autoscaler",
            "image": options.get("image") or containers[0].get("image", ""),
            "imagePullPolicy": options.get("imagePullPolicy", "IfNotPresent"),
            "command": ["/bin/bash", "-c", "--"],
            "args": [
                "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) "
                "--cluster-namespace $(RAY_CLUSTER_NAMESPACE)"
            ],
            "env": [
                {"name": n, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f}}}
                for n, f in field_env
            ]
            + [{"name": "KUBERAY_CRD_VER", "value": "v1"}, *(options.get("env") or [])],
            "resources": copy.deepcopy(
                options.get("resources") or {"limits": default, "requests": dict(default)}
            ),
            "volumeMounts": [dict(logs)],
        }
    )
    mounts = containers[0].setdefault("volumeMounts", [])
    if not any(m.get("name") == "ray-logs" for m in mounts):
        mounts.append(dict(logs))
    volumes = spec.setdefault("volumes", [])
    if not any(v.get("name") == "ray-logs" for v in volumes):
        volumes.append({"name": "ray-logs", "emptyDir": {}})
    spec.setdefault("serviceAccountName", cluster)
