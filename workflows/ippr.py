"""The `ray.io/ippr` RayCluster annotation and the `ray.io/ippr-status` pod annotation.

Accepts exactly Ray's format (Ray 2.60, `IPPRSpecsSchema`):

    {"groups": {"<group>": {"max-cpu": "4" | 4, "max-memory": "8Gi" | 8589934592,
                            "resize-timeout": 60}}}

with the head group named `headgroup`, and applies Ray's pod-template rules. It also
rejects what Ray lets through and fails on later: invalid JSON, wrong types, unknown
groups, a maximum below the template size, a non-positive timeout. Every problem is
reported at once, each naming the group, the field and the fix.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Any

from raysize.workflows.model import (
    HEAD_GROUP,
    GroupSpec,
    IpprLimits,
    PlannerSettings,
    UpscalingMode,
)
from raysize.workflows.resources import (
    CPU,
    MEMORY,
    QuantityError,
    Resources,
    float_to_units,
    quantity_to_units,
    ray_accepted,
    units_to_float,
)
from raysize.workflows.values import Value

IPPR_ANNOTATION = "ray.io/ippr"
IPPR_STATUS_ANNOTATION = "ray.io/ippr-status"
NOT_REQUIRED = "NotRequired"
GPU_KEYS = ("nvidia.com/gpu", "amd.com/gpu")


class ConfigError(Value):
    """One problem in a RayCluster's IPPR configuration."""

    group: str | None
    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        where = f"group {self.group!r}, " if self.group else ""
        return f"{where}{self.field}: {self.problem}; {self.fix}"


class GroupSpecs(Value):
    """The groups of a RayCluster as the planner sees them, or why they can't be used."""

    groups: dict[str, GroupSpec]
    errors: tuple[ConfigError, ...] = ()
    ippr_enabled: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors


def _template_container(group: Mapping[str, Any]) -> Mapping[str, Any] | None:
    try:
        containers = group["template"]["spec"]["containers"]
    except (KeyError, TypeError):
        return None
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], dict):
        return None
    return containers[0]


def _size_of(resources: Mapping[str, Any], key: str, name: str, what: str) -> int | None:
    """Ray's rule: a container's size is its limit when set, else its request."""
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    value = limits.get(key) or requests.get(key)
    if value is None:
        return None
    return quantity_to_units(value, name, what=what)


def _parse_start_param_resources(raw: object) -> dict[str, float]:
    """rayStartParams.resources is a JSON object string, often wrapped in quotes."""
    text = str(raw).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].replace('\\"', '"')
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise ValueError("not an object")
    return {str(k): float(v) for k, v in parsed.items()}


def _parse_labels(raw: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in str(raw).split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _problem(exc: QuantityError, field: str) -> str:
    """The message of a conversion error without its `field: ` prefix (ConfigError adds it)."""
    return str(exc).removeprefix(f"{field}: ")


def _template_quantity(
    value: object, rname: str, group: str, field: str, fix: str, errors: list[ConfigError]
) -> int | None:
    """A template quantity in exact units, or None with the error recorded."""
    try:
        return quantity_to_units(value, rname, what=field)
    except QuantityError as exc:
        errors.append(ConfigError(group=group, field=field, problem=_problem(exc, field), fix=fix))
        return None


def _group_resources(name: str, group: Mapping[str, Any], errors: list[ConfigError]) -> Resources:
    """The Ray resources a new pod of this group registers with."""
    container = _template_container(group)
    units: dict[str, int] = {}
    base = "template.spec.containers[0].resources"
    if container is not None:
        resources = container.get("resources") or {}
        for key, rname in (("cpu", CPU), ("memory", MEMORY)):
            given: dict[str, object] = {}
            parsed: dict[str, int | None] = {}
            for kind in ("requests", "limits"):  # errors in this order
                value = (resources.get(kind) or {}).get(key)
                if value is None:
                    continue
                field = f"{base}.{kind}.{key}"
                fix = "use a Kubernetes quantity such as 2, 1500m or 8Gi"
                given[kind] = value
                parsed[kind] = _template_quantity(value, rname, name, field, fix, errors)
            if None in parsed.values():
                continue
            # `_size_of`'s rule: the limit when one is given, else the request
            size = parsed.get("limits" if given.get("limits") else "requests")
            if size is not None:
                units[rname] = size
        limits = resources.get("limits") or {}
        for key in GPU_KEYS:
            if key in limits:
                field = f"{base}.limits.{key}"
                fix = "use a whole number of GPUs"
                gpus = _template_quantity(limits[key], "GPU", name, field, fix, errors)
                if gpus is not None:
                    units["GPU"] = gpus
    params = group.get("rayStartParams") or {}
    for param, rname in (("num-cpus", CPU), ("num-gpus", "GPU"), ("memory", MEMORY)):
        if param in params:
            raw = params[param]
            field = f"rayStartParams.{param}"
            try:
                amount = float(raw)
            except (TypeError, ValueError):
                problem = f"{raw!r} is not a number"
            else:
                try:
                    units[rname] = float_to_units(amount, rname, what=field)
                    continue
                except QuantityError:
                    problem = (
                        f"{raw!r} is {'negative' if amount < 0 else 'out of range'}; "
                        f"expected {ray_accepted(rname)}"
                    )
            errors.append(
                ConfigError(group=name, field=field, problem=problem, fix='give a number like "2"')
            )
    if "resources" in params:
        field = "rayStartParams.resources"
        try:
            for rname, amount in _parse_start_param_resources(params["resources"]).items():
                units[rname] = float_to_units(amount, rname, what=rname)
        except QuantityError as exc:
            errors.append(
                ConfigError(
                    group=name,
                    field=field,
                    problem=str(exc),
                    fix="write it like '{\"custom\": 1}'",
                )
            )
        except ValueError as exc:
            errors.append(
                ConfigError(
                    group=name,
                    field=field,
                    problem=f"{params['resources']!r} is not a JSON object of numbers ({exc})",
                    fix="write it like '{\"custom\": 1}'",
                )
            )
    return Resources(units)


_JSON_TYPES = {
    dict: "an object", list: "an array", str: "a string", int: "a number",
    float: "a decimal number", bool: "a boolean", type(None): "null",
}  # fmt: skip
GROUP_KEYS = ("max-cpu", "max-memory", "resize-timeout")
UNKNOWN_GROUPS_LISTED = 5  # more unknown group names than this are counted, not listed


def json_type(value: object) -> str:
    """A JSON value's type as JSON names it ("null", not Python's NoneType)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _worker_groups(raycluster: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    spec = raycluster.get("spec") or {}
    out: dict[str, Mapping[str, Any]] = {}
    for g in spec.get("workerGroupSpecs") or []:
        if isinstance(g, dict) and isinstance(g.get("groupName"), str):
            out[g["groupName"]] = g
    return out


def _opt_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def read_group_specs(raycluster: Mapping[str, Any]) -> GroupSpecs:
    """Read every group of a RayCluster and validate its `ray.io/ippr` annotation."""
    errors: list[ConfigError] = []
    spec = raycluster.get("spec") or {}
    raw_groups: dict[str, Mapping[str, Any]] = {}
    head = spec.get("headGroupSpec")
    if isinstance(head, dict):
        raw_groups[HEAD_GROUP] = head
    raw_groups.update(_worker_groups(raycluster))

    annotations = (raycluster.get("metadata") or {}).get("annotations") or {}
    raw_annotation = annotations.get(IPPR_ANNOTATION)
    # present at all, even empty, is asked for: "" is an error, not "no resizing"
    limits = (
        parse_ippr_annotation(raw_annotation, raw_groups, errors)
        if raw_annotation is not None
        else {}
    )

    groups: dict[str, GroupSpec] = {}
    for name, g in raw_groups.items():
        is_head = name == HEAD_GROUP
        resources = _group_resources(name, g, errors)
        replicas_min = 0 if is_head else (_opt_int(g.get("minReplicas")) or 0)
        replicas_max = None if is_head else _opt_int(g.get("maxReplicas"))
        if replicas_max is not None and replicas_min > replicas_max:
            errors.append(
                ConfigError(
                    group=name,
                    field="minReplicas",
                    problem=f"{replicas_min} is above maxReplicas {replicas_max}",
                    fix="make minReplicas at most maxReplicas",
                )
            )
        labels = {"ray.io/node-group": name}
        params = g.get("rayStartParams") or {}
        if "labels" in params:
            labels.update(_parse_labels(params["labels"]))
        groups[name] = GroupSpec(
            name=name,
            resources=resources,
            min_workers=replicas_min,
            max_workers=replicas_max,
            labels=labels,
            ippr=limits.get(name),
            is_head=is_head,
        )
    return GroupSpecs(groups=groups, errors=tuple(errors), ippr_enabled=raw_annotation is not None)


def parse_ippr_annotation(
    raw: object,
    raw_groups: Mapping[str, Mapping[str, Any]],
    errors: list[ConfigError],
) -> dict[str, IpprLimits]:
    """Validate the annotation against the cluster's groups; append every problem."""
    field = f"metadata.annotations[{IPPR_ANNOTATION}]"
    example = '{"groups": {"<group>": {"max-cpu": "4", "max-memory": "8Gi", "resize-timeout": 60}}}'
    if not isinstance(raw, str):
        errors.append(
            ConfigError(
                group=None,
                field=field,
                problem="is not a string",
                fix=f"set it to a JSON string like {example}",
            )
        )
        return {}
    if not raw.strip():
        errors.append(
            ConfigError(
                group=None,
                field=field,
                problem="is empty",
                fix=f"write it like {example}, or remove the annotation to turn resizing off",
            )
        )
        return {}
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        errors.append(
            ConfigError(
                group=None,
                field=field,
                problem=f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                fix=f"write it like {example}",
            )
        )
        return {}
    if not isinstance(doc, dict):
        errors.append(
            ConfigError(
                group=None,
                field=field,
                problem=f"is {json_type(doc)}, not an object",
                fix=f"write it like {example}",
            )
        )
        return {}
    unknown_keys = sorted(k for k in doc if k != "groups")
    if unknown_keys:
        errors.append(
            ConfigError(
                group=None,
                field=field,
                problem=f"has unknown key(s) {', '.join(map(repr, unknown_keys))}",
                fix='the only key is "groups"',
            )
        )
    if "groups" not in doc or doc["groups"] == {}:
        # Ray takes this as IPPR on no group; asked for and empty, it is most likely a
        # mistake, and raysize would then only scale: say so rather than guess
        errors.append(
            ConfigError(
                group=None,
                field="groups",
                problem="is missing" if "groups" not in doc else "is empty",
                fix=f"name at least one group: {example} (or remove the annotation)",
            )
        )
        return {}
    groups_doc = doc["groups"]
    if not isinstance(groups_doc, dict):
        errors.append(
            ConfigError(
                group=None,
                field="groups",
                problem=f"is {json_type(groups_doc)}, not an object",
                fix=f"map each group name to its limits: {example}",
            )
        )
        return {}

    known = sorted(raw_groups)
    strangers = [name for name in groups_doc if name not in raw_groups]
    if strangers:
        listed = ", ".join(map(repr, strangers[:UNKNOWN_GROUPS_LISTED]))
        more = len(strangers) - UNKNOWN_GROUPS_LISTED
        errors.append(
            ConfigError(
                group=strangers[0] if len(strangers) == 1 else None,
                field="groups",
                problem=(
                    "is not a group of this RayCluster"
                    if len(strangers) == 1
                    else f"names {len(strangers)} groups this RayCluster does not have: "
                    f"{listed}{f' and {more} more' if more > 0 else ''}"
                ),
                fix=f"use one of: {', '.join(known)} (the head group is {HEAD_GROUP!r})",
            )
        )
    out: dict[str, IpprLimits] = {}
    for name, entry in groups_doc.items():
        if name not in raw_groups:
            continue
        if not isinstance(entry, dict):
            errors.append(
                ConfigError(
                    group=name,
                    field="groups",
                    problem=f"the entry is {json_type(entry)}, not an object",
                    fix='give {"max-cpu": ..., "max-memory": ..., "resize-timeout": ...}',
                )
            )
            continue
        limits = _parse_group_limits(name, entry, raw_groups[name], errors)
        if limits is not None:
            out[name] = limits
    return out


def _parse_group_limits(
    name: str,
    entry: Mapping[str, Any],
    group: Mapping[str, Any],
    errors: list[ConfigError],
) -> IpprLimits | None:
    before = len(errors)

    def err(fld: str, problem: str, fix: str) -> None:
        errors.append(ConfigError(group=name, field=fld, problem=problem, fix=fix))

    for key in sorted(k for k in entry if k not in GROUP_KEYS):
        near = difflib.get_close_matches(key.replace("_", "-"), GROUP_KEYS, n=1)
        err(
            key,
            "is not a known key",
            f"did you mean {near[0]!r}?" if near else f"use only {', '.join(GROUP_KEYS)}",
        )

    def limit(
        key: str, name: str, types: tuple[type, ...], hints: tuple[str, str, str]
    ) -> int | None:
        """One of max-cpu / max-memory: present, of Ray's types, a positive quantity."""
        missing, wrong_type, bad_quantity = hints
        if key not in entry:
            err(key, "is missing", missing)
            return None
        v = entry[key]
        if isinstance(v, bool) or not isinstance(v, types):
            err(key, f"{v!r} is {json_type(v)}", wrong_type)
            return None
        try:
            units = quantity_to_units(v, name, what=key)
        except QuantityError as exc:
            err(key, _problem(exc, key), bad_quantity)
            return None
        if units <= 0:
            err(
                key,
                f"{v!r} is zero",
                f"give a positive {'CPU' if name == CPU else 'memory'} amount",
            )
            return None
        return units

    # Ray's schema: max-cpu is a string or any number, max-memory a string or an integer
    max_cpu = limit(
        "max-cpu",
        CPU,
        (str, int, float),
        (
            'add "max-cpu", a quantity string like "4" or a number',
            'use a string quantity like "4" or "1500m", or a number',
            'use a quantity like "4", "1500m" or 4',
        ),
    )
    max_memory = limit(
        "max-memory",
        MEMORY,
        (str, int),
        (
            'add "max-memory", a quantity like "8Gi" or bytes',
            'use a string quantity like "8Gi" or an integer number of bytes',
            'use a quantity like "8Gi", "512Mi" or an integer of bytes',
        ),
    )

    timeout: int | None = None
    if "resize-timeout" not in entry:
        err("resize-timeout", "is missing", 'add "resize-timeout", whole seconds like 60')
    else:
        v = entry["resize-timeout"]
        if isinstance(v, bool) or not isinstance(v, int):
            err(
                "resize-timeout",
                f"{v!r} is {json_type(v)}, not an integer",
                "give whole seconds like 60",
            )
        elif v <= 0:
            err("resize-timeout", f"{v} is not positive", "give whole seconds, at least 1")
        else:
            timeout = v

    _check_template(name, group, errors, max_cpu, max_memory)
    if len(errors) > before or max_cpu is None or max_memory is None or timeout is None:
        return None
    return IpprLimits(max_cpu=max_cpu, max_memory=max_memory, resize_timeout_s=timeout)


def _check_template(
    name: str,
    group: Mapping[str, Any],
    errors: list[ConfigError],
    max_cpu: int | None,
    max_memory: int | None,
) -> None:
    def err(fld: str, problem: str, fix: str) -> None:
        errors.append(ConfigError(group=name, field=fld, problem=problem, fix=fix))

    params = group.get("rayStartParams") or {}
    for param in ("num-cpus", "memory"):
        if param in params:
            err(
                f"rayStartParams.{param}",
                "is set, so Ray's logical resources would not follow the pod's size",
                f"remove {param!r} from rayStartParams; Ray reads the size from the container",
            )
    container = _template_container(group)
    base = "template.spec.containers[0]"
    if container is None:
        err(base, "is missing", "give the group a pod template with a Ray container")
        return
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    for key in ("cpu", "memory"):
        if key not in requests:
            err(
                f"{base}.resources.requests.{key}",
                "is missing",
                f"set a {key} request: it is the size a new pod starts at and the lower bound",
            )
    for i, policy in enumerate(container.get("resizePolicy") or []):
        if not isinstance(policy, dict) or policy.get("resourceName") not in ("cpu", "memory"):
            continue
        restart = policy.get("restartPolicy")
        if restart is not None and restart != NOT_REQUIRED:
            err(
                f"{base}.resizePolicy[{i}].restartPolicy",
                f"is {restart!r} for {policy['resourceName']}, which restarts the Ray container",
                f"set it to {NOT_REQUIRED!r} (or leave it out)",
            )
    for key, rname, limit in (("cpu", CPU, max_cpu), ("memory", MEMORY, max_memory)):
        if limit is None:
            continue
        try:
            size = _size_of(resources, key, rname, f"resources.{key}")
        except QuantityError:
            continue  # reported by _group_resources
        if size is not None and limit < size:
            shown = Resources({rname: size}).to_k8s()[key]
            err(
                f"max-{key}",
                f"{Resources({rname: limit}).to_k8s()[key]} is below the template size {shown}",
                f"raise max-{key} to at least {shown} or lower the template",
            )


def read_planner_settings(raycluster: Mapping[str, Any], base: PlannerSettings) -> PlannerSettings:
    """KubeRay's autoscalerOptions (upscalingMode, idleTimeoutSeconds) over our defaults."""
    options = (raycluster.get("spec") or {}).get("autoscalerOptions") or {}
    updates: dict[str, Any] = {}
    mode = options.get("upscalingMode")
    if mode in {m.value for m in UpscalingMode}:
        updates["upscaling_mode"] = UpscalingMode(mode)
    idle = options.get("idleTimeoutSeconds")
    if isinstance(idle, int) and not isinstance(idle, bool) and idle >= 0:
        updates["idle_timeout_s"] = float(idle)
    return base.model_copy(update=updates) if updates else base


# --- ray.io/ippr-status -------------------------------------------------------------


class IpprStatus(Value):
    """Per-pod resize record, in Ray's field names, shared with Ray's own autoscaler."""

    raylet_id: str | None = None
    resizing_at: int | None = None
    suggested_max_cpu: int | None = None  # millicores
    suggested_max_memory: int | None = None  # bytes
    last_failed_at: int | None = None
    last_failed_reason: str | None = None

    @classmethod
    def from_annotation(cls, raw: str | None) -> IpprStatus:
        """Read Ray's JSON; unreadable or missing fields are treated as unset."""
        if not raw:
            return cls()
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError:
            return cls()
        if not isinstance(doc, dict):
            return cls()

        def num(key: str) -> float | None:
            v = doc.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None
            return v

        def text(key: str) -> str | None:
            v = doc.get(key)
            return v if isinstance(v, str) else None

        cpu = num("suggested-max-cpu")
        mem = num("suggested-max-memory")
        at = num("resizing-at")
        failed_at = num("last-failed-at")
        return cls(
            raylet_id=text("raylet-id"),
            resizing_at=int(at) if at is not None else None,
            suggested_max_cpu=float_to_units(cpu, CPU) if cpu is not None and cpu >= 0 else None,
            suggested_max_memory=int(mem) if mem is not None and mem >= 0 else None,
            last_failed_at=int(failed_at) if failed_at is not None else None,
            last_failed_reason=text("last-failed-reason"),
        )

    def to_annotation(self) -> str:
        """Ray's JSON: CPU in cores (float), memory in bytes, times in Unix seconds."""
        return json.dumps(
            {
                "raylet-id": self.raylet_id,
                "resizing-at": self.resizing_at,
                "suggested-max-cpu": (
                    units_to_float(self.suggested_max_cpu, CPU)
                    if self.suggested_max_cpu is not None
                    else None
                ),
                "suggested-max-memory": self.suggested_max_memory,
                "last-failed-at": self.last_failed_at,
                "last-failed-reason": self.last_failed_reason,
            }
        )


# --- kubelet messages ---------------------------------------------------------------

_DEFERRED_RE = re.compile(
    r"Node didn't have enough resource: (cpu|memory), requested: (\d+), used: (\d+), "
    r"capacity: (\d+)"
)
_INFEASIBLE_RE = re.compile(
    r"Node didn't have enough capacity: (cpu|memory), requested: (\d+), capacity: (\d+)"
    # Kubernetes 1.36+ says the same at admission (403, cause NodeCapacity)
    r"|node didn't have enough allocatable resources: (cpu|memory), requested: (\d+), "
    r"allocatable: (\d+)"
)


class KubeletReport(Value):
    """What a Deferred/Infeasible message says the pod may still request on its node."""

    resource: str  # "cpu" | "memory"
    max_request: int  # millicores or bytes the pod's requests may total


def parse_kubelet_message(reason: str, message: str | None) -> KubeletReport | None:
    """Parse the kubelet's PodResizePending message; None when it carries no numbers."""
    if not message:
        return None
    if reason == "Deferred":
        m = _DEFERRED_RE.search(message)
        if m:
            return KubeletReport(resource=m.group(1), max_request=int(m.group(4)) - int(m.group(3)))
    elif reason == "Infeasible":
        m = _INFEASIBLE_RE.search(message)
        if m:
            resource, _, capacity = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
            return KubeletReport(resource=resource, max_request=int(capacity))
    return None
