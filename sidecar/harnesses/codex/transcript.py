"""Codex's rollout files, read from the end (`hctx scan`, a resumed seat) or followed (`rollout` wire).

Codex lines are never interpreted here beyond their shape: `rollout_event` turns them into the
Codex producer's own typed events (`TokenUsage`, `RateLimitsUpdated`, a `CompactionItem`, the
`HarnessBuild`), the very events the app-server's messages decode to, and `RolloutDecoder` is the
`rollout` wire's decoder, so Codex's baseline arithmetic lives in `sidecar.harnesses.codex.producer`
alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ValidationError

from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads_object
from guard.record import round_half_up
from sidecar.decoding import Dropped, LineByLine
from sidecar.framing import Line, LineFramer, Oversized
from sidecar.harnesses.codex.events import (
    ROLLOUT,
    CompactionItem,
    HarnessBuild,
    RateLimitsUpdated,
    RateWindow,
    ThreadOpened,
    TokenUsage,
    event,
)
from sidecar.producer import TolerantModel, harness_version, instant_ms, optional_model
from sidecar.transcripts import (
    HEAD_BYTES,
    MAX_LINE_BYTES,
    BackwardLines,
    ModelId,
    Percent,
    Tokens,
)

__all__ = [
    "CodexTail",
    "RolloutDecoder",
    "RolloutEvent",
    "compacted_event",
    "is_subagent_source",
    "line_timestamp",
    "oversized_rollout_event",
    "read_codex_tail",
    "rollout_event",
    "session_build",
    "tail_events",
]

_CODEX_COMPACTED_KEY: Final = b'"type":"compacted"'

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
        return None  # a tail read skips messages and tool output unparsed: most of a rollout
    found = _rollout_line(line, offset, thread_id)
    return None if isinstance(found, Dropped) else found


def _rollout_line(line: bytes, offset: int, thread_id: str) -> RolloutEvent | Dropped | None:
    """`rollout_event` for the `rollout` wire, which parses every line it is handed, so a line that
    is no JSON object (the one rule) is a `Dropped` the follower counts, whatever it held. Live,
    lines come one message at a time, and a resumed follower starts at the file's end."""
    try:
        raw = loads_object(line, error=MalformedFrame)
    except MalformedFrame as exc:
        return Dropped(f"rollout line: {exc}", ROLLOUT)
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
                                               window_minutes=w.window_minutes, resets_at_s=w.resets_at)
            for w in (limits.primary, limits.secondary)
        ]  # fmt: skip
        return RateLimitsUpdated(primary=windows[0], secondary=windows[1])
    except FrameRejected as exc:
        return Dropped(str(exc), ROLLOUT)


class RolloutDecoder(LineByLine):
    """The `rollout` wire: a rollout file's bytes, from byte `offset` on, to the Codex producer's
    typed events. Lines are framed by the shared `LineFramer` (MAX_LINE_BYTES); of a line over it
    only the first HEAD_BYTES are kept, enough to still count it when it is a `compacted` one.
    Without a `thread_id`, the file's own `session_meta` names it (compaction item ids hold it)."""

    def __init__(self, thread_id: str | None = None, *, offset: int = 0, max_bytes: int = MAX_LINE_BYTES) -> None:
        self.thread_id = thread_id
        self._opened = False
        self.framer = LineFramer(max_bytes, offset=offset, head_bytes=HEAD_BYTES)

    @property
    def offset(self) -> int:
        """Of the next byte fed."""
        return self.framer.offset

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
        found = _rollout_line(line.data, line.start, self._thread())
        return [found] if isinstance(found, Dropped) else self._events(found)

    def _thread(self) -> str:
        return self.thread_id or "rollout"

    def _events(self, event: RolloutEvent | None) -> list[object]:
        opened: list[object] = []
        if event is not None and event.session is not None and self.thread_id is None and event.session.id:
            if is_subagent_source(event.session.source):
                self._opened = True  # a subagent's rollout: its thread is never an agent's own
            self.thread_id = event.session.id
        if not self._opened and self.thread_id is not None:
            # The rollout a seat follows is its own thread's (the follower never follows a
            # subagent's), and so is a replayed one whose session_meta names no parent.
            self._opened = True
            opened.append(ThreadOpened(thread_id=self.thread_id))
        return opened if event is None else [*opened, *event.events]


def is_subagent_source(source: object) -> bool:
    """A rollout `session_meta.source` naming a spawning thread (`{"subagent": {"thread_spawn":
    {"parent_thread_id": ...}}}` on 0.151.0 and 0.171.0): a subagent's rollout."""
    return isinstance(source, dict) and "subagent" in source


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
    each with the time its line says (None: the build's, which no reading takes). The usage's
    thread is opened as the agent's own first, unless the session is a subagent's."""
    if tail.session is not None and (build := session_build(tail.session)) is not None:
        yield None, build
    if tail.rate_limits is not None and tail.rate_limits.rate_limits is not None:
        yield tail.rate_limits.at_ms, tail.rate_limits.rate_limits
    usage = tail.usage.usage if tail.usage is not None else None
    if isinstance(usage, TokenUsage) and not (tail.session is not None and is_subagent_source(tail.session.source)):
        yield None, ThreadOpened(thread_id=usage.thread_id)  # a seat's own rollout: its thread is the agent's
    if tail.usage is not None and tail.usage.usage is not None:
        yield tail.usage.at_ms, tail.usage.usage
