"""`hctx top`: every agent's fill, full-screen, live.

Plain ANSI on the alternate screen: no curses. The view runs under trio: keys are read when the
terminal has them (`trio.lowlevel.wait_readable`, the tty left blocking as the shell had it), a
changed record is noticed by `wrapper.readers.notice` (watchfiles) and only its agent read again, the whole
catalog is looked at every `REREAD_S` through a `RosterCache` (a `stat` per unchanged agent), and
every `REFRESH_S` the records held are projected again for the ages, reading nothing. `q`, Ctrl-C,
SIGTERM/SIGHUP or EOF on stdin quit and restore the terminal; SIGWINCH redraws at the new size.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import termios
import time
import tty
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from guard.errors import CatalogError
from guard.projection import SubagentReading
from wrapper.readers.accounts import fan_in, groups_by_agent
from wrapper.readers.render import (
    ADOPTED_MARK,
    AMBER_PERCENT,
    RED_PERCENT,
    Fill,
    Tint,
    age_text,
    cache_text,
    colour_enabled,
    cost_text,
    counted,
    fill_tint,
    headroom_text,
    limits_text,
    paint,
    percent_text,
    subagent_label,
    tokens_text,
)
from wrapper.readers.roster import AgentRow, Roster, RosterCache, collect_roster, now_ms

if TYPE_CHECKING:  # trio and watchfiles load when the live view runs, not with `--once`
    from wrapper.readers.notice import Changes

__all__ = [
    "BAR_CELLS",
    "BAR_MIN_CELLS",
    "COLUMNS",
    "HIDE_ORDER",
    "OPTIONAL",
    "ORDERS",
    "REFRESH_S",
    "REREAD_S",
    "RIGHT_ALIGNED",
    "SORT_KEYS",
    "Screen",
    "Segment",
    "SortKey",
    "Until",
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
    "summary",
]

REFRESH_S = 1.0  # the ages tick
REREAD_S = 5.0  # the whole catalog looked at again, for what a file event missed
BAR_CELLS = 20
BAR_MIN_CELLS = 8

Segment = tuple[str, Tint]


def fill_order(row: AgentRow) -> tuple[int, float, str, str]:
    """Fullest first; rows whose percent is withheld next; rows with no reading last."""
    context = row.context
    if context is None:
        return (2, 0.0, row.host, row.identity)
    percent = context.used_percent
    if percent is None:
        return (1, 0.0, row.host, row.identity)
    return (0, -percent, row.host, row.identity)


def age_order(row: AgentRow) -> tuple[int, int, str, str]:
    """Freshest reading first; rows with no reading last."""
    if row.context is None:
        return (1, 0, row.host, row.identity)
    return (0, row.context.age_ms, row.host, row.identity)


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
        harness = row.named_harness or ""
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
    percents = [context.used_percent for context in contexts if context.used_percent is not None]
    per_host = "hosts: " + ", ".join(f"{host} {count}" for host, count in sorted(hosts.items()))
    amber = sum(percent >= AMBER_PERCENT for percent in percents)
    red = sum(percent >= RED_PERCENT for percent in percents)
    stale = sum(context.stale for context in contexts)
    return f"{per_host} · {amber} at or above {AMBER_PERCENT}% · {red} at or above {RED_PERCENT}% · {stale} stale"


def bar(fill: Fill | None, cells: int = BAR_CELLS) -> str:
    """The fill bar, clamped to its cells for layout only; the percent beside it is the raw value."""
    if fill is None or fill.used_percent is None:
        return " " * cells
    share = min(max(fill.used_percent, 0.0), 100.0) / 100.0
    filled = int(share * cells + 0.5)
    return "█" * filled + "░" * (cells - filled)


COLUMNS = ("AGENT", "HARNESS", "FILL", "PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳", "AGE", "COST", "LIMITS", "CACHE")
RIGHT_ALIGNED = frozenset({"PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳"})  # numbers
# On a terminal too narrow for the table the bar narrows first, down to BAR_MIN_CELLS; then columns
# are hidden in this order, and the frame says which. AGENT and PCT are always shown. LIMITS (the
# account's rate limits, `wrapper.readers.render.limits_text`) and CACHE (the prompt cache, issue 37:
# `agents`' own cell, `wrapper.readers.render.cache_text`) are left out unasked when no agent has any.
OPTIONAL = ("LIMITS", "CACHE")
HIDE_ORDER = ("LIMITS", "CACHE", "HARNESS", "WINDOW", "HEADROOM", "FILL", "TOKENS", "COST", "⟳", "AGE")


def _cells(row: AgentRow, limits: Segment, now: int, bar_cells: int = BAR_CELLS) -> list[Segment]:
    context = row.context
    tint = fill_tint(context)
    name = row.name + (ADOPTED_MARK if row.adopted else "")  # issue 36: started without `hctx wrap`
    if context is None:
        blank: list[Segment] = [("", None)] * 6
        return [(name, None), (row.harness or "-", None), (bar(None, bar_cells), None), ("-", None),
                *blank, limits, ("-", None)]  # fmt: skip
    percent = context.used_percent
    age = age_text(context.age_ms) + (" stale" if context.stale else "")
    return [
        (name, None),
        (context.harness, None),
        (bar(context, bar_cells), tint),
        ("?" if percent is None else percent_text(percent), tint),
        (tokens_text(context.used_tokens), None),
        (tokens_text(context.window_tokens), None),
        (headroom_text(context), None),
        (str(context.compactions), None),
        (age, None),
        (cost_text(context.cost_usd), None),
        limits,
        (cache_text(context, now), None),
    ]


def _subagent_cells(sub: SubagentReading, bar_cells: int = BAR_CELLS) -> list[Segment]:
    """A subagent's row, indented under its agent's (issue 28): its own numbers, never the agent's;
    its state where the harness goes, its compactions where it states them."""
    tint = fill_tint(sub)
    percent = sub.used_percent
    return [
        (f"  {subagent_label(sub)}", None),
        (sub.state, None),
        (bar(sub, bar_cells), tint),
        ("?" if percent is None else percent_text(percent), tint),
        (tokens_text(sub.used_tokens), None),
        (tokens_text(sub.window_tokens), None),
        ("", None),
        ("" if sub.compactions is None else str(sub.compactions), None),
        (age_text(sub.age_ms), None),
        ("", None),
        ("", None),
        ("", None),  # a subagent's cache is its agent's
    ]


def _rows_cells(row: AgentRow, limits: Segment, now: int, bar_cells: int = BAR_CELLS) -> list[list[Segment]]:
    """The agent's row, then each of its subagents' rows."""
    subagents = () if row.context is None else row.context.subagents
    return [_cells(row, limits, now, bar_cells), *(_subagent_cells(sub, bar_cells) for sub in subagents)]


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
) -> tuple[list[list[Segment]], list[int], list[int], list[str]]:
    """The table (header first), its column widths, the indexes of the columns shown in `width`, and
    the columns offered (an OPTIONAL one only where some row in view has a figure for it). The
    accounts are fanned in from the whole `fleet`, not only the rows in view."""
    header: list[Segment] = [(name, None) for name in COLUMNS]
    groups = groups_by_agent(fan_in(fleet))
    limits = [limits_text(groups.get(row.name), row, now) for row in rows]
    table = [header, *(cells for row, limit in zip(rows, limits, strict=True)
                       for cells in _rows_cells(row, limit, now))]  # fmt: skip
    widths = _widths(table)
    stated = {name for name in OPTIONAL
              if any(cells[COLUMNS.index(name)][0] not in ("-", "") for cells in table[1:])}  # fmt: skip
    offered = [name for name in COLUMNS if name not in OPTIONAL or name in stated]
    shown = [COLUMNS.index(name) for name in offered]
    if width is None or _span(widths, shown) <= width:
        return table, widths, shown, offered
    bar_cells = max(BAR_MIN_CELLS, BAR_CELLS - (_span(widths, shown) - width))
    table = [header, *(cells for row, limit in zip(rows, limits, strict=True)
                       for cells in _rows_cells(row, limit, now, bar_cells))]  # fmt: skip
    widths = _widths(table)
    for name in HIDE_ORDER:
        if _span(widths, shown) <= width:
            break
        if COLUMNS.index(name) in shown:
            shown.remove(COLUMNS.index(name))
    return table, widths, shown, offered


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
    table, widths, shown, offered = _layout(rows, width, now, fleet)
    notes = [view.help(len(rows), len(fleet))] if interactive else []
    if problem is None and len(shown) < len(offered):
        hidden_columns = [name for name in offered if COLUMNS.index(name) not in shown]
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


@dataclass(slots=True)
class Screen:
    """The live view's state: what was read (through the cache), what the person chose, the problem
    reading the whole catalog last met (None: none)."""

    catalog: Path
    here: str
    colour: bool
    view: View
    cache: RosterCache = field(init=False)
    problem: str | None = None

    def __post_init__(self) -> None:
        self.cache = RosterCache(self.catalog)

    def read(self, changes: Changes) -> None:
        """Read what `changes` names (every agent that changed, when `whole`); in a worker thread."""
        now = now_ms()
        if not changes.whole:
            self.cache.changed(changes.agents, now, here=self.here)
            return
        try:
            self.cache.views(now, here=self.here)
        except CatalogError as exc:
            self.problem = str(exc)
        else:
            self.problem = None

    def frame(self, width: int | None, height: int | None) -> list[str]:
        now = now_ms()
        if self.problem is not None:
            return render_frame(None, now, catalog=self.catalog, width=width, height=height,
                                colour=self.colour, problem=self.problem, interactive=True)  # fmt: skip
        return render_frame(self.cache.held(now, here=self.here), now, catalog=self.catalog, width=width,
                            height=height, colour=self.colour, interactive=True, view=self.view)  # fmt: skip


def _once_width() -> int | None:
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


@contextmanager
def _terminal(fd: int) -> Iterator[None]:
    """Alternate screen, hidden cursor, no echo, key-at-a-time; all undone however the view ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)  # keeps ISIG, so Ctrl-C still arrives as SIGINT
        sys.stdout.write("\x1b[?1049h\x1b[?25l\x1b[2J")
        sys.stdout.flush()
        yield
    finally:
        # A terminal that hung up takes neither output nor modes: the view ends all the same.
        with suppress(OSError, termios.error):
            sys.stdout.write("\x1b[0m\x1b[?25h\x1b[?1049l")
            sys.stdout.flush()
        with suppress(OSError, termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _draw(lines: list[str]) -> None:
    sys.stdout.write("\x1b[H" + "\x1b[K\n".join(lines) + "\x1b[K\x1b[J")
    sys.stdout.flush()


Until = Callable[[], Awaitable[None]]
_QUITS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def live(screen: Screen, fd: int, until: Until | None = None, shown: list[str] | None = None) -> None:
    """The view until a quit (a key, a signal, EOF on `fd`) or until `until` returns. `shown`: the
    frame already on the screen."""
    import trio

    from wrapper.readers.notice import follow as follow_catalog

    wanted = trio.Event()  # a frame is owed: a key, a read, a tick or a new size
    reading = trio.Lock()  # a read in its worker thread and a frame's projection never overlap

    async def keys(quit: trio.CancelScope) -> None:
        while True:
            await trio.lowlevel.wait_readable(fd)  # the tty stays blocking: stdout shares it
            try:
                data = os.read(fd, 256)
            except OSError:  # the terminal hung up
                data = b""
            if not data or any(screen.view.press(key) for key in decode_keys(data)):
                quit.cancel()  # closed stdin, q, or Ctrl-C as a byte (a terminal without ISIG)
                return
            wanted.set()

    async def signals(quit: trio.CancelScope) -> None:
        with trio.open_signal_receiver(*_QUITS, signal.SIGWINCH) as received:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _QUITS)  # one sent before now arrives here
            async for signum in received:
                if signum != signal.SIGWINCH:
                    quit.cancel()
                    return
                wanted.set()

    async def ticks() -> None:
        while True:
            await trio.sleep(REFRESH_S)
            wanted.set()

    async def follow() -> None:
        # pace_s: at most twenty reads (so frames) a second, however busy the catalog
        await follow_catalog(screen.catalog, lambda changes, _: screen.read(changes), lambda _: wanted.set(),
                             reread_s=REREAD_S, debounce_ms=200, step_ms=20, pace_s=0.05, held=reading)  # fmt: skip

    async def ended(quit: trio.CancelScope) -> None:
        assert until is not None
        await until()
        quit.cancel()

    last_frame: list[str] | None = shown
    last_size: os.terminal_size | None = None if shown is None else shutil.get_terminal_size()
    async with trio.open_nursery() as nursery:
        for task in (keys, signals) + ((ended,) if until is not None else ()):
            nursery.start_soon(task, nursery.cancel_scope)
        nursery.start_soon(ticks)
        nursery.start_soon(follow)
        while True:
            await wanted.wait()
            wanted = trio.Event()
            async with reading:
                size = shutil.get_terminal_size()
                frame = screen.frame(size.columns, size.lines)
            if frame != last_frame or size != last_size:
                try:
                    _draw(frame)
                except OSError:  # the terminal hung up: the view ends, as on SIGHUP
                    nursery.cancel_scope.cancel()
                    break
            last_frame, last_size = frame, size


def has_terminal() -> bool:
    """What the live view needs: keys from a terminal on stdin, frames to one on stdout."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def run(catalog: Path, *, here: str, once: bool, until: Until | None = None) -> int:
    """`until`: the live view also ends when it returns (`hctx demo`: when a session fails)."""
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
    from wrapper.readers.notice import Changes

    fd = sys.stdin.fileno()
    screen = Screen(catalog, here, colour_enabled(sys.stdout), View())
    # Held until the live view's own receiver is in place: a quit sent while the first frame is
    # drawn or trio starts is a quit, not a death that leaves the terminal without echo.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _QUITS)
    try:
        with _terminal(fd):
            # The first frame before trio is even imported: on a loaded machine that is a second.
            screen.read(Changes(frozenset(), whole=True))
            size = shutil.get_terminal_size()
            shown = screen.frame(size.columns, size.lines)
            _draw(shown)
            import trio

            trio.run(live, screen, fd, until, shown)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return 0
