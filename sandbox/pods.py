"""The pod registry strategy: defaults, QoS, and the validation of create, update and resize.

Behaviour and messages follow kube-apiserver v1.36 (docs/design/kubernetes-resize.md §1 and §5b,
`pkg/registry/core/pod/strategy.go`, `ValidatePodResize` and the `PodResizeValidator`
admission), checked against the real v1.36 server by the conformance suite.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from raysize.sandbox.errors import (
    ApiError,
    FieldError,
    admission_forbidden,
    forbidden,
    invalid,
    invalid_object,
    required,
)
from raysize.sandbox.quantity import canonical, sum_of
from raysize.workflows.resources import QuantityError, parse_quantity

Obj = dict[str, Any]

QOS_RESOURCES = ("cpu", "memory")
# The Kubernetes minor version whose rules apply: 36 adds resize admission against the
# Node (`PodResizeValidator`), init-container and pod-level resize, and rewords a message.
# The embedded server defaults to 35 (its kubelet then reports Infeasible, as 1.33-1.35
# do); the conformance suite runs it as 36 beside the real v1.36 server.
DEFAULT_MINOR = 35
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
UPDATABLE_FIELDS = ",".join(
    [
        "`spec.containers[*].image`",
        "`spec.initContainers[*].image`",
        "`spec.activeDeadlineSeconds`",
        "`spec.tolerations` (only additions to existing tolerations)",
        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
        "negative)",
    ]
)


def _containers(spec: Obj, field: str = "containers") -> list[Obj]:
    value = spec.get(field) or []
    return [c for c in value if isinstance(c, dict)]


def is_sidecar(container: Obj) -> bool:
    """A sidecar: an init container that restarts (`restartPolicy: Always`)."""
    return container.get("restartPolicy") == "Always"


def qty(value: object) -> Decimal:
    return parse_quantity(value)


# --- quantities -----------------------------------------------------------------------
def canonicalize_resources(pod: Obj) -> None:
    """Decode every resource quantity like the server's Quantity unmarshalling does."""
    spec = pod.get("spec") or {}
    holders = [
        c.get("resources") for f in ("containers", "initContainers") for c in _containers(spec, f)
    ]
    holders.append(spec.get("resources"))
    for resources in holders:
        if not isinstance(resources, dict):
            continue
        for part in ("requests", "limits"):
            amounts = resources.get(part)
            if not isinstance(amounts, dict):
                continue
            for name, value in list(amounts.items()):
                if isinstance(value, str) and value.startswith("-"):
                    continue  # parses in Kubernetes; validation rejects it with a field error
                try:
                    amounts[name] = canonical(value)
                except QuantityError as exc:
                    raise ApiError(
                        400,
                        "BadRequest",
                        'Pod in version "v1" cannot be handled as a Pod: quantities must match '
                        "the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                    ) from exc


# --- defaults (SetDefaults_Pod) -------------------------------------------------------
def _default_container(c: Obj) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = str(c.get("image", ""))
    c.setdefault(
        "imagePullPolicy",
        "Always"
        if image.endswith(":latest") or ":" not in image.split("/")[-1]
        else "IfNotPresent",
    )
    resources = c.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)


def _default_requests(pod: Obj) -> None:
    """Decoding defaults requests to limits, on every write, not only on create."""
    spec = pod.get("spec") or {}
    for c in _containers(spec) + _containers(spec, "initContainers"):
        resources = c.get("resources")
        if isinstance(resources, dict) and resources.get("limits"):
            requests = resources.setdefault("requests", {})
            for name, value in resources["limits"].items():
                requests.setdefault(name, value)


def _default_pod_level_requests(spec: Obj) -> None:
    """A pod-level limit without a pod-level request: the request is the containers'
    aggregate request of that resource if any container asks for it, else the limit."""
    res = spec.get("resources")
    if not isinstance(res, dict) or not isinstance(res.get("limits"), dict):
        return
    requests = res.setdefault("requests", {})
    for name, limit in res["limits"].items():
        if name in requests or name not in QOS_RESOURCES:
            continue
        asked = [
            str(r[name])
            for c in _containers(spec)
            if name in (r := (c.get("resources") or {}).get("requests") or {})
        ]
        requests[name] = sum_of(asked) if asked else limit


def apply_defaults(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    for c in _containers(spec) + _containers(spec, "initContainers"):
        _default_container(c)
    _default_pod_level_requests(spec)


# --- QoS (qos.ComputePodQOS) ----------------------------------------------------------
def compute_qos(pod: Obj) -> str:
    spec = pod.get("spec") or {}
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for c in _containers(spec) + _containers(spec, "initContainers"):
        resources = c.get("resources") or {}
        for name, value in (resources.get("requests") or {}).items():
            if name in QOS_RESOURCES and qty(value) != 0:
                requests[name] = requests.get(name, Decimal(0)) + qty(value)
        found = set()
        for name, value in (resources.get("limits") or {}).items():
            if name in QOS_RESOURCES and qty(value) != 0:
                limits[name] = limits.get(name, Decimal(0)) + qty(value)
                found.add(name)
        if found != set(QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and (
        set(requests) != set(limits) or any(limits[n] != v for n, v in requests.items())
    ):
        guaranteed = False
    return "Guaranteed" if guaranteed else "Burstable"


def pod_qos(pod: Obj) -> str:
    """`qos.GetPodQOS`: the recorded class when there is one."""
    return str((pod.get("status") or {}).get("qosClass") or compute_qos(pod))


# --- create ---------------------------------------------------------------------------
def prepare_create(pod: Obj) -> None:
    canonicalize_resources(pod)
    apply_defaults(pod)
    meta = pod.setdefault("metadata", {})
    meta["generation"] = 1
    pod["status"] = {"phase": "Pending", "qosClass": compute_qos(pod)}
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")


def _validate_resources(resources: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for part, amounts in (("limits", limits), ("requests", requests)):
        for name, value in amounts.items():
            if isinstance(value, str) and value.startswith("-"):
                errs.append(
                    invalid(f"{path}.{part}[{name}]", value, "must be greater than or equal to 0")
                )
    if errs:
        return errs
    for name, value in requests.items():
        if name in limits and qty(value) > qty(limits[name]):
            errs.append(
                invalid(
                    f"{path}.requests",
                    value,
                    f"must be less than or equal to {name} limit of {limits[name]}",
                )
            )
    return errs


def _validate_resize_policy(c: Obj, path: str, restart_never: bool, minor: int) -> list[FieldError]:
    """`validateResizePolicy`: errors sit on the list's path, not on the entry's."""
    errs: list[FieldError] = []
    seen: set[str] = set()
    for j, p in enumerate(c.get("resizePolicy") or []):
        name, policy = p.get("resourceName"), p.get("restartPolicy")
        if name in seen:
            errs.append(FieldError(f"{path}[{j}]", "Duplicate value", "", name, True))
        seen.add(str(name))
        if not name:
            errs.append(required(path, ""))
        elif name not in QOS_RESOURCES:
            errs.append(
                FieldError(
                    path, "Unsupported value", 'supported values: "cpu", "memory"', name, True
                )
            )
        if not policy:
            errs.append(required(path, ""))
        elif policy not in ("NotRequired", "RestartContainer"):
            errs.append(
                FieldError(
                    path,
                    "Unsupported value",
                    'supported values: "NotRequired", "RestartContainer"',
                    policy,
                    True,
                )
            )
        if restart_never and policy != "NotRequired":
            errs.append(
                invalid(
                    path, policy or "", "must be 'NotRequired' when pod `restartPolicy` is 'Never'"
                )
            )
    return errs


def validate_spec(pod: Obj, minor: int = DEFAULT_MINOR) -> list[FieldError]:
    """`validatePodMetadataAndSpec`, for the fields the sandbox checks."""
    spec = pod.get("spec") or {}
    errs: list[FieldError] = []
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if MIRROR_ANNOTATION in annotations and not spec.get("nodeName"):
        errs.append(
            invalid(
                f"metadata.annotations[{MIRROR_ANNOTATION}]",
                annotations[MIRROR_ANNOTATION],
                "must set spec.nodeName if mirror pod annotation is set",
            )
        )
    containers = spec.get("containers")
    if not containers:
        errs.append(required("spec.containers", ""))
    names: set[str] = set()
    restart_never = spec.get("restartPolicy") == "Never"
    for field in ("containers", "initContainers"):
        for i, c in enumerate(_containers(spec, field)):
            path = f"spec.{field}[{i}]"
            name = c.get("name")
            if not name:
                errs.append(required(f"{path}.name", ""))
            elif name in names:
                errs.append(FieldError(f"{path}.name", "Duplicate value", "", name, True))
            else:
                names.add(str(name))
            if not c.get("image"):
                errs.append(required(f"{path}.image", ""))
            errs += _validate_resources(c.get("resources") or {}, f"{path}.resources")
            errs += _validate_resize_policy(c, f"{path}.resizePolicy", restart_never, minor)
    if isinstance(spec.get("resources"), dict):
        errs += _validate_resources(spec["resources"], "spec.resources")
    return errs


def validate_create(pod: Obj, minor: int = DEFAULT_MINOR) -> None:
    errs = validate_spec(pod, minor)
    if errs:
        raise invalid_object("Pod", pod["metadata"].get("name", ""), errs)


# --- update of the pod itself ---------------------------------------------------------
def _spec_diff(old: Any, new: Any, path: str = "spec") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _spec_diff(old.get(key), new.get(key), f"{path}.{key}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out += _spec_diff(a, b, f"{path}[{i}]")
        return out
    if old == new:
        return []
    return [f"  {path}: - {json.dumps(old)} + {json.dumps(new)}"]


def prepare_update(old: Obj, new: Obj) -> None:
    """The main resource cannot change status; spec changes bump the generation."""
    canonicalize_resources(new)
    _default_requests(new)
    new["status"] = old.get("status", {})
    keep_system_metadata(old, new)
    if new.get("spec") != old.get("spec"):
        new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1


def keep_system_metadata(old: Obj, new: Obj) -> None:
    """Fields a client may not set: they stay as the server has them."""
    meta = new.setdefault("metadata", {})
    for key in (
        "uid",
        "creationTimestamp",
        "name",
        "namespace",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)


def validate_update(old: Obj, new: Obj, minor: int = DEFAULT_MINOR) -> None:
    """Only images, activeDeadlineSeconds, tolerations and grace period may change."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    munged = json.loads(json.dumps(new_spec))
    for field in ("containers", "initContainers"):
        old_c, new_c = _containers(old_spec, field), _containers(munged, field)
        if len(old_c) == len(new_c):
            for a, b in zip(old_c, new_c, strict=True):
                b["image"] = a.get("image")
    for field in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        if field in old_spec:
            munged[field] = old_spec[field]
        else:
            munged.pop(field, None)
    old_tol = old_spec.get("tolerations") or []
    new_tol = munged.get("tolerations") or []
    if all(t in new_tol for t in old_tol):
        if old_tol:
            munged["tolerations"] = old_tol
        else:
            munged.pop("tolerations", None)
    errs = validate_spec(new, minor)
    if munged != old_spec:
        diff = "\n".join(_spec_diff(old_spec, munged))
        errs.append(
            forbidden(
                "spec",
                f"pod updates may not change fields other than {UPDATABLE_FIELDS}\n{diff}",
            )
        )
    if errs:
        raise invalid_object("Pod", old["metadata"]["name"], errs)


# --- pods/status ----------------------------------------------------------------------
def prepare_status_update(old: Obj, new: Obj) -> None:
    """`podStatusStrategy.PrepareForUpdate`: spec, deletionTimestamp and ownerReferences
    stay as stored; labels, annotations and finalizers may change here as on the pod."""
    new["spec"] = old.get("spec", {})
    keep_system_metadata(old, new)
    meta = new["metadata"]
    if "ownerReferences" in old["metadata"]:
        meta["ownerReferences"] = old["metadata"]["ownerReferences"]
    else:
        meta.pop("ownerReferences", None)
    status = new.setdefault("status", {})
    old_status = old.get("status") or {}
    for key in ("qosClass", "observedGeneration"):  # backfilled when a writer leaves them out
        if not status.get(key) and old_status.get(key):
            status[key] = old_status[key]


def validate_status_update(old: Obj, new: Obj) -> None:
    old_qos = (old.get("status") or {}).get("qosClass")
    new_qos = (new.get("status") or {}).get("qosClass")
    if new_qos != old_qos:
        raise invalid_object(
            "Pod",
            old["metadata"]["name"],
            [invalid("status.qosClass", new_qos or "", "field is immutable")],
        )


# --- pods/resize ----------------------------------------------------------------------
def prepare_resize(old: Obj, new: Obj) -> None:
    """`dropNonResizeUpdates`: only container resources and resizePolicy come from the request."""
    canonicalize_resources(new)
    _default_requests(new)
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    spec = json.loads(json.dumps(old_spec))
    for field in ("containers", "initContainers"):
        old_c, new_c = _containers(old_spec, field), _containers(new_spec, field)
        if len(old_c) != len(new_c):
            spec[field] = new_spec.get(field)
            continue
        if any(a.get("name") != b.get("name") for a, b in zip(old_c, new_c, strict=True)):
            spec[field] = new_spec.get(field)
            continue
        merged = []
        for a, b in zip(old_c, new_c, strict=True):
            c = json.loads(json.dumps(a))
            for key in ("resources", "resizePolicy"):
                if key in b:
                    c[key] = b[key]
                else:
                    c.pop(key, None)
            merged.append(c)
        if field in spec or merged:
            spec[field] = merged
    new["spec"] = spec
    new["status"] = old.get("status", {})
    rv = (new.get("metadata") or {}).get("resourceVersion")
    new["metadata"] = json.loads(json.dumps(old["metadata"]))
    if rv is not None:
        new["metadata"]["resourceVersion"] = rv
    if new["spec"] != old_spec:
        new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1


def _masked(c: Obj, old: Obj) -> Obj:
    """The container with cpu and memory amounts set to those of `old`."""
    out: Obj = json.loads(json.dumps(c))
    res = out.setdefault("resources", {})
    old_res = old.get("resources") or {}
    for part in ("requests", "limits"):
        amounts = dict(res.get(part) or {})
        for name in QOS_RESOURCES:
            if name in (old_res.get(part) or {}):
                amounts[name] = old_res[part][name]
            else:
                amounts.pop(name, None)
        if amounts:
            res[part] = amounts
        else:
            res.pop(part, None)
    if not res:
        out.pop("resources")
    old_copy: Obj = json.loads(json.dumps(old))
    if not old_copy.get("resources"):
        old_copy.pop("resources", None)
    out["__old"] = old_copy
    return out


def validate_resize(old: Obj, new: Obj, minor: int = DEFAULT_MINOR) -> None:
    name = old["metadata"]["name"]
    errs = validate_spec(new, minor)
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}

    def has_pod_level(spec: Obj) -> bool:
        res = spec.get("resources") or {}
        return bool(res.get("requests") or res.get("limits"))

    if minor < 36 and (has_pod_level(old_spec) or has_pod_level(new_spec)):
        raise invalid_object(
            "Pod", name, [forbidden("[]", "pods with pod-level resources cannot be resized")]
        )
    # 1.36 resizes pods with pod-level resources (InPlacePodLevelResourcesVerticalScaling):
    # the pod-level request must still cover what its containers ask together
    pod_level = (new_spec.get("resources") or {}).get("requests") or {}
    for res_name in QOS_RESOURCES:
        if res_name not in pod_level:
            continue
        asked_text = [
            str(r[res_name])
            for c in _containers(new_spec)
            if res_name in (r := (c.get("resources") or {}).get("requests") or {})
        ]
        if sum((qty(v) for v in asked_text), Decimal(0)) > qty(pod_level[res_name]):
            raise invalid_object(
                "Pod",
                name,
                [
                    invalid(
                        f"spec.resources.requests[{res_name}]",
                        pod_level[res_name],
                        "must be greater than or equal to aggregate container requests of "
                        + sum_of(asked_text),
                    )
                ],
            )

    # The two early checks answer with their one error alone, even if the spec has others.
    if MIRROR_ANNOTATION in (old["metadata"].get("annotations") or {}):
        raise invalid_object("Pod", name, [forbidden("[]", "static pods cannot be resized")])
    if (old_spec.get("os") or {}).get("name") == "windows":
        raise invalid_object("Pod", name, [forbidden("[]", "windows pods cannot be resized")])

    old_qos = pod_qos(old)
    if old_qos != compute_qos(new):
        errs.append(
            invalid("spec", old_qos, "Pod QOS Class may not change as a result of resizing")
        )

    for status in (old.get("status") or {}).get("containerStatuses") or []:
        if "running" in (status.get("state") or {}):
            if status.get("resources") is None:
                errs.append(forbidden("spec", "Pod running on node without support for resize"))
            break

    order_errs: list[FieldError] = []
    for field, noun in (("containers", "containers"), ("initContainers", "initContainers")):
        old_c, new_c = _containers(old_spec, field), _containers(new_spec, field)
        if len(old_c) != len(new_c):
            order_errs.append(
                forbidden(f"spec.{field}", f"{noun} may not be added or removed on resize")
            )
            continue
        for i, (a, b) in enumerate(zip(old_c, new_c, strict=True)):
            if a.get("name") != b.get("name"):
                order_errs.append(
                    forbidden(
                        f"spec.{field}[{i}].name",
                        f"{noun} may not be renamed or reordered on resize",
                    )
                )
    if order_errs:
        raise invalid_object("Pod", name, errs + order_errs)

    for field in ("containers", "initContainers"):
        for i, (a, b) in enumerate(
            zip(_containers(old_spec, field), _containers(new_spec, field), strict=True)
        ):
            if minor < 36 and field == "initContainers" and not is_sidecar(a):
                continue
            path = f"spec.{field}[{i}].resources"
            old_res, new_res = a.get("resources") or {}, b.get("resources") or {}
            for part in ("requests", "limits"):
                if any(k not in (new_res.get(part) or {}) for k in old_res.get(part) or {}):
                    errs.append(forbidden(f"{path}.{part}", f"resource {part} cannot be removed"))

    for field in ("containers", "initContainers"):
        for i, (a, b) in enumerate(
            zip(_containers(old_spec, field), _containers(new_spec, field), strict=True)
        ):
            if minor < 36 and field == "initContainers" and not is_sidecar(a):
                if a != b:
                    errs.append(
                        forbidden("spec", "resources for non-sidecar init containers are immutable")
                    )
                continue
            masked = _masked(b, a)
            old_copy = masked.pop("__old")
            if masked == old_copy:
                continue
            if field == "containers":
                errs.append(forbidden("spec", "only cpu and memory resources are mutable"))
            elif minor < 36:
                errs.append(
                    forbidden(
                        "spec", "only cpu and memory resources for sidecar containers are mutable"
                    )
                )
            else:  # 1.36: init containers (InPlacePodVerticalScalingInitContainers) too
                errs.append(
                    forbidden(
                        f"spec.initContainers[{i}]",
                        "only cpu and memory resources for init or sidecar containers are mutable",
                    )
                )
    if errs:
        raise invalid_object("Pod", name, errs)


# --- resize admission (1.36 `PodResizeValidator`) -----------------------------------------
INIT_RESIZE_FEATURE = "InPlacePodVerticalScalingInitContainers"


def admit_resize(old: Obj, new: Obj, node: Obj | None) -> None:
    """What 1.36 checks against the pod's Node before it stores a resize: the Node exists,
    declares the features the resize needs, and has the allocatable room for the pod's new
    requests (else 403, cause NodeCapacity; 1.33-1.35 leave all this to the kubelet). A
    resize that changes nothing, or of a pod not yet bound, is not checked."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    node_name = old_spec.get("nodeName")
    if not node_name or old_spec == new_spec:
        return
    name = old["metadata"]["name"]
    if node is None:
        raise admission_forbidden("pods", name, f'node "{node_name}" not found')
    declared = (node.get("status") or {}).get("declaredFeatures") or []
    init_changed = any(
        a != b
        for a, b in zip(
            _containers(old_spec, "initContainers"),
            _containers(new_spec, "initContainers"),
            strict=False,
        )
        if not is_sidecar(a)
    )
    if init_changed and INIT_RESIZE_FEATURE not in declared:
        raise admission_forbidden(
            "pods",
            name,
            f"pod update requires features {INIT_RESIZE_FEATURE} which are not available "
            f'on node "{node_name}"',
        )
    from raysize.sandbox.kubelet import requests_of  # the kubelet's own sum (resourcehelper)

    allocatable = (node.get("status") or {}).get("allocatable") or {}
    wanted = requests_of(new)
    short = []
    for res_name, scale in (("cpu", 1000), ("memory", 1)):
        if res_name not in allocatable:
            continue
        room = int(qty(allocatable[res_name]) * scale)
        if wanted[res_name] > room:
            short.append(f"{res_name}, requested: {wanted[res_name]}, allocatable: {room}")
    if short:  # every resource short, cpu first, in one message
        raise admission_forbidden(
            "pods",
            name,
            "node didn't have enough allocatable resources: " + "; ".join(short),
            causes=[{"reason": "NodeCapacity"}],
        )
