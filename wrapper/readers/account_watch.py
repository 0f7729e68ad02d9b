"""`hctx watch`'s `rate-limit` event (issue 29): an account's window crossing a `--rate-limit-at` percent.

The event logic is `account_step`, pure like `wrapper.readers.watch.step`: per account and window the fan-in's
newest snapshot (`wrapper.readers.accounts.fan_in`, across every agent sharing the account), so agents on one
account fire once per crossing, not once each. Edge-triggered: a threshold fires when the newest
snapshot is at or above it after one below it (or the first one seen), and is re-armed by a snapshot
below it, by a snapshot whose window has reset, or when the reset time of the window it fired in has
passed. A stale snapshot (past the hour horizon) fires nothing and re-arms nothing, and neither does
one older than the snapshot the state last followed (issue 35: an account's newest agent gone from
the roster leaves an older figure newest; it says nothing new about the account).

What was told is kept beside the agents' watch state, in `<catalog>/.st2/watch/NAME.accounts.json`,
replaced atomically before the events go out (at most once, as the fill events).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from guard.catalog import printable
from guard.constants import HARNESS_CONTEXT_STALE_MS
from wrapper.readers.accounts import WINDOWS, AccountGroup, Snapshot, fan_in, group_key
from wrapper.readers.render import age_text, percent_text, reset_text
from wrapper.readers.watch import CompanionFile, Event, Observation, StateFile, dump_windows, parse_state

__all__ = [
    "ACCOUNT_STATE_SCHEMA",
    "SEEN_REFRESH_MS",
    "AccountState",
    "AccountWatch",
    "RateLimitEvent",
    "WindowSeen",
    "account_step",
    "dump_account_state",
    "load_account_state",
]

ACCOUNT_STATE_SCHEMA = "hctx.watch-accounts.v1"
# `seenAtMs` is refreshed this rarely, so a quiet account does not rewrite the state file at every tick.
SEEN_REFRESH_MS = 5 * 60 * 1000
# The window's name in a message.
_SPOKEN = {"fiveHour": "five-hour", "sevenDay": "seven-day"}


@dataclass(frozen=True, slots=True)
class WindowSeen:
    """What watch told about one account's window: the thresholds fired and not re-armed, the reset
    time of the window they fired in, and when the account was last in a roster (for forgetting)."""

    fired: frozenset[float] = frozenset()
    resets_at_ms: int | None = None
    seen_at_ms: int = 0
    # When the newest snapshot the state followed arrived (`Snapshot.observed_at_ms`): an older one
    # neither fires nor re-arms. 0: none followed yet (or a state file written before it).
    snapshot_at_ms: int = 0


AccountState = Mapping[str, WindowSeen]  # keyed "<group key>/<window>"


@dataclass(frozen=True, slots=True)
class RateLimitEvent(Event):
    """One crossing: the account, its window and the snapshot that crossed (`row` is its agent)."""

    group: AccountGroup | None = None
    snapshot: Snapshot | None = None

    def wire(self) -> dict[str, Any]:
        group, snapshot = self.group, self.snapshot
        assert group is not None and snapshot is not None
        return {
            **self.head(),
            "account": group.key,
            "accountLabel": group.label,
            "agents": len(group.agents),
            "window": snapshot.window,
            "threshold": self.threshold,
            "usedPercent": snapshot.used_percent,
            "resetsAtMs": snapshot.resets_at_ms,
            "observedAtMs": snapshot.observed_at_ms,
            "ageMs": snapshot.age_ms,
            "atMs": self.at_ms,
            "message": self.message(),
        }

    def message(self) -> str:
        group, snapshot = self.group, self.snapshot
        assert group is not None and snapshot is not None
        resets = reset_text(snapshot.resets_at_ms, self.at_ms)
        shared = f"newest of {len(group.agents)} agents: " if len(group.agents) > 1 else ""
        return (
            f"{printable(group.name)}: {_SPOKEN[snapshot.window]} rate limit {percent_text(snapshot.used_percent)} "
            f"used, at or above {self.threshold:g}%"
            + ("" if snapshot.resets_at_ms is None else f"; resets {resets}")
            + f" ({shared}{self.row.name}, {age_text(snapshot.age_ms)} old)"
        )


def account_step(
    state: AccountState,
    snapshot: Iterable[Observation],
    now: int,
    thresholds: tuple[float, ...],
    *,
    partial: bool = False,
) -> tuple[list[Event], dict[str, WindowSeen]]:
    """The `rate-limit` events one roster snapshot brings after `state`, and the state after them.

    An account absent from the roster is remembered for the hour horizon (an agent relaunching
    leaves it empty for a moment, and must not make it tell again), then forgotten. A `partial`
    snapshot holds every agent of some accounts only: the others keep what was told, none forgotten."""
    observations = list(snapshot)
    incarnations = {observation.row.name: observation.incarnation for observation in observations}
    events: list[Event] = []
    after = dict(state)
    present: set[str] = set()
    for group in fan_in(observation.row for observation in observations):
        for window, _ in WINDOWS:
            latest = group.windows.get(window)
            if latest is None:
                continue
            key = f"{group_key(group.agents[0])}/{window}"
            present.add(key)
            before = after.get(key, WindowSeen())
            seen = before.seen_at_ms if now - before.seen_at_ms < SEEN_REFRESH_MS else now
            if before.resets_at_ms is not None and before.resets_at_ms <= now:
                before = WindowSeen()  # the window it fired in has reset: armed again
            if latest.stale or latest.observed_at_ms < before.snapshot_at_ms:  # nothing new of the account
                after[key] = WindowSeen(before.fired, before.resets_at_ms, seen, before.snapshot_at_ms)
                continue
            at = latest.observed_at_ms
            if latest.reset_passed(now):  # its percent no longer describes the account
                after[key] = WindowSeen(seen_at_ms=seen, snapshot_at_ms=at)
                continue
            fired = frozenset(threshold for threshold in thresholds if latest.used_percent >= threshold)
            for threshold in sorted(fired - before.fired):
                events.append(RateLimitEvent(
                    "rate-limit", latest.source, incarnations.get(latest.source.name) or "", threshold, now,
                    group=group, snapshot=latest,
                ))  # fmt: skip
            after[key] = WindowSeen(fired, latest.resets_at_ms, seen, at)
    for key in [] if partial else [key for key, seen in after.items() if key not in present]:
        if now - after[key].seen_at_ms >= HARNESS_CONTEXT_STALE_MS:
            del after[key]
    return events, after


class _SeenWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    fired: list[float] = []
    resets_at_ms: int | None = Field(default=None, alias="resetsAtMs")
    seen_at_ms: int = Field(default=0, alias="seenAtMs")
    snapshot_at_ms: int = Field(default=0, alias="snapshotAtMs")


class _StateWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_id: Literal["hctx.watch-accounts.v1"] = Field(alias="schema")
    windows: dict[str, _SeenWire]


def dump_account_state(state: AccountState) -> bytes:
    return dump_windows(ACCOUNT_STATE_SCHEMA, {
        key: {"fired": sorted(seen.fired), "resetsAtMs": seen.resets_at_ms, "seenAtMs": seen.seen_at_ms,
              "snapshotAtMs": seen.snapshot_at_ms}
        for key, seen in state.items()
    })  # fmt: skip


def load_account_state(data: bytes) -> dict[str, WindowSeen]:
    """Raises RecordRefused (a ValueError) for a file that is not an account watch state."""
    return {
        key: WindowSeen(frozenset(seen.fired), seen.resets_at_ms, seen.seen_at_ms, seen.snapshot_at_ms)
        for key, seen in parse_state(_StateWire, data).windows.items()
    }


class AccountWatch:
    """The account half of one watch: its state file beside the agents' one, under the same lock."""

    def __init__(self, state_file: StateFile, thresholds: tuple[float, ...]) -> None:
        self.thresholds = thresholds
        self.file = CompanionFile(state_file, "accounts", load_account_state, dump_account_state, "no rate limit told")
        self.state: dict[str, WindowSeen] = {}
        # Every agent's newest observation: a file event's tick observes only the agents it named,
        # and an account's newest snapshot is across all of its agents; `members`, the agents of
        # each group (`group_key`), so such a tick steps only the accounts of the agents it named.
        self.held: dict[str, Observation] = {}
        self.members: dict[str, set[str]] = {}

    def load(self, dir_fd: int) -> None:
        self.state = self.file.read(dir_fd) or {}

    def step(self, dir_fd: int, snapshot: list[Observation], now: int, *, partial: bool = False) -> list[Event]:
        """The events, with the state saved first (a failed save is said, and the events still go).
        `partial`: `snapshot` is only the agents that changed; the others are as last observed."""
        if not partial:
            self.held, self.members = {}, {}
        touched: set[str] = set()
        for observation in snapshot:
            name, key = observation.row.name, group_key(observation.row)
            held = self.held.get(name)
            if held is not None and (was := group_key(held.row)) != key:
                self.members[was].discard(name)
                touched.add(was)
            self.held[name] = observation
            self.members.setdefault(key, set()).add(name)
            touched.add(key)
        stepped = (self.held[name] for key in touched for name in self.members.get(key, ()))
        events, after = account_step(self.state, stepped, now, self.thresholds, partial=partial)
        if after != self.state:
            self.file.save(dir_fd, after)
            self.state = after
        return events
