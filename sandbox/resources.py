"""The resource types the sandbox serves, with their discovery documents and strategies."""

from __future__ import annotations

from typing import Any

from raysize.sandbox import generic, pods
from raysize.sandbox.errors import FieldError, invalid, invalid_object, required
from raysize.sandbox.patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from raysize.sandbox.store import ResourceType

Obj = dict[str, Any]

PODS = ResourceType(
    "pods", "Pod", "", "v1", True, "pod", ("po",), ("resize", "status"), categories=("all",)
)
NODES = ResourceType("nodes", "Node", "", "v1", False, "node", ("no",), ("status",))
EVENTS = ResourceType("events", "Event", "", "v1", True, "event", ("ev",))
NAMESPACES = ResourceType(
    "namespaces", "Namespace", "", "v1", False, "namespace", ("ns",), ("status",)
)
RAYCLUSTERS = ResourceType(
    "rayclusters",
    "RayCluster",
    "ray.io",
    "v1",
    True,
    "raycluster",
    (),
    ("status",),
    categories=("all",),
)

ALL = (PODS, NODES, EVENTS, NAMESPACES, RAYCLUSTERS, *generic.KINDS)
BY_GROUP: dict[tuple[str, str], ResourceType] = {(r.group, r.name): r for r in ALL}
GROUP_VERSIONS = {"": "v1", "ray.io": "v1", **generic.GROUP_VERSIONS}
CUSTOM = (RAYCLUSTERS,)  # served from a CRD: no strategic merge patch


def strategic_merge_allowed(r: ResourceType) -> bool:
    return r not in CUSTOM


def patch_types(r: ResourceType) -> tuple[str, ...]:
    """The PATCH content types the endpoint takes, in the server's order (installer.go;
    a CRD's handler has no strategic merge). apply-patch+cbor needs the
    CBORServingAndStorage gate, off by default, so it is refused like any unknown type."""
    if strategic_merge_allowed(r):
        return (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)
    return (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)


def discovery_resource_list(group: str) -> Obj:
    version = GROUP_VERSIONS[group]
    resources: list[Obj] = []
    for r in ALL:
        if r.group != group:
            continue
        entry: Obj = {
            "name": r.name,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": list(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        resources.append(entry)
        for sub in r.subresources:
            verbs = ["get", "patch", "update"]
            resources.append(
                {
                    "name": f"{r.name}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


# --- strategies: what each write may change -------------------------------------------
def prepare_create(r: ResourceType, obj: Obj, minor: int = pods.DEFAULT_MINOR) -> None:
    obj.setdefault("apiVersion", r.api_version)
    obj.setdefault("kind", r.kind)
    if r is PODS:
        pods.prepare_create(obj)
        pods.validate_create(obj, minor)
    elif r is RAYCLUSTERS:
        obj["metadata"]["generation"] = 1
        obj.pop("status", None)
        _validate_raycluster(obj)
    elif r is NODES:
        obj.setdefault("spec", {})  # the real server stores an empty spec, never none
        obj.setdefault("status", {})
    elif r is NAMESPACES:
        name = obj["metadata"].get("name", "")
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        obj["status"] = {"phase": "Active"}
    elif r in generic.KINDS:
        generic.prepare_create(r, obj)
    elif r is EVENTS:
        _validate_event(obj)


def _json_type(value: object) -> str:
    """The JSON type of a decoded value, as the schema validator names it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


def _validate_event(obj: Obj) -> None:
    """`ValidateEventCreate` (core/v1 Events): the involved object's namespace is the
    Event's own; an object without one (a Node) may only have Events in `default`."""
    name = obj["metadata"].get("name", "")
    involved = obj.get("involvedObject")
    if not involved:
        raise invalid_object("Event", name, [required("involvedObject", "")])
    own = obj["metadata"].get("namespace", "")
    theirs = str(involved.get("namespace") or "")
    if (theirs and theirs != own) or (not theirs and own not in ("", "default")):
        raise invalid_object(
            "Event",
            name,
            [invalid("involvedObject.namespace", theirs, "does not match event.namespace")],
        )


def _validate_raycluster(obj: Obj) -> None:
    errs: list[FieldError] = []
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        errs.append(required("spec", ""))
    else:
        if not isinstance(spec.get("headGroupSpec"), dict):
            errs.append(required("spec.headGroupSpec", ""))
        for i, g in enumerate(spec.get("workerGroupSpecs") or []):
            if not g.get("groupName"):
                errs.append(required(f"spec.workerGroupSpecs[{i}].groupName", ""))
            for key in ("replicas", "minReplicas", "maxReplicas"):
                value = g.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    path = f"spec.workerGroupSpecs[{i}].{key}"
                    kind = _json_type(value)
                    errs.append(
                        FieldError(
                            path,
                            "Invalid value",
                            f'{path} in body must be of type integer: "{kind}"',
                            kind,
                            True,
                            reason="FieldValueTypeInvalid",
                        )
                    )
        if errs:  # the CRD's CEL rules are not run on an object of the wrong shape
            errs.append(
                FieldError(
                    "<nil>",
                    "Invalid value",
                    "some validation rules were not checked because the object was invalid; "
                    "correct the existing errors to complete validation",
                    None,
                    True,
                )
            )
    if errs:
        raise invalid_object("RayCluster", obj["metadata"].get("name", ""), errs, "ray.io")


def prepare_update(
    r: ResourceType, sub: str, old: Obj, new: Obj, minor: int = pods.DEFAULT_MINOR
) -> None:
    """Apply the resource's update strategy to `new` (the requested object) in place."""
    new.setdefault("apiVersion", r.api_version)
    new.setdefault("kind", r.kind)
    if r is PODS:
        if sub == "resize":
            pods.prepare_resize(old, new)
            pods.validate_resize(old, new, minor)
        elif sub == "status":
            pods.prepare_status_update(old, new)
            pods.validate_status_update(old, new)
        else:
            pods.prepare_update(old, new)
            pods.validate_update(old, new, minor)
        return
    pods.keep_system_metadata(old, new)
    if r.subresources and "status" in r.subresources:
        if sub == "status":
            new["spec"] = old.get("spec")
            rv = new["metadata"].get("resourceVersion")
            new["metadata"] = dict(old["metadata"])
            if rv is not None:
                new["metadata"]["resourceVersion"] = rv
            if new["spec"] is None:
                new.pop("spec")
        else:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
    if r in generic.KINDS:
        generic.prepare_update(r, sub, old, new)
    if r is RAYCLUSTERS:
        if sub != "status":
            _validate_raycluster(new)
        spec_like = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        old_like = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        if spec_like != old_like:
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
