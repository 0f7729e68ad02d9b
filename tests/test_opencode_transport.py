"""The OpenCode transport against a stand-in OpenCode server on 127.0.0.1: `/event` followed across
restarts and stalls, `/config/providers` pulled at start and as soon as the producer wants a window,
and every byte through the spec's decoders, so what it lives is what `hctx replay` replays."""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.policy import Write, WriteGuard
from sidecar.decoding import Dropped
from sidecar.harnesses.opencode import transport
from sidecar.harnesses.opencode.producer import (
    MAX_BACKOFF_SECONDS,
    SPEC,
    ConfigAnswer,
    MessageUpdated,
    OpenCodeProducer,
    OpenCodeTransport,
    OtherEvent,
    OutputTokenMax,
    ProvidersAnswer,
    sse_event,
)
from sidecar.harnesses.opencode.transport import next_backoff
from sidecar.pipeline import Pipeline
from sidecar.recorder import Chunk
from sidecar.registry import spec_for
from sidecar.replay import replay_bytes
from sidecar.streams import Streams, transport_for
from tests.conformance import chunks_of, outcome, recorded
from tests.conftest import read_head

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "opencode" / "v1.18.25"
HOST = "127.0.0.1"
CONNECTED = sse_event(b'{"id":"evt_c","type":"server.connected","properties":{}}')

Frame = dict[str, Any]


def providers(*models: tuple[str, int]) -> dict[str, Any]:
    return {
        "providers": [{"id": "fake", "models": {name: {"limit": {"context": window}} for name, window in models}}],
        "default": {},
    }


def message(model: str, total: int | None = None, message_id: str = "msg_1") -> Frame:
    tokens: dict[str, Any] = {"input": 0, "output": 0}
    if total is not None:
        tokens["total"] = total
    info = {"id": message_id, "role": "assistant", "sessionID": "ses_1", "providerID": "fake", "modelID": model}
    return {
        "id": f"evt_{message_id}_{total}",
        "type": "message.updated",
        "properties": {"info": {**info, "tokens": tokens}},
    }


class FakeOpenCode:
    """Just enough of `opencode serve`: `/event` (SSE, bytes pushed by the test), `/config/providers`
    and, when the test gives one, `/config`."""

    def __init__(self) -> None:
        self.port = 0
        self.answer: Any = providers(("fake-model", 128_000))
        self.config: Any = None  # None: `/config` is 404
        self.pulls = 0
        self.connections = 0
        self.silent = False  # hold /event open but send nothing, as a wedged server would
        self.unanswered = 0  # requests accepted and never answered, as a just-started 1.18.25 does
        self.failing: dict[str, int] = {}  # path -> how many more requests of it answer 500
        self.chunked = False  # /event's body in chunked transfer-encoding, not until-close
        self.requests: list[bytes] = []  # each request's head, as the transport sent it
        self._streams: list[trio.MemorySendChannel[bytes | None]] = []
        self._scope: trio.CancelScope | None = None

    async def push(self, frame: Frame) -> None:
        await self.push_bytes(sse_event(json.dumps(frame).encode()))

    async def push_bytes(self, data: bytes) -> None:
        for stream in list(self._streams):
            await stream.send(data)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as nursery:
                listeners = await nursery.start(partial(trio.serve_tcp, host=HOST), self._handle, self.port)
                self.port = listeners[0].socket.getsockname()[1]
                task_status.started()

    def stop(self) -> None:
        """The server dies: listener and every open stream go away at once."""
        assert self._scope is not None
        self._scope.cancel()
        self._streams.clear()

    async def _answer(self, stream: trio.SocketStream, body: bytes) -> None:
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        await stream.send_all(head.encode() + b"connection: close\r\n\r\n" + body)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self.unanswered:
                self.unanswered -= 1
                await trio.sleep_forever()
            request = await read_head(stream)
            if b"\r\n\r\n" not in request:
                return
            self.requests.append(request)
            path = request.split(b" ", 2)[1].decode().split("?")[0]
            if self.failing.get(path):
                self.failing[path] -= 1
                await stream.send_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
                return
            if path == "/config/providers":
                self.pulls += 1
                await self._answer(stream, json.dumps(self.answer).encode())
                return
            if path == "/config" and self.config is not None:
                await self._answer(stream, json.dumps(self.config).encode())
                return
            if path != "/event":
                await stream.send_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            self.connections += 1
            framing = b"transfer-encoding: chunked" if self.chunked else b"connection: close"
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + framing + b"\r\n\r\n")
            if self.silent:
                await trio.sleep_forever()
            send, receive = trio.open_memory_channel[bytes | None](100)
            self._streams.append(send)
            await send.send(CONNECTED)
            async for data in receive:
                if self.chunked and data:  # one chunk per push; never the last (an SSE stream has no end)
                    data = b"%x\r\n%s\r\n" % (len(data), data)
                await stream.send_all(data or b"")


@dataclass
class Lived:
    """A sidecar's half behind the transport: every event submitted, fed to a real pipeline."""

    producer: OpenCodeProducer = field(default_factory=OpenCodeProducer)
    events: list[object] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pipeline = Pipeline(self.producer, WriteGuard("a", "i"))

    def submit(self, event: object) -> None:
        self.events.append(event)
        self.writes.extend(self.pipeline.feed(event, len(self.events)))

    def streams(self) -> Streams:
        return Streams(SPEC, self.submit, self.producer.wants)

    def kinds(self) -> list[str]:
        return [_kind(event) for event in self.events]


def _kind(event: object) -> str:
    return event.type if isinstance(event, OtherEvent) else type(event).__name__


@asynccontextmanager
async def following(server: FakeOpenCode, lived: Lived, **config: Any) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        settings = OpenCodeTransport(base_url=f"http://{HOST}:{server.port}", **config)
        nursery.start_soon(transport.run, settings, lived.streams())
        yield nursery
        nursery.cancel_scope.cancel()


async def wait_until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - the state lives in another task's hands
            await trio.sleep(0.01)


def test_the_registry_finds_this_transport() -> None:
    assert transport_for(SPEC) is transport.run


def test_back_off_doubles_and_is_capped() -> None:
    delays, delay = [], 0.0
    for _ in range(10):
        delay = next_backoff(delay, MAX_BACKOFF_SECONDS)
        delays.append(delay)
    assert delays[:4] == [0.2, 0.4, 0.8, 1.6]
    assert max(delays) == MAX_BACKOFF_SECONDS == delays[-1]


START = ["OutputTokenMax", "ProvidersAnswer", "server.connected"]


async def test_providers_are_pulled_at_start_and_before_the_message_that_needs_them() -> None:
    """Pulled once per connection, then right after the message that made a window wanted (the
    token-less frame OpenCode sends first), so the completion after it lands with its window."""
    server, lived = FakeOpenCode(), Lived()
    async with following(server, lived):
        await wait_until(lambda: len(lived.events) == 3)
        assert lived.kinds() == START
        assert lived.producer.catalog.windows == {("fake", "fake-model"): 128_000}
        await server.push(message("fake-model"))  # a known model: no pull
        await wait_until(lambda: len(lived.events) == 4)
        assert server.pulls == 1
        server.answer = providers(("fake-model", 128_000), ("fake-xl", 400_000))
        await server.push(message("fake-xl", message_id="msg_2"))
        await wait_until(lambda: len(lived.events) == 6)
        assert lived.kinds()[4:] == ["MessageUpdated", "ProvidersAnswer"]
        assert server.pulls == 2
        await server.push(message("fake-xl", 1000, message_id="msg_2"))
        await wait_until(lambda: len(lived.events) == 7)
        assert [(w.record.used_tokens, w.record.window_tokens) for w in lived.writes] == [(1000, 400_000)]
        # A model no pull supplies is not asked for again on every frame that names it.
        await server.push(message("fake-ghost", message_id="msg_3"))
        await server.push(message("fake-ghost", 500, message_id="msg_3"))
        await wait_until(lambda: len(lived.events) == 10)
        assert server.pulls == 3
        assert lived.kinds()[7:] == ["MessageUpdated", "ProvidersAnswer", "MessageUpdated"]
        assert lived.producer.wants() == {("fake", "fake-ghost")}
        assert lived.writes[-1].record.window_tokens is None  # withheld, never guessed


async def test_the_stream_resumes_after_the_server_restarts() -> None:
    server, lived = FakeOpenCode(), Lived()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        config = OpenCodeTransport(base_url=f"http://{HOST}:{server.port}", max_backoff_seconds=0.3)
        nursery.start_soon(transport.run, config, lived.streams())
        await wait_until(lambda: server.connections == 1 and len(lived.events) == 3)
        await server.push(message("fake-model", 1000))
        await wait_until(lambda: len(lived.events) == 4)
        server.stop()
        await trio.sleep(1.0)  # down for a while: the transport keeps retrying with its back-off
        await nursery.start(server.serve)
        await wait_until(lambda: server.connections == 2)
        await wait_until(lambda: len(lived.events) == 6)
        await server.push(message("fake-model", 2000, message_id="msg_2"))
        await wait_until(lambda: len(lived.events) == 7)
        assert lived.kinds() == [
            *START, "MessageUpdated",
            "ProvidersAnswer", "server.connected", "MessageUpdated",
        ]  # fmt: skip
        assert server.pulls == 2  # a restarted server may carry a new config: pulled again
        nursery.cancel_scope.cancel()


async def test_a_stalled_stream_is_dropped_and_reopened() -> None:
    server = FakeOpenCode()
    server.silent = True
    async with following(server, Lived(), stall_seconds=0.3, max_backoff_seconds=0.2):
        await wait_until(lambda: server.connections >= 3, seconds=5)


async def test_a_first_request_left_unanswered_is_retried() -> None:
    """Measured on 1.18.25: the first request after `listening` never gets an answer."""
    server, lived = FakeOpenCode(), Lived()
    server.unanswered = 1
    async with following(server, lived, headers_seconds=0.3):
        with trio.fail_after(3):
            await wait_until(lambda: len(lived.events) == 3)
    assert server.connections == 1


def test_a_bad_config_runs_no_transport_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    from sidecar.app import transport_settings

    for config in ({"base_url": "file:///etc/passwd"}, {}, {"base_url": "https://127.0.0.1:4096"},  # no TLS
                   {"base_url": "http://127.0.0.1:1", "stall_seconds": 0}):  # fmt: skip
        assert transport_settings(SPEC, json.dumps(config)) is None
    refused = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "transport-bad-config"]
    assert len(refused) == 4 and all("no opencode transport" in message for message in refused)
    assert "base_url" in refused[2] and "stall_seconds" in refused[3]


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "event", None) == event]


async def test_every_request_names_the_directory_and_no_proxy_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `directory` query parameter on `/event` and both pulls, `/event` asking for SSE, and a
    proxy in the environment (which would break every request) never used: the client is trust_env=False."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    server, lived = FakeOpenCode(), Lived()
    server.config = {"compaction": {"reserved": 5000}}
    async with following(server, lived, directory="/w/my project"):
        await wait_until(lambda: len(lived.events) == 4)
    heads = {head.split(b" ", 2)[1].decode().split("?")[0]: head.decode().lower() for head in server.requests}
    assert sorted(heads) == ["/config", "/config/providers", "/event"]
    for path, head in heads.items():
        assert head.startswith(f"get {path}?directory=%2fw%2fmy%20project http/1.1\r\n"), head
    assert "\r\naccept: text/event-stream\r\n" in heads["/event"]


async def test_the_client_trusts_no_certificate_and_loads_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenCode's server speaks plain HTTP on loopback: the client's TLS context requires
    verification and trusts nothing, so no CA bundle is loaded (httpx's default loads certifi's,
    1.7 MB of each OpenCode sidecar) and a TLS URL can never go unverified."""
    context = transport.tls_context()
    assert (context.verify_mode, context.check_hostname, context.get_ca_certs()) == (ssl.CERT_REQUIRED, True, [])
    made: list[ssl.SSLContext] = []

    def recorded_context(make: Callable[[], ssl.SSLContext] = transport.tls_context) -> ssl.SSLContext:
        made.append(make())
        return made[-1]

    monkeypatch.setattr(transport, "tls_context", recorded_context)
    server, lived = FakeOpenCode(), Lived()
    async with following(server, lived):
        await wait_until(lambda: len(lived.events) >= 2)
    assert len(made) == 1 and made[0].get_ca_certs() == []  # the client ran on it, over plain HTTP


async def test_error_statuses_are_logged_and_retried_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A 500 on `/event` is a lost stream, retried with the back-off; a 500 on a pull is a warning
    and the stream goes on, the window withheld until a later pull supplies it."""
    caplog.set_level(logging.INFO, logger=transport.__name__)
    server, lived = FakeOpenCode(), Lived()
    server.failing = {"/event": 2, "/config/providers": 1}
    async with following(server, lived, max_backoff_seconds=0.2):
        await wait_until(lambda: len(lived.events) == 2)
        assert lived.kinds() == ["OutputTokenMax", "server.connected"]  # the providers pull failed
        await server.push(message("fake-model", message_id="msg_1"))  # the window is wanted: pulled again
        await wait_until(lambda: len(lived.events) == 4)
        assert lived.kinds()[2:] == ["MessageUpdated", "ProvidersAnswer"]
    lost = logged(caplog, "opencode-stream-lost")
    assert len(lost) == 2 and all("answered 500 Internal Server Error" in r.getMessage() for r in lost)
    (failed,) = logged(caplog, "opencode-providers-failed")
    assert failed.levelno == logging.WARNING and "/config/providers answered 500" in failed.getMessage()
    assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere


async def test_a_chunked_stream_cut_mid_body_is_lost_and_reopened(caplog: pytest.LogCaptureFixture) -> None:
    """`/event` in chunked transfer-encoding: events cut across chunks still decode; the server
    gone before the last chunk is a lost stream (logged, no traceback), and the next one opens."""
    caplog.set_level(logging.INFO, logger=transport.__name__)
    server, lived = FakeOpenCode(), Lived()
    server.chunked = True
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        config = OpenCodeTransport(base_url=f"http://{HOST}:{server.port}", max_backoff_seconds=0.2)
        nursery.start_soon(transport.run, config, lived.streams())
        await wait_until(lambda: len(lived.events) == 3)
        event = sse_event(json.dumps(message("fake-model", 1000)).encode())
        await server.push_bytes(event[:7])
        await server.push_bytes(event[7:])
        await wait_until(lambda: len(lived.events) == 4)
        server.stop()
        await wait_until(lambda: bool(logged(caplog, "opencode-stream-lost")))
        await nursery.start(server.serve)
        await wait_until(lambda: server.connections == 2 and len(lived.events) == 6)
        nursery.cancel_scope.cancel()
    assert [w.record.used_tokens for w in lived.writes] == [1000]
    lost = logged(caplog, "opencode-stream-lost")  # then perhaps a refused connection or two
    assert "closed the connection before the end of the body" in lost[0].getMessage()
    assert len(logged(caplog, "opencode-stream-open")) == 2
    assert not [r for r in caplog.records if r.exc_info]


async def test_the_config_answer_and_the_output_cap_arrive_as_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """`GET /config`'s body goes through the `config` wire; the cap the server inherited is the
    sidecar's own fact, submitted as its typed event."""
    monkeypatch.setenv("OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX", "16000")
    server, lived = FakeOpenCode(), Lived()
    server.config = {"$schema": "https://opencode.ai/config.json", "compaction": {"reserved": 5000}}
    async with following(server, lived):
        await wait_until(lambda: len(lived.events) == 4)
    assert lived.kinds() == ["OutputTokenMax", "ProvidersAnswer", "ConfigAnswer", "server.connected"]
    assert lived.events[0] == OutputTokenMax(16_000)
    config = lived.events[2]
    assert isinstance(config, ConfigAnswer) and config.config is not None
    assert (lived.producer.output_max, lived.producer.compaction) == (16_000, config.config.compaction)


async def lived_and_replayed(answer: Any, sse: bytes) -> tuple[Lived, list[Write], int]:
    """The same bytes (i) served by the stand-in server through the real transport into a real
    pipeline and (ii) replayed from a recording of the providers answer and the `sse` stream, as
    `hctx replay` replays one; and how many frames the replay dropped."""
    chunks = [Chunk(None, "providers", json.dumps(answer).encode()), Chunk(None, "sse", CONNECTED + sse)]
    events = sum(len(SPEC.decoder(chunk.wire).receive_data(chunk.data)) for chunk in chunks)
    replayed, summary = await trio.to_thread.run_sync(replay_bytes, SPEC, recorded("opencode", chunks))
    server, lived = FakeOpenCode(), Lived()
    server.answer = answer
    async with following(server, lived):
        await wait_until(lambda: len(lived.events) == 3)
        for start in range(0, len(sse), 4093):  # cut anywhere, never at event boundaries on purpose
            await server.push_bytes(sse[start : start + 4093])
        await wait_until(lambda: len(lived.events) == 1 + events)  # + the transport's OutputTokenMax
    return lived, replayed, sum(summary.drops.values())


async def test_an_event_carrying_nan_reads_the_same_live_and_in_replay() -> None:
    """Issue 14's reproduced divergence: an OpenCode event carrying an unrelated `NaN` was a reading
    live (the transport's own `json.loads` took NaN for a number) and a drop in replay. One decoder
    on both paths: NaN is not JSON, so the event is dropped on both, and the writes are identical."""
    tainted = json.dumps(message("fake-model", 77_777, message_id="msg_2")).encode()
    tainted = tainted[:-1] + b', "junk": NaN}'
    sse = b"".join([
        sse_event(json.dumps(message("fake-model", 11_000)).encode()),
        sse_event(tainted),
        sse_event(json.dumps(message("fake-model", 33_000, message_id="msg_3")).encode()),
    ])  # fmt: skip
    lived, replayed, dropped_in_replay = await lived_and_replayed(providers(("fake-model", 128_000)), sse)
    assert [outcome(w) for w in lived.writes] == [outcome(w) for w in replayed]
    assert [w.record.used_tokens for w in replayed] == [11_000, 33_000]  # 77,777 on neither path
    (dropped,) = [event for event in lived.events if isinstance(event, Dropped)]
    assert "NaN is not a JSON number" in dropped.reason
    assert lived.pipeline.dropped == dropped_in_replay == 1


async def test_captured_frames_through_the_real_client_write_what_replay_writes() -> None:
    """The captured `/event` stream, served as the SSE bytes it was, through the transport into the
    pipeline: the window pull reads `/config/providers` through the real client and the writes are
    replay's, field for field."""
    events = [chunk.data for chunk in chunks_of("opencode/v1.18.25/events.rec")][:700]
    answer = json.loads((FIXTURES / "config_providers.json").read_bytes())
    lived, replayed, _ = await lived_and_replayed(answer, b"".join(events))
    assert [outcome(w) for w in lived.writes] == [outcome(w) for w in replayed]
    assert [w.record.used_tokens for w in lived.writes][:5] == [11390, 21490, 31590, 31590, 21490]
    assert not any(isinstance(event, Dropped) for event in lived.events)
    assert {type(event) for event in lived.events} >= {MessageUpdated, ProvidersAnswer, OutputTokenMax}


def test_the_sidecar_hands_the_transport_its_producers_wants(tmp_path: Path) -> None:
    from sidecar.app import SidecarConfig, open_writer, transport_streams

    spec, writer = open_writer(SidecarConfig(tmp_path, "h", "a", "opencode", "i", tmp_path / "ch.sock"))
    streams = transport_streams(spec, writer)
    assert streams.wants() == frozenset()
    writer.submit(SPEC.decoder("sse").receive_data(sse_event(json.dumps(message("fake-xl")).encode()))[0])
    assert streams.wants() == {("fake", "fake-xl")}  # the model it met, whose window it lacks
    _, pi_writer = open_writer(SidecarConfig(tmp_path, "h", "b", "pi", "i", tmp_path / "ch2.sock"))
    assert transport_streams(spec_for("pi"), pi_writer).wants() == frozenset()  # a producer that wants nothing


def test_the_opencode_sidecar_loads_httpx_without_its_command_line_or_http2() -> None:
    """apprise brings click into the venv and Hypercorn brings h2, and httpx and httpcore then load
    their command line (click, pygments) and HTTP/2 (h2, hpack): 3.9 MB in every OpenCode sidecar,
    past issue 24's bound. The transport loads neither, its client still works, and h2 is still
    importable for anything else in the process."""
    import importlib.util

    assert importlib.util.find_spec("click") and importlib.util.find_spec("h2")  # else this could not fail
    probe = """
import sys, trio
from sidecar.harnesses.opencode import transport
async def main():
    async with transport.httpx.AsyncClient(trust_env=False) as client:
        try:
            await client.get("http://127.0.0.1:9/")
        except transport.httpx.ConnectError:
            pass
trio.run(main)
print(sorted(m for m in ("click", "pygments", "h2", "hpack", "hyperframe") if m in sys.modules))
import h2.connection
print("h2 importable")
"""
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.splitlines() == ["[]", "h2 importable"], shown.stderr
