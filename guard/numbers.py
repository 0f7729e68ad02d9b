"""How a harness rounds a number, in one place that loads nothing (guard.record re-exports it)."""

from __future__ import annotations

import math

__all__ = ["round_half_up"]


def round_half_up(value: float) -> int:
    """Rust's `f64::round` for a non-negative value, which is how the harnesses round a percent.

    Python's `round` rounds halves to even, and `floor(x + 0.5)` is wrong just below a half.
    """
    whole = math.floor(value)
    return whole + 1 if value - whole >= 0.5 else whole
