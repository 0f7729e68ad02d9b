"""Hostile input shared by the producers' fault tests: arbitrary JSON, and the numbers in it."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)

# What a numeric field may hold in a hostile frame: huge, negative, non-finite, or not a number.
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.integers(min_value=0, max_value=300_000),
)


def numbers_in(value: Any) -> set[float]:
    """Every number anywhere in a JSON value: what a producer may publish, and nothing else."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int | float):
        return {value}
    if isinstance(value, dict):
        return {n for item in value.values() for n in numbers_in(item)}
    if isinstance(value, list):
        return {n for item in value for n in numbers_in(item)}
    return set()
