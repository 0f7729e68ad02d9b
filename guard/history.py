"""The fill history (`hctx.fill-history.v1`, docs/fill-history.md): the lines of an agent's log the
board's fill plot reads, written by the sidecar and read back through one typed model.

The log is the sidecar's diagnostics and most of its lines are free to change. Two kinds are a
format: the sidecar's `start` (a new run: the plot does not draw across it) and each `write` (the
reading that landed). Both carry `"history": "hctx.fill-history.v1"`; a reader takes the lines
that carry it, validated by `FillLine` (a `StartLine` or a `WriteLine`), and passes over every
other line (another version, an older sidecar's unversioned line, a line cut or planted), never
reading the log's keys by hand.
The write line's numbers are the record's own fields (guard.record), so their meaning and bounds
are the record's: one definition per field.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, TypeAdapter, ValidationError

from guard.errors import JsonRefused
from guard.json_rule import loads_object
from guard.record import Count, FiniteFloat, HarnessContext, Millis, WireModel

__all__ = [
    "FILL_HISTORY",
    "HISTORY_KEY",
    "PLOTTED",
    "FillLine",
    "StartLine",
    "WriteLine",
    "read_fill_line",
    "start_fields",
    "write_fields",
]

FILL_HISTORY: Final = "hctx.fill-history.v1"
# The key that marks a line as the history's, and its version.
HISTORY_KEY: Final = "history"
# The record fields a write line carries, in the order the line has always had them.
PLOTTED: Final = (
    "used_tokens", "window_tokens", "used_percent", "compactions", "compact_at_tokens", "observed_at_ms",
    "written_at_ms",
)  # fmt: skip


class StartLine(WireModel):
    """A sidecar began: a new run, which the plot draws no line across (the line's other keys are the log's)."""

    history: Literal["hctx.fill-history.v1"]
    event: Literal["start"]


class WriteLine(WireModel):
    """A record landed: why it was written, and the record's numbers as they landed."""

    history: Literal["hctx.fill-history.v1"]
    event: Literal["write"]
    reason: str
    # The record's own fields (guard.record.ContextFields): the same types, bounds and defaults.
    used_tokens: Count | None = None
    window_tokens: Count | None = None
    used_percent: FiniteFloat | None = None
    compactions: Count = 0
    compact_at_tokens: Count | None = None
    observed_at_ms: Millis
    written_at_ms: Millis | None = None  # always written; the plot does without it


FillLine = Annotated[StartLine | WriteLine, Field(discriminator="event")]
_LINE: TypeAdapter[StartLine | WriteLine] = TypeAdapter(FillLine)


def start_fields() -> dict[str, Any]:
    """What the sidecar's `start` log line carries to begin a run of the history."""
    return {"event": "start", HISTORY_KEY: FILL_HISTORY}


def write_fields(record: HarnessContext, reason: str) -> dict[str, Any]:
    """What the sidecar's `write` log line carries: the version, the reason, and the landed record's
    PLOTTED fields under the record's own names."""
    numbers = record.model_dump(mode="json", by_alias=True, include=set(PLOTTED))  # in the model's order
    return {"event": "write", HISTORY_KEY: FILL_HISTORY, "reason": reason, **numbers}


def read_fill_line(line: bytes | str) -> StartLine | WriteLine | None:
    """The history's line, or None for any line that is not one of this version's (never raises:
    the one JSON rule bounds a deep or hostile line)."""
    try:
        return _LINE.validate_python(loads_object(line))  # `history` is a Literal: the version is checked
    except (JsonRefused, ValidationError):
        return None
