"""The readers' text: numbers, ages and costs as the columns show them, tints and colour, the
table, `--json` arrays, and the `agents`, `doctor` and `inspect` outputs. Shared by `agents`,
`top`, `scan`, `watch` and `doctor`; it reads nothing and writes only strings.

Every field a record, a claim or a file name supplies is passed through `printable` before it
reaches a terminal, so a hostile tree cannot drive it.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterable, Mapping
from typing import Protocol

from guard.catalog import printable
from guard.constants import (
    HARNESS_CONTEXT_FUTURE_SKEW_MS,
    HARNESS_CONTEXT_HEADROOM_WARN_PERCENT,
    HARNESS_CONTEXT_STALE_MS,
    HARNESS_CONTEXT_WARN_PERCENT,
)
from guard.files import RawFile
from guard.projection import Context, SubagentReading, cache_cold_in_ms
from guard.record import HarnessContext, PromptCache, Subagent, round_half_up
from guard.state import Unobserved
from wrapper.readers.accounts import WINDOWS, AccountGroup, Snapshot, Window, fan_in, group_key, groups_by_agent
from wrapper.readers.agents_json import (
    account_limits_wire,
    agent_wire,
    clock,
    render_agent_json,
    render_agents_json,
    render_json_array,
)
from wrapper.readers.forecast import Forecast
from wrapper.readers.roster import (
    LOG_TAIL_LINES,
    AgentRow,
    Inspection,
    Roster,
    clocks_ahead,
    fill_advised,
    headroom_short,
    unverified_builds,
)
from wrapper.readers.tint import (
    AMBER_PERCENT,
    PERCENT_DIGITS_LIMIT,
    RED_PERCENT,
    Tint,
    colour_enabled,
    paint,
    percent_text,
    percent_tint,
)

__all__ = [
    "ADOPTED_MARK",
    "AMBER_PERCENT",
    "PERCENT_DIGITS_LIMIT",
    "RAW_SHOWN_BYTES",
    "RED_PERCENT",
    "Fill",
    "Forecasts",
    "Tint",
    "account_limits_wire",
    "age_text",
    "agent_wire",
    "cache_text",
    "claim_section",
    "colour_enabled",
    "compaction_text",
    "cost_text",
    "counted",
    "ctx_text",
    "ctx_words",
    "doctor_advisories",
    "fill_tint",
    "forecast_text",
    "headroom_text",
    "limits_text",
    "limits_tint",
    "meter_text",
    "meter_title",
    "paint",
    "percent_text",
    "percent_tint",
    "prompt_cache_text",
    "record_section",
    "render_accounts",
    "render_accounts_json",
    "render_agent_json",
    "render_agents",
    "render_agents_json",
    "render_caches",
    "render_caches_json",
    "render_doctor",
    "render_inspection",
    "render_json_array",
    "reset_text",
    "state_text",
    "subagent_cells",
    "subagent_label",
    "subagent_lines",
    "table",
    "tokens_text",
    "version_text",
    "warm_caches",
]

# A refused record is shown in `inspect` so its damage can be seen, but not megabytes of it.
RAW_SHOWN_BYTES = 4096


class Fill(Protocol):
    """What the fill columns read, on an agent's reading and a subagent's alike (the record's models,
    guard.record, and the projection's, guard.projection)."""

    @property
    def used_percent(self) -> float | None: ...
    @property
    def used_tokens(self) -> int | None: ...
    @property
    def window_tokens(self) -> int | None: ...


# ---------------------------------------------------------------------------------------------
# Colour


def fill_tint(fill: Fill | None) -> Tint:
    """Amber at >= 80%, red at >= 95% of the harness's own percent; no percent, no tint."""
    return percent_tint(None if fill is None else fill.used_percent)


# ---------------------------------------------------------------------------------------------
# Numbers, ages, costs


def counted(count: int, noun: str) -> str:
    """`1 agent`, `3 agents`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def ctx_text(context: Context | None) -> str:
    """The roster's compact column: `ctx:92% ⟳1`, `ctx:-`, `ctx:?`, with ` stale`."""
    if context is None:
        return "ctx:-"
    return ctx_words(context.used_percent, context.compactions, context.stale)


def ctx_words(percent: float | None, compactions: int | None, stale: bool) -> str:
    """`ctx_text` of a reading's three numbers (a subagent's, whose compactions may be unstated)."""
    text = "ctx:?" if percent is None else f"ctx:{percent_text(percent)}"
    if compactions:
        text += f" ⟳{compactions}"
    if stale:
        text += " stale"
    return text


def tokens_text(tokens: int | None) -> str:
    """`127k` style: whole thousands below a million, then millions to one decimal."""
    if tokens is None:
        return "?"
    if tokens < 1000:
        return str(tokens)
    if round_half_up(tokens / 1000) < 1000:
        return f"{round_half_up(tokens / 1000)}k"
    millions = round_half_up(tokens / 100_000) / 10
    return f"{millions:g}M"


def headroom_text(context: Context | None) -> str:
    """The headroom column: `→ 12k` tokens to the harness's own compaction, `→ -3k` past it, `-`
    where the harness states no compaction point (or the reading no count)."""
    headroom = None if context is None else context.headroom_tokens
    if headroom is None:
        return "-"
    return f"→ {'-' if headroom < 0 else ''}{tokens_text(abs(headroom))}"


def cache_text(context: Context | None, now: int) -> str:
    """The prompt cache column (issue 37): `warm 3m12s` until it goes cold, `cold ↻750k` (the tokens
    the next turn writes again), `-` where the harness states no cache."""
    cache = None if context is None else context.prompt_cache
    if cache is None:
        return "-"
    left = cache_cold_in_ms(cache, now)
    if left:
        return f"warm {age_text(left)}"
    recache = cache.recache_tokens_if_cold
    return "cold" + ("" if recache is None else f" ↻{tokens_text(recache)}")


def meter_title(fill: Fill | None) -> str:
    """The meter as a sentence, the web chip's title: `170k of 200k tokens`; empty as `meter_text`."""
    meter = meter_text(fill)
    return meter.replace("/", " of ", 1) + " tokens" if meter else ""


def meter_text(fill: Fill | None) -> str:
    """The decision record's `127k/200k`; empty when neither count is known."""
    if fill is None or (fill.used_tokens is None and fill.window_tokens is None):
        return ""
    return f"{tokens_text(fill.used_tokens)}/{tokens_text(fill.window_tokens)}"


def age_text(age_ms: int) -> str:
    seconds = age_ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def cost_text(cost: float | None) -> str:
    if cost is None:
        return "-"
    if cost == 0 or abs(cost) >= 1:
        return f"${cost:,.2f}"
    # Below a dollar, three significant digits: a per-message cost of $0.0123 is not "$0.01".
    decimals = max(2, 2 - math.floor(math.log10(abs(cost))))
    return f"${cost:.{decimals}f}"


def _ms_text(ms: int) -> str:
    try:
        stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{ms} ({stamp.isoformat(timespec='milliseconds').replace('+00:00', 'Z')})"


# ---------------------------------------------------------------------------------------------
# Tables and JSON


def table(rows: Iterable[list[tuple[str, Tint]]], header: list[str], colour: bool) -> str:
    """Left-aligned columns; widths from the plain text, colour applied after padding."""
    body = list(rows)
    widths = [len(title) for title in header]
    for cells in body:
        for index, (text, _) in enumerate(cells):
            widths[index] = max(widths[index], len(text))
    lines = ["  ".join(title.ljust(width) for title, width in zip(header, widths, strict=True)).rstrip()]
    for cells in body:
        padded = [
            paint(text, tint, colour) + " " * (width - len(text))
            for (text, tint), width in zip(cells, widths, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# `hctx agents`: its `--json` (and every listing's array) is wrapper.readers.agents_json's, re-exported here


ADOPTED_MARK = " (adopted)"


def state_text(row: AgentRow) -> str:
    """The DESIRED cell: the derived state, marked when the harness was adopted (issue 36), which
    `agents`, `top` and the board show alike."""
    return (row.desired_state or "-") + (ADOPTED_MARK if row.adopted else "")


def render_agents(
    rows: list[AgentRow], *, colour: bool, now: int | None = None, roster: Iterable[AgentRow] | None = None
) -> str:
    """The table; LIMITS is each agent's account's current figure (`limits_text`), fanned in from
    `roster` (default `rows`), and shown only when some agent has one."""
    if not rows:
        return "no agents\n"
    now = clock(now)
    groups = groups_by_agent(fan_in(rows if roster is None else roster))
    limits = [limits_text(groups.get(row.name), row, now) for row in rows]
    with_limits = any(text != "-" for text, _ in limits)
    caches = [cache_text(row.context, now) for row in rows]
    with_cache = any(text != "-" for text in caches)  # only a harness that states its cache has one
    header = ["HOST", "AGENT", "HARNESS", "DESIRED", "CONTEXT", "TOKENS", "HEADROOM", "AGE", "COST"]
    header += ["LIMITS"] if with_limits else []
    header += ["CACHE"] if with_cache else []
    body = []
    for row, limit, cache in zip(rows, limits, caches, strict=True):
        context = row.context
        body.append([
            (row.host, None),
            (row.identity, None),
            (row.named_harness or "-", None),
            (state_text(row), None),
            (ctx_text(context), None),
            (meter_text(context), fill_tint(context)),
            (headroom_text(context), None),
            ("-" if context is None else age_text(context.age_ms), None),
            (cost_text(None if context is None else context.cost_usd), None),
            *([limit] if with_limits else []),
            *([(cache, None)] if with_cache else []),
        ])  # fmt: skip
        # A subagent's limits and cache are its agent's.
        below = [("", None)] * (int(with_limits) + int(with_cache))
        body += [[*subagent_cells(sub), *below] for sub in (() if context is None else context.subagents)]
    return table(body, header, colour)


def subagent_label(sub: Subagent) -> str:
    """How every reader names a subagent under its agent: `└ general-purpose a91242bfc47ae887`."""
    return f"└ {printable(sub.name or 'subagent')} {printable(sub.id[:16])}"


def subagent_cells(sub: SubagentReading) -> list[tuple[str, Tint]]:
    """One subagent's row, indented under its agent's (issue 28): its own fill, never the agent's."""
    return [
        ("", None),
        (f"  {subagent_label(sub)}", None),
        (printable(sub.model or ""), None),
        (sub.state, None),
        (ctx_words(sub.used_percent, sub.compactions, False), None),
        (meter_text(sub), fill_tint(sub)),
        ("-", None),
        (age_text(sub.age_ms), None),
        ("", None),
    ]


# ---------------------------------------------------------------------------------------------
# `hctx doctor` (HC-R17): the rules are wrapper.readers.roster's, the words are these


def doctor_advisories(roster: Roster) -> list[str]:
    """The spec's two cases, then one line per host whose clock runs past the future skew; nothing
    for absent, refused or fresh below-threshold readings."""
    lines = []
    for row in roster.rows:
        context = row.context
        if context is None:
            continue
        age = age_text(context.age_ms)
        if (percent := context.used_percent) is not None and fill_advised(context):
            tokens = meter_text(context)
            lines.append(
                f"advisory: {row.name}: context fill {percent_text(percent)}"
                + (f" ({tokens} tokens)" if tokens else "")
                + f", at or above {HARNESS_CONTEXT_WARN_PERCENT}%; reading {age} old"
            )
        if headroom_short(context):
            lines.append(
                f"advisory: {row.name}: {headroom_text(context)} tokens"
                f" to the harness's own compaction at {tokens_text(context.compact_at_tokens)}"
                f", under {HARNESS_CONTEXT_HEADROOM_WARN_PERCENT}% of the {tokens_text(context.window_tokens)}"
                f" window; reading {age} old"
            )
        if row.desired_state != "running":
            continue
        if context.stale:
            lines.append(
                f"advisory: {row.name}: context record stale while desired state is running; "
                f"the numbers are {age} old, older than the {age_text(HARNESS_CONTEXT_STALE_MS)} horizon"
            )
        harness, version = context.harness, context.harness_version
        if version is not None and (verified := unverified_builds(harness, version)) is not None:
            lines.append(
                f"advisory: {row.name}: {harness} {printable(version)} is not a verified build "
                f"(verified: {', '.join(verified)}); its numbers follow arithmetic measured on those"
            )
    for host, group in clocks_ahead(roster.rows).items():
        most = max(row.ahead_ms or 0 for row in group)
        names = ", ".join(row.name for row in group)
        lines.append(
            f"advisory: host {host}: clock ahead of this host's by at least {age_text(most)} "
            f"({most} ms), past the {age_text(HARNESS_CONTEXT_FUTURE_SKEW_MS)} skew bound; "
            f"context read as absent for {names}"
        )
    return lines


def render_doctor(roster: Roster) -> str:
    """The advisories, or one line saying there are none."""
    advisories = doctor_advisories(roster)
    if not advisories:
        return f"ok: {counted(len(roster.rows), 'agent')}, no advisories\n"
    return "".join(f"{line}\n" for line in advisories)


# ---------------------------------------------------------------------------------------------
# `hctx inspect`


def _raw_text(raw: RawFile) -> list[str]:
    if raw.absent:
        return ["  (no file)"]
    if raw.data is None:
        return [f"  ({raw.problem})"]
    shown = raw.data[:RAW_SHOWN_BYTES].decode("utf-8", errors="replace")
    lines = [f"  {printable(line)}" for line in shown.splitlines() or [""]]
    if len(raw.data) > RAW_SHOWN_BYTES:
        lines.append(f"  … ({len(raw.data) - RAW_SHOWN_BYTES} more bytes not shown)")
    return lines


def compaction_text(record: HarnessContext) -> str:
    """Where this harness compacts on its own, as the record says, and why a null is null."""
    if record.compact_at_tokens is not None:
        return f"at {record.compact_at_tokens} tokens, by the harness's own settings"
    if record.auto_compaction is False:
        return "auto-compaction off (the harness's own settings)"
    return "point not stated by the harness"


def _unobserved_text(gaps: list[Unobserved], indent: str) -> list[str]:
    """Each stretch the session ran with no sidecar watching: its readings then were never written."""
    lines = []
    for gap in gaps:
        since = _ms_text(gap.since_ms)
        if gap.until_ms is None:
            span = f"from {since}, never replaced"
        else:
            ms = max(0, gap.until_ms - gap.since_ms)
            span = f"{age_text(ms) if ms >= 60_000 else f'{ms / 1000:.1f}s'} from {since}"
        lines.append(f"{indent}unobserved {span}: sidecar pid {gap.sidecar_pid} {gap.how_it_ended()}")
    return lines


def version_text(record: HarnessContext) -> str:
    """`2.1.332 (verified)`, `2.2.0 (not verified: 2.1.250, 2.1.332)`, or why there is none."""
    version = record.harness_version
    if version is None:
        return "not named by the channel"
    verified = unverified_builds(record.harness, version)
    verdict = "verified" if verified is None else f"not verified: {', '.join(verified)}"
    return f"{printable(version)} ({verdict})"


def record_section(inspection: Inspection) -> list[str]:
    """`inspect`'s record as stored, with what it says of itself: also the web board's agent page."""
    view = inspection.view
    row = view.row
    out = [f"== record as stored: {inspection.record_path}"]
    out.extend(_raw_text(view.files.record))
    if view.record is not None:
        out.append(f"  incarnation   {printable(view.record.incarnation)}")
        out.append(f"  observedAtMs  {_ms_text(view.record.observed_at_ms)}")
        out.append(f"  writtenAtMs   {_ms_text(view.record.written_at_ms)}")
        out.append(f"  compaction    {compaction_text(view.record)}")
        out.append(f"  harness build {version_text(view.record)}")
        if view.record.session_id is not None:
            out.append(f"  session       {printable(view.record.session_id)}")
        if view.record.prompt_cache is not None:
            out.append(f"  prompt cache  {prompt_cache_text(view.record)}")
        out.extend(subagent_lines(view.record))
    if row.problem:
        out.append(f"  ! {row.problem}")
    out.append(f"  incarnation check: {inspection.incarnation}")
    return out


def prompt_cache_text(record: HarnessContext) -> str:
    """`inspect`'s prompt cache (issue 37), each figure as the harness stated it."""
    cache = record.prompt_cache
    if cache is None:
        return "not stated"
    expiry = "not stated" if cache.expires_at_ms is None else _ms_text(cache.expires_at_ms)
    figures = {
        "ttl": cache.ttl,
        "hit ratio": None if cache.hit_ratio is None else f"{cache.hit_ratio:.3f}",
        "re-cache if cold": None if cache.recache_tokens_if_cold is None else f"{cache.recache_tokens_if_cold} tokens",
        "requests": cache.requests,
        "misses": cache.misses,
    }
    stated = "  ".join(f"{name} {value}" for name, value in figures.items() if value is not None)
    return f"{'warm' if cache.warm else 'cold'}  goes cold at {expiry}  {stated}".rstrip()


def subagent_lines(record: HarnessContext) -> list[str]:
    """`inspect`'s subagents (issue 28): each row's own numbers, where its window came from, its
    state and when it was observed; never the agent's."""
    out = []
    for sub in record.subagents:
        window = {"harness": "stated by the harness", "model-table": "from the model table"}.get(
            sub.window_source or "", "not stated"
        )
        compactions = "not stated" if sub.compactions is None else str(sub.compactions)
        shown = ctx_words(sub.used_percent, sub.compactions, False)
        out.append(f"  subagent      {subagent_label(sub)}  {sub.state}  {shown}"
                   f"  {meter_text(sub) or '?/?'}  model {printable(sub.model or '?')}  window {window}"
                   f"  compactions {compactions}  observedAtMs {_ms_text(sub.observed_at_ms)}")  # fmt: skip
    return out


def claim_section(inspection: Inspection) -> list[str]:
    """`inspect`'s claim with its history: a crash loop and the stretches without a sidecar."""
    view = inspection.view
    row = view.row
    out = [f"== harness-state claim: {inspection.claim_path}"]
    claim = view.claim
    if claim is None:
        out.extend(_raw_text(view.files.claim) if row.claim_problem is None else [f"  ! {row.claim_problem}"])
        return out
    out.append(f"  harness       {claim.harness}")
    out.append(f"  host          {printable(claim.host)}")
    out.append(f"  incarnation   {printable(claim.incarnation)}")
    out.append(f"  claimedAtMs   {_ms_text(claim.claimed_at_ms)}")
    out.append(f"  wrapperPid    {claim.wrapper_pid}")
    out.append(f"  desiredState  {claim.desired_state} (as written; derived now: {row.desired_state})")
    if claim.adopted:
        out.append("  adopted       yes: started without `hctx wrap`; `hctx adopt` (wrapperPid) watches it")
    out.extend(_unobserved_text(claim.unobserved, "  "))
    out.append(f"  launches in the last hour: {inspection.launches_last_hour}")
    out.append(f"  history ({len(claim.history)} earlier claims, newest first):")
    for past in claim.history:
        out.append(
            f"    {printable(past.incarnation)}  claimedAtMs {_ms_text(past.claimed_at_ms)}  pid {past.wrapper_pid}"
        )
        out.extend(_unobserved_text(past.unobserved, "      "))
    return out


def render_inspection(inspection: Inspection) -> str:
    row = inspection.view.row
    out = [f"agent {row.name}", "", *record_section(inspection), "", *claim_section(inspection), ""]

    out.append("== projection (the roster's context)")
    context = None if row.context is None else row.context.wire()
    projected = json.dumps(context, ensure_ascii=False, allow_nan=False, indent=2)
    out.extend(f"  {printable(line)}" for line in projected.splitlines())
    out.append(f"  {ctx_text(row.context)}  {meter_text(row.context)}".rstrip())
    out.append("")

    out.append(f"== log: {inspection.log_path} (last {LOG_TAIL_LINES} lines)")
    if inspection.log_problem:
        out.append(f"  ! log {inspection.log_problem}")
    elif inspection.log_tail is None:
        out.append("  (no log file)")
    else:
        out.extend(f"  {line}" for line in inspection.log_tail)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# `hctx accounts`, and the account's figure beside an agent (issue 29)

_WINDOW_SHORT = {"fiveHour": "5h", "sevenDay": "7d"}


def reset_text(resets_at_ms: int | None, now: int) -> str:
    """`in 2h13m`, `passed 4m00s ago`, or `-` when the harness stated no reset time."""
    if resets_at_ms is None:
        return "-"
    if resets_at_ms <= now:
        return f"passed {age_text(now - resets_at_ms)} ago"
    return f"in {age_text(resets_at_ms - now)}"


def limits_tint(snapshots: Iterable[Snapshot], now: int) -> Tint:
    """The meter's tints on the account's percent: amber from 80, red from 95; a snapshot past its
    reset or the hour horizon is not the account's state and is not tinted."""
    current = [snap.used_percent for snap in snapshots if not snap.stale and not snap.reset_passed(now)]
    return percent_tint(max(current)) if current else None


def limits_text(group: AccountGroup | None, row: AgentRow, now: int) -> tuple[str, Tint]:
    """The account's current figure beside one agent: `5h 44% 7d 61%`, each window the newest
    snapshot across the account's agents; `*` after a window whose figure is another agent's (this
    agent's own snapshot of it is older, or it has none); `-` where there is none."""
    if group is None or not group.windows:
        return "-", None
    parts = []
    for window, _ in WINDOWS:
        snapshot = group.windows.get(window)
        if snapshot is None:
            continue
        text = f"{_WINDOW_SHORT[window]} {percent_text(snapshot.used_percent)}"
        if snapshot.reset_passed(now):
            text += " reset"
        elif snapshot.stale:
            text += " stale"
        if snapshot.source.name != row.name:
            text += "*"
        parts.append(text)
    return " ".join(parts), limits_tint(group.windows.values(), now)


Forecasts = Mapping[tuple[str, Window], Forecast]  # wrapper.rate_history.forecasts, keyed (group key, window)


# ---------------------------------------------------------------------------------------------
# `hctx cache`: the fleet's prompt caches by expiry (issue 37)


def warm_caches(rows: Iterable[AgentRow], now: int) -> list[tuple[AgentRow, PromptCache, int]]:
    """Each agent whose harness states a warm prompt cache with an expiry, its cache and the
    milliseconds until it goes cold (`cache_cold_in_ms`), soonest first; then by host and name."""
    found = []
    for row in rows:
        cache = None if row.context is None else row.context.prompt_cache
        left = cache_cold_in_ms(cache, now)
        if cache is not None and left is not None:
            found.append((row, cache, left))
    return sorted(found, key=lambda item: (item[2], item[0].host, item[0].identity))


def _utc_clock(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def render_caches(rows: Iterable[AgentRow], now: int, *, colour: bool) -> str:
    """One line per warm cache, soonest to go cold first: when (in and at, UTC), the tokens the turn
    after writes again if it does, and the ttl and hit ratio where the harness stated them."""
    caches = warm_caches(rows, now)
    if not caches:
        return "no warm prompt cache stated\n"
    header = ["HOST", "AGENT", "HARNESS", "COLD IN", "AT", "RE-CACHE", "TTL", "HIT"]
    body: list[list[tuple[str, Tint]]] = [[
        (row.host, None),
        (row.identity, None),
        (row.named_harness or "-", None),
        ("now" if left == 0 else age_text(left), None),
        (_utc_clock(cache.expires_at_ms or now), None),
        ("-" if cache.recache_tokens_if_cold is None else tokens_text(cache.recache_tokens_if_cold), None),
        (cache.ttl or "-", None),
        ("-" if cache.hit_ratio is None else f"{cache.hit_ratio:.0%}", None),
    ] for row, cache, left in caches]  # fmt: skip
    return table(body, header, colour)


def render_caches_json(rows: Iterable[AgentRow], now: int) -> str:
    """`hctx cache --json`: the same order, each agent's cache as stated and what `watch`'s
    `cache-expiring` event says of it (`cacheExpiresAtMs`, `cacheColdInMs`, `recacheTokensIfCold`)."""
    return render_json_array([
        {"host": row.host, "identity": row.identity, "harness": row.named_harness,
         "cacheExpiresAtMs": cache.expires_at_ms, "cacheColdInMs": left,
         "recacheTokensIfCold": cache.recache_tokens_if_cold,
         "promptCache": cache.model_dump(mode="json", by_alias=True)}
        for row, cache, left in warm_caches(rows, now)
    ])  # fmt: skip


def forecast_text(forecast: Forecast | None, now: int) -> str:
    """`in 1h12m (9 over 42m00s)`, `not before reset (…)`, `- fewer than two snapshots (1 over 0s)`:
    the verdict, and always the number of snapshots and the span it rests on."""
    if forecast is None:
        return "-"
    basis = f"({forecast.points} over {age_text(forecast.span_ms)})"
    if forecast.status == "runs-out" and forecast.exhausted_at_ms is not None:
        when = "now" if forecast.exhausted_at_ms <= now else f"in {age_text(forecast.exhausted_at_ms - now)}"
        return f"{when} {basis}"
    if forecast.status == "not-before-reset":
        return f"not before reset {basis}"
    return f"- {forecast.reason} {basis}"


def _runs_out_cell(forecast: Forecast | None, now: int) -> tuple[str, Tint]:
    """RUNS OUT: red when the window runs out before its reset at this pace."""
    return forecast_text(forecast, now), "red" if forecast is not None and forecast.status == "runs-out" else None


def render_accounts_json(groups: list[AccountGroup], now: int, forecasts: Forecasts | None = None) -> str:
    """With `forecasts`, each window's object carries its `forecast` (wrapper.forecast.Forecast.wire)."""
    items = []
    for group in groups:
        item = group.wire(now)
        if forecasts is not None:
            key = group_key(group.agents[0])
            item |= {"rateLimits": {
                window: None if (snapshot := group.windows.get(window)) is None else {
                    **snapshot.wire(now),
                    "forecast": None if (found := forecasts.get((key, window))) is None else found.wire(),
                }
                for window, _ in WINDOWS
            }}  # fmt: skip
        items.append(item)
    return render_json_array(items)


def render_accounts(groups: list[AccountGroup], now: int, *, colour: bool, forecasts: Forecasts | None = None) -> str:
    """One line per account and window: the newest snapshot, its reset, its age, its agent; with
    `forecasts`, when it runs out at the fleet's pace (RUNS OUT)."""
    if not groups:
        return "no account rate limits reported\n"
    header = ["ACCOUNT", "LABEL", "WINDOW", "USED", "RESETS", *(["RUNS OUT"] if forecasts is not None else []),
              "AGE", "FROM", "AGENTS"]  # fmt: skip
    body = []
    for group in groups:
        key = "-" if group.key is None else group.key[:12]
        label = printable(group.label) if group.label else "(no account stated)"
        grouped = group_key(group.agents[0])
        for window, _ in WINDOWS:
            snapshot = group.windows.get(window)
            if snapshot is None:
                continue
            age = age_text(snapshot.age_ms) + (" stale" if snapshot.stale else "")
            tint = limits_tint([snapshot], now)
            runs_out = [] if forecasts is None else [_runs_out_cell(forecasts.get((grouped, window)), now)]
            body.append([
                (key, None),
                (label, None),
                (_WINDOW_SHORT[window], None),
                (percent_text(snapshot.used_percent), tint),
                (reset_text(snapshot.resets_at_ms, now), None),
                *runs_out,
                (age, None),
                (snapshot.source.name, None),
                (str(len(group.agents)), None),
            ])  # fmt: skip
    return table(body, header, colour)
