"""API errors rendered as the `Status` bodies a real kube-apiserver returns.

Formats follow apimachinery v0.35.0 (`pkg/api/errors`, `pkg/util/validation/field`):
a field error is `<path>: <Type>[: <value>][: <detail>]`, several are rendered as
`[e1, e2]` after de-duplication, and a 422 carries one cause per field error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

_REASON_OF_TYPE = {
    "Forbidden": "FieldValueForbidden",
    "Invalid value": "FieldValueInvalid",
    "Required value": "FieldValueRequired",
    "Unsupported value": "FieldValueNotSupported",
    "Duplicate value": "FieldValueDuplicate",
    "Not found": "FieldValueNotFound",
}


@dataclass(frozen=True)
class FieldError:
    """One validation error on one field path, rendered like `field.Error`."""

    path: str
    type: str  # "Forbidden", "Invalid value", "Required value", ...
    detail: str = ""
    value: Any = None
    has_value: bool = False
    reason: str = ""  # the cause's reason where the type alone does not say it

    def body(self) -> str:
        parts = [self.type]
        if self.has_value:
            parts.append(_render_value(self.value))
        if self.detail:
            parts.append(self.detail)
        return ": ".join(parts)

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}"

    def cause(self) -> dict[str, str]:
        return {
            "reason": self.reason or _REASON_OF_TYPE.get(self.type, "FieldValueInvalid"),
            "message": self.body(),
            "field": self.path,
        }


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, "Forbidden", detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", detail, value, True)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "Required value", detail)


def _render_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # %q of a plain Go string
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def aggregate(errors: list[FieldError]) -> str:
    """`utilerrors.NewAggregate(...).Error()`: one message, or `[a, b]` de-duplicated."""
    seen: list[str] = []
    for e in errors:
        s = str(e)
        if s not in seen:
            seen.append(s)
    if len(seen) == 1:
        return seen[0]
    return "[" + ", ".join(seen) + "]"


@dataclass
class ApiError(Exception):
    """An error the server answers with; `status()` is the JSON body."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # answered as Go's `http.Error` does, not as a Status: plain text, this line
    text: str | None = None

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def answer(self) -> tuple[bytes, dict[str, str]]:
        """The body and the headers (Content-Type included) the server answers with."""
        if self.text is not None:
            plain = {
                "Content-Type": "text/plain; charset=utf-8",
                "X-Content-Type-Options": "nosniff",
            }
            return (self.text + "\n").encode(), {**self.headers, **plain}
        return json.dumps(self.status()).encode(), {
            **self.headers,
            "Content-Type": "application/json",
        }

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(kind: str, name: str, group: str = "") -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if group:
        d["group"] = group
    d["kind"] = kind
    return d


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(resource, group)} "{name}" not found',
        _details(resource, name, group),
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(resource, group)} "{name}" already exists',
        _details(resource, name, group),
    )


def conflict(resource: str, name: str, group: str = "", detail: str = "") -> ApiError:
    detail = detail or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {detail}',
        _details(resource, name, group),
    )


def invalid_object(kind: str, name: str, errors: list[FieldError], group: str = "") -> ApiError:
    """`NewInvalid`: the kind is group-qualified (`RayCluster.ray.io`), an empty name omitted."""
    details = _details(kind, name, group)
    if not name:
        del details["name"]
    details["causes"] = [e.cause() for e in errors]
    return ApiError(
        422,
        "Invalid",
        f'{_qualified(kind, group)} "{name}" is invalid: {aggregate(errors)}',
        details,
    )


def uid_changed(uid: str) -> list[FieldError]:
    """A write whose body names another UID than the stored object's: `metadata.uid` is
    immutable (a UID in a patch is no precondition; in a PUT it is: `uid_precondition`).
    Checked twice, by the metadata checks common to every kind and by the kind's own: the
    cause comes twice, the message once."""
    error = invalid("metadata.uid", uid, "field is immutable")
    return [error, error]


def checked_first(
    err: ApiError, first: list[FieldError], kind: str, name: str, group: str = ""
) -> ApiError:
    """`err` (what the kind's own checks found) with the field errors `first` before it,
    as `rest.BeforeUpdate` checks the metadata common to every kind first. An error that
    is not field errors (a 422 with causes) comes after them: `first` alone is answered."""
    causes = list((err.details or {}).get("causes") or [])
    head, sep, _ = err.message.partition(" is invalid: ")
    if err.code != 422 or not sep or not causes:
        return invalid_object(kind, name, first, group)
    texts = [str(e) for e in first] + [f"{c.get('field')}: {c.get('message')}" for c in causes]
    seen = list(dict.fromkeys(texts))  # de-duplicated, in order, as `aggregate`
    message = seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"
    details = {**(err.details or {}), "causes": [e.cause() for e in first] + causes}
    return ApiError(422, "Invalid", f"{head} is invalid: {message}", details)


def uid_precondition(
    resource: str, namespace: str, name: str, sent: str, stored: str, group: str = ""
) -> ApiError:
    """A PUT whose body names another UID: the storage layer's precondition fails (409, in
    its own words), before the resourceVersion is compared."""
    key = "/".join(p for p in ("/registry", group, resource, namespace, name) if p)
    return conflict(
        resource,
        name,
        group,
        f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, "
        f"AdditionalErrorMsg: Precondition failed: UID in precondition: {sent}, UID in "
        f"object meta: {stored}",
    )


def unprocessable(message: str, *, cause: bool = True) -> ApiError:
    """A patch that cannot be applied (`NewGenericServerResponse(422, ...)`); a failed
    JSON-patch `test` carries no cause on the real server (`cause=False`)."""
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]} if cause else {},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(verb: str, resource: str) -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {"kind": resource} if resource else None,
    )


def unsupported_media_type(accepted: tuple[str, ...]) -> ApiError:
    """`NewUnsupportedMediaTypeError(accepted)`: lists the types this endpoint takes."""
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def go_repr(value: Any) -> str:
    """A decoded JSON value as Go's `%v` prints it (maps with sorted keys, numbers as
    float64), which is how the server quotes a patch it could not apply."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_repr(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_repr(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, int | float):
        return _go_float(float(value))
    return str(value)


def _go_float(x: float) -> str:
    """Go's shortest `%v` of a float64: plain digits for exponents -4..5, else %e form
    with at least two exponent digits (268435456 → 2.68435456e+08)."""
    if x == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    text = "".join(map(str, digits))
    exp10 = len(text) - 1 + int(exponent)
    if -4 <= exp10 < 6:
        return ("-" if sign else "") + format(Decimal(repr(x)).normalize(), "f")
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"


def invalid_patch(patch: Any, detail: str) -> ApiError:
    """A patch whose result does not decode: 422 on field "patch", quoting the patch."""
    error = FieldError("patch", "Invalid value", detail, go_repr(patch), True)
    return ApiError(
        422,
        "Invalid",
        f' "" is invalid: {error}',
        {"causes": [error.cause()]},
    )


def unsupported_media_type_bare() -> ApiError:
    """A content type no patch handler knows (apply-patch+cbor included, with its gate
    off): the server's bare `415: Unsupported Media Type`, with empty details."""
    return ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})


def page_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


# the UIDs of the FlowSchema and PriorityLevelConfiguration the sandbox's APF "matched":
# kube-apiserver names them (not their names) on every answer APF classified
APF_FLOW_SCHEMA_UID = "5e1dbb2a-0000-4000-8000-00000000a9f5"
APF_PRIORITY_LEVEL_UID = "5e1dbb2a-0000-4000-8000-0000000001e1"


def too_many_requests(retry_after_s: int = 1) -> ApiError:
    """What kube-apiserver's API Priority and Fairness answers a request it turns away
    (k8s.io/apiserver, server/filters/priority-and-fairness.go: `tooManyRequests`, after
    `setResponseHeaders`): 429, `Retry-After` in whole seconds (1, growing to 32 while it
    keeps rejecting), the matched flow schema's and priority level's UIDs, and a plain-text
    line from Go's `http.Error`, not a Status."""
    return ApiError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        headers={
            "Retry-After": str(retry_after_s),
            "X-Kubernetes-PF-FlowSchema-UID": APF_FLOW_SCHEMA_UID,
            "X-Kubernetes-PF-PriorityLevel-UID": APF_PRIORITY_LEVEL_UID,
        },
        text="Too many requests, please try again later.",
    )


def internal_error(message: str = "sandbox: injected fault") -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def admission_forbidden(
    resource: str, name: str, reason: str, causes: list[dict[str, str]] | None = None
) -> ApiError:
    """An admission plugin's refusal (`NewForbidden`): `<resource> "<name>" is forbidden:`."""
    details = _details(resource, name)
    if causes:
        details["causes"] = causes
    return ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: {reason}', details)


def forbidden_request(
    verb: str, resource: str, name: str, namespace: str, user: str, group: str = ""
) -> ApiError:
    """RBAC denial, worded like the authorizer: names the verb, resource and group."""
    base = resource.split("/")[0]
    scope = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    subject = f'{_qualified(base, group)} "{name}"' if name else _qualified(base, group)
    return ApiError(
        403,
        "Forbidden",
        f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}"{scope}',
        _details(base, name, group) if name else {"group": group, "kind": base},
    )
