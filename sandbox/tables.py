"""Server-side printing (`meta.k8s.io/v1` Table), which `kubectl get` asks for."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

from sandbox.store import Obj, ResourceType

Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell


def age(obj: Obj, key: str = "creationTimestamp") -> str:
    stamp = obj.get("metadata", {}).get(key) if key == "creationTimestamp" else obj.get(key)
    if not stamp:
        return "<unknown>"
    seconds = max(0, int(time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


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
    return f"{str(io.get('kind', '')).lower()}/{io.get('name', '')}"


_NAME: Column = ("Name", "string", 0, lambda o: o["metadata"]["name"])
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
        ("Last Seen", "string", 0, lambda o: age(o, "lastTimestamp")),
        ("Type", "string", 0, _path("type")),
        ("Reason", "string", 0, _path("reason")),
        ("Object", "string", 0, _event_object),
        ("Message", "string", 0, _path("message")),
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


def table(r: ResourceType, items: list[Obj], rv: str, cont: str = "") -> Obj:
    columns = COLUMNS.get(r.name, [_NAME, _AGE])
    meta: Obj = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": name,
                "priority": priority,
            }
            for name, kind, priority, _ in columns
        ],
        "rows": [
            {
                "cells": [cell(obj) for _, _, _, cell in columns],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                },
            }
            for obj in items
        ],
    }
