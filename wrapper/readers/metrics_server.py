"""The exporter's HTTP server: trio and h11, with every resource bounded.

- Connections: at most `Limits.connections` at once; a new one past it closes the connection that
  has waited longest for a request (an idle keep-alive, or one that never sent a request), and is
  itself closed when every connection is busy with a response.
- Time: a connection's first request head (and its TLS handshake) must be in within
  `Limits.header_s`; a kept-alive one is closed after `Limits.idle_s` without a request, and a
  response a client takes longer than `Limits.idle_s` to read is abandoned.
- Threads: one. Reading the catalog and rendering run in a single worker thread; scrapes that
  arrive while a read runs wait for it and are answered from it (one roster build shared by all).
- Memory: a request head is at most 16 KiB, a body is refused past 64 KiB, and every response of
  one read is the same bytes, sent in 64 KiB slices.

`/metrics` serves the exposition, `/` a small page naming it, anything else is a 404.
"""

from __future__ import annotations

import html
import signal
import ssl
import sys
from collections.abc import Iterable
from typing import Protocol

import h11
import trio

import guard


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
    "CHUNK",
    "LANDING",
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "OPENMETRICS",
    "REASONS",
    "TEXT_0_0_4",
    "Exporter",
    "Limits",
    "MetricsServer",
    "serve_exporter",
]

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
CHUNK = 64 * 1024
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
REASONS = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed", 500: b"Internal Server Error"}


class _Refused(Exception):
    """The request cannot be read: the connection is closed."""


class MetricsServer:
    def __init__(self, exporter: Exporter, limits: Limits) -> None:
        self.exporter, self.limits = exporter, limits
        self.open = 0
        self._waiting: dict[int, trio.CancelScope] = {}  # connections waiting for a request, oldest first
        self._serial = 0
        self._reading: trio.Event | None = None
        self._worker = trio.CapacityLimiter(1)

    async def handle(self, stream: trio.abc.Stream) -> None:
        self._serial += 1
        key = self._serial
        if self.open >= self.limits.connections:
            if not self._waiting:
                await trio.aclose_forcefully(stream)
                return
            self._waiting.pop(next(iter(self._waiting))).cancel()
        self.open += 1
        try:
            await self._converse(key, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, h11.ProtocolError,
                ssl.SSLError, OSError, _Refused):  # fmt: skip
            pass  # the client went away, was too slow or spoke no HTTP: its connection alone ends
        finally:
            self.open -= 1
            self._waiting.pop(key, None)
            await trio.aclose_forcefully(stream)

    async def _converse(self, key: int, stream: trio.abc.Stream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        wait_s = self.limits.header_s
        while True:
            request = None
            with trio.CancelScope() as scope:
                self._waiting[key] = scope
                with trio.fail_after(wait_s):
                    request = await self._request(stream, connection)
            self._waiting.pop(key, None)
            if request is None:
                return
            status, headers, parts = await self._answer(request)
            with trio.fail_after(self.limits.idle_s):  # a client too slow to take its answer
                await self._send_response(stream, connection, request, status, headers, parts)
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return
            connection.start_next_cycle()
            wait_s = self.limits.idle_s

    async def _receive(self, stream: trio.abc.Stream, connection: h11.Connection) -> object:
        while True:
            event = connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            # At most a head's bound at a time: h11 refuses a head that outgrows it while incomplete.
            connection.receive_data(bytes(await stream.receive_some(MAX_HEAD_BYTES)))

    async def _request(self, stream: trio.abc.Stream, connection: h11.Connection) -> h11.Request | None:
        event = await self._receive(stream, connection)
        if not isinstance(event, h11.Request):
            return None  # closed before a request
        body = 0
        while not isinstance(part := await self._receive(stream, connection), h11.EndOfMessage):
            if not isinstance(part, h11.Data):
                raise _Refused
            body += len(part.data)
            if body > MAX_BODY_BYTES:
                raise _Refused
        return event

    async def _answer(self, request: h11.Request) -> tuple[int, list[tuple[str, str]], list[bytes]]:
        """The status, headers and body parts for a request (a scrape waits here for its read)."""
        path = request.target.split(b"?", 1)[0]
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
        extra: list[tuple[str, str]] = []
        if request.method not in (b"GET", b"HEAD"):
            status, kind, parts = 405, "text/plain; charset=utf-8", [b"only GET and HEAD\n"]
            extra.append(("Allow", "GET, HEAD"))
        elif path == b"/metrics":
            from prometheus_client.exposition import gzip_accepted

            openmetrics = headers.get("accept", "").find("application/openmetrics-text") >= 0
            compressed = gzip_accepted(headers.get("accept-encoding", ""))
            try:
                await self.read()
                parts = await trio.to_thread.run_sync(self.exporter.body, openmetrics, compressed,
                                                      limiter=self._worker)  # fmt: skip
            except Exception as exc:  # a bug must cost this scrape, never the server
                print(f"hctx metrics: scrape failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                status, kind, parts = 500, "text/plain; charset=utf-8", [b"scrape failed; see the exporter's log\n"]
            else:
                status, kind = 200, OPENMETRICS if openmetrics else TEXT_0_0_4
                if compressed:
                    extra.append(("Content-Encoding", "gzip"))
                extra.append(("Vary", "Accept, Accept-Encoding"))
        elif path == b"/":
            status, kind, parts = 200, "text/html; charset=utf-8", [LANDING]
        else:
            status, kind, parts = 404, "text/plain; charset=utf-8", [b"not found; the metrics are at /metrics\n"]
        length = sum(len(part) for part in parts)
        return status, [("Content-Type", kind), ("Content-Length", str(length)), *extra], parts

    async def _send_response(
        self,
        stream: trio.abc.Stream,
        connection: h11.Connection,
        request: h11.Request,
        status: int,
        headers: list[tuple[str, str]],
        parts: list[bytes],
    ) -> None:
        response = h11.Response(status_code=status, headers=headers, reason=REASONS[status])
        await stream.send_all(connection.send(response) or b"")
        if request.method != b"HEAD":
            for part in parts:
                await self._send(stream, connection.send_with_data_passthrough(h11.Data(data=part)) or ())
        await stream.send_all(connection.send(h11.EndOfMessage()) or b"")

    @staticmethod
    async def _send(stream: trio.abc.Stream, pieces: Iterable[bytes]) -> None:
        for piece in pieces:
            view = memoryview(piece)
            for start in range(0, len(view), CHUNK):
                await stream.send_all(view[start : start + CHUNK])

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
    server = MetricsServer(exporter, limits)

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

            nursery.start_soon(stop_on_signal)
            nursery.start_soon(trio.serve_listeners, server.handle, listeners)
        return 0

    return trio.run(main)
