"""`hctx scan`: the occupancy of recent sessions nobody wrapped, read from the harnesses' transcripts.

No catalog and no sidecar: every transcript of a harness whose spec names a transcript reader
(`HarnessSpec.transcripts`, found through `sidecar.registry`) modified within `--since` is read from
its end, and reported as the decision record reads it (../shared/spec/001). Where a harness keeps
its transcripts and how one reads (the window's source, the columns only it has) is its reader's.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from guard.errors import Unavailable
from guard.record import ContextFields, Harness

if TYPE_CHECKING:  # the registry loads only when `hctx scan` runs, not for every command
    from sidecar.registry import WindowSource

__all__ = [
    "DEFAULT_SINCE",
    "ScanRow",
    "SessionFile",
    "TranscriptError",
    "find_sessions",
    "parse_duration",
    "read_session",
    "register",
    "render_rows",
    "run_scan",
    "scan",
]


class TranscriptError(Unavailable):
    """A transcript `hctx scan` reads cannot be opened."""


DEFAULT_SINCE: Final = "24h"
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SESSION_ID: Final = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$")
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `2h`, `7d`, `1w`, or combined (`1h30m`), in milliseconds."""
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is negative: how far back, like 30m, 2h or 7d")
    parts = _DURATION.findall(text)
    if not parts or "".join(value + unit for value, unit in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30m, 2h or 7d")
    return round(sum(float(value) * _UNIT_S[unit] for value, unit in parts) * 1000)


# ---------------------------------------------------------------------------------------------
# Finding sessions


@dataclass(frozen=True)
class SessionFile:
    harness: Harness
    path: Path
    modified_ms: int


def _regular_mtime_ms(path: Path) -> int | None:
    try:
        info = path.lstat()
    except OSError:
        return None
    # A file dated before 1970 reads as 1970: an instant in a reading is never negative.
    return max(0, info.st_mtime_ns // 1_000_000) if stat.S_ISREG(info.st_mode) else None


def find_sessions(environ: Mapping[str, str], since_ms: int, now: int) -> Iterator[SessionFile]:
    """Every harness's transcripts (its reader's `files`) modified at or after `now - since_ms`."""
    from sidecar.registry import transcript_readers

    oldest = now - since_ms
    for harness, reader in transcript_readers().items():
        for path in reader.files(environ):
            modified = _regular_mtime_ms(path)
            if modified is not None and modified >= oldest:
                yield SessionFile(harness, path, modified)


# ---------------------------------------------------------------------------------------------
# Reading one session


# A session nothing could be read from: every number null (its harness is said as null too).
_NOTHING_READ = ContextFields(harness="unknown", observed_at_ms=0)


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

    def observed_ms(self) -> int | None:
        """When the reading was observed; None when it holds no count (nothing was read)."""
        fields = self.fields
        return None if fields is None or fields.used_tokens is None else fields.observed_at_ms

    def wire(self, now: int) -> dict[str, Any]:
        got = self.fields or _NOTHING_READ
        observed = self.observed_ms()
        return {
            "harness": None if self.fields is None else got.harness,
            "sessionId": self.session_id,
            "usedTokens": got.used_tokens,
            "windowTokens": got.window_tokens,
            "usedPercent": got.used_percent,
            "windowSource": self.window_source,
            "model": self.model,
            "sessionTotalTokens": got.session_total_tokens,
            "rateLimits": None if got.rate_limits is None else got.rate_limits.model_dump(mode="json", by_alias=True),
            "compactions": self.compactions,
            "lastCompactionMs": got.last_compaction_ms,
            "lastCompactionTrigger": got.last_compaction_trigger,
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
            raise TranscriptError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _session_id(path: Path) -> str | None:
    match = _SESSION_ID.search(path.name)
    return match.group(1) if match else None


def read_session(session: SessionFile, table: Mapping[str, int]) -> ScanRow:
    from sidecar.registry import TranscriptFile, transcript_readers

    session_id = _session_id(session.path)
    try:
        fd, size = _open_tail(session.path)
    except OSError as exc:
        problem = exc.strerror or str(exc)
        return ScanRow(None, session.path, session_id, None, session.modified_ms, None, None, {}, problem)
    try:
        reader = transcript_readers()[session.harness]
        file = TranscriptFile(session.path, session_id, session.modified_ms)
        got = reader.read(file, lambda offset, length: os.pread(fd, length, offset), size, table)
    except OSError as exc:
        problem = exc.strerror or str(exc)
        return ScanRow(None, session.path, session_id, None, session.modified_ms, None, None, {}, problem)
    finally:
        os.close(fd)
    return ScanRow(got.fields, session.path, got.session_id, got.window_source, session.modified_ms, got.model,
                   got.compactions, dict(got.extra), "; ".join(got.problems) or None)  # fmt: skip


def scan(environ: Mapping[str, str], since_ms: int, now: int, warnings: list[str]) -> list[ScanRow]:
    from sidecar.registry import model_table, transcript_readers

    # Each harness's own model -> window table (its spec's; Claude's alone has one), read once.
    tables = {harness: model_table(harness, environ, warnings) for harness in transcript_readers()}
    rows = [read_session(session, tables[session.harness]) for session in find_sessions(environ, since_ms, now)]
    rows.sort(key=lambda row: row.modified_ms, reverse=True)
    warnings.extend(f"{row.path}: {row.problem}" for row in rows if row.problem)
    return rows


# ---------------------------------------------------------------------------------------------
# The command


def render_rows(rows: list[ScanRow], now: int, *, colour: bool) -> str:
    from guard.catalog import printable
    from wrapper.readers.render import age_text, fill_tint, meter_text, percent_text, table

    if not rows:
        return "no sessions\n"
    header = ["HARNESS", "SESSION", "MODEL", "CONTEXT", "TOKENS", "SOURCE", "COMPACTIONS", "AGE", "PATH"]
    body = []
    for row in rows:
        fields, observed = row.fields, row.observed_ms()
        percent = None if fields is None else fields.used_percent
        unread = fields is None or fields.used_tokens is None
        context = "-" if unread else "?" if percent is None else percent_text(percent)
        compactions = "?" if row.compactions is None else str(row.compactions)
        if row.extra.get("compactedSinceReading"):
            compactions += " (since reading)"
        body.append([
            ((None if fields is None else fields.harness) or row.path.suffix, None),
            (printable((row.session_id or "-")[:8]), None),
            (printable(row.model or "-"), None),
            (context, None),
            (meter_text(fields), fill_tint(fields)),
            (row.window_source or "-", None),
            (compactions, None),
            ("-" if observed is None else age_text(max(now - observed, 0)), None),
            (printable(str(row.path)) + (f"  ({printable(row.problem)})" if row.problem else ""), None),
        ])  # fmt: skip
    return table(body, header, colour)


def run_scan(args: argparse.Namespace) -> int:
    from guard.catalog import printable
    from wrapper.readers.render import colour_enabled, render_json_array

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


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    scan_parser = commands.add_parser(
        "scan",
        help="occupancy of recent sessions read from the harnesses' own transcripts (no wrapping)",
        description="Every session transcript under the home of each harness whose transcripts hctx reads "
        "(Claude's $CLAUDE_CONFIG_DIR/projects, default ~/.claude; each other's home directory, or the "
        "variable that moves it) modified within --since, read from the end "
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
