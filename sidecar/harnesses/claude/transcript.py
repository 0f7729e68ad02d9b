"""Claude Code's session transcripts, read from the end (`sidecar.transcripts.BackwardLines`).

Occupancy as the context-pressure decision record reads it (../shared/spec/001): the prompt side of
the latest main-chain assistant message, and the compactions its `compact_boundary` lines record.
Nothing here opens a file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pydantic import ValidationError

from guard.record import MAX_COUNT, CompactionTrigger, ContextFields
from sidecar.producer import TolerantModel, instant_ms
from sidecar.spec import TranscriptFile, TranscriptReading, WindowSource
from sidecar.transcripts import (
    BackwardLines,
    ModelId,
    ReadAt,
    Tokens,
    json_object,
)

__all__ = [
    "ClaudeCompaction",
    "ClaudeTail",
    "ClaudeUsage",
    "claude_compaction",
    "claude_config_dir",
    "claude_usage",
    "files",
    "read",
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
    agentId: str | None = None  # a subagent's transcript names its subagent on every line
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
    agentId: str | None = None
    timestamp: str


@dataclass(frozen=True)
class ClaudeUsage:
    """One main-chain assistant message's prompt side: what the next request roughly carries."""

    used_tokens: int
    model: str | None
    observed_at_ms: int
    offset: int
    agent_id: str | None = None


@dataclass(frozen=True)
class ClaudeCompaction:
    trigger: CompactionTrigger | None
    pre_tokens: int | None
    post_tokens: int | None
    at_ms: int
    offset: int
    agent_id: str | None = None


@dataclass(frozen=True)
class ClaudeTail:
    usage: ClaudeUsage | None
    latest_compaction: ClaudeCompaction | None
    # Exact only when the read covered the whole file; None when the budget ran out first.
    compactions: int | None
    bytes_read: int


def claude_usage(line: bytes, offset: int = 0, *, sidechain: bool = False) -> ClaudeUsage | None:
    """The occupancy a main-chain assistant line carries; None for anything else.

    input + cache_read + cache_creation (output is the reply, not the prompt). A sidechain (a
    subagent's message) describes another window; an API-error message's zeros are no measurement.
    With `sidechain`, the line is read from a subagent's own transcript
    (`<session>/subagents/agent-<id>.jsonl`, every line `isSidechain`): its window is the one read.
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
    if entry.isSidechain != sidechain or entry.isApiErrorMessage or at_ms is None:
        return None
    if entry.message.model == "<synthetic>":
        return None
    usage = entry.message.usage
    used = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    return ClaudeUsage(used, entry.requestedModel or entry.message.model, at_ms, offset, entry.agentId)


def claude_compaction(line: bytes, offset: int = 0, *, sidechain: bool = False) -> ClaudeCompaction | None:
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
    if entry.isSidechain != sidechain or at_ms is None:
        return None
    meta = entry.compactMetadata or _CompactMetadata()
    trigger = None if meta.trigger is None else _CLAUDE_TRIGGERS.get(meta.trigger, "unknown")
    return ClaudeCompaction(trigger, meta.preTokens, meta.postTokens, at_ms, offset, entry.agentId)


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


# ---------------------------------------------------------------------------------------------
# `hctx scan` (the spec's `transcripts`): every session under the config dir, read as the decision
# record reads it


def claude_config_dir(environ: Mapping[str, str]) -> Path:
    configured = environ.get("CLAUDE_CONFIG_DIR")
    return Path(configured) if configured else Path(environ.get("HOME") or Path.home()) / ".claude"


def files(environ: Mapping[str, str]) -> Iterator[Path]:
    """Claude's `projects/*/<session>.jsonl`: subagent transcripts live deeper and are another window."""
    for project in _subdirs(claude_config_dir(environ) / "projects"):
        yield from sorted(project.glob("*.jsonl"))


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(entry for entry in path.iterdir() if entry.is_dir() and not entry.is_symlink())
    except OSError:
        return []


def _in_range(name: str, value: int | None, problems: list[str]) -> int | None:
    """A count past 2**53, which not every JSON reader keeps exact, is shown null, and says so."""
    if value is None or value <= MAX_COUNT:
        return value
    problems.append(f"{name} {value} is out of range (above 2**53); shown as null")
    return None


def read(file: TranscriptFile, read_at: ReadAt, size: int, windows: Mapping[str, int]) -> TranscriptReading:
    """The latest main-chain assistant message's input + cache_read + cache_creation over the window
    the model table gives for its model id (`windowSource: "model-table"`); an id the table does not
    list yields no window and no percent. After `/compact` the reading stays the pre-compaction one
    until the next assistant message (`compactedSinceReading` says so)."""
    tail = read_claude_tail(BackwardLines(read_at, size))
    usage, latest = tail.usage, tail.latest_compaction
    model = None if usage is None else usage.model
    window = None if model is None else windows.get(model)
    problems: list[str] = []
    used = _in_range("usedTokens", None if usage is None else usage.used_tokens, problems)
    fields = ContextFields(
        harness="claude",
        used_tokens=used,
        window_tokens=window,
        # st2 computes this one: the transcript carries no percent (windowSource says whence the window).
        used_percent=None if used is None or window is None else used * 100 / window,
        model=model,
        compactions=tail.compactions or 0,
        last_compaction_ms=None if latest is None else latest.at_ms,
        last_compaction_trigger=None if latest is None else latest.trigger,
        observed_at_ms=file.modified_ms if usage is None else usage.observed_at_ms,
    )
    pre, post = (None, None) if latest is None else (latest.pre_tokens, latest.post_tokens)
    extra = {
        "lastCompactionPreTokens": _in_range("lastCompactionPreTokens", pre, problems),
        "lastCompactionPostTokens": _in_range("lastCompactionPostTokens", post, problems),
        # The decision record's /compact edge: the value stays stale until the next assistant message.
        "compactedSinceReading": bool(latest and usage and latest.offset > usage.offset),
    }
    source: WindowSource | None = "model-table" if window is not None else None
    return TranscriptReading(fields, file.session_id, source, model, tail.compactions, extra, tuple(problems))
