"""The `ray.io/ippr` RayCluster annotation: which groups may be resized in place, how far.

Accepts exactly Ray's format (Ray 2.60, `IPPRSpecsSchema`):

    {"groups": {"<group>": {"max-cpu": "4" | 4, "max-memory": "8Gi" | 8589934592,
                            "resize-timeout": 60}}}

with the head group named `headgroup`, and applies Ray's pod-template rules. It also
rejects what Ray lets through and fails on later: invalid JSON, wrong types, unknown
groups, a maximum below the template size, a non-positive timeout. Every problem is
reported at once, each naming the group, the field and the fix.

The other parsers of a RayCluster live apart: its groups (`raycluster_spec.py`), a pod
template's size (`pod_template.py`), the `ray.io/ippr-status` pod record
(`ippr_status.py`) and the kubelet's resize messages (`kubelet_messages.py`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from raysize.workflows.model import HEAD_GROUP, IpprLimits
from raysize.workflows.pod_template import (
    ConfigError,
    json_type,
    problem_of,
    size_of,
    template_container,
)
from raysize.workflows.resources import (
    CPU,
    MEMORY,
    QuantityError,
    Resources,
    quantity_to_units,
)

IPPR_ANNOTATION = "ray.io/ippr"
NOT_REQUIRED = "NotRequired"
GROUP_KEYS = ("max-cpu", "max-memory", "resize-timeout")
UNKNOWN_GROUPS_LISTED = 5  # more unknown group names than this are counted, not listed


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
            err(key, problem_of(exc, key), bad_quantity)
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
    container = template_container(group)
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
            size = size_of(resources, key, rname, f"resources.{key}")
        except QuantityError:
            continue  # reported by group_resources
        if size is not None and limit < size:
            shown = Resources({rname: size}).to_k8s()[key]
            err(
                f"max-{key}",
                f"{Resources({rname: limit}).to_k8s()[key]} is below the template size {shown}",
                f"raise max-{key} to at least {shown} or lower the template",
            )
