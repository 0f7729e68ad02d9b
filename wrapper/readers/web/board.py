"""The web board's data: one view per roster row, the rate-limit panel, one agent's page, and the
plot of its fill over time drawn from the fill history (guard.history) in the per-agent log.

Every number and word comes from the readers' one projection (wrapper.readers.roster) and their one
renderer (wrapper.readers.render): the tint, the headroom, the age and the stale mark are theirs, so the
board cannot tell a different story from `hctx agents`. Each view carries the row's `agent`
object, which is exactly that row of `hctx agents --json`. Plain data in, plain data (and SVG
text) out; nothing here serves or watches.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from guard.catalog import printable
from guard.files import open_regular
from guard.history import StartLine, WriteLine, read_fill_line
from guard.layout import log_files, log_path
from guard.projection import SubagentReading
from wrapper.readers.accounts import WINDOWS, AccountGroup, Snapshot, Window, fan_in, group_key, groups_by_agent
from wrapper.readers.forecast import Forecast, Point, forecast
from wrapper.readers.rate_history import KEEP_MS, WINDOW_MS, Series
from wrapper.readers.render import (
    age_text,
    agent_wire,
    cache_text,
    claim_section,
    cost_text,
    fill_tint,
    forecast_text,
    headroom_text,
    meter_text,
    meter_title,
    percent_text,
    record_section,
    state_text,
    subagent_label,
    tokens_text,
)
from wrapper.readers.roster import AgentRow, Inspection
from wrapper.readers.top import fill_order

__all__ = [
    "CACHE_TICK",
    "HISTORY_BYTES",
    "HISTORY_POINTS",
    "RATE_PANEL_ROWS",
    "Drawn",
    "FillHistory",
    "FillPoint",
    "age_now",
    "agent_detail",
    "ages_now",
    "draw_accounts",
    "fill_svg",
    "limits_svg",
    "rate_limit_panel",
    "rate_limit_panel_of",
    "read_fill_history",
    "row_view",
    "subagent_view",
]

# The newest rate-limit readings the panel lists; the rest are counted.
RATE_PANEL_ROWS = 20
# Of each log file (the live one and its rotations) only this much of its end is read.
HISTORY_BYTES = 2 * 1024 * 1024
HISTORY_POINTS = 5000
# The prompt cache's cell (issue 37) counts down with the ages, under its agent's key and this: a line
# break as a subagent's key has, then a tab, which no subagent id holds (ids are printable).
CACHE_TICK = "\n\tcache"


def age_now(row: AgentRow, read_ms: int, now: int) -> str:
    """The age column of a row read at `read_ms`, at `now`: the projection's `ageMs` advanced by the
    time since, so the board's ages tick without re-reading the catalog."""
    context = row.context
    if context is None:
        return "-"
    return age_text(context.age_ms + max(0, now - read_ms)) + (" stale" if context.stale else "")


def ages_now(row: AgentRow, read_ms: int, now: int) -> dict[str, str]:
    """The ages of a row with a reading that tick on the page: its own under its name, and each
    subagent's under the name, a line break and the subagent's id (neither holds a line break); a
    stated prompt cache's countdown under the name and CACHE_TICK."""
    context = row.context
    if context is None:
        return {}
    since = max(0, now - read_ms)
    subagents = {f"{row.name}\n{sub.id}": age_text(sub.age_ms + since) for sub in context.subagents}
    cache = {} if context.prompt_cache is None else {row.name + CACHE_TICK: cache_text(context, now)}
    return {row.name: age_now(row, read_ms, now), **subagents, **cache}


def row_view(row: AgentRow, read_ms: int, now: int, groups: Mapping[str, AccountGroup] | None = None) -> dict[str, Any]:
    """What the fleet page shows of one row, every cell as the terminal readers word it. `groups`:
    the roster's account groups (`groups_by_agent`), for its account's figure; default its own."""
    context = row.context
    percent = None if context is None else context.used_percent
    fill_key = fill_order(row)
    observed = None if context is None else context.observed_at_ms
    age_key = (1, 0, row.host, row.identity) if observed is None else (0, -observed, row.host, row.identity)
    return {
        "key": row.name,
        "agent": agent_wire(row, groups_by_agent(fan_in([row])) if groups is None else groups, read_ms),
        "harness": row.named_harness or "-",
        "model": "-" if context is None or context.model is None else context.model,
        "reading": context is not None,
        "percent": None if percent is None else percent_text(percent),
        "tint": fill_tint(context),
        "meter": meter_text(context),
        "title": meter_title(context),
        "headroom": headroom_text(context),
        "compactions": "-" if context is None else str(context.compactions),
        "age": age_now(row, read_ms, now),
        "stale": context is not None and context.stale,
        "cost": cost_text(None if context is None else context.cost_usd),
        "cache": cache_text(context, now),  # `agents`' CACHE cell; it ticks with the ages (CACHE_TICK)
        "state": state_text(row),
        "problem": "; ".join(problem for problem in (row.problem, row.claim_problem) if problem) or None,
        "order": {"fill": list(fill_key), "age": list(age_key)},
        "subagents": [subagent_view(sub) for sub in (() if context is None else context.subagents)],
    }


def subagent_view(sub: SubagentReading) -> dict[str, Any]:
    """A subagent's line under its agent's row (issue 28), worded as `hctx agents` words it: its
    own numbers, never the agent's."""
    percent = sub.used_percent
    return {
        "key": sub.id,
        "label": subagent_label(sub),
        "state": sub.state,
        "model": sub.model or "-",
        "reading": True,
        "percent": None if percent is None else percent_text(percent),
        "tint": fill_tint(sub),
        "meter": meter_text(sub),
        "title": meter_title(sub),
        "compactions": "-" if sub.compactions is None else str(sub.compactions),
        "age": age_text(sub.age_ms),
        "problem": None,
    }


@dataclass(frozen=True, slots=True)
class Drawn:
    """What the panel shows of one account's history (issue 39), drawn where the history is read
    (the board's worker) so the board holds a few hundred bytes per account, not its points."""

    forecasts: dict[Window, Forecast]
    plot: str  # limits_svg


def draw_accounts(series: Series, now: int) -> dict[str, Drawn]:
    """Each kept account's forecasts and plot, keyed by its group key (wrapper.readers.accounts.group_key)."""
    accounts: dict[str, dict[Window, list[Point]]] = {}
    for (account, window), points in series.items():
        accounts.setdefault(account, {})[window] = points
    return {
        account: Drawn(
            {window: forecast(points, now, horizon_ms=WINDOW_MS[window]) for window, points in held.items() if points},
            limits_svg(held, now),
        )
        for account, held in accounts.items()
    }


def rate_limit_panel(
    rows: Iterable[tuple[AgentRow, int]], now: int, drawn: Mapping[str, Drawn] | None = None
) -> dict[str, Any]:
    """The accounts' rate limits, as `hctx accounts` fans them in (wrapper.readers.accounts.fan_in): one
    entry per account (an agent stating none is its own), each window the newest snapshot across
    its agents, newest account first; `key` is the agent the newest snapshot came from, whose age
    the entry shows. With `drawn` (each account's history, `draw_accounts`), each entry says
    when each window runs out at the fleet's pace, as `hctx accounts`' RUNS OUT does, and carries
    `plot`, the windows over the kept hours (`limits_svg`)."""
    read_at = {row.name: (row, read_ms) for row, read_ms in rows}
    groups = fan_in(row for row, _ in read_at.values())
    return rate_limit_panel_of(groups, lambda name: read_at[name][1], now, drawn)


def rate_limit_panel_of(
    groups: Iterable[AccountGroup], read_ms: Callable[[str], int], now: int, drawn: Mapping[str, Drawn] | None = None
) -> dict[str, Any]:
    """`rate_limit_panel` of account groups already fanned in (the board keeps them between reads):
    only the newest RATE_PANEL_ROWS are put in order (and only theirs drawn). `read_ms`: when an agent's
    row was read; `drawn` as `rate_limit_panel`'s."""

    def newest(group: AccountGroup) -> Snapshot:
        """Its newest snapshot, by when the figure arrived (issue 35), not by the reading holding it."""
        return max(group.windows.values(), key=lambda snapshot: snapshot.observed_at_ms)

    def order(group: AccountGroup) -> tuple[int, str]:
        snapshot = newest(group)
        return -snapshot.observed_at_ms, snapshot.source.name

    every = list(groups)
    shown_groups = heapq.nsmallest(RATE_PANEL_ROWS, every, key=order)

    def shown(group: AccountGroup, window: Window) -> str:
        snapshot = group.windows.get(window)
        return "-" if snapshot is None else percent_text(snapshot.used_percent)

    entries = []
    for group in shown_groups:
        snapshot = newest(group)
        source = snapshot.source
        entries.append({
            "key": source.name,
            "account": printable(group.name),
            "harness": None if source.context is None else source.context.harness,  # the snapshot's reading
            "fiveHour": shown(group, "fiveHour"),
            "sevenDay": shown(group, "sevenDay"),
            "agents": len(group.agents),
            "age": age_text(snapshot.age_ms + max(0, now - read_ms(source.name)))
            + (" stale" if snapshot.stale else ""),  # the snapshot's own age, ticking as age_now's
        })  # fmt: skip
        if drawn is not None:
            held = drawn.get(group_key(group.agents[0]))
            for window, _ in WINDOWS:
                found = None if held is None else held.forecasts.get(window)
                entries[-1][_RUNS_OUT_FIELD[window]] = "-" if window not in group.windows else forecast_text(found, now)
            entries[-1]["plot"] = None if held is None else held.plot
    return {"entries": entries, "more": max(0, len(every) - RATE_PANEL_ROWS)}


_RUNS_OUT_FIELD: dict[Window, str] = {"fiveHour": "runsOutFiveHour", "sevenDay": "runsOutSevenDay"}
_PLOT_W, _PLOT_H, _PLOT_PAD = 180, 48, 2
# Each window's polyline class (board.css colours it) and title.
_PLOT_WINDOWS: tuple[tuple[Window, str], ...] = (("fiveHour", "five-hour"), ("sevenDay", "seven-day"))


def limits_svg(held: Mapping[Window, list[Point]], now: int) -> str:
    """A small plot of each window's percent over the hours the history keeps (0 to 100%, the newest
    snapshot at the right edge): one polyline per window, a dashed line at 100%. Numbers only: nothing of the
    record's text reaches it. An HTML fragment (no namespace URI: the page the snapshot is embedded
    in names no URL), parsed as HTML by the board."""
    # The right edge is the newest snapshot, not the clock: the plot changes only when the history
    # does, so a read that found nothing new pushes no panel.
    last = max((point.at_ms for points in held.values() for point in points if point.at_ms <= now), default=now)
    first = last - KEEP_MS

    def x(ms: int) -> float:
        return round(_PLOT_PAD + max(0, ms - first) / KEEP_MS * (_PLOT_W - 2 * _PLOT_PAD), 1)

    def y(percent: float) -> float:
        return round(_PLOT_H - _PLOT_PAD - min(max(percent, 0), 100) / 100 * (_PLOT_H - 2 * _PLOT_PAD), 1)

    parts = [
        f'<svg class="limits-plot" viewBox="0 0 {_PLOT_W} {_PLOT_H}" '
        f'width="{_PLOT_W}" height="{_PLOT_H}" role="img" aria-label="rate-limit windows over the last '
        f'{KEEP_MS // 3_600_000} hours">',
        f'<line class="full" x1="{_PLOT_PAD}" y1="{y(100)}" x2="{_PLOT_W - _PLOT_PAD}" y2="{y(100)}"/>',
    ]
    for window, spoken in _PLOT_WINDOWS:
        points = [point for point in held.get(window, []) if first <= point.at_ms <= last]
        if points:
            line = " ".join(f"{x(point.at_ms)},{y(point.used_percent)}" for point in points)
            parts.append(f'<polyline class="{spoken}" points="{line}"><title>{spoken}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# One agent's fill over time, from the sidecar's `write` log lines


@dataclass(frozen=True, slots=True)
class FillPoint:
    at_ms: int
    used: int
    window: int | None
    compact_at: int | None
    compactions: int
    reason: str
    run: int  # a new sidecar start begins a new run: the curve is not drawn across it


@dataclass(frozen=True, slots=True)
class FillHistory:
    points: list[FillPoint] = field(default_factory=list)
    note: str | None = None  # why there is nothing (or less than everything) to draw


def _log_lines(path: Path) -> tuple[list[bytes], str | None]:
    opened = open_regular(path)
    if opened is None:
        return [], None
    if not isinstance(opened, tuple):
        return [], f"{path} {opened}"
    fd, size = opened
    start = max(0, size - HISTORY_BYTES)
    try:
        data = os.pread(fd, HISTORY_BYTES, start)
    except OSError as exc:
        return [], f"{path} unreadable: {exc.strerror or exc}"
    finally:
        os.close(fd)
    lines = data.splitlines()
    return lines[1:] if start > 0 else lines, None  # the first line was cut by the byte window


def read_fill_history(catalog: Path, host: str, identity: str, *, here: str) -> FillHistory:
    """The fill history's `write` lines (guard.history, docs/fill-history.md) in the agent's log and
    its rotations, oldest first; every other line is passed over (the log is the sidecar's
    diagnostics, not a record: a line is taken only as the history's typed model validates it)."""
    live = log_path(catalog, host, identity)
    files = log_files(catalog, host, identity)
    points: list[FillPoint] = []
    problems: list[str] = []
    found = False
    run = 0
    for path in files:
        lines, problem = _log_lines(path)
        found = found or bool(lines) or problem is not None or os.path.lexists(path)
        if problem:
            problems.append(problem)
        for line in lines:
            entry = read_fill_line(line)  # the one rule: a deep or hostile line is a skipped line, never a crash
            if isinstance(entry, StartLine):
                run += 1
            if not isinstance(entry, WriteLine) or entry.used_tokens is None:
                continue
            points.append(FillPoint(
                at_ms=entry.observed_at_ms, used=entry.used_tokens, window=entry.window_tokens,
                compact_at=entry.compact_at_tokens, compactions=entry.compactions, reason=entry.reason, run=run,
            ))  # fmt: skip
    if not found:
        if host != here:
            return FillHistory(note=f"no fill history: logs stay on the host that keeps them, and {host}'s "
                               "is not this one (a replica carries the records only)")  # fmt: skip
        return FillHistory(note=f"no fill history yet: {live} does not exist")
    note = "; ".join(printable(problem) for problem in problems) or None
    if not points and note is None:
        note = f"no reading with a token count in {live} yet"
    return FillHistory(points[-HISTORY_POINTS:], note)


# ---------------------------------------------------------------------------------------------
# The plot: inline SVG, drawn here; the page's stylesheet colours it by class

_W, _H = 760, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 12, 14, 30


def _clock(ms: int) -> str:
    import datetime

    try:
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def fill_svg(history: FillHistory, compact_at_now: int | None) -> str | None:
    """The fill (tokens) over time, one line per sidecar run; the window and the harness's own
    compaction point as stepped dashes; each compaction a vertical mark with its time as a title."""
    points = history.points
    if not points:
        return None
    first, last = points[0].at_ms, points[-1].at_ms
    span = max(1, last - first)
    top = max(
        max(point.used for point in points),
        max((point.window or 0 for point in points), default=0),
        max((point.compact_at or 0 for point in points), default=0),
        compact_at_now or 0,
        1,
    )

    def x(ms: int) -> float:
        return round(_LEFT + (ms - first) / span * (_W - _LEFT - _RIGHT), 1)

    def y(tokens: int) -> float:
        return round(_H - _BOTTOM - tokens / top * (_H - _TOP - _BOTTOM), 1)

    def steps(values: list[tuple[int, int | None]], css: str, label: str) -> list[str]:
        out, run = [], []
        for index, (at, value) in enumerate(values):
            if value is not None:
                end = values[index + 1][0] if index + 1 < len(values) else last
                run.append(f"{x(at)},{y(value)} {x(end)},{y(value)}")
            if (value is None or index + 1 == len(values)) and run:
                joined = " ".join(run)
                out.append(f'<polyline class="{css}" points="{joined}"><title>{escape(label)}</title></polyline>')
                run = []
        return out

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="fill-plot" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="context fill over time">',
        f'<line class="axis" x1="{_LEFT}" y1="{_H - _BOTTOM}" x2="{_W - _RIGHT}" y2="{_H - _BOTTOM}"/>',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_H - _BOTTOM}"/>',
        f'<text class="label" x="{_LEFT - 6}" y="{_TOP + 4}" text-anchor="end">{tokens_text(top)}</text>',
        f'<text class="label" x="{_LEFT - 6}" y="{_H - _BOTTOM}" text-anchor="end">0</text>',
        f'<text class="label" x="{_LEFT}" y="{_H - 8}">{_clock(first)}</text>',
        f'<text class="label" x="{_W - _RIGHT}" y="{_H - 8}" text-anchor="end">{_clock(last)}</text>',
    ]
    parts += steps([(p.at_ms, p.window) for p in points], "window", "the context window")
    compact_points = [(p.at_ms, p.compact_at) for p in points]
    if not any(value is not None for _, value in compact_points) and compact_at_now is not None:
        compact_points = [(first, compact_at_now)]  # logged before the log carried it: the record's
    parts += steps(compact_points, "compact-at", "the harness's own compaction point")
    for run in sorted({point.run for point in points}):
        line = " ".join(f"{x(p.at_ms)},{y(p.used)}" for p in points if p.run == run)
        parts.append(f'<polyline class="fill" points="{line}"><title>tokens in the context window</title></polyline>')
    previous: FillPoint | None = None
    for point in points:
        rose = previous is not None and previous.run == point.run and point.compactions > previous.compactions
        if point.reason == "compaction" or rose:
            parts.append(
                f'<line class="compaction" x1="{x(point.at_ms)}" y1="{_TOP}" x2="{x(point.at_ms)}" '
                f'y2="{_H - _BOTTOM}"><title>compaction, {_clock(point.at_ms)}</title></line>'
            )
        previous = point
    parts.append("</svg>")
    return "".join(parts)


def agent_detail(inspection: Inspection, history: FillHistory, read_ms: int) -> dict[str, Any]:
    """One agent's page: its row, `inspect`'s record and claim sections, and the plot."""
    row = inspection.view.row
    context = row.context
    compact_at = None if context is None else context.compact_at_tokens
    return {
        "view": row_view(row, read_ms, read_ms),
        "record": record_section(inspection),
        "claim": claim_section(inspection),
        "history": {"points": len(history.points), "note": history.note, "svg": fill_svg(history, compact_at)},
    }
