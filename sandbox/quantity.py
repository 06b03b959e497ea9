"""Canonical quantity strings, as the API server stores them ("1000m" → "1", "0.5Gi" → "512Mi")."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal

from raysize.workflows.resources import QuantityError, parse_quantity

_SUFFIX_RE = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei)$|[eE][+-]?[0-9]+$")
_DECIMAL_SUFFIXES = [(18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, "")]
_SMALL_SUFFIXES = [(-3, "m"), (-6, "u"), (-9, "n")]
_BINARY_SUFFIXES = [(60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")]


def canonical(value: object) -> str:
    """The canonical form of a quantity; raises `QuantityError` for a malformed one."""
    number = parse_quantity(value)
    text = str(value)
    m = _SUFFIX_RE.search(text) if isinstance(value, str) else None
    # Kubernetes keeps at most nano precision, rounding up.
    number = (number * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING) / Decimal(
        10
    ) ** 9
    if m is not None and m.group(1) and number == number.to_integral_value() and number >= 1024:
        units = int(number)
        for shift, suffix in _BINARY_SUFFIXES:
            if units % (1 << shift) == 0:
                return f"{units >> shift}{suffix}"
        return str(units)
    exponent_form = m is not None and not m.group(1)
    if number == 0:
        return "0"
    for exp, suffix in _DECIMAL_SUFFIXES + _SMALL_SUFFIXES:
        scaled = number / (Decimal(10) ** exp)
        if scaled == scaled.to_integral_value():
            mantissa = int(scaled)
            if exponent_form:
                return f"{mantissa}e{exp}" if exp else str(mantissa)
            return f"{mantissa}{suffix}"
    raise QuantityError(f"{value!r}: cannot be represented")  # pragma: no cover


def sum_of(values: list[str]) -> str:
    """The canonical sum of quantities, in the first one's format (binary `Mi`/`Gi` stays
    binary), as `resource.Quantity.Add` keeps the receiver's format."""
    total = sum((parse_quantity(v) for v in values), Decimal(0))
    binary = bool(values) and bool((m := _SUFFIX_RE.search(str(values[0]))) and m.group(1))
    if binary and total == total.to_integral_value() and int(total) % 1024 == 0:
        return canonical(f"{int(total) // 1024}Ki")
    return canonical(str(total))
