"""`hctx watch`'s command line: every option in one place, the fill events (wrapper.readers.watch)
and, beside them, the account rate-limit events (wrapper.readers.account_watch) and the forecast's
(wrapper.readers.forecast_watch) as its companions, and with --notify each event also notified
(wrapper.readers.notify)."""

from __future__ import annotations

import argparse
import math

from wrapper.arguments import add_catalog_options, positive_seconds, whole_number, with_host
from wrapper.readers import notify
from wrapper.readers.account_watch import AccountWatch
from wrapper.readers.accounts import DEFAULT_RATE_LIMIT_AT
from wrapper.readers.forecast_watch import DEFAULT_FORECAST_MARGIN_S, ForecastWatch
from wrapper.readers.watch import DEFAULT_AT, DEFAULT_EXEC_TIMEOUT_S, DEFAULT_REREAD_S, parse_percents, run_watch

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    around = None
    if notify.wanted(args):
        targets = notify.targets_of(args)  # apprise loads here, with --notify only
        if targets is None:
            return 2
        if args.notify_test:
            return notify.notify_test(targets, args.notify_timeout, args.board_url, args.host)
        if targets:  # the events go to the targets, and to --exec's command if there is one
            around = notify.with_notifications(args, targets)
    return run_watch(args, lambda state_file: [
        AccountWatch(state_file, args.rate_limit_at), ForecastWatch(state_file, args.forecast_margin),
    ], around)  # fmt: skip


def _minutes(text: str) -> float:
    """`--forecast-margin`: minutes, 0 or more, as seconds."""
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not math.isfinite(minutes) or minutes < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes, 0 or more")
    return minutes * 60


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = commands.add_parser(
        "watch",
        help="run a command for every fill crossing, compaction, stale record and account rate-limit crossing",
        description="Follows the catalog (inotify where the platform has it, and a re-read every --reread "
        "seconds) and turns it into events: a reading at or above an --at percent after one below it (or "
        "the first reading of an incarnation), headroom to compaction under --headroom tokens, a compaction, "
        "a record gone stale while its agent runs, and fresh again; and per account and window, its rate limit "
        "reaching a --rate-limit-at percent (the newest snapshot across the agents sharing it). Withheld and "
        "stale readings fire "
        "nothing. Each event is one JSON object with a human `message`: on the stdin of --exec's command "
        "(also as HCTX_* variables: HCTX_EVENT, HCTX_AGENT, HCTX_USED_PERCENT, HCTX_MESSAGE, ...), or "
        "without --exec one JSON line on stdout. What was told is kept in <catalog>/.st2/watch/NAME.json, "
        "so a restarted watch tells nothing twice. Stops on SIGINT or SIGTERM.",
    )
    watch.add_argument(
        "--exec", metavar="CMD",
        help="a shell command run for each event, the event as JSON on its stdin; one agent's events run "
        "in order, one at a time, each in a process group of its own; whatever it leaves running "
        "(backgrounded or setsid children) is ended when it returns (default: print each event as a JSON "
        "line, unless --notify sends them)",
    )  # fmt: skip
    watch.add_argument(
        "--at", type=parse_percents, default=DEFAULT_AT, metavar="PERCENTS",
        help="fill thresholds above 0, comma-separated; each fires once and is re-armed by a reading below "
        "it; above 100 only an overrun reaches, which pi, omp and OpenCode publish (default: 80,95)",
    )  # fmt: skip
    watch.add_argument(
        "--headroom", type=whole_number, metavar="TOKENS",
        help="fire when compactAtTokens - usedTokens falls under TOKENS (only where the harness states "
        "where it compacts; default: no headroom events)",
    )  # fmt: skip
    watch.add_argument(
        "--cache-warn", type=positive_seconds, metavar="SECONDS",
        help="fire cache-expiring when an agent's warm prompt cache goes cold within SECONDS, naming when "
        "and the tokens the next turn then writes again (only where the harness states its cache: Claude "
        "2.1.332; checked at each read, so at least every --reread; default: no such events)",
    )  # fmt: skip
    watch.add_argument(
        "--exec-timeout", type=positive_seconds, default=DEFAULT_EXEC_TIMEOUT_S, metavar="S",
        help="kill a command (and its process group) still running after S seconds; logged, and the watch "
        "goes on (default: %(default)g)",
    )  # fmt: skip
    watch.add_argument(
        "--reread", type=positive_seconds, default=DEFAULT_REREAD_S, metavar="S",
        help="re-read the whole catalog at least every S seconds, for records going stale and for changes "
        "a file event missed (default: %(default)g)",
    )  # fmt: skip
    watch.add_argument(
        "--name", default="default",
        help="the state file's name under <catalog>/.st2/watch/; a second watch on one catalog needs its own "
        "(default: %(default)s)",
    )  # fmt: skip
    add_catalog_options(watch)
    watch.add_argument(
        "--rate-limit-at", type=parse_percents, default=DEFAULT_RATE_LIMIT_AT, metavar="PERCENTS",
        help="account rate-limit thresholds, comma-separated: a `rate-limit` event per account and window "
        "(five-hour, seven-day) when the newest snapshot across the account's agents reaches one; re-armed "
        "below it or once the window resets; a snapshot past the hour horizon fires nothing (default: 80,95)",
    )  # fmt: skip
    watch.add_argument(
        "--forecast-margin", type=_minutes, default=DEFAULT_FORECAST_MARGIN_S, metavar="MINUTES",
        help="a `rate-limit-forecast` event per account and window when, at the pace of all its agents over "
        "the last hour (the history every hctx reader keeps), the window reaches 100%% more than MINUTES "
        "before the reset the harness stated; re-armed when it no longer does or the window resets (default: 15)",
    )  # fmt: skip
    notify.add_notify_options(watch)
    watch.set_defaults(run=with_host(_run))
