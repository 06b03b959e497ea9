"""Exact resources: Kubernetes quantities and Ray floats in, integers out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.resources import (
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


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4 cores", "'4 cores' is not a quantity"),
        ("-1", "'-1' is negative"),
        (-1, "-1 is negative"),
        ("1.5.2Gi", "'1.5.2Gi' is not a quantity"),
        (float("nan"), "nan is not a finite number"),
        (float("inf"), "inf is not a finite number"),
        ("1e400", "has an exponent out of range"),
        ("99999999999999999999Ei", "is too large"),
        ("", "'' is not a quantity"),
        (" 4", "' 4' is not a quantity"),
        ("4gi", "'4gi' is not a quantity"),
        ("Gi", "'Gi' is not a quantity"),
        (True, "True is a boolean"),
        ([4], "has type list"),
        (None, "has type NoneType"),
    ],
)
def test_garbage_is_rejected_quoting_the_value_and_what_is_accepted(
    value: object, message: str
) -> None:
    with pytest.raises(QuantityError) as info:
        quantity_to_units(value, MEMORY, what="max-memory")
    text = str(info.value)
    assert text.startswith("max-memory: ")
    assert message in text
    if "too large" not in text:
        assert "Kubernetes quantity" in text or "finite" in text or "exponent" in text


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
    with pytest.raises(QuantityError, match="is negative"):
        float_to_units(-0.5, CPU)
    with pytest.raises(QuantityError, match="not a finite number"):
        float_to_units(math.nan, CPU)
    with pytest.raises(QuantityError, match="not a number"):
        float_to_units("2", CPU)


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
