"""The readers' command line: `hctx agents`, `accounts`, `doctor`, `inspect` and `top` (the catalog
options every command shares are wrapper.arguments').

Only argparse and the catalog's path are loaded with every `hctx`; each command imports the
roster, the renderer or the top view when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from guard.constants import HARNESS_CONTEXT_HEADROOM_WARN_PERCENT, HARNESS_CONTEXT_WARN_PERCENT
from guard.errors import CatalogError
from wrapper.arguments import add_catalog_options, existing_catalog, fail, quiet_guard_logs, warn, with_host

if TYPE_CHECKING:
    from wrapper.readers.roster import AgentRow

__all__ = [
    "register",
    "run_accounts",
    "run_agents",
    "run_cache",
    "run_doctor",
    "run_inspect",
    "run_top",
    "setup_lines",
]

# ---------------------------------------------------------------------------------------------
# The reader commands


def run_agents(args: argparse.Namespace) -> int:
    from wrapper.readers.accounts import account_of
    from wrapper.readers.agents_json import render_agent_json, render_agents_json
    from wrapper.readers.roster import AgentNotFound, collect_roster, now_ms, resolve_agent, view_agent

    # No quiet_guard_logs(): nothing on this path logs (the roster words every problem as a row's
    # warning), and logging is no part of its start-up (issue 38).
    here, now = args.host, now_ms()
    try:
        catalog = existing_catalog(args)
        if args.agent is not None:
            host, identity = resolve_agent(catalog, args.agent, here=here)
            row = view_agent(catalog, host, identity, now, here=here).row
            warn("agents", row.warnings())
            # The account's figure is fanned in from every agent sharing it, not this one's alone.
            others = collect_roster(catalog, now, here=here).rows if account_of(row) is not None else [row]
            if args.json:
                sys.stdout.write(render_agent_json(row, now=now, roster=others))
            else:
                sys.stdout.write(_agents_table([row], now, others))
            return 0
        roster = collect_roster(catalog, now, here=here)
    except CatalogError as exc:
        return fail("agents", f"cannot read the catalog: {exc}", 2)
    except AgentNotFound as exc:
        return fail("agents", str(exc.args[0]), 1)
    warn("agents", roster.all_warnings())
    if args.json:
        sys.stdout.write(render_agents_json(roster.rows, now=now))
    else:
        sys.stdout.write(_agents_table(roster.rows, now))
    return 0


def _agents_table(rows: list[AgentRow], now: int, roster: list[AgentRow] | None = None) -> str:
    # Imported here: the table's renderer, its tints and what only it needs are no part of a
    # script's `agents --json` (issue 38: that one starts in a few interpreter start-ups).
    from wrapper.readers.render import colour_enabled, render_agents

    return render_agents(rows, colour=colour_enabled(sys.stdout), now=now, roster=roster)


def run_doctor(args: argparse.Namespace) -> int:
    from wrapper.readers.render import render_doctor
    from wrapper.readers.roster import collect_roster, now_ms

    quiet_guard_logs()
    try:
        roster = collect_roster(existing_catalog(args), now_ms(), here=args.host)
    except CatalogError as exc:
        return fail("doctor", f"cannot read the catalog: {exc}", 2)
    sys.stdout.write(render_doctor(roster))
    sys.stdout.write("".join(f"{line}\n" for line in setup_lines(os.environ)))
    return 0  # advisories are never a failure (HC-R17)


def setup_lines(environ: Mapping[str, str]) -> list[str]:
    """A line per installed harness with a setup module (issue 36): whether `hctx setup`'s part is in
    its user files and is this hctx's, read from the files as they are (sidecar.setup_state)."""
    from sidecar.registry import harness_names, setup_state

    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    lines = []
    for harness in harness_names():
        state = setup_state(harness, home, environ)
        if state is None:
            continue
        if state.state == "current":
            lines.append(f"setup: {harness}: in place and current ({state.detail})")
        elif state.state == "not set up":
            lines.append(
                f"setup: {harness}: not set up: a session started without hctx wrap is not seen (hctx setup {harness})"
            )
        elif state.state == "stale":
            lines.append(
                f"setup: {harness}: stale: {state.detail} holds another hctx's commands (an older install, a "
                f"moved venv); run hctx setup {harness} again"
            )
        else:
            lines.append(f"setup: {harness}: cannot tell: {state.detail}")
        lines.extend(f"setup: {harness}: note: {advice}" for advice in state.advice)
    return lines


def run_inspect(args: argparse.Namespace) -> int:
    from wrapper.readers.render import render_inspection
    from wrapper.readers.roster import AgentNotFound, collect_inspection, now_ms, resolve_agent

    quiet_guard_logs()
    here, now = args.host, now_ms()
    try:
        catalog = existing_catalog(args)
        host, identity = resolve_agent(catalog, args.agent, here=here)
        inspection = collect_inspection(catalog, host, identity, now, here=here)
    except CatalogError as exc:
        return fail("inspect", f"cannot read the catalog: {exc}", 2)
    except AgentNotFound as exc:
        return fail("inspect", str(exc.args[0]), 1)
    sys.stdout.write(render_inspection(inspection))
    return 0


def run_accounts(args: argparse.Namespace) -> int:
    from wrapper.readers.accounts import fan_in
    from wrapper.readers.rate_history import keep_groups
    from wrapper.readers.render import colour_enabled, render_accounts, render_accounts_json
    from wrapper.readers.roster import collect_roster, now_ms

    quiet_guard_logs()
    now = now_ms()
    try:
        catalog = existing_catalog(args)
        roster = collect_roster(catalog, now, here=args.host)
    except CatalogError as exc:
        return fail("accounts", f"cannot read the catalog: {exc}", 2)
    warn("accounts", roster.all_warnings())
    groups = fan_in(roster.rows)
    # Issue 39: every agent's snapshot kept in the host-local history, each window forecast from it.
    _, forecasts, problem = keep_groups(catalog, groups, now)
    warn("accounts", [] if problem is None else [problem])
    if args.json:
        sys.stdout.write(render_accounts_json(groups, now, forecasts))
    else:
        sys.stdout.write(render_accounts(groups, now, colour=colour_enabled(sys.stdout), forecasts=forecasts))
    return 0


def run_cache(args: argparse.Namespace) -> int:
    from wrapper.readers.render import colour_enabled, render_caches, render_caches_json
    from wrapper.readers.roster import collect_roster, now_ms

    quiet_guard_logs()
    now = now_ms()
    try:
        roster = collect_roster(existing_catalog(args), now, here=args.host)
    except CatalogError as exc:
        return fail("cache", f"cannot read the catalog: {exc}", 2)
    warn("cache", roster.all_warnings())
    if args.json:
        sys.stdout.write(render_caches_json(roster.rows, now))
    else:
        sys.stdout.write(render_caches(roster.rows, now, colour=colour_enabled(sys.stdout)))
    return 0


def run_top(args: argparse.Namespace) -> int:
    from wrapper.readers.top import run

    quiet_guard_logs()
    try:
        catalog = existing_catalog(args)
    except CatalogError as exc:
        return fail("top", f"cannot read the catalog: {exc}", 2)
    return run(catalog, here=args.host, once=args.once)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agents = commands.add_parser(
        "agents",
        help="list every agent with its context fill",
        description="One row per agent directory of every host in the catalog, sorted by host then identity.",
    )
    agents.add_argument("agent", nargs="?", metavar="ID", help="just this agent (ID or HOST/ID)")
    agents.add_argument(
        "--json",
        action="store_true",
        help="the roster as one JSON array, an object per agent (jq '.[]'); with ID, that agent's object",
    )
    add_catalog_options(agents)
    agents.set_defaults(run=with_host(run_agents))

    accounts = commands.add_parser(
        "accounts",
        help="each account's rate limits, fanned in from every agent that shares it",
        description="Per account (the opaque key a harness's own login yields; never an email or a name) "
        "and window (five-hour, seven-day): the newest snapshot any of its agents' records carries, with "
        "its reset time as the harness stated it, its age, the agent it came from and how many agents "
        "share the account. An agent whose harness states no account is a group of its own; agents whose "
        "harness reports no rate limits (pi, omp, OpenCode) are not listed. A snapshot past the hour "
        "horizon is marked stale; one whose reset time passed no longer describes the account.",
    )
    accounts.add_argument(
        "--json", action="store_true",
        help="one JSON array, an object per account with its `rateLimits` per window (jq '.[]')",
    )  # fmt: skip
    add_catalog_options(accounts)
    accounts.set_defaults(run=with_host(run_accounts))

    cache = commands.add_parser(
        "cache",
        help="the fleet's warm prompt caches, the soonest to go cold first",
        description="One line per agent whose harness states a warm prompt cache (Claude 2.1.332's status "
        "line; issue 37), the soonest to go cold first: in how long and at what time (UTC) it goes cold, the "
        "tokens the turn after a cold cache writes again, its ttl and hit ratio, each as the harness stated "
        "it. An agent whose harness states no cache, or a cold one, is not listed (`hctx agents` shows it).",
    )
    cache.add_argument(
        "--json", action="store_true",
        help="one JSON array in the same order, an object per agent: `cacheExpiresAtMs`, `cacheColdInMs`, "
        "`recacheTokensIfCold` and the `promptCache` as stated (jq '.[]')",
    )  # fmt: skip
    add_catalog_options(cache)
    cache.set_defaults(run=with_host(run_cache))

    doctor = commands.add_parser(
        "doctor",
        help="advise on full windows and stale records",
        description=f"An advisory line per agent at or above {HARNESS_CONTEXT_WARN_PERCENT}% fill, per agent "
        f"under {HARNESS_CONTEXT_HEADROOM_WARN_PERCENT}% of its window from the harness's own compaction point, "
        "per stale record while its desired state is running, and one per host whose clock runs past the "
        "future skew (its records read as absent); then a line per installed harness saying whether `hctx setup` "
        "is in place and current, not set up, or stale; advisories never fail the exit status.",
    )
    add_catalog_options(doctor)
    doctor.set_defaults(run=with_host(run_doctor))

    inspect = commands.add_parser(
        "inspect",
        help="one agent's raw record, claim history and log tail",
        description="The record as stored, the harness-state claim with its history, the projection "
        "and the last lines of the agent's log: for crash-loop inspection.",
    )
    inspect.add_argument("agent", metavar="ID", help="the agent (ID or HOST/ID)")
    add_catalog_options(inspect)
    inspect.set_defaults(run=with_host(run_inspect))

    top = commands.add_parser(
        "top",
        help="a live view of every agent, sorted by fill; scroll, sort and filter from the keyboard",
        description="Full-screen, refreshed every second and within a second of a record changing, with a "
        "summary line (agents per host, how many at or above 80% and 95%, how many stale). Keys: arrows, j/k, "
        "PgUp/PgDn and Home/End (g/G) scroll; f, a and n sort by fill, age or name, s cycles them; / filters "
        "by a substring of the host, harness or name (Enter keeps it, Esc clears it); q or Ctrl-C quits.",
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    add_catalog_options(top)
    top.set_defaults(run=with_host(run_top))
