"""`hctx metrics`: the catalog's roster in the Prometheus exposition format.

A custom collector reads the catalog at every scrape through the roster (`collect_roster`, the same
walk and projection `hctx agents --json` uses), so a scrape is never older than the records and
holds no state of its own. Per agent, labelled host, agent and harness: one gauge per number the
record carries, absent when the harness withheld it; the model in an `_info` series.

`prometheus_client` is imported by the command itself, so the other commands never load it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guard.errors import CatalogError
from wrapper.arguments import TLS_PAIRING, add_tls_options, positive_seconds, tls_unpaired
from wrapper.reader_commands import add_catalog_options, existing_catalog, fail, quiet_guard_logs, warn, with_host
from wrapper.roster import Roster, collect_roster, now_ms

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = [
    "AGENT_LABELS",
    "DEFAULT_LISTEN",
    "MS",
    "RATE_WINDOWS",
    "READINGS",
    "CatalogCollector",
    "account_families",
    "add_metrics_command",
    "families",
    "listen_address",
    "run_metrics",
]

DEFAULT_LISTEN = ("127.0.0.1", 9478)
AGENT_LABELS = ("host", "agent", "harness")
MS = 1000  # ms / 1000 is the double nearest the seconds; ms * 0.001 is not always

# name, HELP, the roster's `context` key, the divisor to the series' unit.
READINGS: tuple[tuple[str, str, str, int], ...] = (
    ("hctx_context_used_tokens", "Tokens in the context window, the harness's own count.", "usedTokens", 1),
    ("hctx_context_window_tokens", "The context window in tokens, as the harness reports it.", "windowTokens", 1),
    ("hctx_context_used_percent", "Context window fill in percent, the harness's own number, never clamped.",
     "usedPercent", 1),
    ("hctx_context_compactions", "Compactions in this incarnation; a gauge: a relaunch starts again at 0.",
     "compactions", 1),
    ("hctx_context_last_compaction_timestamp_seconds", "When the last compaction happened, in Unix time.",
     "lastCompactionMs", MS),
    ("hctx_context_compact_at_tokens", "Tokens at which the harness compacts on its own, from its own settings.",
     "compactAtTokens", 1),
    ("hctx_context_headroom_tokens", "Tokens left before the harness's own compaction point; negative past it.",
     "headroomTokens", 1),
    ("hctx_session_tokens", "Tokens the session processed in all, as the harness reports it.",
     "sessionTotalTokens", 1),
    ("hctx_session_cost_usd", "The session's cost in US dollars, as the harness reports it.", "costUsd", 1),
    ("hctx_context_observed_timestamp_seconds", "When the reading was taken, in Unix time; never re-stamped.",
     "observedAtMs", MS),
)  # fmt: skip
# The record's account rate-limit windows, as the `window` label spells them.
RATE_WINDOWS = (("fiveHour", "five_hour"), ("sevenDay", "seven_day"))


def account_families(roster: Roster) -> Iterator[Metric]:
    """Per account the harness states (its opaque key, never the label: the series stay few and free
    of personal data) and window, the fan-in's newest snapshot across the account's agents."""
    from prometheus_client.core import GaugeMetricFamily

    from wrapper.accounts import WINDOWS, fan_in

    labels = ("account", "window")
    used = GaugeMetricFamily(
        "hctx_account_rate_limit_used_percent",
        "Account rate-limit window used, in percent: the newest snapshot across the account's agents.",
        labels=labels,
    )
    observed = GaugeMetricFamily(
        "hctx_account_rate_limit_observed_timestamp_seconds",
        "When that newest snapshot was taken, in Unix time; its age is time() minus this.",
        labels=labels,
    )
    resets = GaugeMetricFamily(
        "hctx_account_rate_limit_resets_timestamp_seconds",
        "When the window resets, as the harness stated it, in Unix time.",
        labels=labels,
    )
    agents = GaugeMetricFamily("hctx_account_agents", "Agents whose records name the account.", labels=("account",))
    for group in fan_in(roster.rows):
        if group.key is None:
            continue  # an agent that states no account: its own hctx_rate_limit_used_percent says it
        agents.add_metric([group.key], len(group.agents))
        for window, name in WINDOWS:
            snapshot = group.windows.get(window)
            if snapshot is None:
                continue
            used.add_metric([group.key, name], snapshot.used_percent)
            observed.add_metric([group.key, name], snapshot.observed_at_ms / MS)
            if snapshot.resets_at_ms is not None:
                resets.add_metric([group.key, name], snapshot.resets_at_ms / MS)
    yield from (used, observed, resets, agents)


def families(roster: Roster) -> Iterator[Metric]:
    """Every series for one roster; a value the record does not hold is no sample, never a 0."""
    from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

    readings = {name: GaugeMetricFamily(name, text, labels=AGENT_LABELS) for name, text, _, _ in READINGS}
    rate = GaugeMetricFamily(
        "hctx_rate_limit_used_percent",
        "Account rate-limit window used, in percent, as the harness reports it.",
        labels=(*AGENT_LABELS, "window"),
    )
    stale = GaugeMetricFamily(
        "hctx_context_stale", "1 when the reading is older than the 60-minute horizon.", labels=AGENT_LABELS
    )
    model = InfoMetricFamily("hctx_model", "The model the harness reported.", labels=(*AGENT_LABELS, "model"))
    running = GaugeMetricFamily(
        "hctx_agent_running", "1 when the agent's desired state is running, 0 when stopped.", labels=AGENT_LABELS
    )
    # Issue 28, bounded cardinality: per agent, never per subagent id.
    subagents_running = GaugeMetricFamily(
        "hctx_subagents_running", "Subagents of the agent its harness states running.", labels=AGENT_LABELS
    )
    subagent_fill = GaugeMetricFamily(
        "hctx_subagent_max_used_percent",
        "The highest fill among the agent's subagents, in percent, each its harness's own number.",
        labels=AGENT_LABELS,
    )
    unreadable = 0
    for row in roster.rows:
        context: dict[str, Any] | None = row.context
        labels = [row.host, row.identity, row.harness or (context or {}).get("harness") or ""]
        if row.desired_state is not None:
            running.add_metric(labels, float(row.desired_state == "running"))
        if context is None:
            unreadable += row.problem is not None
            continue
        for name, _, key, divisor in READINGS:
            if context[key] is not None:
                readings[name].add_metric(labels, context[key] / divisor)
        for key, window in RATE_WINDOWS:
            if (value := (context["rateLimits"] or {}).get(key)) is not None:
                rate.add_metric([*labels, window], value)
        stale.add_metric(labels, float(context["stale"]))
        if context["model"] is not None:
            model.add_metric([*labels, context["model"]], {})  # the record parser refuses lone surrogates
        subagents = context.get("subagents") or []
        if subagents:
            subagents_running.add_metric(labels, float(sum(sub["state"] == "running" for sub in subagents)))
            fills = [sub["usedPercent"] for sub in subagents if sub["usedPercent"] is not None]
            if fills:
                subagent_fill.add_metric(labels, max(fills))
    yield from (*readings.values(), rate, stale, model, running, subagents_running, subagent_fill)
    yield from account_families(roster)
    yield GaugeMetricFamily("hctx_catalog_agents", "Agent directories in the catalog.", len(roster.rows))
    yield GaugeMetricFamily(
        "hctx_catalog_unreadable", "Agents whose context record is refused and exports nothing.", unreadable
    )


class CatalogCollector:
    """Reads the catalog at every scrape; a warning is printed once, when it first appears."""

    def __init__(self, locate: Callable[[], Path], here: str) -> None:
        # `locate` is resolved per scrape: a catalog created after the exporter started is read.
        self.locate, self.here = locate, here
        self.warned: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        roster: Roster | None = None
        try:
            roster = collect_roster(self.locate(), now_ms(), here=self.here)
        except CatalogError as exc:
            self._warn_new([f"cannot read the catalog: {exc}"])
        yield GaugeMetricFamily(
            "hctx_catalog_readable", "1 when the catalog could be listed; 0 and no other series when not.",
            float(roster is not None),
        )  # fmt: skip
        if roster is not None:
            self._warn_new(roster.all_warnings())
            yield from families(roster)

    def _warn_new(self, warnings: list[str]) -> None:
        warn("metrics", [warning for warning in warnings if warning not in self.warned])
        self.warned = set(warnings)


# ---------------------------------------------------------------------------------------------
# The command


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT`; the host is never implied: every interface is `0.0.0.0` or `[::]`."""
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not HOST:PORT (say 127.0.0.1:9478)")
    return host, int(port)


def _tls_files(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    return [("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-client-ca", args.tls_client_ca)]


def _unreadable_tls_files(args: argparse.Namespace) -> list[str]:
    """Each TLS file given that cannot be read, named with its option (ssl names none, or only one)."""
    problems = []
    for option, name in _tls_files(args):
        if name is None:
            continue
        try:
            with open(name, "rb"):
                pass
        except OSError as exc:
            problems.append(f"{option} {name}: {exc.strerror or exc}")
    return problems


def _serve(args: argparse.Namespace, registry: CollectorRegistry) -> int:
    import ssl

    from prometheus_client import start_http_server

    host, port = args.listen or DEFAULT_LISTEN
    if unreadable := _unreadable_tls_files(args):
        return fail("metrics", f"cannot serve HTTPS: {'; '.join(unreadable)}", 2)
    try:
        server, thread = start_http_server(
            port, addr=host, registry=registry, certfile=args.tls_cert, keyfile=args.tls_key,
            client_cafile=args.tls_client_ca, client_auth_required=args.tls_client_ca is not None,
        )  # fmt: skip
    except ssl.SSLError as exc:  # files that are there but are no certificate, key or CA the other wants
        reason = exc.args[0] if len(exc.args) == 1 else exc  # prometheus_client's text names the files
        return fail("metrics", f"cannot serve HTTPS: {reason}", 2)
    except OSError as exc:
        return fail("metrics", f"cannot listen on {host}:{port}: {exc.strerror or exc}", 2)
    scheme = "https" if args.tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    print(f"hctx metrics: serving {scheme}://{shown}:{server.server_port}/metrics", file=sys.stderr, flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _write(args: argparse.Namespace, registry: CollectorRegistry) -> int:
    from prometheus_client import write_to_textfile

    target: Path = args.textfile
    while True:
        try:
            write_to_textfile(str(target), registry)
        except OSError as exc:
            # prometheus_client's error names its temporary file beside the target, not the target.
            parent = target.parent
            why = f"no directory {parent}" if not parent.is_dir() else f"{exc.strerror or exc} (in {parent})"
            return fail("metrics", f"cannot write {target}: {why}", 2)
        if args.interval is None:
            return 0
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def run_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    if args.textfile is None and args.interval is not None:
        return fail("metrics", "--interval repeats --textfile; a server is read at every scrape", 2)
    if args.textfile is not None and (args.listen or args.tls_cert or args.tls_client_ca):
        return fail("metrics", "--textfile writes a file; --listen and --tls-* are for serving", 2)
    if tls_unpaired(args):
        return fail("metrics", TLS_PAIRING, 2)
    quiet_guard_logs()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CatalogCollector(lambda: existing_catalog(args), args.host))
    return _serve(args, registry) if args.textfile is None else _write(args, registry)


def add_metrics_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    metrics = commands.add_parser(
        "metrics",
        help="serve the roster to Prometheus, or write it for node_exporter's textfile collector",
        description="The Prometheus exposition of every agent in the catalog, read at each scrape. "
        f"Serves http://{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}/metrics unless told otherwise.",
    )
    metrics.add_argument(
        "--listen", type=listen_address, metavar="HOST:PORT",
        help=f"where to serve (default: {DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}; port 0 picks a free one)",
    )  # fmt: skip
    add_tls_options(metrics)
    metrics.add_argument(
        "--textfile", type=Path, metavar="FILE",
        help="write the exposition to FILE once, atomically (node_exporter's textfile collector wants *.prom)",
    )  # fmt: skip
    metrics.add_argument(
        "--interval", type=positive_seconds, metavar="S", help="with --textfile: rewrite it every S seconds"
    )
    add_catalog_options(metrics)
    metrics.set_defaults(run=with_host(run_metrics))
