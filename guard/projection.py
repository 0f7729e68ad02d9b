"""What a reader projects from a record (HC-R06, HC-R07): the evaluation-order table, nothing else."""

from __future__ import annotations

import logging
from collections.abc import Container
from pathlib import Path
from typing import Any

from guard.constants import HARNESS_CONTEXT_FUTURE_SKEW_MS, HARNESS_CONTEXT_STALE_MS
from guard.errors import RecordRefused
from guard.files import RawFile, read_bounded
from guard.record import HarnessContext, parse_record

__all__ = [
    "CONTEXT_KEYS",
    "MAX_RECORD_BYTES",
    "decode_record",
    "exposure",
    "headroom_tokens",
    "load_record",
    "project",
    "read_context",
]

log = logging.getLogger(__name__)

# Records are a few hundred bytes; anything past this is not a record and is not read whole.
MAX_RECORD_BYTES = 64 * 1024

# The roster's `context` keys, in the spec's Exposure order. `incarnation` and `writtenAtMs`
# are deliberately absent: provenance and write mechanism, not something a roster consumer uses.
CONTEXT_KEYS = (
    "harness", "usedTokens", "windowTokens", "usedPercent", "model", "costUsd",
    "sessionTotalTokens", "rateLimits", "compactions", "lastCompactionMs",
    "lastCompactionTrigger", "compactAtTokens", "autoCompaction", "harnessVersion", "sessionId",
    "account", "rateLimitResetsAtMs", "observedAtMs", "ageMs", "stale", "headroomTokens",
)  # fmt: skip


def headroom_tokens(context: dict[str, Any]) -> int | None:
    """Tokens left before the harness compacts on its own: `compactAtTokens - usedTokens`, from a
    record or a roster `context` (camelCase keys); None when either is null. Negative when the
    reading is already past the point (the harness compacts at its next check), never clamped.
    The one place this arithmetic lives: `agents`, `top`, `doctor`, `metrics` and `watch` use it."""
    compact_at, used = context.get("compactAtTokens"), context.get("usedTokens")
    if type(compact_at) is not int or type(used) is not int:  # a JSON true is not a count
        return None
    return compact_at - used


def exposure(record: HarnessContext) -> dict[str, Any]:
    """The record's fields as the roster shows them, before the clock: `project` adds the age.
    A reader that keeps records between readings (guard.catalog.CatalogCache) keeps this too."""
    fields = record.model_dump(mode="json", by_alias=True)
    fields["headroomTokens"] = headroom_tokens(fields)
    return fields


def project(record: HarnessContext, now_ms: int, fields: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The roster's `context` object for a decoded record, or None past the future-skew bound;
    `fields` is the record's `exposure`, when the caller already has it."""
    if record.observed_at_ms > now_ms + HARNESS_CONTEXT_FUTURE_SKEW_MS:
        log.warning(
            "context record observed %d ms in the future; clock untrusted, reading as absent",
            record.observed_at_ms - now_ms,
        )
        return None
    fields = exposure(record) if fields is None else fields
    timed = {
        "ageMs": max(0, now_ms - record.observed_at_ms),
        "stale": record.observed_at_ms <= now_ms - HARNESS_CONTEXT_STALE_MS,
    }
    context = {key: timed[key] if key in timed else fields[key] for key in CONTEXT_KEYS}
    if fields.get("rateLimitsAtMs"):
        # Additive (issue 35), present only where the record carries it: when each window's figure
        # arrived, which the account fan-in (wrapper.accounts) orders and ages snapshots by.
        context["rateLimitsAtMs"] = fields["rateLimitsAtMs"]
    if fields.get("subagents"):
        # Additive (issue 28), present only where the record names some: each row the harness's own
        # numbers with its own age, as the parent's.
        context["subagents"] = [row | {"ageMs": max(0, now_ms - row["observedAtMs"])} for row in fields["subagents"]]
    return context


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
        log.warning("%s: %s", path, problem)
    return record


def read_context(path: str | Path, now_ms: int, harnesses: Container[str] | None = None) -> dict[str, Any] | None:
    """The whole table: no file, refused (a harness outside `harnesses`, the ones the reader knows,
    included), future-skewed -> None; else the reading with its age."""
    record = load_record(path, harnesses)
    return None if record is None else project(record, now_ms)
