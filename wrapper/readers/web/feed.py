"""The board's live state: the roster held in memory, kept current from the catalog's file events,
and pushed to every open page.

A changed record (noticed by `wrapper.readers.notice`, as `hctx watch` and `hctx top` notice it) re-reads
only its agent; the whole catalog is looked at again every `reread_s` (staleness is time-based, and
an event may be missed), through a `RosterCache`, so even then only the agents whose files changed
are read; the ages tick every second from the projection's `ageMs`. Reading runs in a worker
thread, one read at a time, so a catalog of thousands of agents never holds up a push.

Each open stream has a `Mailbox` that coalesces: what it holds is the newest view of each changed
agent, so a slow page costs at most one view per agent, never a queue of every update.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import trio

from guard.errors import CatalogError
from guard.procs import pid_alive
from wrapper.readers.accounts import fan_in, groups_by_agent
from wrapper.readers.notice import Changes
from wrapper.readers.notice import follow as follow_catalog
from wrapper.readers.rate_history import keep, sightings_of
from wrapper.readers.render import account_limits_wire
from wrapper.readers.roster import AgentRow, PidProbe, RosterCache, now_ms
from wrapper.readers.web.board import CACHE_TICK, Drawn, ages_now, draw_accounts, rate_limit_panel, row_view

__all__ = [
    "AGE_TICK_S",
    "DEFAULT_REREAD_S",
    "Board",
    "Mailbox",
    "Read",
    "Reading",
    "follow",
]

AGE_TICK_S = 1.0
DEFAULT_REREAD_S = 30.0


@dataclass(frozen=True, slots=True)
class Reading:
    row: AgentRow
    read_ms: int  # the wall clock the row was projected at
    started: float  # trio's clock when its read began: a later read's result wins


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
        if self.only is not None:
            rows = {key: view for key, view in rows.items() if key == self.only}
            panel = None
        if rows or panel is not None:
            self.rows.update(rows)
            self.panel = panel if panel is not None else self.panel
            self._news.set()

    def post_problem(self) -> None:
        self.problem_changed = True
        self._news.set()

    def post_ages(self, ages: dict[str, str]) -> None:
        if self.only is not None:
            ages = {k: v for k, v in ages.items() if k in (self.only, self.only + CACHE_TICK)}
        self.ages = ages
        self._news.set()

    async def take(self) -> tuple[dict[str, dict[str, Any] | None], dict[str, Any] | None, dict[str, str] | None, bool]:
        await self._news.wait()
        self._news = trio.Event()
        taken = self.rows, self.panel, self.ages, self.problem_changed
        self.rows, self.panel, self.ages, self.problem_changed = {}, None, None, False
        return taken


class Board:
    """The catalog as the board shows it, and the streams it shows it to."""

    def __init__(self, catalog: Path, here: str, alive: PidProbe = pid_alive) -> None:
        self.catalog, self.here, self.alive = catalog, here, alive
        self.readings: dict[str, Reading] = {}
        self.views: dict[str, dict[str, Any]] = {}
        self.panel: dict[str, Any] = {"entries": [], "more": 0}
        self.warnings: list[str] = []
        self.problem: str | None = None  # the catalog itself cannot be read
        self.mailboxes: set[Mailbox] = set()
        self.ready = trio.Event()
        self.version = 0  # counts the changes: a page holding this version's snapshot is current
        self._encoded: str | None = None
        self.drawn: dict[str, Drawn] = {}  # each account's history as last kept and drawn (issue 39)
        self._cache = RosterCache(catalog)  # read by one worker thread at a time (`follow`)

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

    def _changed(self) -> None:
        self.version += 1
        self._encoded = None

    @contextlib.contextmanager
    def subscribe(self, only: str | None = None) -> Iterator[Mailbox]:
        box = Mailbox(only)
        self.mailboxes.add(box)
        try:
            yield box
        finally:
            self.mailboxes.discard(box)

    # -- what reading finds ----------------------------------------------------------------------

    def apply(
        self,
        found: list[Reading],
        *,
        whole: bool,
        warnings: list[str] | None = None,
        drawn: dict[str, Drawn] | None = None,
    ) -> None:
        """`drawn`: the found agents' accounts, their histories kept and drawn (`keep_history`); a whole
        read's are every account's, so an account gone is dropped."""
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
            self.readings[name] = reading
            updated.append(name)
        if whole:
            present = {reading.row.name for reading in found}
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
                for box in self.mailboxes:
                    box.post_problem()
        self._view(updated, changed)
        self.views = dict(sorted(self.views.items()))
        panel = rate_limit_panel(((r.row, r.read_ms) for r in self.readings.values()), now_ms(), self.drawn)
        panel_changed = _settled(panel) != _settled(self.panel)
        self.panel = panel
        # A read that found nothing new keeps the version: a page holding it is sent no snapshot,
        # so its rows are not laid out again for nothing.
        if changed or panel_changed or news:
            self._changed()
        if changed or panel_changed:
            for box in self.mailboxes:
                box.post(changed, panel if panel_changed else None)

    def _view(self, updated: list[str], changed: dict[str, dict[str, Any] | None]) -> None:
        """The views of the `updated` agents, and of every agent whose account's figure (fanned in
        across the agents sharing it, as `hctx agents --json` shows it) another agent moved."""
        groups = groups_by_agent(fan_in(reading.row for reading in self.readings.values()))
        for name in updated:
            reading = self.readings[name]
            view = row_view(reading.row, reading.read_ms, reading.read_ms, groups)
            held = self.views.get(name)
            self.views[name] = view
            if held is None or _settled(held) != _settled(view):
                changed[name] = view
        for name, view in list(self.views.items()):
            reading = self.readings[name]
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
        self._view([], changed)
        if changed:
            self._changed()
            for box in self.mailboxes:
                box.post(changed, None)

    def failed(self, problem: str) -> None:
        """The whole catalog could not be read: every open page is told, and keeps its last rows."""
        if problem != self.problem:
            self.problem = problem
            self._changed()
            for box in self.mailboxes:
                box.post_problem()

    def ages(self) -> dict[str, str]:
        now = now_ms()
        return {key: age for r in self.readings.values() for key, age in ages_now(r.row, r.read_ms, now).items()}

    # -- reading (in a worker thread) -------------------------------------------------------------

    def read_whole(self, started: float) -> tuple[list[Reading], list[str]]:
        """Every agent, each read again only if its files changed since the last read."""
        read_ms = now_ms()
        views, warnings = self._cache.views(read_ms, here=self.here, alive=self.alive)
        rows = [view.row for view in views]
        return [Reading(row, read_ms, started) for row in rows], [*warnings, *(w for r in rows for w in r.warnings())]

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

    def read(self, changes: Changes, started: float) -> Read:
        """What `changes` names: every agent when `whole` (the named ones are read with the rest),
        and their accounts' histories, kept (issue 39)."""
        if not changes.whole:
            found, gone = self.read_agents(changes.agents, started)
            return Read(False, found, gone=gone, drawn=self.keep_history(found))
        try:
            found, warnings = self.read_whole(started)
        except CatalogError as exc:
            return Read(True, [], problem=f"cannot read the catalog: {exc}")
        return Read(True, found, warnings, drawn=self.keep_history(found))

    # -- on the loop, what a read found ------------------------------------------------------------

    def took(self, read: Read) -> None:
        if read.problem is not None:
            self.failed(read.problem)
        elif read.whole:
            self.apply(read.found, whole=True, warnings=read.warnings, drawn=read.drawn)
        else:
            self.apply(read.found, whole=False, drawn=read.drawn)
            self.gone(read.gone)
        if read.whole:
            self.ready.set()


_TICKING = frozenset({"age", "ageMs", "cache"})


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
    `wrapper.readers.notice.follow`) and the ages' tick."""

    async def tick() -> None:
        while True:
            await trio.sleep(AGE_TICK_S)
            if board.mailboxes:
                ages = board.ages()
                for box in board.mailboxes:
                    box.post_ages(ages)

    async def until_stopped() -> None:
        await stop.wait()
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        nursery.start_soon(until_stopped)
        await follow_catalog(board.catalog, board.read, board.took, reread_s=reread_s, debounce_ms=200, step_ms=20)
