"""What a reader projects from a record (HC-R06, HC-R07): the evaluation-order table, nothing else.

The projection is typed: `Context` is the record's reading (guard.record.ContextFields, the very
field definitions the writer validates and the JSON Schema is built from) with the reader's three
derived fields, so a reader reads attributes the type checker follows, never string keys; its
`wire()` is the roster's `context` object, byte for byte what `hctx agents --json` always printed."""

from __future__ import annotations

from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import PrivateAttr

from guard.constants import HARNESS_CONTEXT_FUTURE_SKEW_MS, HARNESS_CONTEXT_STALE_MS, MAX_RECORD_BYTES
from guard.errors import RecordRefused
from guard.files import RawFile, read_bounded
from guard.record import ContextFields, HarnessContext, PromptCache, Subagent, parse_record

__all__ = [
    "CONTEXT_KEYS",
    "MAX_RECORD_BYTES",
    "Context",
    "SubagentReading",
    "cache_cold_in_ms",
    "decode_record",
    "headroom_tokens",
    "load_record",
    "project",
    "read_context",
    "reading_of",
]


def _warn(message: str, *args: object) -> None:
    """The projection's log line. logging is imported where a line is logged (`load_record`,
    `read_context`), not with the module: a reader that reports every problem itself (the roster,
    `hctx agents --json`) never loads it (issue 38)."""
    import logging

    logging.getLogger(__name__).warning(message, *args)


# The roster's `context` keys, in the spec's Exposure order. `incarnation` and `writtenAtMs`
# are deliberately absent: provenance and write mechanism, not something a roster consumer uses.
CONTEXT_KEYS = (
    "harness", "usedTokens", "windowTokens", "usedPercent", "model", "costUsd",
    "sessionTotalTokens", "rateLimits", "compactions", "lastCompactionMs",
    "lastCompactionTrigger", "compactAtTokens", "autoCompaction", "harnessVersion", "sessionId",
    "account", "rateLimitResetsAtMs", "observedAtMs", "ageMs", "stale", "headroomTokens",
)  # fmt: skip
# The record's reading as the projection carries it over: every field of ContextFields.
_READING = tuple(ContextFields.model_fields)


def headroom_tokens(compact_at: int | None, used: int | None) -> int | None:
    """Tokens left before the harness compacts on its own: `compact_at - used`; None when either
    is null. Negative when the reading is already past the point (the harness compacts at its next
    check), never clamped. The one place this arithmetic lives: the projection's `headroom_tokens`
    and `metrics` use it."""
    if type(compact_at) is not int or type(used) is not int:  # a JSON true is not a count
        return None
    return compact_at - used


def cache_cold_in_ms(cache: PromptCache | None, now_ms: int) -> int | None:
    """Milliseconds until the harness's prompt cache goes cold (issue 37): `expiresAtMs - now`, 0
    once past; None where no warm cache with an expiry is stated. The one place this lives:
    `agents`, `inspect` and `watch` use it."""
    if cache is None or not cache.warm or cache.expires_at_ms is None:
        return None
    return max(0, cache.expires_at_ms - now_ms)


class SubagentReading(Subagent):
    """One subagent as a reader sees it (issue 28): the record's row and its own age."""

    age_ms: int


class Context(ContextFields):
    """The roster's `context` for one agent: the record's reading and what the reader derives from it
    at its clock (the age, staleness, the headroom to the harness's own compaction point)."""

    subagents: tuple[SubagentReading, ...] = ()
    age_ms: int
    stale: bool
    headroom_tokens: int | None
    # The record's part of `wire()`, serialized once per record (`reading_of`) rather than once per
    # projection: a board or `top` projects every agent again each second. Carried by a copy that
    # changes the clock's fields only (`project`), dropped by any other.
    _record_wire: dict[str, Any] | None = PrivateAttr(default=None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        if update and not _TIMED.issuperset(update):
            copied._record_wire = None
        return copied

    def wire(self) -> dict[str, Any]:
        """The roster's `context` object: CONTEXT_KEYS in order, then `rateLimitsAtMs` and `subagents`
        where there are any (additive, issues 35 and 28), then `promptCache` where the harness states
        one (additive, issue 37)."""
        held = self._record_wire
        if held is None:
            return _context_wire(self.model_dump(mode="json", by_alias=True))
        context = held | {"ageMs": self.age_ms, "stale": self.stale}
        if self.subagents:
            context["subagents"] = [
                row | {"ageMs": sub.age_ms} for row, sub in zip(held["subagents"], self.subagents, strict=True)
            ]
        return context


def _context_wire(fields: dict[str, Any]) -> dict[str, Any]:
    """`Context.wire()` of a reading's fields as dumped (JSON mode, by alias): a Context's own, or a
    record's with the reader's three fields added (`reading_of`)."""
    context = {key: fields[key] for key in CONTEXT_KEYS}
    if fields["rateLimitsAtMs"]:
        # Additive (issue 35), where the record carries it: when each window's figure arrived,
        # which the account fan-in (wrapper.readers.accounts) orders and ages snapshots by.
        context["rateLimitsAtMs"] = fields["rateLimitsAtMs"]
    if fields["subagents"]:
        context["subagents"] = fields["subagents"]
    if fields["promptCache"] is not None:
        context["promptCache"] = fields["promptCache"]
    return context


# What `project` changes of a reading: the clock's fields (a subagent's age, with its row unchanged).
_TIMED = frozenset({"age_ms", "stale", "subagents"})


def reading_of(record: HarnessContext) -> Context:
    """The record's reading as the projection carries it, before the clock: `project` adds the ages.
    A reader that keeps records between readings (guard.catalog.CatalogCache) keeps this too.
    Constructed, not validated again: every value comes from a record the reader already validated."""
    reading = {name: getattr(record, name) for name in _READING}
    reading["subagents"] = tuple(SubagentReading.model_construct(**dict(sub), age_ms=0) for sub in record.subagents)
    headroom = headroom_tokens(record.compact_at_tokens, record.used_tokens)
    context = Context.model_construct(**reading, age_ms=0, stale=False, headroom_tokens=headroom)
    # Dumped by the record's serializer, which every reader has built, not the Context's (built at
    # its first use, guard.record.AT_FIRST_USE): the same fields, types and order, so the same JSON.
    # Ages and staleness are set again by each `project`.
    fields = record.model_dump(mode="json", by_alias=True)
    if fields["subagents"]:
        fields["subagents"] = [row | {"ageMs": 0} for row in fields["subagents"]]
    context._record_wire = _context_wire(fields | {"ageMs": 0, "stale": False, "headroomTokens": headroom})
    return context


def project(record: HarnessContext, now_ms: int, reading: Context | None = None) -> Context | None:
    """The roster's `context` for a decoded record, or None past the future-skew bound; `reading` is
    the record's `reading_of`, when the caller already has it."""
    if record.observed_at_ms > now_ms + HARNESS_CONTEXT_FUTURE_SKEW_MS:
        return None  # the caller says why: `read_context` logs it, the roster shows it as the row's problem
    reading = reading_of(record) if reading is None else reading
    timed: dict[str, Any] = {
        "age_ms": max(0, now_ms - record.observed_at_ms),
        "stale": record.observed_at_ms <= now_ms - HARNESS_CONTEXT_STALE_MS,
    }
    if reading.subagents:  # each row the harness's own numbers with its own age, as the parent's
        timed["subagents"] = tuple(
            sub.model_copy(update={"age_ms": max(0, now_ms - sub.observed_at_ms)}) for sub in reading.subagents
        )
    return reading.model_copy(update=timed)


def decode_record(raw: RawFile, harnesses: Container[str] | None = None) -> tuple[HarnessContext | None, str | None]:
    """The record and None, or None and why it is not trusted (None, None when there is no file).
    `harnesses` as for `parse_record`."""
    if raw.data is None:
        return None, None if raw.problem is None else f"context record {raw.problem}"
    try:
        return parse_record(raw.data, harnesses=harnesses), None
    except RecordRefused as exc:
        return None, f"context record refused: {exc}"


def load_record(path: str | Path, harnesses: Container[str] | None = None) -> HarnessContext | None:
    """The record at `path`; None when there is none or it is not trustworthy (logged)."""
    record, problem = decode_record(read_bounded(None, path, MAX_RECORD_BYTES), harnesses)
    if problem is not None:
        _warn("%s: %s", path, problem)
    return record


def read_context(path: str | Path, now_ms: int, harnesses: Container[str] | None = None) -> Context | None:
    """The whole table: no file, refused (a harness outside `harnesses`, the ones the reader knows,
    included), future-skewed -> None; else the reading with its age."""
    record = load_record(path, harnesses)
    if record is None:
        return None
    context = project(record, now_ms)
    if context is None:
        _warn(
            "context record observed %d ms in the future; clock untrusted, reading as absent",
            record.observed_at_ms - now_ms,
        )
    return context
