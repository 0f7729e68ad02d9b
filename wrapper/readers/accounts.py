"""The fan-in (issue 29): one account's rate limits, from every agent that shares it.

Every record carries the rate limits its harness last reported, per agent; agents on one account
repeat one account-scoped number at different ages. `fan_in` groups the roster's rows by the
record's `account.key` (else the one a running agent's claim names, known from its launch) and
takes, per window, the newest snapshot across the group: its percent, its reset time, its age and
the agent it came from. A snapshot is dated by when its figure arrived from the service (the
record's `rateLimitsAtMs`, issue 35), not by the reading holding it: an idle Claude seat redraws
limits it heard minutes ago in every fresh reading, and must not pass for the account's newest. A
row that states no account is a group of its own (key null): nothing is merged on a guess. Plain
data, nothing read or written here, so `hctx accounts`, `agents`, `top`, `metrics`, `watch` and
the web board share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from guard.account import Account
from guard.constants import HARNESS_CONTEXT_STALE_MS
from guard.glance import snapshot_at_ms
from wrapper.readers.roster import AgentRow

__all__ = [
    "DEFAULT_RATE_LIMIT_AT",
    "WINDOWS",
    "AccountGroup",
    "Snapshot",
    "Window",
    "account_of",
    "agent_snapshots",
    "fan_in",
    "group_key",
    "groups_by_agent",
]

Window = Literal["fiveHour", "sevenDay"]
# `hctx watch --rate-limit-at`'s default: the meter's amber and red, on the account's percent.
DEFAULT_RATE_LIMIT_AT: Final[tuple[float, ...]] = (80, 95)
# The record's windows, and how `hctx metrics` and `watch` spell them.
WINDOWS: Final[tuple[tuple[Window, str], ...]] = (("fiveHour", "five_hour"), ("sevenDay", "seven_day"))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One window of one account: the newest agent's number for it, and how old that is."""

    window: Window
    used_percent: float
    resets_at_ms: int | None  # as the harness stated it; None unstated
    observed_at_ms: int
    age_ms: int
    stale: bool  # past the hour horizon: shown, never acted on
    source: AgentRow

    def reset_passed(self, now: int) -> bool:
        """The window reset after this snapshot was taken: its percent no longer describes the account."""
        return self.resets_at_ms is not None and self.resets_at_ms <= now

    def wire(self, now: int) -> dict[str, Any]:
        return {
            "usedPercent": self.used_percent,
            "resetsAtMs": self.resets_at_ms,
            "resetPassed": self.reset_passed(now),
            "observedAtMs": self.observed_at_ms,
            "ageMs": self.age_ms,
            "stale": self.stale,
            "agent": self.source.name,
        }


@dataclass(frozen=True, slots=True)
class AccountGroup:
    """The agents one account key groups (or one agent that states no account), with the newest
    snapshot of each window any of them carries."""

    key: str | None
    label: str | None
    agents: tuple[AgentRow, ...]
    windows: dict[Window, Snapshot]

    @property
    def name(self) -> str:
        """How a message names it: the label, else the agent that is its own group."""
        if self.label:
            return self.label
        if self.key is None:
            return self.agents[0].name
        return f"account {self.key[:8]}"

    def wire(self, now: int) -> dict[str, Any]:
        return {
            "account": self.key,
            "label": self.label,
            "agents": [row.name for row in self.agents],
            "agentCount": len(self.agents),
            "rateLimits": {
                window: None if (snapshot := self.windows.get(window)) is None else snapshot.wire(now)
                for window, _ in WINDOWS
            },
        }


def account_of(row: AgentRow) -> Account | None:
    """The record's `account` on a roster row, else the one its running claim names (a seat counts
    toward its account from its launch, before its first reading: issue 35), or None."""
    account = None if row.context is None else row.context.account
    return row.claimed_account if account is None else account


def group_key(row: AgentRow) -> str:
    """What groups a row: its account key, else the agent itself (its own group, never merged)."""
    account = account_of(row)
    return f"account:{account.key}" if account is not None else f"agent:{row.name}"


def _snapshot(row: AgentRow, window: Window, attribute: str) -> Snapshot | None:
    """`attribute`: the window's name on the record's models (WINDOWS' second column)."""
    context = row.context
    if context is None or context.rate_limits is None:
        return None
    percent: float | None = getattr(context.rate_limits, attribute)
    if percent is None:
        return None
    resets, times = context.rate_limit_resets_at_ms, context.rate_limits_at_ms
    reading_ms = context.observed_at_ms
    arrived: int | None = None if times is None else getattr(times, attribute)
    at_ms = snapshot_at_ms(arrived, reading_ms, reading_ms + context.age_ms)
    age = max(0, context.age_ms + reading_ms - at_ms)
    return Snapshot(
        window=window,
        used_percent=percent,
        resets_at_ms=None if resets is None else getattr(resets, attribute),
        observed_at_ms=at_ms,
        age_ms=age,
        stale=age >= HARNESS_CONTEXT_STALE_MS,
        source=row,
    )


def agent_snapshots(group: AccountGroup) -> Iterator[Snapshot]:
    """Every agent's own snapshot of each window of the group (the history's points, issue 39),
    not only the newest that `fan_in` keeps."""
    for row in group.agents:
        for window, attribute in WINDOWS:
            snapshot = _snapshot(row, window, attribute)
            if snapshot is not None:
                yield snapshot


def _newer(candidate: Snapshot, held: Snapshot | None) -> bool:
    """The newest reading wins; on a tie, the first agent in roster order (host, identity) keeps it,
    so the answer does not depend on the order the directories were listed in."""
    return held is None or candidate.observed_at_ms > held.observed_at_ms


def fan_in(rows: Iterable[AgentRow], *, with_limits_only: bool = True) -> list[AccountGroup]:
    """The account groups of a roster, keyed accounts first (by label, then key), then the agents
    that state none. `with_limits_only` leaves out a group none of whose agents reports a rate limit
    (pi, omp and OpenCode report none): it has nothing to show. One pass, linear in the rows."""
    members: dict[str, list[AgentRow]] = {}
    for row in sorted(rows, key=lambda row: (row.host, row.identity)):
        members.setdefault(group_key(row), []).append(row)
    groups = []
    for key, group in members.items():
        windows: dict[Window, Snapshot] = {}
        label_from: AgentRow | None = None
        newest_ms = -1
        for row in group:
            for window, attribute in WINDOWS:
                snapshot = _snapshot(row, window, attribute)
                if snapshot is not None and _newer(snapshot, windows.get(window)):
                    windows[window] = snapshot
            observed = -1 if row.context is None else row.context.observed_at_ms
            if observed > newest_ms:
                label_from, newest_ms = row, observed
        if with_limits_only and not windows:
            continue
        account = None if label_from is None else account_of(label_from)
        groups.append(
            AccountGroup(
                key=key.removeprefix("account:") if key.startswith("account:") else None,
                label=None if account is None else account.label,
                agents=tuple(group),
                windows=windows,
            )
        )
    groups.sort(key=lambda group: (group.key is None, group.label or "", group.key or "", group.agents[0].name))
    return groups


def groups_by_agent(groups: Iterable[AccountGroup]) -> dict[str, AccountGroup]:
    """Each agent's (`host/identity`) group, among `fan_in`'s."""
    return {row.name: group for group in groups for row in group.agents}
