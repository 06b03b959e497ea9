"""The scheduling scenario format v1 (bench/SCENARIO.md) ↔ `ClusterSnapshot` and `Plan`.

Parsing is strict and precise: every problem names its place in the document
(`pods[3].total.CPU`) and says what is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workflows.model import (
    HEAD_GROUP,
    ClusterSnapshot,
    Constraint,
    Demand,
    Gang,
    GangStrategy,
    GroupSpec,
    IpprLimits,
    Plan,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
    ResizePolicy,
    ResizeState,
    UpscalingMode,
)
from workflows.resources import CPU, QuantityError, Resources, float_to_units, units_to_float


class ScenarioError(ValueError):
    """The scenario document is not valid; the message names the field and the fix."""


def _fail(path: str, problem: str) -> ScenarioError:
    return ScenarioError(f"{path}: {problem}")


def _obj(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected an object, got {_kind(value)}")
    return value


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(path, f"expected a list, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _int(value: object, path: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise _fail(path, f"expected a whole number, got {value!r}")
    if value < minimum:
        raise _fail(path, f"{value} is below {minimum}")
    return value


def _num(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise _fail(path, f"expected a number, got {value!r}")
    if value < 0:
        raise _fail(path, f"{value} is negative")
    return float(value)


def _str(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, f"expected a non-empty string, got {value!r}")
    return value


def _resources(value: object, path: str) -> Resources:
    amounts = _obj(value, path)
    out: dict[str, int] = {}
    for name, amount in amounts.items():
        try:
            out[name] = float_to_units(amount, name, what=f"{path}.{name}")
        except QuantityError as exc:
            raise ScenarioError(
                f"{exc} (resources are Ray amounts: CPU in cores, memory in bytes)"
            ) from exc
    return Resources(out)


def _labels(value: object, path: str) -> dict[str, str]:
    if value is None:
        return {}
    labels = _obj(value, path)
    for k, v in labels.items():
        if not isinstance(v, str):
            raise _fail(f"{path}.{k}", f"label values are strings, got {v!r}")
    return dict(labels)


def _enum(value: object, path: str, options: list[str]) -> str:
    if value not in options:
        raise _fail(path, f"{value!r} is not one of {', '.join(options)}")
    return str(value)


def load_scenario(doc: object, base: PlannerSettings | None = None) -> ClusterSnapshot:
    """Build a snapshot from a parsed scenario document."""
    root = _obj(doc, "scenario")
    version = root.get("version")
    if version != 1:
        raise _fail("version", f"{version!r} is not supported; this reads version 1")
    settings = base or PlannerSettings()
    updates: dict[str, Any] = {}
    if root.get("max_workers") is not None:
        updates["max_workers"] = _int(root["max_workers"], "max_workers")
    if "idle_timeout_s" in root:
        updates["idle_timeout_s"] = _num(root["idle_timeout_s"], "idle_timeout_s")
    extra = root.get("settings")
    if extra is not None:
        extra = _obj(extra, "settings")
        if "upscaling_mode" in extra:
            updates["upscaling_mode"] = UpscalingMode(
                _enum(
                    extra["upscaling_mode"],
                    "settings.upscaling_mode",
                    [m.value for m in UpscalingMode],
                )
            )
        if "resize_policy" in extra:
            updates["resize_policy"] = ResizePolicy(
                _enum(
                    extra["resize_policy"],
                    "settings.resize_policy",
                    [m.value for m in ResizePolicy],
                )
            )
        if "cpu_step" in extra:
            updates["cpu_step"] = float_to_units(_num(extra["cpu_step"], "settings.cpu_step"), CPU)
        if "memory_step" in extra:
            updates["memory_step"] = _int(extra["memory_step"], "settings.memory_step", minimum=1)
    settings = settings.model_copy(update=updates)

    groups: dict[str, GroupSpec] = {}
    for name, raw in _obj(root.get("groups"), "groups").items():
        path = f"groups.{name}"
        g = _obj(raw, path)
        ippr = None
        if g.get("ippr") is not None:
            ip = _obj(g["ippr"], f"{path}.ippr")
            for key in ("max_cpu", "max_memory", "resize_timeout_s"):
                if key not in ip:
                    raise _fail(f"{path}.ippr.{key}", "is missing")
            ippr = IpprLimits(
                max_cpu=float_to_units(_num(ip["max_cpu"], f"{path}.ippr.max_cpu"), CPU),
                max_memory=_int(ip["max_memory"], f"{path}.ippr.max_memory"),
                resize_timeout_s=_int(
                    ip["resize_timeout_s"], f"{path}.ippr.resize_timeout_s", minimum=1
                ),
            )
        if "resources" not in g:
            raise _fail(f"{path}.resources", "is missing: give a new pod's size")
        max_w = g.get("max_workers")
        groups[name] = GroupSpec(
            name=name,
            resources=_resources(g["resources"], f"{path}.resources"),
            min_workers=_int(g.get("min_workers", 0), f"{path}.min_workers"),
            max_workers=None if max_w is None else _int(max_w, f"{path}.max_workers"),
            labels=_labels(g.get("labels"), f"{path}.labels"),
            ippr=ippr,
            is_head=name == HEAD_GROUP,
        )
        if groups[name].max_workers is not None and groups[name].min_workers > (
            groups[name].max_workers or 0
        ):
            raise _fail(f"{path}.min_workers", "is above max_workers")

    pods: list[PodView] = []
    seen: set[str] = set()
    for i, raw in enumerate(_list(root.get("pods", []), "pods")):
        path = f"pods[{i}]"
        p = _obj(raw, path)
        name = _str(p.get("name"), f"{path}.name")
        if name in seen:
            raise _fail(f"{path}.name", f"{name!r} appears twice")
        seen.add(name)
        group = _str(p.get("group"), f"{path}.group")
        total = _resources(p.get("total", {}), f"{path}.total")
        if group not in groups:
            if group != HEAD_GROUP:
                raise _fail(f"{path}.group", f"{group!r} is not in groups ({', '.join(groups)})")
            groups[HEAD_GROUP] = GroupSpec(name=HEAD_GROUP, resources=total, is_head=True)
        phase = PodPhase(
            _enum(p.get("phase", "running"), f"{path}.phase", [m.value for m in PodPhase])
        )
        raylet = p.get("raylet_id")
        if raylet is not None:
            raylet = _str(raylet, f"{path}.raylet_id")
        available = _resources(p.get("available", p.get("total", {})), f"{path}.available")
        resize = None
        sug_cpu = sug_mem = None
        failed = False
        if p.get("resize") is not None:
            r = _obj(p["resize"], f"{path}.resize")
            state = ResizeState(
                _enum(
                    r.get("state", "in_progress"),
                    f"{path}.resize.state",
                    [m.value for m in ResizeState],
                )
            )
            if r.get("suggested_max_cpu") is not None:
                sug_cpu = float_to_units(
                    _num(r["suggested_max_cpu"], f"{path}.resize.suggested_max_cpu"), CPU
                )
            if r.get("suggested_max_memory") is not None:
                sug_mem = _int(r["suggested_max_memory"], f"{path}.resize.suggested_max_memory")
            failed = bool(r.get("failed", False)) or state in (
                ResizeState.ERROR,
                ResizeState.TIMED_OUT,
            )
            if "cpu" in r or "memory" in r:
                resize = PodResize(
                    cpu=float_to_units(
                        _num(r.get("cpu", total.cpu / 1000), f"{path}.resize.cpu"), CPU
                    ),
                    memory=_int(r.get("memory", total.memory), f"{path}.resize.memory"),
                    state=state,
                )
        pods.append(
            PodView(
                name=name,
                group=group,
                phase=phase,
                raylet_id=raylet,
                total=total,
                available=available,
                idle_s=_num(p.get("idle_s", 0), f"{path}.idle_s"),
                labels=_labels(p.get("labels"), f"{path}.labels"),
                resize=resize,
                suggested_max_cpu=sug_cpu,
                suggested_max_memory=sug_mem,
                failed=failed,
            )
        )

    demands = tuple(
        Demand(
            shape=_resources(_obj(d, f"demands[{i}]").get("shape"), f"demands[{i}].shape"),
            count=_int(d.get("count", 1), f"demands[{i}].count"),
            label_selector=_labels(d.get("label_selector"), f"demands[{i}].label_selector"),
        )
        for i, d in enumerate(_list(root.get("demands", []), "demands"))
    )
    gangs = []
    for i, raw in enumerate(_list(root.get("gangs", []), "gangs")):
        path = f"gangs[{i}]"
        g = _obj(raw, path)
        bundles = tuple(
            _resources(b, f"{path}.bundles[{j}]")
            for j, b in enumerate(_list(g.get("bundles"), f"{path}.bundles"))
        )
        if not bundles:
            raise _fail(f"{path}.bundles", "is empty: a placement group has at least one bundle")
        selectors = tuple(
            _labels(s, f"{path}.bundle_selectors[{j}]")
            for j, s in enumerate(_list(g.get("bundle_selectors", []), f"{path}.bundle_selectors"))
        )
        gangs.append(
            Gang(
                bundles=bundles,
                strategy=GangStrategy(
                    _enum(
                        g.get("strategy", "PACK"),
                        f"{path}.strategy",
                        [m.value for m in GangStrategy],
                    )
                ),
                count=_int(g.get("count", 1), f"{path}.count"),
                bundle_selectors=selectors,
            )
        )
    constraints = tuple(
        Constraint(
            shape=_resources(_obj(c, f"constraints[{i}]").get("shape"), f"constraints[{i}].shape"),
            count=_int(c.get("count", 1), f"constraints[{i}].count"),
        )
        for i, c in enumerate(_list(root.get("constraints", []), "constraints"))
    )
    name = root.get("name", "scenario")
    return ClusterSnapshot(
        name=str(name),
        groups=groups,
        pods=tuple(pods),
        demands=demands,
        gangs=tuple(gangs),
        constraints=constraints,
        settings=settings,
    )


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan in SCENARIO.md's format: absolute sizes in cores and bytes."""
    return {
        "launch": plan.launch_by_group,
        "resize": [
            {"pod": r.pod, "cpu": units_to_float(r.cpu, CPU), "memory": r.memory}
            for r in plan.resize
        ],
        "terminate": [t.pod for t in plan.terminate],
        "infeasible": plan.infeasible.model_dump(),
    }


__all__ = ["ScenarioError", "load_scenario", "plan_to_json"]
