"""`hctx scan`: the occupancy of recent sessions nobody wrapped, read from the harnesses' transcripts.

No catalog and no sidecar: every Claude session file under `$CLAUDE_CONFIG_DIR/projects` (default
`~/.claude/projects`) and every Codex rollout under `$CODEX_HOME/sessions` (default `~/.codex`)
modified within `--since` is read from its end (`sidecar.transcripts`), and reported as the
decision record reads it (../shared/spec/001):

- Claude: the latest main-chain assistant message's input + cache_read + cache_creation over the
  window an explicit model table gives for its model id (`windowSource: "model-table"`); an id the
  table does not list yields no window and no percent. After `/compact` the reading stays the
  pre-compaction one until the next assistant message (`compactedSinceReading` says so); `/clear`
  starts a new session file, which reads empty until its first reply.
- Codex: the latest `token_count` through the Codex producer's own arithmetic, with the window Codex
  reported in the rollout (`windowSource: "transcript"`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from guard.errors import ModelTableError
from guard.record import MAX_COUNT, ContextFields

if TYPE_CHECKING:  # the transcript readers load only when `hctx scan` runs, not for every command
    from sidecar.transcripts import BackwardLines

__all__ = [
    "DEFAULT_SINCE",
    "MODEL_TABLE_SCHEMA",
    "USER_MODEL_TABLE",
    "ScanRow",
    "SessionFile",
    "WindowSource",
    "add_scan_command",
    "claude_config_dir",
    "codex_home",
    "find_sessions",
    "model_table",
    "parse_duration",
    "read_session",
    "render_rows",
    "run_scan",
    "scan",
    "shipped_model_table",
    "user_model_table_path",
]

DEFAULT_SINCE: Final = "24h"
MODEL_TABLE_SCHEMA: Final = "hctx.model-windows.v1"
USER_MODEL_TABLE: Final = Path("hctx") / "models.json"
_USER_TABLE_LIMIT: Final = 1024 * 1024
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SESSION_ID: Final = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$")
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

WindowSource = Literal["transcript", "model-table"]


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `2h`, `7d`, `1w`, or combined (`1h30m`), in milliseconds."""
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is negative: how far back, like 30m, 2h or 7d")
    parts = _DURATION.findall(text)
    if not parts or "".join(value + unit for value, unit in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30m, 2h or 7d")
    return round(sum(float(value) * _UNIT_S[unit] for value, unit in parts) * 1000)


# ---------------------------------------------------------------------------------------------
# The model → window table


def _windows(data: object, where: str) -> dict[str, int | None]:
    if not isinstance(data, dict) or data.get("schema") != MODEL_TABLE_SCHEMA:
        raise ModelTableError(f"{where}: not a {MODEL_TABLE_SCHEMA} object")
    windows = data.get("windows")
    if not isinstance(windows, dict):
        raise ModelTableError(f"{where}: 'windows' is not an object")
    table: dict[str, int | None] = {}
    for model, window in windows.items():
        valid = window is None or (isinstance(window, int) and not isinstance(window, bool) and 0 < window <= MAX_COUNT)
        if not valid:
            raise ModelTableError(f"{where}: window of {model!r} is not a positive integer up to 2**53, or null")
        table[model] = window
    return table


def shipped_model_table() -> dict[str, int]:
    text = resources.files("wrapper").joinpath("model_windows.json").read_text(encoding="utf-8")
    return {model: window for model, window in _windows(json.loads(text), "shipped table").items() if window}


def user_model_table_path(environ: Mapping[str, str]) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(config) / USER_MODEL_TABLE


def model_table(environ: Mapping[str, str], warnings: list[str]) -> dict[str, int]:
    """The shipped table, extended and overridden by the user's file (a null there removes an id)."""
    table = shipped_model_table()
    path = user_model_table_path(environ)
    try:
        # A config file may be a dotfiles symlink; it may not be a FIFO that hangs the scan.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return table
    except OSError as exc:
        warnings.append(f"model table {path}: {exc.strerror or exc}; using the shipped table")
        return table
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            warnings.append(f"model table {path}: not a regular file; using the shipped table")
            return table
        data = handle.read(_USER_TABLE_LIMIT + 1)
    try:
        if len(data) > _USER_TABLE_LIMIT:
            raise ModelTableError(f"{path}: larger than {_USER_TABLE_LIMIT} bytes")
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ModelTableError(f"{path}: not JSON ({exc})") from None
        for model, window in _windows(parsed, str(path)).items():
            if window is None:
                table.pop(model, None)
            else:
                table[model] = window
    except ModelTableError as exc:
        warnings.append(f"model table {exc}; using the shipped table")
    return table


# ---------------------------------------------------------------------------------------------
# Finding sessions


@dataclass(frozen=True)
class SessionFile:
    harness: Literal["claude", "codex"]
    path: Path
    modified_ms: int


def claude_config_dir(environ: Mapping[str, str]) -> Path:
    configured = environ.get("CLAUDE_CONFIG_DIR")
    return Path(configured) if configured else Path(environ.get("HOME") or Path.home()) / ".claude"


def codex_home(environ: Mapping[str, str]) -> Path:
    configured = environ.get("CODEX_HOME")
    return Path(configured) if configured else Path(environ.get("HOME") or Path.home()) / ".codex"


def _regular_mtime_ms(path: Path) -> int | None:
    try:
        info = path.lstat()
    except OSError:
        return None
    # A file dated before 1970 reads as 1970: an instant in a reading is never negative.
    return max(0, info.st_mtime_ns // 1_000_000) if stat.S_ISREG(info.st_mode) else None


def find_sessions(environ: Mapping[str, str], since_ms: int, now: int) -> Iterator[SessionFile]:
    """Claude's `projects/*/<session>.jsonl` (subagent transcripts live deeper and are another
    window) and Codex's `sessions/**/rollout-*.jsonl`, modified at or after `now - since_ms`."""
    oldest = now - since_ms
    projects = claude_config_dir(environ) / "projects"
    for project in _subdirs(projects):
        for path in sorted(project.glob("*.jsonl")):
            modified = _regular_mtime_ms(path)
            if modified is not None and modified >= oldest:
                yield SessionFile("claude", path, modified)
    sessions = codex_home(environ) / "sessions"
    for directory, subdirs, files in os.walk(sessions):
        subdirs.sort()
        for name in sorted(files):
            if name.startswith("rollout-") and name.endswith(".jsonl"):
                path = Path(directory) / name
                modified = _regular_mtime_ms(path)
                if modified is not None and modified >= oldest:
                    yield SessionFile("codex", path, modified)


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(entry for entry in path.iterdir() if entry.is_dir() and not entry.is_symlink())
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# Reading one session


@dataclass(frozen=True)
class ScanRow:
    fields: ContextFields | None
    path: Path
    session_id: str | None
    window_source: WindowSource | None
    modified_ms: int
    model: str | None
    compactions: int | None
    extra: dict[str, Any]
    problem: str | None = None

    def wire(self, now: int) -> dict[str, Any]:
        fields = self.fields
        reading = {} if fields is None else fields.model_dump(mode="json", by_alias=True)
        observed = None if fields is None or fields.used_tokens is None else fields.observed_at_ms
        return {
            "harness": reading.get("harness"),
            "sessionId": self.session_id,
            "usedTokens": reading.get("usedTokens"),
            "windowTokens": reading.get("windowTokens"),
            "usedPercent": reading.get("usedPercent"),
            "windowSource": self.window_source,
            "model": self.model,
            "sessionTotalTokens": reading.get("sessionTotalTokens"),
            "rateLimits": reading.get("rateLimits"),
            "compactions": self.compactions,
            "lastCompactionMs": reading.get("lastCompactionMs"),
            "lastCompactionTrigger": reading.get("lastCompactionTrigger"),
            **self.extra,
            "observedAtMs": observed,
            "ageMs": None if observed is None else max(now - observed, 0),
            "modifiedAtMs": self.modified_ms,
            "path": str(self.path),
            "problem": self.problem,
        }


def _open_tail(path: Path) -> tuple[int, int]:
    fd = os.open(path, _FILE_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _session_id(path: Path) -> str | None:
    match = _SESSION_ID.search(path.name)
    return match.group(1) if match else None


def read_session(session: SessionFile, table: Mapping[str, int]) -> ScanRow:
    session_id = _session_id(session.path)
    try:
        fd, size = _open_tail(session.path)
    except OSError as exc:
        problem = exc.strerror or str(exc)
        return ScanRow(None, session.path, session_id, None, session.modified_ms, None, None, {}, problem)
    try:
        from sidecar.transcripts import BackwardLines

        lines = BackwardLines(lambda offset, length: os.pread(fd, length, offset), size)
        if session.harness == "claude":
            return _claude_row(session, session_id, lines, table)
        return _codex_row(session, session_id, lines)
    except OSError as exc:
        problem = exc.strerror or str(exc)
        return ScanRow(None, session.path, session_id, None, session.modified_ms, None, None, {}, problem)
    finally:
        os.close(fd)


def _in_range(name: str, value: int | None, problems: list[str]) -> int | None:
    """A count past 2**53, which not every JSON reader keeps exact, is shown null, and says so."""
    if value is None or value <= MAX_COUNT:
        return value
    problems.append(f"{name} {value} is out of range (above 2**53); shown as null")
    return None


def _claude_row(
    session: SessionFile, session_id: str | None, lines: BackwardLines, table: Mapping[str, int]
) -> ScanRow:
    from sidecar.transcripts import read_claude_tail

    tail = read_claude_tail(lines)
    usage, latest = tail.usage, tail.latest_compaction
    model = None if usage is None else usage.model
    window = None if model is None else table.get(model)
    problems: list[str] = []
    used = _in_range("usedTokens", None if usage is None else usage.used_tokens, problems)
    fields = ContextFields(
        harness="claude",
        used_tokens=used,
        window_tokens=window,
        # st2 computes this one: the transcript carries no percent (windowSource says whence the window).
        used_percent=None if used is None or window is None else used * 100 / window,
        model=model,
        compactions=tail.compactions or 0,
        last_compaction_ms=None if latest is None else latest.at_ms,
        last_compaction_trigger=None if latest is None else latest.trigger,
        observed_at_ms=session.modified_ms if usage is None else usage.observed_at_ms,
    )
    pre, post = (None, None) if latest is None else (latest.pre_tokens, latest.post_tokens)
    extra = {
        "lastCompactionPreTokens": _in_range("lastCompactionPreTokens", pre, problems),
        "lastCompactionPostTokens": _in_range("lastCompactionPostTokens", post, problems),
        # The decision record's /compact edge: the value stays stale until the next assistant message.
        "compactedSinceReading": bool(latest and usage and latest.offset > usage.offset),
    }
    source: WindowSource | None = "model-table" if window is not None else None
    return ScanRow(fields, session.path, session_id, source, session.modified_ms, model, tail.compactions, extra,
                   "; ".join(problems) or None)  # fmt: skip


def _codex_row(session: SessionFile, session_id: str | None, lines: BackwardLines) -> ScanRow:
    from sidecar.decoding import Dropped
    from sidecar.harnesses.codex.events import RateLimitsUpdated, TokenUsage
    from sidecar.harnesses.codex.producer import merged_rate_limits, usage_fields
    from sidecar.transcripts import read_codex_tail, session_build

    thread = session_id or "rollout"
    tail = read_codex_tail(lines, thread)
    problems: list[str] = []
    usage = None if tail.usage is None else tail.usage.usage
    limits = None if tail.rate_limits is None else tail.rate_limits.rate_limits
    for refused in (limits, usage):
        if isinstance(refused, Dropped):  # e.g. a count out of range: no reading, and the row says why
            problems.append(f"token_count refused: {refused.reason}")
    reading = ContextFields(harness="codex", observed_at_ms=session.modified_ms)
    if isinstance(usage, TokenUsage) and tail.usage is not None:
        # The producer's own arithmetic on the latest usage, with the rate limits held before it.
        held = merged_rate_limits((None, None), limits) if isinstance(limits, RateLimitsUpdated) else (None, None)
        build = None if tail.session is None else session_build(tail.session)
        at_ms = session.modified_ms if tail.usage.at_ms is None else tail.usage.at_ms
        reading = usage_fields(usage, at_ms, held_limits=held, version=None if build is None else build.version)
    compactions = tail.compactions
    reading = reading.model_copy(
        update={
            "compactions": compactions or 0,
            "last_compaction_ms": tail.latest_compaction_ms,
            # A rollout's compaction line names no trigger.
            "last_compaction_trigger": "unknown" if tail.latest_compaction_ms is not None else None,
        }
    )
    source: WindowSource | None = "transcript" if reading.window_tokens is not None else None
    if tail.session is not None and session_id is None:
        session_id = tail.session.id
    return ScanRow(reading, session.path, session_id, source, session.modified_ms, tail.model, compactions, {},
                   "; ".join(problems) or None)  # fmt: skip


def scan(environ: Mapping[str, str], since_ms: int, now: int, warnings: list[str]) -> list[ScanRow]:
    table = model_table(environ, warnings)
    rows = [read_session(session, table) for session in find_sessions(environ, since_ms, now)]
    rows.sort(key=lambda row: row.modified_ms, reverse=True)
    warnings.extend(f"{row.path}: {row.problem}" for row in rows if row.problem)
    return rows


# ---------------------------------------------------------------------------------------------
# The command


def render_rows(rows: list[ScanRow], now: int, *, colour: bool) -> str:
    from guard.catalog import printable
    from wrapper.render import age_text, fill_tint, meter_text, percent_text, table

    if not rows:
        return "no sessions\n"
    header = ["HARNESS", "SESSION", "MODEL", "CONTEXT", "TOKENS", "SOURCE", "COMPACTIONS", "AGE", "PATH"]
    body = []
    for row in rows:
        wire = row.wire(now)
        percent = wire["usedPercent"]
        context = "-" if wire["usedTokens"] is None else "?" if percent is None else percent_text(percent)
        compactions = "?" if wire["compactions"] is None else str(wire["compactions"])
        if wire.get("compactedSinceReading"):
            compactions += " (since reading)"
        body.append([
            (wire["harness"] or row.path.suffix, None),
            (printable((row.session_id or "-")[:8]), None),
            (printable(row.model or "-"), None),
            (context, None),
            (meter_text(wire), fill_tint(wire)),
            (row.window_source or "-", None),
            (compactions, None),
            ("-" if wire["ageMs"] is None else age_text(wire["ageMs"]), None),
            (printable(str(row.path)) + (f"  ({printable(row.problem)})" if row.problem else ""), None),
        ])  # fmt: skip
    return table(body, header, colour)


def run_scan(args: argparse.Namespace) -> int:
    from guard.catalog import printable
    from wrapper.render import colour_enabled, render_json_array

    now = time.time_ns() // 1_000_000
    warnings: list[str] = []
    rows = scan(os.environ, args.since, now, warnings)
    for warning in warnings:
        print(f"hctx scan: {printable(warning)}", file=sys.stderr)
    if args.json:
        sys.stdout.write(render_json_array([row.wire(now) for row in rows]))
    else:
        sys.stdout.write(render_rows(rows, now, colour=colour_enabled(sys.stdout)))
    return 0


def add_scan_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    scan_parser = commands.add_parser(
        "scan",
        help="occupancy of recent Claude and Codex sessions read from their transcripts (no wrapping)",
        description="Every Claude session under $CLAUDE_CONFIG_DIR/projects (default ~/.claude) and Codex "
        "rollout under $CODEX_HOME/sessions (default ~/.codex) modified within --since, read from the end "
        "of the file. Claude windows come from a model table (shipped, extended by "
        "$XDG_CONFIG_HOME/hctx/models.json); an unknown model shows no window and no percent.",
    )
    scan_parser.add_argument(
        "--json", action="store_true", help="one JSON array, an object per session, newest first (jq '.[]')"
    )
    scan_parser.add_argument(
        "--since",
        type=parse_duration,
        default=parse_duration(DEFAULT_SINCE),
        metavar="DURATION",
        help=f"only sessions modified within this long (e.g. 30m, 2h, 7d; default {DEFAULT_SINCE})",
    )
    scan_parser.set_defaults(run=run_scan)
