"""Exact resource amounts.

Every amount is a fixed-point integer: CPU in millicores, memory in bytes, every other
Ray resource (GPU, custom resources) in 1/10000 units, Ray's own granularity. Floats
appear only at the edges: Kubernetes quantities and Ray's float resource maps are
converted here, once, and arithmetic is done on integers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

CPU = "CPU"
MEMORY = "memory"

CPU_SCALE = 1000  # millicores per core
MEMORY_SCALE = 1  # bytes
OTHER_SCALE = 10_000  # Ray's resource granularity

# Kubernetes stores quantities as int64 in their canonical unit; anything above is an error.
MAX_UNITS = 2**63 - 1

GIB = 1024**3
MIB = 1024**2


class QuantityError(ValueError):
    """A Kubernetes quantity or Ray amount that cannot be used."""


def scale_of(name: str) -> int:
    if name == CPU:
        return CPU_SCALE
    if name == MEMORY:
        return MEMORY_SCALE
    return OTHER_SCALE


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# Kubernetes' quantity grammar: <signedNumber><suffix>, where the number is
# digits[.digits] (either side may be empty, not both) and the suffix is binary SI,
# decimal SI or a decimal exponent (e|E followed by a signed integer).
_QUANTITY_RE = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)

_ACCEPTED = (
    "a non-negative Kubernetes quantity: a number with an optional suffix "
    "(m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent (e.g. 1e3), "
    'like "1500m", "2", "8Gi"'
)


def parse_quantity(value: object, *, what: str = "quantity") -> Decimal:
    """Parse a Kubernetes quantity (string or plain number) into an exact Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"{what}: {value!r} is a boolean; expected {_ACCEPTED}")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{what}: {value!r} is not a finite number; expected {_ACCEPTED}")
        number = Decimal(repr(value))
    elif isinstance(value, str):
        text = value.strip()
        m = _QUANTITY_RE.match(text)
        if m is None or text != value:
            raise QuantityError(f"{what}: {value!r} is not a quantity; expected {_ACCEPTED}")
        try:
            number = Decimal(m.group("num"))
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
            raise QuantityError(
                f"{what}: {value!r} is not a quantity; expected {_ACCEPTED}"
            ) from exc
        if m.group("bin"):
            number *= _BINARY[m.group("bin")]
        elif m.group("exp"):
            exponent = int(m.group("exp")[1:])
            if abs(exponent) > 40:
                raise QuantityError(
                    f"{what}: {value!r} has an exponent out of range; expected {_ACCEPTED}"
                )
            number = number.scaleb(exponent)
        else:
            number *= _DECIMAL[m.group("dec") or ""]
        if m.group("sign") == "-" and number != 0:
            number = -number
    else:
        raise QuantityError(
            f"{what}: {value!r} has type {type(value).__name__}; expected {_ACCEPTED}"
        )
    if number < 0:
        raise QuantityError(f"{what}: {value!r} is negative; expected {_ACCEPTED}")
    return number


def quantity_to_units(value: object, name: str, *, what: str | None = None) -> int:
    """Kubernetes quantity → integer units of resource `name`, rounded up like Kubernetes."""
    label = what or name
    number = parse_quantity(value, what=label)
    units = int((number * scale_of(name)).to_integral_value(rounding=ROUND_CEILING))
    if units > MAX_UNITS:
        raise QuantityError(
            f"{label}: {value!r} is too large; expected a Kubernetes quantity of at most "
            f"{MAX_UNITS} {unit_name(name)}"
        )
    return units


def unit_name(name: str) -> str:
    return {CPU: "millicores", MEMORY: "bytes"}.get(name, "1/10000 units")


def units_to_quantity(units: int, name: str) -> str:
    """Integer units → the canonical Kubernetes quantity string ("1500m", "2", "8Gi")."""
    if units < 0:
        raise QuantityError(
            f"{name}: {units} is negative; expected a non-negative number of {unit_name(name)}"
        )
    if name == CPU:
        return str(units // CPU_SCALE) if units % CPU_SCALE == 0 else f"{units}m"
    if name == MEMORY:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            factor = _BINARY[suffix]
            if units and units % factor == 0:
                return f"{units // factor}{suffix}"
        return str(units)
    scale = OTHER_SCALE
    if units % scale == 0:
        return str(units // scale)
    return format(Decimal(units) / scale, "f")


def ray_unit(name: str) -> str:
    """What one Ray float unit of `name` is: cores, bytes, or plain units."""
    return {CPU: "cores", MEMORY: "bytes"}.get(name, "units")


def ray_amount_text(units: int, name: str) -> str:
    """Units as exact Ray amount text, without trailing zeros: 1500 millicores → "1.5"."""
    text = format(Decimal(units) / scale_of(name), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def max_ray_amount(name: str) -> str:
    """The largest Ray float amount of `name` that fits in `MAX_UNITS`, as exact text."""
    return ray_amount_text(MAX_UNITS, name)


def ray_accepted(name: str) -> str:
    """What a Ray float amount of `name` may be, for error messages."""
    return f"a non-negative number of {ray_unit(name)}"


def _ray_amount_error(label: str, value: object, problem: str, accepted: str) -> QuantityError:
    """The error for a refused Ray float amount (its text is built only then)."""
    return QuantityError(f"{label}: {value!r} {problem}; expected {accepted}")


def float_to_units(
    value: object, name: str, *, what: str | None = None, accepted: str | None = None
) -> int:
    """A Ray float amount → integer units; values between two units round up.

    `accepted` replaces `ray_accepted(name)` in the message for a value that is not a
    number, not finite or negative (a caller that needs a positive amount says so); a value
    too large for `MAX_UNITS` is always told Ray's range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _ray_amount_error(
            what or name, value, "is not a number", accepted or ray_accepted(name)
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise _ray_amount_error(
            what or name, value, "is not a finite number", accepted or ray_accepted(name)
        )
    if value < 0:
        raise _ray_amount_error(what or name, value, "is negative", accepted or ray_accepted(name))
    scaled = value * scale_of(name)
    if isinstance(scaled, int):  # exact, and an int past float's range must not reach a float
        units = scaled
    else:
        nearest = round(scaled)
        units = (
            int(nearest)
            if abs(scaled - nearest) < 1e-6 * max(1.0, abs(scaled))
            else math.ceil(scaled)
        )
    if units > MAX_UNITS:
        raise _ray_amount_error(
            what or name,
            value,
            "is too large",
            f"{ray_accepted(name)}, at most {max_ray_amount(name)}",
        )
    return units


def units_to_float(units: int, name: str) -> float:
    if name == MEMORY:
        return float(units)
    return units / scale_of(name)


class Resources(Mapping[str, int]):
    """An immutable map of resource name → integer units. Zero amounts are dropped."""

    __slots__ = ("_hash", "_items")

    def __init__(self, units: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        pairs = units.items() if isinstance(units, Mapping) else units
        items: dict[str, int] = {}
        for name, amount in pairs:
            if not isinstance(amount, int) or isinstance(amount, bool):
                raise TypeError(f"{name}: units must be int, got {amount!r}")
            if amount:
                items[name] = amount
        self._items = dict(sorted(items.items()))
        self._hash: int | None = None

    # --- constructors -------------------------------------------------------------
    @classmethod
    def of(cls, *, cpu: int = 0, memory: int = 0, **others: int) -> Resources:
        """From raw units: millicores, bytes, 1/10000 units."""
        return cls({CPU: cpu, MEMORY: memory, **others})

    @classmethod
    def from_ray(cls, amounts: Mapping[str, object], *, what: str = "resources") -> Resources:
        """From Ray's float map ({"CPU": 2.0, "memory": 2147483648, "GPU": 1})."""
        if not isinstance(amounts, Mapping):
            raise QuantityError(
                f"{what}: expected an object of resource name → amount, got {amounts!r}"
            )
        return cls(
            {str(n): float_to_units(v, str(n), what=f"{what}.{n}") for n, v in amounts.items()}
        )

    @classmethod
    def from_k8s(cls, quantities: Mapping[str, object], *, what: str = "resources") -> Resources:
        """From a Kubernetes resource list ({"cpu": "1500m", "memory": "8Gi"})."""
        out: dict[str, int] = {}
        for key, value in quantities.items():
            name = {"cpu": CPU, "memory": MEMORY}.get(key)
            if name is None:
                continue  # ephemeral-storage, hugepages, extended resources: not Ray's
            out[name] = quantity_to_units(value, name, what=f"{what}.{key}")
        return cls(out)

    # --- views ------------------------------------------------------------------------
    @property
    def cpu(self) -> int:
        return self._items.get(CPU, 0)

    @property
    def memory(self) -> int:
        return self._items.get(MEMORY, 0)

    def to_ray(self) -> dict[str, float | int]:
        return {n: (v if n == MEMORY else units_to_float(v, n)) for n, v in self._items.items()}

    def to_k8s(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if CPU in self._items:
            out["cpu"] = units_to_quantity(self._items[CPU], CPU)
        if MEMORY in self._items:
            out["memory"] = units_to_quantity(self._items[MEMORY], MEMORY)
        return out

    # --- arithmetic -------------------------------------------------------------------
    def __add__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._items)
        for n, v in other.items():
            out[n] = out.get(n, 0) + v
        return Resources(out)

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._items)
        for n, v in other.items():
            out[n] = out.get(n, 0) - v
        return Resources(out)

    def scale(self, factor: int) -> Resources:
        return Resources({n: v * factor for n, v in self._items.items()})

    def fits(self, capacity: Mapping[str, int]) -> bool:
        """True when every amount here is at most the same amount in `capacity`."""
        return all(capacity.get(n, 0) >= v for n, v in self._items.items())

    def clamp_min(self, floor: int = 0) -> Resources:
        return Resources({n: max(v, floor) for n, v in self._items.items()})

    def with_amount(self, name: str, units: int) -> Resources:
        out = dict(self._items)
        out[name] = units
        return Resources(out)

    def is_negative(self) -> bool:
        return any(v < 0 for v in self._items.values())

    # --- Mapping protocol -------------------------------------------------------------
    def __getitem__(self, name: str) -> int:
        return self._items[name]

    def get_units(self, name: str) -> int:
        return self._items.get(name, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Resources):
            return self._items == other._items
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._items.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"Resources({self.describe()})"

    def describe(self) -> str:
        """Human text in Ray's units: "{CPU: 2, memory: 4Gi}"."""
        parts = []
        for n, v in self._items.items():
            if n == MEMORY:
                parts.append(f"{n}: {units_to_quantity(v, MEMORY) if v >= 0 else v}")
            else:
                f = units_to_float(v, n)
                parts.append(f"{n}: {int(f) if f == int(f) else f}")
        return "{" + ", ".join(parts) + "}"

    # --- pydantic integration: serialised as Ray's float map --------------------------
    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: object) -> Resources:
            if isinstance(value, Resources):
                return value
            if isinstance(value, Mapping):
                return cls.from_ray(value)
            raise QuantityError(f"expected a resource map, got {value!r}")

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda r: r.to_ray(), when_used="always"
            ),
        )


EMPTY = Resources()


def size_text(cpu: int, memory: int) -> str:
    """`1.5 CPU/2Gi`: a pod's size (CPU in millicores, memory in bytes), as decisions, logs
    and the Temporal UI say it."""
    cores = units_to_float(cpu, CPU)
    mem = Resources({MEMORY: memory}).to_k8s().get("memory", "0")
    return f"{int(cores) if cores == int(cores) else cores} CPU/{mem}"
