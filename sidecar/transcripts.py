"""Sans-I/O readers of the harnesses' own transcripts: Claude session JSONL and Codex rollouts.

Occupancy as the context-pressure decision record reads it (../shared/spec/001): the prompt side of
the latest main-chain Claude assistant message, and the latest Codex `token_count` event with its
self-reported `model_context_window`. Nothing here opens a file: a caller hands in `read_at(offset,
size) -> bytes` and the file's size, and the readers walk lines from the END in fixed blocks within a
byte budget, so a 1 GB transcript costs what its last few megabytes cost.

Codex lines are never interpreted here beyond their shape: `rollout_event` turns them into the
Codex producer's own typed events (`TokenUsage`, `RateLimitsUpdated`, a `CompactionItem`, the
`HarnessBuild`), the very events the app-server's messages decode to, and `RolloutDecoder` is the
`rollout` wire's decoder, so Codex's baseline arithmetic lives in `sidecar.harnesses.codex.producer` alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import Field, ValidationError

from guard.errors import FrameRejected
from guard.record import CompactionTrigger, refuse_json_constant, round_half_up
from sidecar.decoding import Dropped
from sidecar.framing import Line, LineFramer, Oversized
from sidecar.harnesses.codex.events import (
    ROLLOUT,
    CompactionItem,
    HarnessBuild,
    RateLimitsUpdated,
    RateWindow,
    TokenUsage,
    event,
)
from sidecar.producer import TolerantModel, harness_version, instant_ms, optional_model

__all__ = [
    "BLOCK_BYTES",
    "HEAD_BYTES",
    "MAX_LINE_BYTES",
    "TAIL_BUDGET_BYTES",
    "BackwardLines",
    "ClaudeCompaction",
    "ClaudeTail",
    "ClaudeUsage",
    "CodexTail",
    "ModelId",
    "Percent",
    "ReadAt",
    "RolloutDecoder",
    "RolloutEvent",
    "Tokens",
    "claude_compaction",
    "claude_usage",
    "compacted_event",
    "forward_lines",
    "line_timestamp",
    "oversized_rollout_event",
    "read_claude_tail",
    "read_codex_tail",
    "rollout_event",
    "session_build",
    "tail_events",
]

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
# Codex rollouts: lines → the typed events the Codex producer consumes


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
    """One rollout line that matters, as the Codex producer's typed events plus its own time.

    A `token_count`'s two parts are judged apart, as the app-server sends them apart: `usage` (its
    `info`: a `TokenUsage`, or the `Dropped` saying why not) and `rate_limits` (a
    `RateLimitsUpdated` or its `Dropped`); `info` is null on early events, and then there is no
    usage at all, never a zero.
    """

    kind: Literal["token_count", "compacted", "turn_context", "session_meta", "task_complete"]
    at_ms: int | None
    usage: TokenUsage | Dropped | None = None
    rate_limits: RateLimitsUpdated | Dropped | None = None
    compaction: CompactionItem | None = None
    build: HarnessBuild | None = None
    model: str | None = None
    session: _SessionMeta | None = None

    @property
    def events(self) -> tuple[object, ...]:
        """In the app-server's own order: a request's usage, then its rate limits (lab/codex §2), so
        a reading carries the rate limits held from before it, exactly as there."""
        found = (self.build, self.compaction, self.usage, self.rate_limits)
        return tuple(item for item in found if item is not None)


_TIMESTAMP: Final = re.compile(rb'^\{"timestamp":"([^"]{1,64})"')
_ROLLOUT_MARKERS: Final = (b'"token_count"', b'"compacted"', b'"turn_context"', b'"session_meta"', b'"task_complete"')


def line_timestamp(line: bytes) -> int | None:
    """When a rollout line says it was written: Codex writes the `timestamp` key first."""
    stamp = _TIMESTAMP.search(line[:256])
    return instant_ms(stamp.group(1).decode("utf-8", "replace")) if stamp else None


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
        return RolloutEvent("session_meta", at_ms, build=session_build(meta), session=meta)
    if entry.type != "event_msg":
        return None
    kind = entry.payload.get("type")
    if kind == "task_complete":
        return RolloutEvent("task_complete", at_ms)
    if kind != "token_count":
        return None
    count = _TokenCount.parse(entry.payload)
    return RolloutEvent("token_count", at_ms, usage=_usage(count, thread_id), rate_limits=_rate_limits(count))


def session_build(meta: _SessionMeta) -> HarnessBuild | None:
    """`session_meta`'s `cli_version`, the build that created the thread (a thread's `cliVersion`)."""
    version = harness_version(meta.cli_version)
    return None if version is None else HarnessBuild(version=version, from_user_agent=False)


def compacted_event(offset: int, thread_id: str, at_ms: int | None) -> RolloutEvent:
    item = CompactionItem(item_id=f"rollout-compacted:{thread_id}:{offset}", turn_id=None)
    return RolloutEvent("compacted", at_ms, compaction=item)


def oversized_rollout_event(head: bytes, offset: int, thread_id: str) -> RolloutEvent | None:
    """A rollout line too long to parse is still a compaction when its prefix says so: Codex writes
    `{"timestamp":…,"type":"compacted","payload":…}`, the (possibly large) history last."""
    if _CODEX_COMPACTED_KEY not in head[:256]:
        return None
    return compacted_event(offset, thread_id, line_timestamp(head))


# The events' values as a rollout line spells them, for a drop's reason.
_USAGE_NAMES: Final = {
    "thread_id": "thread", "tokens_in_window": "info.last_token_usage.total_tokens",
    "session_total_tokens": "info.total_token_usage.total_tokens", "context_window": "info.model_context_window",
}  # fmt: skip
_WINDOW_NAMES: Final = {"used_percent": "rate_limits.used_percent", "window_minutes": "rate_limits.window_minutes"}


def _usage(count: _TokenCount, thread_id: str) -> TokenUsage | Dropped | None:
    if count.info is None:
        return None
    try:
        return event(
            TokenUsage,
            _USAGE_NAMES,
            thread_id=thread_id,
            tokens_in_window=count.info.last_token_usage.total_tokens,
            session_total_tokens=count.info.total_token_usage.total_tokens,
            context_window=count.info.model_context_window,
        )
    except FrameRejected as exc:
        return Dropped(str(exc), ROLLOUT)


def _rate_limits(count: _TokenCount) -> RateLimitsUpdated | Dropped | None:
    """The app-server's conversion: the rollout keeps Codex's float, the v2 notification carries
    `used_percent.round() as i32` (lab/codex §2: 17.5 in the rollout, 18 on the wire)."""
    limits = count.rate_limits
    if limits is None:
        return None
    try:
        windows = [
            None if w is None else event(RateWindow, _WINDOW_NAMES, used_percent=round_half_up(w.used_percent),
                                               window_minutes=w.window_minutes)
            for w in (limits.primary, limits.secondary)
        ]  # fmt: skip
        return RateLimitsUpdated(primary=windows[0], secondary=windows[1])
    except FrameRejected as exc:
        return Dropped(str(exc), ROLLOUT)


class RolloutDecoder:
    """The `rollout` wire: a rollout file's bytes, from byte `offset` on, to the Codex producer's
    typed events. Lines are framed by the shared `LineFramer` (MAX_LINE_BYTES); of a line over it
    only the first HEAD_BYTES are kept, enough to still count it when it is a `compacted` one.
    Without a `thread_id`, the file's own `session_meta` names it (compaction item ids hold it)."""

    def __init__(self, thread_id: str | None = None, *, offset: int = 0, max_bytes: int = MAX_LINE_BYTES) -> None:
        self.thread_id = thread_id
        self.framer = LineFramer(max_bytes, offset=offset, head_bytes=HEAD_BYTES)

    @property
    def offset(self) -> int:
        """Of the next byte fed."""
        return self.framer.offset

    def receive_data(self, data: bytes) -> list[object]:
        events: list[object] = []
        for line in self.framer.receive_data(data):
            events += self._line(line)
        return events

    def end_of_data(self) -> list[object]:
        tail = self.framer.end_of_data()
        if tail is None or (isinstance(tail, Line) and not tail.data.strip()):
            return []
        return [Dropped("truncated rollout line (no newline)", ROLLOUT)]

    @property
    def holding(self) -> int:
        """Bytes held of the line in progress: never more than MAX_LINE_BYTES, or its head."""
        return self.framer.held_bytes

    def _line(self, line: Line | Oversized) -> list[object]:
        if isinstance(line, Oversized):
            return self._events(oversized_rollout_event(line.head, line.start, self._thread()))
        return self._events(rollout_event(line.data, line.start, self._thread()))

    def _thread(self) -> str:
        return self.thread_id or "rollout"

    def _events(self, event: RolloutEvent | None) -> list[object]:
        if event is None:
            return []
        if event.session is not None and self.thread_id is None and event.session.id:
            self.thread_id = event.session.id
        return list(event.events)


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
            if usage is None and event.usage is not None:
                usage = event
            if limits is None and event.rate_limits is not None:
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


def tail_events(tail: CodexTail) -> Iterable[tuple[int | None, object]]:
    """The session's build, the held rate limits, then the usage, so the one reading carries all;
    each with the time its line says (None: the build's, which no reading takes)."""
    if tail.session is not None and (build := session_build(tail.session)) is not None:
        yield None, build
    if tail.rate_limits is not None and tail.rate_limits.rate_limits is not None:
        yield tail.rate_limits.at_ms, tail.rate_limits.rate_limits
    if tail.usage is not None and tail.usage.usage is not None:
        yield tail.usage.at_ms, tail.usage.usage
