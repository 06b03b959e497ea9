"""Kubernetes RBAC over the sandbox's stored Roles and bindings, for one user.

Off by default (the sandbox answers every request as `system:admin`). Turned on with

    sb.api.authorizer = Authorizer(sb.store, service_account_user("raysize", "raysize"))

every request from a client is then allowed only when a rule of a (Cluster)Role bound to
that user (or to one of its groups) allows it, with RBAC's semantics: a rule matches when
its apiGroups, resources (`pods/resize` for a subresource) and verbs each hold the
request's or `*`, and resourceNames is empty or holds the object's name; a
ClusterRoleBinding grants everywhere, a RoleBinding only in its namespace. Requests of the
sandbox's own controllers (`Api.internal`) are not checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raysize.sandbox.store import Store

Obj = dict[str, Any]


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass(frozen=True)
class Request:
    verb: str
    group: str
    resource: str  # "pods" or "pods/resize"
    namespace: str
    name: str


def _groups_of(user: str) -> set[str]:
    groups = {"system:authenticated"}
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        groups |= {"system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"}
    return groups


def _matches(values: Iterable[str] | None, wanted: str) -> bool:
    values = list(values or [])
    return "*" in values or wanted in values


def rule_allows(rule: Obj, req: Request) -> bool:
    if rule.get("nonResourceURLs"):
        return False
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("apiGroups"), req.group)
        and _matches(rule.get("resources"), req.resource)
        and _matches(rule.get("verbs"), req.verb)
        and (not names or req.name in names)
    )


class Authorizer:
    def __init__(self, store: Store, user: str) -> None:
        self.store = store
        self.user = user
        self.groups = _groups_of(user)

    def _subject_is_me(self, subject: Obj, binding_namespace: str) -> bool:
        kind = subject.get("kind")
        if kind == "ServiceAccount":
            ns = subject.get("namespace") or binding_namespace
            return service_account_user(ns, str(subject.get("name", ""))) == self.user
        if kind == "User":
            return subject.get("name") == self.user
        if kind == "Group":
            return subject.get("name") in self.groups
        return False

    def _rules(self, ref: Obj, binding_namespace: str) -> list[Obj]:
        kind, name = ref.get("kind"), str(ref.get("name", ""))
        if kind == "ClusterRole":
            role = self.store.find("clusterroles", "", name)
        elif kind == "Role" and binding_namespace:
            role = self.store.find("roles", binding_namespace, name)
        else:
            role = None
        return list((role or {}).get("rules") or [])

    def rules_for(self, namespace: str) -> list[Obj]:
        """Every rule that applies to this user in `namespace` ("" for cluster scope)."""
        rules: list[Obj] = []
        bindings, _ = self.store.list("clusterrolebindings")
        for b in bindings:
            if any(self._subject_is_me(s, "") for s in b.get("subjects") or []):
                rules += self._rules(b.get("roleRef") or {}, "")
        if namespace:
            bindings, _ = self.store.list("rolebindings", namespace)
            for b in bindings:
                if any(self._subject_is_me(s, namespace) for s in b.get("subjects") or []):
                    rules += self._rules(b.get("roleRef") or {}, namespace)
        return rules

    def allows(self, req: Request) -> bool:
        return any(rule_allows(rule, req) for rule in self.rules_for(req.namespace))
