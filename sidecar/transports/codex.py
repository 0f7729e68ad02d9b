"""The Codex app-server websocket relay: listen where the client asked, tap, forward.

`hctx wrap -- codex app-server --listen ws://IP:PORT` starts the real app-server on a private
loopback port (`wrapper.harnesses.codex`) and hands this transport both addresses:

    config = {"listen": "ws://IP:PORT", "upstream": "ws://127.0.0.1:PRIVATE"}

Every client connection gets its own upstream connection; every message is forwarded unchanged in
both directions, and each server→client text message is also submitted to the producer as
`{"type": "codex.rpc", "payload": <text>}`. Connections are independent: one failing or closing
never touches another. Plain HTTP on the listen address (the app-server's `/readyz` and `/healthz`)
is piped through byte for byte.

Over stdio there is nothing to run here: the wrapper taps the harness's stdout itself. An interactive
seat (`{"mode": "rollout", ...}`) is handed to `sidecar.rollout.follow_rollout`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import trio
import trio_websocket
from trio_websocket import ConnectionClosed, ConnectionRejected, WebSocketConnection, WebSocketRequest

from guard.constants import CHANNEL_MAX_FRAME_BYTES
from sidecar.producers.codex import COMPACTION_CONFIG_FRAME, FRAME_TYPE
from sidecar.transports import Submit

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
            raise ValueError(f"not a ws://HOST:PORT address: {url!r}")
        return cls(parts.hostname, parts.port)


async def run(config: dict[str, Any], submit: Submit) -> None:
    # First, so every reading carries them: the compaction settings the wrapper read.
    keys = ("autoCompactTokenLimit", "modelContextWindow")
    submit({"type": COMPACTION_CONFIG_FRAME, **{key: config[key] for key in keys if key in config}})
    if config.get("mode") == "rollout":  # an interactive seat: no app-server, follow its rollout file
        from sidecar.rollout import follow_rollout

        await follow_rollout(config, submit)
        return
    listen, upstream = config.get("listen"), config.get("upstream")
    if not isinstance(listen, str) or not isinstance(upstream, str):
        return  # stdio: the wrapper's stdout tap feeds the channel; nothing to serve here
    await serve_relay(Address.parse(listen), Address.parse(upstream), submit)


async def serve_relay(
    listen: Address,
    upstream: Address,
    submit: Submit,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status` reports the bound listeners (port 0 picks one)."""
    listeners = await trio.open_tcp_listeners(listen.port, host=listen.host)
    log.info("codex relay listening", extra={"event": "relay-listening", "listen": str(listen)})
    relay = _Relay(upstream, submit)
    await trio.serve_listeners(relay.handle, listeners, task_status=task_status)


class _Relay:
    def __init__(self, upstream: Address, submit: Submit) -> None:
        self.upstream = upstream
        self.submit = submit

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
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosed, OSError) as exc:
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
                    if isinstance(server, WebSocketConnection):
                        client = await request.accept(subprotocol=server.subprotocol)
                        scope = upstream_nursery.cancel_scope
                        upstream_nursery.start_soon(self._forward, client, server, False, scope)
                        upstream_nursery.start_soon(self._forward, server, client, True, scope)
                    else:
                        await _refuse(request, server)
            except* ConnectionRejected as group:  # a refusal with a body surfaces from the reader task
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
                except ConnectionRejected as rejected:
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
        tap: bool,
        connection: trio.CancelScope,
    ) -> None:
        try:
            while True:
                message = await source.get_message()
                try:
                    await sink.send_message(message)  # the client first: the tap folds it in at once
                finally:
                    # The notifications that carry numbers are small; a full-history thread/resume
                    # answer is relayed but not tapped, as the channel would refuse it too.
                    if tap and isinstance(message, str) and len(message) <= CHANNEL_MAX_FRAME_BYTES:
                        self._submit(message)
        except ConnectionClosed as closed:
            code, reason = (1006, None) if closed.reason is None else (closed.reason.code, closed.reason.reason)
            # A connection that dropped without a close frame is dropped on the other side too
            # (by the cancel below), rather than dressed up as a close the peer never sent.
            if code not in _ABNORMAL_CLOSE_CODES:
                await sink.aclose(1000 if code == _NO_STATUS_CODE else code, reason)
        finally:
            connection.cancel()

    def _submit(self, message: str) -> None:
        try:
            self.submit({"type": FRAME_TYPE, "payload": message})
        except Exception:  # the client's traffic never waits on, or dies with, the tap
            log.exception("codex relay could not submit a frame", extra={"event": "relay-submit-failed"})

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


async def _refuse(request: WebSocketRequest, rejected: ConnectionRejected | None) -> None:
    """The app-server's own refusal (say, a failed --ws-auth) reaches the client as it was."""
    if rejected is None:
        await request.reject(502)
        return
    headers = [(name, value) for name, value in rejected.headers or () if name.lower() not in _HOP_HEADERS]
    await request.reject(rejected.status_code, extra_headers=headers, body=rejected.body or None)


def _first_leaf(group: BaseExceptionGroup[ConnectionRejected]) -> ConnectionRejected:
    first = group.exceptions[0]
    return first if isinstance(first, ConnectionRejected) else _first_leaf(first)


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
