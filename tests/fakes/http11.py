"""The HTTP/1.1 plumbing every fake model server shares (trio + h11, loopback only)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h11
import trio

MAX_BODY_BYTES = 64 * 1024 * 1024

# Answers one request: (connection, stream, request, body).
Handler = Callable[[h11.Connection, trio.SocketStream, h11.Request, bytes], Awaitable[None]]


async def send(conn: h11.Connection, stream: trio.SocketStream, *events: Any) -> None:
    for event in events:
        data = conn.send(event)
        if data:
            await stream.send_all(data)


def json_response(status: int, payload: bytes) -> list[Any]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    return [h11.Response(status_code=status, headers=headers), h11.Data(data=payload), h11.EndOfMessage()]


async def reply_json(conn: h11.Connection, stream: trio.SocketStream, status: int, value: object) -> None:
    await send(conn, stream, *json_response(status, json.dumps(value).encode()))


async def serve_connection(handler: Handler, stream: trio.SocketStream) -> None:
    """Keep-alive: answer requests on one connection until either side is done."""
    conn = h11.Connection(h11.SERVER)
    async with stream:
        try:
            while await _one_exchange(handler, conn, stream):
                conn.start_next_cycle()
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def _one_exchange(handler: Handler, conn: h11.Connection, stream: trio.SocketStream) -> bool:
    """Read one request and answer it; False once the connection is done."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                return False
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            break
        elif isinstance(event, h11.ConnectionClosed):
            return False
    await handler(conn, stream, request, bytes(body))
    return conn.our_state is h11.DONE and conn.their_state is h11.DONE


LOOPBACK = "127.0.0.1"


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    """Serve `handler` on 127.0.0.1 at an ephemeral port for the duration of the block; yields the port."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, host=LOOPBACK), partial(serve_connection, handler), 0)
        try:
            yield listeners[0].socket.getsockname()[1]
        finally:
            nursery.cancel_scope.cancel()
