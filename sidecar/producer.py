"""The contract every producer keeps: sans-I/O, typed events in, readings out.

A producer owns no socket, no file and no clock: its harness's decoders hand it typed events with
the time they arrived, and it answers with the readings the write guard should consider. The very
same objects run live in the sidecar and offline in `hctx replay`. Also here: the domain every
published number must lie in, and small helpers the harnesses' decoding halves share.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from datetime import datetime
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.policy import Reading
from guard.record import MAX_SUBAGENTS, ContextFields, Harness, Subagent, describe_validation_error, optional_model

__all__ = [
    "MAX_COST_USD",
    "MAX_PERCENT",
    "SUBAGENTS_REMEMBERED",
    "Percent",
    "Producer",
    "SubagentRoster",
    "TolerantModel",
    "Usd",
    "harness_version",
    "instant_ms",
    "optional_model",
    "out_of_domain",
    "remember",
]


# The domain of every number a producer publishes, beyond the record's own types (counts are
# bounded there). A percent may exceed 100 (an overrun is an observation, never clamped) but not
# run to a hundred windows; a cost is dollars, never negative, exact as a float.
MAX_PERCENT = 10_000.0
MAX_COST_USD = 1e12
Percent = Annotated[float, Field(strict=True, ge=0, le=MAX_PERCENT, allow_inf_nan=False)]
Usd = Annotated[float, Field(strict=True, ge=0, le=MAX_COST_USD, allow_inf_nan=False)]


class _Domain(BaseModel):
    used_percent: Percent | None
    cost_usd: Usd | None
    five_hour: Percent | None
    seven_day: Percent | None


def out_of_domain(fields: ContextFields) -> str | None:
    """Why a reading's numbers are outside their domain, or None: the pipeline's check of every
    producer's output, so a number computed from hostile inputs is refused like one decoded."""
    limits = fields.rate_limits
    try:
        _Domain(
            used_percent=fields.used_percent,
            cost_usd=fields.cost_usd,
            five_hour=None if limits is None else limits.five_hour,
            seven_day=None if limits is None else limits.seven_day,
        )
    except ValidationError as exc:
        return f"reading out of its domain: {describe_validation_error(exc)}"
    return None


class TolerantModel(BaseModel):
    """A harness payload's shape: keys a newer build adds are ignored, never an error."""

    model_config = ConfigDict(extra="ignore", frozen=True)


_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


def instant_ms(value: object) -> int | None:
    """An ISO-8601 instant with an explicit offset (`2026-11-29T22:44:23.096Z`) in epoch ms."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None  # a local time of an unknown zone is not an instant
    try:
        ms = math.floor(stamp.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        return None
    return ms if ms >= 0 else None


# A build's version as a channel spells it: `2.1.332`, `0.171.0`, `18.2.3`, `1.6.0-beta.1`.
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]{0,63}")


def harness_version(value: object) -> str | None:
    """The harness build a channel names, or None: absent, oversized or not a version is not one."""
    return value if isinstance(value, str) and _VERSION.fullmatch(value) else None


def remember(ring: OrderedDict[_Key, _Value], key: _Key, value: _Value, bound: int) -> None:
    """Insert or refresh `key` as the newest entry; the oldest go past `bound`, so a hostile
    stream cannot grow a producer's memory."""
    ring[key] = value
    ring.move_to_end(key)
    while len(ring) > bound:
        ring.popitem(last=False)


class Producer(Protocol):
    harness: Harness

    # The event is one of the harness's own typed events, from its decoders (`Any` here only
    # because each harness has its own event types; its producer's signature names them).
    def feed(self, event: Any, now_ms: int) -> list[Reading]:
        """Fold one event into the producer's state; the readings it yields, oldest first.

        Raises FrameRejected for an event it refuses (hostile, not its own); must never raise
        anything else for any input, and never fabricate a number the event did not carry.
        """
        ...


# Subagents one producer remembers (issue 28); the record carries the newest MAX_SUBAGENTS of them.
# Thousands of subagents (a runaway loop, a hostile stream) cost a bounded ring, never more.
SUBAGENTS_REMEMBERED = 256


class SubagentRoster:
    """An agent's subagents as the harness states them, each row its own numbers and time.

    `update` folds in what the channel just said of one subagent and answers whether its row
    changed; a row that does not validate (a control character in an id, a count past 2**53) is
    refused whole, so no row is ever a cleaned-up guess. `rows` is what the record carries: the
    newest `MAX_SUBAGENTS`, newest first."""

    def __init__(self) -> None:
        self._rows: OrderedDict[str, Subagent] = OrderedDict()

    def __contains__(self, subagent_id: object) -> bool:
        return subagent_id in self._rows

    def get(self, subagent_id: str) -> Subagent | None:
        return self._rows.get(subagent_id)

    def update(self, subagent_id: str, now_ms: int, **fields: Any) -> bool:
        held = self._rows.get(subagent_id)
        base: dict[str, Any] = (
            held.model_dump() if held is not None else {"id": subagent_id, "state": "running", "observed_at_ms": now_ms}
        )
        try:
            row = Subagent.model_validate(base | fields)
        except ValidationError:
            return False
        if row == held:
            return False
        remember(self._rows, subagent_id, row, SUBAGENTS_REMEMBERED)
        return True

    def onto(self, held: ContextFields | None, harness: Harness, now_ms: int) -> ContextFields:
        """The agent's held reading (its numbers and time as they were) carrying these rows; before
        any reading, a reading of nothing but the rows, taken now."""
        base = held or ContextFields(harness=harness, observed_at_ms=now_ms)
        return base.model_copy(update={"subagents": self.rows()})

    def rows(self) -> tuple[Subagent, ...]:
        # Newest first; rows of one millisecond by their order of arrival, the newest first too (a
        # stable sort of the rows oldest first, reversed, kept the first 16 to arrive in a tie).
        newest = sorted(reversed(self._rows.values()), key=lambda row: row.observed_at_ms, reverse=True)
        return tuple(newest[:MAX_SUBAGENTS])
