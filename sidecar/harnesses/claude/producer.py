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
- Each Task subagent's window is Claude's own (issue 37): the `subagentStatusLine` command (hctx's
  subagent tee) is handed `tasks[]`, a row a subagent, its `id` the `agent_id` the subagent hooks name,
  `contextWindowSize` Claude's window function of the row's `model` (absent without one). That window
  rides the row as `windowSource: "harness"`; the model table gives one only to a row Claude states
  none for. The row's `tokenCount` is not occupancy and is not read (measured, `SubagentRows`).
- A snapshot of the limits is dated when it arrived (issue 35, `rateLimitsAtMs`): Claude states no
  time for them (2.1.250, 2.1.332: `rate_limits` holds `used_percentage` and `resets_at` only), and
  with hctx's `refreshInterval` an idle seat redraws the figures its process last heard every 5 s.
  So a window is dated by the status line where its percent or reset changed, or where a new API
  response shows (`cost.total_api_duration_ms` grew: every request Claude makes counts it, and each
  response restates the headers the limits come from); a repeat keeps the time it had. The first
  status line this producer sees dates what it shows: nothing older is known.
- `compactAtTokens` (issue 18, 37): neither the status-line payload nor a hook names the auto-compact
  point (2.1.250, 2.1.332). Where the user's settings (or CLAUDE_CODE_AUTO_COMPACT_WINDOW) state
  `autoCompactWindow`, it is Claude's own rule on that and the status line's window
  (`sidecar.harnesses.claude.compaction`, which quotes the rule); elsewhere Claude picks the window
  itself (server data, experiments) and it stays null. `autoCompaction` is false where Claude's
  switch (`autoCompactEnabled`, DISABLE_COMPACT) turns it off.
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
    PromptCache,
    RateLimitResets,
    RateLimits,
    RateLimitTimes,
    WindowSource,
    describe_validation_error,
)
from sidecar.harnesses.claude.compaction import ClaudeCompaction, compact_at
from sidecar.harnesses.claude.frames import HOOK_TYPE, STATUSLINE_TYPE, SUBAGENT_STATUSLINE_TYPE
from sidecar.harnesses.claude.subagents import (
    SUBAGENT_WIRE,
    ClaudeTransport,
    ModelWindows,
    SubagentCompacted,
    SubagentDecoder,
    SubagentTranscript,
    SubagentUsage,
    is_agent_id,
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
    "MAX_TASK_ROWS",
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
    "SubagentRow",
    "SubagentRows",
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


class _PromptCache(TolerantModel):
    """2.1.332's `prompt_cache` (lab/claude): the fields the record carries, as Claude gave them."""

    warm: Annotated[bool, Field(strict=True)]
    ttl: Annotated[str, Field(strict=True, pattern=r"^[0-9]{1,6}[smh]$")] | None = None
    expires_at: _Number | None = None  # epoch seconds
    hit_ratio: Annotated[float, Field(strict=False, ge=0, le=1, allow_inf_nan=False)] | None = None
    recache_tokens_if_cold: _Count | None = None
    cache_write_tokens: _Count | None = None
    requests: _Count | None = None
    misses: _Count | None = None


class _ApiDuration(TolerantModel):
    total_api_duration_ms: _Count


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
    prompt_cache: PromptCache | None = None  # 2.1.332 only (issue 37); None where absent or malformed
    # `cost.total_api_duration_ms`: grows with every API request the session made; None unstated.
    api_duration_ms: int | None = None


class _TaskRow(TolerantModel):
    """One `tasks[]` row as Claude hands it to `subagentStatusLine` (2.1.250, 2.1.332)."""

    id: Annotated[str, Field(strict=True, min_length=1, max_length=128)]
    model: Annotated[str, Field(strict=True, min_length=1, max_length=_MAX_MODEL_ID)] | None = None
    contextWindowSize: _Count | None = None  # Claude's key


@dataclass(frozen=True, slots=True)
class SubagentRow:
    """A Task subagent as Claude states it to its `subagentStatusLine`: its id (the hooks'
    `agent_id`), the model Claude runs it on, and the window Claude computes for that model."""

    agent_id: str
    model: str | None
    window_tokens: int | None


@dataclass(frozen=True, slots=True)
class SubagentRows:
    """One `subagentStatusLine` payload: the rows that were readable, in Claude's order.

    `tokenCount` is read into nothing. Measured (issue 37, the bundled code and live): it is the
    subagent's last prompt plus its last output on 2.1.332, and its last prompt plus every output it
    has produced on 2.1.250; neither is its occupancy as the record counts it (the prompt, as
    Claude's own status line counts the main agent's), and on 2.1.250 it only grows."""

    rows: tuple[SubagentRow, ...]


# A `tasks[]` this long is no panel Claude draws; the rest is dropped, never read.
MAX_TASK_ROWS: Final = 256

ClaudeEvent = (
    StatusLine
    | Hook
    | SubagentHook
    | SubagentRows
    | ModelWindows
    | ClaudeCompaction
    | SubagentUsage
    | SubagentCompacted
)


def channel_frames(kind: str, frame: dict[str, Any]) -> list[object]:
    """A `claude.statusline`, `claude.subagentstatusline` or `claude.hook` envelope as its typed
    event; FrameRejected otherwise."""
    if kind not in (STATUSLINE_TYPE, SUBAGENT_STATUSLINE_TYPE, HOOK_TYPE):
        raise FrameRejected(f"not a claude frame: type {kind[:40]!r}")
    payload = frame.get("payload")
    if not isinstance(payload, dict):
        raise FrameRejected(f"not a claude frame: payload is {type(payload).__name__}, not an object")
    try:
        if kind == SUBAGENT_STATUSLINE_TYPE:
            return [_subagent_rows(payload)]
        return [_status_line(payload) if kind == STATUSLINE_TYPE else _hook(payload)]
    except RecursionError:
        raise FrameRejected("claude frame nested too deeply") from None


def _subagent_rows(payload: dict[str, Any]) -> SubagentRows:
    """The readable rows of `tasks`: a row whose id could not be an agent id, or whose numbers are
    not counts, is left out whole (no row is a cleaned-up guess); past MAX_TASK_ROWS, none."""
    tasks = payload.get("tasks")
    if not isinstance(tasks, list):
        raise FrameRejected("subagent status line without a tasks list")
    rows = []
    for raw in tasks[:MAX_TASK_ROWS]:
        row: _TaskRow | None = optional_model(_TaskRow, raw)
        if row is not None and is_agent_id(row.id):
            rows.append(SubagentRow(row.id, row.model, row.contextWindowSize or None))
    return SubagentRows(tuple(rows))


def _status_line(payload: dict[str, Any]) -> StatusLine:
    try:
        window = _StatusLine.model_validate(payload).context_window
    except ValidationError as exc:
        raise FrameRejected(
            f"status line without a readable context_window: {describe_validation_error(exc)}"
        ) from None
    model: _Model | None = optional_model(_Model, payload.get("model"))
    cost: _Cost | None = optional_model(_Cost, payload.get("cost"))
    api: _ApiDuration | None = optional_model(_ApiDuration, payload.get("cost"))
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
        prompt_cache=_prompt_cache(payload.get("prompt_cache")),
        api_duration_ms=api.total_api_duration_ms if api else None,
    )


def _prompt_cache(value: object) -> PromptCache | None:
    """Claude's `prompt_cache` in the record's words; None where absent or not Claude's shape (never
    a half-read cache). `expires_at` is epoch seconds; past the year 2286 it is no time Claude stated."""
    cache: _PromptCache | None = optional_model(_PromptCache, value)
    if cache is None:
        return None
    expires = cache.expires_at
    expires_ms = round(expires * 1000) if expires is not None and 0 < expires * 1000 < _MAX_RESET_MS else None
    if expires is not None and expires_ms is None:
        return None
    return PromptCache(
        warm=cache.warm,
        ttl=cache.ttl,
        expires_at_ms=expires_ms,
        hit_ratio=cache.hit_ratio,
        recache_tokens_if_cold=cache.recache_tokens_if_cold,
        cache_write_tokens=cache.cache_write_tokens,
        requests=cache.requests,
        misses=cache.misses,
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
        self._auto_compact: ClaudeCompaction | None = None  # what the launch read of the settings
        # The window Claude states for each subagent (its `subagentStatusLine` rows), bounded.
        self._stated: OrderedDict[str, int] = OrderedDict()
        self._limits = _LimitTimes()

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

    def _window(self, agent_id: str, model: str | None) -> tuple[int | None, WindowSource | None]:
        """A subagent's window and its source: Claude's own where its rows stated one, else the
        model table's for its model, else none (never the parent's)."""
        stated = self._stated.get(agent_id)
        if stated is not None:
            return stated, "harness"
        table = self._windows.get(model) if model is not None else None
        return table, None if table is None else "model-table"

    def _subagent_usage(self, usage: SubagentUsage, now_ms: int) -> list[Reading]:
        """A subagent's own context, from its transcript; its window as `_window` gives it."""
        row = self.held.subagents.get(usage.agent_id)
        if row is None:
            return []  # no hook named it: a transcript is read only for a subagent this agent started
        window, source = self._window(usage.agent_id, usage.model)
        return self.held.subagent(
            usage.agent_id, now_ms,
            used_tokens=usage.used_tokens,
            model=usage.model,
            window_tokens=window,
            window_source=source,
            used_percent=None if window is None else usage.used_tokens * 100 / window,
            compactions=row.compactions or 0,  # the transcript is read from its start: exact
        )  # fmt: skip

    def _subagent_rows(self, rows: SubagentRows, now_ms: int) -> list[Reading]:
        """Claude's window for each subagent a hook already named (a row for any other id makes no
        row: `tasks[]` also lists teammates and workflows, and a hostile payload anything). Claude
        calls the command every few seconds: a row changes only when the window it states does."""
        readings: list[Reading] = []
        for stated in rows.rows:
            row = self.held.subagents.get(stated.agent_id)
            if row is None or stated.window_tokens is None:
                continue
            remember(self._stated, stated.agent_id, stated.window_tokens, SUBAGENTS_REMEMBERED)
            if (row.window_tokens, row.window_source) == (stated.window_tokens, "harness"):
                continue
            used = row.used_tokens
            readings += self.held.subagent(
                stated.agent_id, now_ms,
                window_tokens=stated.window_tokens,
                window_source="harness",
                used_percent=None if used is None else used * 100 / stated.window_tokens,
                **({} if row.model is not None or stated.model is None else {"model": stated.model}),
            )  # fmt: skip
        return readings

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
        if isinstance(event, SubagentRows):
            return self._subagent_rows(event, now_ms)
        if isinstance(event, SubagentUsage):
            return self._subagent_usage(event, now_ms)
        if isinstance(event, SubagentCompacted):
            return self._subagent_compacted(event, now_ms)
        if isinstance(event, ClaudeCompaction):
            self._auto_compact = event
            return []
        if isinstance(event, ModelWindows):
            self._windows = dict(event.windows)
            return []
        raise FrameRejected(f"not a claude event: {type(event).__name__}")

    def _statusline(self, line: StatusLine, now_ms: int) -> Reading:
        measured = line.measured
        compact_point = compact_at(self._auto_compact, line.context_window_size)
        try:
            fields = ContextFields(
                harness="claude",
                used_tokens=line.total_input_tokens if measured else None,
                window_tokens=line.context_window_size or None,
                used_percent=line.used_percentage if measured else None,
                model=line.model,
                cost_usd=line.cost_usd,
                session_total_tokens=None,
                rate_limits=(limits := _rate_limits(line, now_ms)),
                rate_limit_resets_at_ms=(resets := _rate_limit_resets(line, now_ms)),
                rate_limits_at_ms=self._limits.dated(limits, resets, line.api_duration_ms, now_ms),
                harness_version=line.version,
                compact_at_tokens=compact_point,
                prompt_cache=line.prompt_cache,
                auto_compaction=_auto_compaction(self._auto_compact, compact_point),
                observed_at_ms=now_ms,
            )
        except ValidationError as exc:
            raise FrameRejected(f"status line out of range: {describe_validation_error(exc)}") from None
        # Its limits are Claude's newest: a change of them is an edge (guard.policy), as a bucket is.
        return self.held.measured(fields, rate_limits_edge=fields.rate_limits is not None)

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


def _auto_compaction(settings: ClaudeCompaction | None, point: int | None) -> bool | None:
    """False where Claude's switch is off, true where its point is published, else unknown."""
    if settings is not None and not settings.enabled:
        return False
    return True if point is not None else None


class _LimitTimes:
    """When each window's figure arrived: the status line where its percent or reset changed, or
    where `cost.total_api_duration_ms` grew (a response restated it); a redraw keeps the old time."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[float, int | None, int]] = {}  # window -> (percent, reset, at)
        self._api_ms: int | None = None

    def dated(
        self, limits: RateLimits | None, resets: RateLimitResets | None, api_ms: int | None, now_ms: int
    ) -> RateLimitTimes | None:
        responded = api_ms is not None and (self._api_ms is None or api_ms > self._api_ms)
        if api_ms is not None:
            self._api_ms = api_ms
        times: dict[str, int | None] = {}
        for window in ("five_hour", "seven_day"):
            used = None if limits is None else getattr(limits, window)
            reset = None if resets is None else getattr(resets, window)
            if used is None:
                self._held.pop(window, None)
                times[window] = None
                continue
            held = self._held.get(window)
            at = held[2] if held is not None and held[:2] == (used, reset) and not responded else now_ms
            self._held[window] = (used, reset, at)
            times[window] = at
        if all(at is None for at in times.values()):
            return None
        return RateLimitTimes(**times)


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
            "ttl",  # prompt_cache.ttl (issue 37)
        }
    ),
)
