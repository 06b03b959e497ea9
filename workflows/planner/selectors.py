"""Label selectors in Ray's syntax ("v", "!v", "in(a,b)", "!in(a,b)"), and the resource
names only a placement group's bundle offers."""

from __future__ import annotations

import re
from collections.abc import Mapping

from raysize.workflows.model import Demand

# a label selector, sorted: ((key, expression), ...)
Selector = tuple[tuple[str, str], ...]

# Ray names a placement group's resources `<name>_group_<pg id>` and
# `<name>_group_<bundle index>_<pg id>` (ray/_private/utils.py); the id is hex
_PG_RESOURCE = re.compile(r"^.+_group_(?:\d+_)?[0-9a-fA-F]{16,}$")


def is_placement_group_resource(name: str) -> bool:
    """A resource only a placement group's bundle offers (`CPU_group_0_<id>`, ...)."""
    return bool(_PG_RESOURCE.match(name))


def in_placement_group(d: Demand) -> bool:
    """A task waiting inside a placement group: its bundle already holds its room."""
    return any(is_placement_group_resource(name) for name in d.shape)


def _value_matches(expr: str, actual: str | None) -> bool:
    negate = expr.startswith("!")
    body = expr[1:] if negate else expr
    if body.startswith("in(") and body.endswith(")"):
        ok = actual is not None and actual in {v.strip() for v in body[3:-1].split(",")}
    else:
        ok = actual == body
    return not ok if negate else ok


def selector_matches(selector: Mapping[str, str] | Selector, labels: Mapping[str, str]) -> bool:
    items = selector.items() if isinstance(selector, Mapping) else selector
    return all(_value_matches(expr, labels.get(key)) for key, expr in items)
