"""pi and omp: the shipped extension's `context` frames in, full readings out (sans-I/O).

Both harnesses answer `ctx.getContextUsage()` with the same `{tokens, contextWindow, percent}` shape
and different meanings: pi's `tokens` is built on the last assistant message's totalTokens, omp's on
its prompt tokens alone (output excluded). The record carries each as given and `harness` says
which; nothing here converts one into the other.

The frame (hctx-channel.ts beside this module writes it, one JSON object a line):

    {"type": "context", "event": "turn_end",
     "reading": {"tokens", "contextWindow", "percent", "model", "costUsd"} | null,
     "compaction": {"reason", "count"} | null,
     "compactions": <compaction entries in the harness's session store> | null,
     "compactionSettings": {"enabled", "reserveTokens"} | null,
     "version": <the host's build, the extension's reading of its package.json> | null,
     "lastCompactionAt": <the newest compaction entry's timestamp in the session store> | null}

omp (issue 28) runs each `task` subagent in the same process with the extension rebound to the
child's own session; the extension tells that session by omp's own nesting (`<parent>/<name>.jsonl`)
and sends it as `{"type": "subagent", "event", "id", "state": "running" | "finished", "reading",
"compactions"}` (`SubagentFrame`), never as `context`: the child's own `getContextUsage()` is its
row (`Held.subagent`, percent = used * 100 / window, the window the child's own), and the agent's
reading is untouched. "finished" comes with the child's `session_shutdown`, or (reading null) when
the parent is delivered omp's `async-result` naming the child's job. Measured live on 18.1.16 and
18.2.3 (tests/live/test_subagents_live.py, fixtures/pi/delegation/).

The decoding half (`channel_frames`, run by the channel's decoder on the bytes) validates each
frame into a `ContextFrame`, the one typed event `PiProducer.feed` takes. The lab's probe captures
were converted once into recordings of the frames the asset sends (scripts/convert_fixtures.py).

`reading` is null when the harness gave no usage object at all (no model, no telemetry surface, a
throwing getter); a reading whose `tokens`/`percent` are null is pi saying it does not know yet
(right after a compaction), and is published as withheld. `compaction` is set on `session_compact`
only; its `count` is harness-durable, or null when the session store could not be read, in which case
the producer degrades to counting the edge itself. `event` and `compactions` are additive to the
envelope: `compactions` rides every frame so a restarted session publishes its durable count before
its next compaction.

`compactAtTokens` (issue 18), pi only. Rule, from pi's own source (0.84.2 and 1.6.0
`core/compaction/compaction.js`): `shouldCompact` is `enabled && contextTokens > contextWindow -
reserveTokens`, checked after each assistant message on the same totalTokens numerator
`getContextUsage().tokens` reports; `enabled` defaults to true and `reserveTokens` to 16,384
(`SETTINGS_DEFAULTS.compaction`), a model's `compaction.modelOverrides["provider/id"].reserveTokens`
winning (1.6.0). So compactAt = window - reserveTokens: pi compacts once usedTokens exceeds it.
Source: the frame's additive `compactionSettings` ({enabled, reserveTokens}, null where unset), which
the extension reads through `pi.getSettings()`; pi 0.84.2 has no getSettings, so the frame carries
null and so does the record. `enabled: false` publishes null with `autoCompaction: false`.
Measured (tests/live/test_pi_live.py, pi 1.6.0, window 32,000, reserveTokens 6,000): published
26,000; a 24,960-token turn did not compact, the next 26,400-token turn compacted (reason threshold).
omp: null. Its extension API has no settings surface, and its rule (`resolveThresholdTokens`:
`thresholdTokens`, else `thresholdPercent`, else window - max(15% of window, reserveTokens), compared
with max(provider usage incl. output, its own estimate)) is not on the input-only scale omp's
usedTokens has, so no compactAt it could state would be comparable with the published reading.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from guard.errors import FrameRejected
from guard.policy import Reading
from guard.record import (
    COMPACTION_TRIGGERS,
    CompactionTrigger,
    ContextFields,
    Count,
    Harness,
    SubagentState,
    describe_validation_error,
)
from sidecar.held import Held
from sidecar.producer import Percent, Usd, harness_version, instant_ms, optional_model
from sidecar.spec import HarnessSpec, UnknownHarness

__all__ = [
    "FRAME_TYPE",
    "MAX_MODEL_ID_CHARS",
    "OMP",
    "OMP_VERIFIED_VERSIONS",
    "PI",
    "PI_DEFAULT_RESERVE_TOKENS",
    "PI_HARNESSES",
    "PI_VERIFIED_VERSIONS",
    "SUBAGENT_FRAME_TYPE",
    "ChannelCompaction",
    "ChannelCompactionSettings",
    "ChannelReading",
    "ContextFrame",
    "PiProducer",
    "SubagentFrame",
    "channel_frames",
    "pi_compact_at",
    "trigger_of",
]

PI_HARNESSES: tuple[Harness, ...] = ("pi", "omp")

# The builds the fixtures and the live suite measured (HC-R13), per harness of this channel.
PI_VERIFIED_VERSIONS = ("0.84.2", "1.6.0")
OMP_VERIFIED_VERSIONS = ("18.1.16", "18.2.3")

# A model id longer than this is not an id; refusing the frame beats publishing a megabyte of it.
MAX_MODEL_ID_CHARS = 256

_Tokens = Count
_ModelId = Annotated[str, Field(strict=True, max_length=MAX_MODEL_ID_CHARS)]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="ignore", frozen=True)


class ChannelReading(_Wire):
    """`getContextUsage()` plus the two adjacent facts; every key required, nulls kept."""

    tokens: _Tokens | None
    context_window: _Tokens | None
    percent: Percent | None
    model: _ModelId | None
    cost_usd: Usd | None


class ChannelCompaction(_Wire):
    reason: Annotated[str, Field(strict=True)] | None
    count: _Tokens | None


class ChannelCompactionSettings(_Wire):
    """pi's `compaction` settings as the user set them; null where unset (pi's default applies)."""

    enabled: StrictBool | None = None
    reserve_tokens: _Tokens | None = None


# pi 0.84.2 and 1.6.0 `SETTINGS_DEFAULTS.compaction`: auto-compaction on, 16,384 tokens reserved.
PI_DEFAULT_RESERVE_TOKENS = 16_384


def pi_compact_at(settings: ChannelCompactionSettings | None, window: int | None) -> tuple[int | None, bool | None]:
    """(compactAtTokens, autoCompaction) by pi's `shouldCompact`: window - reserveTokens when enabled;
    (None, None) where the settings were not readable, (None, False) when switched off."""
    if settings is None:
        return None, None
    if settings.enabled is False:
        return None, False
    reserve = PI_DEFAULT_RESERVE_TOKENS if settings.reserve_tokens is None else settings.reserve_tokens
    if window is None or window <= reserve:
        return None, True
    return window - reserve, True


FRAME_TYPE = "context"
SUBAGENT_FRAME_TYPE = "subagent"


class ContextFrame(_Wire):
    """The extension's one frame, validated: the typed event the producer folds."""

    type: Literal["context"]
    reading: ChannelReading | None
    compaction: ChannelCompaction | None
    compactions: _Tokens | None = None
    # The harness event the frame was sent on; anything but a string is no event name.
    event: str | None = None
    # Additive: the host's build as the extension found it, read through `harness_version`, so an
    # unreadable one is null, never a dropped frame.
    version: str | None = None
    # Additive (issue 18): pi's compaction settings, read through `optional_model`: a malformed
    # one is unreadable settings (null), never a dropped frame.
    compaction_settings: ChannelCompactionSettings | None = None
    # Additive (issue 24): when the session store's newest compaction happened, in epoch ms, read
    # through `instant_ms`: an unreadable one is unknown (null), never a dropped frame.
    last_compaction_at: int | None = None

    @field_validator("event", mode="before")
    @classmethod
    def _event_name(cls, value: object) -> str | None:
        return value if isinstance(value, str) else None

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> str | None:
        return harness_version(value)

    @field_validator("last_compaction_at", mode="before")
    @classmethod
    def _stored_time(cls, value: object) -> int | None:
        return instant_ms(value)

    @field_validator("compaction_settings", mode="before")
    @classmethod
    def _settings(cls, value: object) -> ChannelCompactionSettings | None:
        return optional_model(ChannelCompactionSettings, value)


class SubagentFrame(_Wire):
    """omp: one `task` subagent's own reading (its own session's `getContextUsage()`), or its end."""

    type: Literal["subagent"]
    id: str
    state: SubagentState
    reading: ChannelReading | None
    compactions: _Tokens | None = None  # the child's own session store's (its `event` is not read)


_FRAMES: dict[str, type[ContextFrame] | type[SubagentFrame]] = {
    FRAME_TYPE: ContextFrame,
    SUBAGENT_FRAME_TYPE: SubagentFrame,
}


def channel_frames(kind: str, frame: dict[str, Any]) -> list[object]:
    """The decoding half: a channel envelope of type `context` (or omp's `subagent`) as its validated
    `ContextFrame` (`SubagentFrame`)."""
    model = _FRAMES.get(kind)
    if model is None:
        raise FrameRejected(f"not a context frame: type {kind[:40]!r}")
    try:
        return [model.model_validate(frame, by_alias=True)]
    except ValidationError as exc:
        raise FrameRejected(f"malformed context frame: {describe_validation_error(exc)}") from None
    except RecursionError:
        raise FrameRejected("context frame nested too deeply") from None


def trigger_of(reason: str | None) -> CompactionTrigger:
    """pi's `manual`/`threshold`/`overflow` as given; no reason, or a word outside the closed set, is unknown."""
    for trigger in COMPACTION_TRIGGERS:
        if reason == trigger:
            return trigger
    return "unknown"


class PiProducer:
    """One agent's pi or omp channel: the harness-durable compaction count and the last reading."""

    def __init__(self, harness: Harness) -> None:
        if harness not in PI_HARNESSES:
            raise UnknownHarness(f"the pi channel producer serves pi and omp, not {harness!r}")
        self.harness: Harness = harness
        self.held = Held(harness)
        self.version: str | None = None
        self.settings: ChannelCompactionSettings | None = None

    def feed(self, decoded: ContextFrame | SubagentFrame, now_ms: int) -> list[Reading]:
        if not isinstance(decoded, ContextFrame | SubagentFrame):
            raise FrameRejected(f"not a context frame but {type(decoded).__name__}")
        if type(now_ms) is not int or now_ms < 0:
            raise FrameRejected(f"arrival time {now_ms!r} is not a time")
        if isinstance(decoded, SubagentFrame):
            return self._subagent(decoded, now_ms)
        ledger = self.held.compactions
        if decoded.event == "session_start":
            # A session begins (startup, `/new`, `/resume`, a fork): the edge and the reading held are
            # another session's, so a reading never carries them; its own count comes with this frame.
            self.held.new_session()
        edge = decoded.compaction
        if edge is not None:
            # The store's count already includes this compaction (it is read inside session_compact);
            # an unreadable store narrows the scope to this incarnation rather than losing the edge.
            ledger.counted(now_ms, trigger_of(edge.reason), stated=edge.count)
        elif decoded.compactions is not None:
            # A resumed or switched-to session (or this sidecar's first frame): the count its store
            # holds, and its last compaction at that entry's own time.
            ledger.stated(decoded.compactions, decoded.last_compaction_at)
        self.version = decoded.version or self.version
        # Restated on every frame; a malformed one is unreadable settings (null), never a dropped frame.
        self.settings = decoded.compaction_settings
        if decoded.reading is not None:
            return [self.held.measured(self._fields(decoded.reading, now_ms))]  # with its edge, if any
        # An edge with no reading keeps the held numbers and their time: nothing was re-measured.
        return self.held.edge(now_ms, harness_version=self.version)

    def _subagent(self, frame: SubagentFrame, now_ms: int) -> list[Reading]:
        """One subagent's row: its own session's numbers, percent as the spec computes fill; a frame
        without a reading (omp's `async-result`) only marks it finished. Never the agent's numbers."""
        fields: dict[str, Any] = {"state": frame.state}
        if frame.compactions is not None:
            fields["compactions"] = frame.compactions
        reading = frame.reading
        if reading is not None:
            used, window = reading.tokens, reading.context_window
            fields |= {
                "used_tokens": used, "window_tokens": window, "model": reading.model,
                "used_percent": None if used is None or not window else used * 100 / window,
                "window_source": None if window is None else "harness",
            }  # fmt: skip
        return self.held.subagent(frame.id, now_ms, **fields)

    def _compact_at(self, window: int | None) -> dict[str, Any]:
        compact_at, auto = pi_compact_at(self.settings if self.harness == "pi" else None, window)
        return {"compact_at_tokens": compact_at, "auto_compaction": auto}

    def _fields(self, reading: ChannelReading, now_ms: int) -> ContextFields:
        try:
            return ContextFields(
                harness=self.harness,
                used_tokens=reading.tokens,
                window_tokens=reading.context_window,
                used_percent=reading.percent,
                model=reading.model,
                cost_usd=reading.cost_usd,
                harness_version=self.version,
                observed_at_ms=now_ms,
                **self._compact_at(reading.context_window),
            )
        except ValidationError as exc:  # the frame was validated to the record's own types; defensive
            raise FrameRejected(f"reading does not make a record: {describe_validation_error(exc)}") from None


PI = HarnessSpec(
    name="pi",
    make_producer=partial(PiProducer, "pi"),
    channel_frames=channel_frames,
    decoders={},
    verified_versions=PI_VERIFIED_VERSIONS,
    package=__name__.rpartition(".")[0],  # sidecar.harnesses.pi: its launch plan loads the extension beside it
    programs=("pi", "@earendil-works/pi-coding-agent"),
    # pi and omp publish their own float: 585.6 measured against a 4,000-token window.
    overruns=True,
    # The extension's frames: types and events, models, builds, reasons and states, ids and times.
    recorded_strings=frozenset({"type", "event", "model", "version", "reason", "state", "id", "lastCompactionAt"}),
)
OMP = dataclasses.replace(
    PI,
    name="omp",
    make_producer=partial(PiProducer, "omp"),
    verified_versions=OMP_VERIFIED_VERSIONS,
    programs=("omp", "@oh-my-pi/pi-coding-agent"),
    setup="setup_omp",  # the same loader in omp's own agent directory (setup.py)
)  # pi's extension channel, decoder and launch plan; omp's row of the arithmetic
