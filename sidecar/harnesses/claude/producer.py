"""Claude Code: status-line payloads carry the window, compaction hooks carry the count.

Frames (sent by `hctx-statusline` / `hctx-hook`, see `sidecar.harnesses.claude.tee`, which defines the types):
    {"type": "claude.statusline", "payload": <statusLine stdin JSON>}
    {"type": "claude.hook",       "payload": <PreCompact | PostCompact | SessionStart stdin JSON>}

The decoding half (`channel_frames`) validates each into a typed event, `StatusLine`, `Hook` or
`SubagentHook`; the producer folds only those. The lab's status-line and hook captures (one stdin
payload a line, `.times` beside them) were converted once into recordings of the very channel lines
the tee builds for them (scripts/convert_fixtures.py, with the tee's own `channel_line`).

Measured on 2.1.250 and 2.1.332 (lab/claude), and followed where the spec said less:
- `current_usage` is null until the first reply while `total_input_tokens` already reads 0 beside
  it, so that 0 is Claude saying it does not know yet: usedTokens and usedPercent are withheld.
- Right after a compaction the payload carries all-zero usage and `used_percentage` 0: a measured
  empty window, published as such.
- `used_percentage` is Claude's own integer, clamped to 0..100 (230000 of 200000 reads 100) and
  published as given; usedTokens keeps the unclamped numerator.
- One compaction raises PreCompact, then SessionStart(source=compact), then PostCompact, all three
  with the same `prompt_id`: the first of them to arrive counts and the others recognise it by that
  id. (The spec lets PostCompact count only when no compaction was counted at all; keyed by prompt,
  a lost PreCompact is also recovered for the second and later compactions of a session.)
- `rate_limits` exist only for a claude.ai login, as a raw float on 2.1.250 (42.370000000000005,
  120) and rounded, clamped at 100 on 2.1.332 (42.4, 100); both are published as given.
- `compactAtTokens` (issue 18) stays null: neither the status-line payload nor a hook names the
  auto-compact point (2.1.250, 2.1.332), which Claude computes itself, lets an environment variable
  move and can change server-side without a release; a number from hctx would be a guess.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import Field, ValidationError

from guard.errors import FrameRejected
from guard.policy import Reading, windows_at_limit
from guard.record import (
    CompactionTrigger,
    ContextFields,
    Count,
    Harness,
    RateLimitResets,
    RateLimits,
    describe_validation_error,
)
from sidecar.harnesses.claude.frames import HOOK_TYPE, STATUSLINE_TYPE
from sidecar.harnesses.claude.subagents import (
    SUBAGENT_WIRE,
    ClaudeTransport,
    ModelWindows,
    SubagentCompacted,
    SubagentDecoder,
    SubagentTranscript,
    SubagentUsage,
    subagent_transcript,
)
from sidecar.held import Held
from sidecar.producer import (
    SUBAGENTS_REMEMBERED,
    Percent,
    TolerantModel,
    Usd,
    harness_version,
    optional_model,
    remember,
)
from sidecar.spec import HarnessSpec

__all__ = [
    "SPEC",
    "SUBAGENT_START",
    "SUBAGENT_STOP",
    "VERIFIED_VERSIONS",
    "ClaudeEvent",
    "ClaudeProducer",
    "Hook",
    "RateWindow",
    "StatusLine",
    "SubagentHook",
    "channel_frames",
]

# The versions whose payloads the fixtures pin (HC-R13); a bump is re-measured, not assumed.
VERIFIED_VERSIONS = ("2.1.250", "2.1.332")

# The words Claude's hooks carry; anything else it might say later is recorded as unknown.
_TRIGGERS: dict[str, CompactionTrigger] = {"manual": "manual", "auto": "auto"}
# A model id is a short identifier; anything longer is not one we publish.
_MAX_MODEL_ID = 256
# Prompt ids of counted compactions, kept only to recognise the later edges of the same one.
_REMEMBERED_COMPACTIONS = 64

_Count = Count
_Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


# --- the decoding half: channel frames to typed events ------------------------------------------


class _ContextWindow(TolerantModel):
    total_input_tokens: _Count | None = None
    context_window_size: _Count | None = None
    current_usage: dict[str, Any] | None = None
    used_percentage: Percent | None = None


class _StatusLine(TolerantModel):
    context_window: _ContextWindow


class _Model(TolerantModel):
    id: Annotated[str, Field(strict=True, min_length=1, max_length=_MAX_MODEL_ID)]


class _Cost(TolerantModel):
    total_cost_usd: Usd


class RateWindow(TolerantModel):
    """One account window of `rate_limits`, as Claude gave it."""

    used_percentage: Percent
    resets_at: _Number | None = None  # epoch seconds


class Hook(TolerantModel):
    """A top-level hook's payload: PreCompact, PostCompact, SessionStart (or one Claude adds)."""

    hook_event_name: Annotated[str, Field(strict=True)]
    prompt_id: Annotated[str, Field(strict=True)] | None = None
    trigger: Annotated[str, Field(strict=True)] | None = None
    source: Annotated[str, Field(strict=True)] | None = None


@dataclass(frozen=True, slots=True)
class SubagentHook:
    """A hook naming a subagent (its payload has an `agent_id`): never this record's top-level
    window. `SubagentStart` (`agent_id`, `agent_type`) and `SubagentStop` make its row (issue 28,
    measured on 2.1.250 and 2.1.332: neither carries usage); its numbers are its own transcript's,
    which `transcript` names (SubagentStop's `agent_transcript_path`, else the file Claude writes
    beside the session's `transcript_path`), read by the transport (`wants`)."""

    event: str | None = None
    agent_id: str | None = None
    agent_type: str | None = None
    transcript: str | None = None


@dataclass(frozen=True, slots=True)
class StatusLine:
    """One status-line payload: Claude's own numbers for the top-level window, and adjacent facts.

    `measured` is whether `current_usage` was an object: null until the first reply, and then the
    `total_input_tokens` 0 beside it is Claude not knowing yet. An adjacent fact that was absent or
    malformed is None, never a guess.
    """

    total_input_tokens: int | None
    context_window_size: int | None
    used_percentage: float | None
    measured: bool
    model: str | None
    cost_usd: float | None
    five_hour: RateWindow | None
    seven_day: RateWindow | None
    version: str | None


ClaudeEvent = StatusLine | Hook | SubagentHook | ModelWindows | SubagentUsage | SubagentCompacted


def channel_frames(kind: str, frame: dict[str, Any]) -> list[object]:
    """A `claude.statusline` or `claude.hook` envelope as its typed event; FrameRejected otherwise."""
    if kind not in (STATUSLINE_TYPE, HOOK_TYPE):
        raise FrameRejected(f"not a claude frame: type {kind[:40]!r}")
    payload = frame.get("payload")
    if not isinstance(payload, dict):
        raise FrameRejected(f"not a claude frame: payload is {type(payload).__name__}, not an object")
    try:
        return [_status_line(payload) if kind == STATUSLINE_TYPE else _hook(payload)]
    except RecursionError:
        raise FrameRejected("claude frame nested too deeply") from None


def _status_line(payload: dict[str, Any]) -> StatusLine:
    try:
        window = _StatusLine.model_validate(payload).context_window
    except ValidationError as exc:
        raise FrameRejected(
            f"status line without a readable context_window: {describe_validation_error(exc)}"
        ) from None
    model: _Model | None = optional_model(_Model, payload.get("model"))
    cost: _Cost | None = optional_model(_Cost, payload.get("cost"))
    limits = payload.get("rate_limits")
    limits = limits if isinstance(limits, dict) else {}
    return StatusLine(
        total_input_tokens=window.total_input_tokens,
        context_window_size=window.context_window_size,
        used_percentage=window.used_percentage,
        measured=window.current_usage is not None,
        model=model.id if model else None,
        cost_usd=cost.total_cost_usd if cost else None,
        five_hour=optional_model(RateWindow, limits.get("five_hour")),
        seven_day=optional_model(RateWindow, limits.get("seven_day")),
        version=harness_version(payload.get("version")),
    )


def _hook(payload: dict[str, Any]) -> Hook | SubagentHook:
    if payload.get("agent_id") is not None:
        names = ("hook_event_name", "agent_id", "agent_type", "agent_transcript_path", "session_id", "transcript_path")
        event, agent, kind, named, session, session_transcript = (
            value if isinstance(value := payload.get(name), str) else None for name in names
        )
        path = None if agent is None else subagent_transcript(agent, named, session, session_transcript)
        return SubagentHook(event, agent, kind, path)
    try:
        return Hook.model_validate(payload)
    except ValidationError as exc:
        raise FrameRejected(f"unreadable hook payload: {describe_validation_error(exc)}") from None


# --- the producer ---------------------------------------------------------------------------------


SUBAGENT_START: Final = "SubagentStart"
SUBAGENT_STOP: Final = "SubagentStop"


class ClaudeProducer:
    harness: Harness = "claude"

    def __init__(self) -> None:
        # The status line comes with every turn: a compaction counted before any reading rides the
        # first one as its edge. Claude stops a session at an account window's 100%.
        self.held = Held(self.harness, exhausted=_exhausted, edge_waits_for_reading=True)
        # Per prompt_id, how many of each compaction edge arrived (bounded, oldest dropped).
        self._edges: OrderedDict[str, Counter[str]] = OrderedDict()
        # Set between a counted edge and its PostCompact, for edges that carry no prompt_id.
        self._episode_open = False
        # Each subagent's transcript, as its hooks name it (bounded as the roster is).
        self._transcripts: OrderedDict[str, str] = OrderedDict()
        self._windows: dict[str, int] = {}  # the model table the launch read

    def wants(self) -> frozenset[SubagentTranscript]:
        """The transcripts of the subagents the record carries: the transport follows a running
        one's and reads a finished one's to its end."""
        return frozenset(
            SubagentTranscript(row.id, path, row.state == "finished")
            for row in self.held.subagents.rows()
            if (path := self._transcripts.get(row.id)) is not None
        )

    def _subagent(self, hook: SubagentHook, now_ms: int) -> list[Reading]:
        """A subagent started or stopped: its row, the top-level reading as held (never re-stamped)."""
        states = {SUBAGENT_START: "running", SUBAGENT_STOP: "finished"}
        if hook.agent_id is not None and hook.transcript is not None:
            remember(self._transcripts, hook.agent_id, hook.transcript, SUBAGENTS_REMEMBERED)
        if hook.event not in states or hook.agent_id is None:
            return []  # a subagent's own tool hook (or its compaction): nothing this record states
        fields: dict[str, Any] = {"state": states[hook.event]}
        if hook.agent_type is not None:
            fields["name"] = hook.agent_type
        return self.held.subagent(hook.agent_id, now_ms, **fields)

    def _subagent_usage(self, usage: SubagentUsage, now_ms: int) -> list[Reading]:
        """A subagent's own context, from its transcript; its window from the model table, named
        as the source, or null (never the parent's)."""
        row = self.held.subagents.get(usage.agent_id)
        if row is None:
            return []  # no hook named it: a transcript is read only for a subagent this agent started
        window = self._windows.get(usage.model) if usage.model is not None else None
        return self.held.subagent(
            usage.agent_id, now_ms,
            used_tokens=usage.used_tokens,
            model=usage.model,
            window_tokens=window,
            window_source=None if window is None else "model-table",
            used_percent=None if window is None else usage.used_tokens * 100 / window,
            compactions=row.compactions or 0,  # the transcript is read from its start: exact
        )  # fmt: skip

    def _subagent_compacted(self, compacted: SubagentCompacted, now_ms: int) -> list[Reading]:
        if self.held.subagents.get(compacted.agent_id) is None:
            return []
        return self.held.subagent_compacted(compacted.agent_id, now_ms)

    def feed(self, event: ClaudeEvent, now_ms: int) -> list[Reading]:
        if isinstance(event, StatusLine):
            return [self._statusline(event, now_ms)]
        if isinstance(event, Hook):
            return self._hook(event, now_ms)
        if isinstance(event, SubagentHook):
            return self._subagent(event, now_ms)
        if isinstance(event, SubagentUsage):
            return self._subagent_usage(event, now_ms)
        if isinstance(event, SubagentCompacted):
            return self._subagent_compacted(event, now_ms)
        if isinstance(event, ModelWindows):
            self._windows = dict(event.windows)
            return []
        raise FrameRejected(f"not a claude event: {type(event).__name__}")

    def _statusline(self, line: StatusLine, now_ms: int) -> Reading:
        measured = line.measured
        try:
            fields = ContextFields(
                harness="claude",
                used_tokens=line.total_input_tokens if measured else None,
                window_tokens=line.context_window_size or None,
                used_percent=line.used_percentage if measured else None,
                model=line.model,
                cost_usd=line.cost_usd,
                session_total_tokens=None,
                rate_limits=_rate_limits(line, now_ms),
                rate_limit_resets_at_ms=_rate_limit_resets(line, now_ms),
                harness_version=line.version,
                observed_at_ms=now_ms,
            )
        except ValidationError as exc:
            raise FrameRejected(f"status line out of range: {describe_validation_error(exc)}") from None
        return self.held.measured(fields)

    def _hook(self, hook: Hook, now_ms: int) -> list[Reading]:
        event = hook.hook_event_name
        if event == "PreCompact":
            return self._compaction_edge(hook, now_ms, always_new=True)
        if event == "SessionStart" and hook.source == "compact":
            return self._compaction_edge(hook, now_ms, always_new=False)
        if event == "PostCompact":
            readings = self._compaction_edge(hook, now_ms, always_new=False)
            self._episode_open = False
            return readings
        return []  # SessionStart startup/resume/clear and other events carry no context

    def _compaction_edge(self, hook: Hook, now_ms: int, *, always_new: bool) -> list[Reading]:
        """Count each compaction once, on whichever of its three edges arrives first.

        Each compaction raises one PreCompact, one SessionStart(compact) and one PostCompact, each
        from its own process, so they may arrive in any order. Per prompt_id the compactions are
        the most edges of any one kind: order-free, and a long turn that compacts twice counts two.
        Without a prompt_id, PreCompact opens a new compaction and the other two join it.
        """
        if hook.prompt_id is not None:
            edges = self._edges.setdefault(hook.prompt_id, Counter())
            self._edges.move_to_end(hook.prompt_id)
            before = max(edges.values(), default=0)
            edges[hook.hook_event_name] += 1
            seen = max(edges.values()) == before
            while len(self._edges) > _REMEMBERED_COMPACTIONS:
                self._edges.popitem(last=False)
        else:
            seen = not always_new and self._episode_open
        if seen:
            if hook.hook_event_name == "PostCompact":
                # The same compaction, now finished: lastCompactionMs moves to when the window
                # emptied, and rides the next reading rather than writing again.
                self.held.compactions.finished(now_ms)
            return []
        self._episode_open = True
        return self.held.compacted(now_ms, _TRIGGERS.get(hook.trigger or "", "unknown"))


def _exhausted(fields: ContextFields) -> frozenset[str]:
    """The account windows Claude itself proves exhausted now: it stops a session at 100%, and
    `_rate_limits` publishes a window only while its reset is still ahead."""
    return windows_at_limit(fields.rate_limits)


def _rate_limits(line: StatusLine, now_ms: int) -> RateLimits | None:
    """`rate_limits.{five_hour,seven_day}.used_percentage` in whichever form the version gives.

    A window whose `resets_at` has passed no longer describes the account; Claude itself drops
    it from the payload once it notices, and it must not hold an exhaustion edge up meanwhile.
    """

    def window(parsed: RateWindow | None) -> float | None:
        if parsed is None:
            return None
        if parsed.resets_at is not None and parsed.resets_at * 1000 <= now_ms:
            return None
        return parsed.used_percentage

    five_hour, seven_day = window(line.five_hour), window(line.seven_day)
    if five_hour is None and seven_day is None:
        return None
    return RateLimits(five_hour=five_hour, seven_day=seven_day)


# A reset past this (epoch ms, the year 2286) is no time a harness stated: it is left unstated.
_MAX_RESET_MS = 10**13


def _rate_limit_resets(line: StatusLine, now_ms: int) -> RateLimitResets | None:
    """`rate_limits.{five_hour,seven_day}.resets_at` (epoch seconds; Claude rounds the header's), in
    ms, for each window `_rate_limits` publishes."""

    def resets(parsed: RateWindow | None) -> int | None:
        if parsed is None or parsed.resets_at is None or not 0 < parsed.resets_at * 1000 < _MAX_RESET_MS:
            return None
        at = round(parsed.resets_at * 1000)
        return at if at > now_ms else None  # a window past its reset is not published at all

    five_hour, seven_day = resets(line.five_hour), resets(line.seven_day)
    if five_hour is None and seven_day is None:
        return None
    return RateLimitResets(five_hour=five_hour, seven_day=seven_day)


SPEC = HarnessSpec(
    name="claude",
    make_producer=ClaudeProducer,
    channel_frames=channel_frames,
    decoders={SUBAGENT_WIRE: SubagentDecoder},
    verified_versions=VERIFIED_VERSIONS,
    package=__name__.rpartition(".")[0],  # sidecar.harnesses.claude: every module below is its own
    transport="follow",
    transport_config=ClaudeTransport,
    programs=("claude", "@anthropic-ai/claude-code"),
    transcripts="transcript",
    model_windows="windows",
    # What the status line, the hooks and a subagent's transcript lines are read by (never a
    # path, a cwd, a prompt, a message's content or a tool's input or output).
    recorded_strings=frozenset(
        {
            "type",
            "subtype",
            "hook_event_name",
            "trigger",
            "source",
            "model",
            "requestedModel",
            "version",
            "timestamp",
            "id",
            "session_id",
            "sessionId",
            "agent_id",
            "agentId",
            "agent_type",
            "prompt_id",
            "promptId",
            "requestId",
        }
    ),
)
