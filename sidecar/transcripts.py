"""Sans-I/O readers of the harnesses' own transcripts: Claude session JSONL and Codex rollouts.

Occupancy as the context-pressure decision record reads it (../shared/spec/001): the prompt side of
the latest main-chain Claude assistant message, and the latest Codex `token_count` event with its
self-reported `model_context_window`. Nothing here opens a file: a caller hands in `read_at(offset,
size) -> bytes` and the file's size, and the readers walk lines from the END in fixed blocks within a
byte budget, so a 1 GB transcript costs what its last few megabytes cost.

Codex lines are never interpreted here beyond their shape: `rollout_frames` turns them into the
app-server messages the Codex producer already consumes (`thread/tokenUsage/updated`,
`account/rateLimits/updated`, a `contextCompaction` item), so Codex's baseline arithmetic lives in
`sidecar.producers.codex` alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import Field, ValidationError

from guard.record import CompactionTrigger, refuse_json_constant, round_half_up
from sidecar.producers.base import Frame, TolerantModel, instant_ms, optional_model
from sidecar.producers.codex import FRAME_TYPE as CODEX_FRAME_TYPE

ReadAt = Callable[[int, int], bytes]

BLOCK_BYTES: Final = 64 * 1024
# A line longer than this is skipped unparsed: the lines these readers want (an assistant message's
# usage, a token_count event, a compact_boundary) are kilobytes, while a tool result can be anything.
MAX_LINE_BYTES: Final = 4 * 1024 * 1024
# How far from the end a tail read looks. Beyond it a reading is not found and a count is unknown.
TAIL_BUDGET_BYTES: Final = 32 * 1024 * 1024

_I64_MAX: Final = 2**63 - 1
Tokens = Annotated[int, Field(ge=0, le=_I64_MAX, strict=True)]
Percent = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
_MAX_MODEL_ID: Final = 256
ModelId = Annotated[str, Field(min_length=1, max_length=_MAX_MODEL_ID, strict=True)]

_CLAUDE_TRIGGERS: Final[dict[str, CompactionTrigger]] = {"manual": "manual", "auto": "auto"}
# JSON structure, not text: inside a string these quotes would be escaped, so no message body matches.
_CLAUDE_BOUNDARY_KEY: Final = b'"subtype":"compact_boundary"'
_CODEX_COMPACTED_KEY: Final = b'"type":"compacted"'


# ---------------------------------------------------------------------------------------------
# Lines, newest first, within a budget


# Of a line too long to parse, this much of its beginning is kept: enough to see what kind it was.
HEAD_BYTES: Final = 1024


@dataclass
class BackwardLines:
    """Complete lines of a file from its end: `(offset of the line's first byte, line)`, newest first.

    A final line without its newline is still yielded (the reader decides whether it parses: a
    writer mid-line gives a truncated one). Lines longer than `max_line` are not yielded and never
    held whole: only their first HEAD_BYTES land in `skipped_heads`, so a reader that counts can
    still recognise a line of its kind by its prefix. Reading stops after `budget` bytes;
    `reached_start` then says whether the whole file was covered, which makes a count over it exact.
    """

    read_at: ReadAt
    size: int
    budget: int = TAIL_BUDGET_BYTES
    block: int = BLOCK_BYTES
    max_line: int = MAX_LINE_BYTES
    bytes_read: int = field(default=0, init=False)
    reached_start: bool = field(default=False, init=False)
    skipped_heads: list[tuple[int, bytes]] = field(default_factory=list, init=False)
    # Set by a reader mid-iteration once only lines holding one of these byte strings can matter to
    # it: whole blocks without any are then passed over without being split into lines.
    only_containing: tuple[bytes, ...] | None = field(default=None, init=False)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        position = max(self.size, 0)
        later: list[bytes] = []  # pieces of the line being assembled, newest piece first
        later_bytes = 0
        head = b""  # the first HEAD_BYTES of what has been assembled so far
        oversized = False
        while position > 0:
            if self.bytes_read >= self.budget:
                return
            size = min(self.block, position, self.budget - self.bytes_read)
            chunk = self.read_at(position - size, size)
            if len(chunk) != size:
                return  # the file shrank under us: what is left is not the file we sized
            position -= size
            self.bytes_read += size
            end = len(chunk)
            newline = chunk.rfind(b"\n", 0, end)
            wanted = self.only_containing
            while newline >= 0:
                start = newline + 1
                if not oversized and later_bytes + (end - start) <= self.max_line:
                    line = chunk[start:end] + b"".join(reversed(later)) if later else chunk[start:end]
                    if line.strip():
                        yield position + start, line
                else:
                    self.skipped_heads.append((position + start, _head(chunk[start:end], head)))
                later, later_bytes, head, oversized = [], 0, b"", False
                end = newline
                if wanted is not None:
                    # Only lines holding a wanted marker matter: those wholly inside this block are
                    # found by the markers themselves, the rest of the block is never split.
                    first = chunk.find(b"\n", 0, end + 1)
                    for start, stop in _lines_with(chunk, first + 1, end, wanted):
                        if stop - start <= self.max_line:
                            yield position + start, chunk[start:stop]
                        else:
                            self.skipped_heads.append((position + start, chunk[start : start + HEAD_BYTES]))
                    end = first
                    break
                newline = chunk.rfind(b"\n", 0, end)
            head = _head(chunk[:end], head)
            if not oversized:
                later.append(chunk[:end])
                later_bytes += end
                if later_bytes > self.max_line:
                    later, later_bytes, oversized = [], 0, True
        self.reached_start = True
        if oversized:
            self.skipped_heads.append((0, head))
        elif later_bytes:
            line = b"".join(reversed(later))
            if line.strip():
                yield 0, line


def _lines_with(chunk: bytes, low: int, high: int, markers: tuple[bytes, ...]) -> list[tuple[int, int]]:
    """(start, stop) of the lines within chunk[low:high] (whole lines) holding a marker, newest first."""
    found: set[tuple[int, int]] = set()
    for marker in markers:
        at = chunk.find(marker, low, high)
        while at >= 0:
            start = chunk.rfind(b"\n", low, at) + 1 or low
            stop = chunk.find(b"\n", at, high)
            stop = high if stop < 0 else stop
            found.add((max(start, low), stop))
            at = chunk.find(marker, stop, high)
    return sorted(found, reverse=True)


def _head(earlier: bytes, head: bytes) -> bytes:
    """The first HEAD_BYTES of `earlier + head` without copying more than that."""
    if len(earlier) >= HEAD_BYTES:
        return earlier[:HEAD_BYTES]
    return earlier + head[: HEAD_BYTES - len(earlier)]


def forward_lines(data: bytes, max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """`(offset, line)` of every non-blank line in `data`, oldest first, oversized ones skipped."""
    start = 0
    while start < len(data):
        newline = data.find(b"\n", start)
        end = len(data) if newline < 0 else newline
        if end - start <= max_line and data[start:end].strip():
            yield start, data[start:end]
        start = end + 1


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        value: Any = json.loads(line, parse_constant=refuse_json_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


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
    raw = _json_object(line)
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
    raw = _json_object(line)
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


# ---------------------------------------------------------------------------------------------
# Codex rollouts: lines → the app-server messages the Codex producer consumes


class _RolloutTokenUsage(TolerantModel):
    input_tokens: Tokens | None = None
    cached_input_tokens: Tokens | None = None
    cache_write_input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    reasoning_output_tokens: Tokens | None = None
    total_tokens: Tokens


class _RolloutTokenInfo(TolerantModel):
    total_token_usage: _RolloutTokenUsage
    last_token_usage: _RolloutTokenUsage
    model_context_window: Tokens | None = None


class _RolloutRateWindow(TolerantModel):
    used_percent: Percent
    window_minutes: Tokens | None = None
    resets_at: Tokens | None = None


class _RolloutRateLimits(TolerantModel):
    limit_id: str | None = None
    limit_name: str | None = None
    primary: _RolloutRateWindow | None = None
    secondary: _RolloutRateWindow | None = None


@dataclass(frozen=True)
class _TokenCount:
    """`info` and `rate_limits` judged apart: a broken rate-limit block must not cost the usage."""

    info: _RolloutTokenInfo | None
    rate_limits: _RolloutRateLimits | None

    @classmethod
    def parse(cls, payload: dict[str, Any]) -> _TokenCount:
        return cls(
            optional_model(_RolloutTokenInfo, payload.get("info")),
            optional_model(_RolloutRateLimits, payload.get("rate_limits")),
        )


class _RolloutLine(TolerantModel):
    timestamp: str | None = None
    type: str
    payload: dict[str, Any]


class _SessionMeta(TolerantModel):
    id: str
    timestamp: str | None = None
    cwd: str | None = None
    cli_version: str | None = None
    source: Any = None


class _TurnContext(TolerantModel):
    model: ModelId | None = None


@dataclass(frozen=True)
class RolloutEvent:
    """One rollout line that matters, as app-server messages (oldest first) plus its own time."""

    kind: Literal["token_count", "compacted", "turn_context", "session_meta", "task_complete"]
    at_ms: int | None
    messages: tuple[dict[str, Any], ...] = ()
    model: str | None = None
    session: _SessionMeta | None = None


_TIMESTAMP: Final = re.compile(rb'^\{"timestamp":"([^"]{1,64})"')
_ROLLOUT_MARKERS: Final = (b'"token_count"', b'"compacted"', b'"turn_context"', b'"session_meta"', b'"task_complete"')


def rollout_event(line: bytes, offset: int, thread_id: str) -> RolloutEvent | None:
    """Interpret one rollout line; None for lines that say nothing about context (or are broken).

    `offset` identifies a `compacted` line within its file, which is how one compaction is one item
    however often the follower re-reads it.
    """
    if not any(marker in line for marker in _ROLLOUT_MARKERS):
        return None
    raw = _json_object(line)
    if raw is None:
        return None
    try:
        entry = _RolloutLine.model_validate(raw)
    except ValidationError:
        return None
    at_ms = instant_ms(entry.timestamp)
    if entry.type == "compacted":
        return compacted_event(offset, thread_id, at_ms)
    if entry.type == "turn_context":
        try:
            return RolloutEvent("turn_context", at_ms, model=_TurnContext.model_validate(entry.payload).model)
        except ValidationError:
            return None
    if entry.type == "session_meta":
        try:
            meta = _SessionMeta.model_validate(entry.payload)
        except ValidationError:
            return None
        return RolloutEvent("session_meta", at_ms, (thread_started(meta),), session=meta)
    if entry.type != "event_msg":
        return None
    kind = entry.payload.get("type")
    if kind == "task_complete":
        return RolloutEvent("task_complete", at_ms)
    if kind != "token_count":
        return None
    return RolloutEvent("token_count", at_ms, token_count_messages(_TokenCount.parse(entry.payload), thread_id))


def thread_started(meta: _SessionMeta) -> dict[str, Any]:
    """`session_meta` as the app-server announces a thread: the build that created it (the Codex
    producer's harnessVersion)."""
    return {"method": "thread/started", "params": {"thread": {"id": meta.id, "cliVersion": meta.cli_version}}}


def compacted_event(offset: int, thread_id: str, at_ms: int | None) -> RolloutEvent:
    item = {"type": "contextCompaction", "id": f"rollout-compacted:{thread_id}:{offset}"}
    message = {"method": "item/started", "params": {"threadId": thread_id, "item": item}}
    return RolloutEvent("compacted", at_ms, (message,))


def oversized_rollout_event(head: bytes, offset: int, thread_id: str) -> RolloutEvent | None:
    """A rollout line too long to parse is still a compaction when its prefix says so: Codex writes
    `{"timestamp":…,"type":"compacted","payload":…}`, the (possibly large) history last."""
    if _CODEX_COMPACTED_KEY not in head[:256]:
        return None
    stamp = _TIMESTAMP.search(head[:256])
    return compacted_event(offset, thread_id, instant_ms(stamp.group(1).decode()) if stamp else None)


def token_count_messages(event: _TokenCount, thread_id: str) -> tuple[dict[str, Any], ...]:
    """The app-server's two notifications for one `token_count`, in the app-server's own order.

    The app-server sends `thread/tokenUsage/updated` and then `account/rateLimits/updated` for each
    one (lab/codex §2), so a reading carries the rate limits held from before it, exactly as there.
    `info` is null on early events: then there is no usage message at all, never a zero.
    """
    messages: list[dict[str, Any]] = []
    if event.info is not None:
        usage = {
            "total": _breakdown(event.info.total_token_usage),
            "last": _breakdown(event.info.last_token_usage),
            "modelContextWindow": event.info.model_context_window,
        }
        params = {"threadId": thread_id, "turnId": None, "tokenUsage": usage}
        messages.append({"method": "thread/tokenUsage/updated", "params": params})
    limits = event.rate_limits
    if limits is not None:
        snapshot = {
            "limitId": limits.limit_id,
            "limitName": limits.limit_name,
            "primary": _rate_window(limits.primary),
            "secondary": _rate_window(limits.secondary),
        }
        messages.append({"method": "account/rateLimits/updated", "params": {"rateLimits": snapshot}})
    return tuple(messages)


def _breakdown(usage: _RolloutTokenUsage) -> dict[str, int | None]:
    return {
        "totalTokens": usage.total_tokens,
        "inputTokens": usage.input_tokens,
        "cachedInputTokens": usage.cached_input_tokens,
        "cacheWriteInputTokens": usage.cache_write_input_tokens,
        "outputTokens": usage.output_tokens,
        "reasoningOutputTokens": usage.reasoning_output_tokens,
    }


def _rate_window(window: _RolloutRateWindow | None) -> dict[str, Any] | None:
    """The app-server's conversion: the rollout keeps Codex's float, the v2 notification carries
    `used_percent.round() as i32` (lab/codex §2: 17.5 in the rollout, 18 on the wire)."""
    if window is None:
        return None
    return {
        "usedPercent": round_half_up(window.used_percent),
        "windowDurationMins": window.window_minutes,
        "resetsAt": window.resets_at,
    }


def codex_frames(event: RolloutEvent) -> list[Frame]:
    return [{"type": CODEX_FRAME_TYPE, "payload": message} for message in event.messages]


@dataclass(frozen=True)
class CodexTail:
    """What the end of a rollout says, oldest first, ready for the Codex producer."""

    usage: RolloutEvent | None  # the latest token_count carrying `info`
    rate_limits: RolloutEvent | None  # the latest token_count carrying `rate_limits`
    model: str | None
    latest_compaction_ms: int | None
    compactions: int | None  # exact only when the whole file was read
    session: _SessionMeta | None
    bytes_read: int


def read_codex_tail(lines: BackwardLines, thread_id: str) -> CodexTail:
    usage: RolloutEvent | None = None
    limits: RolloutEvent | None = None
    model: str | None = None
    session: _SessionMeta | None = None
    latest_compaction_ms: int | None = None
    latest_compaction_offset = -1
    seen_compaction = False
    count = 0
    for offset, line in lines:
        if usage is not None and limits is not None and model is not None:
            # Everything but the count is known: only compactions and the header matter now.
            lines.only_containing = (b'"compacted"', b'"session_meta"')
            if b'"compacted"' not in line and b'"session_meta"' not in line:
                continue
        event = rollout_event(line, offset, thread_id)
        if event is None:
            continue
        if event.kind == "compacted":
            count += 1
            if not seen_compaction:
                latest_compaction_ms, latest_compaction_offset, seen_compaction = event.at_ms, offset, True
        elif event.kind == "token_count":
            methods = [message["method"] for message in event.messages]
            if usage is None and "thread/tokenUsage/updated" in methods:
                usage = event
            if limits is None and "account/rateLimits/updated" in methods:
                limits = event
        elif event.kind == "turn_context" and model is None:
            model = event.model
        elif event.kind == "session_meta":
            session = event.session
    for offset, head in lines.skipped_heads:
        oversized = oversized_rollout_event(head, offset, thread_id)
        if oversized is not None:
            count += 1
            if not seen_compaction or offset > latest_compaction_offset:
                latest_compaction_ms, latest_compaction_offset, seen_compaction = oversized.at_ms, offset, True
    return CodexTail(
        usage, limits, model, latest_compaction_ms, count if lines.reached_start else None, session, lines.bytes_read
    )


def tail_frames(tail: CodexTail) -> Iterable[tuple[int | None, Frame]]:
    """The session's build, the held rate limits, then the usage, so the one reading carries all."""
    if tail.session is not None:
        yield None, {"type": CODEX_FRAME_TYPE, "payload": thread_started(tail.session)}
    if tail.rate_limits is not None:
        for message in tail.rate_limits.messages:
            if message["method"] == "account/rateLimits/updated":
                yield tail.rate_limits.at_ms, {"type": CODEX_FRAME_TYPE, "payload": message}
    if tail.usage is not None:
        for message in tail.usage.messages:
            if message["method"] == "thread/tokenUsage/updated":
                yield tail.usage.at_ms, {"type": CODEX_FRAME_TYPE, "payload": message}
