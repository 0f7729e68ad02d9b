"""`hctx watch --notify URL`: every watch event as a short notification, through apprise (issue 38).

Off the event path: the watch's delivery only puts a notice on each target's bounded queue, which
never waits; one trio task per target sends its queue in order, apprise's blocking `notify` in a
worker thread of that target's own (its own thread limit, so a hung target ties up only its own
threads), each attempt bounded by `--notify-timeout`. A failed attempt is retried with back-off for
at most `--notify-retry-for` seconds, then given up, said on stderr. A full queue drops the newest
notice for that target alone, said too. What watch records as told is recorded when the event is
queued, as for `--exec`: a restarted watch never sends one twice (a notice still queued when it
stops is lost, and counted on stderr).

A URL carries its service's secrets (a token, a password): none of what this module says names the
URL itself, only apprise's privacy form of it (`url(privacy=True)`: secrets masked), and any text
apprise answers is scrubbed of the URL's secret parts before it is said. apprise is imported here
only, when a watch notifies: `hctx` without `--notify` never loads it (measured on a loaded 2-core
machine: 0.06-0.14 s to import it beside the watch's modules, then 0.17-0.23 s for its plugins at
the first URL; once per watch, never per event).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from wrapper.arguments import UsageError
from wrapper.readers.account_watch import RateLimitEvent
from wrapper.readers.forecast_watch import ForecastEvent
from wrapper.readers.render import meter_text, percent_text
from wrapper.readers.watch import Around, Deliver, Event

if TYPE_CHECKING:
    import apprise
    import trio

__all__ = [
    "DEFAULT_NOTIFY_QUEUE",
    "DEFAULT_NOTIFY_RETRY_FOR_S",
    "DEFAULT_NOTIFY_TIMEOUT_S",
    "NOTIFY_URLS_ENV",
    "Answer",
    "Notice",
    "Notifier",
    "Target",
    "add_notify_options",
    "board_link",
    "notice_of",
    "notify_test",
    "notifying",
    "read_targets",
    "target_of",
    "targets_of",
    "wanted",
    "with_notifications",
]

NOTIFY_URLS_ENV = "HCTX_NOTIFY_URLS"
DEFAULT_NOTIFY_TIMEOUT_S = 15.0
DEFAULT_NOTIFY_RETRY_FOR_S = 300.0
DEFAULT_NOTIFY_QUEUE = 64
# Back-off between attempts: doubling from the first, never longer than the last.
_BACKOFF_FIRST_S = 1.0
_BACKOFF_MAX_S = 60.0
# When the watch stops, what is queued still has this long to go out (a stop is not a reason to
# lose the last alert), bounded so a dead target cannot hold the stop.
_DRAIN_S = 5.0

_TITLES = {
    "fill": "context {fill} full",
    "subagent-fill": "subagent context {fill} full",
    "headroom": "near compaction",
    "compaction": "compacted",
    "stale": "context reading stale",
    "fresh": "context reading fresh again",
    "rate-limit": "rate limit {fill} used",
    "rate-limit-forecast": "rate limit runs out before its reset, {fill} used",
}
_WINDOWS = {"fiveHour": "five-hour", "sevenDay": "seven-day"}


def log(message: str) -> None:
    print(f"hctx watch: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# What a notification says


@dataclass(frozen=True, slots=True)
class Notice:
    """One event as a notification: a short title, a body of a few lines, and what the logs name it by."""

    title: str
    body: str
    about: str  # "fill of host/agent", for what is said on stderr


def board_link(base: str, host: str, identity: str) -> str:
    """The board's page of one agent (`hctx web`'s `/agents/HOST/AGENT`, each part escaped as the
    board's own links do)."""
    return f"{base.rstrip('/')}/agents/{quote(host, safe='')}/{quote(identity, safe='')}"


def notice_of(event: Event, board_url: str | None = None) -> Notice:
    """The title names the agent and what happened; the body the event's message, then host, agent,
    harness, the fill and its window (for a rate limit, the account's window), and the board's link."""
    row = event.row
    harness = row.named_harness or "?"
    if isinstance(event, RateLimitEvent) and event.snapshot is not None:
        percent: float | None = event.snapshot.used_percent
        window = f"{_WINDOWS.get(event.snapshot.window, event.snapshot.window)} window"
        if event.group is not None:
            window += f" of {event.group.label}"
    elif isinstance(event, ForecastEvent) and event.group is not None and event.window in event.group.windows:
        percent = event.group.windows[event.window].used_percent
        window = f"{_WINDOWS.get(event.window, event.window)} window of {event.group.label}"
    elif event.kind == "subagent-fill" and event.subagent is not None:
        percent = event.subagent.used_percent
        window = meter_text(event.subagent) or "window unknown"
    else:
        context = row.context
        percent = None if context is None else context.used_percent
        window = meter_text(context) or "window unknown"
    fill = "?" if percent is None else percent_text(percent)
    what = _TITLES.get(event.kind, event.kind).format(fill=fill)
    lines = [
        event.message(),
        f"host {row.host} · agent {row.identity} · harness {harness}",
        f"fill {fill} · {window}",
    ]
    if board_url is not None:
        lines.append(board_link(board_url, row.host, row.identity))
    return Notice(f"{row.identity}: {what}", "\n".join(lines), f"{event.kind} of {row.name}")


# ---------------------------------------------------------------------------------------------
# Targets


@dataclass(frozen=True, slots=True)
class Target:
    """One `--notify` URL: the URL itself (kept out of every message), apprise's privacy form of it
    (what is said), and the secret parts to scrub from anything apprise answers."""

    url: str = field(repr=False)
    shown: str
    secrets: tuple[str, ...] = field(repr=False)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "****")
        return text


def _secrets_of(url: str, shown: str) -> tuple[str, ...]:
    """The parts of `url` its privacy form leaves out: the whole URL, its password, and every path
    segment, user or query value long enough to be a token that does not appear in `shown`."""
    parts = urlsplit(url)
    found = {url}
    candidates = [parts.password or "", parts.username or ""]
    candidates += re.split(r"[/,]", parts.path)
    candidates += [value for pair in parts.query.split("&") for value in pair.split("=", 1)[1:]]
    for candidate in candidates:
        for form in {candidate, unquote(candidate)}:
            if len(form) >= 4 and form not in shown:
                found.add(form)
    return tuple(sorted(found, key=len, reverse=True))  # the longest first: a token inside the URL goes with it


def _scheme(url: str) -> str:
    head, sep, _ = url.partition("://")
    return head if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,31}", head) else "?"


def target_of(url: str) -> Target:
    """UsageError, naming only the URL's scheme, when apprise cannot make a service of it."""
    import apprise

    service = apprise.Apprise.instantiate(url)
    if service is None:
        raise UsageError(
            f"a {_scheme(url)}:// URL apprise cannot use (unknown scheme, a malformed URL, or a service "
            f"whose Python package is missing; `apprise --details` lists them)"
        )
    # apprise's privacy form, less its query (every option spelled out, secrets already masked)
    shown: str = service.url(privacy=True).partition("?")[0]  # type: ignore[no-untyped-call]
    return Target(url, shown, _secrets_of(url, shown))


def _split_urls(text: str) -> list[str]:
    """One URL a line or whitespace-separated; `#` starts a comment line."""
    return [word for line in text.splitlines() if not line.lstrip().startswith("#") for word in line.split()]


def read_targets(
    given: Sequence[str], files: Sequence[Path], environ: dict[str, str] | os._Environ[str]
) -> list[Target]:
    """The targets of `--notify`, `--notify-file` and HCTX_NOTIFY_URLS, in that order, each URL once.
    The variable is taken out of `environ`, so no `--exec` command inherits it. UsageError with a
    message naming where a bad URL came from, never the URL."""
    sources: list[tuple[str, str]] = [(f"--notify #{n}", url) for n, url in enumerate(given, 1)]
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --notify-file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        sources += [(f"{path} URL #{n}", url) for n, url in enumerate(_split_urls(text), 1)]
    env_text = environ.pop(NOTIFY_URLS_ENV, None)
    if env_text:
        sources += [(f"{NOTIFY_URLS_ENV} URL #{n}", url) for n, url in enumerate(_split_urls(env_text), 1)]
    targets: dict[str, Target] = {}
    for where, url in sources:
        if url in targets:
            continue
        try:
            targets[url] = target_of(url)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
    return list(targets.values())


# ---------------------------------------------------------------------------------------------
# Sending


@dataclass(frozen=True, slots=True)
class Answer:
    """What one attempt came to: delivered or not, and what the service (or apprise) said, scrubbed."""

    ok: bool
    said: str


def _send(service: apprise.Apprise, target: Target, notice: Notice, timeout_s: float) -> Answer:
    """One blocking attempt (in a worker thread): apprise's result and its log lines, scrubbed."""
    try:
        result = service.notify(body=notice.body, title=notice.title, timeout=timeout_s)
    except Exception as exc:  # apprise's own failure to send is this target's answer, nothing else's
        return Answer(False, target.scrub(f"{type(exc).__name__}: {exc}"))
    said = "; ".join(dict.fromkeys(entry.message.strip() for entry in result.logs() if entry.message.strip()))
    status = result.status.name.lower()
    return Answer(bool(result), target.scrub(f"{status}" + (f" ({said})" if said else "")))


class _Sender:
    """One target's apprise object, thread limit and attempt bound."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        import apprise
        import trio

        self.target = target
        self.timeout_s = timeout_s
        # apprise answers through its result (`_send`); its logger, with no handler of the
        # program's, would otherwise reach stderr through logging's last resort as well.
        logging.getLogger("apprise").addHandler(logging.NullHandler())
        self._service = apprise.Apprise()
        self._service.add(target.url)
        # Two: one attempt abandoned past its bound may still hold a thread while the next one runs.
        self._threads = trio.CapacityLimiter(2)

    async def attempt(self, notice: Notice) -> Answer:
        import trio

        with trio.move_on_after(self.timeout_s + 2):  # apprise's own bound, and ours past it
            return await trio.to_thread.run_sync(
                _send, self._service, self.target, notice, self.timeout_s,
                abandon_on_cancel=True, limiter=self._threads,
            )  # fmt: skip
        return Answer(False, f"no answer within {self.timeout_s:g} s")


class Notifier:
    """One bounded queue and one sending task per target (`run`); `put` never waits."""

    def __init__(self, targets: Sequence[Target], *, timeout_s: float, retry_for_s: float, queue: int) -> None:
        import trio

        self._senders = [_Sender(target, timeout_s) for target in targets]
        self._retry_for_s = retry_for_s
        channels = [trio.open_memory_channel[Notice](queue) for _ in targets]
        self._queues = [send for send, _ in channels]
        self._inboxes = [receive for _, receive in channels]
        self._unsent = [0] * len(targets)

    def put(self, notice: Notice) -> None:
        import trio

        for n, queue in enumerate(self._queues):
            try:
                queue.send_nowait(notice)
                self._unsent[n] += 1
            except trio.WouldBlock:
                log(f"--notify {self._senders[n].target.shown}: queue full; {notice.about} dropped for it")
            except trio.ClosedResourceError:
                log(f"--notify {self._senders[n].target.shown}: stopping; {notice.about} not sent")

    def start(self, nursery: trio.Nursery) -> None:
        """The sending tasks, one per target, each until its queue is closed (`close`) and empty."""
        for n, sender in enumerate(self._senders):
            nursery.start_soon(self._work, n, sender, self._inboxes[n])

    def close(self) -> None:
        for queue in self._queues:
            queue.close()

    def unsent(self) -> list[tuple[Target, int]]:
        """Each target with notices queued or in flight, and how many."""
        return [(sender.target, count) for sender, count in zip(self._senders, self._unsent, strict=True) if count]

    async def _work(self, n: int, sender: _Sender, inbox: trio.MemoryReceiveChannel[Notice]) -> None:
        async with inbox:
            async for notice in inbox:
                await self._deliver(sender, notice)
                self._unsent[n] -= 1

    async def _deliver(self, sender: _Sender, notice: Notice) -> None:
        import trio

        shown, started, delay, attempts = sender.target.shown, time.monotonic(), _BACKOFF_FIRST_S, 0
        while True:
            attempts += 1
            answer = await sender.attempt(notice)
            if answer.ok:
                if attempts > 1:
                    log(f"--notify {shown}: {notice.about} sent at attempt {attempts}")
                return
            spent = time.monotonic() - started
            if spent + delay > self._retry_for_s:
                log(f"--notify {shown}: gave up on {notice.about} after {attempts} attempt"
                    f"{'' if attempts == 1 else 's'} in {spent:.0f} s: {answer.said}")  # fmt: skip
                return
            if attempts == 1:
                log(f"--notify {shown}: {notice.about} failed ({answer.said}); retrying for up to "
                    f"{self._retry_for_s:g} s")  # fmt: skip
            await trio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)


@contextlib.asynccontextmanager
async def notifying(notifier: Notifier, board_url: str | None, deliver: Deliver | None) -> AsyncIterator[Deliver]:
    """A delivery that queues each event's notice, then hands the event to `deliver` (the watch's
    own: `--exec`, or none); on leaving, the queues have _DRAIN_S to empty, then what is left is said."""
    import trio

    async def both(event: Event) -> None:
        notifier.put(notice_of(event, board_url))
        if deliver is not None:
            await deliver(event)

    async with trio.open_nursery() as nursery:
        notifier.start(nursery)
        try:
            yield both
        finally:
            notifier.close()  # the senders end once their queues are empty, or at the deadline
            nursery.cancel_scope.deadline = trio.current_time() + _DRAIN_S
    for target, count in notifier.unsent():
        log(f"--notify {target.shown}: {count} notification{'' if count == 1 else 's'} not sent: the watch stopped")


# ---------------------------------------------------------------------------------------------
# --notify-test


def notify_test(targets: Sequence[Target], timeout_s: float, board_url: str | None, host: str) -> int:
    """One message to every target at once; one line per target with its answer. 0 when all took it."""
    import trio

    if not targets:
        log(f"--notify-test: no URL to test (give --notify, --notify-file or {NOTIFY_URLS_ENV})")
        return 2
    title = "hctx: test notification"
    body = f"hctx watch --notify-test from host {host}: notifications from this watch reach you here."
    if board_url is not None:
        body += f"\n{board_url.rstrip('/')}/"
    notice = Notice(title, body, "the test message")
    answers: list[Answer | None] = [None] * len(targets)

    async def main() -> None:
        async def one(n: int, sender: _Sender) -> None:
            answers[n] = await sender.attempt(notice)

        async with trio.open_nursery() as nursery:
            for n, target in enumerate(targets):
                nursery.start_soon(one, n, _Sender(target, timeout_s))

    trio.run(main)
    failed = 0
    for target, answer in zip(targets, answers, strict=True):
        assert answer is not None
        failed += not answer.ok
        print(f"{'sent' if answer.ok else 'FAILED'}  {target.shown}  {answer.said}", flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# The command line


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return int(text)


def add_notify_options(watch: argparse.ArgumentParser) -> None:
    group = watch.add_argument_group("notifications (apprise URLs: ntfy, Slack, Discord, email, desktop, ...)")
    group.add_argument(
        "--notify", action="append", default=[], metavar="URL",
        help="send every event to this apprise URL (repeatable), e.g. ntfy://ntfy.sh/TOPIC or dbus:// for the "
        "desktop; a URL given here is visible in `ps`: put one that holds a secret in --notify-file or "
        f"{NOTIFY_URLS_ENV} instead",
    )  # fmt: skip
    group.add_argument(
        "--notify-file", action="append", default=[], type=Path, metavar="PATH",
        help=f"read apprise URLs from PATH, one a line, # for comments (repeatable); {NOTIFY_URLS_ENV} in the "
        "environment is read the same way",
    )  # fmt: skip
    group.add_argument(
        "--board-url", metavar="BASE",
        help="the `hctx web` board's address (e.g. http://127.0.0.1:9479): each notification links to "
        "the agent's page on it",
    )  # fmt: skip
    group.add_argument(
        "--notify-timeout", type=_seconds, default=DEFAULT_NOTIFY_TIMEOUT_S, metavar="S",
        help="give up one attempt to one target after S seconds (default: %(default)g)",
    )  # fmt: skip
    group.add_argument(
        "--notify-retry-for", type=_seconds, default=DEFAULT_NOTIFY_RETRY_FOR_S, metavar="S",
        help="retry a failed notification with back-off for at most S seconds, then give it up, said on "
        "stderr (default: %(default)g)",
    )  # fmt: skip
    group.add_argument(
        "--notify-queue", type=_count, default=DEFAULT_NOTIFY_QUEUE, metavar="N",
        help="notifications waiting per target at most; past it the newest is dropped for that target, "
        "said on stderr (default: %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--notify-test",
        action="store_true",
        help="send one test message to every target, print what each answered, and exit (1 if any failed)",
    )


def targets_of(args: argparse.Namespace) -> list[Target] | None:
    """The targets the arguments name (empty: no notifications); None, said, when one is unusable."""
    try:
        return read_targets(args.notify, args.notify_file, os.environ)
    except UsageError as exc:
        log(str(exc))
        return None


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line or the environment asks for notifications (or their test)."""
    return bool(args.notify or args.notify_file or args.notify_test or os.environ.get(NOTIFY_URLS_ENV))


def with_notifications(args: argparse.Namespace, targets: Sequence[Target]) -> Around:
    """The watch's run with every event also notified to `targets`, beside --exec's command if any."""

    def around(follow: Callable[[Deliver], Awaitable[None]], deliver: Deliver | None) -> Callable[[], Awaitable[None]]:
        async def main() -> None:
            notifier = Notifier(targets, timeout_s=args.notify_timeout, retry_for_s=args.notify_retry_for,
                                queue=args.notify_queue)  # fmt: skip
            async with notifying(notifier, args.board_url, deliver) as both:
                await follow(both)

        return main

    return around
