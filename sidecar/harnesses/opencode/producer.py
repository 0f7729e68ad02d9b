"""OpenCode: the server's SSE event stream joined with the windows of `GET /config/providers`.

Three wires, each decoded here into typed events (`SPEC`), the same live and in `hctx replay`:

- `sse`: the `/event` body (`text/event-stream`); each event's data is one JSON object
  (`{"id", "type", "properties"}`) that becomes a `MessageUpdated`, `SessionUpdated`,
  `SessionCompacted`, `TuiSessionSelect` or, for every other type (deltas, parts, status,
  `server.heartbeat`), an `OtherEvent`;
- `providers`: one `GET /config/providers` answer body per message: a `ProvidersAnswer`;
- `config`: one `GET /config` answer body per message: a `ConfigAnswer`.

The transport also submits one fact of the sidecar's own, `OutputTokenMax`: the
`OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX` the server inherited (`output_token_max`). The producer
says which windows it lacks (`wants`), so the transport knows when another providers pull is due.

What the lab measured (../shared/lab/opencode/README.md, 1.18.25 and 1.18.33 alike):

- An assistant message goes out as one `message.updated` with zero tokens and NO `total` key, then
  two identical completion frames carrying `tokens.total` (prompt + completion, whatever the
  provider claimed). Only a present `total` is a reading: a missing key is never zero.
- After a compaction the newest assistant message is the summarizer's (`summary: true`); its total
  is the cost of the summarization call, not the context, so it is never the reading. `summary` on
  a user message is an object (per-turn diffs) and means nothing here.
- `session.updated` carries the session's cumulative tokens (no `total`) and cost: spend, never
  occupancy. They are folded into state and ride the next reading that lands; never published alone.
- `session.compacted` is `{sessionID}` and nothing else: counted once per event, trigger unknown.

Several sessions on one server share one record: the newest reading of any session wins (the
spec's v1 rule, DQ-C10), carrying the cost and cumulative tokens of its own session, and naming it
(`sessionId`, issue 19), so a reader can tell two sessions' windows apart. `harnessVersion` is the
session's own `version` (`session.updated`: the build that created the session).

A child session is never the agent's (issue 28): the `task` tool runs a subagent in a session whose
`session.created`/`session.updated` `info.parentID` names its parent (the parent's `task` tool
part names it too, `state.metadata.sessionId` beside `parentSessionId`), and its turns arrive on
the same stream, on the subagent's own model and window. Measured live on 1.18.25 and 1.18.33 with
plain `opencode serve` (fixtures/opencode/delegation-*.events.sse): without this rule, each child's
turn was the newest reading and became the agent's. So a child's turns, its compactions and a TUI
told to show it change nothing of the record, whether or not a TUI selected a session.

Which session a TUI shows is the TUI's own route; the server learns it only when it tells the TUI
(`POST /tui/select-session` publishes `tui.session.select {sessionID}`, which the TUI obeys; measured
on 1.18.33, live). Once it has, the record follows that session: other sessions' turns are held (the
newest per session), and selecting one publishes its held turn. A route the TUI changes by itself is
invisible to the server, so then the record keeps the last selected session, named. There is no
heartbeat of a held number: every reading this producer emits is a turn that really completed, or
that same turn newly joined with its window, always with the turn's own `observedAtMs`.

`compactAtTokens` (issue 18). Source: the model's `limit` in `GET /config/providers` and the
`compaction` block of `GET /config`, and `$OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX` if set. Rule,
read off the 1.18.25 and 1.18.33 binaries (session compaction's `usable` / `isOverflow`): no auto-compaction when
`compaction.auto` is false or `limit.context` is 0; else it compacts once the turn's `tokens.total`
(the record's usedTokens) is >= `limit.input - (compaction.reserved ?? min(20000, maxOut))` where the
model has `limit.input`, else >= `limit.context - maxOut`, with maxOut = min(`limit.output`, 32000)
(0 or absent: 32000; the 32,000 is `OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX`'s default). Note that
`compaction.reserved` only counts where the model declares `limit.input`. Measured: the lab's run D
(128,000 / 8,192, no `limit.input`): 119,808; its 125,500-token turn compacted
(fixtures/opencode/*/events.jsonl), where context alone (128,000) or a 20,000 reserve (108,000)
would be wrong. Before the config is read the point is null.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads, loads_object
from guard.policy import Reading
from guard.record import ContextFields, Count, Harness, describe_validation_error
from sidecar.decoding import PROVIDERS, MessageDecoder, SseDecoder
from sidecar.held import Held
from sidecar.producer import Usd, harness_version, remember
from sidecar.spec import HarnessSpec

__all__ = [
    "COMPACTION_RESERVED_CAP",
    "CONFIG_SCHEMA_PREFIX",
    "CONFIG_WIRE",
    "HEADERS_SECONDS",
    "MAX_BACKOFF_SECONDS",
    "MAX_EVENT_BYTES",
    "MESSAGES_REMEMBERED",
    "MESSAGE_UPDATED",
    "OPENCODE_CONTEXT_VERIFIED_VERSIONS",
    "OUTPUT_TOKEN_MAX",
    "PART_UPDATED",
    "PROVIDERS_WIRE",
    "SESSIONS_REMEMBERED",
    "SESSION_COMPACTED",
    "SESSION_CREATED",
    "SESSION_UPDATED",
    "SPEC",
    "SSE_WIRE",
    "STALL_SECONDS",
    "TASK_TOOL",
    "TUI_SESSION_SELECT",
    "WINDOWS_REMEMBERED",
    "ChildSession",
    "CompactionSettings",
    "ConfigAnswer",
    "Id",
    "MessageInfo",
    "MessageUpdated",
    "ModelKey",
    "ModelLimits",
    "OpenCodeEvent",
    "OpenCodeProducer",
    "OpenCodeTransport",
    "OtherEvent",
    "OutputTokenMax",
    "ProvidersAnswer",
    "SessionCompacted",
    "SessionInfo",
    "SessionUpdated",
    "Tokens",
    "TuiSessionSelect",
    "WindowCatalog",
    "channel_frames",
    "event_of",
    "limits_from_providers",
    "model_spelling",
    "opencode_compact_at",
    "output_token_max",
    "parse_config",
    "parse_event",
    "parse_providers",
    "sse_event",
    "windows_from_providers",
]

# The wires (sidecar.harnesses.opencode.transport moves their bytes; a recording keeps them).
SSE_WIRE: Final = "sse"
PROVIDERS_WIRE: Final = PROVIDERS
CONFIG_WIRE: Final = "config"
CONFIG_SCHEMA_PREFIX: Final = "https://opencode.ai/config"
# ProviderTransform.OUTPUT_TOKEN_MAX and session compaction's reserve cap, 1.18.25 and 1.18.33.
OUTPUT_TOKEN_MAX: Final = 32_000
COMPACTION_RESERVED_CAP: Final = 20_000
MESSAGE_UPDATED: Final = "message.updated"
SESSION_UPDATED: Final = "session.updated"
SESSION_CREATED: Final = "session.created"
PART_UPDATED: Final = "message.part.updated"
TASK_TOOL: Final = "task"
SESSION_COMPACTED: Final = "session.compacted"
TUI_SESSION_SELECT: Final = "tui.session.select"

# The builds whose captures the fixture tests decode (identical token and compaction behaviour).
OPENCODE_CONTEXT_VERIFIED_VERSIONS: Final = ("1.18.25", "1.18.33")

# Bounds that only keep a hostile stream from growing memory; a real server stays far below them.
SESSIONS_REMEMBERED: Final = 1024
MESSAGES_REMEMBERED: Final = 4096
WINDOWS_REMEMBERED: Final = 16384
# One SSE event's data, and one answer body: larger is dropped whole, never buffered.
MAX_EVENT_BYTES: Final = 16 * 1024 * 1024

Tokens = Count
Id = Annotated[str, Field(min_length=1, max_length=512, strict=True)]

ModelKey = tuple[str, str]  # (providerID, modelID): modelID alone is ambiguous across providers


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class _Envelope(_Wire):
    type: Annotated[str, Field(max_length=256, strict=True)]
    id: Id | None = None
    properties: dict[str, Any] | None = None


class _MessageTokens(_Wire):
    total: Tokens | None = None


class _UserModel(_Wire):
    provider_id: Id = Field(alias="providerID")
    model_id: Id = Field(alias="modelID")


class MessageInfo(_Wire):
    id: Id
    role: Annotated[str, Field(max_length=64, strict=True)]
    session_id: Id | None = Field(default=None, alias="sessionID")
    provider_id: Id | None = Field(default=None, alias="providerID")
    model_id: Id | None = Field(default=None, alias="modelID")
    # An object (per-turn diffs) on user messages, `true` on a compaction summary: read, never typed.
    summary: Any = None
    tokens: _MessageTokens | None = None
    # `{providerID, modelID}` on user messages; read only where the message names no model itself.
    model: Any = None
    agent: Any = None  # the agent that answered (`general` in a `task` child): read, never typed


class MessageUpdated(_Wire):
    """`message.updated`: its `properties`."""

    session_id: Id | None = Field(default=None, alias="sessionID")
    info: MessageInfo


class _CacheTokens(_Wire):
    read: Tokens = 0
    write: Tokens = 0


class _SessionTokens(_Wire):
    input: Tokens
    output: Tokens
    reasoning: Tokens = 0
    cache: _CacheTokens = _CacheTokens()


class SessionInfo(_Wire):
    id: Id
    parent_id: Id | None = Field(default=None, alias="parentID")  # set on a `task` child session
    cost: Usd | None = None
    tokens: _SessionTokens | None = None
    version: Any = None  # read through `harness_version`, never typed: a bad one is null, not a drop


class SessionUpdated(_Wire):
    """`session.updated`: its `properties`."""

    info: SessionInfo


class _CompactedProperties(_Wire):
    session_id: Id = Field(alias="sessionID")


@dataclass(frozen=True, slots=True)
class SessionCompacted:
    """`session.compacted` (`{sessionID}`, nothing more); `event_id` is the event's own `id`."""

    event_id: str | None
    session_id: str


class TuiSessionSelect(_Wire):
    """`tui.session.select`: the server told its TUI to show this session."""

    session_id: Id = Field(alias="sessionID")


@dataclass(frozen=True, slots=True)
class ChildSession:
    """A session the parent's `task` tool part names as the one it runs (`state.metadata`), and
    whether that task is done (`state.status` completed or error)."""

    session_id: str
    parent_session_id: str
    finished: bool = False


class _TaskMetadata(_Wire):
    session_id: Id = Field(alias="sessionId")
    parent_session_id: Id = Field(alias="parentSessionId")


class _TaskState(_Wire):
    metadata: _TaskMetadata
    status: str | None = None


class _TaskPart(_Wire):
    type: Annotated[str, Field(max_length=64, strict=True)]
    tool: Annotated[str, Field(max_length=256, strict=True)]
    state: _TaskState


class _PartProperties(_Wire):
    part: _TaskPart


def _child_of_task_part(properties: object) -> ChildSession | None:
    """The child a `task` tool part names, or None: any other part is nothing about occupancy, so
    one that does not read as a task part is no drop."""
    try:
        part = _PartProperties.model_validate(properties).part
    except (ValidationError, RecursionError):
        return None
    if part.type != "tool" or part.tool != TASK_TOOL:
        return None
    finished = part.state.status in ("completed", "error")
    return ChildSession(part.state.metadata.session_id, part.state.metadata.parent_session_id, finished)


@dataclass(frozen=True, slots=True)
class OtherEvent:
    """Any other event type (deltas, parts, status, heartbeats): nothing about occupancy."""

    type: str


class _Limit(_Wire):
    context: Tokens


class ModelLimits(_Wire):
    """What the compaction rule reads of a model's `limit`; an odd `input`/`output` makes it unknown."""

    context: Tokens
    input: Tokens | None = None
    output: Tokens | None = None


class CompactionSettings(_Wire):
    auto: StrictBool | None = None
    reserved: Tokens | None = None


class _Config(_Wire):
    compaction: CompactionSettings | None = None


@dataclass(frozen=True, slots=True)
class ProvidersAnswer:
    """A `GET /config/providers` answer: each model's window and the limits compaction reads."""

    windows: Mapping[ModelKey, int]
    limits: Mapping[ModelKey, ModelLimits]


@dataclass(frozen=True, slots=True)
class ConfigAnswer:
    """A `GET /config` answer; `config` is None when it does not validate (the point is unknown)."""

    config: _Config | None


@dataclass(frozen=True, slots=True)
class OutputTokenMax:
    """The server's output cap (`OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX`); None: set but unreadable."""

    value: int | None


def output_token_max(raw: str | None) -> OutputTokenMax:
    """The cap the environment sets: unset is OpenCode's default, an unreadable one is unknown."""
    if raw is None:
        return OutputTokenMax(OUTPUT_TOKEN_MAX)
    readable = raw.isascii() and raw.isdigit() and 0 < int(raw) <= 10**9
    return OutputTokenMax(int(raw) if readable else None)


def opencode_compact_at(
    limits: ModelLimits | None, compaction: CompactionSettings | None, output_max: int | None
) -> tuple[int | None, bool | None]:
    """(compactAtTokens, autoCompaction) by OpenCode's own overflow rule (see the module doc);
    (None, None) until the config is read, (None, False) when `compaction.auto` is false."""
    if compaction is None:
        return None, None
    if compaction.auto is False:
        return None, False
    if limits is None or limits.context == 0 or output_max is None:
        return None, True
    max_out = min(limits.output or 0, output_max) or output_max
    if limits.input:
        reserved = compaction.reserved if compaction.reserved is not None else min(COMPACTION_RESERVED_CAP, max_out)
        return max(0, limits.input - reserved), True
    return max(0, limits.context - max_out), True


class _ProviderLimits(_Wire):
    limit: ModelLimits


def limits_from_providers(payload: object) -> dict[ModelKey, ModelLimits]:
    """Every model's `limit` as the compaction rule reads it; entries that do not validate are left out."""
    found: dict[ModelKey, ModelLimits] = {}
    for key, model in _provider_models(payload):
        try:
            found[key] = _ProviderLimits.model_validate(model).limit
        except ValidationError:
            continue
    return found


class _ProviderModel(_Wire):
    limit: _Limit


class _Provider(_Wire):
    id: Id
    models: dict[str, Any]


class _Providers(_Wire):
    providers: list[Any]


def model_spelling(key: ModelKey) -> str:
    """The record's `model`: OpenCode's own `providerID/modelID`."""
    return f"{key[0]}/{key[1]}"


def windows_from_providers(payload: object) -> dict[ModelKey, int]:
    """`limit.context` of every model in a `GET /config/providers` answer.

    `providers` is a list, `models` an object keyed by model id. Entries that do not validate, and a
    context of 0 (OpenCode's "unknown"), are left out rather than guessed at.
    """
    windows: dict[ModelKey, int] = {}
    for key, model in _provider_models(payload):
        try:
            window = _ProviderModel.model_validate(model).limit.context
        except ValidationError:
            continue
        if window > 0:
            windows[key] = window
    return windows


def _provider_models(payload: object) -> Iterator[tuple[ModelKey, object]]:
    """(key, model entry) of a `GET /config/providers` answer, at most WINDOWS_REMEMBERED of them."""
    try:
        answer = _Providers.model_validate(payload)
    except ValidationError as exc:
        raise FrameRejected(f"providers answer: {describe_validation_error(exc)}") from None
    count = 0
    for entry in answer.providers:
        try:
            provider = _Provider.model_validate(entry)
        except ValidationError:
            continue
        for model_id, model in provider.models.items():
            if count >= WINDOWS_REMEMBERED:
                return
            if 0 < len(model_id) <= 512:
                count += 1
                yield (provider.id, model_id), model


def _model_key(info: MessageInfo) -> ModelKey | None:
    if info.provider_id is not None and info.model_id is not None:
        return (info.provider_id, info.model_id)
    try:
        model = _UserModel.model_validate(info.model)
    except ValidationError:
        return None
    return (model.provider_id, model.model_id)


# --- decoding: bytes -> typed events ---------------------------------------------------------------


def event_of(frame: dict[str, Any]) -> list[object]:
    """One `/event` object as its typed event; FrameRejected (the drop's reason) for a malformed one."""
    envelope = _parse(_Envelope, frame, "frame")
    if envelope.type == MESSAGE_UPDATED:
        return [_parse(MessageUpdated, envelope.properties, MESSAGE_UPDATED)]
    if envelope.type in (SESSION_UPDATED, SESSION_CREATED):
        return [_parse(SessionUpdated, envelope.properties, envelope.type)]
    if envelope.type == PART_UPDATED and (child := _child_of_task_part(envelope.properties)) is not None:
        return [child]
    if envelope.type == SESSION_COMPACTED:
        compacted = _parse(_CompactedProperties, envelope.properties, SESSION_COMPACTED)
        return [SessionCompacted(envelope.id, compacted.session_id)]
    if envelope.type == TUI_SESSION_SELECT:
        return [_parse(TuiSessionSelect, envelope.properties, TUI_SESSION_SELECT)]
    return [OtherEvent(envelope.type)]


def parse_event(data: bytes) -> list[object]:
    """The data of one SSE event (`sse` wire)."""
    return event_of(loads_object(data, error=MalformedFrame))


def parse_providers(data: bytes) -> list[object]:
    """One `GET /config/providers` answer body (`providers` wire)."""
    payload = loads(data, error=MalformedFrame)
    return [ProvidersAnswer(windows_from_providers(payload), limits_from_providers(payload))]


def parse_config(data: bytes) -> list[object]:
    """One `GET /config` answer body (`config` wire): its `compaction` block is all that is read."""
    payload = loads(data, error=MalformedFrame)
    try:
        return [ConfigAnswer(_Config.model_validate(payload))]
    except ValidationError:
        return [ConfigAnswer(None)]


def channel_frames(kind: str, frame: dict[str, Any]) -> list[object]:
    """OpenCode's events, should a client send them on the channel: read as `/event` would."""
    return event_of(frame)


def sse_event(data: bytes) -> bytes:
    """`data` as one `text/event-stream` event, as OpenCode's server writes each (`data:` lines)."""
    return b"".join(b"data: " + line + b"\n" for line in data.split(b"\n")) + b"\n"


# --- the producer ----------------------------------------------------------------------------------


class WindowCatalog:
    """Windows cached per `providerID/modelID`, and the models named that still lack one."""

    def __init__(self) -> None:
        self.windows: dict[ModelKey, int] = {}
        self.missing: set[ModelKey] = set()

    def learn(self, windows: Mapping[ModelKey, int]) -> None:
        """Fold in a providers answer's windows; a model listed again takes its new window."""
        self.windows.update(windows)
        while len(self.windows) > WINDOWS_REMEMBERED:
            del self.windows[next(iter(self.windows))]
        self.missing -= self.windows.keys()

    def window(self, key: ModelKey) -> int | None:
        return self.windows.get(key)

    def note(self, key: ModelKey | None) -> bool:
        """Record that a message named `key`; True when its window is not known."""
        if key is None or key in self.windows:
            return False
        if len(self.missing) < WINDOWS_REMEMBERED:
            self.missing.add(key)
        return True


@dataclass(frozen=True, slots=True)
class _SessionFacts:
    cost_usd: float | None
    total_tokens: int | None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class _Turn:
    """The numerator that last landed: one completed assistant message of one session."""

    used_tokens: int
    key: ModelKey
    session_id: str | None
    observed_at_ms: int


OpenCodeEvent = (
    MessageUpdated | SessionUpdated | SessionCompacted | TuiSessionSelect | ChildSession | OtherEvent
    | ProvidersAnswer | ConfigAnswer | OutputTokenMax
)  # fmt: skip


class OpenCodeProducer:
    """Sans-I/O: OpenCode's typed events in, full `ContextFields` readings out."""

    def __init__(self, harness: Harness = "opencode") -> None:
        self.harness: Harness = harness
        self.catalog = WindowCatalog()
        self.limits: dict[ModelKey, ModelLimits] = {}
        self.compaction: CompactionSettings | None = None  # None until a config answer was read
        self.output_max: int | None = OUTPUT_TOKEN_MAX
        # The reading, the compaction ledger (keyed by the event's id) and the subagents' rows.
        self.held = Held(harness)
        self._turn: _Turn | None = None
        self._turns: OrderedDict[str, _Turn] = OrderedDict()  # the newest turn of each session
        self._shown: str | None = None  # the session the server last told its TUI to show
        self._sessions: OrderedDict[str, _SessionFacts] = OrderedDict()
        self._children: OrderedDict[str, str] = OrderedDict()  # a `task` child session -> its parent
        self._landed: OrderedDict[tuple[str | None, str], int] = OrderedDict()

    @property
    def missing_windows(self) -> frozenset[ModelKey]:
        """Models a message named whose window no providers answer has supplied yet."""
        return frozenset(self.catalog.missing)

    def wants(self) -> frozenset[ModelKey]:
        """What a pull could supply (the transport asks after each event): the missing windows."""
        return self.missing_windows

    def feed(self, event: OpenCodeEvent, now_ms: int) -> list[Reading]:
        if isinstance(event, MessageUpdated):
            return self._message(event, now_ms)
        if isinstance(event, SessionUpdated):
            self._session(event.info)
            return []
        if isinstance(event, ChildSession):
            if event.session_id == event.parent_session_id:
                # A child that is its own parent (a broken or hostile stream) would take the agent's
                # turns into a subagent row: refused, and counted as a drop.
                raise FrameRejected("a task child's session id is its parent's own")
            remember(self._children, event.session_id, event.parent_session_id, SESSIONS_REMEMBERED)
            return self._subagent(event.session_id, now_ms, state="finished" if event.finished else "running")
        if isinstance(event, SessionCompacted):
            if event.session_id in self._children:
                return self.held.subagent_compacted(event.session_id, now_ms)  # a subagent's window, not the agent's
            return self.held.compacted(now_ms, key=event.event_id)  # an event delivered twice counts once
        if isinstance(event, TuiSessionSelect):
            if event.session_id in self._children:
                return []  # a TUI showing a subagent's session: still not the agent's numbers
            return self._select(event.session_id)
        if isinstance(event, ProvidersAnswer):
            self.catalog.learn(event.windows)
            self.limits.update(event.limits)
            return self._joined_late()
        if isinstance(event, ConfigAnswer):
            # Absent `compaction` is OpenCode's defaults; an unreadable answer leaves the point unknown.
            self.compaction = None if event.config is None else event.config.compaction or CompactionSettings()
            return []
        if isinstance(event, OutputTokenMax):
            self.output_max = event.value
            return []
        if isinstance(event, OtherEvent):
            return []  # deltas, parts, status, heartbeats: nothing about occupancy
        raise FrameRejected(f"not an OpenCode event: {type(event).__name__}")

    def _message(self, properties: MessageUpdated, now_ms: int) -> list[Reading]:
        info = properties.info
        key = _model_key(info)
        self.catalog.note(key)
        if info.role != "assistant" or info.summary is True:
            return []  # the summarizer's total is the cost of summarizing, never the context
        total = info.tokens.total if info.tokens is not None else None
        if total is None or total == 0 or key is None:
            return []  # creation frame or a provider that reported no usage: no reading at all
        session_id = info.session_id or properties.session_id
        if session_id is not None and session_id in self._children:
            return self._child_turn(session_id, info, key, total, now_ms)  # never the agent's numbers
        landed = (session_id, info.id)
        if self._landed.get(landed) == total:
            return []  # the duplicated completion frame
        remember(self._landed, landed, total, MESSAGES_REMEMBERED)
        turn = _Turn(total, key, session_id, now_ms)
        if session_id is not None:
            remember(self._turns, session_id, turn, SESSIONS_REMEMBERED)
        if self._shown is not None and session_id != self._shown:
            return []  # not the session the TUI was told to show: held for when it is
        self._turn = turn
        return [self.held.measured(self._snapshot(turn))]

    def _child_turn(self, session_id: str, info: MessageInfo, key: ModelKey, total: int, now_ms: int) -> list[Reading]:
        """A `task` child's completed turn: its own row, on its own model's window."""
        window = self.catalog.window(key)
        name = info.agent if isinstance(info.agent, str) else None
        return self._subagent(
            session_id, now_ms, used_tokens=total, window_tokens=window, model=model_spelling(key),
            used_percent=None if window is None else total * 100 / window,
            window_source=None if window is None else "harness", name=name,
        )  # fmt: skip

    def _subagent(self, session_id: str, now_ms: int, **fields: Any) -> list[Reading]:
        """One subagent's row changed; a new one starts at 0 compactions (OpenCode states a session's)."""
        start = {} if session_id in self.held.subagents else {"compactions": 0}
        return self.held.subagent(session_id, now_ms, **(start | fields))

    def _select(self, session_id: str) -> list[Reading]:
        """The TUI now shows `session_id`: its newest turn, with that turn's own time, if one landed."""
        self._shown = session_id
        turn = self._turns.get(session_id)
        if turn is None or turn is self._turn:
            return []
        self._turn = turn
        return [self.held.measured(self._snapshot(turn))]

    def _snapshot(self, turn: _Turn) -> ContextFields:
        window = self.catalog.window(turn.key)
        facts = self._sessions.get(turn.session_id) if turn.session_id is not None else None
        compact_at, auto_compaction = opencode_compact_at(self.limits.get(turn.key), self.compaction, self.output_max)
        fields = ContextFields(
            harness=self.harness,
            used_tokens=turn.used_tokens,
            window_tokens=window,
            # Unrounded and unclamped: rounding would move the value into another 1% bucket.
            used_percent=None if window is None else turn.used_tokens * 100 / window,
            model=model_spelling(turn.key),
            cost_usd=facts.cost_usd if facts else None,
            session_total_tokens=facts.total_tokens if facts else None,
            rate_limits=None,
            harness_version=facts.version if facts else None,
            session_id=turn.session_id,
            compact_at_tokens=compact_at,
            auto_compaction=auto_compaction,
            observed_at_ms=turn.observed_at_ms,
        )
        return fields

    def _joined_late(self) -> list[Reading]:
        """The held turn, now that the pull it waited for supplied its window; its time is kept."""
        turn, last = self._turn, self.held.reading
        if turn is None or last is None or last.window_tokens is not None:
            return []
        if self.catalog.window(turn.key) is None:
            return []
        fields = self._snapshot(turn).model_copy(
            update={"cost_usd": last.cost_usd, "session_total_tokens": last.session_total_tokens}
        )
        return [self.held.measured(fields)]

    def _session(self, info: SessionInfo) -> None:
        tokens = info.tokens
        total = None
        if tokens is not None:
            total = tokens.input + tokens.output + tokens.reasoning + tokens.cache.read + tokens.cache.write
        facts = _SessionFacts(info.cost, total, harness_version(info.version))
        remember(self._sessions, info.id, facts, SESSIONS_REMEMBERED)
        if info.parent_id == info.id:
            raise FrameRejected("a session whose parent id is its own")  # see ChildSession in `feed`
        if info.parent_id is not None and info.id not in self._children:
            remember(self._children, info.id, info.parent_id, SESSIONS_REMEMBERED)


_M = TypeVar("_M", bound=_Wire)


def _parse(model: type[_M], value: object, what: str) -> _M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise FrameRejected(f"{what}: {describe_validation_error(exc)}") from None
    except RecursionError:
        raise FrameRejected(f"{what}: nested too deeply") from None


# --- the transport config ----------------------------------------------------------------------

# Heartbeats come every ~10 s: two and a half missed ones mean the stream is gone.
STALL_SECONDS: Final = 25.0
# Measured on 1.18.25: the first request a just-started server accepts is never answered, while
# the next one is at once. A connection whose response headers do not come promptly is retried.
HEADERS_SECONDS: Final = 3.0
# SSE has no replay: what the server emits while no stream is open is lost, so retries stay close.
MAX_BACKOFF_SECONDS: Final = 2.0


class OpenCodeTransport(BaseModel):
    """What the wrapper's launch plan hands the transport (`sidecar.harnesses.opencode.transport`), built by
    the wrapper and validated from its JSON by the sidecar: one model on both sides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Plain http:// only: the wrapper passes the address it made the server bind.
    base_url: Annotated[str, Field(pattern=r"^http://[^/?#\s]+(/[^?#\s]*)?$", max_length=2048)]
    directory: str | None = None
    stall_seconds: Annotated[float, Field(gt=0)] = STALL_SECONDS
    headers_seconds: Annotated[float, Field(gt=0)] = HEADERS_SECONDS
    max_backoff_seconds: Annotated[float, Field(gt=0)] = MAX_BACKOFF_SECONDS


SPEC = HarnessSpec(
    name="opencode",
    make_producer=OpenCodeProducer,
    channel_frames=channel_frames,
    decoders={
        SSE_WIRE: lambda: SseDecoder(parse_event, where=SSE_WIRE, max_bytes=MAX_EVENT_BYTES),
        PROVIDERS_WIRE: lambda: MessageDecoder(parse_providers, where=PROVIDERS_WIRE, max_bytes=MAX_EVENT_BYTES),
        CONFIG_WIRE: lambda: MessageDecoder(parse_config, where=CONFIG_WIRE, max_bytes=MAX_EVENT_BYTES),
    },
    verified_versions=OPENCODE_CONTEXT_VERIFIED_VERSIONS,
    package=__name__.rpartition(".")[0],  # sidecar.harnesses.opencode: every module below is its own
    transport="transport",
    programs=("opencode", "opencode-ai"),
    transport_config=OpenCodeTransport,
    # usedTokens / windowTokens, unclamped: an overrun publishes past 100.
    overruns=True,
    # Event types, ids (a task child's and its parent's), roles, models and providers, builds (never a
    # part's text, a tool's input or output, a prompt, a directory, an apiKey or an MCP token).
    recorded_strings=frozenset(
        {
            "type",
            "id",
            "sessionID",
            "sessionId",
            "parentID",
            "parentSessionId",
            "role",
            "modelID",
            "providerID",
            "model",
            "agent",
            "tool",
            "status",
            "version",
        }
    ),
)
