"""Each account's rate-limit history (issue 39): what `wrapper.readers.forecast` forecasts from.

A record carries only its agent's newest snapshot; a pace needs several. Whichever reader sees the
accounts (`hctx accounts`, `watch`, `metrics`, the board) hands every agent's snapshot of every
window to `keep`, which merges them into the account's file and returns the merged series. So
running any reader builds the history, and every reader forecasts from the same points.

Host-local, beside the watch state: `<catalog>/.st2/rate-limits/<digest of the account>.json`, one
small file per account (a reader touches the files of the accounts in its roster only, whatever
the number of accounts), nothing under the replicated `agents/` subtree. Concurrent readers take
`.lock` in that directory for the read-merge-replace of each pass (flock), and each file is replaced
atomically (guard.atomic; not fsynced: a crash may cost the newest points, no more, and a
first pass over a thousand accounts stays quick), so two readers never lose each other's points and
no reader sees half a file. Bounded: points older than KEEP_MS before a window's newest are dropped, and past MAX_POINTS
the point whose neighbours are closest goes (the series stays spread over the kept hours); a file
is read only up to MAX_FILE_BYTES. A file that is not a history (hostile, truncated by a crash of
another tool) is started afresh, never a traceback. A reader that cannot write (a read-only
catalog) still forecasts from what it read and what it saw.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.atomic import write_json_atomic
from guard.constants import CONTROL_DIR_NAME
from guard.files import read_bounded
from guard.procs import pid_alive
from guard.walk import open_chain
from wrapper.readers.accounts import AccountGroup, Window, agent_snapshots, group_key
from wrapper.readers.forecast import Forecast, Point, forecast, point_order

__all__ = [
    "HISTORY_DIR_NAME",
    "HISTORY_SCHEMA",
    "KEEP_MS",
    "MAX_FILE_BYTES",
    "MAX_POINTS",
    "WINDOW_MS",
    "Series",
    "Sighting",
    "forecasts",
    "keep",
    "keep_groups",
    "merge",
    "sightings_of",
]

HISTORY_DIR_NAME: Final = "rate-limits"
HISTORY_SCHEMA: Final = "hctx.rate-limit-history.v1"
# The board plots the last hours; the forecast reads the last one (wrapper.readers.forecast.FORECAST_SPAN_MS).
KEEP_MS: Final = 6 * 60 * 60 * 1000
MAX_POINTS: Final = 256
MAX_FILE_BYTES: Final = 256 * 1024
# Each window's length: how far ahead a projection means anything when no reset is stated.
WINDOW_MS: Final[Mapping[Window, int]] = {"fiveHour": 5 * 3_600_000, "sevenDay": 7 * 86_400_000}
_LOCK_NAME: Final = ".lock"
_STAGED = re.compile(r"[0-9a-f]{32}\.json\.([0-9]+)\.[0-9a-f]+")

Series = dict[tuple[str, Window], list[Point]]  # keyed (group key, window)


@dataclass(frozen=True, slots=True)
class Sighting:
    """One agent's snapshot of one account's window (`account`: `wrapper.readers.accounts.group_key`)."""

    account: str
    window: Window
    point: Point


def sightings_of(groups: Iterable[AccountGroup]) -> Iterator[Sighting]:
    """Every agent's snapshot of every window of `groups`, not only the newest: the pace is across
    all of an account's agents. Only accounts a record names: an agent stating none is no account
    (as `hctx metrics` exports none for it), and a fleet of them costs no history files."""
    for group in groups:
        if group.key is None:
            continue
        key = group_key(group.agents[0])
        for snapshot in agent_snapshots(group):
            yield Sighting(key, snapshot.window,
                           Point(snapshot.observed_at_ms, snapshot.used_percent, snapshot.resets_at_ms))  # fmt: skip


def _thin(points: list[Point], limit: int) -> None:
    """Past `limit`, drop the inner point whose neighbours are closest in time, until within it."""
    while len(points) > limit:
        gaps = [points[index + 1].at_ms - points[index - 1].at_ms for index in range(1, len(points) - 1)]
        del points[1 + gaps.index(min(gaps))]


def merge(held: Iterable[Point], seen: Iterable[Point], now: int) -> list[Point]:
    """`held` and `seen` as one bounded series, oldest first: duplicates once, nothing after `now`
    (a clock ahead of this host's), nothing KEEP_MS older than the newest, at most MAX_POINTS."""
    points = sorted(
        {point for point in (*held, *seen) if point.at_ms <= now and math.isfinite(point.used_percent)},
        key=point_order,
    )
    if points:
        cut = bisect.bisect_left([point.at_ms for point in points], points[-1].at_ms - KEEP_MS)
        del points[:cut]
    _thin(points, MAX_POINTS)
    return points


class _FileWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_id: Literal["hctx.rate-limit-history.v1"] = Field(alias="schema")
    account: str
    windows: dict[Window, list[tuple[int, float, int | None]]]


def _file_name(account: str) -> str:
    return hashlib.sha256(account.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json"


def _load(dir_fd: int, account: str) -> dict[Window, list[Point]]:
    raw = read_bounded(dir_fd, _file_name(account), MAX_FILE_BYTES)
    if raw.data is None:
        return {}
    try:
        wire = _FileWire.model_validate_json(raw.data)
    except ValidationError:
        return {}  # not a history: started afresh, and replaced at the next write
    if wire.account != account:
        return {}  # a digest collision, or a file copied in: not this account's points
    return {window: [Point(*entry) for entry in entries] for window, entries in wire.windows.items()}


def _dump(account: str, windows: Mapping[Window, list[Point]]) -> bytes:
    body = {
        "schema": HISTORY_SCHEMA,
        "account": account,
        "windows": {
            window: [[p.at_ms, p.used_percent, p.resets_at_ms] for p in points]
            for window, points in sorted(windows.items())
            if points
        },
    }
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


@contextlib.contextmanager
def _history_dir(catalog: Path) -> Iterator[int]:
    """The history directory's descriptor with its lock held (created as needed)."""
    dir_fd = open_chain(catalog, (CONTROL_DIR_NAME, HISTORY_DIR_NAME), create=True)
    try:
        lock_fd = os.open(_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            yield dir_fd
        finally:
            os.close(lock_fd)
    finally:
        os.close(dir_fd)


def _sweep(dir_fd: int) -> None:
    """What a writer killed mid-replace left staged (its pid is in the name), under the lock."""
    for name in os.listdir(dir_fd):
        match = _STAGED.fullmatch(name)
        if match is not None and not pid_alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)


def keep(catalog: Path, seen: Iterable[Sighting], now: int) -> tuple[Series, str | None]:
    """Merge `seen` into each sighted account's history and return the merged series, with a
    problem (None when none) when the history could not be read or written: then the series are
    what could be read and what was seen, and the forecast still goes on."""
    by_account: dict[str, dict[Window, list[Point]]] = {}
    for sighting in seen:
        by_account.setdefault(sighting.account, {}).setdefault(sighting.window, []).append(sighting.point)
    series: Series = {}
    problem = None
    try:
        with _history_dir(catalog) as dir_fd:
            _sweep(dir_fd)
            for account, windows in by_account.items():
                held = _load(dir_fd, account)
                merged = {
                    window: merge(held.get(window, ()), windows.get(window, ()), now) for window in {*held, *windows}
                }
                for window, points in merged.items():
                    series[account, window] = points
                if merged != held:
                    write_json_atomic(dir_fd, _file_name(account), _dump(account, merged), dir_fd, durable=False)
    except (OSError, ValueError) as exc:  # CatalogError is a ValueError: a symlinked .st2, say
        problem = f"cannot keep the rate-limit history: {exc}"
        for account, windows in by_account.items():
            for window, points in windows.items():
                series.setdefault((account, window), merge(series.get((account, window), ()), points, now))
    return series, problem


def forecasts(series: Series, now: int) -> dict[tuple[str, Window], Forecast]:
    return {
        (account, window): forecast(points, now, horizon_ms=WINDOW_MS[window])
        for (account, window), points in series.items()
    }


def keep_groups(
    catalog: Path, groups: Iterable[AccountGroup], now: int
) -> tuple[Series, dict[tuple[str, Window], Forecast], str | None]:
    """What a reader calls: its fan-in's snapshots kept, and each account's windows forecast."""
    series, problem = keep(catalog, sightings_of(groups), now)
    return series, forecasts(series, now), problem
