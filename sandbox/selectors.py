"""Label and field selectors, parsed and matched like apimachinery's `labels` and `fields`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raysize.sandbox.errors import bad_request

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text:
        return []
    out = []
    for term in _split_terms(text):
        m = _EQ_RE.match(term)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            out.append(Requirement(m.group(1), op, (m.group(3),)))
            continue
        m = _SET_RE.match(term)
        if m and not (m.group(1) and m.group(3)):
            if m.group(3):
                values = tuple(v.strip() for v in m.group(4).split(",") if v.strip())
                out.append(Requirement(m.group(2), m.group(3), values))
            else:
                out.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
            continue
        raise bad_request(f"unable to parse requirement: {term.strip()!r}")
    return out


def labels_match(requirements: list[Requirement], obj: dict[str, Any]) -> bool:
    if not requirements:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(r.matches(labels) for r in requirements)


# Field selectors: the fields each resource supports, as the real server registers them.
def _path(*keys: str) -> Callable[[dict[str, Any]], str]:
    def get(obj: dict[str, Any]) -> str:
        node: Any = obj
        for k in keys:
            if not isinstance(node, dict):
                return ""
            node = node.get(k)
        return "" if node is None else str(node)

    return get


_COMMON = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}
FIELDS: dict[str, dict[str, Callable[[dict[str, Any]], str]]] = {
    "pods": {
        **_COMMON,
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "events": {
        **_COMMON,
        "involvedObject.kind": _path("involvedObject", "kind"),
        "involvedObject.namespace": _path("involvedObject", "namespace"),
        "involvedObject.name": _path("involvedObject", "name"),
        "involvedObject.uid": _path("involvedObject", "uid"),
        "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
        "involvedObject.resourceVersion": _path("involvedObject", "resourceVersion"),
        "involvedObject.fieldPath": _path("involvedObject", "fieldPath"),
        "reason": _path("reason"),
        "reportingComponent": _path("reportingComponent"),
        "source": _path("source", "component"),
        "type": _path("type"),
    },
    "nodes": {**_COMMON, "spec.unschedulable": _path("spec", "unschedulable")},
    "rayclusters": dict(_COMMON),
    "namespaces": {**_COMMON, "status.phase": _path("status", "phase")},
}


@dataclass(frozen=True)
class FieldRequirement:
    get: Callable[[dict[str, Any]], str]
    equal: bool
    value: str


def parse_field_selector(text: str | None, resource: str) -> list[FieldRequirement]:
    if not text:
        return []
    supported = FIELDS.get(resource, _COMMON)
    out = []
    for term in _split_terms(text):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key = m.group(1)
        if key not in supported:
            raise bad_request(f"field label not supported: {key}")
        out.append(FieldRequirement(supported[key], m.group(2) != "!=", m.group(3)))
    return out


def fields_match(requirements: list[FieldRequirement], obj: dict[str, Any]) -> bool:
    return all((r.get(obj) == r.value) == r.equal for r in requirements)
