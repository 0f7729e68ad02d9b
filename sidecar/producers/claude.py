"""Claude Code: status-line payloads carry the window, compaction hooks carry the count.

Frames (sent by `hctx-statusline` / `hctx-hook`, see `sidecar.claude_tee`):
    {"type": "claude.statusline", "payload": <statusLine stdin JSON>}
    {"type": "claude.hook",       "payload": <PreCompact | PostCompact | SessionStart stdin JSON>}

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

import json
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from guard.policy import Reading
from guard.record import CompactionTrigger, ContextFields, Count, Harness, RateLimits, describe_validation_error
from sidecar.producers.base import (
    Frame,
    FrameRejected,
    Percent,
    TolerantModel,
    Usd,
    harness_version,
    instant_ms,
    optional_model,
)

STATUSLINE_FRAME = "claude.statusline"
HOOK_FRAME = "claude.hook"

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


class _Envelope(TolerantModel):
    type: Literal["claude.statusline", "claude.hook"]
    payload: dict[str, Any]


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


class _RateWindow(TolerantModel):
    used_percentage: Percent
    resets_at: _Number | None = None  # epoch seconds


class _Hook(TolerantModel):
    hook_event_name: Annotated[str, Field(strict=True)]
    prompt_id: Annotated[str, Field(strict=True)] | None = None
    trigger: Annotated[str, Field(strict=True)] | None = None
    source: Annotated[str, Field(strict=True)] | None = None


@dataclass(frozen=True, slots=True)
class _Compaction:
    count: int = 0
    last_ms: int | None = None
    trigger: CompactionTrigger | None = None


class ClaudeProducer:
    harness: Harness = "claude"

    def __init__(self) -> None:
        self._reading: ContextFields | None = None
        self._compaction = _Compaction()
        # Per prompt_id, how many of each compaction edge arrived (bounded, oldest dropped).
        self._edges: OrderedDict[str, Counter[str]] = OrderedDict()
        # Set between a counted edge and its PostCompact, for edges that carry no prompt_id.
        self._episode_open = False
        # A compaction counted before any reading existed rides the first reading as its edge.
        self._edge_pending = False

    def feed(self, frame: Frame, now_ms: int) -> list[Reading]:
        try:
            envelope = _Envelope.model_validate(frame)
        except ValidationError as exc:
            raise FrameRejected(f"not a claude frame: {describe_validation_error(exc)}") from None
        except (RecursionError, TypeError, ValueError) as exc:
            raise FrameRejected(f"not a claude frame: {type(exc).__name__}") from None
        if envelope.type == STATUSLINE_FRAME:
            return [self._statusline(envelope.payload, now_ms)]
        return self._hook(envelope.payload, now_ms)

    def _statusline(self, payload: dict[str, Any], now_ms: int) -> Reading:
        try:
            window = _StatusLine.model_validate(payload).context_window
        except ValidationError as exc:
            raise FrameRejected(
                f"status line without a readable context_window: {describe_validation_error(exc)}"
            ) from None
        measured = window.current_usage is not None
        model: _Model | None = optional_model(_Model, payload.get("model"))
        cost: _Cost | None = optional_model(_Cost, payload.get("cost"))
        try:
            fields = ContextFields(
                harness="claude",
                used_tokens=window.total_input_tokens if measured else None,
                window_tokens=window.context_window_size or None,
                used_percent=window.used_percentage if measured else None,
                model=model.id if model else None,
                cost_usd=cost.total_cost_usd if cost else None,
                session_total_tokens=None,
                rate_limits=_rate_limits(payload.get("rate_limits"), now_ms),
                compactions=self._compaction.count,
                last_compaction_ms=self._compaction.last_ms,
                last_compaction_trigger=self._compaction.trigger,
                harness_version=harness_version(payload.get("version")),
                observed_at_ms=now_ms,
            )
        except ValidationError as exc:
            raise FrameRejected(f"status line out of range: {describe_validation_error(exc)}") from None
        self._reading = fields
        edge, self._edge_pending = self._edge_pending, False
        return Reading(fields, compaction_edge=edge)

    def _hook(self, payload: dict[str, Any], now_ms: int) -> list[Reading]:
        if payload.get("agent_id") is not None:
            return []  # a subagent's compaction; this record is the top-level window (DQ-C9)
        try:
            hook = _Hook.model_validate(payload)
        except ValidationError as exc:
            raise FrameRejected(f"unreadable hook payload: {describe_validation_error(exc)}") from None
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

    def _compaction_edge(self, hook: _Hook, now_ms: int, *, always_new: bool) -> list[Reading]:
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
                self._compaction = _Compaction(self._compaction.count, now_ms, self._compaction.trigger)
            return []
        self._episode_open = True
        trigger = _TRIGGERS.get(hook.trigger or "", "unknown")
        self._compaction = _Compaction(self._compaction.count + 1, now_ms, trigger)
        if self._reading is None:
            self._edge_pending = True
            return []
        # The held reading, never re-stamped: only the compaction fields are new.
        self._reading = self._reading.model_copy(
            update={
                "compactions": self._compaction.count,
                "last_compaction_ms": now_ms,
                "last_compaction_trigger": trigger,
            }
        )
        return [Reading(self._reading, compaction_edge=True)]


def _rate_limits(value: object, now_ms: int) -> RateLimits | None:
    """`rate_limits.{five_hour,seven_day}.used_percentage` in whichever form the version gives.

    A window whose `resets_at` has passed no longer describes the account; Claude itself drops
    it from the payload once it notices, and it must not hold an exhaustion edge up meanwhile.
    """
    if not isinstance(value, dict):
        return None

    def window(name: str) -> float | None:
        parsed: _RateWindow | None = optional_model(_RateWindow, value.get(name))
        if parsed is None:
            return None
        if parsed.resets_at is not None and parsed.resets_at * 1000 <= now_ms:
            return None
        return parsed.used_percentage

    five_hour, seven_day = window("five_hour"), window("seven_day")
    if five_hour is None and seven_day is None:
        return None
    return RateLimits(five_hour=five_hour, seven_day=seven_day)


def make_producer(harness: Harness) -> ClaudeProducer:
    if harness != "claude":
        raise ValueError(f"the claude producer does not read {harness!r}")
    return ClaudeProducer()


# --- recordings -------------------------------------------------------------------------------


def decode_recording(data: bytes) -> Iterator[tuple[int | None, Frame]]:
    """JSONL of channel frames (`type`, `payload`, optional `atMs`), or raw captured payloads.

    A raw line (what the lab's capture scripts stored: the stdin JSON itself) is a hook payload
    when it names `hook_event_name` and a status-line payload otherwise. Lines that are not JSON
    objects are skipped: a truncated tail is what a killed capture leaves.
    """
    for line in data.splitlines():
        item = _json_object(line)
        if item is not None:
            yield _timed_frame(item, None)


def _json_object(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        item = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return item if isinstance(item, dict) else None


def _timed_frame(item: dict[str, Any], at_ms: int | None) -> tuple[int | None, Frame]:
    if "type" in item:
        stamp = item.get("atMs")
        own = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp >= 0 else None
        return (own if own is not None else at_ms), item
    kind = HOOK_FRAME if "hook_event_name" in item else STATUSLINE_FRAME
    return at_ms, {"type": kind, "payload": item}


# Measured arrival order of one compaction's three hooks, on both versions.
_HOOK_ORDER = {"PreCompact": 0, "SessionStart": 1, "PostCompact": 2}


def load_recordings(paths: Sequence[Path]) -> list[bytes]:
    """Merge capture files into one timed channel-frame stream for `hctx replay`.

    A capture `X.jsonl` is timed by its sibling `X.times` (one ISO-8601 instant per line) when
    there is one; channel frames by their own `atMs`. Timed frames run in time order. The lab
    kept no times for the hook captures, so an untimed hook is placed just before the first
    status-line payload of the same `prompt_id` (each compaction's hooks fire before the payload
    that follows it) and takes that payload's time; a hook with no prompt_id (SessionStart at
    startup) goes first; one whose prompt never shows up goes last.
    """
    spine: list[tuple[int | None, Frame]] = []
    loose: list[Frame] = []
    for path in paths:
        times = _times_beside(path)
        for index, item in enumerate(filter(None, map(_json_object, path.read_bytes().splitlines()))):
            at_ms, frame = _timed_frame(item, times[index] if index < len(times) else None)
            if at_ms is None and frame.get("type") == HOOK_FRAME:
                loose.append(frame)
            else:
                spine.append((at_ms, frame))
    if all(at is not None for at, _ in spine):
        spine.sort(key=lambda timed: timed[0] or 0)
    first: list[Frame] = []
    anchored: dict[str, list[Frame]] = {}
    for hook in sorted(loose, key=lambda hook: _HOOK_ORDER.get(str(_payload(hook).get("hook_event_name")), 3)):
        prompt = _payload(hook).get("prompt_id")
        if isinstance(prompt, str):
            anchored.setdefault(prompt, []).append(hook)
        else:
            first.append(hook)
    merged: list[tuple[int | None, Frame]] = []
    for at_ms, frame in spine:
        prompt = _payload(frame).get("prompt_id")
        hooks = first + (anchored.pop(prompt, []) if isinstance(prompt, str) else [])
        first = []
        merged.extend((at_ms, hook) for hook in hooks)
        merged.append((at_ms, frame))
    merged.extend((None, hook) for hook in first + [hook for hooks in anchored.values() for hook in hooks])
    lines = []
    for at_ms, frame in merged:
        stamped = frame if at_ms is None else {**frame, "atMs": at_ms}
        lines.append(json.dumps(stamped, ensure_ascii=False) + "\n")
    return ["".join(lines).encode()]


def _hook_rank(hook: Frame) -> int:
    return _HOOK_ORDER.get(str(_payload(hook).get("hook_event_name")), len(_HOOK_ORDER))


def _payload(frame: Frame) -> dict[str, Any]:
    payload = frame.get("payload")
    return payload if isinstance(payload, dict) else {}


def _times_beside(path: Path) -> list[int | None]:
    try:
        text = path.with_suffix(".times").read_bytes().decode("utf-8", "replace")
    except OSError:
        return []
    return [instant_ms(line.strip()) for line in text.splitlines()]
