"""OpenCode: the server's SSE event stream joined with the windows of `GET /config/providers`.

Frames are the `/event` stream's own JSON objects (`{"id", "type", "properties"}`: `message.updated`,
`session.updated`, `session.compacted`, `server.heartbeat`, ...), plus one frame of this project's
own, `{"type": "hctx.providers", "payload": <GET /config/providers answer>}`, which the transport
submits before the first message that needs a window it has not pulled yet.

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

Which session a TUI shows is the TUI's own route; the server learns it only when it tells the TUI
(`POST /tui/select-session` publishes `tui.session.select {sessionID}`, which the TUI obeys; measured
on 1.18.33, live). Once it has, the record follows that session: other sessions' turns are held (the
newest per session), and selecting one publishes its held turn. A route the TUI changes by itself is
invisible to the server, so then the record keeps the last selected session, named. There is no
heartbeat of a held number: every reading this producer emits is a turn that really completed, or
that same turn newly joined with its window, always with the turn's own `observedAtMs`.

`compactAtTokens` (issue 18). Source: the model's `limit` in `GET /config/providers` and the
`compaction` block of `GET /config` (`{"type": "hctx.config", "payload": <answer>, "outputTokenMax":
$OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX if set}`, pulled by the transport). Rule, read off the
1.18.25 and 1.18.33 binaries (session compaction's `usable` / `isOverflow`): no auto-compaction when
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

import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from guard.policy import Reading
from guard.record import ContextFields, Count, Harness, describe_validation_error, refuse_json_constant
from sidecar.producers.base import Frame, FrameRejected, Usd, harness_version, remember

PROVIDERS_FRAME: Final = "hctx.providers"
CONFIG_FRAME: Final = "hctx.config"
CONFIG_SCHEMA_PREFIX: Final = "https://opencode.ai/config"
# ProviderTransform.OUTPUT_TOKEN_MAX and session compaction's reserve cap, 1.18.25 and 1.18.33.
OUTPUT_TOKEN_MAX: Final = 32_000
COMPACTION_RESERVED_CAP: Final = 20_000
MESSAGE_UPDATED: Final = "message.updated"
SESSION_UPDATED: Final = "session.updated"
SESSION_COMPACTED: Final = "session.compacted"
TUI_SESSION_SELECT: Final = "tui.session.select"

# The builds whose captures the fixture tests decode (identical token and compaction behaviour).
OPENCODE_CONTEXT_VERIFIED_VERSIONS: Final = ("1.18.25", "1.18.33")

# Bounds that only keep a hostile stream from growing memory; a real server stays far below them.
SESSIONS_REMEMBERED: Final = 1024
MESSAGES_REMEMBERED: Final = 4096
COMPACTIONS_REMEMBERED: Final = 1024
WINDOWS_REMEMBERED: Final = 16384
MAX_EVENT_CHARS: Final = 16 * 1024 * 1024

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


class _MessageInfo(_Wire):
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


class _MessageProperties(_Wire):
    session_id: Id | None = Field(default=None, alias="sessionID")
    info: _MessageInfo


class _CacheTokens(_Wire):
    read: Tokens = 0
    write: Tokens = 0


class _SessionTokens(_Wire):
    input: Tokens
    output: Tokens
    reasoning: Tokens = 0
    cache: _CacheTokens = _CacheTokens()


class _SessionInfo(_Wire):
    id: Id
    cost: Usd | None = None
    tokens: _SessionTokens | None = None
    version: Any = None  # read through `harness_version`, never typed: a bad one is null, not a drop


class _SessionProperties(_Wire):
    info: _SessionInfo


class _CompactedProperties(_Wire):
    session_id: Id = Field(alias="sessionID")


class _SelectProperties(_Wire):
    session_id: Id = Field(alias="sessionID")


class _Limit(_Wire):
    context: Tokens


class _Limits(_Wire):
    """What the compaction rule reads of a model's `limit`; an odd `input`/`output` makes it unknown."""

    context: Tokens
    input: Tokens | None = None
    output: Tokens | None = None


class _Compaction(_Wire):
    auto: StrictBool | None = None
    reserved: Tokens | None = None


class _Config(_Wire):
    compaction: _Compaction | None = None


def opencode_compact_at(
    limits: _Limits | None, compaction: _Compaction | None, output_max: int | None
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
    limit: _Limits


def limits_from_providers(payload: object) -> dict[ModelKey, _Limits]:
    """Every model's `limit` as the compaction rule reads it; entries that do not validate are left out."""
    found: dict[ModelKey, _Limits] = {}
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
        raise FrameRejected(f"{PROVIDERS_FRAME}: {describe_validation_error(exc)}") from None
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


def model_named_by(frame: Frame) -> ModelKey | None:
    """The `providerID/modelID` a `message.updated` frame names (assistant or user), else None.

    Never raises: the transport asks this of every frame before the producer has seen it.
    """
    if not isinstance(frame, dict) or frame.get("type") != MESSAGE_UPDATED:
        return None
    try:
        info = _MessageProperties.model_validate(frame.get("properties")).info
    except ValidationError:
        return None
    return _model_key(info)


def _model_key(info: _MessageInfo) -> ModelKey | None:
    if info.provider_id is not None and info.model_id is not None:
        return (info.provider_id, info.model_id)
    try:
        model = _UserModel.model_validate(info.model)
    except ValidationError:
        return None
    return (model.provider_id, model.model_id)


class WindowCatalog:
    """Windows cached per `providerID/modelID`, and the models named that still lack one.

    The producer joins readings through it; the transport keeps one of its own over the same
    frames to know when a `GET /config/providers` pull is due.
    """

    def __init__(self) -> None:
        self.windows: dict[ModelKey, int] = {}
        self.missing: set[ModelKey] = set()

    def learn(self, payload: object) -> dict[ModelKey, int]:
        """Fold in a providers answer; a model listed again takes its new window."""
        windows = windows_from_providers(payload)
        self.windows.update(windows)
        while len(self.windows) > WINDOWS_REMEMBERED:
            del self.windows[next(iter(self.windows))]
        self.missing -= self.windows.keys()
        return windows

    def window(self, key: ModelKey) -> int | None:
        return self.windows.get(key)

    def note(self, key: ModelKey | None) -> bool:
        """Record that a frame named `key`; True when its window is not known."""
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


class OpenCodeProducer:
    """Sans-I/O: `/event` frames and providers answers in, full `ContextFields` readings out."""

    def __init__(self, harness: Harness = "opencode") -> None:
        self.harness: Harness = harness
        self.catalog = WindowCatalog()
        self.limits: dict[ModelKey, _Limits] = {}
        self.compaction: _Compaction | None = None  # None until a config answer was read
        self.output_max: int | None = OUTPUT_TOKEN_MAX
        self.compactions = 0
        self.last_compaction_ms: int | None = None
        self.last_reading: ContextFields | None = None
        self._turn: _Turn | None = None
        self._turns: OrderedDict[str, _Turn] = OrderedDict()  # the newest turn of each session
        self._shown: str | None = None  # the session the server last told its TUI to show
        self._sessions: OrderedDict[str, _SessionFacts] = OrderedDict()
        self._landed: OrderedDict[tuple[str | None, str], int] = OrderedDict()
        self._counted_compactions: OrderedDict[str, None] = OrderedDict()

    @property
    def missing_windows(self) -> frozenset[ModelKey]:
        """Models a message named whose window no providers answer has supplied yet."""
        return frozenset(self.catalog.missing)

    def feed(self, frame: Frame, now_ms: int) -> list[Reading]:
        envelope = _parse(_Envelope, frame, "frame")
        if envelope.type == PROVIDERS_FRAME:
            if not isinstance(frame, dict) or "payload" not in frame:
                raise FrameRejected(f"{PROVIDERS_FRAME} without a payload")
            self.catalog.learn(frame["payload"])
            self.limits.update(limits_from_providers(frame["payload"]))
            return self._joined_late()
        if envelope.type == CONFIG_FRAME:
            self._config(frame)
            return []
        if envelope.type == MESSAGE_UPDATED:
            properties = _parse(_MessageProperties, envelope.properties, MESSAGE_UPDATED)
            return self._message(properties, now_ms)
        if envelope.type == SESSION_UPDATED:
            self._session(_parse(_SessionProperties, envelope.properties, SESSION_UPDATED).info)
            return []
        if envelope.type == SESSION_COMPACTED:
            _parse(_CompactedProperties, envelope.properties, SESSION_COMPACTED)  # {sessionID}, nothing more
            return self._compacted(envelope.id, now_ms)
        if envelope.type == TUI_SESSION_SELECT:
            return self._select(_parse(_SelectProperties, envelope.properties, TUI_SESSION_SELECT).session_id)
        return []  # deltas, parts, status, heartbeats: nothing about occupancy

    def _message(self, properties: _MessageProperties, now_ms: int) -> list[Reading]:
        info = properties.info
        key = _model_key(info)
        self.catalog.note(key)
        if info.role != "assistant" or info.summary is True:
            return []  # the summarizer's total is the cost of summarizing, never the context
        total = info.tokens.total if info.tokens is not None else None
        if total is None or total == 0 or key is None:
            return []  # creation frame or a provider that reported no usage: no reading at all
        session_id = info.session_id or properties.session_id
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
        return [Reading(self._snapshot(turn))]

    def _select(self, session_id: str) -> list[Reading]:
        """The TUI now shows `session_id`: its newest turn, with that turn's own time, if one landed."""
        self._shown = session_id
        turn = self._turns.get(session_id)
        if turn is None or turn is self._turn:
            return []
        self._turn = turn
        return [Reading(self._snapshot(turn))]

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
            compactions=self.compactions,
            last_compaction_ms=self.last_compaction_ms,
            last_compaction_trigger="unknown" if self.compactions else None,
            harness_version=facts.version if facts else None,
            session_id=turn.session_id,
            compact_at_tokens=compact_at,
            auto_compaction=auto_compaction,
            observed_at_ms=turn.observed_at_ms,
        )
        self.last_reading = fields
        return fields

    def _config(self, frame: Frame) -> None:
        """A `GET /config` answer: its `compaction` block (absent is OpenCode's defaults), and the
        output cap the server's environment sets; an unreadable one leaves the point unknown."""
        try:
            config = _Config.model_validate(frame.get("payload"))
        except ValidationError:
            self.compaction = None
            return
        self.compaction = config.compaction or _Compaction()
        raw = frame.get("outputTokenMax")
        if raw is None:
            self.output_max = OUTPUT_TOKEN_MAX
        else:
            self.output_max = int(raw) if isinstance(raw, str) and raw.isdigit() and 0 < int(raw) <= 10**9 else None

    def _joined_late(self) -> list[Reading]:
        """The held turn, now that the pull it waited for supplied its window; its time is kept."""
        turn, last = self._turn, self.last_reading
        if turn is None or last is None or last.window_tokens is not None:
            return []
        if self.catalog.window(turn.key) is None:
            return []
        fields = self._snapshot(turn).model_copy(
            update={"cost_usd": last.cost_usd, "session_total_tokens": last.session_total_tokens}
        )
        self.last_reading = fields
        return [Reading(fields)]

    def _session(self, info: _SessionInfo) -> None:
        tokens = info.tokens
        total = None
        if tokens is not None:
            total = tokens.input + tokens.output + tokens.reasoning + tokens.cache.read + tokens.cache.write
        facts = _SessionFacts(info.cost, total, harness_version(info.version))
        remember(self._sessions, info.id, facts, SESSIONS_REMEMBERED)

    def _compacted(self, event_id: str | None, now_ms: int) -> list[Reading]:
        if event_id is not None:
            if event_id in self._counted_compactions:
                return []  # the same event delivered twice
            remember(self._counted_compactions, event_id, None, COMPACTIONS_REMEMBERED)
        self.compactions += 1
        self.last_compaction_ms = now_ms
        update = {
            "compactions": self.compactions,
            "last_compaction_ms": now_ms,
            "last_compaction_trigger": "unknown",
        }
        if self.last_reading is None:
            # No reading yet: the count is the only observation, and it was made now.
            fields = ContextFields(harness=self.harness, observed_at_ms=now_ms, **update)
        else:
            fields = self.last_reading.model_copy(update=update)
        self.last_reading = fields
        return [Reading(fields, compaction_edge=True)]


_M = TypeVar("_M", bound=_Wire)
_V = TypeVar("_V")


def _parse(model: type[_M], value: object, what: str) -> _M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise FrameRejected(f"{what}: {describe_validation_error(exc)}") from None
    except RecursionError:
        raise FrameRejected(f"{what}: nested too deeply") from None


def make_producer(harness: Harness) -> OpenCodeProducer:
    return OpenCodeProducer(harness)


def providers_frame(payload: object) -> Frame:
    return {"type": PROVIDERS_FRAME, "payload": payload}


def decode_recording(data: bytes) -> Iterator[tuple[int | None, Frame]]:
    """Every recording shape the lab and the transport produce, one file at a time:

    - a `GET /config/providers` answer (one JSON object with `providers`): one providers frame;
    - a `GET /config` answer (one JSON object naming OpenCode's config `$schema`): one config frame;
    - the lab's `events.jsonl` (`{"seq","t","stream","event","id","raw"}` per line): the frames of
      the `/event` stream only (`stream == "event"`), `raw` decoded, `t` (seconds) as the clock;
    - plain JSONL of event objects, or raw SSE text (`data:` lines, blank-line separated): untimed.

    A line that is not a JSON object is handed on as an untyped frame, so the producer refuses it
    and the pipeline counts the drop.
    """
    text = data.decode("utf-8", "replace")
    whole = _json_or_none(text) if text.lstrip().startswith("{") else None
    if isinstance(whole, dict) and "providers" in whole:
        yield None, providers_frame(whole)
        return
    if isinstance(whole, dict) and str(whole.get("$schema", "")).startswith(CONFIG_SCHEMA_PREFIX):
        yield None, {"type": CONFIG_FRAME, "payload": whole}
        return
    if any(line.startswith("data:") for line in text.splitlines()):
        for payload in sse_payloads(text.splitlines()):
            yield None, _as_frame(_json_or_none(payload), payload)
        return
    for line in text.splitlines():
        if not line.strip():
            continue
        value = _json_or_none(line)
        if isinstance(value, dict) and {"stream", "raw"} <= value.keys():
            if value["stream"] != "event":
                continue  # /global/event and the v2 stream repeat the same events in other envelopes
            raw = value["raw"]
            yield (
                _seconds_to_ms(value.get("t")),
                _as_frame(_json_or_none(raw) if isinstance(raw, str) else None, raw),
            )
        elif isinstance(value, dict) and "providers" in value and "type" not in value:
            yield None, providers_frame(value)
        else:
            yield None, _as_frame(value, line)


class SseParser:
    """Server-sent events, one line at a time: the `data:` payload of each event once it ends.

    OpenCode sends neither `event:` nor `id:` fields, only `data:`. An event whose data outgrows
    MAX_EVENT_CHARS is dropped whole rather than buffered without bound.
    """

    def __init__(self) -> None:
        self._data: list[str] = []
        self._size = 0
        self._oversized = False

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            return self.finish()
        if line.startswith(":"):
            return None  # an SSE comment
        name, _, value = line.partition(":")
        if name == "data" and not self._oversized:
            value = value[1:] if value.startswith(" ") else value
            self._size += len(value) + 1
            if self._size > MAX_EVENT_CHARS:
                self._oversized, self._data = True, []
            else:
                self._data.append(value)
        return None

    def finish(self) -> str | None:
        """The pending event's payload (end of an event, or of the stream)."""
        payload = "\n".join(self._data) if self._data else None
        self._data, self._size, self._oversized = [], 0, False
        return payload


def sse_payloads(lines: Iterable[str]) -> Iterator[str]:
    """The `data:` payload of every server-sent event in `lines`."""
    parser = SseParser()
    for line in lines:
        payload = parser.feed(line)
        if payload is not None:
            yield payload
    payload = parser.finish()
    if payload is not None:
        yield payload


def _as_frame(value: object, raw: object) -> Frame:
    if isinstance(value, dict):
        return value
    return {"type": None, "raw": str(raw)[:200]}


def _json_or_none(text: str) -> object:
    try:
        return json.loads(text, parse_constant=refuse_json_constant)
    except (ValueError, RecursionError):
        return None


def _seconds_to_ms(value: object) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return round(value * 1000)
    return None
