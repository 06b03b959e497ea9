"""Plain stored kinds: what `kubectl apply -k deploy/` creates, kept but never acted on.

ServiceAccounts, ConfigMaps, Secrets, Services, Deployments, PodDisruptionBudgets, RBAC
objects and validating admission policies have no controller in the sandbox (no
Deployment makes pods, no eviction reads a budget, RBAC objects and admission policies
are not enforced; the real world enforces both): the store only keeps them, with the
verbs, resourceVersions, watches and discovery entries every served kind has, and the few
server-side defaults `kubectl` shows or relies on:

- every kind: `generation` (1, +1 when anything but metadata/status changes) on kinds
  with a spec;
- Secret: `stringData` folded into base64 `data`, `type` defaults to `Opaque`;
- Service: `type` defaults to `ClusterIP` and a cluster IP is allocated and kept;
- RoleBinding/ClusterRoleBinding: `roleRef` is required and immutable.

`sandbox.resources` mounts `KINDS` next to its own kinds, so routing, discovery, tables
and OpenAPI pick them up.
"""

from __future__ import annotations

import base64
import itertools
import threading
from typing import Any

from raysize.sandbox.errors import FieldError, invalid, invalid_object, required
from raysize.sandbox.store import ResourceType

Obj = dict[str, Any]

APPS = "apps"
RBAC = "rbac.authorization.k8s.io"
ADMISSION = "admissionregistration.k8s.io"
POLICY = "policy"
GROUP_VERSIONS = {APPS: "v1", RBAC: "v1", ADMISSION: "v1", POLICY: "v1"}

SERVICEACCOUNTS = ResourceType(
    "serviceaccounts", "ServiceAccount", "", "v1", True, "serviceaccount", ("sa",)
)
CONFIGMAPS = ResourceType("configmaps", "ConfigMap", "", "v1", True, "configmap", ("cm",))
SECRETS = ResourceType("secrets", "Secret", "", "v1", True, "secret")
SERVICES = ResourceType(
    "services", "Service", "", "v1", True, "service", ("svc",), ("status",), categories=("all",)
)
DEPLOYMENTS = ResourceType(
    "deployments",
    "Deployment",
    APPS,
    "v1",
    True,
    "deployment",
    ("deploy",),
    ("status",),
    categories=("all",),
)
# no eviction API in the sandbox: the budget is stored, never consulted
PODDISRUPTIONBUDGETS = ResourceType(
    "poddisruptionbudgets",
    "PodDisruptionBudget",
    POLICY,
    "v1",
    True,
    "poddisruptionbudget",
    ("pdb",),
    ("status",),
)
ROLES = ResourceType("roles", "Role", RBAC, "v1", True, "role")
ROLEBINDINGS = ResourceType("rolebindings", "RoleBinding", RBAC, "v1", True, "rolebinding")
CLUSTERROLES = ResourceType("clusterroles", "ClusterRole", RBAC, "v1", False, "clusterrole")
CLUSTERROLEBINDINGS = ResourceType(
    "clusterrolebindings", "ClusterRoleBinding", RBAC, "v1", False, "clusterrolebinding"
)
VALIDATING_ADMISSION_POLICIES = ResourceType(
    "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy",
    ADMISSION,
    "v1",
    False,
    "validatingadmissionpolicy",
)
VALIDATING_ADMISSION_POLICY_BINDINGS = ResourceType(
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    ADMISSION,
    "v1",
    False,
    "validatingadmissionpolicybinding",
)

MUTATING_ADMISSION_POLICIES = ResourceType(
    "mutatingadmissionpolicies",
    "MutatingAdmissionPolicy",
    ADMISSION,
    "v1",
    False,
    "mutatingadmissionpolicy",
)
MUTATING_ADMISSION_POLICY_BINDINGS = ResourceType(
    "mutatingadmissionpolicybindings",
    "MutatingAdmissionPolicyBinding",
    ADMISSION,
    "v1",
    False,
    "mutatingadmissionpolicybinding",
)

KINDS = (
    SERVICEACCOUNTS,
    CONFIGMAPS,
    SECRETS,
    SERVICES,
    DEPLOYMENTS,
    PODDISRUPTIONBUDGETS,
    ROLES,
    ROLEBINDINGS,
    CLUSTERROLES,
    CLUSTERROLEBINDINGS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    MUTATING_ADMISSION_POLICIES,
    MUTATING_ADMISSION_POLICY_BINDINGS,
)
# Plural → API group, for error messages (`deployments.apps "x" not found`).
GROUP_OF = {r.name: r.group for r in KINDS if r.group}

_SPEC_KINDS = (SERVICES, DEPLOYMENTS, PODDISRUPTIONBUDGETS)
_BINDINGS = (ROLEBINDINGS, CLUSTERROLEBINDINGS)

_ip_lock = threading.Lock()
_next_ip = itertools.count(10)  # 10.96.0.10, ... (10.96.0.1 is the apiserver's own)


def _allocate_cluster_ip() -> str:
    with _ip_lock:
        n = next(_next_ip)
    return f"10.96.{n // 256 % 256}.{n % 256}"


def prepare_create(r: ResourceType, obj: Obj) -> None:
    """Defaults and validation of a new object of one of `KINDS` (apiVersion/kind are set)."""
    name = obj["metadata"].get("name", "")
    if r in _SPEC_KINDS:
        obj["metadata"]["generation"] = 1
        obj.pop("status", None)
        if r is SERVICES:
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
                spec["clusterIP"] = _allocate_cluster_ip()
            if spec.get("clusterIP") and spec["clusterIP"] != "None":
                spec["clusterIPs"] = [spec["clusterIP"]]
            obj["status"] = {"loadBalancer": {}}
    elif r is SECRETS:
        _fold_string_data(obj)
    elif r in _BINDINGS:
        _validate_binding(r, name, obj, None)


def prepare_update(r: ResourceType, sub: str, old: Obj, new: Obj) -> None:
    """Keep what the server owns when an object of one of `KINDS` is written."""
    if r in _SPEC_KINDS:
        if sub != "status":
            spec_like = {k: v for k, v in new.items() if k not in ("metadata", "status")}
            old_like = {k: v for k, v in old.items() if k not in ("metadata", "status")}
            generation = old["metadata"].get("generation", 1)
            new["metadata"]["generation"] = generation + (spec_like != old_like)
        if r is SERVICES:
            old_spec, spec = old.get("spec") or {}, new.setdefault("spec", {})
            for key in ("clusterIP", "clusterIPs"):
                if key in old_spec:
                    spec.setdefault(key, old_spec[key])
            spec.setdefault("type", old_spec.get("type", "ClusterIP"))
            if spec.get("clusterIP") != old_spec.get("clusterIP"):
                raise invalid_object(
                    "Service",
                    new["metadata"]["name"],
                    [invalid("spec.clusterIP", spec.get("clusterIP"), "field is immutable")],
                )
    elif r is SECRETS:
        _fold_string_data(new)
    elif r in _BINDINGS:
        _validate_binding(r, new["metadata"]["name"], new, old)


def _fold_string_data(secret: Obj) -> None:
    string_data = secret.pop("stringData", None) or {}
    if string_data:
        data = secret.setdefault("data", {}) or {}
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        secret["data"] = data
    secret.setdefault("type", "Opaque")


def _validate_binding(r: ResourceType, name: str, obj: Obj, old: Obj | None) -> None:
    errs: list[FieldError] = []
    ref = obj.get("roleRef")
    if not isinstance(ref, dict) or not ref.get("kind") or not ref.get("name"):
        errs.append(required("roleRef", ""))
    elif old is not None and ref != old.get("roleRef"):
        errs.append(invalid("roleRef", ref, "cannot change roleRef"))
    if errs:
        raise invalid_object(r.kind, name, errs, RBAC)
