"""`hctx status`: the whole fleet in one line, for a tmux status line, waybar or polybar.

Refreshed every few seconds by a status bar, so it starts fast: the catalog is listed and read by
guard.catalog (the same walker as every reader), each record read at a glance (guard.glance,
the stdlib's json) and nothing else loads, pydantic least of all. The counts are `hctx top`'s summary
(wrapper.readers.top.summary) and the tightest window is `hctx accounts`' fan-in (the newest snapshot
per account and window); tests/test_status.py holds both equal to those readers' on one catalog.
"""

from __future__ import annotations

import argparse
import itertools
import json
import operator
import os
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from guard.catalog import list_agents, open_host_dir, read_agent_files
from guard.errors import CatalogError
from guard.glance import Glance, glance
from sidecar.names import REGISTERED
from wrapper.arguments import add_catalog_options, existing_catalog, fail, with_host
from wrapper.readers.tint import AMBER_PERCENT, RED_PERCENT, colour_enabled, paint, percent_text, percent_tint

__all__ = [
    "DEFAULT_FORMAT",
    "FIELDS",
    "Fleet",
    "Tightest",
    "fields_of",
    "format_problem",
    "line_of",
    "read_fleet",
    "register",
    "run_status",
    "waybar",
]

# The named fields of --format; each is text.
FIELDS = {
    "agents": "how many agents the catalog holds",
    "fullest": "the fullest agent, HOST/ID (`-` when no agent states a percent)",
    "fill": "its fill, as `hctx agents` prints it (87%)",
    "at80": "how many agents are at or above 80%",
    "at95": "how many agents are at or above 95%",
    "stale": "how many records are stale (older than an hour)",
    "hosts": "how many hosts",
    "window": "the tightest account window and its percent (5h 72%), `-` with none",
    "window_agent": "the agent whose record carries that window's snapshot",
}
DEFAULT_FORMAT = "{agents} agents · {fullest} {fill} · {at80} ≥80% · {at95} ≥95% · {stale} stale · limit {window}"
_WINDOW_NAMES = {"fiveHour": "5h", "sevenDay": "7d"}


@dataclass(frozen=True, slots=True)
class Tightest:
    """The fullest account window: the newest snapshot of its account, neither stale nor reset since."""

    window: str  # fiveHour, sevenDay
    used_percent: float
    agent: str


@dataclass(frozen=True, slots=True)
class Fleet:
    agents: int
    hosts: int
    fullest: str | None
    fill: float | None
    at80: int
    at95: int
    stale: int
    tightest: Tightest | None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000  # wrapper.readers.roster.now_ms, without the roster's imports


def read_fleet(catalog: Path, now: int) -> Fleet:
    """The fleet at `now`; CatalogError when the catalog cannot be read at all."""
    agents, _ = list_agents(catalog)
    read: list[tuple[str, Glance]] = []
    for host, group in itertools.groupby(agents, key=operator.itemgetter(0)):
        host_fd = open_host_dir(catalog, host)
        try:
            for _, identity in group:
                data = read_agent_files(catalog, host, identity, host_fd).record.data
                seen = None if data is None else glance(data, now, REGISTERED)
                if seen is not None:
                    read.append((f"{host}/{identity}", seen))
        finally:
            if host_fd is not None:
                os.close(host_fd)
    percents = [(seen.used_percent, name) for name, seen in read if seen.used_percent is not None]
    # Fullest first, ties by name (wrapper.readers.top.fill_order): the first in host, identity order.
    fullest = min(percents, key=lambda pair: (-pair[0], pair[1]), default=None)
    return Fleet(
        agents=len(agents),
        hosts=len({host for host, _ in agents}),
        fullest=None if fullest is None else fullest[1],
        fill=None if fullest is None else fullest[0],
        at80=sum(percent >= AMBER_PERCENT for percent, _ in percents),
        at95=sum(percent >= RED_PERCENT for percent, _ in percents),
        stale=sum(seen.stale for _, seen in read),
        tightest=_tightest(read, now),
    )


def _tightest(read: list[tuple[str, Glance]], now: int) -> Tightest | None:
    """Per account (an agent stating none is its own) and window, the newest snapshot, as
    wrapper.readers.accounts.fan_in takes it; of those neither stale nor reset since, the fullest."""
    newest: dict[tuple[str, str], tuple[int, Tightest, bool]] = {}
    for name, seen in read:
        group = f"account:{seen.account_key}" if seen.account_key is not None else f"agent:{name}"
        for reading in seen.windows:
            held = newest.get((group, reading.window))
            if held is None or reading.at_ms > held[0]:  # ties: the first in roster order
                passed = reading.resets_at_ms is not None and reading.resets_at_ms <= now
                snapshot = Tightest(reading.window, reading.used_percent, name)
                newest[(group, reading.window)] = (reading.at_ms, snapshot, reading.stale or passed)
    current = [snapshot for _, snapshot, out in newest.values() if not out]
    return max(current, key=lambda snapshot: snapshot.used_percent, default=None)


def fields_of(fleet: Fleet, *, colour: bool = False) -> dict[str, str]:
    tightest = fleet.tightest
    window = "-"
    if tightest is not None:
        tint = percent_tint(tightest.used_percent)
        window = f"{_WINDOW_NAMES[tightest.window]} {paint(percent_text(tightest.used_percent), tint, colour)}"
    fill = "" if fleet.fill is None else paint(percent_text(fleet.fill), percent_tint(fleet.fill), colour)
    return {
        "agents": str(fleet.agents),
        "fullest": fleet.fullest or "-",
        "fill": fill,
        "at80": str(fleet.at80),
        "at95": str(fleet.at95),
        "stale": str(fleet.stale),
        "hosts": str(fleet.hosts),
        "window": window,
        "window_agent": "" if tightest is None else tightest.agent,
    }


def line_of(fleet: Fleet, template: str, *, colour: bool = False) -> str:
    """The line: `template` with its named fields filled in; a line break in a value never splits it."""
    return " ".join(template.format_map(fields_of(fleet, colour=colour)).split())


def waybar(fleet: Fleet, template: str) -> str:
    """waybar's custom-module JSON (return-type json): text, tooltip, class, percentage."""
    fields = fields_of(fleet)
    tooltip = [
        f"{fleet.agents} agents on {fleet.hosts} hosts",
        f"fullest: {fields['fullest']} {fields['fill']}" if fleet.fullest else "no agent states a percent",
        f"at or above 80%: {fleet.at80} · at or above 95%: {fleet.at95} · stale: {fleet.stale}",
        f"tightest window: {fields['window']}" + (f" ({fields['window_agent']})" if fleet.tightest is not None else ""),
    ]
    figures = [fleet.fill, None if fleet.tightest is None else fleet.tightest.used_percent]
    worst = max((value for value in figures if value is not None), default=None)
    tint = percent_tint(worst)
    # waybar's percentage is 0-100 (it picks format-icons by it); the text carries the real number.
    percentage = 0 if fleet.fill is None else max(0, min(100, round(fleet.fill)))
    return json.dumps(
        {
            "text": line_of(fleet, template),
            "tooltip": "\n".join(tooltip),
            "class": "empty" if fleet.agents == 0 else (tint or "ok"),
            "percentage": percentage,
        },
        ensure_ascii=False,
    )


def format_problem(template: str) -> str | None:
    """Why `template` will not do, naming the fields it may use; None when it will."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        return f"--format {template!r}: {exc}"
    unknown = [name for name in names if name not in FIELDS]
    if unknown:
        return f"--format: no field {unknown[0]!r}; the fields are {', '.join(FIELDS)}"
    return None


def run_status(args: argparse.Namespace) -> int:
    problem = format_problem(args.format)
    if problem is not None:
        return fail("status", problem, 2)
    try:
        fleet = read_fleet(existing_catalog(args), _now_ms())
    except CatalogError as exc:
        return fail("status", f"cannot read the catalog: {exc}", 2)
    if args.json:
        sys.stdout.write(waybar(fleet, args.format) + "\n")
    else:
        sys.stdout.write(line_of(fleet, args.format, colour=colour_enabled(sys.stdout)) + "\n")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser(
        "status",
        help="the whole fleet in one line, for a status bar (tmux, waybar, polybar)",
        description="One line: how many agents, the fullest and its fill, how many at or above 80% and 95%, "
        "how many stale, and the tightest account window (the newest snapshot of each account, neither "
        "stale nor reset since). Colour on a terminal only. Starts in about the time of the interpreter "
        "itself; exits non-zero only when the catalog cannot be read or --format is wrong (2).",
    )
    status.add_argument(
        "--format", default=DEFAULT_FORMAT, metavar="TEMPLATE",
        help="the line, with named fields in braces: " + ", ".join(f"{{{name}}}" for name in FIELDS)
        + f" (default: {DEFAULT_FORMAT.replace('%', '%%')!r})",
    )  # fmt: skip
    status.add_argument(
        "--json", action="store_true",
        help="waybar's custom-module JSON: {text, tooltip, class (ok, amber, red, empty), percentage}",
    )  # fmt: skip
    add_catalog_options(status)
    status.set_defaults(run=with_host(run_status))
