"""The exporter's HTTP server: Hypercorn (the board's server too) on trio, every resource bounded.

Hypercorn speaks HTTP (h11) and keeps a kept-alive connection for `Limits.idle_s`; what it has no
setting for is held here, around each of its connections, and in the ASGI app:

- Connections: at most `Limits.connections` at once; a new one past it closes the connection that
  has waited longest for a request (an idle keep-alive, or one that never sent a request), and is
  itself closed when every connection is busy with a response.
- Time: a connection's first request head (and its TLS handshake) must be in within
  `Limits.header_s`; a kept-alive one is closed after `Limits.idle_s` without a request (Hypercorn's
  `keep_alive_timeout`), and a response a client takes longer than `Limits.idle_s` to read is
  abandoned (Hypercorn's sends have no deadline of their own).
- Threads: one. Reading the catalog and rendering run in a single worker thread; scrapes that
  arrive while a read runs wait for it and are answered from it (one roster build shared by all).
- Memory: a request head is at most 16 KiB (answered 431 past it: h11 bounds only a head still
  incomplete, so one that arrives whole in a read of Hypercorn's 64 KiB is measured here), a body
  past 64 KiB is answered 413, and every response of one read is the same bytes.

`/metrics` serves the exposition, `/` a small page naming it, anything else is a 404.
"""

from __future__ import annotations

import html
import itertools
import math
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

import guard

# ASGI's own shapes (Hypercorn types them as TypedDicts a plain app need not import).
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Exporter(Protocol):
    """What the server needs of wrapper.readers.metrics.Exporter (kept apart: no import cycle)."""

    def build(self) -> None: ...

    def body(self, openmetrics: bool, compressed: bool = False) -> list[bytes]: ...


class Limits(Protocol):
    @property
    def connections(self) -> int: ...

    @property
    def header_s(self) -> float: ...

    @property
    def idle_s(self) -> float: ...


__all__ = [
    "LANDING",
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "OPENMETRICS",
    "PLAIN",
    "TEXT_0_0_4",
    "Exporter",
    "Limits",
    "Message",
    "MetricsApp",
    "Receive",
    "Scope",
    "Send",
    "head_bytes",
    "serve_exporter",
]

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
PLAIN = "text/plain; charset=utf-8"


def head_bytes(scope: Scope) -> int:
    """The size of the request head as it came: request line, header lines, the blank line (h11
    hands over the headers without the whitespace around a value: at most that much is not counted)."""
    target = len(scope["raw_path"]) + (len(scope["query_string"]) + 1 if scope["query_string"] else 0)
    line = len(scope["method"]) + 1 + target + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + 2 + len(value) + 2 for name, value in scope["headers"]) + 2


@dataclass
class _Connection:
    scope: trio.CancelScope  # cancelled: the connection is closed (evicted, or its first head is late)
    busy: bool = False  # a request is being answered


class MetricsApp:
    """The ASGI app, and the connection bounds Hypercorn does not hold (`connection` wraps each)."""

    def __init__(self, exporter: Exporter, limits: Limits) -> None:
        self.exporter, self.limits = exporter, limits
        self._connections: dict[int, _Connection] = {}  # open connections, oldest first
        self._by_peer: dict[tuple[str, int], int] = {}
        self._serial = itertools.count()
        self._reading: trio.Event | None = None
        self._worker = trio.CapacityLimiter(1)

    @property
    def open(self) -> int:
        return len(self._connections)

    async def connection(self, stream: trio.abc.Stream, serve: Callable[[trio.abc.Stream], Awaitable[None]]) -> None:
        """Serve one accepted connection with `serve` (Hypercorn's), within the bounds."""
        if self.open >= self.limits.connections:
            idle = next((key for key, it in self._connections.items() if not it.busy), None)
            if idle is None:
                await trio.aclose_forcefully(stream)
                return
            self._connections.pop(idle).scope.cancel()
        key = next(self._serial)
        peer: tuple[str, int] | None = None
        with trio.CancelScope(deadline=trio.current_time() + self.limits.header_s) as scope:
            self._connections[key] = _Connection(scope)
            try:
                if isinstance(stream, trio.SSLStream):
                    await stream.do_handshake()
                socket = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket  # type: ignore[attr-defined]
                peer = tuple(socket.getpeername()[:2])
                self._by_peer[peer] = key
                await serve(_Bounded(stream, socket, self.limits.idle_s))
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                pass  # the client went away or spoke no TLS: its connection alone ends
            finally:
                self._connections.pop(key, None)
                if peer is not None:
                    self._by_peer.pop(peer, None)
                await trio.aclose_forcefully(stream)

    def _mark(self, scope: Scope, busy: bool) -> None:
        client = scope.get("client")
        key = None if client is None else self._by_peer.get((client[0], client[1]))
        if key is not None and (it := self._connections.get(key)) is not None:
            it.busy = busy
            it.scope.deadline = math.inf  # a request came in time: Hypercorn's keep-alive rules from here

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to start or stop
        self._mark(scope, True)
        try:
            status, headers, parts = await self._answer(scope, receive)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(name.encode(), value.encode()) for name, value in headers]})  # fmt: skip
            if scope["method"] == "HEAD":
                parts = []
            for index, part in enumerate(parts):
                await send({"type": "http.response.body", "body": part, "more_body": index < len(parts) - 1})
            if not parts:
                await send({"type": "http.response.body", "body": b""})
        finally:
            self._mark(scope, False)

    async def _answer(self, scope: Scope, receive: Receive) -> tuple[int, list[tuple[str, str]], list[bytes]]:
        """The status, headers and body parts for a request (a scrape waits here for its read)."""
        extra: list[tuple[str, str]] = []
        if head_bytes(scope) > MAX_HEAD_BYTES:
            status, kind, parts = 431, PLAIN, [b"request head past 16 KiB\n"]
            extra.append(("Connection", "close"))
        elif not await _body_within_bound(receive):
            status, kind, parts = 413, PLAIN, [b"request body past 64 KiB\n"]
            extra.append(("Connection", "close"))
        elif scope["method"] not in ("GET", "HEAD"):
            status, kind, parts = 405, PLAIN, [b"only GET and HEAD\n"]
            extra.append(("Allow", "GET, HEAD"))
        elif scope["path"] == "/metrics":
            from prometheus_client.exposition import gzip_accepted

            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
            openmetrics = headers.get("accept", "").find("application/openmetrics-text") >= 0
            compressed = gzip_accepted(headers.get("accept-encoding", ""))
            try:
                await self.read()
                parts = await trio.to_thread.run_sync(self.exporter.body, openmetrics, compressed,
                                                      limiter=self._worker)  # fmt: skip
            except Exception as exc:  # a bug must cost this scrape, never the server
                print(f"hctx metrics: scrape failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                status, kind, parts = 500, PLAIN, [b"scrape failed; see the exporter's log\n"]
            else:
                status, kind = 200, OPENMETRICS if openmetrics else TEXT_0_0_4
                if compressed:
                    extra.append(("Content-Encoding", "gzip"))
                extra.append(("Vary", "Accept, Accept-Encoding"))
        elif scope["path"] == "/":
            status, kind, parts = 200, "text/html; charset=utf-8", [LANDING]
        else:
            status, kind, parts = 404, PLAIN, [b"not found; the metrics are at /metrics\n"]
        length = sum(len(part) for part in parts)
        return status, [("Content-Type", kind), ("Content-Length", str(length)), *extra], parts

    async def read(self) -> None:
        """One catalog read for every scrape that arrives while it runs."""
        if self._reading is not None:
            await self._reading.wait()
            return
        self._reading = trio.Event()
        try:
            await trio.to_thread.run_sync(self.exporter.build, limiter=self._worker)
        finally:
            self._reading.set()
            self._reading = None


async def _body_within_bound(receive: Receive) -> bool:
    """Read the request body; False as soon as it passes MAX_BODY_BYTES."""
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return True  # the client left; the answer goes nowhere
        size += len(message.get("body", b""))
        if size > MAX_BODY_BYTES:
            return False
        if not message.get("more_body", False):
            return True


class _Bounded(trio.abc.Stream):
    """A connection whose every send must be taken by the client within `send_s`: Hypercorn sends
    shielded from cancellation and without a deadline, so a client that never reads would hold its
    connection (and the response's bytes) for ever. Too slow: the connection is closed."""

    def __init__(self, inner: trio.abc.Stream, socket: Any, send_s: float) -> None:
        self.inner, self.socket, self.send_s = inner, socket, send_s  # `socket`: Hypercorn reads its addresses

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with trio.move_on_after(self.send_s) as late:
            await self.inner.send_all(data)
        if late.cancelled_caught:
            await trio.aclose_forcefully(self.inner)
            raise trio.BrokenResourceError("the client took longer than the idle timeout to read")

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        if not isinstance(self.inner, trio.abc.HalfCloseableStream):
            raise AttributeError("send_eof")  # as Hypercorn expects of a TLS stream
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


LANDING = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hctx metrics</title></head>
<body><h1>hctx metrics</h1>
<p>The context-window fill of every agent in this host's catalog, for Prometheus:
<a href="/metrics">/metrics</a>.</p>
<p>hctx {html.escape(guard.__version__)}</p></body></html>
""".encode()


def _tls(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _hypercorn(app: MetricsApp, limits: Limits) -> Callable[[trio.abc.Stream], Awaitable[None]]:
    """Hypercorn's connection server for `app` (what `hypercorn.trio.serve` runs per connection;
    called here so that each connection passes through `MetricsApp.connection` first)."""
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.config import Config
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext

    config = Config()
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.keep_alive_timeout = limits.idle_s
    config.accesslog = None
    config.loglevel = "WARNING"
    config.include_server_header = False  # which server software answers is nobody's business
    context, wrapped = WorkerContext(None), ASGIWrapper(app)  # type: ignore[arg-type]

    async def serve(stream: trio.abc.Stream) -> None:
        await TCPServer(wrapped, config, context, {}, stream)  # type: ignore[arg-type]

    return serve


def serve_exporter(
    exporter: Exporter,
    address: tuple[str, int],
    limits: Limits,
    cert: str | None = None,
    key: str | None = None,
    client_ca: str | None = None,
) -> int:
    """Serve until SIGINT or SIGTERM; 2 when the address or the TLS files cannot be used."""
    host, port = address
    try:
        context = None if cert is None or key is None else _tls(cert, key, client_ca)
    except (OSError, ssl.SSLError) as exc:  # there, but no certificate, key or CA the other wants
        files = " and ".join(f"{option} {name}" for option, name in (("--tls-cert", cert), ("--tls-key", key),
                             ("--tls-client-ca", client_ca)) if name)  # fmt: skip
        print(f"hctx metrics: cannot serve HTTPS: {files}: {getattr(exc, 'reason', None) or exc}", file=sys.stderr)
        return 2
    app = MetricsApp(exporter, limits)
    serve = _hypercorn(app, limits)

    async def main() -> int:
        try:
            listeners: list[trio.abc.Listener[trio.abc.Stream]] = list(await trio.open_tcp_listeners(port, host=host))
        except OSError as exc:
            print(f"hctx metrics: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        bound = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
        if context is not None:
            listeners = [trio.SSLListener(listener, context, https_compatible=True) for listener in listeners]
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if context else "http"
        print(f"hctx metrics: serving {scheme}://{shown}:{bound}/metrics", file=sys.stderr, flush=True)
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

            async def handle(stream: trio.abc.Stream) -> None:
                await app.connection(stream, serve)

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(trio.serve_listeners, handle, listeners)
        return 0

    return trio.run(main)
