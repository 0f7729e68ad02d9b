"""Argument types shared by every `hctx` command: one message each for a number that will not do."""

from __future__ import annotations

import argparse
import math

__all__ = [
    "harness_name",
    "non_negative",
    "positive_seconds",
    "whole_number",
]


def whole_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 0")
    return int(text)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def non_negative(text: str) -> float:
    if not _finite(text) >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number")
    return float(text)


def positive_seconds(text: str) -> float:
    if not _finite(text) > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return float(text)


def harness_name(text: str) -> str:
    """A harness the registry knows (the built-in table, then the registered ones)."""
    from guard.errors import UnknownHarness
    from sidecar.registry import spec_for

    try:
        return spec_for(text).name
    except UnknownHarness as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
