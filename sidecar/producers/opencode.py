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
spec's v1 rule, DQ-C10), carrying the cost and cumulative tokens of its own session. There is no
heartbeat of a held number: every reading this producer emits is a turn that really completed, or
that same turn newly joined with its window, always with the turn's own `observedAtMs`.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.policy import Reading
from guard.record import ContextFields, Count, Harness, describe_validation_error, refuse_json_constant
from sidecar.producers.base import Frame, FrameRejected, Usd, remember

PROVIDERS_FRAME: Final = "hctx.providers"
MESSAGE_UPDATED: Final = "message.updated"
SESSION_UPDATED: Final = "session.updated"
SESSION_COMPACTED: Final = "session.compacted"

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


class _SessionProperties(_Wire):
    info: _SessionInfo


class _CompactedProperties(_Wire):
    session_id: Id = Field(alias="sessionID")


class _Limit(_Wire):
    context: Tokens


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
    try:
        answer = _Providers.model_validate(payload)
    except ValidationError as exc:
        raise FrameRejected(f"{PROVIDERS_FRAME}: {describe_validation_error(exc)}") from None
    windows: dict[ModelKey, int] = {}
    for entry in answer.providers:
        try:
            provider = _Provider.model_validate(entry)
        except ValidationError:
            continue
        for model_id, model in provider.models.items():
            if len(windows) >= WINDOWS_REMEMBERED:
                return windows
            try:
                window = _ProviderModel.model_validate(model).limit.context
            except ValidationError:
                continue
            if window > 0 and 0 < len(model_id) <= 512:
                windows[(provider.id, model_id)] = window
    return windows


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
        self.compactions = 0
        self.last_compaction_ms: int | None = None
        self.last_reading: ContextFields | None = None
        self._turn: _Turn | None = None
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
            return self._joined_late()
        if envelope.type == MESSAGE_UPDATED:
            properties = _parse(_MessageProperties, envelope.properties, MESSAGE_UPDATED)
            return self._message(properties, now_ms)
        if envelope.type == SESSION_UPDATED:
            self._session(_parse(_SessionProperties, envelope.properties, SESSION_UPDATED).info)
            return []
        if envelope.type == SESSION_COMPACTED:
            _parse(_CompactedProperties, envelope.properties, SESSION_COMPACTED)  # {sessionID}, nothing more
            return self._compacted(envelope.id, now_ms)
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
        self._turn = _Turn(total, key, session_id, now_ms)
        return [Reading(self._snapshot(self._turn))]

    def _snapshot(self, turn: _Turn) -> ContextFields:
        window = self.catalog.window(turn.key)
        facts = self._sessions.get(turn.session_id) if turn.session_id is not None else None
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
            observed_at_ms=turn.observed_at_ms,
        )
        self.last_reading = fields
        return fields

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
        remember(self._sessions, info.id, _SessionFacts(info.cost, total), SESSIONS_REMEMBERED)

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
