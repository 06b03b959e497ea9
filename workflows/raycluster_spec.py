"""A RayCluster's groups as the planner sees them (`read_group_specs`: sizes, replica
bounds, labels, `ray.io/ippr` limits) and KubeRay's autoscalerOptions over raysize's
defaults (`read_planner_settings`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from raysize.workflows.ippr import IPPR_ANNOTATION, parse_ippr_annotation
from raysize.workflows.model import HEAD_GROUP, GroupSpec, PlannerSettings, UpscalingMode
from raysize.workflows.pod_template import (
    ConfigError,
    group_resources,
    parse_labels,
    start_param_resources,
)
from raysize.workflows.values import Value


class GroupSpecs(Value):
    """The groups of a RayCluster as the planner sees them, or why they can't be used."""

    groups: dict[str, GroupSpec]
    errors: tuple[ConfigError, ...] = ()
    ippr_enabled: bool = False
    # group → what its rayStartParams set, by Ray's names in units (a 0 kept: "num-cpus:
    # 0" is set): its Raylets register with these whatever the pod's size
    pinned: dict[str, dict[str, int]] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


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
    pinned: dict[str, dict[str, int]] = {}
    for name, g in raw_groups.items():
        is_head = name == HEAD_GROUP
        resources = group_resources(name, g, errors)
        pinned[name] = start_param_resources(name, g, [])  # its errors: just above
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
            labels.update(parse_labels(params["labels"]))
        groups[name] = GroupSpec(
            name=name,
            resources=resources,
            min_workers=replicas_min,
            max_workers=replicas_max,
            labels=labels,
            ippr=limits.get(name),
            is_head=is_head,
        )
    return GroupSpecs(
        groups=groups,
        errors=tuple(errors),
        ippr_enabled=raw_annotation is not None,
        pinned=pinned,
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
