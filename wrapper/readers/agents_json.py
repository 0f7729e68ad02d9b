"""`hctx agents --json`'s objects and every `--json` listing's array.

Apart from the text renderer (wrapper.readers.render, which re-exports all of this) so the JSON
path loads only what it prints: a status bar or a script runs `hctx agents --json` every few
seconds, and the tables, tints, forecasts and their imports are no part of its answer (issue 38).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from wrapper.readers.accounts import WINDOWS, AccountGroup, fan_in, groups_by_agent
from wrapper.readers.roster import AgentRow

__all__ = [
    "account_limits_wire",
    "agent_wire",
    "clock",
    "encode",
    "render_agent_json",
    "render_agents_json",
    "render_json_array",
]

# One object, compact, through json's C encoder; text stays text (no \\u escapes), and a NaN is refused.
encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def render_json_array(objects: list[dict[str, Any]]) -> str:
    """What every `--json` listing prints: one JSON array, one object per line. Greppable, and
    compact enough for json's C encoder (an indented dump is the pure-Python one, several times
    slower on a 10,000-agent roster)."""
    if not objects:
        return "[]\n"
    return "[\n" + ",\n".join(encode(item) for item in objects) + "\n]\n"


def clock(now: int | None) -> int:
    """`now`, or this host's clock in ms when the caller gave none."""
    return time.time_ns() // 1_000_000 if now is None else now


def account_limits_wire(group: AccountGroup | None, row: AgentRow, now: int) -> dict[str, Any] | None:
    """`hctx agents --json`'s `accountRateLimits`: the account's newest snapshot per window, each
    with `fromAnotherAgent` (the agent's own snapshot is older, or it has none); null when the
    group has none."""
    if group is None or not group.windows:
        return None
    out: dict[str, Any] = {"account": group.key, "agentCount": len(group.agents)}
    for window, _ in WINDOWS:
        snapshot = group.windows.get(window)
        out[window] = None if snapshot is None else {
            **snapshot.wire(now), "fromAnotherAgent": snapshot.source.name != row.name,
        }  # fmt: skip
    return out


def agent_wire(row: AgentRow, groups: Mapping[str, AccountGroup], now: int) -> dict[str, Any]:
    """One object of `hctx agents --json`: the row, and its account's figure fanned in from `groups`."""
    return {**row.wire(), "accountRateLimits": account_limits_wire(groups.get(row.name), row, now)}


def render_agents_json(
    rows: list[AgentRow], *, now: int | None = None, roster: Iterable[AgentRow] | None = None
) -> str:
    """`roster`: the rows the accounts are fanned in from (default `rows`)."""
    groups = groups_by_agent(fan_in(rows if roster is None else roster))
    return render_json_array([agent_wire(row, groups, clock(now)) for row in rows])


def render_agent_json(row: AgentRow, *, now: int | None = None, roster: Iterable[AgentRow] | None = None) -> str:
    groups = groups_by_agent(fan_in([row] if roster is None else roster))
    return encode(agent_wire(row, groups, clock(now))) + "\n"
