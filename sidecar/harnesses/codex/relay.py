"""The Codex app-server websocket relay: listen where the client asked, tap, forward.

`hctx wrap -- codex app-server --listen ws://IP:PORT` starts the real app-server on a private
loopback port (`sidecar.harnesses.codex.launch`) and hands the transport both addresses
(`sidecar.harnesses.codex.producer.Relay`: `listen`, the client's; `upstream`, 127.0.0.1:PRIVATE).

Every client connection gets its own upstream connection; every message is forwarded unchanged in
both directions, and each server→client text message's UTF-8 bytes also go to that connection's
own `websocket` stream (`streams.open`), whose decoder is the one every Codex wire shares
(`sidecar.harnesses.codex.producer.parse_message`). Connections are independent: one failing or closing
never touches another. Plain HTTP on the listen address (the app-server's `/readyz` and `/healthz`)
is piped through byte for byte.

Its own module, so trio-websocket loads only in a sidecar that relays (`sidecar.harnesses.codex.transport`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import trio
import trio_websocket
from trio_websocket import ConnectionRejected, WebSocketConnection, WebSocketRequest

from sidecar.harnesses.codex.events import WEBSOCKET
from sidecar.harnesses.codex.producer import Relay
from sidecar.spec import ConfigError, Stream, Streams

__all__ = [
    "MAX_MESSAGE_BYTES",
    "PIPE_CHUNK",
    "RECEIVE_BYTES",
    "REQUEST_HEAD_LIMIT",
    "REQUEST_HEAD_TIMEOUT_S",
    "UPSTREAM_READY_TIMEOUT_S",
    "UPSTREAM_RETRY_S",
    "Address",
    "run_relay",
    "serve_relay",
]

log = logging.getLogger(__name__)

# A thread/resume response carries the whole history in one message; trio-websocket's 1 MiB default
# would cut such a connection where the bare app-server would not.
MAX_MESSAGE_BYTES: Final = 256 * 1024 * 1024
# trio-websocket reads 4 KiB at a time by default: a 64 KiB response took 16 reads on each side.
RECEIVE_BYTES: Final = 256 * 1024
# The client may connect before the freshly started app-server listens; the lab saw it take 2.4 s
# to answer `initialize` from a cold page cache.
UPSTREAM_READY_TIMEOUT_S: Final = 30.0
UPSTREAM_RETRY_S: Final = 0.05
REQUEST_HEAD_LIMIT: Final = 64 * 1024
REQUEST_HEAD_TIMEOUT_S: Final = 30.0
PIPE_CHUNK: Final = 64 * 1024

# Handshake headers each hop writes for itself; everything else the client sent goes upstream.
_HOP_HEADERS: Final = frozenset({
    b"host", b"upgrade", b"connection", b"sec-websocket-key", b"sec-websocket-version",
    b"sec-websocket-extensions", b"sec-websocket-protocol", b"content-length", b"transfer-encoding",
})  # fmt: skip
# Close codes a peer may not put on the wire (RFC 6455 §7.4.1).
_NO_STATUS_CODE: Final = 1005
_ABNORMAL_CLOSE_CODES: Final = frozenset({1006, 1015})


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Address:
        parts = urlsplit(url)
        if parts.scheme != "ws" or parts.hostname is None or parts.port is None:
            raise ConfigError(f"not a ws://HOST:PORT address: {url!r}")
        return cls(parts.hostname, parts.port)


async def run_relay(config: Relay, streams: Streams) -> None:
    await serve_relay(Address.parse(config.listen), Address.parse(config.upstream), streams)


async def serve_relay(
    listen: Address,
    upstream: Address,
    streams: Streams,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status` reports the bound listeners (port 0 picks one)."""
    listeners = await trio.open_tcp_listeners(listen.port, host=listen.host)
    log.info("codex relay listening", extra={"event": "relay-listening", "listen": str(listen)})
    relay = _Relay(upstream, streams)
    await trio.serve_listeners(relay.handle, listeners, task_status=task_status)


class _Relay:
    def __init__(self, upstream: Address, streams: Streams) -> None:
        self.upstream = upstream
        self.streams = streams

    async def handle(self, stream: trio.SocketStream) -> None:
        """One client connection, start to end; whatever happens stays inside it."""
        try:
            async with stream:
                head = await _read_request_head(stream)
                if head is None:
                    return
                if _is_websocket_upgrade(head):
                    await self._relay_websocket(_Replayed(stream, head))
                else:
                    await self._pipe_http(stream, head)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio_websocket.ConnectionClosed, OSError) as exc:
            log.info("codex relay connection ended: %s", exc, extra={"event": "relay-connection-ended"})
        except Exception:  # a bug in one connection must not end the others
            log.exception("codex relay connection failed", extra={"event": "relay-connection-failed"})

    async def _relay_websocket(self, stream: _Replayed) -> None:
        async with trio.open_nursery() as nursery:
            request = await trio_websocket.wrap_server_stream(
                nursery, stream, max_message_size=MAX_MESSAGE_BYTES, receive_buffer_size=RECEIVE_BYTES
            )
            try:
                async with trio.open_nursery() as upstream_nursery:
                    server = await self._connect_upstream(upstream_nursery, request)
                    if isinstance(server, trio_websocket.WebSocketConnection):
                        client = await request.accept(subprotocol=server.subprotocol)
                        scope = upstream_nursery.cancel_scope
                        tap = self.streams.open(WEBSOCKET)
                        upstream_nursery.start_soon(self._forward, client, server, None, scope)
                        upstream_nursery.start_soon(self._forward, server, client, tap, scope)
                    else:
                        await _refuse(request, server)
            except* trio_websocket.ConnectionRejected as group:  # a refusal with a body surfaces from the reader task
                await _refuse(request, _first_leaf(group))
            nursery.cancel_scope.cancel()

    async def _connect_upstream(
        self, nursery: trio.Nursery, request: WebSocketRequest
    ) -> WebSocketConnection | ConnectionRejected | None:
        headers = [(name, value) for name, value in request.headers if name.lower() not in _HOP_HEADERS]
        with trio.move_on_after(UPSTREAM_READY_TIMEOUT_S):
            while True:
                try:
                    return await trio_websocket.connect_websocket(
                        nursery,
                        self.upstream.host,
                        self.upstream.port,
                        request.path,
                        use_ssl=False,
                        subprotocols=request.proposed_subprotocols or None,
                        extra_headers=headers,
                        max_message_size=MAX_MESSAGE_BYTES,
                        receive_buffer_size=RECEIVE_BYTES,
                    )
                except OSError:
                    await trio.sleep(UPSTREAM_RETRY_S)  # not listening yet
                except trio_websocket.ConnectionRejected as rejected:
                    log.warning("codex app-server refused a relayed connection: %s", rejected.status_code)
                    return rejected
                except trio_websocket.HandshakeError as exc:
                    log.warning("codex app-server broke the relayed handshake: %s", exc)
                    return None
        log.warning("codex app-server did not accept a connection", extra={"event": "relay-upstream-down"})
        return None

    async def _forward(
        self,
        source: WebSocketConnection,
        sink: WebSocketConnection,
        tap: Stream | None,
        connection: trio.CancelScope,
    ) -> None:
        try:
            while True:
                message = await source.get_message()
                try:
                    await sink.send_message(message)  # the client first: the tap folds it in at once
                finally:
                    if tap is not None and isinstance(message, str):
                        _tapped(tap, message)
        except trio_websocket.ConnectionClosed as closed:
            code, reason = (1006, None) if closed.reason is None else (closed.reason.code, closed.reason.reason)
            # A connection that dropped without a close frame is dropped on the other side too
            # (by the cancel below), rather than dressed up as a close the peer never sent.
            if code not in _ABNORMAL_CLOSE_CODES:
                await sink.aclose(1000 if code == _NO_STATUS_CODE else code, reason)
        finally:
            connection.cancel()

    async def _pipe_http(self, client: trio.SocketStream, head: bytes) -> None:
        server = await _open_upstream_stream(self.upstream)
        if server is None:
            await client.send_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            return
        async with server:
            await server.send_all(head)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, server)
                nursery.start_soon(_pipe, server, client)


def _tapped(tap: Stream, message: str) -> None:
    """One server→client text message's bytes to the connection's decoder. A full-history
    thread/resume answer over the size limit is the decoder's to drop (its length is checked before
    any parsing), as the stdout tap's channel drops it."""
    try:
        tap.receive_data(message.encode("utf-8", "surrogatepass"))
    except Exception:  # the client's traffic never waits on, or dies with, the tap
        log.exception("codex relay could not submit a frame", extra={"event": "relay-submit-failed"})


async def _refuse(request: WebSocketRequest, rejected: ConnectionRejected | None) -> None:
    """The app-server's own refusal (say, a failed --ws-auth) reaches the client as it was."""
    if rejected is None:
        await request.reject(502)
        return
    headers = [(name, value) for name, value in rejected.headers or () if name.lower() not in _HOP_HEADERS]
    await request.reject(rejected.status_code, extra_headers=headers, body=rejected.body or None)


def _first_leaf(group: BaseExceptionGroup[ConnectionRejected]) -> ConnectionRejected:
    first = group.exceptions[0]
    return first if isinstance(first, trio_websocket.ConnectionRejected) else _first_leaf(first)


async def _open_upstream_stream(upstream: Address) -> trio.SocketStream | None:
    with trio.move_on_after(UPSTREAM_READY_TIMEOUT_S):
        while True:
            try:
                return await trio.open_tcp_stream(upstream.host, upstream.port)
            except OSError:
                await trio.sleep(UPSTREAM_RETRY_S)
    return None


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    try:
        while data := await source.receive_some(PIPE_CHUNK):
            await sink.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await sink.aclose()


async def _read_request_head(stream: trio.SocketStream) -> bytes | None:
    """The bytes up to and including the blank line that ends the request head."""
    data = b""
    with trio.move_on_after(REQUEST_HEAD_TIMEOUT_S):
        while b"\r\n\r\n" not in data and len(data) < REQUEST_HEAD_LIMIT:
            chunk = await stream.receive_some(PIPE_CHUNK)
            if not chunk:
                return None
            data += chunk
        return data
    return None


def _is_websocket_upgrade(head: bytes) -> bool:
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"upgrade" and b"websocket" in value.lower():
            return True
    return False


class _Replayed(trio.abc.Stream):
    """A stream whose first bytes were already read to route it; they are handed out again first."""

    def __init__(self, stream: trio.SocketStream, head: bytes) -> None:
        self._stream = stream
        self._head = head

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._head:
            size = len(self._head) if max_bytes is None else max_bytes
            data, self._head = self._head[:size], self._head[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
