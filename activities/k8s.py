"""Kubernetes activities: read a RayCluster and its pods, resize pods, scale groups, events.

`Kube` does the work with the synchronous `kubernetes` client and raises the typed errors
of `activities.k8s_errors`; `K8sActivities` exposes it to Temporal under the activity
names of `workflows.contracts.Act` (run in a thread, so the worker's event loop never
blocks on HTTP). Every write is an absolute target, so a retried activity is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities.k8s_errors import (
    Conflict,
    Invalid,
    KubeError,
    NoRoom,
    PodGone,
    Unavailable,
    from_api_exception,
)
from activities.pod_watch import PodWatch, raycluster_mark
from workflows.contracts import (
    HEARTBEAT_TIMEOUT,
    Act,
    ApplyResizeInput,
    ApplyResizeResult,
    EventInput,
    ProgressState,
    ResizeProgress,
    ScaleInput,
    SetStatusInput,
    WaitResizeInput,
)
from workflows.ippr import (
    IPPR_STATUS_ANNOTATION,
    GroupSpecs,
    IpprStatus,
    read_group_specs,
    read_planner_settings,
)
from workflows.model import (
    ClusterSnapshot,
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
)
from workflows.resources import CPU, MEMORY, Resources, quantity_to_units, units_to_quantity
from workflows.values import Value

RAY_GROUP, RAY_API, RAY_PLURAL = "ray.io", "v1", "rayclusters"
PENDING, IN_PROGRESS = "PodResizePending", "PodResizeInProgress"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT_S = 10.0
Obj = dict[str, Any]
T = TypeVar("T")


class ContainerSize(Value):
    """One container's cpu/memory: requests and limits (absent = 0), in units."""

    cpu_request: int = 0
    cpu_limit: int = 0
    memory_request: int = 0
    memory_limit: int = 0

    @classmethod
    def of(cls, resources: Obj | None) -> ContainerSize:
        res = resources or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        return cls(
            cpu_request=quantity_to_units(req.get("cpu", 0), CPU),
            cpu_limit=quantity_to_units(lim.get("cpu", 0), CPU),
            memory_request=quantity_to_units(req.get("memory", 0), MEMORY),
            memory_limit=quantity_to_units(lim.get("memory", 0), MEMORY),
        )

    @property
    def cpu(self) -> int:
        """Ray's reading: the limit when set, else the request."""
        return self.cpu_limit or self.cpu_request

    @property
    def memory(self) -> int:
        return self.memory_limit or self.memory_request


class KubeconfigError(ValueError):
    """No usable Kubernetes configuration: the message names the file and the fix."""


def short_cause(exc: BaseException) -> str:
    """The innermost reason of a connection failure, in a few words (urllib3 nests the
    socket's error three deep: `MaxRetryError(NewConnectionError(ConnectionRefused))`)."""
    seen: set[int] = set()
    inner: BaseException = exc
    while id(inner) not in seen:
        seen.add(id(inner))
        nxt = getattr(inner, "reason", None) or inner.__cause__ or inner.__context__
        if not isinstance(nxt, BaseException):
            break
        inner = nxt
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    text = str(inner) or type(inner).__name__
    # urllib3's texts end with the socket's own words: "…: [Errno 111] Connection refused"
    if "] " in text and "[Errno" in text:
        text = text.rsplit("] ", 1)[1].rstrip(")'\"")
    return text[:200]


class KubeCluster(Value):
    """A RayCluster and its pods, as one consistent read."""

    namespace: str
    name: str
    raycluster: Obj
    groups: GroupSpecs
    pods: tuple[PodView, ...]
    replicas: dict[str, int]
    workers_to_delete: tuple[str, ...]
    resource_version: str
    pods_version: str
    resizing: tuple[str, ...]
    gcs_address: str
    mark: str = ""  # raycluster_mark: what the cluster-change watch compares

    @property
    def in_tree_autoscaling(self) -> bool:
        """Ray's own autoscaler runs beside the head (`spec.enableInTreeAutoscaling`)."""
        return (self.raycluster.get("spec") or {}).get("enableInTreeAutoscaling") is True

    def snapshot(self, settings: PlannerSettings | None = None) -> ClusterSnapshot:
        return ClusterSnapshot(
            name=self.name,
            groups=self.groups.groups,
            pods=self.pods,
            settings=read_planner_settings(self.raycluster, settings or PlannerSettings()),
        )


def _condition(pod: Obj, ctype: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return dict(c)
    return None


def _container_sizes(pod: Obj) -> tuple[ContainerSize, ContainerSize | None]:
    """(spec size, actual size from status.resources or None) of the Ray container."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise Invalid(f'pod "{pod["metadata"]["name"]}" has no containers')
    first = containers[0]
    spec = ContainerSize.of(first.get("resources"))
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == first.get("name") and cs.get("resources") is not None:
            return spec, ContainerSize.of(cs["resources"])
    return spec, None


def resize_state(pod: Obj) -> KubeletResizeState | None:
    """The resize state the conditions report (None: nothing in flight)."""
    pending = _condition(pod, PENDING)
    if pending is not None:
        return (
            KubeletResizeState.INFEASIBLE
            if pending.get("reason") == "Infeasible"
            else (KubeletResizeState.DEFERRED)
        )
    progress = _condition(pod, IN_PROGRESS)
    if progress is not None:
        return (
            KubeletResizeState.ERROR
            if progress.get("reason") == "Error"
            else KubeletResizeState.IN_PROGRESS
        )
    return None


def pod_view(pod: Obj, now: float | None = None) -> PodView:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    status = IpprStatus.from_annotation((meta.get("annotations") or {}).get(IPPR_STATUS_ANNOTATION))
    spec, actual = _container_sizes(pod)
    current = actual or spec
    state = resize_state(pod)
    resize = None
    if state is None and (spec.cpu, spec.memory) != (current.cpu, current.memory):
        state = KubeletResizeState.IN_PROGRESS  # asked, and the kubelet has not reported yet
    if state is not None:
        asked = (
            max(0.0, (time.time() if now is None else now) - status.resizing_at)
            if status.resizing_at is not None
            else None
        )
        resize = PodResize(cpu=spec.cpu, memory=spec.memory, state=state, asked_s=asked)
    running = (pod.get("status") or {}).get("phase") == "Running" and not meta.get(
        "deletionTimestamp"
    )
    return PodView(
        name=meta["name"],
        group=labels.get("ray.io/group", ""),
        phase=PodPhase.RUNNING if running else PodPhase.PENDING,
        raylet_id=status.raylet_id,
        total=Resources.of(cpu=current.cpu, memory=current.memory),
        labels=dict(labels),
        resize=resize,
        suggested_max_cpu=status.suggested_max_cpu,
        suggested_max_memory=status.suggested_max_memory,
        failed=status.last_failed_at is not None,
        failed_age_s=max(0.0, (time.time() if now is None else now) - status.last_failed_at)
        if status.last_failed_at is not None
        else 0.0,
        running_s=_running_s(pod, time.time() if now is None else now) if running else 0.0,
    )


def _running_s(pod: Obj, now: float) -> float:
    """Seconds since the pod's status.startTime (0 when it has none)."""
    started = (pod.get("status") or {}).get("startTime")
    if not isinstance(started, str):
        return 0.0
    try:
        at = datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(0.0, now - at)


def progress_of(pod: Obj, cpu: int, memory: int, generation: int) -> ResizeProgress:
    """Where the resize of `pod` to (cpu, memory) at `generation` stands."""
    spec, actual = _container_sizes(pod)
    current = actual or spec
    gaps = {
        "cpu_gap": current.cpu_limit - current.cpu_request if current.cpu_limit else 0,
        "memory_gap": (
            current.memory_limit - current.memory_request if current.memory_limit else 0
        ),
    }
    others = [
        ContainerSize.of(cs.get("resources"))
        for cs in ((pod.get("status") or {}).get("containerStatuses") or [])[1:]
    ]
    base: dict[str, Any] = {
        "cpu": current.cpu,
        "memory": current.memory,
        **gaps,
        "other_cpu_requests": sum(o.cpu_request for o in others),
        "other_memory_requests": sum(o.memory_request for o in others),
    }
    pending = _condition(pod, PENDING)
    if pending is not None and int(pending.get("observedGeneration") or generation) >= generation:
        reason = str(pending.get("reason", ""))
        state = ProgressState.INFEASIBLE if reason == "Infeasible" else ProgressState.DEFERRED
        return ResizeProgress(
            state=state, reason=reason, message=str(pending.get("message", "")), **base
        )
    progress = _condition(pod, IN_PROGRESS)
    if progress is not None and progress.get("reason") == "Error":
        return ResizeProgress(
            state=ProgressState.ERROR,
            reason="Error",
            message=str(progress.get("message", "")),
            **base,
        )
    if progress is None and pending is None and (current.cpu, current.memory) == (cpu, memory):
        return ResizeProgress(state=ProgressState.DONE, **base)
    return ResizeProgress(state=ProgressState.IN_PROGRESS, **base)


def gcs_address(rc: Obj) -> str:
    """host:port of the RayCluster's GCS from its status, "" until KubeRay reports both.
    The port is the head service's port named `gcs` (KubeRay 1.6) or `gcs-server` (older
    KubeRay); the host is the head service's IP, else the head pod's."""
    status = rc.get("status") or {}
    head, endpoints = status.get("head") or {}, status.get("endpoints") or {}
    port = endpoints.get("gcs") or endpoints.get("gcs-server") or ""
    host = head.get("serviceIP") or head.get("podIP") or ""
    return f"{host}:{port}" if host and port else ""


def resize_patch(pod: Obj, cpu: int, memory: int) -> list[Obj]:
    """JSON patch setting the Ray container to (cpu, memory), keeping limit − request.

    The size is the limit where the container has one (its request moves with it, the
    gap unchanged, so the QoS class stays), else the request.
    """
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise Invalid(f'pod "{pod["metadata"]["name"]}" has no containers')
    res = containers[0].get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    ops: list[Obj] = []
    if not res:
        ops.append({"op": "add", "path": "/spec/containers/0/resources", "value": {}})
    if not requests:
        ops.append({"op": "add", "path": "/spec/containers/0/resources/requests", "value": {}})
    for key, unit, target in (("cpu", CPU, cpu), ("memory", MEMORY, memory)):
        request = quantity_to_units(requests.get(key, 0), unit)
        if key in limits:
            limit = quantity_to_units(limits[key], unit)
            new_request = target - (limit - request)
            if new_request <= 0:
                raise Invalid(
                    f"cannot size {key} to {units_to_quantity(target, unit)}: the container's "
                    f"limit − request gap is {units_to_quantity(limit - request, unit)}"
                )
            ops.append(
                {
                    "op": "replace",
                    "path": f"/spec/containers/0/resources/limits/{key}",
                    "value": units_to_quantity(target, unit),
                }
            )
        else:
            new_request = target
        ops.append(
            {
                "op": "add" if key not in requests else "replace",
                "path": f"/spec/containers/0/resources/requests/{key}",
                "value": units_to_quantity(new_request, unit),
            }
        )
    return ops


class Kube:
    """The Kubernetes calls raysize makes, with typed errors and a timeout on every call."""

    def __init__(self, api: client.ApiClient, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.timeout_s = timeout_s

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Kube:
        if path is None:
            try:
                config.load_incluster_config()
                return cls(client.ApiClient(), timeout_s)
            except config.ConfigException:
                pass
        try:
            api = config.new_client_from_config(config_file=path)
        except Exception as exc:  # the client's errors range from ConfigException to TypeError
            where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
            reason = (str(exc).splitlines()[0] if str(exc) else type(exc).__name__).rstrip(".")
            if not isinstance(exc, (config.ConfigException, OSError)):
                reason = f"not a kubeconfig ({type(exc).__name__}: {reason})"
            raise KubeconfigError(
                f"cannot load the kubeconfig {where}: {reason}. Point RAYSIZE_KUBECONFIG (or "
                "KUBECONFIG) at a valid kubeconfig file; in a pod, raysize uses its "
                "ServiceAccount instead"
            ) from None
        return cls(api, timeout_s)

    def _call(self, kind: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            raise from_api_exception(exc, kind=kind) from exc
        except KubeError:
            raise
        except Exception as exc:  # timeouts, refused connections, TLS: all "unknown"
            raise Unavailable(
                f"cannot reach the Kubernetes API at {self.host}: {short_cause(exc)}"
            ) from exc

    @property
    def host(self) -> str:
        return str(getattr(self.api.configuration, "host", "") or "?")

    def _raw(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        response = self._call(kind, fn, *args, _preload_content=False, **kwargs)
        try:
            doc: Obj = json.loads(response.data)
        finally:
            # back to the pool: without this every call opens a new connection (and, on a
            # real cluster, a new TLS handshake)
            response.release_conn()
        return doc

    # --- reads ----------------------------------------------------------------------
    def get_pod(self, namespace: str, pod: str) -> Obj:
        return self._raw("Pod", self.core.read_namespaced_pod, pod, namespace)

    def list_rayclusters(self, namespace: str) -> list[Obj]:
        """Every RayCluster in a namespace ("" for all namespaces)."""
        if namespace:
            doc = self._call(
                "RayCluster",
                self.custom.list_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayclusters",
            )
        else:
            doc = self._call(
                "RayCluster", self.custom.list_cluster_custom_object, "ray.io", "v1", "rayclusters"
            )
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise Unavailable(f"listing RayClusters in {namespace or 'all namespaces'}: no items")
        return items

    def get_raycluster(self, namespace: str, name: str) -> Obj:
        return self._raw(
            "RayCluster",
            self.custom.get_namespaced_custom_object,
            RAY_GROUP,
            RAY_API,
            namespace,
            RAY_PLURAL,
            name,
        )

    def list_cluster_pods(self, namespace: str, cluster: str) -> tuple[list[Obj], str]:
        doc = self._raw(
            "Pod",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"ray.io/cluster={cluster}",
        )
        items = doc.get("items")
        if not isinstance(items, list):
            raise Unavailable(f"listing pods of {namespace}/{cluster}: no items in the answer")
        return items, str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def read_cluster(self, namespace: str, name: str) -> KubeCluster:
        rc = self.get_raycluster(namespace, name)
        pods, pods_version = self.list_cluster_pods(namespace, name)
        spec = rc.get("spec") or {}
        views = tuple(pod_view(p) for p in pods if not p["metadata"].get("deletionTimestamp"))
        replicas, to_delete = {}, []
        for g in spec.get("workerGroupSpecs") or []:
            replicas[g.get("groupName", "")] = int(g.get("replicas") or 0)
            to_delete += list((g.get("scaleStrategy") or {}).get("workersToDelete") or [])
        resizing = tuple(
            v.name
            for v, p in zip(views, pods, strict=False)
            if v.resize is not None and v.resize.state.in_flight
        )
        return KubeCluster(
            namespace=namespace,
            name=name,
            raycluster=rc,
            groups=read_group_specs(rc),
            pods=views,
            replicas=replicas,
            workers_to_delete=tuple(to_delete),
            resource_version=str(rc["metadata"].get("resourceVersion", "")),
            pods_version=pods_version,
            resizing=resizing,
            gcs_address=gcs_address(rc),
            mark=raycluster_mark(rc),
        )

    def find_pod(self, namespace: str, pod: str) -> Obj | None:
        """The pod, or None when it is gone."""
        try:
            return self.get_pod(namespace, pod)
        except PodGone:
            return None

    def resize_progress(
        self, namespace: str, pod: str, cpu: int, memory: int, generation: int
    ) -> ResizeProgress:
        try:
            return progress_of(self.get_pod(namespace, pod), cpu, memory, generation)
        except PodGone:
            return ResizeProgress(state=ProgressState.POD_GONE)

    # --- writes ---------------------------------------------------------------------
    def patch_resize(self, namespace: str, pod: str, cpu: int, memory: int) -> int:
        """Resize the Ray container to absolute (cpu, memory); returns the pod's generation."""
        current = self.get_pod(namespace, pod)
        doc = self._raw(
            "Pod",
            self.core.patch_namespaced_pod_resize,
            pod,
            namespace,
            resize_patch(current, cpu, memory),
            _content_type=JSON_PATCH,
        )
        return int(doc["metadata"].get("generation", 0))

    def set_ippr_status(self, namespace: str, pod: str, status: IpprStatus) -> Obj:
        """Write ray.io/ippr-status; returns the pod as it is now."""
        body = {"metadata": {"annotations": {IPPR_STATUS_ANNOTATION: status.to_annotation()}}}
        return self._raw(
            "Pod", self.core.patch_namespaced_pod, pod, namespace, body, _content_type=MERGE_PATCH
        )

    def scale(
        self,
        namespace: str,
        cluster: str,
        replicas: dict[str, int],
        workers_to_delete: dict[str, tuple[str, ...]],
        resource_version: str = "",
    ) -> bool:
        """Set groups' replicas and add pods to workersToDelete; False if already so.

        The write is guarded by `resource_version` (the read the decision was made on),
        unless the cluster already says what was asked: a retry after a write that
        succeeded is then a no-op, not a conflict.
        """
        rc = self.get_raycluster(namespace, cluster)
        groups = (rc.get("spec") or {}).get("workerGroupSpecs") or []
        index = {g.get("groupName"): i for i, g in enumerate(groups)}
        unknown = sorted((set(replicas) | set(workers_to_delete)) - set(index))
        if unknown:
            raise Invalid(f"RayCluster {namespace}/{cluster} has no worker group {unknown[0]!r}")
        if any(workers_to_delete.values()):
            # a pod already gone needs no deleting: a retry after the operator acted is a no-op
            pods, _ = self.list_cluster_pods(namespace, cluster)
            alive = {
                p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
            }
            workers_to_delete = {
                g: tuple(n for n in names if n in alive) for g, names in workers_to_delete.items()
            }
        ops: list[Obj] = []
        for name, i in index.items():
            group = groups[i]
            if name in replicas and int(group.get("replicas") or 0) != replicas[name]:
                ops.append(
                    {
                        "op": "add",
                        "path": f"/spec/workerGroupSpecs/{i}/replicas",
                        "value": replicas[name],
                    }
                )
            wanted = workers_to_delete.get(name, ())
            listed = list((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
            merged = listed + [p for p in wanted if p not in listed]
            if merged != listed:
                if "scaleStrategy" not in group:
                    ops.append(
                        {
                            "op": "add",
                            "path": f"/spec/workerGroupSpecs/{i}/scaleStrategy",
                            "value": {},
                        }
                    )
                ops.append(
                    {
                        "op": "add",
                        "path": f"/spec/workerGroupSpecs/{i}/scaleStrategy/workersToDelete",
                        "value": merged,
                    }
                )
        if not ops:
            return False
        current_rv = str(rc["metadata"].get("resourceVersion", ""))
        if resource_version and resource_version != current_rv:
            raise Conflict(
                f"RayCluster {namespace}/{cluster} changed since it was read "
                f"(resourceVersion {resource_version} → {current_rv})"
            )
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": current_rv})
        try:
            self._call(
                "RayCluster",
                self.custom.patch_namespaced_custom_object,
                RAY_GROUP,
                RAY_API,
                namespace,
                RAY_PLURAL,
                cluster,
                ops,
                _content_type=JSON_PATCH,
            )
        except Invalid as exc:
            if "test failed" in exc.message or "rejected our request" in exc.message:
                raise Conflict(f"RayCluster {namespace}/{cluster} changed while scaling") from exc
            raise
        return True

    def record_event(
        self, namespace: str, kind: str, name: str, reason: str, message: str, warning: bool = False
    ) -> Obj:
        if kind == "Pod":
            obj, api_version = self.get_pod(namespace, name), "v1"
        elif kind == "RayCluster":
            obj, api_version = self.get_raycluster(namespace, name), f"{RAY_GROUP}/{RAY_API}"
        else:
            raise Invalid(f"events are recorded on Pods and RayClusters, not {kind}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {
                "kind": kind,
                "namespace": namespace,
                "name": name,
                "apiVersion": api_version,
                "uid": obj["metadata"]["uid"],
                "resourceVersion": obj["metadata"].get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "raysize"},
            "reportingComponent": "raysize",
            "reportingInstance": "raysize",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return self._raw(kind, self.core.create_namespaced_event, namespace, body)


HEARTBEAT_EVERY_S = HEARTBEAT_TIMEOUT.total_seconds() / 3  # well inside the saga's timeout


class K8sActivities:
    """The Temporal face of `Kube`: typed errors become non-retryable where they must."""

    def __init__(self, kube: Kube, pods: PodWatch | None = None) -> None:
        """`pods`: the worker's shared pod watch; without it, waits poll the pod."""
        self.kube = kube
        self.pods = pods

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except KubeError as exc:
            raise exc.to_application_error() from exc

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.apply_resize,
            self.wait_resize,
            self.set_status,
            self.scale_groups,
            self.record_event,
        ]

    @activity.defn(name=Act.APPLY_RESIZE)
    async def apply_resize(self, inp: ApplyResizeInput) -> ApplyResizeResult:
        """PATCH pods/resize (absolute, so a retry repeats nothing), record
        ray.io/ippr-status, then watch the kubelet for up to the window."""
        sent = asyncio.ensure_future(
            asyncio.to_thread(self.kube.patch_resize, inp.namespace, inp.pod, inp.cpu, inp.memory)
        )
        try:
            try:
                generation = await asyncio.shield(sent)
            except asyncio.CancelledError:
                # the request is on its way: let it land (or fail) before this activity
                # ends, so the saga's next patch (a rollback) always comes after it
                while not sent.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(sent)
                raise
        except NoRoom as exc:  # 1.36+ admission: what 1.33-1.35's kubelet says as Infeasible
            return await self._refused_for_room(inp, exc)
        except KubeError as exc:
            raise exc.to_application_error() from exc
        now = await self._run(self.kube.set_ippr_status, inp.namespace, inp.pod, inp.status)
        progress = await self._watch(
            inp.namespace, inp.pod, inp.cpu, inp.memory, generation, inp.poll_interval_s,
            inp.window_s, now,
        )  # fmt: skip
        return ApplyResizeResult(generation=generation, progress=progress)

    async def _refused_for_room(self, inp: ApplyResizeInput, exc: NoRoom) -> ApplyResizeResult:
        """The pod was left as it was: report Infeasible with the server's numbers, so the
        saga asks again at what fits or rolls back, as for the kubelet's Infeasible."""
        pod = await self._run(self.kube.find_pod, inp.namespace, inp.pod)
        if pod is None:
            return ApplyResizeResult(
                generation=0, progress=ResizeProgress(state=ProgressState.POD_GONE)
            )
        generation = int(pod["metadata"].get("generation", 0))
        progress = progress_of(pod, inp.cpu, inp.memory, generation).model_copy(
            update={
                "state": ProgressState.INFEASIBLE,
                "reason": "Infeasible",
                "message": f"refused at admission: {exc.message}",
            }
        )
        return ApplyResizeResult(generation=generation, progress=progress)

    @activity.defn(name=Act.WAIT_RESIZE)
    async def wait_resize(self, inp: WaitResizeInput) -> ResizeProgress:
        """Poll the pod until the resize leaves IN_PROGRESS or the window ends; heartbeats."""
        return await self._watch(
            inp.namespace, inp.pod, inp.cpu, inp.memory, inp.generation, inp.poll_interval_s,
            inp.window_s,
        )  # fmt: skip

    async def _watch(
        self,
        namespace: str,
        pod: str,
        cpu: int,
        memory: int,
        generation: int,
        poll_interval_s: float,
        window_s: float,
        current: Obj | None = None,
    ) -> ResizeProgress:
        started = time.monotonic()
        deadline = started + window_s

        def beat(progress: ResizeProgress) -> None:
            # a heartbeat is a write on the server: none while a resize is quick (the
            # timeout is 15 s; the SDK sends the first one at once, then throttles)
            if time.monotonic() - started >= HEARTBEAT_EVERY_S:
                activity.heartbeat(progress.state.value)

        if self.pods is None:
            while True:
                progress = await self._run(
                    self.kube.resize_progress, namespace, pod, cpu, memory, generation
                )
                left = deadline - time.monotonic()
                if progress.state != ProgressState.IN_PROGRESS or left <= 0:
                    return progress
                beat(progress)
                await asyncio.sleep(min(poll_interval_s, left))
        # subscribe first, then read: no change can fall between the two
        with self.pods.subscribe(namespace, pod) as changes:
            # what the caller just read is as new as a read now (the watch has the rest)
            obj = current or await self._run(self.kube.find_pod, namespace, pod)
            while True:
                if obj is None:
                    return ResizeProgress(state=ProgressState.POD_GONE)
                progress = progress_of(obj, cpu, memory, generation)
                left = deadline - time.monotonic()
                if progress.state != ProgressState.IN_PROGRESS or left <= 0:
                    return progress
                beat(progress)
                # silence longer than the poll interval: read the pod (a watch can be
                # quiet for reasons of its own); every few seconds at most, to heartbeat
                heard = await changes.wait(min(poll_interval_s, HEARTBEAT_EVERY_S, left))
                if heard and changes.latest is not None and not changes.deleted:
                    obj = changes.latest
                else:  # silence, a restarted watch, or a deletion to confirm: read it
                    obj = await self._run(self.kube.find_pod, namespace, pod)

    @activity.defn(name=Act.SET_STATUS)
    async def set_status(self, inp: SetStatusInput) -> None:
        await self._run(self.kube.set_ippr_status, inp.namespace, inp.pod, inp.status)

    @activity.defn(name=Act.SCALE)
    async def scale_groups(self, inp: ScaleInput) -> bool:
        return await self._run(
            self.kube.scale,
            inp.namespace,
            inp.cluster,
            inp.replicas,
            inp.workers_to_delete,
            inp.resource_version,
        )

    @activity.defn(name=Act.EVENT)
    async def record_event(self, inp: EventInput) -> None:
        await self._run(
            self.kube.record_event,
            inp.namespace,
            inp.kind,
            inp.name,
            inp.reason,
            inp.message,
            inp.warning,
        )
