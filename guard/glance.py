"""The record at a glance: the few fields a status bar shows, read with the stdlib's json.

`hctx status` runs every few seconds in a tmux status line or a waybar module, so it must start about
as fast as the interpreter: pydantic alone costs it ~100 ms. A `Glance` holds the fields the line
needs, under the record's own names (guard.record is the one definition: tests/test_status.py derives
each name here from its models and asserts they are the same), and `glance` applies the record's own
rules to those fields: an accepted schema, a harness the registry knows, a finite percent (never a
JSON true), an observedAtMs of whole milliseconds; a record outside them is no reading, never a guessed
number. What the full model checks of fields the line never shows (token counts, subagents) is not
looked at: such a record still shows its percent here while `hctx agents` names why it refused it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container
from dataclasses import dataclass

from guard.constants import ACCEPTED_SCHEMAS, HARNESS_CONTEXT_FUTURE_SKEW_MS, HARNESS_CONTEXT_STALE_MS
from guard.errors import JsonRefused
from guard.json_rule import loads_object

__all__ = [
    "ACCOUNT_FIELDS",
    "RECORD_FIELDS",
    "WINDOW_FIELDS",
    "Glance",
    "WindowReading",
    "glance",
    "snapshot_at_ms",
]

# The record's keys this view reads (guard.record.HarnessContext's aliases), the windows' keys
# (guard.record.RateLimits and RateLimitResets) and the account's (guard.account.Account).
RECORD_FIELDS = (
    "schema", "harness", "usedPercent", "rateLimits", "account", "rateLimitResetsAtMs", "rateLimitsAtMs",
    "observedAtMs",
)  # fmt: skip
WINDOW_FIELDS = ("fiveHour", "sevenDay")
ACCOUNT_FIELDS = ("key",)
_ACCOUNT_KEY = re.compile(r"[0-9a-f]{32}")  # guard.account.ACCOUNT_KEY_PATTERN


class _Refused(Exception):
    pass


@dataclass(frozen=True, slots=True)
class WindowReading:
    """One rate-limit window as the record carries it."""

    window: str  # WINDOW_FIELDS
    used_percent: float
    resets_at_ms: int | None
    at_ms: int  # when its figure arrived (snapshot_at_ms)
    stale: bool  # by the age of its figure, not of the reading that carries it


@dataclass(frozen=True, slots=True)
class Glance:
    """One agent's record as the status line reads it, at the reader's clock."""

    harness: str
    used_percent: float | None
    observed_at_ms: int
    age_ms: int
    stale: bool
    account_key: str | None  # its label is not read: a status line names no account
    windows: tuple[WindowReading, ...]


def _number(value: object) -> float | None:
    """A finite JSON number, or null; anything else refuses the record (FiniteFloat's rule)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Refused
    if isinstance(value, int) and float(value) != value:  # no exact floating-point value
        raise _Refused
    return float(value)


def _millis(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Refused
    return value


def snapshot_at_ms(arrived: int | None, reading_ms: int, now_ms: int) -> int:
    """When a window's figure arrived (issue 35): the record's `rateLimitsAtMs` for it, else (a record
    written before the field, a harness that dates none) its reading's time. An arrival may be later
    than the reading (a producer restates its held reading with limits that came after it); one past
    the clock's skew bound is no arrival (a planted record would pin the account's figure as the
    newest forever), so it is dated by its reading. The one rule for every reader's fan-in."""
    if arrived is not None and arrived <= now_ms + HARNESS_CONTEXT_FUTURE_SKEW_MS:
        return arrived
    return reading_ms


def _millis_or_none(value: object) -> int | None:
    """Read tolerantly, as the record reads its additive keys: malformed is unstated."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _windows(limits: object, resets: object, times: object, observed: int, now_ms: int) -> tuple[WindowReading, ...]:
    if limits is None:
        return ()
    if not isinstance(limits, dict):
        raise _Refused
    # rateLimitResetsAtMs and rateLimitsAtMs are read tolerantly, as the record does.
    stated = resets if isinstance(resets, dict) else {}
    arrivals = times if isinstance(times, dict) else {}
    readings = []
    for window in WINDOW_FIELDS:
        percent = _number(limits.get(window))
        if percent is not None:
            at = snapshot_at_ms(_millis_or_none(arrivals.get(window)), observed, now_ms)
            stale = at <= now_ms - HARNESS_CONTEXT_STALE_MS
            readings.append(WindowReading(window, percent, _millis_or_none(stated.get(window)), at, stale))
    return tuple(readings)


def glance(data: bytes, now_ms: int, harnesses: Container[str]) -> Glance | None:
    """The record's glance at `now_ms`; None when it is refused or observed past the future skew."""
    try:
        raw = loads_object(data)
    except JsonRefused:
        return None
    try:
        schema, harness = raw.get("schema"), raw.get("harness")
        if not isinstance(schema, str) or schema not in ACCEPTED_SCHEMAS:
            raise _Refused
        if not isinstance(harness, str) or harness not in harnesses:
            raise _Refused
        observed = _millis(raw.get("observedAtMs"))
        percent = _number(raw.get("usedPercent"))
        times = raw.get("rateLimitsAtMs")
        windows = _windows(raw.get("rateLimits"), raw.get("rateLimitResetsAtMs"), times, observed, now_ms)
    except _Refused:
        return None
    if observed > now_ms + HARNESS_CONTEXT_FUTURE_SKEW_MS:
        return None
    account = raw.get("account")  # tolerant: malformed is no account
    key = account.get("key") if isinstance(account, dict) else None
    if not (isinstance(key, str) and _ACCOUNT_KEY.fullmatch(key)):
        key = None
    return Glance(
        harness=harness,
        used_percent=percent,
        observed_at_ms=observed,
        age_ms=max(0, now_ms - observed),
        stale=observed <= now_ms - HARNESS_CONTEXT_STALE_MS,
        account_key=key,
        windows=windows,
    )
