"""Kubernetes API failures as typed exceptions, and as the Temporal errors workflows see.

| exception     | when                                    | retryable |
| ------------- | --------------------------------------- | --------- |
| `PodGone`     | 404 on a pod, or the pod of that name   | no        |
|               | has another UID than the one decided on |           |
|               | (raised by `Kube`, docs/kubernetes-     |           |
|               | resize.md §1 *UID preconditions*)       |           |
| `ClusterGone` | 404 on a RayCluster                     | no        |
| `Conflict`    | 409 (stale resourceVersion)             | yes       |
| `Unauthorized`| 401: the credentials were refused; says | yes       |
|               | which (a pod's token, or a kubeconfig)  |           |
| `Forbidden`   | 403; names the missing RBAC rule        | no        |
| `NoRoom`      | 403 from 1.36+ resize admission: the    | no        |
|               | node's allocatable is too small         |           |
| `Invalid`     | 422 / 400; the server's message is kept | no        |
| `Throttled`   | 429: the server's API Priority and      | yes, not  |
|               | Fairness (or max-in-flight) turned the  | before    |
|               | request away; carries its Retry-After   | Retry-    |
|               | (an `Unavailable`)                      | After     |
| `Unavailable` | 5xx, timeouts, connection errors        | yes       |

A failed or timed-out read raises; it never looks like an empty answer.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from temporalio.exceptions import ApplicationError

from raysize.activities.kube_limits import RETRY_AFTER_CAP_S, retry_after_of
from raysize.workflows.contracts import Err

_FORBIDDEN_RE = re.compile(
    r'cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)" in API group "(?P<group>[^"]*)"'
    r'(?: in the namespace "(?P<namespace>[^"]+)")?'
)


class KubeError(Exception):
    """A Kubernetes API call failed."""

    retryable = True
    error_type = "KubernetesError"

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def to_application_error(self) -> ApplicationError:
        return ApplicationError(
            self.message, type=self.error_type, non_retryable=not self.retryable
        )


class PodGone(KubeError):
    retryable = False
    error_type = Err.POD_GONE


class ClusterGone(KubeError):
    retryable = False
    error_type = Err.CLUSTER_GONE


class NotFound(KubeError):
    retryable = False
    error_type = "NotFound"


class Conflict(KubeError):
    retryable = True
    error_type = "Conflict"


class Superseded(KubeError):
    """A compare-and-set write found the object elsewhere than the decision saw it (a
    pod resize's `from`): nothing was written; decide again on a fresh read. `pod` is the
    object as it was found."""

    retryable = False
    error_type = "Superseded"

    def __init__(self, message: str, pod: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.pod = pod or {}


class Invalid(KubeError):
    retryable = False
    error_type = Err.INVALID


class Unavailable(KubeError):
    retryable = True
    error_type = "KubernetesUnavailable"


class Throttled(Unavailable):
    """429 Too Many Requests: the API server is throttling raysize (API Priority and
    Fairness, or `--max-requests-inflight`). Retryable as any `Unavailable`, but not before
    the server's `Retry-After` (`retry_after`, seconds; None when it gave none): Temporal
    waits that long before the activity's next attempt (`next_retry_delay`, at most
    RETRY_AFTER_CAP_S)."""

    error_type = Err.KUBE_THROTTLED

    def __init__(
        self, message: str = "", *, status: int = 429, retry_after: float | None = None,
        server: str = "",
    ) -> None:  # fmt: skip
        self.retry_after = retry_after
        self.server = server
        when = (
            f"it asks to be called again in {retry_after:g} s (Retry-After)"
            if retry_after is not None
            else "it gave no Retry-After"
        )
        said = f"; it said: {message}" if message else ""
        super().__init__(
            f"the Kubernetes API server{f' at {server}' if server else ''} is throttling "
            "raysize (429 Too Many Requests: its API Priority and Fairness, or its "
            f"max-requests-inflight limit, turned the request away): {when}; raysize holds "
            f"its calls to that server until then{said}",
            status=status,
        )

    @property
    def retry_delay(self) -> timedelta | None:
        """How long Temporal waits before the next attempt: the Retry-After, capped."""
        if self.retry_after is None:
            return None
        return timedelta(seconds=min(self.retry_after, RETRY_AFTER_CAP_S))

    def to_application_error(self) -> ApplicationError:
        return ApplicationError(
            self.message,
            type=self.error_type,
            non_retryable=False,
            next_retry_delay=self.retry_delay,
        )


class Forbidden(KubeError):
    retryable = False
    error_type = Err.FORBIDDEN

    def __init__(self, message: str, *, status: int = 403, rule: dict[str, Any] | None = None):
        self.rule = rule
        if rule is not None:
            message = f"{message} (missing RBAC rule: {format_rule(rule)})"
        super().__init__(message, status=status)


SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class Unauthorized(KubeError):
    """401: the API server does not know who is calling. Retried: the kubelet rewrites a
    pod's token before it expires, and the worker follows the file (activities/k8s.py)."""

    retryable = True
    error_type = "KubernetesUnauthorized"

    def __init__(self, message: str, *, status: int = 401) -> None:
        super().__init__(
            f"the API server refused raysize's credentials (401 {message or 'Unauthorized'}): "
            f"in a pod, its ServiceAccount token ({SA_TOKEN}) is missing or expired, or the "
            "ServiceAccount was deleted (check automountServiceAccountToken and that the "
            "ServiceAccount exists); with RAYSIZE_KUBECONFIG or KUBECONFIG, that file's "
            "credentials expired",
            status=status,
        )


class NoRoom(KubeError):
    """Kubernetes 1.36+ refuses a resize above the node's allocatable at admission
    (`PodResizeValidator`, cause `NodeCapacity`), where 1.33–1.35 accept it and the kubelet
    marks it Infeasible. The same news, earlier: not an RBAC problem."""

    retryable = False
    error_type = "NoRoom"


_NO_ROOM_MARK = "node didn't have enough allocatable resources"


def _causes(doc: Any) -> list[str]:
    details = doc.get("details") if isinstance(doc, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return [str(c.get("reason", "")) for c in causes or [] if isinstance(c, dict)]


def format_rule(rule: dict[str, Any]) -> str:
    text = (
        f"apiGroups: [{json.dumps(rule['apiGroups'][0])}], "
        f"resources: [{json.dumps(rule['resources'][0])}], verbs: [{json.dumps(rule['verbs'][0])}]"
    )
    if rule.get("namespace"):
        text += f" in namespace {json.dumps(rule['namespace'])}"
    return text


def missing_rule(message: str) -> dict[str, Any] | None:
    """The RBAC rule a 403 message says is missing (the authorizer's wording)."""
    m = _FORBIDDEN_RE.search(message)
    if m is None:
        return None
    rule: dict[str, Any] = {
        "apiGroups": [m.group("group")],
        "resources": [m.group("resource")],
        "verbs": [m.group("verb")],
    }
    if m.group("namespace"):
        rule["namespace"] = m.group("namespace")
    return rule


def error_kind(exc: KubeError) -> str:
    """The `kind` label of `raysize_kube_api_errors`: what the server (or its absence)
    said, so a 429 is told from a 5xx and from a server that never answered."""
    if isinstance(exc, Throttled):
        return "throttled"
    if isinstance(exc, Unavailable):
        return "unavailable" if exc.status >= 500 else "unreachable"
    kinds: dict[type[KubeError], str] = {
        PodGone: "not_found",
        ClusterGone: "not_found",
        NotFound: "not_found",
        Conflict: "conflict",
        Invalid: "invalid",
        Forbidden: "forbidden",
        NoRoom: "no_room",
        Unauthorized: "unauthorized",
    }
    return kinds.get(type(exc), "other")


def from_api_exception(exc: Any, *, kind: str = "", server: str = "") -> KubeError:
    """Map a `kubernetes.client.ApiException` (or transport error) to a typed error.
    `server`: the API server's address, for the messages that name it."""
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    message = ""
    doc: Any = None
    if body:
        try:
            doc = json.loads(body)
            message = str(doc.get("message", "")) if isinstance(doc, dict) else ""
        except (TypeError, ValueError):
            message = str(body)[:500].strip()
    message = message or str(getattr(exc, "reason", "") or exc)
    if status == 404:
        if kind == "Pod":
            return PodGone(message, status=status)
        if kind == "RayCluster":
            return ClusterGone(message, status=status)
        return NotFound(message, status=status)
    if status == 409:
        return Conflict(message, status=status)
    if status == 401:
        return Unauthorized(message, status=status)
    if status == 403 and ("NodeCapacity" in _causes(doc) or _NO_ROOM_MARK in message):
        return NoRoom(message, status=status)
    if status == 403:
        return Forbidden(message, rule=missing_rule(message))
    if status in (400, 415, 422):
        return Invalid(message, status=status)
    if status == 429:
        # kube-apiserver's APF answers in plain text with a Retry-After header; other 429s
        # are a Status whose details may carry retryAfterSeconds
        retry_after = retry_after_of(getattr(exc, "headers", None))
        details = doc.get("details") if isinstance(doc, dict) else None
        if retry_after is None and isinstance(details, dict):
            seconds = details.get("retryAfterSeconds")
            if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0:
                retry_after = float(seconds)
        return Throttled(message, status=status, retry_after=retry_after, server=server)
    if status >= 500 or status == 0:
        return Unavailable(message or repr(exc), status=status)
    return KubeError(message, status=status)
