"""The scheduling scenario format v1 (bench/SCENARIO.md) ↔ `ClusterSnapshot` and `Plan`.

Parsing is strict and precise: every problem names its place in the document
(`pods[3].total.CPU`) and says what is accepted.
"""

from __future__ import annotations

import difflib
import json
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from raysize.workflows.model import (
    HEAD_GROUP,
    MAX_PLAN_UNITS,
    ClusterSnapshot,
    Constraint,
    Demand,
    Gang,
    GangStrategy,
    GroupSpec,
    IpprLimits,
    KubeletResizeState,
    Plan,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
    ResizePolicy,
    UpscalingMode,
    plan_units,
)
from raysize.workflows.resources import (
    CPU,
    MAX_UNITS,
    MEMORY,
    QuantityError,
    Resources,
    float_to_units,
    ray_amount_text,
    units_to_float,
)


class ScenarioError(ValueError):
    """The scenario document is not valid; the message names the field and the fix."""


# The keys each object of the format may have (bench/SCENARIO.md); anything else is refused.
ROOT_KEYS = (
    "version",
    "name",
    "max_workers",
    "idle_timeout_s",
    "settings",
    "groups",
    "pods",
    "demands",
    "gangs",
    "constraints",
)
SETTINGS_KEYS = ("upscaling_mode", "resize_policy", "cpu_step", "memory_step")
GROUP_KEYS = ("resources", "min_workers", "max_workers", "labels", "ippr")
IPPR_KEYS = ("max_cpu", "max_memory", "resize_timeout_s")
POD_KEYS = (
    "name",
    "group",
    "phase",
    "raylet_id",
    "total",
    "available",
    "idle_s",
    "labels",
    "resize",
)
RESIZE_KEYS = (
    "cpu",
    "memory",
    "state",
    "suggested_max_cpu",
    "suggested_max_memory",
    "failed",
)
DEMAND_KEYS = ("shape", "count", "label_selector")
GANG_KEYS = ("bundles", "strategy", "count", "bundle_selectors")
CONSTRAINT_KEYS = ("shape", "count")
# The accepted values of each enum field, in declaration order (the messages list them).
_POD_PHASES = tuple(m.value for m in PodPhase)
_RESIZE_STATES = tuple(m.value for m in KubeletResizeState)
_GANG_STRATEGIES = tuple(m.value for m in GangStrategy)
_UPSCALING_MODES = tuple(m.value for m in UpscalingMode)
_RESIZE_POLICIES = tuple(m.value for m in ResizePolicy)

# keys that are valid, but in another object
_ELSEWHERE = {
    "scenario": {k: "in settings" for k in SETTINGS_KEYS},
    "settings": {"max_workers": "at the top level", "idle_timeout_s": "at the top level"},
}


def _fail(path: str, problem: str) -> ScenarioError:
    return ScenarioError(f"{path}: {problem}")


def _bad(path: str, value: object, problem: str, accepted: str) -> ScenarioError:
    return ScenarioError(f"{path}: {value!r} {problem}; expected {accepted}")


def _missing(path: str, accepted: str) -> ScenarioError:
    return ScenarioError(f"{path}: is missing; expected {accepted}")


def _closest(word: str, options: Iterable[str]) -> str | None:
    """The valid option closest to a misspelling (case aside), if any is close."""
    by_lower = {o.lower(): o for o in options}
    match = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def _keys(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    """Refuse a key the format does not have, suggesting the closest one that it does."""
    for key in obj:
        if key in allowed:
            continue
        where = _ELSEWHERE.get(path, {}).get(key)
        if where is not None:
            raise _fail(path, f"unknown key {key!r} (it belongs {where})")
        guess = _closest(str(key), allowed)
        if guess is not None:
            raise _fail(path, f"unknown key {key!r} (did you mean {guess!r}?)")
        raise _fail(path, f"unknown key {key!r}; expected one of {', '.join(allowed)}")


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


def _int_accepted(minimum: int, unit: str, or_null: str) -> str:
    """What `_int` accepts, for its error messages (built only when one is refused)."""
    if minimum == 0:
        accepted = f"a non-negative whole number{f' of {unit}' if unit else ''}"
    elif unit:
        accepted = f"a whole number of {unit}, at least {minimum}"
    else:
        accepted = f"a whole number of at least {minimum}"
    return f"{accepted}, or null {or_null}" if or_null else accepted


def _int(value: object, path: str, *, minimum: int = 0, unit: str = "", or_null: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, value, "is not a number", _int_accepted(minimum, unit, or_null))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(path, value, "is not a finite number", _int_accepted(minimum, unit, or_null))
        if not value.is_integer():
            raise _bad(path, value, "is not a whole number", _int_accepted(minimum, unit, or_null))
    number = int(value)
    if number < minimum:
        raise _bad(
            path,
            value,
            "is negative" if number < 0 else f"is below {minimum}",
            _int_accepted(minimum, unit, or_null),
        )
    if number > MAX_UNITS:
        raise _bad(
            path,
            value,
            "is too large",
            f"{_int_accepted(minimum, unit, or_null)}, at most {MAX_UNITS}",
        )
    return number


_MAX_FLOAT = sys.float_info.max


def _num_accepted(unit: str, positive: bool) -> str:
    """What `_num` accepts, for its error messages (built only when one is refused)."""
    return f"a {'positive' if positive else 'non-negative'} number of {unit}"


def _num(value: object, path: str, *, unit: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, value, "is not a number", _num_accepted(unit, positive))
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(path, value, "is not a finite number", _num_accepted(unit, positive))
    if value < 0:
        raise _bad(path, value, "is negative", _num_accepted(unit, positive))
    if positive and value == 0:
        raise _bad(path, value, "is not positive", _num_accepted(unit, positive))
    if value > _MAX_FLOAT:  # only an int can be: float(value) would raise OverflowError
        raise _bad(
            path, value, "is too large", f"{_num_accepted(unit, positive)}, at most {_MAX_FLOAT!r}"
        )
    return float(value)


def _cores(value: object, path: str, *, positive: bool = False) -> int:
    """A CPU amount in cores → millicores, rounded as Ray rounds it.

    A positive amount must still be positive once rounded: 1e-10 cores is 0 millicores.
    """
    try:
        units = float_to_units(
            value, CPU, what=path, accepted="a positive number of cores" if positive else None
        )
    except QuantityError as exc:
        raise ScenarioError(str(exc)) from exc
    if positive and units == 0:
        problem = "is not positive" if value == 0 else "is not positive: it rounds to 0 millicores"
        raise _bad(path, value, problem, "a positive number of cores")
    return units


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _bad(path, value, "is not a string", "a non-empty string")
    if not value:
        raise _bad(path, value, "is empty", "a non-empty string")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(path, value, "is not a boolean", "true or false")
    return value


def _resources(value: object, path: str) -> Resources:
    amounts = _obj(value, path)
    out: dict[str, int] = {}
    for name, amount in amounts.items():
        if not name:
            raise _fail(path, "'' is not a resource name; expected a name like CPU, memory, GPU")
        try:
            out[name] = float_to_units(amount, name, what=f"{path}.{name}")
        except QuantityError as exc:
            raise ScenarioError(str(exc)) from exc
    return Resources(out)


def _labels(value: object, path: str) -> dict[str, str]:
    if value is None:
        return {}
    labels = _obj(value, path)
    for k, v in labels.items():
        if not isinstance(v, str):
            raise _bad(f"{path}.{k}", v, "is not a string", "a string label value")
    return dict(labels)


_SELECTOR_SYNTAX = '"value", "!value", "in(v1,v2)" or "!in(v1,v2)"'


def _selector(value: object, path: str) -> dict[str, str]:
    """A Ray label selector: each value is "v", "!v", "in(a,b)" or "!in(a,b)"."""
    selector = _labels(value, path)
    for k, expr in selector.items():
        body = expr[1:] if expr.startswith("!") else expr
        if body.startswith("in(") or body.endswith(")"):
            ok = body.startswith("in(") and body.endswith(")")
            ok = ok and all(v.strip() for v in body[3:-1].split(","))
        else:
            ok = bool(body) and "(" not in body
        if not ok:
            raise _bad(f"{path}.{k}", expr, "is not a label selector", _SELECTOR_SYNTAX)
    return selector


def _enum(value: object, path: str, options: tuple[str, ...]) -> str:
    if value not in options:
        raise _fail(path, f"{value!r} is not one of {', '.join(options)}")
    return str(value)


def _settings(root: Mapping[str, Any], base: PlannerSettings) -> PlannerSettings:
    """The planner settings: the top-level caps and timeout, then `settings`."""
    updates: dict[str, Any] = {}
    if root.get("max_workers") is not None:
        updates["max_workers"] = _int(root["max_workers"], "max_workers", or_null="for no cap")
    if "idle_timeout_s" in root:
        updates["idle_timeout_s"] = _num(root["idle_timeout_s"], "idle_timeout_s", unit="seconds")
    extra = root.get("settings")
    if extra is not None:
        extra = _obj(extra, "settings")
        _keys(extra, "settings", SETTINGS_KEYS)
        if "upscaling_mode" in extra:
            updates["upscaling_mode"] = UpscalingMode(
                _enum(
                    extra["upscaling_mode"],
                    "settings.upscaling_mode",
                    _UPSCALING_MODES,
                )
            )
        if "resize_policy" in extra:
            updates["resize_policy"] = ResizePolicy(
                _enum(
                    extra["resize_policy"],
                    "settings.resize_policy",
                    _RESIZE_POLICIES,
                )
            )
        if "cpu_step" in extra:
            updates["cpu_step"] = _cores(extra["cpu_step"], "settings.cpu_step", positive=True)
        if "memory_step" in extra:
            updates["memory_step"] = _int(
                extra["memory_step"], "settings.memory_step", minimum=1, unit="bytes"
            )
    try:
        # validated, not model_copy: that would skip the model's own checks (cpu_step > 0)
        return PlannerSettings.model_validate({**base.model_dump(), **updates})
    except ValidationError as exc:  # pragma: no cover - every field is checked above
        raise _fail("settings", str(exc)) from exc


def _group(name: str, raw: object) -> GroupSpec:
    path = f"groups.{name}"
    if not name:
        raise _fail("groups", "'' is not a group name; expected a non-empty name")
    g = _obj(raw, path)
    _keys(g, path, GROUP_KEYS)
    if "resources" not in g:
        raise _missing(
            f"{path}.resources", 'a new pod\'s size, like {"CPU": 1, "memory": 2147483648}'
        )
    resources = _resources(g["resources"], f"{path}.resources")
    ippr = None
    if g.get("ippr") is not None:
        ipath = f"{path}.ippr"
        ip = _obj(g["ippr"], ipath)
        _keys(ip, ipath, IPPR_KEYS)
        for key, accepted in (
            ("max_cpu", "the most cores a pod may grow to"),
            ("max_memory", "the most bytes a pod may grow to"),
            ("resize_timeout_s", "whole seconds a resize may take, like 60"),
        ):
            if key not in ip:
                raise _missing(f"{ipath}.{key}", accepted)
        ippr = IpprLimits(
            max_cpu=_cores(ip["max_cpu"], f"{ipath}.max_cpu", positive=True),
            max_memory=_int(ip["max_memory"], f"{ipath}.max_memory", minimum=1, unit="bytes"),
            resize_timeout_s=_int(
                ip["resize_timeout_s"], f"{ipath}.resize_timeout_s", minimum=1, unit="seconds"
            ),
        )
        for key, rname, limit in (
            ("max_cpu", CPU, ippr.max_cpu),
            ("max_memory", MEMORY, ippr.max_memory),
        ):
            size = resources.get_units(rname)
            if limit < size:
                raise _bad(
                    f"{ipath}.{key}",
                    ip[key],
                    f"is below the group's resources.{rname} {ray_amount_text(size, rname)}",
                    f"at least {ray_amount_text(size, rname)} (a pod starts at its group's size)",
                )
    min_w = _int(g.get("min_workers", 0), f"{path}.min_workers")
    max_raw = g.get("max_workers")
    max_w = None if max_raw is None else _int(max_raw, f"{path}.max_workers", or_null="for no cap")
    if max_w is not None and min_w > max_w:
        raise _bad(
            f"{path}.min_workers",
            g["min_workers"],
            f"is above max_workers {max_w}",
            f"at most {max_w}",
        )
    return GroupSpec(
        name=name,
        resources=resources,
        min_workers=min_w,
        max_workers=max_w,
        labels=_labels(g.get("labels"), f"{path}.labels"),
        ippr=ippr,
        is_head=name == HEAD_GROUP,
    )


def _group_of(value: object, path: str, groups: Mapping[str, GroupSpec]) -> str:
    group = _str(value, path)
    if group in groups or group == HEAD_GROUP:
        return group
    names = [*groups, *([] if HEAD_GROUP in groups else [HEAD_GROUP])]
    guess = _closest(group, names)
    if guess is not None:
        raise _fail(path, f"{group!r} is not in groups (did you mean {guess!r}?)")
    listed = ", ".join(groups) or "none"
    raise _bad(
        path,
        group,
        f"is not in groups ({listed})",
        f"one of them, or {HEAD_GROUP!r} for the head pod",
    )


def _pod(i: int, raw: object, groups: dict[str, GroupSpec], seen: dict[str, int]) -> PodView:
    path = f"pods[{i}]"
    p = _obj(raw, path)
    _keys(p, path, POD_KEYS)
    name = _str(p.get("name"), f"{path}.name")
    if name in seen:
        raise _fail(
            f"{path}.name",
            f"{name!r} appears twice (also pods[{seen[name]}]); expected unique pod names",
        )
    seen[name] = i
    group = _group_of(p.get("group"), f"{path}.group", groups)
    if "total" not in p:
        raise _missing(
            f"{path}.total",
            'the Ray resources the pod has, like {"CPU": 1, "memory": 2147483648}',
        )
    total = _resources(p["total"], f"{path}.total")
    if group not in groups:  # the head pod, with no group entry: its group is its size
        groups[HEAD_GROUP] = GroupSpec(name=HEAD_GROUP, resources=total, is_head=True)
    phase = PodPhase(_enum(p.get("phase", "running"), f"{path}.phase", _POD_PHASES))
    raylet = p.get("raylet_id")
    if raylet is not None:
        raylet = _str(raylet, f"{path}.raylet_id")
        if phase == PodPhase.PENDING:
            raise _bad(
                f"{path}.raylet_id",
                raylet,
                "is set on a pending pod",
                'null: a pending pod has no Raylet yet (or "phase": "running")',
            )
    available = total
    if "available" in p:
        available = _resources(p["available"], f"{path}.available")
        for rname, units in available.items():
            if units > total.get_units(rname):
                held = ray_amount_text(total.get_units(rname), rname)
                given = ray_amount_text(units, rname)
                raise _fail(
                    f"{path}.available.{rname}",
                    f"{given} exceeds total {held}; expected at most {held}",
                )
    resize = None
    sug_cpu = sug_mem = None
    failed = False
    if p.get("resize") is not None:
        rpath = f"{path}.resize"
        r = _obj(p["resize"], rpath)
        _keys(r, rpath, RESIZE_KEYS)
        state = KubeletResizeState(
            _enum(r.get("state", "in_progress"), f"{rpath}.state", _RESIZE_STATES)
        )
        if r.get("suggested_max_cpu") is not None:
            sug_cpu = _cores(r["suggested_max_cpu"], f"{rpath}.suggested_max_cpu")
        if r.get("suggested_max_memory") is not None:
            sug_mem = _int(r["suggested_max_memory"], f"{rpath}.suggested_max_memory", unit="bytes")
        failed = _bool(r.get("failed", False), f"{rpath}.failed") or state in (
            KubeletResizeState.ERROR,
            KubeletResizeState.TIMED_OUT,
        )
        if "cpu" in r or "memory" in r:
            resize = PodResize(
                cpu=_cores(r["cpu"], f"{rpath}.cpu") if "cpu" in r else total.cpu,
                memory=(
                    _int(r["memory"], f"{rpath}.memory", unit="bytes")
                    if "memory" in r
                    else total.memory
                ),
                state=state,
            )
    return PodView(
        name=name,
        group=group,
        phase=phase,
        raylet_id=raylet,
        total=total,
        available=available,
        idle_s=_num(p.get("idle_s", 0), f"{path}.idle_s", unit="seconds"),
        labels=_labels(p.get("labels"), f"{path}.labels"),
        resize=resize,
        suggested_max_cpu=sug_cpu,
        suggested_max_memory=sug_mem,
        failed=failed,
    )


def _shape(entry: Mapping[str, Any], path: str, what: str) -> Resources:
    if "shape" not in entry:
        raise _missing(f"{path}.shape", f'the resources {what}, like {{"CPU": 1}}')
    return _resources(entry["shape"], f"{path}.shape")


def _demand(i: int, raw: object) -> Demand:
    path = f"demands[{i}]"
    d = _obj(raw, path)
    _keys(d, path, DEMAND_KEYS)
    return Demand(
        shape=_shape(d, path, "one task or actor asks for"),
        count=_int(d.get("count", 1), f"{path}.count", minimum=1),
        label_selector=_selector(d.get("label_selector"), f"{path}.label_selector"),
    )


def _gang(i: int, raw: object) -> Gang:
    path = f"gangs[{i}]"
    g = _obj(raw, path)
    _keys(g, path, GANG_KEYS)
    if "bundles" not in g:
        raise _missing(f"{path}.bundles", 'a list of bundles, like [{"CPU": 1}, {"CPU": 1}]')
    bundles = []
    for j, b in enumerate(_list(g["bundles"], f"{path}.bundles")):
        bundle = _resources(b, f"{path}.bundles[{j}]")
        if not bundle:
            raise _fail(
                f"{path}.bundles[{j}]",
                'is empty; expected at least one non-zero resource, like {"CPU": 1} '
                "(Ray refuses empty bundles)",
            )
        bundles.append(bundle)
    if not bundles:
        raise _fail(
            f"{path}.bundles",
            'is empty; expected at least one bundle, like [{"CPU": 1}]',
        )
    selectors = tuple(
        _selector(s, f"{path}.bundle_selectors[{j}]")
        for j, s in enumerate(_list(g.get("bundle_selectors", []), f"{path}.bundle_selectors"))
    )
    if selectors and len(selectors) != len(bundles):
        raise _fail(
            f"{path}.bundle_selectors",
            f"has {len(selectors)} selector(s) for {len(bundles)} bundle(s); expected one per "
            "bundle ({} for none), or no bundle_selectors",
        )
    return Gang(
        bundles=tuple(bundles),
        strategy=GangStrategy(
            _enum(g.get("strategy", "PACK"), f"{path}.strategy", _GANG_STRATEGIES)
        ),
        count=_int(g.get("count", 1), f"{path}.count", minimum=1),
        bundle_selectors=selectors,
    )


def _constraint(i: int, raw: object) -> Constraint:
    path = f"constraints[{i}]"
    c = _obj(raw, path)
    _keys(c, path, CONSTRAINT_KEYS)
    return Constraint(
        shape=_shape(c, path, "one requested bundle holds"),
        count=_int(c.get("count", 1), f"{path}.count", minimum=1),
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ScenarioError(
                f"key {key!r} appears twice in one object; JSON keeps only the last, so "
                "give it once"
            )
        out[key] = value
    return out


def parse_scenario_json(text: str) -> object:
    """`json.loads`, but a key given twice in one object is refused, not silently dropped."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def load_scenario(doc: object, base: PlannerSettings | None = None) -> ClusterSnapshot:
    """Build a snapshot from a parsed scenario document."""
    root = _obj(doc, "scenario")
    _keys(root, "scenario", ROOT_KEYS)
    if "version" not in root:
        raise _missing("version", "1 (this reads version 1 of bench/SCENARIO.md)")
    version = root["version"]
    if version != 1 or isinstance(version, bool):
        raise _fail("version", f"{version!r} is not supported; this reads version 1")
    name = _str(root.get("name", "scenario"), "name")
    settings = _settings(root, base or PlannerSettings())
    if "groups" not in root:
        raise _missing("groups", "an object of worker groups by name (bench/SCENARIO.md)")
    groups = {g: _group(g, raw) for g, raw in _obj(root["groups"], "groups").items()}
    seen: dict[str, int] = {}
    pods = tuple(
        _pod(i, raw, groups, seen) for i, raw in enumerate(_list(root.get("pods", []), "pods"))
    )
    heads = [i for i, p in enumerate(pods) if p.group == HEAD_GROUP]
    if len(heads) > 1:
        raise _fail(
            f"pods[{heads[1]}].group",
            f"{HEAD_GROUP!r} again (pods[{heads[0]}] is the head pod); expected one head pod",
        )
    snapshot = ClusterSnapshot(
        name=name,
        groups=groups,
        pods=pods,
        demands=tuple(
            _demand(i, d) for i, d in enumerate(_list(root.get("demands", []), "demands"))
        ),
        gangs=tuple(_gang(i, g) for i, g in enumerate(_list(root.get("gangs", []), "gangs"))),
        constraints=tuple(
            _constraint(i, c)
            for i, c in enumerate(_list(root.get("constraints", []), "constraints"))
        ),
        settings=settings,
    )
    units = plan_units(snapshot)
    if units > MAX_PLAN_UNITS:
        raise ScenarioError(
            f"demands, gangs, constraints: {units} units in all (counts × bundles); one plan "
            f"places at most {MAX_PLAN_UNITS} (bench/SCENARIO.md, Limits): lower the counts"
        )
    return snapshot


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


__all__ = ["ScenarioError", "load_scenario", "parse_scenario_json", "plan_to_json"]
