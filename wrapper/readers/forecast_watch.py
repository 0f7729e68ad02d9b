"""`hctx watch`'s `rate-limit-forecast` event (issue 39): an account's window that, at the pace of
all its agents, reaches 100% more than `--forecast-margin` before the reset the harness stated.

The event logic is `forecast_step`, pure like `wrapper.readers.account_watch.account_step`, on the forecasts
`wrapper.readers.forecast` makes from the account's history (`wrapper.readers.rate_history`, which this watch keeps
as every other reader does). Edge-triggered: it fires when the projection falls before the reset
by more than the margin after a forecast that did not (or the first one seen), and is re-armed by a
forecast that no longer does, or once the reset of the window it fired in has passed. No forecast
(too few snapshots, stale, a reset just seen) neither fires nor re-arms: it says nothing new.

What was told is kept beside the other watch state, `<catalog>/.st2/watch/NAME.forecast.json`,
replaced atomically before the events go out, so a restarted watch does not tell it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from guard.catalog import printable
from guard.constants import HARNESS_CONTEXT_STALE_MS
from wrapper.readers.accounts import WINDOWS, AccountGroup, Window, fan_in, group_key
from wrapper.readers.forecast import Forecast
from wrapper.readers.rate_history import keep_groups
from wrapper.readers.render import age_text
from wrapper.readers.watch import CompanionFile, Event, Observation, StateFile, dump_windows, log, parse_state

__all__ = [
    "DEFAULT_FORECAST_MARGIN_S",
    "FORECAST_STATE_SCHEMA",
    "ForecastEvent",
    "ForecastSeen",
    "ForecastWatch",
    "dump_forecast_state",
    "forecast_step",
    "load_forecast_state",
]

FORECAST_STATE_SCHEMA = "hctx.watch-forecast.v1"
# `--forecast-margin`'s default: a window running dry a quarter of an hour early is worth a word;
# a few minutes is within the noise of whole-percent readings.
DEFAULT_FORECAST_MARGIN_S = 15 * 60
_SEEN_REFRESH_MS = 5 * 60 * 1000  # as wrapper.account_watch: a quiet account rewrites nothing each tick
_SPOKEN = {"fiveHour": "five-hour", "sevenDay": "seven-day"}


@dataclass(frozen=True, slots=True)
class ForecastSeen:
    """What watch told about one account's window: whether the early run-out was told and not
    re-armed, the reset of the window it was told in, and when the account was last in a roster."""

    fired: bool = False
    resets_at_ms: int | None = None
    seen_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class ForecastEvent(Event):
    """One early run-out: the account, its window, the forecast (`row` is the newest snapshot's agent)."""

    group: AccountGroup | None = None
    window: Window = "fiveHour"
    forecast: Forecast | None = None
    margin_ms: int = 0

    def wire(self) -> dict[str, Any]:
        group, forecast = self.group, self.forecast
        assert group is not None and forecast is not None
        snapshot = group.windows[self.window]
        return {
            **self.head(),
            "account": group.key,
            "accountLabel": group.label,
            "agents": len(group.agents),
            "window": self.window,
            "usedPercent": snapshot.used_percent,
            "resetsAtMs": forecast.resets_at_ms,
            "exhaustedAtMs": forecast.exhausted_at_ms,
            "percentPerHour": forecast.percent_per_hour,
            "spanMs": forecast.span_ms,
            "points": forecast.points,
            "marginMs": self.margin_ms,
            "observedAtMs": snapshot.observed_at_ms,
            "atMs": self.at_ms,
            "message": self.message(),
        }

    def message(self) -> str:
        group, forecast = self.group, self.forecast
        assert group is not None and forecast is not None
        assert forecast.exhausted_at_ms is not None and forecast.resets_at_ms is not None
        assert forecast.percent_per_hour is not None
        runs_out = max(0, forecast.exhausted_at_ms - self.at_ms)
        return (
            f"{printable(group.name)}: {_SPOKEN[self.window]} rate limit runs out in {age_text(runs_out)} at the "
            f"pace of its {len(group.agents)} agent{'s' * (len(group.agents) != 1)} "
            f"({forecast.percent_per_hour:.1f}%/h over {age_text(forecast.span_ms)}, {forecast.points} snapshots), "
            f"{age_text(forecast.resets_at_ms - forecast.exhausted_at_ms)} before it resets"
        )


def _falls_early(forecast: Forecast, margin_ms: int) -> bool:
    return (
        forecast.status == "runs-out"
        and forecast.exhausted_at_ms is not None
        and forecast.resets_at_ms is not None
        and forecast.exhausted_at_ms < forecast.resets_at_ms - margin_ms
    )


def forecast_step(
    state: Mapping[str, ForecastSeen],
    groups: Sequence[AccountGroup],
    forecasts: Mapping[tuple[str, Window], Forecast],
    now: int,
    margin_ms: int,
    incarnations: Mapping[str, str | None],
    *,
    partial: bool = False,
) -> tuple[list[Event], dict[str, ForecastSeen]]:
    """The `rate-limit-forecast` events `groups` and their `forecasts` bring after `state`, and the
    state after them. An account absent from `groups` is forgotten after the hour horizon, unless
    `partial` (`groups` are only the accounts a file event touched)."""
    events: list[Event] = []
    after = dict(state)
    present: set[str] = set()
    for group in groups:
        account = group_key(group.agents[0])
        for window, _ in WINDOWS:
            latest, forecast = group.windows.get(window), forecasts.get((account, window))
            if latest is None or forecast is None:
                continue
            key = f"{account}/{window}"
            present.add(key)
            before = after.get(key, ForecastSeen())
            seen = before.seen_at_ms if now - before.seen_at_ms < _SEEN_REFRESH_MS else now
            if before.resets_at_ms is not None and before.resets_at_ms <= now:
                before = ForecastSeen()  # the window it was told in has reset: armed again
            if forecast.status == "unknown":
                after[key] = ForecastSeen(before.fired, before.resets_at_ms, seen)
                continue
            early = _falls_early(forecast, margin_ms)
            if early and not before.fired:
                events.append(ForecastEvent(
                    "rate-limit-forecast", latest.source, incarnations.get(latest.source.name) or "", None, now,
                    group=group, window=window, forecast=forecast, margin_ms=margin_ms,
                ))  # fmt: skip
            after[key] = ForecastSeen(early, forecast.resets_at_ms if early else None, seen)
    for key in [] if partial else [key for key in after if key not in present]:
        if now - after[key].seen_at_ms >= HARNESS_CONTEXT_STALE_MS:
            del after[key]
    return events, after


class _SeenWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    fired: bool = False
    resets_at_ms: int | None = Field(default=None, alias="resetsAtMs")
    seen_at_ms: int = Field(default=0, alias="seenAtMs")


class _StateWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_id: Literal["hctx.watch-forecast.v1"] = Field(alias="schema")
    windows: dict[str, _SeenWire]


def dump_forecast_state(state: Mapping[str, ForecastSeen]) -> bytes:
    return dump_windows(FORECAST_STATE_SCHEMA, {
        key: {"fired": seen.fired, "resetsAtMs": seen.resets_at_ms, "seenAtMs": seen.seen_at_ms}
        for key, seen in state.items()
    })  # fmt: skip


def load_forecast_state(data: bytes) -> dict[str, ForecastSeen]:
    """Raises RecordRefused (a ValueError) for a file that is not a forecast watch state."""
    windows = parse_state(_StateWire, data).windows
    return {key: ForecastSeen(seen.fired, seen.resets_at_ms, seen.seen_at_ms) for key, seen in windows.items()}


class ForecastWatch:
    """The forecast half of one watch: it keeps the accounts' history as every reader does, and its
    state file sits beside the agents' one, under the same lock."""

    def __init__(self, state_file: StateFile, margin_s: float) -> None:
        self.margin_ms = int(margin_s * 1000)
        self.file = CompanionFile(state_file, "forecast", load_forecast_state, dump_forecast_state, "no forecast told")
        self.catalog: Path = state_file.path.parents[2]  # <catalog>/.st2/watch/NAME.json
        self.state: dict[str, ForecastSeen] = {}
        # Every agent's newest observation: a file event's tick names only the agents it saw change.
        self.held: dict[str, Observation] = {}
        self.problem: str | None = None  # the history's, said once while it lasts

    def load(self, dir_fd: int) -> None:
        self.state = self.file.read(dir_fd) or {}

    def step(self, dir_fd: int, snapshot: list[Observation], now: int, *, partial: bool = False) -> list[Event]:
        if not partial:
            self.held = {}
        self.held.update((observation.row.name, observation) for observation in snapshot)
        groups = fan_in(observation.row for observation in self.held.values())
        if partial:  # only the accounts of the agents a file event named: their histories, no others
            named = {observation.row.name for observation in snapshot}
            groups = [group for group in groups if any(row.name in named for row in group.agents)]
        _, forecasts, problem = keep_groups(self.catalog, groups, now)
        if problem is not None and problem != self.problem:
            log(problem)
        self.problem = problem
        incarnations = {name: observation.incarnation for name, observation in self.held.items()}
        events, after = forecast_step(self.state, groups, forecasts, now, self.margin_ms, incarnations, partial=partial)
        if after != self.state:
            self.file.save(dir_fd, after)
            self.state = after
        return events
