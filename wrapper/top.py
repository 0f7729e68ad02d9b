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
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from guard.catalog import list_agents
from guard.constants import AGENTS_DIR_NAME, CONTEXT_RECORD_NAME, STATE_RECORD_NAME
from guard.errors import CatalogError
from wrapper.accounts import fan_in, groups_by_agent
from wrapper.render import (
    AMBER_PERCENT,
    RED_PERCENT,
    Tint,
    age_text,
    colour_enabled,
    cost_text,
    counted,
    fill_tint,
    headroom_text,
    limits_text,
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
    "ORDERS",
    "POLL_S",
    "REFRESH_S",
    "RIGHT_ALIGNED",
    "SORT_KEYS",
    "Screen",
    "Segment",
    "SortKey",
    "View",
    "age_order",
    "bar",
    "decode_keys",
    "fill_order",
    "has_terminal",
    "live",
    "name_order",
    "render_frame",
    "run",
    "signature",
    "summary",
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


def age_order(row: AgentRow) -> tuple[int, int, str, str]:
    """Freshest reading first; rows with no reading last."""
    if row.context is None:
        return (1, 0, row.host, row.identity)
    return (0, row.context["ageMs"], row.host, row.identity)


def name_order(row: AgentRow) -> tuple[str, str]:
    return (row.host, row.identity)


SortKey = Literal["fill", "age", "name"]
SORT_KEYS: tuple[SortKey, ...] = ("fill", "age", "name")
ORDERS: dict[SortKey, Callable[[AgentRow], Any]] = {"fill": fill_order, "age": age_order, "name": name_order}


@dataclass(slots=True)
class View:
    """What the person at the live view chose: the order, the filter, how far down they scrolled.

    Keys: arrows, j/k, PgUp/PgDn, Home/End (g/G) scroll; s cycles the order, f, a and n pick fill,
    age or name; / starts a filter (typed live, Enter keeps it, Esc clears it); q quits."""

    sort: SortKey = "fill"
    filter: str = ""
    editing: bool = False  # typing the filter after `/`
    offset: int = 0  # the first row shown; the frame clamps it to what there is
    page: int = 1  # rows the last frame had room for: what PgUp/PgDn move by

    def shows(self, row: AgentRow) -> bool:
        """The filter is a substring of the row's host, harness or name, in any case."""
        needle = self.filter.casefold()
        harness = row.harness or (row.context or {}).get("harness") or ""
        return not needle or any(needle in text.casefold() for text in (row.host, harness, row.identity))

    def rows(self, rows: Iterable[AgentRow]) -> list[AgentRow]:
        return sorted((row for row in rows if self.shows(row)), key=ORDERS[self.sort])

    def press(self, key: str) -> bool:
        """Apply one key (a name from `decode_keys`); True when it quits."""
        if self.editing:
            if key == "enter":
                self.editing = False
            elif key == "esc":
                self.editing, self.filter = False, ""
            elif key == "backspace":
                self.filter = self.filter[:-1]
            elif len(key) == 1 and key.isprintable():
                self.filter += key
            self.offset = 0
            return False
        steps = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -self.page, "pgdn": self.page,
                 "home": -sys.maxsize, "g": -sys.maxsize, "end": sys.maxsize, "G": sys.maxsize}  # fmt: skip
        picked: dict[str, SortKey] = {"f": "fill", "a": "age", "n": "name"}
        if key in ("q", "Q"):
            return True
        if key in steps:
            self.offset = max(0, min(sys.maxsize, self.offset + steps[key]))
        elif key == "s":
            self.sort, self.offset = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)], 0
        elif key in picked:
            self.sort, self.offset = picked[key], 0
        elif key == "/":
            self.editing = True
        elif key == "esc":
            self.filter, self.offset = "", 0
        return False

    def help(self, shown: int, total: int) -> str:
        if self.editing:
            return f"filter: {self.filter}▏ · {shown} of {total} · Enter keeps it, Esc clears it"
        words = ["q quits", "↑↓ jk PgUp PgDn Home End", f"s sort: {self.sort}"]
        words.append(f"filter {self.filter!r}: {shown} of {total} · Esc clears" if self.filter else "/ filter")
        return " · ".join(words)


_KEY_SEQUENCES = {
    b"\x1b[A": "up", b"\x1bOA": "up", b"\x1b[B": "down", b"\x1bOB": "down",
    b"\x1b[5~": "pgup", b"\x1b[6~": "pgdn",
    b"\x1b[H": "home", b"\x1bOH": "home", b"\x1b[1~": "home", b"\x1b[7~": "home",
    b"\x1b[F": "end", b"\x1bOF": "end", b"\x1b[4~": "end", b"\x1b[8~": "end",
}  # fmt: skip
_KEY_CHARACTERS = {"\r": "enter", "\n": "enter", "\x7f": "backspace", "\x08": "backspace"}


def decode_keys(data: bytes) -> list[str]:
    """Key names from what a terminal sent: `up`, `pgdn`, `home`, `enter`, `esc`, ... or the
    character typed. An escape sequence it does not know is skipped whole, never typed."""
    keys: list[str] = []
    index = 0
    while index < len(data):
        if data[index] != 0x1B:
            end = data.find(b"\x1b", index)
            end = len(data) if end < 0 else end
            for char in data[index:end].decode(errors="ignore"):
                if char in _KEY_CHARACTERS:
                    keys.append(_KEY_CHARACTERS[char])
                elif char.isprintable():
                    keys.append(char)
            index = end
            continue
        known = next((seq for seq in _KEY_SEQUENCES if data.startswith(seq, index)), None)
        if known is not None:
            keys.append(_KEY_SEQUENCES[known])
            index += len(known)
        elif data[index + 1 : index + 2] in (b"[", b"O"):  # CSI or SS3: up to its final byte
            final = next((i for i in range(index + 2, len(data)) if 0x40 <= data[i] <= 0x7E), len(data) - 1)
            index = final + 1
        else:
            keys.append("esc")
            index += 1
    return keys


def summary(rows: list[AgentRow]) -> str:
    """Agents per host, how many at or above the amber and the red fill, how many stale."""
    hosts = Counter(row.host for row in rows)
    contexts = [row.context for row in rows if row.context is not None]
    percents = [context["usedPercent"] for context in contexts if context["usedPercent"] is not None]
    per_host = "hosts: " + ", ".join(f"{host} {count}" for host, count in sorted(hosts.items()))
    amber = sum(percent >= AMBER_PERCENT for percent in percents)
    red = sum(percent >= RED_PERCENT for percent in percents)
    stale = sum(bool(context["stale"]) for context in contexts)
    return f"{per_host} · {amber} at or above {AMBER_PERCENT}% · {red} at or above {RED_PERCENT}% · {stale} stale"


def bar(context: dict[str, Any] | None, cells: int = BAR_CELLS) -> str:
    """The fill bar, clamped to its cells for layout only; the percent beside it is the raw value."""
    if context is None or context["usedPercent"] is None:
        return " " * cells
    share = min(max(context["usedPercent"], 0.0), 100.0) / 100.0
    filled = int(share * cells + 0.5)
    return "█" * filled + "░" * (cells - filled)


COLUMNS = ("AGENT", "HARNESS", "FILL", "PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳", "AGE", "COST", "LIMITS")
RIGHT_ALIGNED = frozenset({"PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳"})  # numbers
# On a terminal too narrow for the table the bar narrows first, down to BAR_MIN_CELLS; then columns
# are hidden in this order, and the frame says which. AGENT and PCT are always shown. LIMITS (the
# account's rate limits, `wrapper.render.limits_text`) is left out unasked when no agent has any.
HIDE_ORDER = ("LIMITS", "HARNESS", "WINDOW", "HEADROOM", "FILL", "TOKENS", "COST", "⟳", "AGE")


def _cells(row: AgentRow, limits: Segment, bar_cells: int = BAR_CELLS) -> list[Segment]:
    context = row.context
    tint = fill_tint(context)
    if context is None:
        return [(row.name, None), (row.harness or "-", None), (bar(None, bar_cells), None), ("-", None),
                ("", None), ("", None), ("", None), ("", None), ("", None), ("", None), limits]  # fmt: skip
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
        limits,
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


def _layout(
    rows: list[AgentRow], width: int | None, now: int, fleet: list[AgentRow]
) -> tuple[list[list[Segment]], list[int], list[int], bool]:
    """The table (header first), its column widths, the indexes of the columns shown in `width`, and
    whether any agent has an account figure (LIMITS is no column of a fleet with none). The
    accounts are fanned in from the whole `fleet`, not only the rows in view."""
    header: list[Segment] = [(name, None) for name in COLUMNS]
    groups = groups_by_agent(fan_in(fleet))
    limits = [limits_text(groups.get(row.name), row, now) for row in rows]
    table = [header, *(_cells(row, limit) for row, limit in zip(rows, limits, strict=True))]
    widths = _widths(table)
    with_limits = any(text != "-" for text, _ in limits)
    shown = list(range(len(COLUMNS) - (0 if with_limits else 1)))
    if width is None or _span(widths, shown) <= width:
        return table, widths, shown, with_limits
    bar_cells = max(BAR_MIN_CELLS, BAR_CELLS - (_span(widths, shown) - width))
    table = [header, *(_cells(row, limit, bar_cells) for row, limit in zip(rows, limits, strict=True))]
    widths = _widths(table)
    for name in HIDE_ORDER:
        if _span(widths, shown) <= width:
            break
        if COLUMNS.index(name) in shown:
            shown.remove(COLUMNS.index(name))
    return table, widths, shown, with_limits


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
    view: View | None = None,
) -> list[str]:
    """The screen's lines (no trailing newline on any); `height` bounds them, `width` cuts them.
    Only the `interactive` view says its keys and where its scrolled rows are; it clamps the
    `view`'s offset to the rows there are, and keeps the room it had as the view's page."""
    view = View() if view is None else view
    clock = time.strftime("%H:%M:%S", time.localtime(now / 1000))
    fleet = [] if roster is None else roster.rows
    rows = view.rows(fleet)
    title = f"hctx top · {counted(len(fleet), 'agent')} · {catalog} · {clock}"
    table, widths, shown, with_limits = _layout(rows, width, now, fleet)
    notes = [view.help(len(rows), len(fleet))] if interactive else []
    offered = COLUMNS if with_limits else COLUMNS[:-1]
    if problem is None and len(shown) < len(offered):
        hidden_columns = [name for index, name in enumerate(offered) if index not in shown]
        columns = counted(len(hidden_columns), "column")
        notes.append(f"+{columns} hidden, widen the terminal: {', '.join(hidden_columns)}")
    heading = [title, " · ".join(notes), summary(fleet) if fleet and problem is None else ""]
    lines = [_fit([(text, None)], width, False) for text in heading if text]
    lines.append("")
    if problem is not None:
        lines.append(_fit([(f"cannot read the catalog: {problem}", "red")], width, colour))
        return lines if height is None else lines[:height]

    header, *body = [_row_line(cells, widths, shown, width, colour) for cells in table]
    refused = 0 if roster is None else len(roster.all_warnings())
    footer = [f"{counted(refused, 'warning')}: `hctx agents` names them"] if refused else []
    if height is not None:
        room = max(1, height - len(lines) - 1 - len(footer))
        if len(body) > room:
            room = max(1, room - 1)  # one line says where the rows shown are
            view.offset = min(view.offset, len(body) - room) if interactive else 0
            last = view.offset + room
            footer.insert(0, f"rows {view.offset + 1}–{last} of {len(body)}" if interactive
                          else f"… {len(body) - room} more")  # fmt: skip
            body = body[view.offset : last]
        else:
            view.offset = 0
        view.page = room
    lines.append(header)
    lines.extend(body)
    lines.extend(_fit([(line, None)], width, False) for line in footer)
    return lines


def _row_line(cells: list[Segment], widths: list[int], shown: list[int], width: int | None, colour: bool) -> str:
    segments: list[Segment] = []
    for index in shown:
        (text, tint), column_width = cells[index], widths[index]
        pad = " " * (column_width - len(text))
        if segments:
            segments.append(("  ", None))
        right = COLUMNS[index] in RIGHT_ALIGNED
        segments.extend([(pad, None), (text, tint)] if right else [(text, tint), (pad, None)])
    return _fit(segments, width, colour)


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
    view: View

    def frame(self, width: int | None, height: int | None) -> list[str]:
        now = now_ms()
        try:
            roster = collect_roster(self.catalog, now, here=self.here)
        except CatalogError as exc:
            return render_frame(None, now, catalog=self.catalog, width=width, height=height,
                                colour=self.colour, problem=str(exc), interactive=True)  # fmt: skip
        return render_frame(roster, now, catalog=self.catalog, width=width, height=height, colour=self.colour,
                            interactive=True, view=self.view)  # fmt: skip


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


def _read_keys(fd: int, timeout: float) -> bytes | None:
    """What the terminal sent within `timeout`: None for nothing, b"" once stdin is closed."""
    readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
    return os.read(fd, 256) if readable else None


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
        data = _read_keys(fd, min(poll, next_refresh - time.monotonic()))
        if data is None:
            continue
        if not data or any(screen.view.press(key) for key in decode_keys(data)):
            return  # closed stdin, q, or Ctrl-C as a byte (a terminal without ISIG)
        next_refresh = 0.0  # a key's effect shows at once


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
    screen = Screen(catalog, here, colour_enabled(sys.stdout), View())
    try:
        with _terminal(fd):
            live(screen, fd)
    except (KeyboardInterrupt, _Quit):
        pass
    return 0
