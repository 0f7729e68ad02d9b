"""Codex: the app-server's own JSON-RPC stream, mirrored in Codex's own arithmetic.

Frames are `{"type": "codex.rpc", "payload": <message>}`, one per server→client JSON-RPC message,
whether the wrapper tapped the harness's stdout (payload: the line as a string) or the sidecar's
websocket relay tapped a connection (payload: the text message). The producer reads three things:

- `thread/tokenUsage/updated` is the reading. `last.totalTokens` over `modelContextWindow` through
  Codex's `percent_of_context_window_remaining` (the 12,000-token baseline, Rust's rounding), and
  `total.totalTokens` as the session total, which is spend and never occupancy. The window Codex
  reports is already its effective window (95% of the configured one), so it is used as-is.
- `account/rateLimits/updated` is merged and restates the held reading (its own observedAtMs kept)
  when it changes the limits: Codex sends a request's snapshot after its usage, so riding only the
  next reading would leave the record one snapshot behind and never publish the last one.
- a `contextCompaction` thread item is a compaction, counted once per item id however many
  `item/started` / `item/completed` frames (or relay connections) carry it.
- the build: the initialize response's `userAgent` (`<originator>/<version> (...)`), the app-server
  binary itself; before it (a relay that joined late, the rollout follower's `session_meta`), a
  thread's `cliVersion`, the build that created the thread. It rides every reading.

Several threads on one app-server share one record: the newest reading of any thread wins.

`compactAtTokens` (issue 18). Source: `model_auto_compact_token_limit` (and `model_context_window`)
from the config Codex loads, read by the wrapper (`wrapper.harnesses.codex.compaction_config`) and
handed over as the sidecar's own `{"type": "hctx.codex-config", "autoCompactTokenLimit",
"modelContextWindow"}` frame before any harness frame. Rule (codex-rs `ModelInfo::
auto_compact_token_limit`, public copies of the source, not pinned to a tag): the effective limit is
min(configured limit, 9/10 of the model's context window), compared `>=` with the tokens in the
window (`last.totalTokens`, the record's usedTokens) when a turn starts, so the compaction runs before
the turn after the one that reached it. The model's window is the configured `model_context_window`,
or else not stated anywhere on the channel (`modelContextWindow` is 95% of it); without it the limit
is published only where the cap cannot bind (limit <= 9/10 of the reported window, which is below
9/10 of the model's). An unset limit is null: Codex then compacts at 9/10 of a window it does not
state. Measured: lab 0.151.0/0.171.0, 160,000 configured, 200,000 window: turn 4 at 175,900
compacted before turn 5 (../shared/lab/codex/); tests/live/test_codex_live.py, 0.171.0: the
published 100,000 is where it compacted (a turn at 99,000 did not, the next after 101,000 did).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from guard.policy import Reading
from guard.record import (
    MAX_COUNT,
    ContextFields,
    Count,
    Harness,
    RateLimits,
    describe_validation_error,
    refuse_json_constant,
    round_half_up,
)
from sidecar.producers.base import Frame, FrameRejected, Percent, harness_version, remember

FRAME_TYPE: Final = "codex.rpc"
# The sidecar's own frame (sidecar.transports.codex): the compaction settings the wrapper read.
COMPACTION_CONFIG_FRAME: Final = "hctx.codex-config"

# The codex-cli build whose Rust source the arithmetic below was compared against, and the newest
# build the lab captured with the same shapes and numbers (../shared/lab/codex/README.md).
CODEX_CONTEXT_VERIFIED_VERSIONS: Final = ("0.151.0", "0.171.0")

# codex-rs/protocol: "Includes prompts, tools and space to call compact." No override exists.
BASELINE_TOKENS: Final = 12_000

# Rate-limit windows are named primary/secondary and identified by their length alone.
FIVE_HOUR_MINUTES: Final = 300
SEVEN_DAY_MINUTES: Final = 10_080

# Item ids already counted. One compaction is at most a handful of frames apart on one connection,
# a few more across relay connections; the bound only keeps a hostile stream from growing memory.
COUNTED_ITEMS_REMEMBERED: Final = 1024

TOKEN_USAGE: Final = "thread/tokenUsage/updated"
RATE_LIMITS: Final = "account/rateLimits/updated"
ITEM_EVENTS: Final = frozenset({"item/started", "item/completed"})
LEGACY_COMPACTED: Final = "thread/compacted"

Tokens = Count
Id = Annotated[str, Field(min_length=1, strict=True)]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class _Envelope(_Wire):
    type: Literal["codex.rpc"]
    payload: str | dict[str, Any]


class _Breakdown(_Wire):
    total_tokens: Tokens


class _TokenUsage(_Wire):
    total: _Breakdown
    last: _Breakdown
    model_context_window: Tokens | None = None


class _TokenUsageParams(_Wire):
    thread_id: Id
    token_usage: _TokenUsage


class _RateLimitWindow(_Wire):
    used_percent: Percent
    window_duration_mins: Tokens | None = None


class _RateLimitSnapshot(_Wire):
    primary: _RateLimitWindow | None = None
    secondary: _RateLimitWindow | None = None


class _RateLimitParams(_Wire):
    rate_limits: _RateLimitSnapshot


class _Item(_Wire):
    type: str
    id: Id | None = None


class _ItemParams(_Wire):
    item: _Item
    turn_id: Id | None = None


class _CompactedParams(_Wire):
    turn_id: Id


def percent_of_context_window_remaining(tokens_in_window: int, context_window: int) -> int | None:
    """Codex's `TokenUsage::percent_of_context_window_remaining`, in its own order of operations.

    None where the window is at or below the baseline: Codex answers 0 there, which mirrored would
    be a saturation Codex never displayed.
    """
    if context_window <= BASELINE_TOKENS:
        return None
    effective_window = context_window - BASELINE_TOKENS
    used = max(tokens_in_window - BASELINE_TOKENS, 0)
    remaining = max(effective_window - used, 0)
    return round_half_up(min(max(remaining / effective_window * 100.0, 0.0), 100.0))


def used_percent(tokens_in_window: int, context_window: int | None) -> int | None:
    """100 − the "% context left" Codex displays; None where Codex could not normalise."""
    if context_window is None:
        return None
    remaining = percent_of_context_window_remaining(tokens_in_window, context_window)
    return None if remaining is None else 100 - remaining


class CodexProducer:
    """Sans-I/O: app-server messages in, full `ContextFields` readings out."""

    def __init__(self, harness: Harness = "codex") -> None:
        self.harness: Harness = harness
        self.compactions = 0
        self.last_compaction_ms: int | None = None
        self.five_hour: float | None = None
        self.seven_day: float | None = None
        self.last_reading: ContextFields | None = None
        self.auto_compact_limit: int | None = None
        self.configured_window: int | None = None
        self.version: str | None = None
        self._version_from_user_agent = False
        self._counted_items: OrderedDict[str, str | None] = OrderedDict()
        # Turns whose compaction was counted from the deprecated notification, which names no item:
        # the first item seen in such a turn is that same compaction, not a second one.
        self._legacy_turns: OrderedDict[str, bool] = OrderedDict()

    def feed(self, frame: Frame, now_ms: int) -> list[Reading]:
        if isinstance(frame, dict) and frame.get("type") == COMPACTION_CONFIG_FRAME:
            self.auto_compact_limit = _positive_count(frame.get("autoCompactTokenLimit"))
            self.configured_window = _positive_count(frame.get("modelContextWindow"))
            return []
        message = _message(frame)
        self._note_version(message)
        method = message.get("method")
        if not isinstance(method, str):
            return []  # a response to the client's own request: nothing about context
        params = message.get("params")
        if method == TOKEN_USAGE:
            return [self._token_usage(_parse(_TokenUsageParams, params, method), now_ms)]
        if method == RATE_LIMITS:
            self._merge_rate_limits(_parse(_RateLimitParams, params, method).rate_limits)
            return self._restated_with_rate_limits()
        if method in ITEM_EVENTS:
            return self._item(_parse(_ItemParams, params, method), now_ms)
        if method == LEGACY_COMPACTED:
            return self._legacy_compacted(_parse(_CompactedParams, params, method).turn_id, now_ms)
        return []

    def _token_usage(self, params: _TokenUsageParams, now_ms: int) -> Reading:
        usage = params.token_usage
        window = usage.model_context_window
        tokens_in_window = usage.last.total_tokens
        fields = ContextFields(
            harness=self.harness,
            used_tokens=tokens_in_window,
            window_tokens=window,
            used_percent=used_percent(tokens_in_window, window),
            model=None,
            cost_usd=None,
            session_total_tokens=usage.total.total_tokens,
            rate_limits=self._rate_limits(),
            compactions=self.compactions,
            last_compaction_ms=self.last_compaction_ms,
            last_compaction_trigger="unknown" if self.compactions else None,
            harness_version=self.version,
            compact_at_tokens=self._compact_at(window),
            auto_compaction=True if self.auto_compact_limit is not None else None,
            observed_at_ms=now_ms,
        )
        self.last_reading = fields
        return Reading(fields)

    def _compact_at(self, reported_window: int | None) -> int | None:
        """The effective auto-compact limit Codex states through its config (see the module doc)."""
        limit = self.auto_compact_limit
        if limit is None:
            return None
        if self.configured_window is not None:
            return min(limit, self.configured_window * 9 // 10)
        if reported_window is not None and limit * 10 <= reported_window * 9:
            return limit
        return None

    def _note_version(self, message: dict[str, Any]) -> None:
        result, params = message.get("result"), message.get("params")
        agent = result.get("userAgent") if isinstance(result, dict) else None
        if isinstance(agent, str):
            version = harness_version(agent.split(" ", 1)[0].rpartition("/")[2])
            if version is not None:
                self.version, self._version_from_user_agent = version, True
                return
        if self._version_from_user_agent:
            return  # a resumed thread's cliVersion names the build that created it, not this one
        for holder in (result, params):
            thread = holder.get("thread") if isinstance(holder, dict) else None
            version = harness_version(thread.get("cliVersion")) if isinstance(thread, dict) else None
            if version is not None:
                self.version = version

    def _merge_rate_limits(self, snapshot: _RateLimitSnapshot) -> None:
        # A sparse rolling update: a null or absent window says nothing, so it never clears one.
        for window in (snapshot.primary, snapshot.secondary):
            if window is None:
                continue
            if window.window_duration_mins == FIVE_HOUR_MINUTES:
                self.five_hour = window.used_percent
            elif window.window_duration_mins == SEVEN_DAY_MINUTES:
                self.seven_day = window.used_percent

    def _restated_with_rate_limits(self) -> list[Reading]:
        """The held reading with the merged limits, when they changed it; nothing was re-measured,
        so its observedAtMs stays. Before any reading the limits wait for the first one."""
        held, limits = self.last_reading, self._rate_limits()
        if held is None or held.rate_limits == limits:
            return []
        self.last_reading = held.model_copy(update={"rate_limits": limits})
        return [Reading(self.last_reading, rate_limits_edge=True)]

    def _rate_limits(self) -> RateLimits | None:
        if self.five_hour is None and self.seven_day is None:
            return None
        return RateLimits(five_hour=self.five_hour, seven_day=self.seven_day)

    def _item(self, params: _ItemParams, now_ms: int) -> list[Reading]:
        item = params.item
        if item.type != "contextCompaction":
            return []
        if item.id is None:
            raise FrameRejected("contextCompaction item without an id")
        if item.id in self._counted_items:
            return []
        remember(self._counted_items, item.id, params.turn_id, COUNTED_ITEMS_REMEMBERED)
        turn = params.turn_id
        if turn is not None and self._legacy_turns.get(turn):
            self._legacy_turns[turn] = False  # this item is the compaction already counted
            return []
        return [self._compacted(now_ms)]

    def _legacy_compacted(self, turn_id: str, now_ms: int) -> list[Reading]:
        if turn_id in self._legacy_turns or turn_id in self._counted_items.values():
            return []
        remember(self._legacy_turns, turn_id, True, COUNTED_ITEMS_REMEMBERED)
        return [self._compacted(now_ms)]

    def _compacted(self, now_ms: int) -> Reading:
        """The edge: the held reading (its own observedAtMs kept) with the count advanced."""
        self.compactions += 1
        self.last_compaction_ms = now_ms
        update = {
            "compactions": self.compactions,
            "last_compaction_ms": now_ms,
            "last_compaction_trigger": "unknown",
            "rate_limits": self._rate_limits(),
            "harness_version": self.version,
        }
        if self.last_reading is None:
            # No reading yet: the count is the only observation, and it was made now.
            fields = ContextFields(harness=self.harness, observed_at_ms=now_ms, **update)
        else:
            fields = self.last_reading.model_copy(update=update)
        self.last_reading = fields
        return Reading(fields, compaction_edge=True)


_M = TypeVar("_M", bound=_Wire)


def _message(frame: Frame) -> dict[str, Any]:
    try:
        envelope = _Envelope.model_validate(frame, strict=True)
    except ValidationError as exc:
        raise FrameRejected(f"not a {FRAME_TYPE} frame: {describe_validation_error(exc)}") from None
    payload = envelope.payload
    if isinstance(payload, str):
        try:
            payload = json.loads(payload, parse_constant=refuse_json_constant)
        except (ValueError, RecursionError) as exc:
            raise FrameRejected(f"payload is not JSON: {str(exc)[:200]}") from None
    if not isinstance(payload, dict):
        raise FrameRejected(f"payload is not a JSON-RPC message but {type(payload).__name__}")
    return payload


def _parse(model: type[_M], params: object, method: str) -> _M:
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise FrameRejected(f"{method}: {describe_validation_error(exc)}") from None


def _positive_count(value: object) -> int | None:
    return value if type(value) is int and 0 < value <= MAX_COUNT else None


def make_producer(harness: Harness) -> CodexProducer:
    return CodexProducer(harness)


def decode_recording(data: bytes) -> Iterator[tuple[int | None, Frame]]:
    """The lab's captures: `<name>.jsonl` (verbatim inbound messages, one per line) or
    `<name>.timed.jsonl` (`{"t": seconds, "dir": "in"|"out", "frame": message}`, both directions).

    The clock is Codex's own `emittedAtMs`. Responses carry none; they keep the previous frame's time,
    so they neither rewind the clock nor push it ahead of Codex's.
    """
    clock: int | None = None
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            message: Any = json.loads(line, parse_constant=refuse_json_constant)
        except (ValueError, RecursionError):
            # Handed on as text, so the producer refuses it and the pipeline counts the drop.
            yield clock, {"type": FRAME_TYPE, "payload": line.decode("utf-8", "replace")}
            continue
        if _is_timed_line(message):
            if message["dir"] != "in":
                continue  # the client's own requests: the producer sees server→client only
            if clock is None:
                clock = _seconds_to_ms(message["t"])
            message = message["frame"]
        if isinstance(message, dict) and _is_millis(emitted := message.get("emittedAtMs")):
            clock = emitted
        yield clock, {"type": FRAME_TYPE, "payload": message}


def _is_timed_line(message: Any) -> bool:
    return isinstance(message, dict) and set(message) == {"t", "dir", "frame"}


def _seconds_to_ms(value: Any) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return int(value * 1000)
    return None


def _is_millis(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
