"""The websocket relay against stand-in upstreams: byte-identical both ways, tapped, independent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
import trio
import trio_websocket
from trio_websocket import WebSocketRequest

from sidecar.decoding import Decoder
from sidecar.harnesses.codex import relay as relay_module
from sidecar.harnesses.codex.events import CompactionConfig
from sidecar.harnesses.codex.producer import SPEC, CodexTransport, Rollout
from sidecar.harnesses.codex.relay import Address, serve_relay
from sidecar.harnesses.codex.transport import run
from sidecar.streams import Stream, Streams, transport_for

LOOPBACK = "127.0.0.1"


@dataclass
class Upstream:
    """A stand-in app-server: echoes, bursts and closes on command, and remembers what it got."""

    port: int = 0
    received: list[str | bytes] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    connections: int = 0

    async def handle(self, request: WebSocketRequest) -> None:
        if request.path == "/forbidden":
            await request.reject(401, extra_headers=[(b"www-authenticate", b"Bearer")], body=b"no token")
            return
        self.paths.append(request.path)
        self.headers.append({k.decode().lower(): v.decode() for k, v in request.headers})
        protocols = request.proposed_subprotocols
        connection = await request.accept(subprotocol=protocols[0] if protocols else None)
        self.connections += 1
        try:
            while True:
                message = await connection.get_message()
                self.received.append(message)
                if isinstance(message, str) and message.startswith("close:"):
                    _, code, reason = message.split(":", 2)
                    await connection.aclose(int(code), reason)
                    return
                if isinstance(message, str) and message.startswith("burst:"):
                    for n in range(int(message.split(":")[1])):
                        await connection.send_message(f'{{"method":"n","params":{{"i":{n}}}}}')
                    continue
                await connection.send_message(message)
        except trio_websocket.ConnectionClosed:
            return


@asynccontextmanager
async def upstream_server() -> AsyncIterator[Upstream]:
    upstream = Upstream()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(trio_websocket.serve_websocket, max_message_size=64 * 1024 * 1024),
            upstream.handle, LOOPBACK, 0, None,
        )  # fmt: skip
        upstream.port = server.port
        yield upstream
        nursery.cancel_scope.cancel()


class Taped(Streams):
    """The sidecar's streams, each also keeping the bytes the relay handed it."""

    def __init__(self, submit: Any = None) -> None:
        self.events: list[object] = []
        super().__init__(SPEC, self.events.append if submit is None else submit)
        self.tapes: list[tuple[str, list[bytes]]] = []
        self.order: list[bytes] = []  # every stream's bytes as they came

    def open(self, wire: str) -> Stream:
        tape: list[bytes] = []
        self.tapes.append((wire, tape))
        return Stream(_Recording(self.spec.decoder(wire), tape, self.order), self.submit, wire)


@dataclass
class _Recording:
    decoder: Decoder
    tape: list[bytes]
    order: list[bytes]

    def receive_data(self, data: bytes) -> list[object]:
        self.tape.append(data)
        self.order.append(data)
        return self.decoder.receive_data(data)

    def end_of_data(self) -> list[object]:
        return self.decoder.end_of_data()


@asynccontextmanager
async def relay(upstream_port: int, streams: Streams | None = None) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            serve_relay, Address(LOOPBACK, 0), Address(LOOPBACK, upstream_port), streams or Taped()
        )
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def client(port: int, path: str = "/", **kwargs: Any) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    async with trio_websocket.open_websocket(
        LOOPBACK, port, path, use_ssl=False, max_message_size=64 * 1024 * 1024, **kwargs
    ) as connection:
        yield connection


SAMPLES = [
    '{"method":"initialize","id":1,"params":{}}',
    '{"method":"turn/start","id":2,"params":{"input":[{"type":"text","text":"héllo ✓ \\u2028 \U0001f600"}]}}',
    "not json at all, still relayed verbatim",
    "x" * (5 * 1024 * 1024),  # above trio-websocket's 1 MiB default: a big thread/resume response
    '  {"id" : 3 ,"result":{}}  ',
]


async def test_messages_cross_unchanged_both_ways_and_server_text_is_tapped() -> None:
    streams = Taped()
    async with upstream_server() as upstream, relay(upstream.port, streams) as port, client(port) as ws:
        echoed = []
        for text in SAMPLES:
            await ws.send_message(text)
            echoed.append(await ws.get_message())
        await ws.send_message(b"\x00\xffbinary")
        binary = await ws.get_message()
    assert upstream.received[: len(SAMPLES)] == SAMPLES  # client → server, byte for byte
    assert echoed == SAMPLES  # server → client, byte for byte
    assert binary == b"\x00\xffbinary"
    # Every server→client text message's bytes, in order, to the connection's websocket stream; binary
    # is forwarded but not tapped, and the 5 MiB one is the decoder's to drop.
    assert [wire for wire, _ in streams.tapes] == ["websocket"]
    assert streams.order == [text.encode() for text in SAMPLES]
    reasons = [getattr(event, "reason", None) for event in streams.events]
    assert reasons == ["malformed JSON: Expecting value: line 1 column 1 (char 0)", "message over 1048576 bytes"]


async def test_path_subprotocol_and_headers_reach_the_app_server() -> None:
    async with upstream_server() as upstream, relay(upstream.port) as port:
        headers = [(b"authorization", b"Bearer t0ken"), (b"origin", b"http://localhost")]
        async with client(port, "/some/path?q=1", subprotocols=["codex.v1"], extra_headers=headers) as ws:
            assert ws.subprotocol == "codex.v1"
            await ws.send_message("ping")
            assert await ws.get_message() == "ping"
    assert upstream.paths == ["/some/path?q=1"]
    assert upstream.headers[0]["authorization"] == "Bearer t0ken"
    assert upstream.headers[0]["origin"] == "http://localhost"


async def test_connections_are_independent_one_dropping_leaves_the_others() -> None:
    streams = Taped()
    async with upstream_server() as upstream, relay(upstream.port, streams) as port, client(port) as steady:
        # One client vanishes without a close frame, another closes normally, a third is
        # closed by the server with its own code: the steady one keeps talking throughout.
        async with trio.open_nursery() as nursery:
            dropped = await trio_websocket.connect_websocket(nursery, LOOPBACK, port, "/", use_ssl=False)
            await dropped.send_message("from the dropped one")
            assert await dropped.get_message() == "from the dropped one"
            nursery.cancel_scope.cancel()
        async with client(port) as polite:
            await polite.send_message("bye soon")
            assert await polite.get_message() == "bye soon"
        async with client(port) as closed_by_server:
            await closed_by_server.send_message("close:4001:server says bye")
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await closed_by_server.get_message()
            assert closed.value.reason is not None
            assert (closed.value.reason.code, closed.value.reason.reason) == (4001, "server says bye")
        await steady.send_message("burst:500")
        burst = [await steady.get_message() for _ in range(500)]
    assert burst == [f'{{"method":"n","params":{{"i":{n}}}}}' for n in range(500)]
    assert upstream.connections == 4
    assert streams.order[-500:] == [text.encode() for text in burst]
    assert len(streams.tapes) == 4  # a stream of its own for each connection


async def test_a_failing_tap_never_stops_the_traffic() -> None:
    def broken_submit(event: object) -> None:
        raise RuntimeError("the sidecar's queue blew up")

    async with upstream_server() as upstream, trio.open_nursery() as nursery:
        listeners = await nursery.start(
            serve_relay, Address(LOOPBACK, 0), Address(LOOPBACK, upstream.port), Streams(SPEC, broken_submit)
        )
        async with client(listeners[0].socket.getsockname()[1]) as ws:
            for text in SAMPLES[:3]:
                await ws.send_message(text)
                assert await ws.get_message() == text
        nursery.cancel_scope.cancel()


async def test_a_client_early_for_the_app_server_is_held_until_it_listens() -> None:
    probe = trio.socket.socket()
    await probe.bind((LOOPBACK, 0))
    upstream_port = probe.getsockname()[1]
    probe.close()
    upstream = Upstream()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_relay, Address(LOOPBACK, 0), Address(LOOPBACK, upstream_port), Taped())

        async def late_app_server() -> None:
            await trio.sleep(0.5)
            await trio_websocket.serve_websocket(upstream.handle, LOOPBACK, upstream_port, None)

        nursery.start_soon(late_app_server)
        with trio.fail_after(10):
            async with client(listeners[0].socket.getsockname()[1]) as ws:
                await ws.send_message("hello")
                assert await ws.get_message() == "hello"
        nursery.cancel_scope.cancel()


async def test_no_app_server_at_all_is_a_502_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "UPSTREAM_READY_TIMEOUT_S", 0.3)
    probe = trio.socket.socket()
    await probe.bind((LOOPBACK, 0))
    dead_port = probe.getsockname()[1]
    probe.close()
    async with relay(dead_port) as port:
        with trio.fail_after(10), pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with client(port):
                pass
        assert rejected.value.status_code == 502


async def test_the_app_servers_refusal_reaches_the_client_as_it_was() -> None:
    async with upstream_server() as upstream, relay(upstream.port) as port:
        with trio.fail_after(10), pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with client(port, "/forbidden"):
                pass
    assert (rejected.value.status_code, rejected.value.body) == (401, b"no token")
    assert (b"www-authenticate", b"Bearer") in list(rejected.value.headers or [])


async def test_plain_http_is_piped_through_for_readyz() -> None:
    requests: list[bytes] = []

    async def http_upstream(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        requests.append(data)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        up = await nursery.start(partial(trio.serve_tcp, host=LOOPBACK), http_upstream, 0)
        async with relay(up[0].socket.getsockname()[1]) as port:
            stream = await trio.open_tcp_stream(LOOPBACK, port)
            request = b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n"
            await stream.send_all(request)
            answer = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some(4096):
                    answer += chunk
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert requests == [request]
    assert answer == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"


async def test_stdio_launch_runs_no_relay() -> None:
    assert transport_for(SPEC) is run
    streams = Taped()
    with trio.fail_after(10):  # a liveness bound: a relay would serve until cancelled
        # Returns at once: the stdout tap feeds the channel. The config as the sidecar reads it.
        await run(CodexTransport.model_validate_json('{"mode":"channel","autoCompactTokenLimit":160000}'), streams)
    # The settings the wrapper read, as the sidecar's own typed fact; no stream opened.
    assert streams.events == [CompactionConfig(auto_compact_token_limit=160_000)] and streams.tapes == []


async def test_an_interactive_seat_is_handed_to_the_rollout_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    import sidecar.harnesses.codex.rollout

    seen: list[Rollout] = []

    async def follow(config: Rollout, submit: Any) -> None:
        seen.append(config)

    monkeypatch.setattr(sidecar.harnesses.codex.rollout, "follow_rollout", follow)
    config = CodexTransport.model_validate_json('{"mode":"rollout","codexHome":"/h","cwd":"/w","startedAtMs":1}')
    streams = Taped()
    await run(config, streams)
    assert seen == [Rollout(codex_home="/h", cwd="/w", started_at_ms=1)] and streams.events == [CompactionConfig()]


@pytest.mark.parametrize(
    "text",
    [
        "{}",  # no mode
        '{"mode":"relay","listen":"http://x:1","upstream":"ws://127.0.0.1:2"}',  # not a ws address
        '{"mode":"rollout","codexHome":"/h","startedAtMs":-1}',
        '{"mode":"channel","autoCompactTokenLimit":0}',  # a limit is a positive count
        '{"mode":"channel","surprise":1}',  # the wrapper and the sidecar are one build: no unknown keys
        "not json",
    ],
)
def test_a_config_that_is_not_one_runs_no_transport_and_says_why(text: str, caplog: pytest.LogCaptureFixture) -> None:
    from sidecar.app import transport_settings

    assert transport_settings(SPEC, text) is None
    assert any(getattr(record, "event", None) == "transport-bad-config" for record in caplog.records)


def test_addresses_are_ws_host_port_only() -> None:
    assert Address.parse("ws://127.0.0.1:4500") == Address("127.0.0.1", 4500)
    assert Address.parse("ws://[::1]:4500") == Address("::1", 4500)
    for bad in ["wss://127.0.0.1:1", "ws://127.0.0.1", "unix:///tmp/x", "stdio://"]:
        with pytest.raises(ValueError):
            Address.parse(bad)
