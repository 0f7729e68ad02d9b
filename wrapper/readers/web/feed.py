"""The board's live state: the roster held in memory, kept current from the catalog's file events,
and pushed to every open page.

A changed record (noticed by `wrapper.readers.notice`, as `hctx watch` and `hctx top` notice it) re-reads
only its agent; the whole catalog is looked at again every `reread_s` (staleness is time-based, and
an event may be missed), through a `RosterCache`, so even then only the agents whose files changed
are read; the ages tick every second from the projection's `ageMs`. Reading runs in a worker
thread, one read at a time, so a catalog of thousands of agents never holds up a push.

Every fleet page's stream reads one `Journal`: each change is encoded once, as the event's bytes,
and every stream sends those same bytes; the journal keeps the newest events up to a byte bound, and
a stream that fell further behind is sent the snapshot again (itself encoded once per change). The
ages are sent as what moved since the last tick. An agent page's stream has a `Mailbox` that
coalesces: the newest view of its one agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import sys
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import trio

from guard.catalog import list_agents
from guard.errors import CatalogError
from guard.procs import pid_alive
from wrapper.readers.accounts import AccountGroup, fan_in, group_key
from wrapper.readers.notice import Changes
from wrapper.readers.notice import follow as follow_catalog
from wrapper.readers.rate_history import keep, sightings_of
from wrapper.readers.render import account_limits_wire, render_agents_json
from wrapper.readers.roster import AgentRow, PidProbe, RosterCache, now_ms
from wrapper.readers.web.board import CACHE_TICK, Drawn, ages_now, draw_accounts, rate_limit_panel_of, row_view

__all__ = [
    "AGES_BYTES_PER_S",
    "AGE_TICK_S",
    "DEFAULT_REREAD_S",
    "GC_YOUNG",
    "GZIP_HEADER",
    "JOURNAL_BYTES",
    "KEEPALIVE_S",
    "PASS_AGENTS",
    "THAW_PASSES",
    "Board",
    "Journal",
    "Mailbox",
    "Read",
    "Reading",
    "WholePass",
    "follow",
    "packed",
    "serving_collector",
    "settle_heap",
    "sse_event",
]

AGE_TICK_S = 1.0
# The ages the fleet pages are sent, bytes a second across all of them: a tick's news is each age the
# clock moved (under an hour old, every one of them), so 10,000 agents to 1,000 pages would be
# 300 MB a second; past this the ticks come further apart than AGE_TICK_S.
AGES_BYTES_PER_S = 32 * 1024 * 1024
DEFAULT_REREAD_S = 30.0
# The longest an event stream goes without a write: a fleet stream is sent a keep-alive on the
# journal's beat (`Journal.beat`) when nothing else came, an agent page's after this long of nothing.
KEEPALIVE_S = 15.0
# A whole re-read's part (`WholePass`): at 10,000 agents ~20 ms of reading and ~10 ms of layout on 2
# shared cores, the longest a changed agent's read waits behind it.
PASS_AGENTS = 256
# The fleet pages' undelivered events kept, in bytes: a stream further behind is sent a snapshot.
# Since each rows event carries its accounts' forecast plots (issue 39), 4 MB left the board's
# memory under 10,000 pushed updates within 1 MB of test_web_browser's 6 MB bound; 3 MB leaves 2.
JOURNAL_BYTES = 3 * 1024 * 1024
# The cyclic collector in `hctx web` (`serving_collector`, `Board(settle=True)`). Measured at 10,000
# agents, 1,000 gzip pages, 100 writes/s on 2 shared cores (Python 3.11): with CPython's default
# young generation (700 allocations) the objects of every round of sends (they live for the round)
# were promoted to the oldest generation, whose collection walked the whole board, GIL held,
# 0.4-0.5 s every 0.5-1 s: half the server's time, and every write that met one waited for it
# (write -> page p50 0.7 s, p99 1.1-2.3 s). Young objects are collected every GC_YOUNG allocations
# instead (each such collection ~10 ms), and the board as a whole re-read leaves it is frozen out of
# the collector's walk (gc.freeze); every THAW_PASSES whole re-reads (10 min at the default
# --reread) it is thawed and collected once, so a cycle frozen while alive is still reclaimed.
GC_YOUNG = 50_000
THAW_PASSES = 20


@dataclass(frozen=True, slots=True)
class Reading:
    row: AgentRow
    read_ms: int  # the wall clock the row was projected at
    started: float  # trio's clock when its read began: a later read's result wins


@dataclass(slots=True)
class WholePass:
    """A whole re-read under way, read in parts (`Board.read_part`) between which the changed
    agents' reads go first: at 10,000 agents the whole read at once held them up ~0.7 s (and its
    layout the event loop ~0.2 s more), so a write reached a page up to 2.3 s late."""

    started: float  # trio's clock when the catalog was listed
    listed: list[tuple[str, str]]
    warnings: list[str]  # the listing's
    next: int = 0  # the first agent of `listed` not read yet
    row_warnings: list[str] = field(default_factory=list)  # the rows' read so far

    @property
    def done(self) -> bool:
        return self.next >= len(self.listed)


@dataclass(frozen=True, slots=True)
class Read:
    """What one read of a batch of changes found: a `whole` read's readings and warnings, or why the
    catalog could not be read (`problem`); a read of the named agents, theirs and the ones `gone`."""

    whole: bool
    found: list[Reading]
    warnings: list[str] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    problem: str | None = None
    drawn: dict[str, Drawn] = field(default_factory=dict)  # the found agents' accounts' histories, drawn
    passing: WholePass | None = None  # a part of this whole re-read


class Mailbox:
    """One open stream's undelivered news, coalesced: the newest view per agent (None: gone)."""

    def __init__(self, only: str | None) -> None:
        self.only = only
        self.rows: dict[str, dict[str, Any] | None] = {}
        self.panel: dict[str, Any] | None = None
        self.ages: dict[str, str] | None = None
        self.problem_changed = False  # the catalog turned unreadable, or readable again
        self._news = trio.Event()

    def post(self, rows: dict[str, dict[str, Any] | None], panel: dict[str, Any] | None) -> None:
        if self.only is not None:  # one look-up, however many agents changed
            rows = {self.only: rows[self.only]} if self.only in rows else {}
            panel = None
        if rows or panel is not None:
            self.rows.update(rows)
            self.panel = panel if panel is not None else self.panel
            self._news.set()

    def post_problem(self) -> None:
        self.problem_changed = True
        self._news.set()

    def post_ages(self, ages: dict[str, str]) -> None:
        if self.only is not None:  # two look-ups, however many ages ticked; no wake-up for none of them
            ages = {key: ages[key] for key in (self.only, self.only + CACHE_TICK) if key in ages}
            if not ages:
                return
        self.ages = ages
        self._news.set()

    async def take(self) -> tuple[dict[str, dict[str, Any] | None], dict[str, Any] | None, dict[str, str] | None, bool]:
        await self._news.wait()
        self._news = trio.Event()
        taken = self.rows, self.panel, self.ages, self.problem_changed
        self.rows, self.panel, self.ages, self.problem_changed = {}, None, None, False
        return taken


class Journal:
    """The fleet pages' events, each encoded once and kept while they fit in `limit` bytes: every
    stream sends the same bytes objects. Event `n` is the journal's `n`th (`next` counts them).
    Each is also kept `packed`, for the streams that take gzip."""

    def __init__(self, limit: int = JOURNAL_BYTES) -> None:
        self.limit = limit
        self.events: deque[bytes] = deque()
        self.packed: deque[bytes] = deque()
        self.first = 0  # the number of the oldest event kept
        self.next = 0
        self.size = 0
        self._news = trio.Event()

    def add(self, data: bytes) -> None:
        self.events.append(data)
        self.packed.append(packed(data))
        self.next += 1
        self.size += len(data)
        while self.size > self.limit and len(self.events) > 1:
            self.size -= len(self.events.popleft())
            self.packed.popleft()
            self.first += 1
        self._news.set()
        self._news = trio.Event()

    def since(self, cursor: int, *, gzip: bool = False) -> list[bytes] | None:
        """The events from `cursor` on (`gzip`: packed); None when some of them are no longer kept.
        Read from the newest end (a deque is indexed in O(1) near its ends): each of a thousand
        streams asks every round for the few newest events, never for a copy of the journal."""
        if cursor < self.first:
            return None
        kept = self.packed if gzip else self.events
        return [kept[index] for index in range(cursor - self.next, 0)]

    async def news(self) -> None:
        """Until the next event is added, or the next `beat`: one wake-up shared by every stream
        waiting, and no timer of each stream's own (at 1,000 pages, a timer each per round was a
        third of the server's time: each expiry is a cancellation delivered)."""
        await self._news.wait()

    def beat(self) -> None:
        """Wake every waiting stream with nothing added: each sends a keep-alive."""
        self._news.set()
        self._news = trio.Event()


class Board:
    """The catalog as the board shows it, and the streams it shows it to."""

    def __init__(self, catalog: Path, here: str, alive: PidProbe = pid_alive, *, settle: bool = False) -> None:
        self.catalog, self.here, self.alive = catalog, here, alive
        self.settle = settle  # freeze the board out of the collector's walk after each whole re-read
        self.passes = 0  # whole re-reads read to their end
        self.readings: dict[str, Reading] = {}
        self.views: dict[str, dict[str, Any]] = {}
        self.panel: dict[str, Any] = {"entries": [], "more": 0}
        self.warnings: list[str] = []
        self.problem: str | None = None  # the catalog itself cannot be read
        self.mailboxes: set[Mailbox] = set()  # the agent pages' streams
        self.journal = Journal()  # the fleet pages' streams read this
        self.streams = 0  # event streams open, of both pages
        self.ready = trio.Event()
        self.version = 0  # counts the changes: a page holding this version's snapshot is current
        self._encoded: str | None = None
        self._snapshot_event: bytes | None = None
        self._snapshot_packed: bytes | None = None
        self._page_data: bytes | None = None
        self._ages: dict[str, str] = {}  # the last tick's, for the fleet pages (what moved is sent)
        self._ages_event: bytes | None = None
        self._ages_packed: bytes | None = None
        self.ticked = -math.inf  # trio's clock at the last tick
        self.tick_s = AGE_TICK_S  # until the next: longer when the ages sent would pass AGES_BYTES_PER_S
        # Read by one worker thread at a time: `follow`'s reads and `/api/agents` hold `reading`.
        self._cache = RosterCache(catalog)
        self.reading = trio.Lock()
        # The account groups as `fan_in` makes them, kept between reads (`_view`): each agent's group
        # key, the agents under each key, the groups with a rate limit to show, each agent's group.
        self._key_of: dict[str, str] = {}
        self._members: dict[str, set[str]] = {}
        self._fanned: dict[str, AccountGroup] = {}
        self._group_of: dict[str, AccountGroup] = {}
        self._agents: tuple[float, float, bytes] | None = None  # `/api/agents`: built from, until; the body
        self._agents_lock = trio.Lock()
        self.drawn: dict[str, Drawn] = {}  # each account's history as last kept and drawn (issue 39)
        self._passing: WholePass | None = None  # the whole re-read under way (`part`)
        self._whole_wanted = False  # one asked for, to begin once the one under way is read
        self.part_agents = PASS_AGENTS

    # -- what a page is sent -------------------------------------------------------------------

    def snapshot(self, only: str | None = None) -> dict[str, Any]:
        views = list(self.views.values()) if only is None else [v for k, v in self.views.items() if k == only]
        return {"rows": views, "panel": self.panel, "warnings": self.warnings, "problem": self.problem,
                "catalog": str(self.catalog), "version": self.version}  # fmt: skip

    def encoded(self) -> str:
        """The whole snapshot as JSON, encoded once per change however many pages load it."""
        if self._encoded is None:
            self._encoded = json.dumps(self.snapshot(), ensure_ascii=False, allow_nan=False)
        return self._encoded

    def snapshot_event(self, *, gzip: bool = False) -> bytes:
        """The snapshot as an event of the fleet page's stream, encoded (and packed) once per change."""
        if self._snapshot_event is None:
            self._snapshot_event = b"event: snapshot\ndata: " + self.encoded().encode() + b"\n\n"
        if not gzip:
            return self._snapshot_event
        if self._snapshot_packed is None:
            self._snapshot_packed = packed(self._snapshot_event)
        return self._snapshot_packed

    def page_data(self) -> bytes:
        """The snapshot as the fleet page's JSON data block (no `<`, so no `</script>`), once per change."""
        if self._page_data is None:
            self._page_data = self.encoded().replace("<", "\\u003c").encode()
        return self._page_data

    def ages_event(self, *, gzip: bool = False) -> bytes:
        """Every age at the last tick, as an event: what follows a snapshot (the journal's ages
        events say only what moved since the tick before). Ticked first if no stream was open."""
        if trio.current_time() - self.ticked > self.tick_s:
            self.tick()
        if self._ages_event is None:
            self._ages_event = sse_event("ages", self._ages)
        if not gzip:
            return self._ages_event
        if self._ages_packed is None:
            self._ages_packed = packed(self._ages_event)
        return self._ages_packed

    def _changed(self) -> None:
        self.version += 1
        self._encoded = self._snapshot_event = self._snapshot_packed = self._page_data = None

    def _publish(self, rows: dict[str, dict[str, Any] | None], panel: dict[str, Any] | None) -> None:
        self.journal.add(sse_event("rows", {"rows": rows, "panel": panel}))
        for name in rows:  # its age (and cache countdown) as the view words them may not be the last tick's: sent again
            self._ages.pop(name, None)
            self._ages.pop(name + CACHE_TICK, None)
        for box in self.mailboxes:
            box.post(rows, panel)

    def _publish_problem(self) -> None:
        self.journal.add(sse_event("problem", {"problem": self.problem}))
        for box in self.mailboxes:
            box.post_problem()

    def tick(self) -> None:
        """The ages now: to the fleet pages what moved since the last tick, to each agent page its own."""
        ages = self.ages()
        moved = {key: text for key, text in ages.items() if self._ages.get(key) != text}
        self._ages, self._ages_event, self._ages_packed, self.ticked = ages, None, None, trio.current_time()
        if moved:
            event = sse_event("ages", moved)
            self.journal.add(event)
            self.tick_s = max(AGE_TICK_S, len(event) * self.streams / AGES_BYTES_PER_S)
        for box in self.mailboxes:
            box.post_ages(ages)

    @contextlib.contextmanager
    def subscribe(self, only: str | None = None) -> Iterator[Mailbox]:
        box = Mailbox(only)
        self.mailboxes.add(box)
        try:
            yield box
        finally:
            self.mailboxes.discard(box)

    @contextlib.contextmanager
    def stream(self) -> Iterator[None]:
        """One open event stream, counted (`/api/status`, the cap on streams)."""
        self.streams += 1
        try:
            yield
        finally:
            self.streams -= 1

    # -- what reading finds ----------------------------------------------------------------------

    def apply(
        self,
        found: list[Reading],
        *,
        whole: bool,
        warnings: list[str] | None = None,
        drawn: dict[str, Drawn] | None = None,
        looked: bool = False,
    ) -> None:
        """`drawn`: the found agents' accounts, their histories kept and drawn (`keep_history`); a whole
        read's are every account's, so an account gone is dropped. `looked`: a part of a whole
        re-read (`WholePass`): like a whole read's, a reading that says what the held one says but
        for the clock is passed over; the rest of the catalog is not in it (`finish_pass` is)."""
        if whole:
            self.drawn = dict(drawn or {})
        else:
            self.drawn.update(drawn or {})
        changed: dict[str, dict[str, Any] | None] = {}
        updated: list[str] = []
        news = False  # the warnings or the catalog's problem changed
        started = min((reading.started for reading in found), default=math.inf)
        for reading in found:
            name = reading.row.name
            held = self.readings.get(name)
            if held is not None and held.started > reading.started:
                continue  # a later read of this agent already landed
            if (whole or looked) and held is not None and _same_but_the_clock(held.row, reading.row):
                continue  # the held reading stands (its ages tick from its own read): nothing to lay out
            self.readings[name] = reading
            updated.append(name)
        if whole:
            news = self._unlisted({reading.row.name for reading in found}, started, warnings, changed)
        self._land(updated, changed, news)

    def _unlisted(
        self, present: set[str], started: float, warnings: list[str] | None, changed: dict[str, dict[str, Any] | None]
    ) -> bool:
        """A whole read's end: the agents it did not find, unless read since it began, are gone (into
        `changed`); its warnings; the catalog readable again. Whether the warnings or problem changed."""
        news = False
        for name, held in list(self.readings.items()):
            if name not in present and held.started < started:  # gone, not added while reading
                del self.readings[name]
                self.views.pop(name, None)
                changed[name] = None
        if warnings is not None and warnings != self.warnings:
            self.warnings = warnings
            news = True
        if self.problem is not None:
            self.problem = None
            news = True
            self._publish_problem()
        return news

    def _land(self, updated: list[str], changed: dict[str, dict[str, Any] | None], news: bool) -> None:
        """The `updated` readings (and the `changed` views, the gone ones among them) laid out and published."""
        added = any(name not in self.views for name in updated)
        self._view(updated, changed)
        if added:  # the snapshot lists the agents sorted
            self.views = dict(sorted(self.views.items()))
        panel_changed = self._repanel()  # with `drawn`: a read may move an account's forecast alone
        panel = self.panel
        # A read that found nothing new keeps the version: a page holding it is sent no snapshot,
        # so its rows are not laid out again for nothing.
        if changed or panel_changed or news:
            self._changed()
        if changed or panel_changed:
            self._publish(changed, panel if panel_changed else None)

    def _view(self, updated: list[str], changed: dict[str, dict[str, Any] | None]) -> None:
        """The views of the `updated` agents, and of every agent whose account's figure (fanned in
        across the agents sharing it, as `hctx agents --json` shows it) another agent moved.

        The account groups are kept between reads: a read fans in again only the groups its agents
        left or joined (at 10,000 agents, fanning in every row on every write held the event loop
        for most of a second)."""
        affected = set()
        for name in [*updated, *(name for name, view in changed.items() if view is None)]:
            old = self._key_of.pop(name, None)
            if old is not None:
                affected.add(old)
                self._members[old].discard(name)
            current = self.readings.get(name)
            if current is not None:
                key = group_key(current.row)
                self._key_of[name] = key
                self._members.setdefault(key, set()).add(name)
                affected.add(key)
        for key in affected:
            names = self._members.get(key, set())
            for name in names:
                self._group_of.pop(name, None)
            self._fanned.pop(key, None)
            if not names:
                self._members.pop(key, None)
                continue
            for group in fan_in(self.readings[name].row for name in names):  # one group: they share `key`
                self._fanned[key] = group
                for row in group.agents:
                    self._group_of[row.name] = group
        groups = self._group_of
        for name in updated:
            reading = self.readings[name]
            view = row_view(reading.row, reading.read_ms, reading.read_ms, groups)
            held = self.views.get(name)
            self.views[name] = view
            if held is None or _settled(held) != _settled(view):
                changed[name] = view
        for name in [name for key in affected for name in self._members.get(key, ())]:
            reading = self.readings[name]
            view = self.views[name]
            if name not in changed and _settled(view["agent"]["accountRateLimits"]) != _settled(
                account_limits_wire(groups.get(name), reading.row, reading.read_ms)
            ):
                self.views[name] = changed[name] = row_view(reading.row, reading.read_ms, reading.read_ms, groups)

    def gone(self, names: set[str]) -> None:
        changed: dict[str, dict[str, Any] | None] = {}
        for name in names:
            if self.readings.pop(name, None) is not None:
                self.views.pop(name, None)
                changed[name] = None
        if changed:  # a gone agent's account may have been in the panel
            self._land([], changed, False)

    def _repanel(self) -> bool:
        """The rate-limit panel again, from the account groups held; whether it changed."""
        panel = rate_limit_panel_of(
            self._fanned.values(), lambda name: self.readings[name].read_ms, now_ms(), self.drawn
        )
        changed: bool = _settled(panel) != _settled(self.panel)
        self.panel = panel
        return changed

    def failed(self, problem: str) -> None:
        """The whole catalog could not be read: every open page is told, and keeps its last rows."""
        if problem != self.problem:
            self.problem = problem
            self._changed()
            self._publish_problem()

    def ages(self) -> dict[str, str]:
        now = now_ms()
        return {key: age for r in self.readings.values() for key, age in ages_now(r.row, r.read_ms, now).items()}

    async def agents_json(self) -> bytes:
        """`hctx agents --json` of the catalog as the board holds it: the records the board's cache
        (a `CatalogCache`, the exporter's) last read, projected now; no file is read. Built once for
        every request that arrives while it is built, and kept for requests within a tick of it."""
        await self.ready.wait()
        arrived = trio.current_time()
        async with self._agents_lock:
            # Built within a tick before this request, or while it waited: one build serves a burst.
            if self._agents is not None and max(self._agents[0] + AGE_TICK_S, self._agents[1]) >= arrived:
                return self._agents[2]
            started = trio.current_time()
            async with self.reading:
                body = await trio.to_thread.run_sync(self._agents_document)
            self._agents = started, trio.current_time(), body
            return body

    def _agents_document(self) -> bytes:
        return render_agents_json(self._cache.held(now_ms(), here=self.here, alive=self.alive).rows).encode()

    # -- reading (in a worker thread) -------------------------------------------------------------

    def read_whole(self, started: float) -> tuple[list[Reading], list[str]]:
        """Every agent at once, each read again only if its files changed since the last read (a
        whole re-read of one part), and the warnings; for `apply(…, whole=True)`."""
        under_way = self.begin_pass(started)
        found, _ = self._read_part(under_way, len(under_way.listed), started)
        return found, [*under_way.warnings, *under_way.row_warnings]

    def read_agents(self, agents: frozenset[tuple[str, str]], started: float) -> tuple[list[Reading], set[str]]:
        """The named agents whose files changed, and those of them that are gone."""
        read_ms = now_ms()
        views, gone = self._cache.changed(agents, read_ms, here=self.here, alive=self.alive)
        found = [Reading(view.row, read_ms, started) for view in views]
        return found, {f"{host}/{identity}" for host, identity in gone}

    def keep_history(self, found: list[Reading]) -> dict[str, Drawn]:
        """The found agents' rate-limit snapshots kept in the host-local history, as every reader
        keeps them (wrapper.readers.rate_history), and their accounts drawn from it; a history that
        cannot be kept is a warning on stderr, and the board goes on with what it saw."""
        now = now_ms()
        series, problem = keep(self.catalog, sightings_of(fan_in(r.row for r in found)), now)
        if problem is not None:
            print(f"hctx web: warning: {problem}", file=sys.stderr)
        return draw_accounts(series, now)

    def begin_pass(self, started: float) -> WholePass:
        """A whole re-read begun: the catalog listed (CatalogError when it cannot be), to be read in
        parts (`read_part`)."""
        listed, warnings = list_agents(self.catalog)
        return WholePass(started, listed, warnings)

    def read_part(self, under_way: WholePass, size: int, started: float) -> Read:
        """The next `size` agents of a whole re-read (`_read_part`), their accounts' histories kept."""
        found, gone = self._read_part(under_way, size, started)
        return Read(False, found, gone=gone, drawn=self.keep_history(found), passing=under_way)

    def _read_part(self, under_way: WholePass, size: int, started: float) -> tuple[list[Reading], set[str]]:
        """The next `size` agents of a whole re-read, every one projected now (a row may move with
        the clock alone: staleness, a wrapper gone), each read again only if its files changed, and
        the listed ones gone since. The last part also looks again at the agents held that the
        listing did not name."""
        part = under_way.listed[under_way.next : under_way.next + size]
        under_way.next += len(part)
        read_ms = now_ms()
        views, gone = self._cache.looked(part, read_ms, here=self.here, alive=self.alive)
        found = [Reading(view.row, read_ms, started) for view in views]
        under_way.row_warnings.extend(warning for reading in found for warning in reading.row.warnings())
        if under_way.done:
            gone += self._cache.listed(under_way.listed, under_way.warnings)
        return found, {f"{host}/{identity}" for host, identity in gone}

    # The whole re-read in parts, as `wrapper.readers.notice.follow` drives it (`InParts`).

    @property
    def under_way(self) -> bool:
        return self._whole_wanted or (self._passing is not None and not self._passing.done)

    def begin(self, started: float) -> Read:
        """A whole re-read asked for: begun with its first part, or after the one under way."""
        self._whole_wanted = True
        return self.part(started)

    def part(self, started: float) -> Read:
        """The next part of the whole re-read under way (one is begun if asked for)."""
        if self._passing is None or self._passing.done:
            if not self._whole_wanted:
                return Read(False, [])
            self._whole_wanted = False
            try:
                self._passing = self.begin_pass(started)
            except CatalogError as exc:
                self._passing = None
                return Read(True, [], problem=f"cannot read the catalog: {exc}")
        return self.read_part(self._passing, self.part_agents, started)

    def took_part(self, under_way: WholePass, read: Read) -> None:
        """On the loop, what a part of a whole re-read found; the last part ends it (`finish_pass`)."""
        self.apply(read.found, whole=False, drawn=read.drawn, looked=True)
        self.gone(read.gone)
        if under_way.done:
            self.finish_pass(under_way)

    def finish_pass(self, under_way: WholePass) -> None:
        """A whole re-read read to its end: the agents it did not list, unless read since it began,
        are gone; the accounts no agent holds any more are dropped from the panel's histories."""
        changed: dict[str, dict[str, Any] | None] = {}
        present = {f"{host}/{identity}" for host, identity in under_way.listed}
        warnings = [*under_way.warnings, *under_way.row_warnings]
        news = self._unlisted(present, under_way.started, warnings, changed)
        self._land([], changed, news)
        self.drawn = {key: drawn for key, drawn in self.drawn.items() if key in self._members}
        self.ready.set()
        self.passes += 1
        if self.settle:
            settle_heap(self.passes)

    def read(self, changes: Changes, started: float) -> Read:
        """What `changes` names: every agent when `whole` (a whole re-read in one part; the named
        ones are read with the rest), and their accounts' histories, kept (issue 39)."""
        if not changes.whole:
            found, gone = self.read_agents(changes.agents, started)
            return Read(False, found, gone=gone, drawn=self.keep_history(found))
        try:
            under_way = self.begin_pass(started)
        except CatalogError as exc:
            return Read(True, [], problem=f"cannot read the catalog: {exc}")
        return self.read_part(under_way, len(under_way.listed), started)

    # -- on the loop, what a read found ------------------------------------------------------------

    def took(self, read: Read) -> None:
        if read.problem is not None:
            self.failed(read.problem)
            self.ready.set()
        elif read.passing is not None:
            self.took_part(read.passing, read)
        elif read.found or read.gone:
            self.apply(read.found, whole=False, drawn=read.drawn)
            self.gone(read.gone)


def serving_collector() -> None:
    """The young generation as `hctx web` collects it: every GC_YOUNG allocations, so what lives for
    one round of sends dies young instead of filling the oldest generation (GC_YOUNG's note)."""
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG), *older)


def settle_heap(passes: int) -> None:
    """After the `passes`th whole re-read: everything alive frozen out of the collector's walk (the
    board just read, the pages open), and every THAW_PASSES passes thawed and collected first."""
    if passes % THAW_PASSES == 0:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


# A gzip stream's header: deflate, no name, no time, no OS said. What follows it is `packed` pieces.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def packed(data: bytes) -> bytes:
    """`data` as a piece of a gzip stream (after GZIP_HEADER) that stands on its own: a compressor of
    its own (it refers to nothing sent before, so every stream sends the same piece whatever it sent
    before: each change is still packed once), sync-flushed (byte-aligned, not the last block: the
    stream goes on; its trailer never comes, as an event stream ends only by closing).

    At 10,000 agents, 100 writes/s and 1,000 pages, the rows events were ~170 MB/s of writes, and
    sending them held the event loop's one core (write -> page p50 1.8 s, p99 3.6 s); packed at
    level 1, a rows event of 20 rows is ~17x smaller, the 15 MB snapshot 0.6 MB (16 ms)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH)


def sse_event(kind: str, data: object) -> bytes:
    """One Server-Sent Event, encoded."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n".encode()


_TICKING = frozenset({"age", "ageMs", "cache"})


def _same_but_the_clock(held: AgentRow, read: AgentRow) -> bool:
    """The same row but for what the clock alone moves (a whole read over unchanged files)."""
    if dataclasses.replace(held, context=None) != dataclasses.replace(read, context=None):
        return False
    if held.context is None or read.context is None:
        return held.context is read.context
    return bool(_settled(held.context.wire()) == _settled(read.context.wire()))


def _settled(value: Any) -> Any:
    """A view, or the panel, without what the clock alone moves: the ages reach a page every second
    on their own (`Mailbox.post_ages`), so only what a read found is a change."""
    if isinstance(value, dict):
        return {key: _settled(item) for key, item in value.items() if key not in _TICKING}
    if isinstance(value, list):
        return [_settled(item) for item in value]
    return value


async def follow(board: Board, stop: anyio.Event, *, reread_s: float = DEFAULT_REREAD_S) -> None:
    """Keep `board` current until `stop` is set: the catalog's changes (the readers' one loop,
    `wrapper.readers.notice.follow`; a whole re-read in parts of `board.part_agents`, the changed
    agents read between them), the ages' tick and the fleet streams' keep-alive beat."""

    async def tick() -> None:
        while True:
            await trio.sleep(board.tick_s)
            if board.streams:
                board.tick()

    async def beat() -> None:
        while True:
            await trio.sleep(KEEPALIVE_S)
            board.journal.beat()

    async def until_stopped() -> None:
        await stop.wait()
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        nursery.start_soon(beat)
        nursery.start_soon(until_stopped)
        # `reading`: the cache is read by one worker thread at a time, `/api/agents`'s build included.
        await follow_catalog(board.catalog, board.read, board.took, reread_s=reread_s, debounce_ms=200, step_ms=20,
                             held=board.reading, parts=board)  # fmt: skip
