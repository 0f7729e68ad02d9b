"""Claude Code's session transcripts, read from the end (`sidecar.transcripts.BackwardLines`).

Occupancy as the context-pressure decision record reads it (../shared/spec/001): the prompt side of
the latest main-chain assistant message, and the compactions its `compact_boundary` lines record.
Nothing here opens a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from pydantic import ValidationError

from guard.record import CompactionTrigger
from sidecar.producer import TolerantModel, instant_ms
from sidecar.transcripts import (
    BackwardLines,
    ModelId,
    Tokens,
    json_object,
)

__all__ = [
    "ClaudeCompaction",
    "ClaudeTail",
    "ClaudeUsage",
    "claude_compaction",
    "claude_usage",
    "read_claude_tail",
]

_CLAUDE_TRIGGERS: Final[dict[str, CompactionTrigger]] = {"manual": "manual", "auto": "auto"}
# JSON structure, not text: inside a string these quotes would be escaped, so no message body matches.
_CLAUDE_BOUNDARY_KEY: Final = b'"subtype":"compact_boundary"'

# ---------------------------------------------------------------------------------------------
# Claude Code session transcripts


class _ClaudeUsage(TolerantModel):
    input_tokens: Tokens
    cache_read_input_tokens: Tokens = 0
    cache_creation_input_tokens: Tokens = 0


class _ClaudeMessage(TolerantModel):
    model: ModelId | None = None
    usage: _ClaudeUsage


class _ClaudeAssistant(TolerantModel):
    type: Literal["assistant"]
    message: _ClaudeMessage
    isSidechain: bool = False
    isApiErrorMessage: bool = False
    requestedModel: ModelId | None = None
    timestamp: str


class _CompactMetadata(TolerantModel):
    trigger: str | None = None
    preTokens: Tokens | None = None
    postTokens: Tokens | None = None


class _ClaudeBoundary(TolerantModel):
    type: Literal["system"]
    subtype: Literal["compact_boundary"]
    isSidechain: bool = False
    compactMetadata: _CompactMetadata | None = None
    timestamp: str


@dataclass(frozen=True)
class ClaudeUsage:
    """One main-chain assistant message's prompt side: what the next request roughly carries."""

    used_tokens: int
    model: str | None
    observed_at_ms: int
    offset: int


@dataclass(frozen=True)
class ClaudeCompaction:
    trigger: CompactionTrigger | None
    pre_tokens: int | None
    post_tokens: int | None
    at_ms: int
    offset: int


@dataclass(frozen=True)
class ClaudeTail:
    usage: ClaudeUsage | None
    latest_compaction: ClaudeCompaction | None
    # Exact only when the read covered the whole file; None when the budget ran out first.
    compactions: int | None
    bytes_read: int


def claude_usage(line: bytes, offset: int = 0) -> ClaudeUsage | None:
    """The occupancy a main-chain assistant line carries; None for anything else.

    input + cache_read + cache_creation (output is the reply, not the prompt). A sidechain (a
    subagent's message) describes another window; an API-error message's zeros are no measurement.
    """
    if b'"assistant"' not in line or b'"usage"' not in line:
        return None
    raw = json_object(line)
    if raw is None or raw.get("type") != "assistant":
        return None
    try:
        entry = _ClaudeAssistant.model_validate(raw)
    except ValidationError:
        return None
    at_ms = instant_ms(entry.timestamp)
    if entry.isSidechain or entry.isApiErrorMessage or at_ms is None:
        return None
    if entry.message.model == "<synthetic>":
        return None
    usage = entry.message.usage
    used = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    return ClaudeUsage(used, entry.requestedModel or entry.message.model, at_ms, offset)


def claude_compaction(line: bytes, offset: int = 0) -> ClaudeCompaction | None:
    if b"compact_boundary" not in line:
        return None
    raw = json_object(line)
    if raw is None:
        return None
    try:
        entry = _ClaudeBoundary.model_validate(raw)
    except ValidationError:
        return None
    at_ms = instant_ms(entry.timestamp)
    if entry.isSidechain or at_ms is None:
        return None
    meta = entry.compactMetadata or _CompactMetadata()
    trigger = None if meta.trigger is None else _CLAUDE_TRIGGERS.get(meta.trigger, "unknown")
    return ClaudeCompaction(trigger, meta.preTokens, meta.postTokens, at_ms, offset)


def read_claude_tail(lines: BackwardLines) -> ClaudeTail:
    """The latest usage, the latest compaction, and the compaction count if the whole file was read.

    Past the latest usage only compact_boundary lines are looked at, and only by a substring test
    before anything is parsed, so the rest of the budget is a memory scan, not JSON decoding.
    """
    usage: ClaudeUsage | None = None
    latest: ClaudeCompaction | None = None
    count = 0
    for offset, line in lines:
        compaction = claude_compaction(line, offset)
        if compaction is not None:
            count += 1
            latest = latest or compaction
            continue
        if usage is None:
            usage = claude_usage(line, offset)
            if usage is not None:
                lines.only_containing = (b"compact_boundary",)
    # A compact_boundary is small, but one too long to parse still counts (its prefix says what it is).
    count += sum(_CLAUDE_BOUNDARY_KEY in head for _, head in lines.skipped_heads)
    return ClaudeTail(usage, latest, count if lines.reached_start else None, lines.bytes_read)


