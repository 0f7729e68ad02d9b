"""`hctx web`: the command line of the board. Starlette, hypercorn and the board's modules load
when the command runs, never with another `hctx` command.

The socket is bound here, before the server starts, so a port in use is one clear line and exit 2,
and the URL on stdout is the port actually bound (`--listen 127.0.0.1:0` picks a free one). It
carries the write timeout (TCP_USER_TIMEOUT, which every accepted connection inherits): a page that
stops reading is dropped by the kernel once its unread data waited that long.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import resource
import signal
import socket
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from guard.errors import CatalogError
from wrapper.arguments import (
    TLS_PAIRING,
    add_catalog_options,
    add_tls_options,
    existing_catalog,
    fail,
    positive_int,
    positive_seconds,
    tls_unpaired,
    with_host,
)
from wrapper.readers.metrics import listen_address

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_WRITE_TIMEOUT_S",
    "DESCRIPTORS_WANTED",
    "FD_RESERVE",
    "STREAMS_CEILING",
    "WILDCARDS",
    "allowed_hosts",
    "default_max_streams",
    "is_loopback",
    "needs_token",
    "raise_descriptor_limit",
    "register",
    "run_web",
]

DEFAULT_LISTEN = ("127.0.0.1", 9479)
WILDCARDS = frozenset({"0.0.0.0", "::"})
DEFAULT_WRITE_TIMEOUT_S = 10.0
# Descriptors kept for what is not an event stream: the listener, inotify, the catalog's reads,
# page and API requests, and the connections a refusal answers.
FD_RESERVE = 128
STREAMS_CEILING = 4096  # memory, not descriptors, bounds it past this
DESCRIPTORS_WANTED = 65536


def raise_descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE raised toward the hard one (as Go's runtime does; 1,024 is a shell's
    usual soft limit, a few hundred pages); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = DESCRIPTORS_WANTED if hard == resource.RLIM_INFINITY else min(hard, DESCRIPTORS_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def default_max_streams(descriptors: int) -> int:
    """Three quarters of the descriptors past FD_RESERVE, at most STREAMS_CEILING, at least 1: the
    streams past it are refused while descriptors remain to answer them and to serve pages."""
    return max(1, min(STREAMS_CEILING, (descriptors - FD_RESERVE) * 3 // 4))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, extra: Sequence[str] = ()) -> list[str]:
    """The Host headers the board answers: the address it listens on and localhost; on every
    interface (0.0.0.0, ::) also this machine's own names; and the names given (`--allow-host`)."""
    names = {f"[{host}]" if ":" in host else host, "localhost", *extra}
    if host in WILDCARDS:
        names |= {socket.gethostname(), socket.getfqdn()}
    return sorted(name.lower() for name in names)


def _bind(host: str, port: int, write_timeout_s: float) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT is not "in use"
        # hypercorn's writes are shielded from cancellation: the kernel ends a connection whose
        # sent data waited unacknowledged (a reader's full window included) this long.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(write_timeout_s * 1000)))
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def needs_token(host: str, args: argparse.Namespace) -> bool:
    """A board others can reach answers only its token: on an address that is not loopback, or when
    asked (`--require-token`, for a loopback board a tunnel or a proxy exposes)."""
    return bool(args.require_token) or not is_loopback(host)


async def _serve(args: argparse.Namespace, catalog: Path, sock: socket.socket, url: str, token: str | None) -> None:
    """Until SIGINT or SIGTERM: the board kept current, and hypercorn serving it on `sock`."""
    import anyio
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from wrapper.readers.web.app import make_app
    from wrapper.readers.web.feed import Board, follow, serving_collector

    serving_collector()
    board = Board(catalog, args.host, settle=True)
    config = Config()
    host = sock.getsockname()[0]
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn's from here on
    config.accesslog = None
    config.loglevel = "WARNING"
    config.graceful_timeout = 1.0  # event streams never end by themselves
    if args.tls_cert:
        config.certfile, config.keyfile = args.tls_cert, args.tls_key
        if args.tls_client_ca:
            import ssl

            config.ca_certs, config.verify_mode = args.tls_client_ca, ssl.CERT_REQUIRED
    app = make_app(board, allowed_hosts(host, args.allow_host), max_streams=args.max_streams)
    if token is not None:
        from wrapper.readers.web.app import SecurityHeaders
        from wrapper.readers.web.token import TokenGate

        app = TokenGate(app, token, secure=bool(args.tls_cert), headers=SecurityHeaders.HEADERS)  # type: ignore[assignment]
    stop = anyio.Event()

    async def stop_on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                stop.set()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signal)
        nursery.start_soon(partial(follow, board, stop, reread_s=args.reread))
        await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        print(url, flush=True)
        await stop.wait()
        await trio.sleep(config.graceful_timeout + 0.5)  # hypercorn's own graceful end
        nursery.cancel_scope.cancel()


def run_web(args: argparse.Namespace) -> int:
    from wrapper.readers.web.feed import DEFAULT_REREAD_S

    if args.reread is None:
        args.reread = DEFAULT_REREAD_S
    descriptors = raise_descriptor_limit()
    if args.max_streams is None:
        args.max_streams = default_max_streams(descriptors)
    if tls_unpaired(args):
        return fail("web", TLS_PAIRING, 2)
    try:
        catalog = existing_catalog(args)
    except CatalogError as exc:
        return fail("web", f"cannot read the catalog: {exc}", 2)
    host, port = args.listen or DEFAULT_LISTEN
    try:
        sock = _bind(host, port, args.write_timeout)
    except OSError as exc:
        why = "the port is in use (another hctx web?)" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        return fail("web", f"cannot listen on {host}:{port}: {why}", 2)
    token = None
    if needs_token(host, args):
        from wrapper.readers.web.token import QUERY, new_token

        token = new_token()
    if not is_loopback(host):
        print(
            f"hctx web: warning: listening on {host}, not loopback: the board shows every agent's data to "
            "whoever holds the URL below (its access token)"
            + ("" if args.tls_cert else ", unencrypted (no --tls-cert): anyone on the path can read both"),
            file=sys.stderr,
            flush=True,
        )
    import trio

    scheme = "https" if args.tls_cert else "http"
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # The token is printed once, here, on stdout: never in argv (ps) or a log.
    url = f"{scheme}://{shown}:{bound_port}/" + ("" if token is None else f"?{QUERY}={token}")
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C during the graceful end
        trio.run(_serve, args, catalog, sock, url, token)
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    web = commands.add_parser(
        "web",
        help="a live, read-only board of every agent in a browser",
        description="Serves the fleet page (every agent of every host in the catalog: fill, headroom, "
        "compactions, age, cost, rate limits), one page per agent with its fill over time, and a JSON API "
        "(/api/agents is `hctx agents --json`). Records changed on disk reach an open page within a "
        f"second. Listens on {DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]} unless told otherwise; the first "
        "line on stdout is the URL. Stops on SIGINT or SIGTERM.",
    )
    web.add_argument(
        "--listen", type=listen_address, metavar="HOST:PORT",
        help=f"where to serve (default: {DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}; port 0 picks a free one; "
        "an address that is not loopback answers only its access token: the first line on stdout is then "
        "the URL carrying it, which sets a cookie once opened)",
    )  # fmt: skip
    web.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="also answer requests for this Host name (the address or DNS name a phone or a proxy uses; "
        "repeatable); any other Host is refused",
    )  # fmt: skip
    web.add_argument(
        "--require-token", action="store_true",
        help="require the access token on a loopback address too (one a tunnel or a proxy exposes)",
    )  # fmt: skip
    add_tls_options(web)
    web.add_argument(
        "--reread", type=positive_seconds, metavar="S",
        help="re-read the whole catalog every S seconds, for records going stale and changes a file event "
        "missed (default: 30)",
    )  # fmt: skip
    web.add_argument(
        "--max-streams", type=positive_int, metavar="N",
        help="event streams (open pages) served at once; past it a page is refused with 503 and a line on "
        f"stderr (default: three quarters of the open-file limit past {FD_RESERVE}, at most {STREAMS_CEILING})",
    )  # fmt: skip
    web.add_argument(
        "--write-timeout", type=positive_seconds, metavar="S", default=DEFAULT_WRITE_TIMEOUT_S,
        help="drop a page whose connection has not taken what it was sent for S seconds (default: "
        f"{DEFAULT_WRITE_TIMEOUT_S:g})",
    )  # fmt: skip
    add_catalog_options(web)
    web.set_defaults(run=with_host(run_web))
