"""The readers' data (HC-R14, HC-R17): the roster, one agent's inspection, doctor's rules.

Plain data only: `collect_*` take the catalog path and `now_ms` and return dataclasses; the text
(tables, meters, advisory lines) is wrapper.readers.render's, the command line wrapper.readers.reader_commands'.
Reading goes through guard.catalog, so a hostile tree gives a row with `context: null` and a
warning, never a traceback and never a number the record did not carry. Nothing here writes.
"""

from __future__ import annotations

import itertools
import operator
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.account import Account
from guard.catalog import (
    AgentFiles,
    CatalogCache,
    decode_claim,
    list_agents,
    open_host_dir,
    printable,
    read_agent_files,
    short,
)
from guard.constants import (
    AGENTS_DIR_NAME,
    CONTEXT_RECORD_NAME,
    HARNESS_CONTEXT_HEADROOM_WARN_PERCENT,
    HARNESS_CONTEXT_WARN_PERCENT,
    STATE_RECORD_NAME,
)
from guard.errors import CatalogError, NotFound
from guard.files import open_regular
from guard.layout import check_name, log_path
from guard.procs import pid_alive
from guard.projection import Context, decode_record, project, reading_of
from guard.record import HarnessContext
from guard.state import HarnessState, process_identity
from sidecar.names import REGISTERED

__all__ = [
    "LAUNCH_WINDOW_MS",
    "LOG_TAIL_BYTES",
    "LOG_TAIL_LINES",
    "AgentNotFound",
    "AgentRow",
    "AgentView",
    "DecodedAgent",
    "Inspection",
    "PidProbe",
    "Roster",
    "RosterCache",
    "agent_view",
    "clocks_ahead",
    "collect_inspection",
    "collect_roster",
    "decode_agent",
    "desired_state",
    "fill_advised",
    "headroom_short",
    "incarnation_verdict",
    "launches_within",
    "now_ms",
    "read_log_tail",
    "resolve_agent",
    "unverified_builds",
    "view_agent",
]


class AgentNotFound(NotFound):
    """No agent answers to the name asked for."""


PidProbe = Callable[[int], bool]

LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 * 1024
LAUNCH_WINDOW_MS = 60 * 60 * 1000


def now_ms() -> int:
    """This host's clock, as every reader dates its reading."""
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------
# One agent


def desired_state(claim: HarnessState | None, host: str, here: str, alive: PidProbe) -> str | None:
    """`running` while the claim's wrapper lives on this host, else what the claim says, else null.

    The wrapper is the claim's pid *and* the process that pid was when it claimed (its start time,
    `guard.state.process_identity`), as the claim itself judges a holder: a pid reused since by
    another process is not the wrapper."""
    if claim is None:
        return None
    if host == here and claim.host == here and alive(claim.wrapper_pid) and _same_process(claim):
        return "running"
    return claim.desired_state


def _same_process(claim: HarnessState) -> bool:
    if claim.wrapper_identity is None:
        return True  # a claim written before identities were: the pid is all there is
    return process_identity(claim.wrapper_pid) in (None, claim.wrapper_identity)


@dataclass(frozen=True, slots=True)
class AgentRow:
    host: str
    identity: str
    harness: str | None
    desired_state: str | None
    context: Context | None
    # Why `context` is null although something was there; None for a plain absence.
    problem: str | None = None
    claim_problem: str | None = None
    # How far past this host's clock the record's observedAtMs lies, when that made it read as absent.
    ahead_ms: int | None = None
    # The account a running agent's claim names (issue 35: known from its launch, before any
    # reading); None otherwise. The record's own comes first.
    claimed_account: Account | None = None
    # The claim says the harness was adopted (issue 36: started without `hctx wrap`, `hctx adopt`
    # runs its sidecar), not launched by the wrapper.
    adopted: bool = False

    @property
    def name(self) -> str:
        return f"{self.host}/{self.identity}"

    @property
    def named_harness(self) -> str | None:
        """The harness the claim names, else the one the reading names; None with neither."""
        return self.harness or (None if self.context is None else self.context.harness)

    def wire(self) -> dict[str, Any]:
        """The row as `agents --json` prints it; `adopted` (additive, issue 36) only where it is
        true, so a wrapped agent's object is what it always was."""
        wire: dict[str, Any] = {
            "host": self.host,
            "identity": self.identity,
            "harness": self.harness,
            "desiredState": self.desired_state,
        }
        if self.adopted:
            wire["adopted"] = True
        wire["context"] = None if self.context is None else self.context.wire()
        return wire

    def warnings(self) -> list[str]:
        return [f"{self.name}: {problem}" for problem in (self.problem, self.claim_problem) if problem]


@dataclass(frozen=True, slots=True)
class DecodedAgent:
    """One agent's files as read and decoded: everything of a view that does not depend on the clock."""

    files: AgentFiles
    record: HarnessContext | None
    problem: str | None
    claim: HarnessState | None
    claim_problem: str | None
    reading: Context | None  # the record's `reading_of`, computed once

    @property
    def harness(self) -> str | None:
        return None if self.claim is None else self.claim.harness


def decode_agent(files: AgentFiles, *, expose: bool = True) -> DecodedAgent:
    """`expose=False` skips the record's `reading_of` (for a reader that takes the record's attributes)."""
    record, problem = decode_record(files.record, REGISTERED)
    claim, claim_problem = decode_claim(files.claim, REGISTERED)
    if files.problem is not None:
        claim_problem = None  # one warning for the directory, not one per file
    return DecodedAgent(
        files, record, None if problem is None else short(problem), claim, claim_problem,
        None if record is None or not expose else reading_of(record),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class AgentView:
    """Everything read about one agent: the files, their decoding, and the roster row built on them."""

    files: AgentFiles
    record: HarnessContext | None
    claim: HarnessState | None
    row: AgentRow


def agent_view(
    host: str, identity: str, decoded: DecodedAgent, now: int, *, here: str, alive: PidProbe = pid_alive
) -> AgentView:
    """The view of a decoded agent at `now`: its age, staleness and whether its wrapper lives."""
    record, problem, context, ahead = decoded.record, decoded.problem, None, None
    if record is not None:
        context = project(record, now, decoded.reading)
        if context is None:
            ahead = record.observed_at_ms - now
            problem = f"context record observed {ahead} ms in the future; clock untrusted, read as absent"
    state = desired_state(decoded.claim, host, here, alive)
    claimed = None if decoded.claim is None or state != "running" else decoded.claim.account
    row = AgentRow(
        host=host,
        identity=identity,
        harness=decoded.harness,
        desired_state=state,
        context=context,
        problem=problem,
        claim_problem=decoded.claim_problem,
        ahead_ms=ahead,
        claimed_account=claimed,
        adopted=decoded.claim is not None and decoded.claim.adopted,
    )
    return AgentView(decoded.files, record, decoded.claim, row)


def view_agent(
    catalog: Path,
    host: str,
    identity: str,
    now: int,
    *,
    here: str,
    alive: PidProbe = pid_alive,
    host_fd: int | None = None,
) -> AgentView:
    decoded = decode_agent(read_agent_files(catalog, host, identity, host_fd))
    return agent_view(host, identity, decoded, now, here=here, alive=alive)


# ---------------------------------------------------------------------------------------------
# The whole catalog


@dataclass(frozen=True, slots=True)
class Roster:
    rows: list[AgentRow]
    # Entries of the tree that are not agent directories, hosts that could not be listed.
    warnings: list[str] = field(default_factory=list)

    def all_warnings(self) -> list[str]:
        return [*self.warnings, *(warning for row in self.rows for warning in row.warnings())]


def collect_roster(catalog: Path, now: int, *, here: str, alive: PidProbe = pid_alive) -> Roster:
    """One row per agent directory, sorted by host then identity."""
    agents, warnings = list_agents(catalog)
    rows: list[AgentRow] = []
    for host, group in itertools.groupby(agents, key=operator.itemgetter(0)):
        host_fd = open_host_dir(catalog, host)
        try:
            rows.extend(
                view_agent(catalog, host, identity, now, here=here, alive=alive, host_fd=host_fd).row
                for _, identity in group
            )
        finally:
            if host_fd is not None:
                os.close(host_fd)
    return Roster(rows, warnings)


class RosterCache:
    """The roster of a catalog read again and again (`hctx watch`, the board): each agent's files
    are decoded again only when they changed (guard.catalog.CatalogCache)."""

    def __init__(self, catalog: Path) -> None:
        self.cache = CatalogCache(catalog, lambda _host, _identity, files: decode_agent(files))
        self.warnings: list[str] = []  # the last whole listing's

    def views(
        self, now: int, *, here: str, alive: PidProbe = pid_alive, only: Iterable[tuple[str, str]] | None = None
    ) -> tuple[list[AgentView], list[str]]:
        """Every agent's view at `now` and the listing's warnings; CatalogError as `list_agents`.
        `only`: just these agents (host, identity), and of them the ones whose files changed."""
        snapshot = self.cache.refresh() if only is None else self.cache.refresh_agents(only)
        if only is None:
            self.warnings = snapshot.warnings
        changed = None if only is None else set(snapshot.changed)
        views = [agent_view(host, identity, decoded, now, here=here, alive=alive)
                 for host, identity, decoded in snapshot.agents
                 if changed is None or (host, identity) in changed]  # fmt: skip
        return views, snapshot.warnings

    def changed(
        self, agents: Iterable[tuple[str, str]], now: int, *, here: str, alive: PidProbe = pid_alive
    ) -> tuple[list[AgentView], list[tuple[str, str]]]:
        """Of these agents (named by a file event), the views of those whose files changed, and the
        ones whose directory is gone (or never was an agent's)."""
        return self.looked(agents, now, here=here, alive=alive, every=False)

    def looked(
        self, agents: Iterable[tuple[str, str]], now: int, *, here: str, alive: PidProbe = pid_alive, every: bool = True
    ) -> tuple[list[AgentView], list[tuple[str, str]]]:
        """Of these agents (a part of a whole listing), every one's view at `now` (what the clock
        alone moves: age, staleness, whether the wrapper lives), each read again only if its files
        changed (`every=False`: only those views), and the ones whose directory is gone."""
        wanted = set(agents)
        snapshot = self.cache.refresh_agents(wanted)
        present = {(host, identity) for host, identity, _ in snapshot.agents}
        changed = None if every else set(snapshot.changed)
        views = [agent_view(host, identity, decoded, now, here=here, alive=alive)
                 for host, identity, decoded in snapshot.agents
                 if changed is None or (host, identity) in changed]  # fmt: skip
        return views, sorted(wanted - present)

    def listed(self, listed: Iterable[tuple[str, str]], warnings: list[str]) -> list[tuple[str, str]]:
        """A whole listing read in parts is done: the agents held that it did not list are looked at
        again (gone: dropped; made since the listing: kept), its warnings are the roster's; the gone."""
        unlisted = self.cache.held_keys() - set(listed)
        self.warnings = warnings
        if not unlisted:
            return []
        present = {(host, identity) for host, identity, _ in self.cache.refresh_agents(unlisted).agents}
        return sorted(unlisted - present)

    def roster(self, now: int, *, here: str, alive: PidProbe = pid_alive) -> Roster:
        views, warnings = self.views(now, here=here, alive=alive)
        return Roster([view.row for view in views], warnings)

    def held(self, now: int, *, here: str, alive: PidProbe = pid_alive) -> Roster:
        """The roster as the reads so far left it, projected at `now` (ages, staleness, whether each
        wrapper lives): no file is read."""
        rows = [agent_view(host, identity, decoded, now, here=here, alive=alive).row
                for host, identity, decoded in self.cache.held()]  # fmt: skip
        return Roster(rows, list(self.warnings))


def resolve_agent(catalog: Path, wanted: str, *, here: str) -> tuple[str, str]:
    """`HOST/ID` or a bare `ID`; a bare ID on several hosts means this host's, else it is ambiguous."""
    if "/" in wanted:
        host, _, identity = wanted.partition("/")
        try:
            check_name("host", host)
            check_name("identity", identity)
        except CatalogError as exc:
            raise AgentNotFound(str(exc)) from None
        if (host, identity) in list_agents(catalog)[0]:
            return host, identity
        raise AgentNotFound(f"no agent {wanted} in {catalog}")
    try:
        check_name("identity", wanted)
    except CatalogError as exc:
        raise AgentNotFound(str(exc)) from None
    hosts = [host for host, identity in list_agents(catalog)[0] if identity == wanted]
    if len(hosts) == 1:
        return hosts[0], wanted
    if here in hosts:
        return here, wanted
    if not hosts:
        raise AgentNotFound(f"no agent {wanted} in {catalog}")
    raise AgentNotFound(f"{wanted} exists on several hosts; name one of: "
                        + ", ".join(f"{host}/{wanted}" for host in hosts))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Doctor's rules (HC-R17); wrapper.readers.render words them


def fill_advised(context: Context) -> bool:
    """Doctor's first case: the harness's own percent at or above HARNESS_CONTEXT_WARN_PERCENT."""
    percent = context.used_percent
    return percent is not None and percent >= HARNESS_CONTEXT_WARN_PERCENT


def headroom_short(context: Context) -> bool:
    """Doctor's headroom case: tokens to the harness's compaction point below
    HARNESS_CONTEXT_HEADROOM_WARN_PERCENT of the window (no window or no point: never)."""
    headroom, window = context.headroom_tokens, context.window_tokens
    if headroom is None or not window:
        return False
    return headroom * 100 < window * HARNESS_CONTEXT_HEADROOM_WARN_PERCENT


def unverified_builds(harness: str, version: str) -> tuple[str, ...] | None:
    """None when `version` is one of its producer's verified builds; else the builds that are."""
    # Imported here: a harness's spec (its producer module) loads only when its builds are asked about.
    from sidecar.registry import verified_versions

    verified = verified_versions(harness)
    return None if version in verified else verified


def clocks_ahead(rows: list[AgentRow]) -> dict[str, list[AgentRow]]:
    """Per host, its rows whose record is dated past the future skew and so read as absent."""
    ahead: dict[str, list[AgentRow]] = {}
    for row in rows:
        if row.ahead_ms is not None:
            ahead.setdefault(row.host, []).append(row)
    return ahead


# ---------------------------------------------------------------------------------------------
# Inspect


@dataclass(frozen=True, slots=True)
class Inspection:
    view: AgentView
    record_path: Path
    claim_path: Path
    incarnation: str  # what the record's incarnation is relative to the claim
    launches_last_hour: int | None
    log_path: Path
    log_tail: list[str] | None  # None: no log file
    log_problem: str | None


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> tuple[list[str] | None, str | None]:
    """The last `lines` lines of a regular file, read from its end only (None, None when absent)."""
    opened = open_regular(path)
    if not isinstance(opened, tuple):
        return None, opened
    fd, size = opened
    start = max(0, size - LOG_TAIL_BYTES)
    try:
        data = os.pread(fd, LOG_TAIL_BYTES, start)
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace").splitlines()
    if start > 0 and text:
        text = text[1:]  # the first line was cut by the byte window
    return [printable(line) for line in text[-lines:]], None


def incarnation_verdict(record: HarnessContext | None, claim: HarnessState | None) -> str:
    if record is None:
        return "no record to compare"
    if claim is None:
        return "no readable claim to compare against"
    if record.incarnation == claim.incarnation:
        return "current: the record comes from the incarnation the claim names"
    for launches_ago, past in enumerate(claim.history, start=1):
        if past.incarnation == record.incarnation:
            return (
                f"straggler from an earlier incarnation ({launches_ago} launch"
                f"{'es' if launches_ago > 1 else ''} ago, pid {past.wrapper_pid}); "
                "the next reading of the current one overwrites it"
            )
    return "from an incarnation that is neither the claim's nor in its history"


def launches_within(claim: HarnessState | None, now: int, window_ms: int = LAUNCH_WINDOW_MS) -> int | None:
    if claim is None:
        return None
    stamps = [claim.claimed_at_ms, *(past.claimed_at_ms for past in claim.history)]
    return sum(1 for stamp in stamps if now - window_ms <= stamp)


def collect_inspection(
    catalog: Path, host: str, identity: str, now: int, *, here: str, alive: PidProbe = pid_alive
) -> Inspection:
    view = view_agent(catalog, host, identity, now, here=here, alive=alive)
    agent_path = catalog / AGENTS_DIR_NAME / host / identity
    path = log_path(catalog, host, identity)
    tail, log_problem = read_log_tail(path)
    return Inspection(
        view=view,
        record_path=agent_path / CONTEXT_RECORD_NAME,
        claim_path=agent_path / STATE_RECORD_NAME,
        incarnation=incarnation_verdict(view.record, view.claim),
        launches_last_hour=launches_within(view.claim, now),
        log_path=path,
        log_tail=tail,
        log_problem=log_problem,
    )
