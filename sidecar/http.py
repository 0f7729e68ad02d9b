"""A tiny HTTP/1.1 `GET` client: h11 for the protocol, `trio.open_tcp_stream` for the bytes.

The sidecar talks HTTP to one kind of server, the OpenCode server the wrapper made listen on
loopback (`http://127.0.0.1:PORT`), and only reads from it: `GET /event` (a `text/event-stream`
body that never ends) and two small JSON answers. A general client (httpx, with httpcore, anyio and
certifi) cost that sidecar about 4.5 MB of RSS; this is the part of one it uses, in h11's manner:
h11 turns bytes into events, this module only moves the bytes and bounds the waits.

What it does not do, on purpose:

- no TLS: `http://` only (`parse_url` refuses anything else, so a config names it at validation);
- no proxy: h11 knows nothing of the environment, so `HTTP_PROXY` / `ALL_PROXY` never apply and
  loopback traffic can never be sent to a proxy (httpx needed `trust_env=False` for that);
- no redirects, no compression (`accept-encoding: identity`; a body encoded anyway is refused,
  never handed on undecoded), no cookies, no connection reuse: one connection per request
  (`connection: close`), which on loopback costs nothing.

The body is whatever framing the server chose: `content-length`, `chunked`, or "until the server
closes" (OpenCode's `/event`); h11 tells them apart, and a body cut short of its declared end is an
error, not an end. Every failure, whether a refused connection, a timeout, a status that is not
2xx, a malformed or oversized head or a reset, is an `HttpError` whose message is the sentence to
log; nothing else escapes (`trio.Cancelled` aside, which must).

    async with get(parse_url("http://127.0.0.1:4096"), "/event", head_seconds=3, read_seconds=25) as response:
        response.raise_for_status()
        async for data in response:  # each piece as it arrived
            ...
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

import h11
import trio

from guard.errors import ConfigError, HttpError, HttpStatusError, HttpTimeout

__all__ = [
    "MAX_HEAD_BYTES",
    "RECEIVE_BYTES",
    "USER_AGENT",
    "Head",
    "Response",
    "Url",
    "get",
    "parse_url",
]

# A response head (status line and headers) larger than this is refused: OpenCode's are ~200 bytes.
MAX_HEAD_BYTES: Final = 64 * 1024
RECEIVE_BYTES: Final = 64 * 1024
USER_AGENT: Final = "hctx-sidecar"


@dataclass(frozen=True, slots=True)
class Url:
    """Where a server listens: `host` as `open_tcp_stream` takes it (an IPv6 literal unbracketed)
    and the path prefix every request's path is appended to ("" for none)."""

    host: str
    port: int
    prefix: str = ""

    @property
    def authority(self) -> str:
        """The `host` header's value."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"http://{self.authority}{self.prefix}"


def parse_url(text: str) -> Url:
    """`http://host[:port][/prefix]`; anything else (https, userinfo, a query) is a ConfigError (a
    ValueError) that says what is supported."""
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"not a usable http:// URL ({exc}): {text!r}") from None
    if parts.scheme.lower() != "http":
        raise ConfigError(f"only plain http:// is supported (no TLS; the server is on loopback): {text!r}")
    if not parts.hostname:
        raise ConfigError(f"no host in {text!r}")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ConfigError(f"only http://host:port[/path] is supported: {text!r}")
    return Url(parts.hostname, 80 if port is None else port, parts.path.rstrip("/"))


@dataclass(frozen=True, slots=True)
class Head:
    """A response's status line and headers (names lowercased, values as sent)."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        """The first value of header `name` (lowercase), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Response:
    """A response whose head has arrived; iterate it for the body's pieces, each as it arrived
    (every wait for more bounded by `read_seconds`), or `read` it whole."""

    def __init__(
        self, head: Head, url: str, conn: h11.Connection, stream: trio.SocketStream, read_seconds: float
    ) -> None:
        self.head = head
        self.url = url
        self._conn = conn
        self._stream = stream
        self._read_seconds = read_seconds
        self._done = False

    @property
    def status(self) -> int:
        return self.head.status

    def raise_for_status(self) -> None:
        if not 200 <= self.head.status < 300:
            why = f"{self.head.status} {self.head.reason}".rstrip()
            raise HttpStatusError(f"GET {self.url} answered {why}", self.head.status)

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        data = await self.receive()
        if data is None:
            raise StopAsyncIteration
        return data

    async def receive(self) -> bytes | None:
        """The body's next piece, or None once it is complete."""
        while not self._done:
            event = await _next_event(self._conn, self._stream, self._read_seconds, self.url, "body bytes")
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._done = True
            else:  # h11 yields nothing else on a client between the head and the end
                raise HttpError(f"GET {self.url}: unexpected {type(event).__name__} in the body")
        return None

    async def read(self, max_bytes: int) -> bytes:
        """The whole body; an HttpError once it grows past `max_bytes`."""
        pieces: list[bytes] = []
        size = 0
        async for data in self:
            size += len(data)
            if size > max_bytes:
                raise HttpError(f"GET {self.url}: the body is larger than {max_bytes} bytes")
            pieces.append(data)
        return b"".join(pieces)


@asynccontextmanager
async def get(
    url: Url,
    path: str,
    *,
    query: Mapping[str, str] | None = None,
    headers: Sequence[tuple[str, str]] = (),
    head_seconds: float,
    read_seconds: float,
) -> AsyncIterator[Response]:
    """`GET url.prefix + path?query` on a connection of its own, closed when the block ends.

    Connecting, sending the request and receiving the response head must all happen within
    `head_seconds`; after that each wait for more of the body is bounded by `read_seconds`. Either
    limit passed is an `HttpTimeout`.
    """
    target = url.prefix + path
    if query:
        target += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    shown = f"{url}{path}"
    names = {name.lower() for name, _ in headers}
    defaults = [("accept", "*/*"), ("accept-encoding", "identity"), ("user-agent", USER_AGENT)]
    request = h11.Request(
        method="GET",
        target=target,
        headers=[
            ("host", url.authority),
            *headers,
            *((name, value) for name, value in defaults if name not in names),
            ("connection", "close"),
        ],
    )
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    stream: trio.SocketStream | None = None
    try:
        with trio.move_on_after(head_seconds) as waited:
            stream = await _connect(url, shown)
            await _send(stream, conn.send(request) + conn.send(h11.EndOfMessage()), shown)
            event = await _next_event(conn, stream, math.inf, shown, "a response head")
            while isinstance(event, h11.InformationalResponse):  # a 1xx before the answer
                event = await _next_event(conn, stream, math.inf, shown, "a response head")
        if waited.cancelled_caught:
            raise HttpTimeout(f"GET {shown}: no response head within {head_seconds:g} s")
        if not isinstance(event, h11.Response):
            raise HttpError(f"GET {shown}: unexpected {type(event).__name__} instead of a response head")
        head = Head(
            event.status_code,
            event.reason.decode("latin-1"),
            tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers),
        )
        encoding = head.header("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            raise HttpError(f"GET {shown}: unsupported content-encoding {encoding!r} (identity was asked for)")
        assert stream is not None  # the head arrived on it
        yield Response(head, shown, conn, stream, read_seconds)
    finally:
        if stream is not None:
            await stream.aclose()


async def _connect(url: Url, shown: str) -> trio.SocketStream:
    try:
        return await trio.open_tcp_stream(url.host, url.port)
    except OSError as exc:
        raise HttpError(f"GET {shown}: cannot connect: {exc.strerror or exc}") from None


async def _send(stream: trio.SocketStream, data: bytes, shown: str) -> None:
    try:
        await stream.send_all(data)
    except (OSError, trio.BrokenResourceError) as exc:
        raise HttpError(f"GET {shown}: the connection broke while sending the request: {exc}") from None


async def _next_event(conn: h11.Connection, stream: trio.SocketStream, seconds: float, shown: str, what: str) -> object:
    """h11's next event, receiving bytes (each wait at most `seconds`) until it has one."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise HttpError(f"GET {shown}: {_protocol_error(exc)}") from None
        if event is not h11.NEED_DATA:
            return event
        data = b""
        with trio.move_on_after(seconds):
            try:
                data = await stream.receive_some(RECEIVE_BYTES)
            except (OSError, trio.BrokenResourceError) as exc:
                raise HttpError(f"GET {shown}: the connection broke: {exc}") from None
            try:
                conn.receive_data(data)  # b"": the server closed its end
            except h11.RemoteProtocolError as exc:
                raise HttpError(f"GET {shown}: {_protocol_error(exc)}") from None
            continue
        raise HttpTimeout(f"GET {shown}: no {what} for {seconds:g} s")


def _protocol_error(exc: h11.RemoteProtocolError) -> str:
    text = str(exc)
    if "buffer too long" in text.lower():
        return f"the response head is larger than {MAX_HEAD_BYTES} bytes"
    if "without sending complete message body" in text:  # h11 adds "(received N bytes, expected M)"
        detail = text.partition(" body")[2]
        return f"the server closed the connection before the end of the body{detail}"
    if "unexpectedly closed" in text or "event type ConnectionClosed" in text:  # within the head, or before it
        return "the server closed the connection before a complete response head"
    return f"not a valid HTTP/1.1 response ({text})"
