"""sidecar.http, the sidecar's h11 client, against real servers on 127.0.0.1 that write raw bytes:
each framing a body can have, the statuses and timeouts the OpenCode transport relies on, and every
way a server can fail it, each an `HttpError` with a sentence, never anything else."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from guard.errors import HttpError, HttpStatusError, HttpTimeout
from sidecar import http
from sidecar.http import get, parse_url
from tests.conftest import read_head

HOST = "127.0.0.1"
Handler = Callable[[trio.SocketStream], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[http.Url]:
    """A server on 127.0.0.1 whose every connection `handler` answers; its base URL."""

    async def each(stream: trio.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):  # the client went away first: some tests do
                await handler(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, host=HOST), each, 0)
        yield parse_url(f"http://{HOST}:{listeners[0].socket.getsockname()[1]}")
        nursery.cancel_scope.cancel()


def answer(body: bytes, status: str = "200 OK", *headers: str) -> Handler:
    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        head = "".join(f"{h}\r\n" for h in (f"HTTP/1.1 {status}", f"content-length: {len(body)}", *headers))
        await stream.send_all(head.encode() + b"\r\n" + body)

    return handle


async def body_of(url: http.Url, path: str = "/", **limits: float) -> bytes:
    async with get(url, path, head_seconds=limits.get("head", 2.0), read_seconds=limits.get("read", 2.0)) as response:
        response.raise_for_status()
        return await response.read(1 << 20)


async def test_a_content_length_body_and_the_request_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request: the prefix and the query in the target, the caller's headers over the defaults,
    identity only, one request per connection; and no proxy, whatever the environment says."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: a proxy used would fail
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    seen: list[bytes] = []

    async def handle(stream: trio.SocketStream) -> None:
        seen.append(await read_head(stream))
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n")
        await stream.send_all(b'{"a": 1}')
        await trio.sleep(0.05)
        await stream.send_all(b"\n\n\n")

    async with serving(handle) as url:
        prefixed = parse_url(f"{url}/api/")
        query = {"directory": "/home/me/my project"}
        headers = [("Accept", "text/event-stream")]
        async with get(prefixed, "/event", query=query, headers=headers, head_seconds=2, read_seconds=2) as response:
            assert (response.status, response.head.reason) == (200, "OK")
            assert response.head.header("content-type") == "application/json"
            assert response.head.header("x-none") is None
            assert await response.read(100) == b'{"a": 1}\n\n\n'
            assert await response.receive() is None  # complete, and stays so
    (request,) = seen
    lines = request.decode().split("\r\n")
    assert lines[0] == "GET /api/event?directory=%2Fhome%2Fme%2Fmy%20project HTTP/1.1"
    fields = [line.lower() for line in lines[1:] if line]
    assert fields[0] == f"host: {url.authority}"
    assert "accept: text/event-stream" in fields and "accept: */*" not in fields
    assert {"accept-encoding: identity", "connection: close"} <= set(fields)


async def test_a_chunked_body_arrives_piece_by_piece() -> None:
    """Each piece is handed on as it arrives: the second chunk is sent only once the client has the
    first (an SSE stream never ends, so waiting for the end would deliver nothing)."""
    got_first = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await stream.send_all(b"6\r\ndata: \r\n")
        await got_first.wait()
        await stream.send_all(b"3\r\n{}\n\r\n1\r\n\n\r\n0\r\n\r\n")

    pieces = []
    async with serving(handle) as url, get(url, "/event", head_seconds=2, read_seconds=2) as response:
        async for data in response:
            pieces.append(data)
            got_first.set()
    assert pieces[0] == b"data: " and b"".join(pieces) == b"data: {}\n\n"


async def test_a_body_that_ends_when_the_server_closes() -> None:
    """No length, not chunked: the body is everything until the close (OpenCode's `/event`)."""

    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        await stream.send_all(b"data: 1\n\n")

    async with serving(handle) as url:
        assert await body_of(url) == b"data: 1\n\n"


async def test_a_500_is_a_status_error_and_its_body_is_still_readable() -> None:
    server = serving(answer(b"boom", "500 Internal Server Error"))
    async with server as url, get(url, "/config", head_seconds=2, read_seconds=2) as response:
        assert response.status == 500
        with pytest.raises(HttpStatusError) as caught:
            response.raise_for_status()
        assert await response.read(100) == b"boom"
    assert caught.value.status == 500
    assert str(caught.value) == f"GET {url}/config answered 500 Internal Server Error"
    assert isinstance(caught.value, HttpError)


async def test_a_server_that_never_answers_the_head_times_out() -> None:
    """As a just-started OpenCode 1.18.25 does with its first request."""

    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await trio.sleep_forever()

    async with serving(handle) as url:
        started = trio.current_time()
        with pytest.raises(HttpTimeout, match=r"no response head within 0\.3 s"):
            await body_of(url, "/event", head=0.3)
        assert 0.3 <= trio.current_time() - started < 2


async def test_a_server_that_stalls_mid_body_times_out() -> None:
    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
        await trio.sleep_forever()

    pieces: list[bytes] = []
    async with serving(handle) as url, get(url, "/event", head_seconds=2, read_seconds=0.3) as response:
        with pytest.raises(HttpTimeout, match=r"no body bytes for 0\.3 s"):
            async for data in response:
                pieces.append(data)
    assert pieces == [b"0123456789"]  # what came before the stall was delivered


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"transfer-encoding: chunked\r\n\r\na\r\nhello", "(incomplete chunked read)"),
        (b"content-length: 100\r\n\r\nhello", "(received 5 bytes, expected 100)"),
    ],
    ids=["chunked", "content-length"],
)
async def test_a_server_that_closes_mid_body_is_an_error_not_an_end(body: bytes, detail: str) -> None:
    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\n" + body)

    async with serving(handle) as url:
        with pytest.raises(HttpError) as caught:
            await body_of(url, "/event")
    assert str(caught.value) == f"GET {url}/event: the server closed the connection before the end of the body {detail}"


async def test_a_huge_head_is_refused() -> None:
    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (http.MAX_HEAD_BYTES * 2) + b"\r\n\r\n")

    async with serving(handle) as url:
        with pytest.raises(HttpError, match=f"the response head is larger than {http.MAX_HEAD_BYTES} bytes"):
            await body_of(url)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"", "the server closed the connection before a complete response head"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not a valid HTTP/1.1 response"),
        (b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 0\r\n\r\n", "unsupported content-encoding"),
    ],
    ids=["closed", "not-http", "gzip"],
)
async def test_a_server_that_does_not_answer_in_http_is_an_error(reply: bytes, message: str) -> None:
    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(reply)

    async with serving(handle) as url:
        with pytest.raises(HttpError, match=message):
            await body_of(url)


async def test_a_reset_mid_body_is_an_error() -> None:
    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")
        await trio.sleep(0.1)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST

    async with serving(handle) as url:
        with pytest.raises(HttpError, match=r"the connection broke|before the end of the body"):
            await body_of(url)


async def test_nobody_listening_and_a_body_too_large_are_errors() -> None:
    with socket.socket() as sock:  # a port just freed: nothing listens there
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    with pytest.raises(HttpError, match="cannot connect"):
        await body_of(parse_url(f"http://{HOST}:{port}"))
    async with serving(answer(b"x" * 2000)) as url, get(url, "/", head_seconds=2, read_seconds=2) as response:
        with pytest.raises(HttpError, match="larger than 1000 bytes"):
            await response.read(1000)


def test_only_plain_http_urls_are_accepted() -> None:
    assert parse_url("http://127.0.0.1:4096") == http.Url("127.0.0.1", 4096)
    assert str(parse_url("http://127.0.0.1:4096/")) == "http://127.0.0.1:4096"
    assert parse_url("HTTP://[::1]:5/api/") == http.Url("::1", 5, "/api")
    assert parse_url("http://[::1]:5").authority == "[::1]:5"
    assert parse_url("http://localhost").port == 80
    for bad, why in [
        ("https://127.0.0.1:4096", "only plain http://"),
        ("file:///etc/passwd", "only plain http://"),
        ("127.0.0.1:4096", "only plain http://"),
        ("http://", "no host"),
        ("http://127.0.0.1:99999", "not a usable"),
        ("http://u:p@127.0.0.1:1", "only http://host:port"),
        ("http://127.0.0.1:1/?a=b", "only http://host:port"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_url(bad)
