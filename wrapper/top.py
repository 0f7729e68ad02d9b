"""`hctx top`: every agent's fill, full-screen, live.

Plain ANSI on the alternate screen: no curses, no dependency. The catalog is re-read every second
for the ages, and its files' stat signature is polled five times a second so a changed record shows
within a second. `q`, Ctrl-C, SIGTERM/SIGHUP or EOF on stdin quit and restore the terminal.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from guard.catalog import list_agents
from guard.constants import AGENTS_DIR_NAME, CONTEXT_RECORD_NAME, STATE_RECORD_NAME
from guard.errors import CatalogError
from wrapper.render import (
    Tint,
    age_text,
    colour_enabled,
    cost_text,
    counted,
    fill_tint,
    headroom_text,
    paint,
    percent_text,
    tokens_text,
)
from wrapper.roster import AgentRow, Roster, collect_roster, now_ms

__all__ = [
    "BAR_CELLS",
    "BAR_MIN_CELLS",
    "COLUMNS",
    "HIDE_ORDER",
    "POLL_S",
    "REFRESH_S",
    "RIGHT_ALIGNED",
    "Screen",
    "Segment",
    "bar",
    "fill_order",
    "has_terminal",
    "live",
    "render_frame",
    "run",
    "signature",
]

REFRESH_S = 1.0
POLL_S = 0.2
BAR_CELLS = 20
BAR_MIN_CELLS = 8

Segment = tuple[str, Tint]


def fill_order(row: AgentRow) -> tuple[int, float, str, str]:
    """Fullest first; rows whose percent is withheld next; rows with no reading last."""
    context = row.context
    if context is None:
        return (2, 0.0, row.host, row.identity)
    percent = context["usedPercent"]
    if percent is None:
        return (1, 0.0, row.host, row.identity)
    return (0, -percent, row.host, row.identity)


def bar(context: dict[str, Any] | None, cells: int = BAR_CELLS) -> str:
    """The fill bar, clamped to its cells for layout only; the percent beside it is the raw value."""
    if context is None or context["usedPercent"] is None:
        return " " * cells
    share = min(max(context["usedPercent"], 0.0), 100.0) / 100.0
    filled = int(share * cells + 0.5)
    return "█" * filled + "░" * (cells - filled)


COLUMNS = ("AGENT", "HARNESS", "FILL", "PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳", "AGE", "COST")
RIGHT_ALIGNED = frozenset({"PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳"})  # numbers
# On a terminal too narrow for the table the bar narrows first, down to BAR_MIN_CELLS; then columns
# are hidden in this order, and the frame says which. AGENT and PCT are always shown.
HIDE_ORDER = ("HARNESS", "WINDOW", "HEADROOM", "FILL", "TOKENS", "COST", "⟳", "AGE")


def _cells(row: AgentRow, bar_cells: int = BAR_CELLS) -> list[Segment]:
    context = row.context
    tint = fill_tint(context)
    if context is None:
        return [(row.name, None), (row.harness or "-", None), (bar(None, bar_cells), None), ("-", None),
                ("", None), ("", None), ("", None), ("", None), ("", None), ("", None)]  # fmt: skip
    percent = context["usedPercent"]
    age = age_text(context["ageMs"]) + (" stale" if context["stale"] else "")
    return [
        (row.name, None),
        (context["harness"], None),
        (bar(context, bar_cells), tint),
        ("?" if percent is None else percent_text(percent), tint),
        (tokens_text(context["usedTokens"]), None),
        (tokens_text(context["windowTokens"]), None),
        (headroom_text(context), None),
        (str(context["compactions"]), None),
        (age, None),
        (cost_text(context["costUsd"]), None),
    ]


def _fit(segments: list[Segment], width: int | None, colour: bool) -> str:
    """Join segments, cut to `width` terminal cells, paint what survives."""
    out = []
    room = width
    for text, tint in segments:
        if room is not None:
            if room <= 0:
                break
            text = text[:room]
            room -= len(text)
        out.append(paint(text, tint, colour))
    return "".join(out).rstrip()


def _widths(table: list[list[Segment]]) -> list[int]:
    return [max(len(cells[index][0]) for cells in table) for index in range(len(COLUMNS))]


def _span(widths: list[int], shown: list[int]) -> int:
    """Terminal cells the shown columns take, two spaces apart."""
    return sum(widths[index] for index in shown) + 2 * (len(shown) - 1)


def _layout(rows: list[AgentRow], width: int | None) -> tuple[list[list[Segment]], list[int], list[int]]:
    """The table (header first), its column widths, and the indexes of the columns shown in `width`."""
    header: list[Segment] = [(name, None) for name in COLUMNS]
    table = [header, *(_cells(row) for row in rows)]
    widths = _widths(table)
    shown = list(range(len(COLUMNS)))
    if width is None or _span(widths, shown) <= width:
        return table, widths, shown
    bar_cells = max(BAR_MIN_CELLS, BAR_CELLS - (_span(widths, shown) - width))
    table = [header, *(_cells(row, bar_cells) for row in rows)]
    widths = _widths(table)
    for name in HIDE_ORDER:
        if _span(widths, shown) <= width:
            break
        shown.remove(COLUMNS.index(name))
    return table, widths, shown


def render_frame(
    roster: Roster | None,
    now: int,
    *,
    catalog: Path,
    width: int | None,
    height: int | None,
    colour: bool,
    problem: str | None = None,
    interactive: bool = False,
) -> list[str]:
    """The screen's lines (no trailing newline on any); `height` bounds them, `width` cuts them.
    Only the `interactive` view says how to quit it."""
    clock = time.strftime("%H:%M:%S", time.localtime(now / 1000))
    rows = [] if roster is None else sorted(roster.rows, key=fill_order)
    title = f"hctx top · {counted(len(rows), 'agent')} · {catalog} · {clock}"
    table, widths, shown = _layout(rows, width)
    notes = ["q quits"] if interactive else []
    if problem is None and len(shown) < len(COLUMNS):
        hidden_columns = [name for index, name in enumerate(COLUMNS) if index not in shown]
        columns = counted(len(hidden_columns), "column")
        notes.append(f"+{columns} hidden, widen the terminal: {', '.join(hidden_columns)}")
    lines = [_fit([(text, None)], width, False) for text in (title, " · ".join(notes)) if text]
    lines.append("")
    if problem is not None:
        lines.append(_fit([(f"cannot read the catalog: {problem}", "red")], width, colour))
        return lines if height is None else lines[:height]

    body = []
    for cells in table:
        segments: list[Segment] = []
        for index in shown:
            (text, tint), column_width = cells[index], widths[index]
            pad = " " * (column_width - len(text))
            if segments:
                segments.append(("  ", None))
            right = COLUMNS[index] in RIGHT_ALIGNED
            segments.extend([(pad, None), (text, tint)] if right else [(text, tint), (pad, None)])
        body.append(_fit(segments, width, colour))

    refused = 0 if roster is None else len(roster.all_warnings())
    footer = [f"{counted(refused, 'warning')}: `hctx agents` names them"] if refused else []
    if height is not None:
        room = max(1, height - len(lines) - len(footer))
        if len(body) > room:
            hidden = len(body) - (room - 1)
            body = [*body[: room - 1], _fit([(f"… {hidden} more", None)], width, False)]
    lines.extend(body)
    lines.extend(_fit([(line, None)], width, False) for line in footer)
    return lines


def signature(catalog: Path) -> tuple[object, ...]:
    """Cheap fingerprint of every record and claim: it moves when any of them is replaced."""
    marks: list[object] = []
    try:
        agents, _ = list_agents(catalog)
    except CatalogError as exc:
        return (str(exc),)
    for host, identity in agents:
        base = catalog / AGENTS_DIR_NAME / host / identity
        for name in (CONTEXT_RECORD_NAME, STATE_RECORD_NAME):
            try:
                info = os.stat(base / name, follow_symlinks=False)
            except OSError:
                marks.append(None)
                continue
            marks.append((info.st_ino, info.st_mtime_ns, info.st_size))
        marks.append((host, identity))
    return tuple(marks)


@dataclass(slots=True)
class Screen:
    catalog: Path
    here: str
    colour: bool

    def frame(self, width: int | None, height: int | None) -> list[str]:
        now = now_ms()
        try:
            roster = collect_roster(self.catalog, now, here=self.here)
        except CatalogError as exc:
            return render_frame(None, now, catalog=self.catalog, width=width, height=height,
                                colour=self.colour, problem=str(exc), interactive=True)  # fmt: skip
        return render_frame(roster, now, catalog=self.catalog, width=width, height=height, colour=self.colour,
                            interactive=True)  # fmt: skip


def _once_width() -> int | None:
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


class _Quit(Exception):
    pass


def _raise_quit(signum: int, frame: FrameType | None) -> None:
    raise _Quit


@contextmanager
def _terminal(fd: int) -> Iterator[None]:
    """Alternate screen, hidden cursor, no echo, key-at-a-time; all undone however the view ends."""
    saved = termios.tcgetattr(fd)
    handlers = {sig: signal.signal(sig, _raise_quit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        tty.setcbreak(fd)  # keeps ISIG, so Ctrl-C still arrives as SIGINT
        sys.stdout.write("\x1b[?1049h\x1b[?25l\x1b[2J")
        sys.stdout.flush()
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        # A terminal that hung up takes neither output nor modes: the view ends all the same.
        with suppress(OSError, termios.error):
            sys.stdout.write("\x1b[0m\x1b[?25h\x1b[?1049l")
            sys.stdout.flush()
        with suppress(OSError, termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_requested(fd: int, timeout: float) -> bool:
    readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
    if not readable:
        return False
    keys = os.read(fd, 64)
    return not keys or any(key in keys for key in (b"q", b"Q", b"\x03"))


def _draw(lines: list[str]) -> None:
    sys.stdout.write("\x1b[H" + "\x1b[K\n".join(lines) + "\x1b[K\x1b[J")
    sys.stdout.flush()


def live(screen: Screen, fd: int) -> None:
    last_frame: list[str] | None = None
    last_size: os.terminal_size | None = None
    last_mark: tuple[object, ...] | None = None
    next_refresh = 0.0
    while True:
        size = shutil.get_terminal_size()
        started = time.monotonic()
        mark = signature(screen.catalog)
        clock = time.monotonic()
        # On a huge catalog the stat sweep itself is costly: poll less often, at most a quarter busy.
        poll = min(max(POLL_S, 4 * (clock - started)), REFRESH_S)
        if clock >= next_refresh or mark != last_mark or size != last_size:
            frame = screen.frame(size.columns, size.lines)
            if frame != last_frame or size != last_size:
                _draw(frame)
            last_frame, last_size, last_mark = frame, size, mark
            next_refresh = clock + REFRESH_S
        if _quit_requested(fd, min(poll, next_refresh - time.monotonic())):
            return


def has_terminal() -> bool:
    """What the live view needs: keys from a terminal on stdin, frames to one on stdout."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def run(catalog: Path, *, here: str, once: bool) -> int:
    if once:
        now = now_ms()
        try:
            roster = collect_roster(catalog, now, here=here)
        except CatalogError as exc:  # as `hctx agents`: an unreadable catalog is a failure
            print(f"hctx top: {exc}", file=sys.stderr)
            return 2
        lines = render_frame(roster, now, catalog=catalog, width=_once_width(), height=None,
                             colour=colour_enabled(sys.stdout))  # fmt: skip
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    if not has_terminal():
        print("hctx top: needs a terminal on stdin and stdout (use --once for one frame)", file=sys.stderr)
        return 2
    fd = sys.stdin.fileno()
    screen = Screen(catalog, here, colour_enabled(sys.stdout))
    try:
        with _terminal(fd):
            live(screen, fd)
    except (KeyboardInterrupt, _Quit):
        pass
    return 0
