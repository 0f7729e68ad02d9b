"""The meter's tints and a percent as the readers print it: amber at 80%, red at 95%, colour only on
a terminal. Stdlib only, so the status line (`hctx status`) starts without the renderer's imports;
wrapper.readers.render re-exports all of it."""

from __future__ import annotations

import os
from typing import IO, Literal

from guard.numbers import round_half_up

__all__ = [
    "AMBER_PERCENT",
    "PERCENT_DIGITS_LIMIT",
    "RED_PERCENT",
    "Tint",
    "colour_enabled",
    "paint",
    "percent_text",
    "percent_tint",
]

Tint = Literal["amber", "red"] | None
AMBER_PERCENT = 80
RED_PERCENT = 95
_SGR = {"amber": "\x1b[33m", "red": "\x1b[31m"}
_RESET = "\x1b[0m"
PERCENT_DIGITS_LIMIT = 100_000


def colour_enabled(stream: IO[str], environ: dict[str, str] | None = None) -> bool:
    """Colour on a terminal only, and never when NO_COLOR is set (https://no-color.org) or TERM=dumb."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def percent_tint(percent: float | None) -> Tint:
    if percent is None:
        return None
    if percent >= RED_PERCENT:
        return "red"
    if percent >= AMBER_PERCENT:
        return "amber"
    return None


def paint(text: str, tint: Tint, colour: bool) -> str:
    if not colour or tint is None or not text:
        return text
    return f"{_SGR[tint]}{text}{_RESET}"


def percent_text(percent: float) -> str:
    """Rounded for width, never clamped: 585.6 is 586%; past five digits in exponent form (1e+308%),
    so a planted number cannot print hundreds of digits."""
    if not -PERCENT_DIGITS_LIMIT < percent < PERCENT_DIGITS_LIMIT:
        return f"{percent:.0e}%"
    return f"{round_half_up(percent)}%"
