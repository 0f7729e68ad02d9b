"""Records for the guard tests: the spec's own example and a builder with overridable fields."""

from __future__ import annotations

import json
from typing import Any

from guard.record import ContextFields, HarnessContext

# The key order of the spec's Record example, spelled out here rather than imported, so a
# reordering inside guard/ cannot silently redefine what the tests check against.
SPEC_KEY_ORDER = (
    "schema", "agent", "harness", "usedTokens", "windowTokens", "usedPercent", "model", "costUsd",
    "sessionTotalTokens", "rateLimits", "compactions", "lastCompactionMs", "lastCompactionTrigger",
    "compactAtTokens", "autoCompaction", "harnessVersion", "sessionId", "account", "rateLimitResetsAtMs",
    "incarnation", "observedAtMs", "writtenAtMs",
)  # fmt: skip

# The spec's Record example with its placeholders filled in (a Codex reading: model and cost null).
SPEC_EXAMPLE: dict[str, Any] = {
    "schema": "st2.harness-context.v1",
    "agent": "alice",
    "harness": "codex",
    "usedTokens": 92283,
    "windowTokens": 258400,
    "usedPercent": 33,
    "model": None,
    "costUsd": None,
    "sessionTotalTokens": 2235329,
    "rateLimits": {"fiveHour": 31, "sevenDay": 55},
    "compactions": 3,
    "lastCompactionMs": 1788000097290,
    "lastCompactionTrigger": "manual",
    "compactAtTokens": None,  # additive (issue 18): absent from the spec's example
    "autoCompaction": None,
    "harnessVersion": None,  # additive (issue 19): absent from the spec's example
    "sessionId": None,
    "account": None,  # additive (issue 29): absent from the spec's example
    "rateLimitResetsAtMs": None,
    "incarnation": "inc-7f3a",
    "observedAtMs": 1788000100000,
    "writtenAtMs": 1788000100000,
}


def wire(**overrides: Any) -> dict[str, Any]:
    """The spec example as a JSON object, with camelCase keys overridden (None deletes nothing)."""
    raw = dict(SPEC_EXAMPLE)
    raw.update(overrides)
    return raw


def wire_bytes(**overrides: Any) -> bytes:
    return (json.dumps(wire(**overrides)) + "\n").encode()


def fields(**overrides: Any) -> ContextFields:
    """A reading (snake_case overrides) with every adjacent fact null unless given."""
    base: dict[str, Any] = {"harness": "claude", "observed_at_ms": 1_000}
    base.update(overrides)
    return ContextFields(**base)


def record(**overrides: Any) -> HarnessContext:
    """A full record (snake_case overrides) built on the spec example's values."""
    base: dict[str, Any] = {
        "harness": "codex",
        "used_tokens": 92283,
        "window_tokens": 258400,
        "used_percent": 33.0,
        "session_total_tokens": 2235329,
        "rate_limits": {"five_hour": 31.0, "seven_day": 55.0},
        "compactions": 3,
        "last_compaction_ms": 1788000097290,
        "last_compaction_trigger": "manual",
        "agent": "alice",
        "incarnation": "inc-7f3a",
        "observed_at_ms": 1788000100000,
        "written_at_ms": 1788000100000,
    }
    base.update(overrides)
    return HarnessContext(**base)
