"""`hctx metrics`: the catalog's agents in the Prometheus exposition formats.

Each agent's files are read through a `CatalogCache`: a scrape `lstat`s every agent's two records
and reads, validates and renders again only the agents whose files changed. What an agent exports
from its record is rendered once, when it is read, as the exposition's own lines; a scrape joins
them, with the two series that move with the clock alone (`hctx_context_stale`, and
`hctx_agent_running`, whose wrapper may have died) decided at that moment. When nothing changed,
the joined text (and its gzip member) of the last scrape is served again.

Two formats, as Prometheus negotiates them: OpenMetrics 1.0 (where `hctx_model` is an `info`
family and the session totals `counter` families) and the classic text format 0.0.4 (info as a
gauge), for the textfile and anything that does not ask for OpenMetrics. The exporter's own series
(build info, scrape duration, read errors, records read, the `process_*` collector) come from
`prometheus_client`, imported by this command only.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import guard
from guard.catalog import AgentFiles, CatalogCache, CatalogSnapshot
from guard.constants import HARNESS_CONTEXT_FUTURE_SKEW_MS, HARNESS_CONTEXT_STALE_MS
from guard.errors import CatalogError
from guard.procs import pid_alive
from guard.projection import headroom_tokens
from guard.record import HarnessContext, RateLimits
from guard.state import HarnessState
from wrapper.arguments import (
    TLS_PAIRING,
    add_catalog_options,
    add_tls_options,
    existing_catalog,
    fail,
    positive_seconds,
    quiet_guard_logs,
    tls_unpaired,
    warn,
    with_host,
)
from wrapper.readers.roster import PidProbe, decode_agent, desired_state, now_ms

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = [
    "ACCOUNT_AGENTS",
    "ACCOUNT_EXHAUSTED",
    "ACCOUNT_FAMILIES",
    "ACCOUNT_OBSERVED",
    "ACCOUNT_RESETS",
    "ACCOUNT_USED",
    "AGENT_FAMILIES",
    "CACHE_EXPIRES",
    "CACHE_FAMILIES",
    "CACHE_RECACHE",
    "CACHE_WARM",
    "DEFAULT_LIMITS",
    "DEFAULT_LISTEN",
    "MODEL",
    "MS",
    "RATE",
    "RATE_WINDOWS",
    "READINGS",
    "RUNNING",
    "STALE",
    "SUBAGENTS_RUNNING",
    "SUBAGENT_FILL",
    "AccountWindow",
    "ExportedAgent",
    "Exporter",
    "Family",
    "Limits",
    "exposition",
    "listen_address",
    "number_text",
    "register",
    "run_metrics",
]

DEFAULT_LISTEN = ("127.0.0.1", 9478)
MS = 1000  # ms / 1000 is the double nearest the seconds; ms * 0.001 is not always


def _connections(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return int(text)


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's bounds (wrapper.readers.metrics_server says what each one does)."""

    connections: int = 256
    header_s: float = 10.0
    idle_s: float = 60.0


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family; `name` as OpenMetrics spells it (a counter's and an info's samples add
    `_total` and `_info`)."""

    name: str
    kind: Literal["gauge", "counter", "info"]
    help: str

    @property
    def sample(self) -> str:
        return self.name + {"gauge": "", "counter": "_total", "info": "_info"}[self.kind]

    def header(self, openmetrics: bool) -> str:
        if openmetrics:
            return f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        kind = "gauge" if self.kind == "info" else self.kind  # the text format has no info type
        return f"# HELP {self.sample} {self.help}\n# TYPE {self.sample} {kind}\n"


def _gauge(name: str, text: str) -> Family:
    return Family(name, "gauge", text)


# The family, the roster's `context` key, the divisor to the series' unit.
READINGS: tuple[tuple[Family, str, int], ...] = (
    (_gauge("hctx_context_used_tokens", "Tokens in the context window, the harness's own count."), "usedTokens", 1),
    (_gauge("hctx_context_window_tokens", "The context window in tokens, as the harness reports it."),
     "windowTokens", 1),
    (_gauge("hctx_context_used_percent", "Context window fill in percent, the harness's own number, never clamped."),
     "usedPercent", 1),
    (Family("hctx_context_compactions", "counter",
            "Compactions in this incarnation. A counter: it only rises while the agent runs and starts again at 0 "
            "when it is relaunched, which rate() and increase() take for a counter reset."), "compactions", 1),
    (_gauge("hctx_context_last_compaction_timestamp_seconds", "When the last compaction happened, in Unix time."),
     "lastCompactionMs", MS),
    (_gauge("hctx_context_compact_at_tokens", "Tokens at which the harness compacts on its own, by its own settings."),
     "compactAtTokens", 1),
    (_gauge("hctx_context_headroom_tokens", "Tokens left before the harness's own compaction point; negative past it."),
     "headroomTokens", 1),
    (Family("hctx_session_tokens", "counter",
            "Tokens the session processed in all, as the harness reports it. A counter: the session's running "
            "total, which a new session starts again (a counter reset to rate() and increase())."),
     "sessionTotalTokens", 1),
    (Family("hctx_session_cost_usd", "counter",
            "The session's cost in US dollars so far, as the harness reports it. A counter: a running total that "
            "a new session starts again (a counter reset to rate() and increase())."), "costUsd", 1),
    (_gauge("hctx_context_observed_timestamp_seconds", "When the reading was taken, in Unix time; never re-stamped."),
     "observedAtMs", MS),
)  # fmt: skip
RATE = _gauge("hctx_rate_limit_used_percent", "Account rate-limit window used, in percent, as the harness reports it.")
# The record's account rate-limit windows, as the `window` label spells them.
RATE_WINDOWS = (("fiveHour", "five_hour"), ("sevenDay", "seven_day"))
MODEL = Family("hctx_model", "info", "The model the harness reported; join it on by host and agent.")
STALE = _gauge("hctx_context_stale", "1 when the reading is older than the 60-minute horizon, else 0.")
RUNNING = _gauge("hctx_agent_running", "1 when the agent's desired state is running, 0 when stopped.")
# In exposition order; the last two move with the clock and are decided at every scrape.
# Issue 28, bounded cardinality: per agent, never per subagent id.
SUBAGENTS_RUNNING = _gauge("hctx_subagents_running", "Subagents of the agent its harness states running.")
SUBAGENT_FILL = _gauge(
    "hctx_subagent_max_used_percent",
    "The highest fill among the agent's subagents, in percent, each its harness's own number.",
)
# Issue 37: the prompt cache as the harness states it (Claude 2.1.332's status line); each family has
# no sample where the harness does not state that figure, so a harness with no cache has none.
CACHE_WARM = _gauge("hctx_prompt_cache_warm", "1 while the harness states its prompt cache warm, 0 once it is cold.")
CACHE_EXPIRES = _gauge(
    "hctx_prompt_cache_expires_timestamp_seconds",
    "When the warm prompt cache goes cold, as the harness stated it, in Unix time.",
)
CACHE_RECACHE = _gauge(
    "hctx_prompt_cache_recache_tokens",
    "Tokens the next turn writes to the cache again if it has gone cold, as the harness stated it.",
)
CACHE_FAMILIES = (CACHE_WARM, CACHE_EXPIRES, CACHE_RECACHE)
AGENT_FAMILIES: tuple[Family, ...] = (
    *(family for family, _, _ in READINGS), RATE, MODEL, SUBAGENTS_RUNNING, SUBAGENT_FILL, *CACHE_FAMILIES, STALE,
    RUNNING,
)  # fmt: skip
_STATIC = len(AGENT_FAMILIES) - 2
# Issue 29: per account and window, the newest snapshot across the agents whose records name the
# account (wrapper.readers.accounts.fan_in's rule), labelled by the opaque key, never the label: the
# series stay few and free of personal data. After the agents' families, from the readable ones.
ACCOUNT_USED = _gauge(
    "hctx_account_rate_limit_used_percent",
    "Account rate-limit window used, in percent: the newest snapshot across the account's agents.",
)
ACCOUNT_OBSERVED = _gauge(
    "hctx_account_rate_limit_observed_timestamp_seconds",
    "When that newest snapshot arrived from the service, in Unix time; its age is time() minus this.",
)
ACCOUNT_RESETS = _gauge(
    "hctx_account_rate_limit_resets_timestamp_seconds",
    "When the window resets, as the harness stated it, in Unix time.",
)
ACCOUNT_AGENTS = _gauge("hctx_account_agents", "Agents whose records name the account.")
# Issue 39: when the window reaches 100% at the fleet's pace (wrapper.forecast), only when that is
# before its reset; absent when there is no such forecast (too few snapshots, flat, stale, reset).
ACCOUNT_EXHAUSTED = _gauge(
    "hctx_account_rate_limit_exhausted_at_seconds",
    "When the window reaches 100% at the pace of the account's agents over the last hour, in Unix "
    "time; only when that is before its reset.",
)
ACCOUNT_FAMILIES = (ACCOUNT_USED, ACCOUNT_OBSERVED, ACCOUNT_RESETS, ACCOUNT_AGENTS, ACCOUNT_EXHAUSTED)
# The record's attribute behind each `context` key (None: headroom, derived), read off the model
# itself: rendering skips the record's dump into a dict.
_ATTRIBUTES = {field.alias or name: name for name, field in HarnessContext.model_fields.items()}
_READING_SAMPLES = tuple((family.sample, _ATTRIBUTES.get(key), divisor) for family, key, divisor in READINGS)
_RATE_ALIASES = {field.alias or name: name for name, field in RateLimits.model_fields.items()}
_RATE_ATTRIBUTES = tuple((_RATE_ALIASES[key], window) for key, window in RATE_WINDOWS)
# The per-agent samples' names, spelled once rather than per agent.
_RATE_SAMPLE, _MODEL_SAMPLE, _STALE_SAMPLE, _RUNNING_SAMPLE = RATE.sample, MODEL.sample, STALE.sample, RUNNING.sample
_SUBAGENTS_SAMPLE, _SUBAGENT_FILL_SAMPLE = SUBAGENTS_RUNNING.sample, SUBAGENT_FILL.sample
_CACHE_AT = AGENT_FAMILIES.index(CACHE_WARM)  # the first cache family's place among an agent's lines


@dataclass(frozen=True, slots=True)
class AccountWindow:
    """One window of the account a record names, as that record reported it."""

    window: str  # as the `window` label spells it
    used_percent: float
    resets_at_ms: int | None
    observed_at_ms: int


def _account_windows(record: HarnessContext) -> tuple[AccountWindow, ...]:
    """Each window dated by when its figure arrived (`rateLimitsAtMs`, issue 35), else by the
    reading: an idle seat's redrawn old figure is never the account's newest (wrapper.accounts).
    A figure arrives before the record holding it is written: a later time is none (planted)."""
    if record.account is None or record.rate_limits is None:
        return ()
    resets, times = record.rate_limit_resets_at_ms, record.rate_limits_at_ms

    def arrived(attribute: str) -> int:
        at: int | None = None if times is None else getattr(times, attribute)
        return record.observed_at_ms if at is None or at > record.written_at_ms else at

    return tuple(
        AccountWindow(window, value, None if resets is None else getattr(resets, attribute), arrived(attribute))
        for attribute, window in _RATE_ATTRIBUTES
        if (value := getattr(record.rate_limits, attribute)) is not None
    )  # fmt: skip


def _headroom(record: HarnessContext) -> int | None:
    return headroom_tokens(record.compact_at_tokens, record.used_tokens)


def number_text(value: float) -> str:
    """A value as prometheus_client spells it (Go's shortest form), the common numbers fast."""
    if type(value) is int and -(10**15) < value < 1_000_000:
        return f"{value}.0"  # what floatToGoString gives them, at a fraction of its cost
    if type(value) is float and -math.inf < value < 1_000_000:
        return repr(value)  # floatToGoString's own answer below a million (above, Go turns to exponents)
    return _go_string(value)


def _go_string(value: float) -> str:
    from prometheus_client.utils import floatToGoString

    global _go_string  # the import once, then the library's function itself
    _go_string = floatToGoString
    spelled: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return spelled


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass(frozen=True, slots=True)
class ExportedAgent:
    """One agent as the exporter keeps it between scrapes: its rendered lines and the little the
    clock still decides on. The decoded record is not kept: at 10,000 agents the garbage
    collector's passes over kept models cost more than rendering them."""

    lines: tuple[str, ...]  # per family of AGENT_FAMILIES[:_STATIC], "" where it has no sample
    stale_line: str  # the `hctx_context_stale` sample without its value
    running_line: str
    observed_at_ms: int | None  # None: no record that reads
    claim: HarnessState | None
    problem: str | None
    claim_problem: str | None
    account: str | None = None  # the key of the account the record names (issue 29)
    account_windows: tuple[AccountWindow, ...] = ()
    claimed_account: str | None = None  # the key the claim names, known from the launch (issue 35)

    @classmethod
    def of(cls, host: str, identity: str, files: AgentFiles) -> ExportedAgent:
        decoded = decode_agent(files, expose=False)
        record = decoded.record
        harness = decoded.harness or (record.harness if record is not None else "")
        # Sorted label names, as prometheus_client writes them.
        labels = f'agent="{_label(identity)}",harness="{_label(harness)}",host="{_label(host)}"'
        lines = [""] * _STATIC
        if record is not None:
            for index, (sample, attribute, divisor) in enumerate(_READING_SAMPLES):
                value = _headroom(record) if attribute is None else getattr(record, attribute)
                if value is not None:
                    lines[index] = f"{sample}{{{labels}}} {number_text(value if divisor == 1 else value / divisor)}\n"
            rate = []
            for attribute, window in _RATE_ATTRIBUTES:
                if record.rate_limits is not None and (value := getattr(record.rate_limits, attribute)) is not None:
                    rate.append(f'{_RATE_SAMPLE}{{{labels},window="{window}"}} {number_text(value)}\n')
            lines[len(READINGS)] = "".join(rate)
            if record.model is not None:  # the record parser refuses lone surrogates
                lines[len(READINGS) + 1] = f'{_MODEL_SAMPLE}{{{labels},model="{_label(record.model)}"}} 1.0\n'
            if record.subagents:
                running = sum(sub.state == "running" for sub in record.subagents)
                lines[len(READINGS) + 2] = f"{_SUBAGENTS_SAMPLE}{{{labels}}} {number_text(running)}\n"
                fills = [sub.used_percent for sub in record.subagents if sub.used_percent is not None]
                if fills:
                    lines[len(READINGS) + 3] = f"{_SUBAGENT_FILL_SAMPLE}{{{labels}}} {number_text(max(fills))}\n"
            cache = record.prompt_cache
            if cache is not None:
                expires = None if cache.expires_at_ms is None else cache.expires_at_ms / MS
                figures = (int(cache.warm), expires, cache.recache_tokens_if_cold)
                for offset, (family, value) in enumerate(zip(CACHE_FAMILIES, figures, strict=True)):
                    if value is not None:
                        lines[_CACHE_AT + offset] = f"{family.sample}{{{labels}}} {number_text(value)}\n"
        return cls(
            tuple(lines), f"{_STALE_SAMPLE}{{{labels}}} ", f"{_RUNNING_SAMPLE}{{{labels}}} ",
            None if decoded.record is None else decoded.record.observed_at_ms, decoded.claim, decoded.problem,
            decoded.claim_problem, None if record is None or record.account is None else record.account.key,
            () if record is None else _account_windows(record),
            None if decoded.claim is None or decoded.claim.account is None else decoded.claim.account.key,
        )  # fmt: skip

    def flags(self, now: int, host: str, here: str, alive: PidProbe) -> int:
        """What the clock decides: bit 0 the record reads (not dated past the skew), bit 1 stale,
        bit 2 the agent has a desired state, bit 3 it is running."""
        observed, flags = self.observed_at_ms, 0
        if observed is not None and observed <= now + HARNESS_CONTEXT_FUTURE_SKEW_MS:
            flags |= 1 | (2 if observed <= now - HARNESS_CONTEXT_STALE_MS else 0)
        state = desired_state(self.claim, host, here, alive)
        if state is not None:
            flags |= 4 | (8 if state == "running" else 0)
        return flags

    def problems(self, name: str, flags: int, now: int) -> list[str]:
        found = [self.problem, self.claim_problem]
        if self.observed_at_ms is not None and not flags & 1:
            ahead = self.observed_at_ms - now
            found[0] = f"context record observed {ahead} ms in the future; clock untrusted, read as absent"
        return [f"{name}: {problem}" for problem in found if problem]


@dataclass(frozen=True, slots=True)
class _Build:
    """One read of the catalog: None when it could not be listed."""

    snapshot: CatalogSnapshot[ExportedAgent] | None
    flags: bytes
    unreadable: int
    version: int  # changes whenever the agents' text would
    # (account key, window label) -> when it runs out before its reset (issue 39), from the history
    exhausted: tuple[tuple[str, str, int], ...] = ()


class Exporter:
    """The catalog read at each scrape, through one cache shared by every scrape (`build` is not
    reentrant: the server runs one at a time and shares it between concurrent scrapes)."""

    def __init__(
        self,
        locate: Callable[[], Path],
        here: str,
        *,
        process: bool,
        alive: PidProbe = pid_alive,
        clock: Callable[[], int] = now_ms,
        remember: bool = True,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Info, disable_created_metrics

        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series beside every counter
        # `locate` is resolved per scrape: a catalog created after the exporter started is read.
        self.locate, self.here, self.alive, self.clock = locate, here, alive, clock
        self.remember = remember  # False: one read only (a single --textfile), no signatures kept
        self.cache: CatalogCache[ExportedAgent] | None = None
        self.warned: set[str] = set()
        self.last = _Build(None, b"", 0, 0)
        self._text: dict[tuple[bool, bool], tuple[int, bytes]] = {}
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_CatalogFamilies(self))
        Info("hctx_exporter_build", "The exporter's version.", registry=self.registry).info(
            {"version": guard.__version__, "python": ".".join(map(str, sys.version_info[:3]))}
        )
        self.scrapes = Counter("hctx_exporter_scrapes", "Catalog reads the exporter made (concurrent scrapes "
                               "share one).", registry=self.registry)  # fmt: skip
        self.duration = Gauge("hctx_exporter_scrape_duration_seconds", "How long the last catalog read and "
                              "rendering took.", registry=self.registry)  # fmt: skip
        self.reads = Counter("hctx_exporter_records_read", "Agent directories read and decoded again because "
                             "their files changed (or were new); an unchanged agent costs two lstat calls.",
                             registry=self.registry)  # fmt: skip
        self.errors = Counter("hctx_exporter_read_errors", "Records or claims refused or unreadable, counted "
                              "each time they are read.", registry=self.registry)  # fmt: skip
        if process:
            from prometheus_client import ProcessCollector

            ProcessCollector(registry=self.registry)

    def build(self) -> None:
        with self._lock:
            started = time.perf_counter()
            self.last = self._read(self.clock())
            self.scrapes.inc()
            self.duration.set(time.perf_counter() - started)

    def _read(self, now: int) -> _Build:
        try:
            catalog = self.locate()
            if self.cache is None or self.cache.catalog != catalog:
                self.cache = CatalogCache(catalog, ExportedAgent.of, remember=self.remember)
            snapshot = self.cache.refresh()
        except CatalogError as exc:
            self._warn_new([f"cannot read the catalog: {exc}"])
            return _Build(None, b"", 0, self.last.version + 1)
        flags = bytes(agent.flags(now, host, self.here, self.alive) for host, _, agent in snapshot.agents)
        warnings = list(snapshot.warnings)
        unreadable = errors = 0
        changed = set(snapshot.changed)
        for (host, identity, agent), flag in zip(snapshot.agents, flags, strict=True):
            warnings.extend(agent.problems(f"{host}/{identity}", flag, now))
            # Refused, or dated past the skew: the agent exports no reading.
            unreadable += not flag & 1 and (agent.observed_at_ms is not None or agent.problem is not None)
            if (host, identity) in changed:
                errors += (agent.problem is not None) + (agent.claim_problem is not None)
        self.reads.inc(len(snapshot.changed))
        self.errors.inc(errors)
        self._warn_new(warnings)
        exhausted = self._forecast(catalog, snapshot, flags, now)
        same = self.last.snapshot is not None and not snapshot.changed and flags == self.last.flags and [
            (h, i) for h, i, _ in snapshot.agents] == [(h, i) for h, i, _ in self.last.snapshot.agents] and (
            exhausted == self.last.exhausted)  # fmt: skip
        return _Build(snapshot, flags, unreadable, self.last.version if same else self.last.version + 1, exhausted)

    def _forecast(
        self, catalog: Path, snapshot: CatalogSnapshot[ExportedAgent], flags: bytes, now: int
    ) -> tuple[tuple[str, str, int], ...]:
        """Every readable agent's account snapshots kept in the history (wrapper.rate_history), and
        the windows that run out before their reset at the fleet's pace."""
        from wrapper.readers.accounts import WINDOWS
        from wrapper.readers.forecast import Point
        from wrapper.readers.rate_history import Sighting, forecasts, keep

        windows = {label: window for window, label in WINDOWS}
        seen = [
            Sighting(f"account:{agent.account}", windows[window.window],
                     Point(window.observed_at_ms, window.used_percent, window.resets_at_ms))
            for (_, _, agent), flag in zip(snapshot.agents, flags, strict=True)
            if flag & 1 and agent.account is not None
            for window in agent.account_windows
        ]  # fmt: skip
        series, problem = keep(catalog, seen, now)
        self._warn_new([] if problem is None else [problem])
        labels = dict(WINDOWS)
        return tuple(sorted(
            (account.removeprefix("account:"), labels[window], forecast.exhausted_at_ms)
            for (account, window), forecast in forecasts(series, now).items()
            if forecast.exhausted_at_ms is not None
        ))  # fmt: skip

    def agents_text(self, openmetrics: bool, compressed: bool) -> bytes:
        """The agents' families in one format, rendered again only when something changed."""
        build = self.last
        cached = self._text.get((openmetrics, compressed))
        if cached is not None and cached[0] == build.version:
            return cached[1]
        if compressed:
            data = gzip.compress(self.agents_text(openmetrics, False), compresslevel=1, mtime=0)
        else:
            data = _join(build, openmetrics).encode()
        self._text[openmetrics, compressed] = (build.version, data)
        return data

    def own_text(self, openmetrics: bool) -> bytes:
        """The catalog's and the exporter's own families; in OpenMetrics, the `# EOF` too."""
        from prometheus_client import generate_latest
        from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

        return (generate_openmetrics if openmetrics else generate_latest)(self.registry)

    def body(self, openmetrics: bool, compressed: bool = False) -> list[bytes]:
        """The whole exposition of the last build, as parts to send one after another (two gzip
        members when compressed: a gzip stream may hold several, and readers join them)."""
        own = self.own_text(openmetrics)
        return [self.agents_text(openmetrics, compressed), gzip.compress(own, 1, mtime=0) if compressed else own]

    def _warn_new(self, warnings: list[str]) -> None:
        warn("metrics", [warning for warning in warnings if warning not in self.warned])
        self.warned = set(warnings)


def _join(build: _Build, openmetrics: bool) -> str:
    if build.snapshot is None:
        return ""
    agents = build.snapshot.agents
    parts: list[str] = []
    for index, family in enumerate(AGENT_FAMILIES[:_STATIC]):
        parts.append(family.header(openmetrics))
        parts.extend(agent.lines[index] for (_, _, agent), flag in zip(agents, build.flags, strict=True) if flag & 1)
    parts.append(STALE.header(openmetrics))
    parts.extend(agent.stale_line + ("1.0\n" if flag & 2 else "0.0\n")
                 for (_, _, agent), flag in zip(agents, build.flags, strict=True) if flag & 1)  # fmt: skip
    parts.append(RUNNING.header(openmetrics))
    parts.extend(agent.running_line + ("1.0\n" if flag & 8 else "0.0\n")
                 for (_, _, agent), flag in zip(agents, build.flags, strict=True) if flag & 4)  # fmt: skip
    parts.extend(_account_lines([(agent, flag) for (_, _, agent), flag in zip(agents, build.flags, strict=True)
                                 if flag & 9], openmetrics))  # fmt: skip
    parts.append(ACCOUNT_EXHAUSTED.header(openmetrics))
    parts += [f'{ACCOUNT_EXHAUSTED.sample}{{account="{key}",window="{name}"}} {number_text(at_ms / MS)}\n'
              for key, name, at_ms in build.exhausted]  # fmt: skip
    return "".join(parts)


def _account_lines(members: list[tuple[ExportedAgent, int]], openmetrics: bool) -> list[str]:
    """The account families: per account and window the newest snapshot (the first agent in the
    catalog's order keeps a tie), and how many agents name the account (a readable record's, else a
    running agent's claim's: counted from its launch, as `hctx accounts` counts it); an account none
    of whose agents reports a window exports nothing, as `hctx accounts` lists nothing for it.
    `members`: the readable or running agents with their `flags`."""
    newest: dict[tuple[str, str], AccountWindow] = {}
    agents: dict[str, int] = {}
    for agent, flag in members:
        account = agent.account if flag & 1 else None
        if account is None and flag & 8:
            account = agent.claimed_account
        if account is None:
            continue  # an agent that states no account: its own hctx_rate_limit_used_percent says it
        agents[account] = agents.get(account, 0) + 1
        for window in agent.account_windows if flag & 1 else ():
            held = newest.get((account, window.window))
            if held is None or window.observed_at_ms > held.observed_at_ms:
                newest[account, window.window] = window
    series = sorted(newest.items())
    parts = [ACCOUNT_USED.header(openmetrics)]
    parts += [f'{ACCOUNT_USED.sample}{{account="{key}",window="{name}"}} {number_text(window.used_percent)}\n'
              for (key, name), window in series]  # fmt: skip
    parts.append(ACCOUNT_OBSERVED.header(openmetrics))
    parts += [f'{ACCOUNT_OBSERVED.sample}{{account="{key}",window="{name}"}} '
              f"{number_text(window.observed_at_ms / MS)}\n" for (key, name), window in series]  # fmt: skip
    parts.append(ACCOUNT_RESETS.header(openmetrics))
    parts += [f'{ACCOUNT_RESETS.sample}{{account="{key}",window="{name}"}} {number_text(window.resets_at_ms / MS)}\n'
              for (key, name), window in series if window.resets_at_ms is not None]  # fmt: skip
    parts.append(ACCOUNT_AGENTS.header(openmetrics))
    with_windows = {key for key, _ in newest}
    parts += [f'{ACCOUNT_AGENTS.sample}{{account="{key}"}} {number_text(count)}\n'
              for key, count in sorted(agents.items()) if key in with_windows]  # fmt: skip
    return parts


class _CatalogFamilies:
    """`hctx_catalog_*`, from the exporter's last build."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        build = self.exporter.last
        yield GaugeMetricFamily(
            "hctx_catalog_readable", "1 when the catalog could be listed; 0 and no agent series when not.",
            float(build.snapshot is not None),
        )  # fmt: skip
        if build.snapshot is not None:
            yield GaugeMetricFamily("hctx_catalog_agents", "Agent directories in the catalog.",
                                    len(build.snapshot.agents))  # fmt: skip
            yield GaugeMetricFamily(
                "hctx_catalog_unreadable", "Agents whose context record is refused and exports nothing.",
                build.unreadable,
            )  # fmt: skip


def exposition(exporter: Exporter, openmetrics: bool = False) -> str:
    """One build, and its whole text: what a scrape (or the textfile) gets."""
    exporter.build()
    return b"".join(exporter.body(openmetrics)).decode()


# ---------------------------------------------------------------------------------------------
# The command


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT`; the host is never implied: every interface is `0.0.0.0` or `[::]`."""
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not HOST:PORT (say 127.0.0.1:9478)")
    return host, int(port)


def _write(args: argparse.Namespace, exporter: Exporter) -> int:
    import os
    import tempfile

    target: Path = args.textfile
    while True:
        text = exposition(exporter).encode()
        try:
            # Beside the target, renamed over it: node_exporter never reads a half-written file.
            fd, staging = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(text)
                os.chmod(staging, 0o644)
                os.replace(staging, target)
            except BaseException:
                os.unlink(staging)
                raise
        except OSError as exc:
            parent = target.parent
            why = f"no directory {parent}" if not parent.is_dir() else f"{exc.strerror or exc} (in {parent})"
            return fail("metrics", f"cannot write {target}: {why}", 2)
        if args.interval is None:
            return 0
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def _unreadable_tls_files(args: argparse.Namespace) -> list[str]:
    """Each TLS file given that cannot be read, named with its option (ssl names none, or only one)."""
    problems = []
    for option, name in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key),
                         ("--tls-client-ca", args.tls_client_ca)):  # fmt: skip
        if name is None:
            continue
        try:
            with open(name, "rb"):
                pass
        except OSError as exc:
            problems.append(f"{option} {name}: {exc.strerror or exc}")
    return problems


def run_metrics(args: argparse.Namespace) -> int:
    if args.textfile is None and args.interval is not None:
        return fail("metrics", "--interval repeats --textfile; a server is read at every scrape", 2)
    if args.textfile is not None and (args.listen or args.tls_cert or args.tls_client_ca):
        return fail("metrics", "--textfile writes a file; --listen and --tls-* are for serving", 2)
    if tls_unpaired(args):
        return fail("metrics", TLS_PAIRING, 2)
    quiet_guard_logs()
    serving = args.textfile is None
    exporter = Exporter(lambda: existing_catalog(args), args.host, process=serving,
                        remember=serving or args.interval is not None)  # fmt: skip
    if args.textfile is not None:
        return _write(args, exporter)
    from wrapper.readers.metrics_server import serve_exporter

    if unreadable := _unreadable_tls_files(args):
        return fail("metrics", f"cannot serve HTTPS: {'; '.join(unreadable)}", 2)

    limits = Limits(args.max_connections, args.header_timeout, args.idle_timeout)
    return serve_exporter(exporter, args.listen or DEFAULT_LISTEN, limits, args.tls_cert, args.tls_key,
                          args.tls_client_ca)  # fmt: skip


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    metrics = commands.add_parser(
        "metrics",
        help="serve the roster to Prometheus, or write it for node_exporter's textfile collector",
        description="The Prometheus exposition of every agent in the catalog, read at each scrape (only the "
        f"records that changed are read again). Serves http://{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}/metrics "
        "unless told otherwise, a small page at /, and nothing else.",
    )
    metrics.add_argument(
        "--listen", type=listen_address, metavar="HOST:PORT",
        help=f"where to serve (default: {DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}; port 0 picks a free one)",
    )  # fmt: skip
    add_tls_options(metrics)
    metrics.add_argument(
        "--max-connections", type=_connections, default=DEFAULT_LIMITS.connections, metavar="N",
        help="connections served at once; past it the one idle longest is closed (default: %(default)s)",
    )  # fmt: skip
    metrics.add_argument(
        "--header-timeout", type=positive_seconds, default=DEFAULT_LIMITS.header_s, metavar="S",
        help="close a connection whose request (or TLS handshake) is not in after S seconds (default: %(default)g)",
    )  # fmt: skip
    metrics.add_argument(
        "--idle-timeout", type=positive_seconds, default=DEFAULT_LIMITS.idle_s, metavar="S",
        help="close a kept-alive connection idle for S seconds, and one that takes longer than S to take "
        "a response (default: %(default)g)",
    )  # fmt: skip
    metrics.add_argument(
        "--textfile", type=Path, metavar="FILE",
        help="write the exposition to FILE once, atomically (node_exporter's textfile collector wants *.prom)",
    )  # fmt: skip
    metrics.add_argument(
        "--interval", type=positive_seconds, metavar="S", help="with --textfile: rewrite it every S seconds"
    )
    add_catalog_options(metrics)
    metrics.set_defaults(run=with_host(run_metrics))
