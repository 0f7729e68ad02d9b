"""The readers: `hctx agents`, `hctx doctor`, `hctx inspect` and `hctx top` (HC-R14, HC-R17).

Collecting is separated from rendering: `collect_*` take the catalog path and `now_ms` and return
plain data; `render_*` turn that data into text. Nothing here writes into the catalog.

A reader faces whatever a replicated directory tree may hold, so every file is opened without
following a symlink and without blocking (a FIFO named like a record must not hang the roster),
must be a regular file, and is read only up to its bound. Anything else is a row with `context:
null` and a warning, never a traceback and never a number the record did not carry.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import json
import math
import operator
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from guard.constants import (
    AGENTS_DIR_NAME,
    CONTEXT_RECORD_NAME,
    HARNESS_CONTEXT_FUTURE_SKEW_MS,
    HARNESS_CONTEXT_HEADROOM_WARN_PERCENT,
    HARNESS_CONTEXT_STALE_MS,
    HARNESS_CONTEXT_WARN_PERCENT,
    STATE_RECORD_NAME,
)
from guard.files import RawFile, open_regular, read_bounded
from guard.projection import MAX_RECORD_BYTES, decode_record, headroom_tokens, project
from guard.record import HarnessContext, RecordRefused, round_half_up
from guard.state import MAX_STATE_BYTES, HarnessState, Unobserved, parse_state
from guard.store import (
    CatalogError,
    agent_tree_children,
    check_name,
    default_catalog_origin,
    default_host,
    log_path,
    pid_alive,
)
from sidecar.producers import verified_versions

Command = Callable[[argparse.Namespace], int]
PidProbe = Callable[[int], bool]

LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 * 1024
# A refused record is shown in `inspect` so its damage can be seen, but not megabytes of it.
RAW_SHOWN_BYTES = 4096
LAUNCH_WINDOW_MS = 60 * 60 * 1000
PROBLEM_CHARS = 200

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# ---------------------------------------------------------------------------------------------
# This host


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------
# Reading files a hostile tree may hold


class CatalogUnreadable(Exception):
    """The catalog cannot be read at all; the message says where and why."""


def _short(text: str) -> str:
    text = printable(text)
    return text if len(text) <= PROBLEM_CHARS else text[: PROBLEM_CHARS - 1] + "…"


def _open_below(catalog: Path, names: tuple[str, ...], parent_fd: int | None = None) -> int:
    """A directory's descriptor; every component below the catalog (or `parent_fd`) must be real."""
    current = os.open(catalog, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if parent_fd is None else parent_fd
    try:
        for name in names:
            child = os.open(name, _DIR_FLAGS, dir_fd=current)
            if current != parent_fd:
                os.close(current)
            current = child
    except BaseException:
        if current != parent_fd:
            os.close(current)
        raise
    return current


# ---------------------------------------------------------------------------------------------
# One agent


@dataclass(frozen=True, slots=True)
class AgentFiles:
    """The two records of one agent directory as read, before any interpretation."""

    record: RawFile
    claim: RawFile
    problem: str | None = None  # the directory itself could not be opened


def read_agent_files(catalog: Path, host: str, identity: str, host_fd: int | None = None) -> AgentFiles:
    """`host_fd`, when the caller holds the host directory open, saves re-walking the catalog per agent."""
    try:
        if host_fd is None:
            dir_fd = _open_below(catalog, (AGENTS_DIR_NAME, host, identity))
        else:
            dir_fd = _open_below(catalog, (identity,), host_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            reason = "is not a real directory (symlink or file)"
        elif exc.errno == errno.ENOENT:
            reason = "does not exist"
        else:
            reason = f"unreadable: {exc.strerror or exc}"
        problem = f"agent directory {reason}"
        return AgentFiles(RawFile(problem=problem), RawFile(problem=problem), problem)
    try:
        return AgentFiles(
            record=read_bounded(dir_fd, CONTEXT_RECORD_NAME, MAX_RECORD_BYTES),
            claim=read_bounded(dir_fd, STATE_RECORD_NAME, MAX_STATE_BYTES),
        )
    finally:
        os.close(dir_fd)


def decode_claim(raw: RawFile) -> tuple[HarnessState | None, str | None]:
    if raw.data is None:
        return None, None if raw.problem is None else f"harness-state claim {raw.problem}"
    try:
        return parse_state(raw.data), None
    except RecordRefused as exc:
        return None, _short(f"harness-state claim refused: {exc}")


def desired_state(claim: HarnessState | None, host: str, here: str, alive: PidProbe) -> str | None:
    """`running` while the claim's wrapper lives on this host, else what the claim says, else null."""
    if claim is None:
        return None
    if host == here and claim.host == here and alive(claim.wrapper_pid):
        return "running"
    return claim.desired_state


@dataclass(frozen=True, slots=True)
class AgentRow:
    host: str
    identity: str
    harness: str | None
    desired_state: str | None
    context: dict[str, Any] | None
    # Why `context` is null although something was there; None for a plain absence.
    problem: str | None = None
    claim_problem: str | None = None
    # How far past this host's clock the record's observedAtMs lies, when that made it read as absent.
    ahead_ms: int | None = None

    @property
    def name(self) -> str:
        return f"{self.host}/{self.identity}"

    def wire(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "identity": self.identity,
            "harness": self.harness,
            "desiredState": self.desired_state,
            "context": self.context,
        }

    def warnings(self) -> list[str]:
        return [f"{self.name}: {problem}" for problem in (self.problem, self.claim_problem) if problem]


@dataclass(frozen=True, slots=True)
class AgentView:
    """Everything read about one agent: the files, their decoding, and the roster row built on them."""

    files: AgentFiles
    record: HarnessContext | None
    claim: HarnessState | None
    row: AgentRow


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
    files = read_agent_files(catalog, host, identity, host_fd)
    record, problem = decode_record(files.record)
    problem = None if problem is None else _short(problem)
    claim, claim_problem = decode_claim(files.claim)
    context = None
    ahead = None
    if record is not None:
        context = project(record, now)
        if context is None:
            ahead = record.observed_at_ms - now
            problem = f"context record observed {ahead} ms in the future; clock untrusted, read as absent"
    if files.problem is not None:
        claim_problem = None  # one warning for the directory, not one per file
    row = AgentRow(
        host=host,
        identity=identity,
        harness=None if claim is None else claim.harness,
        desired_state=desired_state(claim, host, here, alive),
        context=context,
        problem=problem,
        claim_problem=claim_problem,
        ahead_ms=ahead,
    )
    return AgentView(files, record, claim, row)


# ---------------------------------------------------------------------------------------------
# The whole catalog


@dataclass(frozen=True, slots=True)
class Roster:
    rows: list[AgentRow]
    # Entries of the tree that are not agent directories, hosts that could not be listed.
    warnings: list[str] = field(default_factory=list)

    def all_warnings(self) -> list[str]:
        return [*self.warnings, *(warning for row in self.rows for warning in row.warnings())]


def _agents_root(catalog: Path) -> Path | None:
    """`<catalog>/agents`, None when there is no catalog yet; raises when it cannot be read at all."""
    root = catalog / AGENTS_DIR_NAME
    try:
        catalog_info = os.stat(catalog)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CatalogUnreadable(f"{catalog}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(catalog_info.st_mode):
        raise CatalogUnreadable(f"{catalog} is not a directory")
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CatalogUnreadable(f"{root}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CatalogUnreadable(f"{root} is not a real directory (symlink or file)")
    return root


def _named_dirs(directory: Path, kind: str, warnings: list[str], *, legacy_ok: bool) -> list[str]:
    """Subdirectories that can be agent-tree names; everything else is named in a warning."""
    names, passed_over = agent_tree_children(directory, kind, legacy_ok=legacy_ok)
    warnings.extend(f"{printable(line)}; ignored" for line in passed_over)
    return names


def list_agents(catalog: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Every (host, identity) under `<catalog>/agents`, sorted, and warnings for what was passed over."""
    root = _agents_root(catalog)
    if root is None:
        return [], []
    warnings: list[str] = []
    try:
        hosts = _named_dirs(root, "host", warnings, legacy_ok=False)
    except OSError as exc:
        raise CatalogUnreadable(f"{root}: {exc.strerror or exc}") from None
    agents: list[tuple[str, str]] = []
    for host in hosts:
        try:
            identities = _named_dirs(root / host, "identity", warnings, legacy_ok=True)
        except OSError as exc:
            warnings.append(f"{root / host}: {exc.strerror or exc}; host skipped")
            continue
        agents.extend((host, identity) for identity in identities)
    return agents, warnings


def collect_roster(catalog: Path, now: int, *, here: str, alive: PidProbe = pid_alive) -> Roster:
    """One row per agent directory, sorted by host then identity."""
    agents, warnings = list_agents(catalog)
    rows: list[AgentRow] = []
    for host, group in itertools.groupby(agents, key=operator.itemgetter(0)):
        try:
            host_fd: int | None = _open_below(catalog, (AGENTS_DIR_NAME, host))
        except OSError:
            host_fd = None  # each of its agents then names what is wrong
        try:
            rows.extend(
                view_agent(catalog, host, identity, now, here=here, alive=alive, host_fd=host_fd).row
                for _, identity in group
            )
        finally:
            if host_fd is not None:
                os.close(host_fd)
    return Roster(rows, warnings)


class AgentNotFound(LookupError):
    pass


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
# Doctor (HC-R17)


def doctor_advisories(roster: Roster) -> list[str]:
    """The spec's two cases, then one line per host whose clock runs past the future skew; nothing
    for absent, refused or fresh below-threshold readings."""
    lines = []
    for row in roster.rows:
        context = row.context
        if context is None:
            continue
        percent = context["usedPercent"]
        if percent is not None and percent >= HARNESS_CONTEXT_WARN_PERCENT:
            tokens = meter_text(context)
            lines.append(
                f"advisory: {row.name}: context fill {percent_text(percent)}"
                + (f" ({tokens} tokens)" if tokens else "")
                + f", at or above {HARNESS_CONTEXT_WARN_PERCENT}%; reading {age_text(context['ageMs'])} old"
            )
        if headroom_short(context):
            lines.append(
                f"advisory: {row.name}: {headroom_text(context)} tokens"
                f" to the harness's own compaction at {tokens_text(context['compactAtTokens'])}"
                f", under {HARNESS_CONTEXT_HEADROOM_WARN_PERCENT}% of the {tokens_text(context['windowTokens'])}"
                f" window; reading {age_text(context['ageMs'])} old"
            )
        if context["stale"] and row.desired_state == "running":
            lines.append(
                f"advisory: {row.name}: context record stale while desired state is running; "
                f"the numbers are {age_text(context['ageMs'])} old, older than the "
                f"{age_text(HARNESS_CONTEXT_STALE_MS)} horizon"
            )
        unverified = unverified_version(context)
        if unverified is not None and row.desired_state == "running":
            lines.append(f"advisory: {row.name}: {unverified}")
    return lines + clock_advisories(roster.rows)


def unverified_version(context: dict[str, Any]) -> str | None:
    """Why the running build's numbers are unmeasured, or None: a build the record names that is
    outside its producer's verified set (a record naming no build says nothing either way)."""
    harness, version = context["harness"], context.get("harnessVersion")
    if version is None:
        return None
    verified = verified_versions(harness)
    if version in verified:
        return None
    return (
        f"{harness} {printable(version)} is not a verified build (verified: {', '.join(verified)}); "
        "its numbers follow arithmetic measured on those"
    )


def headroom_short(context: dict[str, Any]) -> bool:
    """Doctor's headroom case: tokens to the harness's compaction point below
    HARNESS_CONTEXT_HEADROOM_WARN_PERCENT of the window (no window or no point: never)."""
    headroom, window = headroom_tokens(context), context["windowTokens"]
    return headroom is not None and bool(window) and headroom * 100 < window * HARNESS_CONTEXT_HEADROOM_WARN_PERCENT


def clock_advisories(rows: list[AgentRow]) -> list[str]:
    """A record dated past the future skew reads as absent (the spec); say which host's clock runs
    ahead of this one and by how much, rather than let its agents vanish silently."""
    ahead: dict[str, list[AgentRow]] = {}
    for row in rows:
        if row.ahead_ms is not None:
            ahead.setdefault(row.host, []).append(row)
    lines = []
    for host, group in ahead.items():
        most = max(row.ahead_ms or 0 for row in group)
        names = ", ".join(row.name for row in group)
        lines.append(
            f"advisory: host {host}: clock ahead of this host's by at least {age_text(most)} "
            f"({most} ms), past the {age_text(HARNESS_CONTEXT_FUTURE_SKEW_MS)} skew bound; "
            f"context read as absent for {names}"
        )
    return lines


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


# ---------------------------------------------------------------------------------------------
# Rendering

_CONTROL_ESCAPES = {0x7F: "\\x7f"}
_BIDI = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A))

Tint = Literal["amber", "red"] | None
AMBER_PERCENT = 80
RED_PERCENT = 95
_SGR = {"amber": "\x1b[33m", "red": "\x1b[31m"}
_RESET = "\x1b[0m"


def printable(text: str) -> str:
    """`text` with terminal controls shown escaped, so a hostile field cannot drive the terminal."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        code = ord(char)
        if code < 0x20 or code in _CONTROL_ESCAPES or 0x80 <= code < 0xA0 or code in _BIDI:
            out.append(_CONTROL_ESCAPES.get(code, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"))
        else:
            out.append(char)
    return "".join(out)


def colour_enabled(stream: IO[str], environ: dict[str, str] | None = None) -> bool:
    """Colour on a terminal only, and never when NO_COLOR is set (https://no-color.org) or TERM=dumb."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def percent_text(percent: float) -> str:
    """Rounded for width, never clamped: 585.6 is 586%; past five digits in exponent form (1e+308%),
    so a planted number cannot print hundreds of digits."""
    if not -PERCENT_DIGITS_LIMIT < percent < PERCENT_DIGITS_LIMIT:
        return f"{percent:.0e}%"
    return f"{round_half_up(percent)}%"


PERCENT_DIGITS_LIMIT = 100_000


def ctx_text(context: dict[str, Any] | None) -> str:
    """The roster's compact column: `ctx:92% ⟳1`, `ctx:-`, `ctx:?`, with ` stale`."""
    if context is None:
        return "ctx:-"
    percent = context["usedPercent"]
    text = "ctx:?" if percent is None else f"ctx:{percent_text(percent)}"
    if context["compactions"]:
        text += f" ⟳{context['compactions']}"
    if context["stale"]:
        text += " stale"
    return text


def tokens_text(tokens: int | None) -> str:
    """`127k` style: whole thousands below a million, then millions to one decimal."""
    if tokens is None:
        return "?"
    if tokens < 1000:
        return str(tokens)
    if round_half_up(tokens / 1000) < 1000:
        return f"{round_half_up(tokens / 1000)}k"
    millions = round_half_up(tokens / 100_000) / 10
    return f"{millions:g}M"


def headroom_text(context: dict[str, Any] | None) -> str:
    """The headroom column: `→ 12k` tokens to the harness's own compaction, `→ -3k` past it, `-`
    where the harness states no compaction point (or the reading no count)."""
    headroom = None if context is None else headroom_tokens(context)
    if headroom is None:
        return "-"
    return f"→ {'-' if headroom < 0 else ''}{tokens_text(abs(headroom))}"


def meter_text(context: dict[str, Any] | None) -> str:
    """The decision record's `127k/200k`; empty when neither count is known."""
    if context is None or (context["usedTokens"] is None and context["windowTokens"] is None):
        return ""
    return f"{tokens_text(context['usedTokens'])}/{tokens_text(context['windowTokens'])}"


def fill_tint(context: dict[str, Any] | None) -> Tint:
    """Amber at >= 80%, red at >= 95% of the harness's own percent; no percent, no tint."""
    if context is None or context["usedPercent"] is None:
        return None
    percent = context["usedPercent"]
    if percent >= RED_PERCENT:
        return "red"
    if percent >= AMBER_PERCENT:
        return "amber"
    return None


def paint(text: str, tint: Tint, colour: bool) -> str:
    if not colour or tint is None or not text:
        return text
    return f"{_SGR[tint]}{text}{_RESET}"


def age_text(age_ms: int) -> str:
    seconds = age_ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def cost_text(cost: float | None) -> str:
    if cost is None:
        return "-"
    if cost == 0 or abs(cost) >= 1:
        return f"${cost:,.2f}"
    # Below a dollar, three significant digits: a per-message cost of $0.0123 is not "$0.01".
    decimals = max(2, 2 - math.floor(math.log10(abs(cost))))
    return f"${cost:.{decimals}f}"


def table(rows: Iterable[list[tuple[str, Tint]]], header: list[str], colour: bool) -> str:
    """Left-aligned columns; widths from the plain text, colour applied after padding."""
    body = list(rows)
    widths = [len(title) for title in header]
    for cells in body:
        for index, (text, _) in enumerate(cells):
            widths[index] = max(widths[index], len(text))
    lines = ["  ".join(title.ljust(width) for title, width in zip(header, widths, strict=True)).rstrip()]
    for cells in body:
        padded = [
            paint(text, tint, colour) + " " * (width - len(text))
            for (text, tint), width in zip(cells, widths, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def render_json_array(objects: list[dict[str, Any]]) -> str:
    """What every `--json` listing prints: one JSON array, one object per line. Greppable, and
    compact enough for json's C encoder (an indented dump is the pure-Python one, several times
    slower on a 10,000-agent roster)."""
    if not objects:
        return "[]\n"
    return "[\n" + ",\n".join(_encode(item) for item in objects) + "\n]\n"


def render_agents_json(rows: list[AgentRow]) -> str:
    return render_json_array([row.wire() for row in rows])


def render_agent_json(row: AgentRow) -> str:
    return _encode(row.wire()) + "\n"


def render_agents(rows: list[AgentRow], *, colour: bool) -> str:
    if not rows:
        return "no agents\n"
    header = ["HOST", "AGENT", "HARNESS", "DESIRED", "CONTEXT", "TOKENS", "HEADROOM", "AGE", "COST"]
    body = []
    for row in rows:
        context = row.context
        body.append([
            (row.host, None),
            (row.identity, None),
            (row.harness or (None if context is None else context["harness"]) or "-", None),
            (row.desired_state or "-", None),
            (ctx_text(context), None),
            (meter_text(context), fill_tint(context)),
            (headroom_text(context), None),
            ("-" if context is None else age_text(context["ageMs"]), None),
            (cost_text(None if context is None else context["costUsd"]), None),
        ])  # fmt: skip
    return table(body, header, colour)


def _ms_text(ms: int) -> str:
    import datetime

    try:
        stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{ms} ({stamp.isoformat(timespec='milliseconds').replace('+00:00', 'Z')})"


def _raw_text(raw: RawFile) -> list[str]:
    if raw.absent:
        return ["  (no file)"]
    if raw.data is None:
        return [f"  ({raw.problem})"]
    shown = raw.data[:RAW_SHOWN_BYTES].decode("utf-8", errors="replace")
    lines = [f"  {printable(line)}" for line in shown.splitlines() or [""]]
    if len(raw.data) > RAW_SHOWN_BYTES:
        lines.append(f"  … ({len(raw.data) - RAW_SHOWN_BYTES} more bytes not shown)")
    return lines


def compaction_text(record: HarnessContext) -> str:
    """Where this harness compacts on its own, as the record says, and why a null is null."""
    if record.compact_at_tokens is not None:
        return f"at {record.compact_at_tokens} tokens, by the harness's own settings"
    if record.auto_compaction is False:
        return "auto-compaction off (the harness's own settings)"
    return "point not stated by the harness"


def _unobserved_text(gaps: list[Unobserved], indent: str) -> list[str]:
    """Each stretch the session ran with no sidecar watching: its readings then were never written."""
    lines = []
    for gap in gaps:
        since = _ms_text(gap.since_ms)
        if gap.until_ms is None:
            span = f"from {since}, never replaced"
        else:
            ms = max(0, gap.until_ms - gap.since_ms)
            span = f"{age_text(ms) if ms >= 60_000 else f'{ms / 1000:.1f}s'} from {since}"
        lines.append(f"{indent}unobserved {span}: sidecar pid {gap.sidecar_pid} {gap.how_it_ended()}")
    return lines


def version_text(record: HarnessContext) -> str:
    """`2.1.332 (verified)`, `2.2.0 (not verified: 2.1.250, 2.1.332)`, or why there is none."""
    version = record.harness_version
    if version is None:
        return "not named by the channel"
    verified = verified_versions(record.harness)
    verdict = "verified" if version in verified else f"not verified: {', '.join(verified)}"
    return f"{printable(version)} ({verdict})"


def render_inspection(inspection: Inspection) -> str:
    view = inspection.view
    row = view.row
    out = [f"agent {row.name}", ""]

    out.append(f"== record as stored: {inspection.record_path}")
    out.extend(_raw_text(view.files.record))
    if view.record is not None:
        out.append(f"  incarnation   {printable(view.record.incarnation)}")
        out.append(f"  observedAtMs  {_ms_text(view.record.observed_at_ms)}")
        out.append(f"  writtenAtMs   {_ms_text(view.record.written_at_ms)}")
        out.append(f"  compaction    {compaction_text(view.record)}")
        out.append(f"  harness build {version_text(view.record)}")
        if view.record.session_id is not None:
            out.append(f"  session       {printable(view.record.session_id)}")
    if row.problem:
        out.append(f"  ! {row.problem}")
    out.append(f"  incarnation check: {inspection.incarnation}")
    out.append("")

    out.append(f"== harness-state claim: {inspection.claim_path}")
    claim = view.claim
    if claim is None:
        out.extend(_raw_text(view.files.claim) if row.claim_problem is None else [f"  ! {row.claim_problem}"])
    else:
        out.append(f"  harness       {claim.harness}")
        out.append(f"  host          {printable(claim.host)}")
        out.append(f"  incarnation   {printable(claim.incarnation)}")
        out.append(f"  claimedAtMs   {_ms_text(claim.claimed_at_ms)}")
        out.append(f"  wrapperPid    {claim.wrapper_pid}")
        out.append(f"  desiredState  {claim.desired_state} (as written; derived now: {row.desired_state})")
        out.extend(_unobserved_text(claim.unobserved, "  "))
        out.append(f"  launches in the last hour: {inspection.launches_last_hour}")
        out.append(f"  history ({len(claim.history)} earlier claims, newest first):")
        for past in claim.history:
            out.append(
                f"    {printable(past.incarnation)}  claimedAtMs {_ms_text(past.claimed_at_ms)}  pid {past.wrapper_pid}"
            )
            out.extend(_unobserved_text(past.unobserved, "      "))
    out.append("")

    out.append("== projection (the roster's context)")
    projected = json.dumps(row.context, ensure_ascii=False, allow_nan=False, indent=2)
    out.extend(f"  {printable(line)}" for line in projected.splitlines())
    out.append(f"  {ctx_text(row.context)}  {meter_text(row.context)}".rstrip())
    out.append("")

    out.append(f"== log: {inspection.log_path} (last {LOG_TAIL_LINES} lines)")
    if inspection.log_problem:
        out.append(f"  ! log {inspection.log_problem}")
    elif inspection.log_tail is None:
        out.append("  (no log file)")
    else:
        out.extend(f"  {line}" for line in inspection.log_tail)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# The command line


def catalog_origin(args: argparse.Namespace) -> tuple[Path, str]:
    """The catalog a command uses and where that path came from: `--catalog`, else `$HCTX_CATALOG`,
    else the XDG default. Every command resolves it here."""
    catalog: Path | None = args.catalog
    return default_catalog_origin() if catalog is None else (catalog, "--catalog")


def catalog_of(args: argparse.Namespace) -> Path:
    return catalog_origin(args)[0]


def existing_catalog(args: argparse.Namespace) -> Path:
    """The catalog a reader reads. A path that does not exist is an error naming it and its origin,
    so a typo never reads as an empty fleet; an existing empty catalog is an empty answer."""
    catalog, origin = catalog_origin(args)
    if not os.path.lexists(catalog):
        raise CatalogUnreadable(f"{catalog} does not exist (from {origin})")
    return catalog


def _quiet_guard_logs() -> None:
    """The projection logs what it refuses; readers report it themselves, as a row's warning."""
    import logging

    guard_log = logging.getLogger("guard")
    guard_log.addHandler(logging.NullHandler())
    guard_log.propagate = False


def _warn(command: str, messages: Iterable[str]) -> None:
    for message in messages:
        print(f"hctx {command}: warning: {message}", file=sys.stderr)


def _fail(command: str, message: str, status: int) -> int:
    print(f"hctx {command}: {message}", file=sys.stderr)
    return status


def run_agents(args: argparse.Namespace) -> int:
    _quiet_guard_logs()
    here, now = args.host, now_ms()
    try:
        catalog = existing_catalog(args)
        if args.agent is not None:
            host, identity = resolve_agent(catalog, args.agent, here=here)
            row = view_agent(catalog, host, identity, now, here=here).row
            _warn("agents", row.warnings())
            if args.json:
                sys.stdout.write(render_agent_json(row))
            else:
                sys.stdout.write(render_agents([row], colour=colour_enabled(sys.stdout)))
            return 0
        roster = collect_roster(catalog, now, here=here)
    except CatalogUnreadable as exc:
        return _fail("agents", f"cannot read the catalog: {exc}", 2)
    except AgentNotFound as exc:
        return _fail("agents", str(exc.args[0]), 1)
    _warn("agents", roster.all_warnings())
    if args.json:
        sys.stdout.write(render_agents_json(roster.rows))
    else:
        sys.stdout.write(render_agents(roster.rows, colour=colour_enabled(sys.stdout)))
    return 0


def run_doctor(args: argparse.Namespace) -> int:
    _quiet_guard_logs()
    try:
        roster = collect_roster(existing_catalog(args), now_ms(), here=args.host)
    except CatalogUnreadable as exc:
        return _fail("doctor", f"cannot read the catalog: {exc}", 2)
    advisories = doctor_advisories(roster)
    for line in advisories:
        print(line)
    if not advisories:
        count = len(roster.rows)
        print(f"ok: {count} agent{'' if count == 1 else 's'}, no advisories")
    return 0  # advisories are never a failure (HC-R17)


def run_inspect(args: argparse.Namespace) -> int:
    _quiet_guard_logs()
    here, now = args.host, now_ms()
    try:
        catalog = existing_catalog(args)
        host, identity = resolve_agent(catalog, args.agent, here=here)
        inspection = collect_inspection(catalog, host, identity, now, here=here)
    except CatalogUnreadable as exc:
        return _fail("inspect", f"cannot read the catalog: {exc}", 2)
    except AgentNotFound as exc:
        return _fail("inspect", str(exc.args[0]), 1)
    sys.stdout.write(render_inspection(inspection))
    return 0


def run_top(args: argparse.Namespace) -> int:
    from wrapper.top import run

    _quiet_guard_logs()
    try:
        catalog = existing_catalog(args)
    except CatalogUnreadable as exc:
        return _fail("top", f"cannot read the catalog: {exc}", 2)
    return run(catalog, here=args.host, once=args.once)


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    """`--catalog` and `--host`, the same for every command; resolved when the command runs."""
    parser.add_argument(
        "--catalog",
        type=Path,
        metavar="DIR",
        help="catalog root (default: $HCTX_CATALOG, else $XDG_STATE_HOME/hctx, else ~/.local/state/hctx)",
    )
    parser.add_argument(
        "--host",
        default=None,
        metavar="NAME",
        help="the host name this machine has in the catalog (default: the short hostname)",
    )


def with_host(run: Command) -> Command:
    def resolved(args: argparse.Namespace) -> int:
        if args.host is None:
            args.host = default_host()
        return run(args)

    return resolved


def add_reader_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agents = commands.add_parser(
        "agents",
        help="list every agent with its context fill",
        description="One row per agent directory of every host in the catalog, sorted by host then identity.",
    )
    agents.add_argument("agent", nargs="?", metavar="ID", help="just this agent (ID or HOST/ID)")
    agents.add_argument(
        "--json",
        action="store_true",
        help="the roster as one JSON array, an object per agent (jq '.[]'); with ID, that agent's object",
    )
    add_catalog_options(agents)
    agents.set_defaults(run=with_host(run_agents))

    doctor = commands.add_parser(
        "doctor",
        help="advise on full windows and stale records",
        description=f"An advisory line per agent at or above {HARNESS_CONTEXT_WARN_PERCENT}% fill, per agent "
        f"under {HARNESS_CONTEXT_HEADROOM_WARN_PERCENT}% of its window from the harness's own compaction point, "
        "per stale record while its desired state is running, and one per host whose clock runs past the "
        "future skew (its records read as absent); advisories never fail the exit status.",
    )
    add_catalog_options(doctor)
    doctor.set_defaults(run=with_host(run_doctor))

    inspect = commands.add_parser(
        "inspect",
        help="one agent's raw record, claim history and log tail",
        description="The record as stored, the harness-state claim with its history, the projection "
        "and the last lines of the agent's log: for crash-loop inspection.",
    )
    inspect.add_argument("agent", metavar="ID", help="the agent (ID or HOST/ID)")
    add_catalog_options(inspect)
    inspect.set_defaults(run=with_host(run_inspect))

    top = commands.add_parser(
        "top",
        help="a live view of every agent, sorted by fill",
        description="Full-screen, refreshed every second and within a second of a record changing; q or Ctrl-C quits.",
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    add_catalog_options(top)
    top.set_defaults(run=with_host(run_top))
