"""Exact resources: Kubernetes quantities and Ray floats in, integers out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raysize.workflows.resources import (
    CPU,
    GIB,
    MEMORY,
    QuantityError,
    Resources,
    float_to_units,
    quantity_to_units,
    units_to_quantity,
)


@pytest.mark.parametrize(
    ("value", "name", "units"),
    [
        ("1500m", CPU, 1500),
        ("2", CPU, 2000),
        (2, CPU, 2000),
        (0.5, CPU, 500),
        ("0.1", CPU, 100),
        (".5", CPU, 500),
        ("1.", CPU, 1000),
        ("500000000n", CPU, 500),
        ("250000u", CPU, 250),
        ("1e3", CPU, 1_000_000),
        ("1E-3", CPU, 1),
        ("0.0001", CPU, 1),  # Kubernetes rounds CPU up to the millicore
        ("8Gi", MEMORY, 8 * GIB),
        ("512Mi", MEMORY, 512 * 1024**2),
        ("1Ki", MEMORY, 1024),
        ("1Ti", MEMORY, 1024**4),
        ("1Pi", MEMORY, 1024**5),
        ("1Ei", MEMORY, 1024**6),
        ("1k", MEMORY, 1000),
        ("1M", MEMORY, 10**6),
        ("1G", MEMORY, 10**9),
        ("1T", MEMORY, 10**12),
        ("1P", MEMORY, 10**15),
        ("1E", MEMORY, 10**18),
        ("1.5Gi", MEMORY, 3 * GIB // 2),
        ("129e6", MEMORY, 129_000_000),
        ("+4", CPU, 4000),
        (2147483648, MEMORY, 2 * GIB),
        ("0", CPU, 0),
        ("1", "GPU", 10_000),
        ("0.25", "TPU", 2_500),
    ],
)
def test_quantities_parse_to_exact_units(value: object, name: str, units: int) -> None:
    assert quantity_to_units(value, name) == units


ACCEPTED = (
    "expected a non-negative Kubernetes quantity: a number with an optional suffix "
    "(m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent (e.g. 1e3), "
    'like "1500m", "2", "8Gi"'
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4 cores", f"max-memory: '4 cores' is not a quantity; {ACCEPTED}"),
        ("-1", f"max-memory: '-1' is negative; {ACCEPTED}"),
        (-1, f"max-memory: -1 is negative; {ACCEPTED}"),
        ("1.5.2Gi", f"max-memory: '1.5.2Gi' is not a quantity; {ACCEPTED}"),
        (float("nan"), f"max-memory: nan is not a finite number; {ACCEPTED}"),
        (float("inf"), f"max-memory: inf is not a finite number; {ACCEPTED}"),
        ("1e400", f"max-memory: '1e400' has an exponent out of range; {ACCEPTED}"),
        (
            "99999999999999999999Ei",
            "max-memory: '99999999999999999999Ei' is too large; expected a Kubernetes quantity "
            "of at most 9223372036854775807 bytes",
        ),
        ("", f"max-memory: '' is not a quantity; {ACCEPTED}"),
        (" 4", f"max-memory: ' 4' is not a quantity; {ACCEPTED}"),
        ("4gi", f"max-memory: '4gi' is not a quantity; {ACCEPTED}"),
        ("Gi", f"max-memory: 'Gi' is not a quantity; {ACCEPTED}"),
        (True, f"max-memory: True is a boolean; {ACCEPTED}"),
        ([4], f"max-memory: [4] has type list; {ACCEPTED}"),
        (None, f"max-memory: None has type NoneType; {ACCEPTED}"),
    ],
)
def test_garbage_is_rejected_quoting_the_value_and_what_is_accepted(
    value: object, message: str
) -> None:
    with pytest.raises(QuantityError) as info:
        quantity_to_units(value, MEMORY, what="max-memory")
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("value", "name", "message"),
    [
        (
            -0.5,
            CPU,
            "demands[0].shape.CPU: -0.5 is negative; expected a non-negative number of cores",
        ),
        (
            1e300,
            CPU,
            "demands[0].shape.CPU: 1e+300 is too large; expected a non-negative number of "
            "cores, at most 9223372036854775.807",
        ),
        (
            2**63,
            MEMORY,
            "demands[0].shape.memory: 9223372036854775808 is too large; expected a "
            "non-negative number of bytes, at most 9223372036854775807",
        ),
        (
            1e16,
            "GPU",
            "demands[0].shape.GPU: 1e+16 is too large; expected a non-negative number of "
            "units, at most 922337203685477.5807",
        ),
        (
            math.nan,
            CPU,
            "demands[0].shape.CPU: nan is not a finite number; expected a non-negative "
            "number of cores",
        ),
        (
            math.inf,
            MEMORY,
            "demands[0].shape.memory: inf is not a finite number; expected a non-negative "
            "number of bytes",
        ),
        (
            "2",
            CPU,
            "demands[0].shape.CPU: '2' is not a number; expected a non-negative number of cores",
        ),
        (
            True,
            "GPU",
            "demands[0].shape.GPU: True is not a number; expected a non-negative number of units",
        ),
        (
            None,
            "TPU",
            "demands[0].shape.TPU: None is not a number; expected a non-negative number of units",
        ),
    ],
)
def test_bad_ray_amounts_are_rejected_quoting_the_value_and_what_is_accepted(
    value: object, name: str, message: str
) -> None:
    with pytest.raises(QuantityError) as info:
        float_to_units(value, name, what=f"demands[0].shape.{name}")
    assert str(info.value) == message


def test_every_other_rejection_says_what_is_accepted() -> None:
    with pytest.raises(QuantityError) as info:
        quantity_to_units("99999999999999999999", CPU, what="--cpu")
    assert str(info.value) == (
        "--cpu: '99999999999999999999' is too large; expected a Kubernetes quantity of at "
        "most 9223372036854775807 millicores"
    )
    with pytest.raises(QuantityError) as info:
        units_to_quantity(-1, CPU)
    assert str(info.value) == "CPU: -1 is negative; expected a non-negative number of millicores"
    with pytest.raises(QuantityError) as info:
        Resources.from_ray([1], what="total")  # type: ignore[arg-type]
    assert str(info.value) == "total: expected an object of resource name → amount, got [1]"


@pytest.mark.parametrize(
    ("units", "name", "text"),
    [
        (1500, CPU, "1500m"),
        (2000, CPU, "2"),
        (8 * GIB, MEMORY, "8Gi"),
        (3 * GIB // 2, MEMORY, "1536Mi"),
        (1000, MEMORY, "1000"),
        (15_000, "GPU", "1.5"),
    ],
)
def test_units_render_as_canonical_quantities(units: int, name: str, text: str) -> None:
    assert units_to_quantity(units, name) == text
    assert quantity_to_units(text, name) == units


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from([CPU, MEMORY, "GPU"]))
def test_quantity_round_trip_is_exact(units: int, name: str) -> None:
    assert quantity_to_units(units_to_quantity(units, name), name) == units


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from([CPU, MEMORY, "GPU", "x"]))
def test_ray_float_round_trip_is_exact(units: int, name: str) -> None:
    r = Resources({name: units})
    assert Resources.from_ray(r.to_ray()) == r


def test_ray_floats_round_to_the_nearest_unit_and_up_between_units() -> None:
    assert float_to_units(0.1, CPU) == 100
    assert float_to_units(0.30000000000000004, CPU) == 300
    assert float_to_units(0.0005, CPU) == 1  # half a millicore still needs one


def test_arithmetic_is_exact_and_drops_zeros() -> None:
    a = Resources.of(cpu=1500, memory=2 * GIB)
    b = Resources.of(cpu=500, memory=GIB, GPU=10_000)
    assert (a + b) == Resources.of(cpu=2000, memory=3 * GIB, GPU=10_000)
    assert (a - Resources.of(cpu=1500)) == Resources.of(memory=2 * GIB)
    assert CPU not in (a - Resources.of(cpu=1500))
    assert b.scale(3) == Resources.of(cpu=1500, memory=3 * GIB, GPU=30_000)
    assert Resources.of(cpu=1000).fits(a)
    assert not b.fits(a)  # a has no GPU
    assert (a - b).is_negative()  # a has no GPU to give
    assert not (a - Resources.of(cpu=1500, memory=GIB)).is_negative()


def test_kubernetes_resource_lists_convert_both_ways() -> None:
    r = Resources.from_k8s({"cpu": "1500m", "memory": "8Gi", "ephemeral-storage": "1Gi"})
    assert r == Resources.of(cpu=1500, memory=8 * GIB)
    assert r.to_k8s() == {"cpu": "1500m", "memory": "8Gi"}
    with pytest.raises(QuantityError, match=r"limits\.cpu: '2 cores'"):
        Resources.from_k8s({"cpu": "2 cores"}, what="limits")


def test_resources_describe_in_ray_units() -> None:
    assert Resources.of(cpu=2000, memory=4 * GIB).describe() == "{CPU: 2, memory: 4Gi}"
    assert Resources.of(cpu=500).describe() == "{CPU: 0.5}"
