"""`hctx watch`: the catalog as a stream of events, each handed to a user's command.

The event logic is `step`, a pure function: the state the last step left, one snapshot of the
roster and the clock in; the events and the next state out. Around it a thin shell: the roster is
re-read when watchfiles reports a changed record (inotify on Linux) and every `--reread` seconds
(staleness is time-based: no file event marks it), the state is saved atomically under the
catalog's host-local `.st2/watch/`, then each event goes to `--exec` (or stdout as a JSON line).

What is saved for an agent is what was told as far as its events' delivery was attempted: an event
is recorded as told the moment its command starts (a watch killed while it runs does not repeat it:
at most once, never twice), and one still queued when the watch stops is told by the next watch.
One hostile record or failing command costs only its own agent's events.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import json
import math
import os
import re
import signal
import stat
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.atomic import write_json_atomic
from guard.constants import CONTROL_DIR_NAME, HARNESS_CONTEXT_STALE_MS
from guard.errors import CatalogError, RecordRefused
from guard.files import read_bounded, set_aside
from guard.json_rule import loads_object
from guard.layout import check_name, control_dir
from guard.procs import pid_alive
from guard.projection import Context, SubagentReading, cache_cold_in_ms
from guard.walk import open_chain
from wrapper.arguments import existing_catalog
from wrapper.readers.render import age_text, meter_text, percent_text, subagent_label, tokens_text
from wrapper.readers.roster import AgentRow, PidProbe, RosterCache, now_ms

if TYPE_CHECKING:  # trio loads when the command runs, not with every `hctx`
    import trio

    from wrapper.readers.notice import Changes

__all__ = [
    "DEFAULT_AT",
    "DEFAULT_EXEC_TIMEOUT_S",
    "DEFAULT_REREAD_S",
    "MAX_STATE_BYTES",
    "STATE_SCHEMA",
    "WATCH_DIR_NAME",
    "Around",
    "Companion",
    "CompanionFile",
    "Deliver",
    "Event",
    "Found",
    "Kind",
    "Observation",
    "Outbox",
    "Seen",
    "Settings",
    "State",
    "StateFile",
    "dump_state",
    "dump_windows",
    "exec_command",
    "follow",
    "load_state",
    "observe",
    "parse_percents",
    "parse_state",
    "print_event",
    "read_state",
    "run_watch",
    "step",
]

Kind = Literal[
    "fresh",
    "compaction",
    "fill",
    "headroom",
    "stale",
    "rate-limit",
    "rate-limit-forecast",
    "subagent-fill",
    "cache-expiring",
]

DEFAULT_AT: tuple[float, ...] = (80, 95)
DEFAULT_EXEC_TIMEOUT_S = 10.0
DEFAULT_REREAD_S = 30.0
WATCH_DIR_NAME = "watch"
MAX_STATE_BYTES = 16 * 1024 * 1024
STATE_SCHEMA = "hctx.watch-state.v1"


# ---------------------------------------------------------------------------------------------
# The state machine (pure)


@dataclass(frozen=True, slots=True)
class Settings:
    thresholds: tuple[float, ...] = DEFAULT_AT
    headroom: int | None = None  # tokens; None: no headroom events
    cache_warn_ms: int | None = None  # issue 37: a warm prompt cache going cold within it; None: no such events


@dataclass(frozen=True, slots=True)
class Seen:
    """What watch has told about one agent: for the incarnation whose record it last read, the
    thresholds fired and not yet re-armed, whether headroom fired, the compaction count told, when
    that reading was observed; and, across incarnations, whether it told `stale` and still owes `fresh`."""

    incarnation: str
    fired: frozenset[float] = frozenset()
    headroom_fired: bool = False
    compactions: int = 0
    stale: bool = False
    observed_ms: int = 0
    # (subagent id, threshold) fired and not yet re-armed (issue 28): only the record's own subagents
    # (at most MAX_SUBAGENTS), so a runaway delegation cannot grow the state.
    subagents_fired: frozenset[tuple[str, float]] = frozenset()
    # The prompt cache expiry (`promptCache.expiresAtMs`) a cache-expiring event was told for (issue
    # 37): each turn moves it, and each new one is news once.
    cache_warned: int | None = None


State = Mapping[str, Seen]
# One event an agent's step found: its kind, the threshold crossed, and the subagent it is about.
Found = tuple[Kind, float | None, str | None]  # keyed "host/identity"


@dataclass(frozen=True, slots=True)
class Observation:
    """One roster row and the incarnation of the record behind its `context` (None: no reading)."""

    row: AgentRow
    incarnation: str | None


@dataclass(frozen=True, slots=True)
class Event:
    kind: Kind
    row: AgentRow
    incarnation: str
    threshold: float | None  # fill: the percent crossed; headroom: the --headroom margin
    at_ms: int
    # The agent's state to record once this event's delivery is attempted: what was told up to and
    # including it, none of what comes after it (None: nothing to record).
    told: Seen | None = None
    subagent: SubagentReading | None = None  # a subagent-fill's subagent row, as the record has it

    def wire(self) -> dict[str, Any]:
        return self._common(self.row.context) | self._subagent_wire() | self._cache_wire()

    def _cache_wire(self) -> dict[str, Any]:
        """A cache-expiring event says when the cache goes cold and what a re-cache costs, as stated."""
        cache = None if self.row.context is None else self.row.context.prompt_cache
        if self.kind != "cache-expiring" or cache is None:
            return {}
        return {"cacheExpiresAtMs": cache.expires_at_ms, "cacheColdInMs": cache_cold_in_ms(cache, self.at_ms),
                "recacheTokensIfCold": cache.recache_tokens_if_cold}  # fmt: skip

    def _subagent_wire(self) -> dict[str, Any]:
        """A subagent-fill names the subagent beside its agent, with the subagent's own numbers."""
        sub = self.subagent
        if sub is None:
            return {}
        return {"subagentId": sub.id, "subagentName": sub.name, "subagentState": sub.state,
                "subagentUsedPercent": sub.used_percent, "subagentUsedTokens": sub.used_tokens,
                "subagentWindowTokens": sub.window_tokens}  # fmt: skip

    def head(self) -> dict[str, Any]:
        """The keys every event's wire starts with (the agent's and the account watches' alike)."""
        return {
            "event": self.kind,
            "host": self.row.host,
            "agent": self.row.identity,
            "harness": self.row.named_harness,
            "incarnation": self.incarnation,
        }

    def _common(self, context: Context | None) -> dict[str, Any]:
        # An event of an agent with no reading (none is made today) carries nulls, never a guess.
        return {
            **self.head(),
            "threshold": self.threshold,
            "usedPercent": None if context is None else context.used_percent,
            "usedTokens": None if context is None else context.used_tokens,
            "windowTokens": None if context is None else context.window_tokens,
            "compactAtTokens": None if context is None else context.compact_at_tokens,
            "headroomTokens": None if context is None else context.headroom_tokens,
            "compactions": None if context is None else context.compactions,
            "observedAtMs": None if context is None else context.observed_at_ms,
            "ageMs": None if context is None else context.age_ms,
            "atMs": self.at_ms,
            "message": self.message(),
        }

    def env(self) -> dict[str, str]:
        """`HCTX_USED_PERCENT=96.5` for `usedPercent`, and so on; a null is the empty string. A value
        no environment can carry (a NUL, a lone surrogate) goes escaped, as JSON would spell it."""
        return {
            "HCTX_" + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper(): "" if value is None else _carried(str(value))
            for key, value in self.wire().items()
        }

    def line(self) -> str:
        """The event as one JSON line, text any stream can carry."""
        return _carried(json.dumps(self.wire(), ensure_ascii=False)) + "\n"

    def message(self) -> str:
        context = self.row.context
        name, percent = self.row.name, None if context is None else context.used_percent
        fill = "?" if percent is None else percent_text(percent)
        if self.kind == "fill":
            meter = meter_text(context)
            return (
                f"{name}: context {fill} full"
                + (f" ({meter})" if meter else "")
                + (f", at or above {self.threshold:g}%")
            )
        if self.kind == "subagent-fill" and self.subagent is not None:
            sub = self.subagent
            shown = "?" if sub.used_percent is None else percent_text(sub.used_percent)
            meter = meter_text(sub)
            return (f"{name}: subagent {subagent_label(sub).removeprefix('└ ')} context {shown} full"
                    + (f" ({meter})" if meter else "") + f", at or above {self.threshold:g}%")  # fmt: skip
        if self.kind == "headroom":
            margin = tokens_text(None if self.threshold is None else int(self.threshold))
            headroom = None if context is None else context.headroom_tokens
            return f"{name}: {tokens_text(headroom)} tokens left before it compacts, under {margin}"
        if self.kind == "cache-expiring":
            cache = None if context is None else context.prompt_cache
            left = cache_cold_in_ms(cache, self.at_ms) or 0
            recache = None if cache is None else cache.recache_tokens_if_cold
            cost = "" if recache is None else f"; the turn after writes {tokens_text(recache)} tokens again"
            return f"{name}: prompt cache goes cold in {age_text(left)}{cost}"
        if self.kind == "compaction":
            count = None if context is None else context.compactions
            return f"{name}: compacted ({count} this session); context now {fill}"
        if self.kind == "stale":
            age = 0 if context is None else context.age_ms
            return (
                f"{name}: context reading {age_text(age)} old while the agent runs "
                f"(older than {age_text(HARNESS_CONTEXT_STALE_MS)})"
            )
        return f"{name}: context reading fresh again; context {fill}"


def _carried(text: str) -> str:
    return text.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def _told_before(seen: Seen, later: list[Found], before: Seen) -> Seen:
    """`seen` (the state after all of one step's events) less what the `later` ones tell: the state
    to record once the events before them were attempted."""
    for kind, threshold, subagent in later:
        if kind == "subagent-fill" and subagent is not None and threshold is not None:
            seen = dataclasses.replace(seen, subagents_fired=seen.subagents_fired - {(subagent, threshold)})
        elif kind == "fill":
            seen = dataclasses.replace(seen, fired=seen.fired - {threshold})
        elif kind == "headroom":
            seen = dataclasses.replace(seen, headroom_fired=before.headroom_fired)
        elif kind == "compaction":
            seen = dataclasses.replace(seen, compactions=before.compactions)
        elif kind == "cache-expiring":
            seen = dataclasses.replace(seen, cache_warned=before.cache_warned)
        elif kind == "fresh":
            seen = dataclasses.replace(seen, stale=True)
        else:  # stale
            seen = dataclasses.replace(seen, stale=before.stale)
    return seen


def _subagents_reached(context: Context, seen: Seen, settings: Settings) -> frozenset[tuple[str, float]]:
    """Each of the record's subagents' thresholds at or under its own percent; a subagent whose
    percent is withheld keeps what it had (nothing fires, nothing re-arms); one the record no
    longer carries is forgotten."""
    reached: set[tuple[str, float]] = set()
    for sub in context.subagents:
        percent = sub.used_percent
        if percent is None:
            reached |= {(ident, t) for ident, t in seen.subagents_fired if ident == sub.id}
        else:
            reached |= {(sub.id, t) for t in settings.thresholds if percent >= t}
    return frozenset(reached)


def _cache_expiring(context: Context, settings: Settings, now: int) -> int | None:
    """The expiry of a warm prompt cache going cold within --cache-warn of `now`, else None."""
    cache = context.prompt_cache
    left = cache_cold_in_ms(cache, now)
    if cache is None or settings.cache_warn_ms is None or left is None or not 0 < left <= settings.cache_warn_ms:
        return None
    return cache.expires_at_ms


def _agent_step(seen: Seen, row: AgentRow, settings: Settings, now: int = 0) -> tuple[list[Found], Seen]:
    context = row.context
    assert context is not None
    if context.stale:  # a stale reading fires nothing and re-arms nothing, but may be news itself
        if row.desired_state == "running" and not seen.stale:
            return [("stale", None, None)], dataclasses.replace(seen, stale=True)
        return [], seen
    found: list[Found] = [("fresh", None, None)] if seen.stale else []
    if context.compactions > seen.compactions:
        found.append(("compaction", None, None))
    fired, headroom_fired = seen.fired, seen.headroom_fired
    percent = context.used_percent
    if percent is not None:  # withheld: nothing fires, nothing re-arms
        fired = frozenset(threshold for threshold in settings.thresholds if percent >= threshold)
        found.extend(("fill", threshold, None) for threshold in sorted(fired - seen.fired))
    headroom = context.headroom_tokens
    if settings.headroom is not None and headroom is not None:
        headroom_fired = headroom < settings.headroom
        if headroom_fired and not seen.headroom_fired:
            found.append(("headroom", settings.headroom, None))
    subagents = _subagents_reached(context, seen, settings)
    found.extend(("subagent-fill", t, ident) for ident, t in sorted(subagents - seen.subagents_fired))
    warned, expiring = seen.cache_warned, _cache_expiring(context, settings, now)
    if expiring is not None and expiring != warned:
        found.append(("cache-expiring", None, None))
        warned = expiring
    return found, Seen(seen.incarnation, fired, headroom_fired, context.compactions, False,
                       context.observed_at_ms, subagents, warned)  # fmt: skip


def _first_sight(incarnation: str, row: AgentRow, settings: Settings) -> Seen:
    """An agent this watch has never told anything about is armed from its record as it stands:
    the compactions it already had are not news, nor is the last fresh reading of a stopped agent.
    Any other fresh reading is the present, told as any reading is (and a stale one, as ever,
    fires nothing and arms nothing)."""
    context = row.context
    assert context is not None
    if row.desired_state != "stopped" or context.stale:
        return Seen(incarnation, compactions=context.compactions)
    percent, headroom = context.used_percent, context.headroom_tokens
    reached = frozenset() if percent is None else frozenset(t for t in settings.thresholds if percent >= t)
    below = settings.headroom is not None and headroom is not None and headroom < settings.headroom
    subagents = _subagents_reached(context, Seen(incarnation), settings)
    return Seen(incarnation, reached, below, context.compactions, observed_ms=context.observed_at_ms,
                subagents_fired=subagents)  # fmt: skip


def step(
    state: State, snapshot: Iterable[Observation], now: int, settings: Settings, *, partial: bool = False
) -> tuple[list[Event], dict[str, Seen]]:
    """The events one roster snapshot brings after `state`, and the state after them.

    A new incarnation starts from nothing told (its thresholds armed, zero compactions); a record of
    another incarnation observed before the reading last told is a straggler of an older one and
    changes nothing. An agent watch has never seen is armed by `_first_sight`. An agent missing from
    the snapshot is forgotten (unless the snapshot is `partial`: only the agents whose files
    changed); one present without a reading keeps what was told."""
    events: list[Event] = []
    after: dict[str, Seen] = dict(state) if partial else {}
    for observation in snapshot:
        row, incarnation = observation.row, observation.incarnation
        before = state.get(row.name)
        if row.context is None or incarnation is None:
            if before is not None:
                after[row.name] = before
            continue
        if before is None:
            before = _first_sight(incarnation, row, settings)
        elif before.incarnation != incarnation:
            if row.context.observed_at_ms < before.observed_ms:
                after[row.name] = before  # a straggler from an older incarnation
                continue
            before = Seen(incarnation, stale=before.stale)
        found, after[row.name] = _agent_step(before, row, settings, now)
        subs = {sub.id: sub for sub in row.context.subagents}
        events.extend(
            Event(kind, row, incarnation, threshold, now, _told_before(after[row.name], found[n + 1 :], before),
                  None if subagent is None else subs.get(subagent))
            for n, (kind, threshold, subagent) in enumerate(found)
        )  # fmt: skip
    return events, after


def observe(
    catalog: Path,
    now: int,
    *,
    here: str,
    alive: PidProbe = pid_alive,
    cache: RosterCache | None = None,
    only: Iterable[tuple[str, str]] | None = None,
) -> tuple[list[Observation], list[str]]:
    """The roster's rows (every host's; running-ness for this host's) with their records' incarnations;
    through `cache`, only the agents whose files changed are read again (and with `only`, the agents
    a file event named, only those of them that changed are observed). A record of an incarnation
    the claim lists as past is a straggler, and no reading."""
    views, warnings = (cache or RosterCache(catalog)).views(now, here=here, alive=alive, only=only)
    observations = []
    for view in views:
        incarnation = None if view.record is None or view.row.context is None else view.record.incarnation
        if view.claim is not None and incarnation in {past.incarnation for past in view.claim.history}:
            incarnation = None
        observations.append(Observation(view.row, incarnation))
        warnings.extend(view.row.warnings())
    return observations, warnings


# ---------------------------------------------------------------------------------------------
# The state file


class _SeenWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    incarnation: str
    fired: list[float] = []
    headroom_fired: bool = Field(default=False, alias="headroomFired")
    compactions: int = Field(default=0, ge=0)
    stale: bool = False
    observed_ms: int = Field(default=0, alias="observedMs")
    subagents_fired: list[tuple[str, float]] = Field(default=[], alias="subagentsFired", max_length=4096)
    cache_warned: int | None = Field(default=None, alias="cacheWarned")


class _StateWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_id: Literal["hctx.watch-state.v1"] = Field(alias="schema")
    agents: dict[str, _SeenWire]


def _seen_wire(seen: Seen) -> dict[str, Any]:
    wire = {"incarnation": seen.incarnation, "fired": sorted(seen.fired), "headroomFired": seen.headroom_fired,
            "compactions": seen.compactions, "stale": seen.stale, "observedMs": seen.observed_ms}  # fmt: skip
    if seen.subagents_fired:  # issue 28: left out when none, so a watch without subagents saves what it did
        wire["subagentsFired"] = sorted(seen.subagents_fired)
    if seen.cache_warned is not None:  # issue 37: likewise
        wire["cacheWarned"] = seen.cache_warned
    return wire


def dump_state(state: State, encoded: dict[str, tuple[Seen, str]] | None = None) -> bytes:
    """The state file's bytes. `encoded`: each agent's JSON from the last dump, kept by the caller
    and updated here, so a save encodes only the agents whose state changed since."""
    held = {} if encoded is None else encoded
    parts = []
    for key in sorted(state):
        seen = state[key]
        cached = held.get(key)
        if cached is None or cached[0] != seen:
            cached = held[key] = (seen, json.dumps(key) + ":" + json.dumps(_seen_wire(seen), separators=(",", ":")))
        parts.append(cached[1])
    if len(held) > len(state):
        for key in [key for key in held if key not in state]:
            del held[key]
    # One line, as json.dumps(..., separators=(",", ":")) writes it.
    return ('{"schema":"' + STATE_SCHEMA + '","agents":{' + ",".join(parts) + "}}\n").encode()


def load_state(data: bytes) -> dict[str, Seen]:
    """Raises RecordRefused (a ValueError) for a file that is not a watch state."""
    try:
        wire = _StateWire.model_validate(loads_object(data, error=RecordRefused))
    except ValidationError as exc:
        raise RecordRefused(str(exc).splitlines()[0]) from None
    return {
        key: Seen(
            seen.incarnation,
            frozenset(seen.fired),
            seen.headroom_fired,
            seen.compactions,
            seen.stale,
            seen.observed_ms,
            frozenset(seen.subagents_fired),
            seen.cache_warned,
        )
        for key, seen in wire.agents.items()
    }


_Parsed = TypeVar("_Parsed")


def read_state(dir_fd: int, name: str, path: Path, parse: Callable[[bytes], _Parsed], told: str) -> _Parsed | None:
    """A watch's state file (at most MAX_STATE_BYTES, never through a symlink) parsed; None when there
    is none, and None with the file set aside, said, when it cannot be read or parsed (`told`: what
    the watch then starts with, for the message)."""
    raw = read_bounded(dir_fd, name, MAX_STATE_BYTES)
    if raw.absent:
        return None
    problem = raw.problem
    if raw.data is not None:
        try:
            return parse(raw.data)
        except ValueError as exc:
            problem = f"unreadable ({exc})"
    try:
        aside = set_aside(dir_fd, name)
    except OSError as exc:
        log(f"{path} {problem}; starting with {told} (cannot set it aside: {exc.strerror})")
    else:
        log(f"{path} {problem}; set aside as {aside}, starting with {told}")
    return None


_Wire = TypeVar("_Wire", bound=BaseModel)


def parse_state(wire: type[_Wire], data: bytes) -> _Wire:
    """A companion state file's wire model; RecordRefused (a ValueError) for one that is not it."""
    try:
        return wire.model_validate_json(data)
    except ValidationError as exc:
        raise RecordRefused(str(exc).splitlines()[0]) from None


def dump_windows(schema: str, windows: Mapping[str, Mapping[str, object]]) -> bytes:
    """A companion state file: its schema and one entry per account window, keys sorted."""
    return (json.dumps({"schema": schema, "windows": dict(sorted(windows.items()))}, indent=1) + "\n").encode()


class CompanionFile(Generic[_Parsed]):
    """A second state file of one watch, `NAME.<kind>.json` beside `NAME.json`, under the same lock:
    read once when the watch starts (set aside and said when unreadable, as the agents' one is),
    replaced whenever a step changed what it holds. A failed save is said and the watch goes on."""

    def __init__(self, state_file: StateFile, kind: str, parse: Callable[[bytes], _Parsed],
                 dump: Callable[[_Parsed], bytes], told: str) -> None:  # fmt: skip
        self.name = state_file.name.removesuffix(".json") + f".{kind}.json"
        self.path = state_file.path.with_name(self.name)
        self._parse, self._dump, self._told = parse, dump, told

    def read(self, dir_fd: int) -> _Parsed | None:
        return read_state(dir_fd, self.name, self.path, self._parse, self._told)

    def save(self, dir_fd: int, state: _Parsed) -> None:
        try:
            write_json_atomic(dir_fd, self.name, self._dump(state), dir_fd)
        except OSError as exc:
            log(f"cannot save {self.path}: {exc}; a restart may repeat these events")


class StateFile:
    """`<catalog>/.st2/watch/NAME.json`, replaced atomically; `NAME.lock` held while a watch runs."""

    def __init__(self, catalog: Path, name: str) -> None:
        self.name = check_name("watch name", name) + ".json"
        self.path = control_dir(catalog) / WATCH_DIR_NAME / self.name
        self._catalog = catalog
        self._lock_name = name + ".lock"
        self._encoded: dict[str, tuple[Seen, str]] = {}  # dump_state's per-agent JSON

    @contextlib.contextmanager
    def held(self) -> Iterator[int]:
        """The directory's descriptor, with the lock taken; CatalogError when another watch holds it.
        A lock file that is a symlink or not a regular file is set aside, never followed."""
        dir_fd = open_chain(self._catalog, (CONTROL_DIR_NAME, WATCH_DIR_NAME), create=True)
        try:
            lock_fd = self._open_lock(dir_fd)
            try:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise CatalogError(f"another hctx watch holds {self.path} (give this one its own --name)") from None
                yield dir_fd
            finally:
                os.close(lock_fd)
        finally:
            os.close(dir_fd)

    def _open_lock(self, dir_fd: int) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for _ in range(3):  # another watch may be setting the same one aside
            try:
                fd = os.open(self._lock_name, flags, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                problem = "is a symlink"
            else:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
                problem = "is not a regular file"
            with contextlib.suppress(FileNotFoundError):
                aside = set_aside(dir_fd, self._lock_name)
                log(f"{self.path.with_name(self._lock_name)} {problem}; set aside as {aside}")
        raise CatalogError(f"{self.path.with_name(self._lock_name)} keeps being replaced by something else; refusing")

    def load(self, dir_fd: int) -> dict[str, Seen]:
        """What the last watch told; nothing, with the file set aside, when it cannot be read."""
        return read_state(dir_fd, self.name, self.path, load_state, "nothing told") or {}

    def save(self, dir_fd: int, state: State) -> None:
        write_json_atomic(dir_fd, self.name, dump_state(state, self._encoded), dir_fd)


# ---------------------------------------------------------------------------------------------
# Delivery


def log(message: str) -> None:
    print(f"hctx watch: {message}", file=sys.stderr, flush=True)


Deliver = Callable[[Event], Awaitable[None]]


class Companion(Protocol):
    """Another state machine stepping on the watch's snapshots (`wrapper.readers.account_watch`): its
    state loaded once the lock is held, and saved by `step` before its events go out; its events
    are delivered through the same outbox as the watch's own."""

    def load(self, dir_fd: int) -> None: ...

    def step(self, dir_fd: int, snapshot: list[Observation], now: int, *, partial: bool) -> list[Event]:
        """`partial`: the snapshot holds only the agents a file event named, not the whole roster."""
        ...


async def print_event(event: Event) -> None:
    sys.stdout.write(event.line())
    sys.stdout.flush()


def exec_command(command: str, timeout_s: float) -> Deliver:
    """Run `command` (a shell command line) per event: the event as one JSON line on its stdin and
    as HCTX_* variables, in a session and process group of its own; killed with its group past
    `timeout_s`. What it leaves behind (backgrounded or `setsid` children) is ended when it returns,
    times out or the watch stops (wrapper.readers.leftovers). Any failure is logged."""
    import itertools
    import secrets
    from functools import partial

    import trio

    from wrapper.readers import leftovers

    leftovers.become_subreaper()
    marks = (f"{os.getpid()}-{secrets.token_hex(4)}-{n}" for n in itertools.count())
    running: set[int] = set()  # commands' shells: their own waiter reaps them, never reap_zombies
    spawning = trio.Lock()  # a shell is in `running` before any reaping can see it

    async def kill_group(process: trio.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    async def deliver(event: Event) -> None:
        what = f"--exec for {event.kind} of {event.row.name}"
        mark = next(marks)
        env = {**os.environ, **event.env(), leftovers.MARK_ENV: mark}
        run = partial(trio.run_process, command, shell=True, stdin=event.line().encode(), env=env, check=False,
                      start_new_session=True, deliver_cancel=kill_group)  # fmt: skip
        process: trio.Process | None = None
        stopping = True
        try:
            with trio.move_on_after(timeout_s) as scope:
                async with trio.open_nursery() as nursery, spawning:
                    process = await nursery.start(run)
                    running.add(process.pid)
            stopping = False
        except OSError as exc:
            log(f"{what} could not start: {exc}")
            stopping = False
        finally:
            with trio.CancelScope(shield=True):
                if process is not None:
                    running.discard(process.pid)
                left = leftovers.marked(mark)
                if stopping:  # the watch stops: whatever it adopted goes too, marked or not
                    left.extend(leftovers.orphans(running))
                ended = await leftovers.end(left)
                async with spawning:
                    leftovers.reap_zombies(running)
            if ended:
                log(f"{what} left {ended} process{'' if ended == 1 else 'es'} running; ended")
        if process is None:
            return
        if scope.cancelled_caught:
            log(f"{what} timed out after {timeout_s:g} s; killed")
        elif process.returncode != 0:
            log(f"{what} exited with status {process.returncode}")

    return deliver


class Outbox:
    """One queue and one worker per agent: an agent's events in order, and a slow or hung command
    for one agent holding up no other agent's. It keeps what is recorded as told: per agent, the
    state as far as its events' delivery was attempted, and the latest state once none is pending.

    Saving is batched: every change since the last save goes in the next one. An event's worker
    saves before its attempt starts (what is told is on disk first: never told twice), with
    whatever else waits; the rest (a step's state, a finished delivery's) is saved by `_flusher` as
    soon as the workers woken with it have had their turn, so a step with events costs one save."""

    def __init__(self, nursery: trio.Nursery, deliver: Deliver, record: Callable[[State], None], told: State) -> None:
        import trio

        self._nursery = nursery
        self._deliver = deliver
        self._record = record
        self._told = dict(told)
        self._latest: State = told
        self._pending: dict[str, int] = {}
        self._queues: dict[str, trio.MemorySendChannel[Event]] = {}
        self._dirty = False
        self._unsaved = trio.Event()
        nursery.start_soon(self._flusher)

    def settle(self, latest: State, events: Iterable[Event]) -> None:
        """One step's outcome: its events queued, and the state recorded for every agent that owes none."""
        self._latest = latest
        for event in events:
            self.put(event)
        for name in [name for name in self._told if name not in latest and not self._pending.get(name)]:
            self._tell(name, None)
        for name, seen in latest.items():
            if not self._pending.get(name):
                self._tell(name, seen)

    def put(self, event: Event) -> None:
        import trio

        name = event.row.name
        queue = self._queues.get(name)
        if queue is None:
            queue, inbox = trio.open_memory_channel[Event](math.inf)
            self._queues[name] = queue
            self._nursery.start_soon(self._work, inbox)
        self._pending[name] = self._pending.get(name, 0) + 1
        queue.send_nowait(event)

    def flush(self) -> None:
        """Save what changed since the last save, if anything did."""
        if self._dirty:
            self._dirty = False
            self._record(self._told)

    def _tell(self, name: str, seen: Seen | None) -> None:
        if self._told.get(name) == seen:
            return
        if seen is None:
            del self._told[name]
        else:
            self._told[name] = seen
        if not self._dirty:
            self._dirty = True
            self._unsaved.set()

    async def _flusher(self) -> None:
        import trio

        while True:
            await self._unsaved.wait()
            self._unsaved = trio.Event()
            await trio.lowlevel.checkpoint()  # the workers woken beside it save first, and this with them
            self.flush()

    async def _work(self, inbox: trio.MemoryReceiveChannel[Event]) -> None:
        async for event in inbox:
            name = event.row.name
            if event.told is not None:
                self._tell(name, event.told)
            self.flush()  # recorded as the attempt starts
            try:
                await self._deliver(event)
            except Exception as exc:  # a record no command could take costs its own event, nothing else
                log(f"could not deliver {event.kind} of {name}: {type(exc).__name__}: {exc}")
            self._pending[name] -= 1
            if not self._pending[name]:
                self._tell(name, self._latest.get(name))


# ---------------------------------------------------------------------------------------------
# Following the catalog


@dataclass(frozen=True, slots=True)
class _Look:
    """One read of the catalog: at `now`, of every agent (`full`) or of those a file event named; the
    snapshot (None: the catalog could not be read) and the warnings."""

    now: int
    full: bool
    snapshot: list[Observation] | None
    warnings: list[str]


async def follow(
    catalog: Path,
    *,
    here: str,
    settings: Settings,
    deliver: Deliver,
    state_file: StateFile,
    reread_s: float = DEFAULT_REREAD_S,
    companions: Sequence[Companion] = (),
) -> None:
    """Until SIGINT or SIGTERM: read, step, save, deliver; on every record change and every `reread_s`.
    Each of `companions` steps on the same snapshots, under the same lock."""
    import trio

    from wrapper.readers.notice import follow as follow_catalog

    told_warnings: set[str] = set()  # each warning once while it lasts, not at every re-read
    cache = RosterCache(catalog)  # each tick reads again only the agents whose files changed
    with state_file.held() as dir_fd:
        state = state_file.load(dir_fd)
        for companion in companions:
            companion.load(dir_fd)

        def read(changes: Changes, _: float) -> _Look:
            """Every agent (the periodic re-read, for staleness), or only the agents a file event
            named; in a worker thread."""
            now = now_ms()
            only = None if changes.whole else changes.agents
            try:
                snapshot, warnings = observe(catalog, now, here=here, cache=cache, only=only)
            except CatalogError as exc:
                return _Look(now, changes.whole, None, [f"cannot read the catalog: {exc}"])
            return _Look(now, changes.whole, snapshot, warnings)

        def tick(outbox: Outbox, look: _Look) -> None:
            nonlocal state, told_warnings
            now, full, snapshot, warnings = look.now, look.full, look.snapshot, look.warnings
            for warning in warnings:
                if warning not in told_warnings:
                    log(f"warning: {warning}")
            told_warnings = set(warnings) if full else told_warnings | set(warnings)
            if snapshot is None:
                return
            events, state = step(state, snapshot, now, settings, partial=not full)
            for companion in companions:
                events.extend(companion.step(dir_fd, snapshot, now, partial=not full))
            outbox.settle(state, events)

        def record(told: State) -> None:
            try:
                state_file.save(dir_fd, told)
            except OSError as exc:
                log(f"cannot save {state_file.path}: {exc}; a restart may repeat events")

        outbox: Outbox | None = None
        try:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            nursery.cancel_scope.cancel()
                            return

                def say_following() -> None:
                    log(f"following {catalog}, re-reading every {reread_s:g} s; state in {state_file.path}")

                nursery.start_soon(stop_on_signal)
                outbox = Outbox(nursery, deliver, record, state)
                await follow_catalog(catalog, read, lambda look: tick(outbox, look), reread_s=reread_s, warn=log,
                                     armed=say_following)  # fmt: skip
        finally:
            if outbox is not None:
                outbox.flush()  # what the last deliveries attempted, before the lock goes


# ---------------------------------------------------------------------------------------------
# The command line


def parse_percents(text: str) -> tuple[float, ...]:
    """`--at`: percents above 0 (at or below 0 every reading would be past it); above 100 is allowed,
    and said once, for the harnesses that publish an overrun."""
    try:
        values = {float(part) for part in text.split(",") if part.strip()}
    except ValueError:
        values = set()
    if not values or not all(math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of percents")
    if bad := sorted(value for value in values if value <= 0):
        raise argparse.ArgumentTypeError(f"{bad[0]:g} is not a percent above 0 (every reading is at or above it)")
    if over := sorted(value for value in values if value > 100):
        # Which harnesses can run past 100 is each one's spec's (`HarnessSpec.overruns`).
        from sidecar.registry import overrun_harnesses

        log(f"--at {', '.join(f'{value:g}' for value in over)}: above 100% only an overrun reaches, "
            f"which {', '.join(overrun_harnesses())} publish; the others stop at 100")  # fmt: skip
    # 80, not 80.0, in the event and in HCTX_THRESHOLD: what the user wrote
    return tuple(sorted(int(value) if value.is_integer() else value for value in values))


# What runs the watch when something stands around its delivery (`wrapper.readers.notify`): given
# how to follow the catalog with a delivery, and --exec's (None without --exec), the whole run.
Around = Callable[[Callable[[Deliver], Awaitable[None]], "Deliver | None"], Callable[[], Awaitable[None]]]


def run_watch(
    args: argparse.Namespace,
    companions: Callable[[StateFile], Sequence[Companion]] = lambda _: (),
    around: Around | None = None,
) -> int:
    import trio

    try:
        catalog = existing_catalog(args)
        state_file = StateFile(catalog, args.name)
    except CatalogError as exc:
        log(f"cannot read the catalog: {exc}")
        return 2
    settings = Settings(args.at, args.headroom, None if args.cache_warn is None else round(args.cache_warn * 1000))
    beside = companions(state_file)

    def following(deliver: Deliver) -> Awaitable[None]:
        return follow(catalog, here=args.host, settings=settings, deliver=deliver, state_file=state_file,
                      reread_s=args.reread, companions=beside)  # fmt: skip

    command = None if args.exec is None else exec_command(args.exec, args.exec_timeout)
    main = (lambda: following(command or print_event)) if around is None else around(following, command)
    try:
        trio.run(main)
    except CatalogError as exc:
        log(str(exc))
        return 2
    return 0
