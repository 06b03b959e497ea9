"""Server-side printing (`meta.k8s.io/v1` Table), which `kubectl get` asks for.

A list or get answers one Table; a watch answers one Table per event (one row each), and
only the first carries `columnDefinitions` (null after it, as the real server sends them:
kubectl keeps the first event's columns for the rest). Each row's `object` follows the
request's `includeObject`: the object's metadata (`Metadata`, the default), the whole
object (`Object`) or nothing (`None`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raysize.sandbox.kubetime import translate_since
from raysize.sandbox.store import Obj, ResourceType

Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell
INCLUDE_OBJECT = ("None", "Metadata", "Object")


def age(obj: Obj, key: str = "creationTimestamp") -> str:
    """`translateTimestampSince`: how long ago, `<unknown>` for no time."""
    stamp = (obj.get("metadata") or {}).get(key) if key == "creationTimestamp" else obj.get(key)
    return translate_since(stamp)


def _pod_ready(pod: Obj) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{total}"


def _pod_status(pod: Obj) -> str:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "Terminating"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _restarts(pod: Obj) -> int:
    return sum(
        int(s.get("restartCount") or 0)
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _path(*keys: str, default: Any = "") -> Callable[[Obj], Any]:
    def get(obj: Obj) -> Any:
        node: Any = obj
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    return get


def _node_status(node: Obj) -> str:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return "Ready" if c.get("status") == "True" else "NotReady"
    return "Unknown"


def _event_object(ev: Obj) -> str:
    io = ev.get("involvedObject") or {}
    kind = str(io.get("kind") or "").lower()
    return f"{kind}/{io['name']}" if io.get("name") else kind


# printEvent (pkg/printers/internalversion): an Event written with only `eventTime` (the
# events.k8s.io way) is first seen then; one with a `series` was last seen at its last
# observation, and counts its occurrences there.
def _event_first_seen(ev: Obj) -> str:
    return age(ev, "firstTimestamp") if ev.get("firstTimestamp") else age(ev, "eventTime")


def _event_last_seen(ev: Obj) -> str:
    series = ev.get("series")
    if isinstance(series, dict):
        return age(series, "lastObservedTime")
    return age(ev, "lastTimestamp") if ev.get("lastTimestamp") else _event_first_seen(ev)


def _event_count(ev: Obj) -> int:
    series = ev.get("series")
    if isinstance(series, dict):
        count = series.get("count")
        return count if isinstance(count, int) else 0
    count = ev.get("count")
    return count if isinstance(count, int) and count else 1  # a singleton has no count


def _event_source(ev: Obj) -> str:
    source = ev.get("source") or {}
    component = source.get("component") or ev.get("reportingComponent") or ""
    instance = source.get("host") or ev.get("reportingInstance") or ""
    return f"{component}, {instance}" if instance else str(component)


_NAME: Column = ("Name", "string", 0, lambda o: (o.get("metadata") or {}).get("name", ""))
_AGE: Column = ("Age", "string", 0, age)
COLUMNS: dict[str, list[Column]] = {
    "pods": [
        _NAME,
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, _restarts),
        _AGE,
        ("IP", "string", 1, _path("status", "podIP", default="<none>")),
        ("Node", "string", 1, _path("spec", "nodeName", default="<none>")),
    ],
    "nodes": [
        _NAME,
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, lambda o: "<none>"),
        _AGE,
        ("Version", "string", 0, _path("status", "nodeInfo", "kubeletVersion")),
    ],
    "events": [
        ("Last Seen", "string", 0, _event_last_seen),
        ("Type", "string", 0, _path("type")),
        ("Reason", "string", 0, _path("reason")),
        ("Object", "string", 0, _event_object),
        ("Subobject", "string", 1, _path("involvedObject", "fieldPath")),
        ("Source", "string", 1, _event_source),
        ("Message", "string", 0, lambda o: str(o.get("message") or "").strip()),
        ("First Seen", "string", 1, _event_first_seen),
        ("Count", "string", 1, _event_count),
        ("Name", "string", 1, _NAME[3]),
    ],
    # KubeRay's CRD additionalPrinterColumns.
    "rayclusters": [
        _NAME,
        ("desired workers", "integer", 0, _path("status", "desiredWorkerReplicas", default=None)),
        (
            "available workers",
            "integer",
            0,
            _path("status", "availableWorkerReplicas", default=None),
        ),
        ("cpus", "string", 0, _path("status", "desiredCPU", default=None)),
        ("memory", "string", 0, _path("status", "desiredMemory", default=None)),
        ("gpus", "string", 0, _path("status", "desiredGPU", default=None)),
        ("status", "string", 0, _path("status", "state", default=None)),
        _AGE,
    ],
    "namespaces": [_NAME, ("Status", "string", 0, _path("status", "phase")), _AGE],
}


def partial_metadata(obj: Obj) -> Obj:
    """An object as meta.k8s.io/v1 PartialObjectMetadata: its metadata only."""
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata") or {},
    }


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return partial_metadata(obj)


def table(
    r: ResourceType,
    items: list[Obj],
    rv: str,
    cont: str = "",
    *,
    headers: bool = True,
    include: str = "Metadata",
) -> Obj:
    """The Table of `items`. `headers=False` leaves `columnDefinitions` null (a watch's
    events after its first); `include` is the request's `includeObject`."""
    columns = COLUMNS.get(r.name, [_NAME, _AGE])
    meta: Obj = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    definitions = [
        {
            "name": name,
            "type": kind,
            "format": "name" if name == "Name" else "",
            "description": name,
            "priority": priority,
        }
        for name, kind, priority, _ in columns
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions if headers else None,
        "rows": [
            {
                "cells": [cell(obj) for _, _, _, cell in columns],
                "object": _row_object(obj, include),
            }
            for obj in items
        ],
    }
