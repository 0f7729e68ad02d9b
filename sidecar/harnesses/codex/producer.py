"""Codex: the app-server's own JSON-RPC stream, mirrored in Codex's own arithmetic.

Decoding is apart from the arithmetic. Every server→client JSON-RPC message is bytes through ONE
function, `parse_message`, whichever way it came: the app-server's stdout (`stdout` wire, a JSONL
stream: what the lab's `<name>.jsonl` captures are), one websocket text message of the sidecar's
relay (`websocket` wire), or the wrapper's stdout tap on the channel, whose envelope
`{"type": "codex.rpc", "payload": "<the line>"}` (`tap_frame`) carries the line's very bytes as a
string (in base64 when not UTF-8). The rollout file an interactive seat writes (`rollout` wire,
`sidecar.transcripts`) yields the same typed events. The producer reads only those events, and its
arithmetic is pure functions (`usage_fields`, `merged_rate_limits`, `compact_at`) that `hctx scan`
calls too:

- `thread/tokenUsage/updated` is the reading. `last.totalTokens` over `modelContextWindow` through
  Codex's `percent_of_context_window_remaining` (the 12,000-token baseline, Rust's rounding), and
  `total.totalTokens` as the session total, which is spend and never occupancy. The window Codex
  reports is already its effective window (95% of the configured one), so it is used as-is.
- `account/rateLimits/updated` is merged and restates the held reading (its own observedAtMs kept)
  when it changes the limits: Codex sends a request's snapshot after its usage, so riding only the
  next reading would leave the record one snapshot behind and never publish the last one. Each
  window it carries is dated by the notification's own time (`rateLimitsAtMs`, issue 35: the
  notification states none, so the time it arrived; a rollout's, its line's), which later readings
  carry unchanged.
- a `contextCompaction` thread item is a compaction, counted once per item id however many
  `item/started` / `item/completed` frames (or relay connections) carry it.
- the build: the initialize response's `userAgent` (`<originator>/<version> (...)`), the app-server
  binary itself; before it (a relay that joined late, the rollout follower's `session_meta`), a
  thread's `cliVersion`, the build that created the thread. It rides every reading.

Several threads on one app-server share one record: the newest reading of any of the agent's own
threads wins. A thread is the agent's own only when the stream said so (`ThreadOpened`: a
`thread/started`, or a thread a client's `thread/start`/`thread/resume`/`thread/fork` returned,
without a `parentThreadId`; the rollout a seat follows). A subagent's thread never is (issue 28):
Codex 0.151.0 and 0.171.0 (multi_agent on by default) send no `thread/started` for a
`spawn_agent` child, while its `thread/tokenUsage/updated` arrive on the same connection under its
own `threadId`, in the parent's shape; a reading of a thread not opened as the agent's own is never
the agent's (fixtures/codex/*-delegation.jsonl, recorded live).

`compactAtTokens` (issue 18). Source: `model_auto_compact_token_limit` (and `model_context_window`)
from the config Codex loads, read by the wrapper (`sidecar.harnesses.codex.launch.compaction_settings`) and
handed over by the transport as a `CompactionConfig` event (`_Transport.compaction`) before any
harness event. Rule (codex-rs `ModelInfo::auto_compact_token_limit`, public copies of the source,
not pinned to a tag): the effective limit is
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

import base64
import binascii
import json
from collections import OrderedDict
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError
from pydantic.alias_generators import to_camel

from guard.constants import CHANNEL_MAX_FRAME_BYTES
from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads_object
from guard.policy import Reading
from guard.record import (
    MAX_COUNT,
    ContextFields,
    Harness,
    RateLimitResets,
    RateLimits,
    RateLimitTimes,
    describe_validation_error,
    round_half_up,
)
from sidecar.decoding import Decoder, LineDecoder, MessageDecoder
from sidecar.harnesses.codex.events import (
    FRAME_TYPE,
    ROLLOUT,
    STDOUT,
    WEBSOCKET,
    CompactionConfig,
    CompactionItem,
    HarnessBuild,
    Id,
    RateLimitsUpdated,
    RateWindow,
    SubagentsSpawned,
    ThreadCompacted,
    ThreadOpened,
    Tokens,
    TokenUsage,
    TurnState,
)
from sidecar.held import Held
from sidecar.producer import Percent, harness_version, remember
from sidecar.spec import HarnessSpec

__all__ = [
    "BASELINE_TOKENS",
    "CODEX_CONTEXT_VERIFIED_VERSIONS",
    "COLLAB_ITEM",
    "COUNTED_ITEMS_REMEMBERED",
    "FIVE_HOUR_MINUTES",
    "ITEM_EVENTS",
    "LEGACY_COMPACTED",
    "MAX_THREAD_ID",
    "OWN_THREADS_REMEMBERED",
    "RATE_LIMITS",
    "SEVEN_DAY_MINUTES",
    "SPEC",
    "THREAD_STARTED",
    "TOKEN_USAGE",
    "TURN_EVENTS",
    "ChannelOnly",
    "CodexProducer",
    "CodexTransport",
    "HeldLimits",
    "HeldResets",
    "HeldTimes",
    "PositiveTokens",
    "Relay",
    "Rollout",
    "WsAddress",
    "channel_frames",
    "compact_at",
    "merged_rate_limits",
    "merged_resets",
    "merged_times",
    "parse_message",
    "percent_of_context_window_remaining",
    "rate_limit_resets",
    "rate_limit_times",
    "rate_limits",
    "tap_frame",
    "tapped_line",
    "usage_fields",
    "used_percent",
]


# The codex-cli build whose Rust source the arithmetic below was compared against, and the newest
# build the lab captured with the same shapes and numbers (../shared/lab/codex/README.md).
CODEX_CONTEXT_VERIFIED_VERSIONS: Final = ("0.151.0", "0.171.0")

# codex-rs/protocol: "Includes prompts, tools and space to call compact." No override exists.
BASELINE_TOKENS: Final = 12_000

# Rate-limit windows are named primary/secondary and identified by their length alone.
FIVE_HOUR_MINUTES: Final = 300
SEVEN_DAY_MINUTES: Final = 10_080

# The agent's own threads: one per `thread/start` or resume a client made on this app-server.
OWN_THREADS_REMEMBERED: Final = 1024

# Item ids already counted. One compaction is at most a handful of frames apart on one connection,
# a few more across relay connections; the bound only keeps a hostile stream from growing memory.
COUNTED_ITEMS_REMEMBERED: Final = 1024

TOKEN_USAGE: Final = "thread/tokenUsage/updated"
RATE_LIMITS: Final = "account/rateLimits/updated"
ITEM_EVENTS: Final = frozenset({"item/started", "item/completed"})
LEGACY_COMPACTED: Final = "thread/compacted"


# ---------------------------------------------------------------------------------------------
# The app-server's JSON-RPC messages: bytes -> events, the same on every wire


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


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
    resets_at: Tokens | None = None  # unix seconds


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
    thread_id: Id | None = None


class _SpawnItem(_Wire):
    sender_thread_id: Id
    receiver_thread_ids: list[Id]
    model: str | None = None


class _TurnParams(_Wire):
    thread_id: Id


class _CompactedParams(_Wire):
    turn_id: Id


THREAD_STARTED: Final = "thread/started"


_M = TypeVar("_M", bound=_Wire)


def parse_message(data: bytes) -> list[object]:
    """One server→client JSON-RPC message's bytes to its events; FrameRejected for one refused.

    The one rule of every wire (guard.json_rule: strict UTF-8, no NaN), and one size rule: a message
    the stdout tap could not carry to the channel (its `tap_frame` over the channel's limit) is
    refused on the websocket and in a replay too, so no path publishes what another would drop.
    """
    could_outgrow = len(data) * _WORST_ESCAPE + len(_TAP_PREFIX) + 1 > CHANNEL_MAX_FRAME_BYTES
    if could_outgrow and len(tap_frame(data)) > CHANNEL_MAX_FRAME_BYTES:
        raise FrameRejected(f"message over {CHANNEL_MAX_FRAME_BYTES} bytes as the stdout tap frames it")
    message = loads_object(data, error=MalformedFrame)
    if not _is_app_server_message(message):
        raise FrameRejected("not an app-server message: no method, and no id with a result or an error")
    events: list[object] = []
    build = _build(message)
    if build is not None:
        events.append(build)
    opened = _own_thread(message)
    if opened is not None:
        events.append(opened)
    method = message.get("method")
    if not isinstance(method, str):
        return events  # a response to the client's own request: nothing about context
    params = message.get("params")
    if method == TOKEN_USAGE:
        usage = _parse(_TokenUsageParams, params, method)
        events.append(
            TokenUsage(
                thread_id=usage.thread_id,
                tokens_in_window=usage.token_usage.last.total_tokens,
                session_total_tokens=usage.token_usage.total.total_tokens,
                context_window=usage.token_usage.model_context_window,
            )
        )
    elif method == RATE_LIMITS:
        snapshot = _parse(_RateLimitParams, params, method).rate_limits
        events.append(RateLimitsUpdated(primary=_window(snapshot.primary), secondary=_window(snapshot.secondary)))
    elif method in ITEM_EVENTS:
        item = _parse(_ItemParams, params, method)
        if item.item.type == "contextCompaction":
            if item.item.id is None:
                raise FrameRejected("contextCompaction item without an id")
            events.append(CompactionItem(item_id=item.item.id, turn_id=item.turn_id, thread_id=item.thread_id))
        elif method == "item/completed" and item.item.type == COLLAB_ITEM:
            events += _spawned(params)
    elif method in TURN_EVENTS:
        turn = _parse(_TurnParams, params, method)
        events.append(TurnState(thread_id=turn.thread_id, running=method == "turn/started"))
    elif method == LEGACY_COMPACTED:
        events.append(ThreadCompacted(turn_id=_parse(_CompactedParams, params, method).turn_id))
    return events


def _is_app_server_message(message: dict[str, Any]) -> bool:
    """JSON-RPC as the app-server speaks it (without the `jsonrpc` member): a request or notification
    names its `method`, a response carries the `id` it answers and a `result` or an `error`."""
    if "method" in message:
        return isinstance(message["method"], str)
    return "id" in message and ("result" in message or "error" in message)


def _window(window: _RateLimitWindow | None) -> RateWindow | None:
    if window is None:
        return None
    return RateWindow(
        used_percent=window.used_percent, window_minutes=window.window_duration_mins, resets_at_s=window.resets_at
    )


def _build(message: dict[str, Any]) -> HarnessBuild | None:
    """The initialize response's `userAgent` (`<originator>/<version> (...)`), else the last
    `thread.cliVersion` of the result or the params."""
    result, params = message.get("result"), message.get("params")
    agent = result.get("userAgent") if isinstance(result, dict) else None
    if isinstance(agent, str):
        version = harness_version(agent.split(" ", 1)[0].rpartition("/")[2])
        if version is not None:
            return HarnessBuild(version=version, from_user_agent=True)
    found: HarnessBuild | None = None
    for holder in (result, params):
        thread = holder.get("thread") if isinstance(holder, dict) else None
        version = harness_version(thread.get("cliVersion")) if isinstance(thread, dict) else None
        if version is not None:
            found = HarnessBuild(version=version, from_user_agent=False)
    return found


COLLAB_ITEM: Final = "collabAgentToolCall"
TURN_EVENTS: Final = frozenset({"turn/started", "turn/completed"})


def _spawned(params: object) -> list[object]:
    """The children a finished `spawnAgent` item started; any other collab tool says nothing here,
    and one that does not read as a spawn is no drop (it is nothing about the parent's numbers)."""
    item = params.get("item") if isinstance(params, dict) else None
    if not isinstance(item, dict) or item.get("tool") != "spawnAgent":
        return []
    try:
        spawn = _SpawnItem.model_validate(item)
        return [SubagentsSpawned(sender_thread_id=spawn.sender_thread_id, thread_ids=tuple(spawn.receiver_thread_ids),
                                 model=spawn.model if spawn.model and len(spawn.model) <= 128 else None)]  # fmt: skip
    except ValidationError:
        return []


def _own_thread(message: dict[str, Any]) -> ThreadOpened | None:
    """The agent's own thread a `thread/started` or a response's `result.thread` names: one
    without a `parentThreadId` (a subagent's names its parent, where Codex says anything of it)."""
    if message.get("method") == THREAD_STARTED:
        holder = message.get("params")
    elif "method" not in message:
        holder = message.get("result")
    else:
        return None
    thread = holder.get("thread") if isinstance(holder, dict) else None
    if not isinstance(thread, dict) or thread.get("parentThreadId") is not None:
        return None
    thread_id = thread.get("id")
    if not isinstance(thread_id, str) or not 0 < len(thread_id) <= MAX_THREAD_ID:
        return None
    return ThreadOpened(thread_id=thread_id)


# Codex's thread ids are UUIDs; anything much longer is not one.
MAX_THREAD_ID: Final = 256


def _parse(model: type[_M], params: object, method: str) -> _M:
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        raise FrameRejected(f"{method}: {describe_validation_error(exc)}") from None


# ---------------------------------------------------------------------------------------------
# The stdout tap's envelope on the channel

_TAP_PREFIX: Final = b'{"type":' + json.dumps(FRAME_TYPE).encode() + b',"payload":'
# The most bytes one line byte becomes inside the envelope's string (`\udc80` for a stray byte).
_WORST_ESCAPE: Final = 6


def tap_frame(line: bytes, frame_type: str = FRAME_TYPE) -> bytes:
    """The channel frame (no newline) the wrapper's stdout tap sends for one stdout line: the line's
    very bytes, as the string `payload` when they are UTF-8 and in base64 as `bytes` when not. Such
    a line is never a message, but it is dropped for the very reason stdout drops it: a surrogate
    escape of its stray bytes would be a lone surrogate, which the one JSON rule refuses."""
    kind = json.dumps(frame_type).encode()
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return b'{"type":' + kind + b',"bytes":"' + base64.b64encode(line) + b'"}'
    return b'{"type":' + kind + b',"payload":' + json.dumps(text, ensure_ascii=False).encode("utf-8") + b"}"


def tapped_line(frame: dict[str, Any]) -> bytes:
    """The stdout line a tap frame carries (the inverse of `tap_frame`)."""
    payload, raw = frame.get("payload"), frame.get("bytes")
    if isinstance(payload, str):
        try:
            return payload.encode("utf-8")
        except UnicodeEncodeError:
            raise FrameRejected("payload holds a lone surrogate: not the bytes of a line") from None
    if payload is None and isinstance(raw, str):
        try:
            return base64.b64decode(raw, validate=True)
        except binascii.Error:
            raise FrameRejected(f"{FRAME_TYPE} bytes are not base64") from None
    shown = type(payload).__name__ if payload is not None else "absent"
    raise FrameRejected(f"{FRAME_TYPE} payload is not the line as a string but {shown}")


def channel_frames(kind: str, frame: dict[str, Any]) -> list[object]:
    """The channel's Codex frames: the stdout tap's `codex.rpc`, carrying one stdout line."""
    if kind != FRAME_TYPE:
        raise FrameRejected(f"not a {FRAME_TYPE} frame but {kind[:40]!r}")
    line = tapped_line(frame)
    return parse_message(line) if line.strip() else []  # a blank line, as on stdout: nothing


# ---------------------------------------------------------------------------------------------
# The transport config: built by the wrapper's launch plan, validated by the sidecar, one model


PositiveTokens = Annotated[int, Field(gt=0, le=MAX_COUNT, strict=True)]
WsAddress = Annotated[str, Field(pattern=r"^ws://[^/\s]+:[0-9]{1,5}$", max_length=300)]


class _Transport(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    # The compaction settings Codex will load (`sidecar.harnesses.codex.launch.compaction_settings`).
    auto_compact_token_limit: PositiveTokens | None = None
    model_context_window: PositiveTokens | None = None

    def compaction(self) -> CompactionConfig:
        return CompactionConfig(
            auto_compact_token_limit=self.auto_compact_token_limit, model_context_window=self.model_context_window
        )


class ChannelOnly(_Transport):
    """The app-server on stdio: the wrapper taps its stdout onto the channel; nothing to run."""

    mode: Literal["channel"] = "channel"


class Relay(_Transport):
    """`app-server --listen ws://...`: the sidecar listens where the client asked and relays."""

    mode: Literal["relay"] = "relay"
    listen: WsAddress
    upstream: WsAddress


class Rollout(_Transport):
    """An interactive seat: no app-server, the rollout file Codex writes is followed."""

    mode: Literal["rollout"] = "rollout"
    codex_home: Annotated[str, Field(min_length=1)]
    cwd: str | None = None
    started_at_ms: Annotated[int, Field(ge=0, strict=True)]
    # The wrapper, the harness's parent: the rollout its descendants hold open is this seat's.
    root_pid: Annotated[int | None, Field(ge=1, strict=True)] = None


class CodexTransport(RootModel[Annotated[ChannelOnly | Relay | Rollout, Field(discriminator="mode")]]):
    """What crosses the process boundary, as one discriminated union on both sides."""


# ---------------------------------------------------------------------------------------------
# Codex's arithmetic: pure, shared by the producer and `hctx scan`


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


def compact_at(config: CompactionConfig | None, reported_window: int | None) -> int | None:
    """The effective auto-compact limit Codex states through its config (see the module doc)."""
    limit = None if config is None else config.auto_compact_token_limit
    if config is None or limit is None:
        return None
    if config.model_context_window is not None:
        return min(limit, config.model_context_window * 9 // 10)
    if reported_window is not None and limit * 10 <= reported_window * 9:
        return limit
    return None


# (fiveHour, sevenDay) held so far.
HeldLimits = tuple[float | None, float | None]
# Their reset times, unix ms, as Codex stated them with each window (issue 29).
HeldResets = tuple[int | None, int | None]
# When each arrived, unix ms: the notification's own time (issue 35).
HeldTimes = tuple[int | None, int | None]


def merged_rate_limits(held: HeldLimits, update: RateLimitsUpdated) -> HeldLimits:
    """A sparse rolling update: a null or absent window says nothing, so it never clears one."""
    five_hour, seven_day = held
    for window in (update.primary, update.secondary):
        if window is None:
            continue
        if window.window_minutes == FIVE_HOUR_MINUTES:
            five_hour = window.used_percent
        elif window.window_minutes == SEVEN_DAY_MINUTES:
            seven_day = window.used_percent
    return five_hour, seven_day


def merged_resets(held: HeldResets, update: RateLimitsUpdated) -> HeldResets:
    """Each window's reset goes with its percent: a window that came restates its reset (null when
    this snapshot stated none, so an old reset never rides a newer percent)."""
    five_hour, seven_day = held
    for window in (update.primary, update.secondary):
        if window is None:
            continue
        resets = None if window.resets_at_s is None else window.resets_at_s * 1000
        if window.window_minutes == FIVE_HOUR_MINUTES:
            five_hour = resets
        elif window.window_minutes == SEVEN_DAY_MINUTES:
            seven_day = resets
    return five_hour, seven_day


def merged_times(held: HeldTimes, update: RateLimitsUpdated, at_ms: int) -> HeldTimes:
    """Each window the update carries arrived at `at_ms`; one it leaves out keeps its own time."""
    five_hour, seven_day = held
    for window in (update.primary, update.secondary):
        if window is None:
            continue
        if window.window_minutes == FIVE_HOUR_MINUTES:
            five_hour = at_ms
        elif window.window_minutes == SEVEN_DAY_MINUTES:
            seven_day = at_ms
    return five_hour, seven_day


def rate_limit_times(held: HeldTimes) -> RateLimitTimes | None:
    five_hour, seven_day = held
    if five_hour is None and seven_day is None:
        return None
    return RateLimitTimes(five_hour=five_hour, seven_day=seven_day)


def rate_limits(held: HeldLimits) -> RateLimits | None:
    five_hour, seven_day = held
    if five_hour is None and seven_day is None:
        return None
    return RateLimits(five_hour=five_hour, seven_day=seven_day)


def rate_limit_resets(held: HeldResets) -> RateLimitResets | None:
    five_hour, seven_day = held
    if five_hour is None and seven_day is None:
        return None
    return RateLimitResets(five_hour=five_hour, seven_day=seven_day)


def _subagent_usage(usage: TokenUsage) -> dict[str, Any]:
    """A child thread's own reading, in the parent's arithmetic (the same shape, its own window)."""
    window = usage.context_window
    percent = used_percent(usage.tokens_in_window, window)
    return {
        "used_tokens": usage.tokens_in_window,
        "window_tokens": window,
        "used_percent": None if percent is None else float(percent),
        "window_source": None if window is None else "harness",
    }


def usage_fields(
    usage: TokenUsage,
    observed_at_ms: int,
    *,
    harness: Harness = "codex",
    held_limits: HeldLimits = (None, None),
    held_resets: HeldResets = (None, None),
    held_times: HeldTimes = (None, None),
    version: str | None = None,
    config: CompactionConfig | None = None,
) -> ContextFields:
    """The reading one token-usage event makes: Codex's numbers through Codex's arithmetic (the
    compaction fields are the producer's ledger's, `sidecar.held`)."""
    window = usage.context_window
    tokens_in_window = usage.tokens_in_window
    return ContextFields(
        harness=harness,
        used_tokens=tokens_in_window,
        window_tokens=window,
        used_percent=used_percent(tokens_in_window, window),
        model=None,
        cost_usd=None,
        session_total_tokens=usage.session_total_tokens,
        rate_limits=rate_limits(held_limits),
        rate_limit_resets_at_ms=rate_limit_resets(held_resets),
        rate_limits_at_ms=rate_limit_times(held_times),
        harness_version=version,
        compact_at_tokens=compact_at(config, window),
        auto_compaction=True if config is not None and config.auto_compact_token_limit is not None else None,
        observed_at_ms=observed_at_ms,
    )


# ---------------------------------------------------------------------------------------------
# The producer


class CodexProducer:
    """Sans-I/O: Codex's typed events in, full `ContextFields` readings out."""

    def __init__(self, harness: Harness = "codex") -> None:
        self.harness: Harness = harness
        # The reading, the compaction ledger and the subagents (spawned threads of the agent's own).
        self.held = Held(harness)
        self.held_limits: HeldLimits = (None, None)
        self.held_resets: HeldResets = (None, None)
        self.held_times: HeldTimes = (None, None)
        self.config: CompactionConfig | None = None
        self.version: str | None = None
        self._version_from_user_agent = False
        self._own_threads: OrderedDict[str, None] = OrderedDict()
        self._counted_items: OrderedDict[str, str | None] = OrderedDict()
        # Turns whose compaction was counted from the deprecated notification, which names no item:
        # the first item seen in such a turn is that same compaction, not a second one.
        self._legacy_turns: OrderedDict[str, bool] = OrderedDict()

    @property
    def compaction_limit(self) -> int | None:
        return None if self.config is None else self.config.auto_compact_token_limit

    def feed(self, event: object, now_ms: int) -> list[Reading]:
        if isinstance(event, TokenUsage):
            if event.thread_id in self.held.subagents:
                return self.held.subagent(event.thread_id, now_ms, **_subagent_usage(event))
            if event.thread_id not in self._own_threads:
                return []  # an unknown thread: never the agent's numbers
            return [self._token_usage(event, now_ms)]
        if isinstance(event, SubagentsSpawned):
            if event.sender_thread_id not in self._own_threads:
                return []  # a grandchild (depth > 1 is off by default): not this record's row
            if any(thread in self._own_threads for thread in event.thread_ids):
                # A child named as the agent's own thread (a broken or hostile stream) would take the
                # agent's readings into its row: refused whole, and counted as a drop.
                raise FrameRejected("a spawned child's thread id is the agent's own")
            readings: list[Reading] = []
            for thread in event.thread_ids:
                # Codex states a child's compactions as items under its thread: none yet is a 0.
                spawned = self.held.subagent(thread, now_ms, model=event.model, state="running", compactions=0)
                readings = spawned or readings
            return readings
        if isinstance(event, TurnState):
            if event.thread_id not in self.held.subagents:
                return []
            return self.held.subagent(event.thread_id, now_ms, state="running" if event.running else "finished")
        if isinstance(event, ThreadOpened):
            remember(self._own_threads, event.thread_id, None, OWN_THREADS_REMEMBERED)
            return []
        if isinstance(event, RateLimitsUpdated):
            self.held_limits = merged_rate_limits(self.held_limits, event)
            self.held_resets = merged_resets(self.held_resets, event)
            self.held_times = merged_times(self.held_times, event, now_ms)
            return self._restated_with_rate_limits()
        if isinstance(event, CompactionItem):
            return self._item(event, now_ms)
        if isinstance(event, ThreadCompacted):
            return self._legacy_compacted(event.turn_id, now_ms)
        if isinstance(event, HarnessBuild):
            self._note_version(event)
            return []
        if isinstance(event, CompactionConfig):
            self.config = event
            return []
        raise FrameRejected(f"not a Codex event but {type(event).__name__}")

    def _token_usage(self, usage: TokenUsage, now_ms: int) -> Reading:
        fields = usage_fields(
            usage,
            now_ms,
            harness=self.harness,
            held_limits=self.held_limits,
            held_resets=self.held_resets,
            held_times=self.held_times,
            version=self.version,
            config=self.config,
        )
        return self.held.measured(fields)

    def _note_version(self, build: HarnessBuild) -> None:
        if build.from_user_agent:
            self.version, self._version_from_user_agent = build.version, True
        elif not self._version_from_user_agent:
            # Once the user agent spoke, a resumed thread's cliVersion names the build that created
            # the thread, not this one.
            self.version = build.version

    def _restated_with_rate_limits(self) -> list[Reading]:
        """The held reading with the merged limits, when they changed it; nothing was re-measured,
        so its observedAtMs stays. Before any reading the limits wait for the first one."""
        held, limits, resets = self.held.reading, rate_limits(self.held_limits), rate_limit_resets(self.held_resets)
        times = rate_limit_times(self.held_times)
        if held is None:
            return []
        if (held.rate_limits, held.rate_limit_resets_at_ms) == (limits, resets):
            # The same figures, arrived again: newer, so the held reading carries their time (and a
            # write it rides dates them right), but nothing moved that warrants one.
            self.held.reading = held.model_copy(update={"rate_limits_at_ms": times})
            return []
        restated = held.model_copy(
            update={"rate_limits": limits, "rate_limit_resets_at_ms": resets, "rate_limits_at_ms": times}
        )
        return [self.held.publish(restated, rate_limits_edge=True)]

    def _item(self, item: CompactionItem, now_ms: int) -> list[Reading]:
        if item.item_id in self._counted_items:
            return []
        if item.thread_id is not None and item.thread_id not in self._own_threads:
            remember(self._counted_items, item.item_id, item.turn_id, COUNTED_ITEMS_REMEMBERED)
            if item.thread_id not in self.held.subagents:
                return []  # an unknown thread's compaction: not the agent's window
            return self.held.subagent_compacted(item.thread_id, now_ms)
        remember(self._counted_items, item.item_id, item.turn_id, COUNTED_ITEMS_REMEMBERED)
        turn = item.turn_id
        if turn is not None and self._legacy_turns.get(turn):
            self._legacy_turns[turn] = False  # this item is the compaction already counted
            return []
        return self._compacted(now_ms)

    def _legacy_compacted(self, turn_id: str, now_ms: int) -> list[Reading]:
        if turn_id in self._legacy_turns or turn_id in self._counted_items.values():
            return []
        remember(self._legacy_turns, turn_id, True, COUNTED_ITEMS_REMEMBERED)
        return self._compacted(now_ms)

    def _compacted(self, now_ms: int) -> list[Reading]:
        """The edge, on the held reading with the limits and build held since (Codex names no trigger)."""
        return self.held.compacted(
            now_ms,
            rate_limits=rate_limits(self.held_limits),
            rate_limit_resets_at_ms=rate_limit_resets(self.held_resets),
            rate_limits_at_ms=rate_limit_times(self.held_times),
            harness_version=self.version,
        )


# ---------------------------------------------------------------------------------------------
# Recordings and the spec


def _rollout_decoder() -> Decoder:
    # Imported here: a stdio or relay seat never reads a rollout, nor pays for its models.
    from sidecar.harnesses.codex.transcript import RolloutDecoder

    return RolloutDecoder()


SPEC = HarnessSpec(
    name="codex",
    make_producer=CodexProducer,
    channel_frames=channel_frames,
    decoders={
        STDOUT: lambda: LineDecoder(parse_message, where=STDOUT),
        WEBSOCKET: lambda: MessageDecoder(parse_message, where=WEBSOCKET),
        ROLLOUT: _rollout_decoder,
    },
    verified_versions=CODEX_CONTEXT_VERIFIED_VERSIONS,
    package=__name__.rpartition(".")[0],  # sidecar.harnesses.codex: every module below is its own
    transport="transport",
    transport_config=CodexTransport,
    tap_frame=tap_frame,
    transcripts="scan",
    programs=("codex", "@openai/codex"),
    # JSON-RPC methods, thread/turn/item ids, models, builds and times; a rollout's types (never a
    # cwd, a message, a command's output, an email, a token or an instruction).
    recorded_strings=frozenset(
        {
            "method",
            "type",
            "tool",
            "id",
            "threadId",
            "turnId",
            "itemId",
            "senderThreadId",
            "receiverThreadIds",
            "parentThreadId",
            "model",
            "cliVersion",
            "userAgent",
            "limitId",
            "limit_id",
            "source",
            "timestamp",
        }
    ),
    recorded_json_strings=frozenset({"payload"}),  # the stdout tap's line (tap_frame)
)
