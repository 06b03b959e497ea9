"""What a pod of a RayCluster group registers with in Ray: read from the group's pod
template and `rayStartParams` by Ray's rules, every problem a `ConfigError` that names the
group, the field and the fix. Shared by the `ray.io/ippr` annotation (`ippr.py`) and the
RayCluster's groups (`raycluster_spec.py`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from raysize.workflows.resources import (
    CPU,
    MEMORY,
    QuantityError,
    Resources,
    float_to_units,
    quantity_to_units,
    ray_accepted,
)
from raysize.workflows.values import Value

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


def template_container(group: Mapping[str, Any]) -> Mapping[str, Any] | None:
    try:
        containers = group["template"]["spec"]["containers"]
    except (KeyError, TypeError):
        return None
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], dict):
        return None
    return containers[0]


def size_of(resources: Mapping[str, Any], key: str, name: str, what: str) -> int | None:
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


def parse_labels(raw: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in str(raw).split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def problem_of(exc: QuantityError, field: str) -> str:
    """The message of a conversion error without its `field: ` prefix (ConfigError adds it)."""
    return str(exc).removeprefix(f"{field}: ")


def _template_quantity(
    value: object, rname: str, group: str, field: str, fix: str, errors: list[ConfigError]
) -> int | None:
    """A template quantity in exact units, or None with the error recorded."""
    try:
        return quantity_to_units(value, rname, what=field)
    except QuantityError as exc:
        errors.append(
            ConfigError(group=group, field=field, problem=problem_of(exc, field), fix=fix)
        )
        return None


def group_resources(name: str, group: Mapping[str, Any], errors: list[ConfigError]) -> Resources:
    """The Ray resources a new pod of this group registers with."""
    container = template_container(group)
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
            # `size_of`'s rule: the limit when one is given, else the request
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
    return Resources({**units, **start_param_resources(name, group, errors)})


def start_param_resources(
    name: str, group: Mapping[str, Any], errors: list[ConfigError]
) -> dict[str, int]:
    """What the group's `rayStartParams` set (`num-cpus`, `num-gpus`, `memory`,
    `resources`), by Ray's names in exact units: KubeRay passes them to `ray start`, so
    its Raylets register with these whatever the pod's size, and a resize of the pod does
    not change them."""
    pinned: dict[str, int] = {}
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
                    pinned[rname] = float_to_units(amount, rname, what=field)
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
                pinned[rname] = float_to_units(amount, rname, what=rname)
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
    return pinned


_JSON_TYPES = {
    dict: "an object", list: "an array", str: "a string", int: "a number",
    float: "a decimal number", bool: "a boolean", type(None): "null",
}  # fmt: skip


def json_type(value: object) -> str:
    """A JSON value's type as JSON names it ("null", not Python's NoneType)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)
