"""Kubernetes objects as raysize reads and writes them, pure translation on plain dicts:
a pod's view for the planner (`pod_view`), where the kubelet stands on a resize
(`resize_state`, `progress_of`), whether a pod is the one a decision was made on
(`is_same_pod`, `check_same_pod`), the resize patch (`resize_patch`), a RayCluster's GCS
address (`gcs_address`), and `KubeCluster`, one consistent read of a RayCluster and its
pods. The calls are `activities/k8s.py`'s; the activities `activities/k8s_activities.py`.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from raysize.activities.k8s_errors import (
    Invalid,
    PodGone,
)
from raysize.workflows.contracts import (
    ProgressState,
    ResizeProgress,
)
from raysize.workflows.ippr_status import IPPR_STATUS_ANNOTATION, IpprStatus
from raysize.workflows.model import (
    ClusterSnapshot,
    KubeletResizeState,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
)
from raysize.workflows.raycluster_spec import GroupSpecs, read_planner_settings
from raysize.workflows.resources import CPU, MEMORY, Resources, quantity_to_units, units_to_quantity
from raysize.workflows.values import Value

RAY_GROUP, RAY_API, RAY_PLURAL = "ray.io", "v1", "rayclusters"
PENDING, IN_PROGRESS = "PodResizePending", "PodResizeInProgress"
Obj = dict[str, Any]


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
        quantities = (
            req.get("cpu", 0),
            lim.get("cpu", 0),
            req.get("memory", 0),
            lim.get("memory", 0),
        )
        try:
            return _container_size(*quantities)
        except TypeError:  # a quantity that cannot be a key (a list): the error says which
            return _container_size.__wrapped__(*quantities)

    @property
    def cpu(self) -> int:
        """Ray's reading: the limit when set, else the request."""
        return self.cpu_limit or self.cpu_request

    @property
    def memory(self) -> int:
        return self.memory_limit or self.memory_request


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
    generation: int = 0  # the RayCluster's metadata.generation: what its spec is at
    # names in workersToDelete whose pod no longer exists: KubeRay would delete a later pod
    # of the same name at birth, so the next write leaves them out
    stale_to_delete: tuple[str, ...] = ()
    resizing: tuple[str, ...]
    gcs_address: str
    mark: str = ""  # raycluster_mark: what the cluster-change watch compares
    pods_cached: bool = False  # the pods came from the pod watch's cache, not a LIST
    ray_autoscaler_pod: str = ""  # ray_autoscaler_running: its head pod, or ""

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


# the container KubeRay adds to the head pod for Ray's autoscaler (BuildAutoscalerContainer)
RAY_AUTOSCALER_CONTAINER = "autoscaler"
GROUP_LABEL = "ray.io/group"  # the worker group KubeRay made a pod for


def ray_autoscaler_running(pods: Iterable[Obj]) -> str:
    """The head pod whose `autoscaler` container (Ray's own autoscaler) is running, or ""."""
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if labels.get("ray.io/node-type") != "head" or pod["metadata"].get("deletionTimestamp"):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") == RAY_AUTOSCALER_CONTAINER and "running" in (cs.get("state") or {}):
                return str(pod["metadata"]["name"])
    return ""


# What of a pod `KubeCluster` (`Kube.read_cluster`: `pod_view`, `ray_autoscaler_running`,
# `pods_mark`, the stale and resizing names) reads, and nothing else: the pod watch keeps
# this record of each Ray pod (`compact_pod`), so a cached observe holds kilobytes of a
# pod's JSON as a few hundred bytes. A field `KubeCluster` starts reading must be added here
# (tests/activities/test_pod_view.py checks that a record reads as its pod does).
KEPT_CONDITIONS = (PENDING, IN_PROGRESS)


def _s(value: Any) -> Any:
    """A string interned (the same label keys and values, quantities, phases and
    condition words recur in every pod: one copy each); anything else as it is."""
    return sys.intern(value) if isinstance(value, str) else value


# Parts of records that are the same in many pods (a group's labels, its container's
# spec and status resources) are kept once and shared: records are never changed, so a
# shared part is never changed either. Bounded: past SHARED_MAX parts it starts over.
# Every SHARED_SWEEP new parts, the parts no record holds any more (a deleted cluster's
# labels, a size no pod has now) are dropped.
SHARED_MAX = 10_000
SHARED_SWEEP = 1_000
_shared: dict[str, Any] = {}
_shared_lock = threading.Lock()
_shared_added = 0
# references to a part held by no record: `_shared`'s, and getrefcount's argument
_UNHELD = 2


def _share(part: Any) -> Any:
    """`part` (plain JSON: dicts, lists, strings), or an equal one already kept."""
    global _shared_added
    key = json.dumps(part, sort_keys=True, separators=(",", ":"))
    with _shared_lock:
        found = _shared.get(key)
        if found is None:
            _shared_added += 1
            if _shared_added % SHARED_SWEEP == 0:
                for k in [k for k in _shared if sys.getrefcount(_shared[k]) <= _UNHELD]:
                    del _shared[k]
            if len(_shared) >= SHARED_MAX:
                _shared.clear()
            _shared[key] = found = part
    return found


def compact_pod(pod: Obj) -> Obj:
    """The pod as `KubeCluster` reads it, in the pod's own shape: metadata (name, uid,
    resourceVersion, labels, the `ray.io/ippr-status` annotation, deletionTimestamp), the
    Ray container's name and resources (the first container), status.phase, startTime,
    the resize conditions (type, status, reason), and of the container statuses the Ray
    container's resources and the `autoscaler` container's state (which states, not
    their details), and the node it is bound to. Everything else (managedFields, env,
    volumes, probes, other containers, podIP, restart counts, …) is left out. The record
    is never changed after it is made: a change of the pod is a new record. Not for
    `progress_of` (a resize's progress reads the whole pod: observedGeneration, messages,
    the other containers), which the saga reads from the pod itself or the watch's event."""
    meta = pod.get("metadata") or {}
    kept_meta: Obj = {
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    labels = meta.get("labels")
    if labels:
        kept_meta["labels"] = _share({_s(k): _s(v) for k, v in labels.items()})
    ippr = (meta.get("annotations") or {}).get(IPPR_STATUS_ANNOTATION)
    if ippr is not None:
        kept_meta["annotations"] = {IPPR_STATUS_ANNOTATION: ippr}
    if meta.get("deletionTimestamp"):
        kept_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    out: Obj = {"metadata": kept_meta}
    containers = (pod.get("spec") or {}).get("containers") or []
    first = containers[0] if containers else None
    kept_spec: Obj = {}
    if first is not None:
        kept_spec["containers"] = [{"name": _s(first.get("name")), **_resources(first)}]
    node = (pod.get("spec") or {}).get("nodeName")
    if node:  # the node's room limits its grows (activities/node_room.py)
        kept_spec["nodeName"] = _s(node)
    if kept_spec:
        out["spec"] = _share(kept_spec)
    status = pod.get("status") or {}
    kept_status: Obj = {}
    for key in ("phase", "startTime"):
        if status.get(key) is not None:
            kept_status[key] = _s(status[key])
    conditions = [
        {k: _s(c[k]) for k in ("type", "status", "reason") if k in c}
        for c in status.get("conditions") or []
        if c.get("type") in KEPT_CONDITIONS
    ]
    if conditions:
        kept_status["conditions"] = _share(conditions)
    statuses = []
    for cs in status.get("containerStatuses") or []:
        name = cs.get("name")
        if first is not None and name == first.get("name"):
            statuses.append(_share({"name": _s(name), **_resources(cs)}))
        elif name == RAY_AUTOSCALER_CONTAINER:
            statuses.append(
                _share({"name": _s(name), "state": {_s(k): {} for k in cs.get("state") or {}}})
            )
    if statuses:
        kept_status["containerStatuses"] = _share(statuses)
    if kept_status:
        out["status"] = kept_status
    return out


def _resources(container: Obj) -> Obj:
    """{"resources": …} of a container (spec or status), interned; {} when it has none."""
    res = container.get("resources")
    if res is None:
        return {}
    return {
        "resources": {
            _s(kind): {_s(k): _s(v) for k, v in (values or {}).items()}
            for kind, values in res.items()
            if kind in ("requests", "limits")
        }
    }


def _condition(pod: Obj, ctype: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return dict(c)
    return None


@functools.lru_cache(maxsize=1024)
def _container_size(
    cpu_request: object, cpu_limit: object, memory_request: object, memory_limit: object
) -> ContainerSize:
    """Of the few sizes a cluster's pods have, each parsed once: an observe reads every
    pod (5,000 pods' quantities took 0.2 s of each tick)."""
    return ContainerSize(
        cpu_request=quantity_to_units(cpu_request, CPU),
        cpu_limit=quantity_to_units(cpu_limit, CPU),
        memory_request=quantity_to_units(memory_request, MEMORY),
        memory_limit=quantity_to_units(memory_limit, MEMORY),
    )


# `ray.io/ippr-status` as read, by its text: the same pod's annotation is read each tick
# parsed annotations: the pod views keep what a pod with no resize in flight needs, so
# this serves the few pods with one in flight (each version's annotation is new text)
_ippr_status = functools.lru_cache(maxsize=1024)(IpprStatus.from_annotation)


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


# PodViews of pods with no resize in flight, by uid: of its newest version read (its
# resourceVersion), with the instants its ages count from (start, last failure): a version
# of a pod reads the same every tick but for those ages (with a resize in flight, its age
# too: not kept). A pod the pod watch sees deleted is dropped (`forget_pod`), so a deleted
# cluster leaves none; VIEWS_KEPT bounds the rest
_views: OrderedDict[str, tuple[str, PodView, float | None, float | None]] = OrderedDict()
_VIEWS_KEPT = 16384
_views_lock = threading.Lock()


def pod_view(pod: Obj, now: float | None = None) -> PodView:
    """What the planner sees of a pod (or of its record, `compact_pod`). An observe reads
    every pod each tick: a pod seen before in the same version is not read again, only
    its ages are brought to `now` (at 5,000 pods the views took 0.3 s of each tick)."""
    meta = pod["metadata"]
    at = time.time() if now is None else now
    uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    if uid and version:
        with _views_lock:
            kept = _views.get(uid)
            if kept is not None and kept[0] == version:
                _views.move_to_end(uid)
            else:
                kept = None
        if kept is not None:
            _, view, started, failed = kept
            return view.model_copy(
                update={
                    "running_s": max(0.0, at - started) if started is not None else 0.0,
                    "failed_age_s": max(0.0, at - failed) if failed is not None else 0.0,
                }
            )
    view = _pod_view(pod, at)
    if uid and version and view.resize is None:
        started = _started_at(pod) if view.phase == PodPhase.RUNNING else None
        failed = _ippr_status(
            (meta.get("annotations") or {}).get(IPPR_STATUS_ANNOTATION)
        ).last_failed_at
        with _views_lock:
            _views[uid] = (version, view, started, failed)
            _views.move_to_end(uid)
            if len(_views) > _VIEWS_KEPT:
                _views.popitem(last=False)
    return view


def forget_pod(uid: str) -> None:
    """A pod is gone: its view is dropped (the pod watch, on the pod's deletion)."""
    if uid:
        with _views_lock:
            _views.pop(uid, None)


def _pod_view(pod: Obj, now: float) -> PodView:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    status = _ippr_status((meta.get("annotations") or {}).get(IPPR_STATUS_ANNOTATION))
    spec, actual = _container_sizes(pod)
    current = actual or spec
    state = resize_state(pod)
    resize = None
    if state is None and (spec.cpu, spec.memory) != (current.cpu, current.memory):
        state = KubeletResizeState.IN_PROGRESS  # asked, and the kubelet has not reported yet
    if state is not None:
        asked = max(0.0, now - status.resizing_at) if status.resizing_at is not None else None
        resize = PodResize(cpu=spec.cpu, memory=spec.memory, state=state, asked_s=asked)
    running = (pod.get("status") or {}).get("phase") == "Running" and not meta.get(
        "deletionTimestamp"
    )
    return PodView(
        name=meta["name"],
        uid=str(meta.get("uid") or ""),
        group=labels.get(GROUP_LABEL, ""),
        phase=PodPhase.RUNNING if running else PodPhase.PENDING,
        raylet_id=status.raylet_id,
        total=Resources.of(cpu=current.cpu, memory=current.memory),
        labels=dict(labels),
        resize=resize,
        suggested_max_cpu=status.suggested_max_cpu,
        suggested_max_memory=status.suggested_max_memory,
        failed=status.last_failed_at is not None,
        failed_age_s=max(0.0, now - status.last_failed_at)
        if status.last_failed_at is not None
        else 0.0,
        running_s=_running_s(pod, now) if running else 0.0,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        resized=IPPR_STATUS_ANNOTATION in (meta.get("annotations") or {}),
    )


def _started_at(pod: Obj) -> float | None:
    """The pod's status.startTime as an instant (None when it has none, or unreadable)."""
    started = (pod.get("status") or {}).get("startTime")
    if not isinstance(started, str):
        return None
    try:
        return datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _running_s(pod: Obj, now: float) -> float:
    """Seconds since the pod's status.startTime (0 when it has none)."""
    at = _started_at(pod)
    return 0.0 if at is None else max(0.0, now - at)


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


def default_gcs_address(namespace: str, name: str) -> str:
    """Where a RayCluster's GCS is when its status does not say: KubeRay's head Service."""
    return f"{name}-head-svc.{namespace}.svc:6379"


def running_size(pod: Obj) -> tuple[int, int]:
    """(cpu, memory) the Ray container runs with as Ray reads a size (the limit where it
    has one): the kubelet's report (status.resources), else the spec. What a resize's
    `from` was read as (`PodView.total`)."""
    spec, actual = _container_sizes(pod)
    current = actual or spec
    return current.cpu, current.memory


def ray_container_resources(pod: Obj) -> Obj:
    """The spec's resources of the Ray container (the one a resize patches), as read."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return dict(containers[0].get("resources") or {})


def is_same_pod(pod: Obj, uid: str) -> bool:
    """The pod is the one with `uid` ("" : any pod of its name)."""
    return not uid or (pod.get("metadata") or {}).get("uid") == uid


def check_same_pod(found: Obj | None, namespace: str, pod: str, uid: str) -> None:
    """PodGone unless `found` (the pod now, None when deleted) is the pod with `uid`."""
    if found is None:
        raise PodGone(f'pods "{pod}" not found', status=404)
    if not is_same_pod(found, uid):
        now = found["metadata"].get("uid")
        raise PodGone(
            f"pod {namespace}/{pod} with UID {uid} is gone: the pod of that name now is "
            f"another one (UID {now})"
        )


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


# --- launching at size -------------------------------------------------------------------
# The ConfigMap (one per namespace) the `raysize-launch-size` MutatingAdmissionPolicy
# (deploy/worker/launch-size-policy.yaml) reads when KubeRay creates a worker pod: keys
# `<cluster>.<group>.<requests|limits>.<cpu|memory>`, each the quantity the pod's Ray
# container starts with. No key for a group: its pods start as its template says.
LAUNCH_SIZES_CONFIGMAP = "raysize-launch-sizes"
_LAUNCH_FIELDS = tuple(
    f"{kind}.{key}" for kind in ("requests", "limits") for key in ("cpu", "memory")
)


def launch_size_entries(
    cluster: str, group: str, template: Obj, size: tuple[int, int] | None
) -> dict[str, str | None]:
    """The ConfigMap keys that make a new pod of `group` start at `size` (millicores,
    bytes), computed from the group's pod `template` as a resize of it would be
    (`resize_patch`: the size is the limit where there is one, limit − request kept);
    None values remove a key (`size` None: the template's size again)."""
    prefix = f"{cluster}.{group}."
    out: dict[str, str | None] = {prefix + f: None for f in _LAUNCH_FIELDS}
    if size is None:
        return out
    pod = {
        "metadata": {"name": f"{cluster}-{group} (template)"},
        "spec": template.get("spec") or {},
    }
    for op in resize_patch(pod, *size):
        path = str(op["path"])
        if isinstance(op.get("value"), str) and path.startswith("/spec/containers/0/resources/"):
            kind, key = path.rsplit("/", 2)[-2:]
            out[f"{prefix}{kind}.{key}"] = op["value"]
    return out
