"""One decoder for Codex: the same server→client bytes make the same writes on every path.

The paths: (i) the wrapper's real stdout tap (`wrapper.launch.tap.Tap`, through `tap_stream`) into the sidecar's
real channel (`sidecar.channel.serve`) and the Codex channel decoder; (ii) the sidecar's real
websocket relay (`serve_relay`) in front of a stand-in app-server on 127.0.0.1; (iii) `hctx replay`
of the stdout recording. The pinned divergence (HEAD before issue 14): a `thread/tokenUsage/updated`
message carrying `NaN` in a field hctx never reads was ACCEPTED through the tap (the tap embedded
the line as the envelope's payload object, and the channel parsed the envelope with Python's
permissive `json.loads`, NaN included) and REJECTED through the relay (the payload string parsed
with NaN refused): the same app-server published 44% on stdio and 10% over the websocket. A line
holding two JSON values diverged the same way (embedded, its second `payload` key replaced the
envelope's). Now the tap carries the line's bytes as a string and every path hands those bytes to
the one `parse_message`: each such message is a drop on every path.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
import trio_websocket
from trio_websocket import WebSocketRequest

from guard.policy import Write, WriteGuard
from scripts.fault_suite import tap_stream
from sidecar import channel
from sidecar.decoding import Dropped, channel_decoder
from sidecar.harnesses.codex.producer import SPEC
from sidecar.harnesses.codex.relay import Address, serve_relay
from sidecar.pipeline import Pipeline
from sidecar.recorder import Chunk
from sidecar.streams import Streams
from tests.codex_threads import THREAD_STARTED
from tests.conformance import UNTIMED_STEP_MS, outcome, replayed_in_a_thread

LOOPBACK = "127.0.0.1"
SENTINEL = b"end of the capture"  # not JSON: a drop on every path, after which nothing is owed


def usage_line(last: int, total: int, extra: str = "") -> bytes:
    usage = {"total": {"totalTokens": total}, "last": {"totalTokens": last}, "modelContextWindow": 190_000}
    body = json.dumps({"method": "thread/tokenUsage/updated", "params": {"threadId": "t", "turnId": "u",
                                                                      "tokenUsage": usage}})  # fmt: skip
    return body[:-1].encode() + extra.encode() + b"}"


INITIALIZE = b'{"id":1,"result":{"userAgent":"codex_lab_client/0.171.0 (Debian 12.0.0; x86_64) xterm"}}'
# The input class that diverged: the same usage message with a non-finite number beside the numbers.
DIVERGENT = {
    "nan-beside-the-usage": usage_line(90_800, 121_300, ',"emittedAtMs":NaN'),
    "infinity-in-params": usage_line(90_800, 121_300, ',"junk":[-Infinity]'),
    # Not one JSON value but two: embedded as the envelope's payload, the second `payload` key won.
    "two-values-in-one-line": b'{"id":2,"result":{}},"payload":' + usage_line(90_800, 121_300),
}


def stdout_bytes(*lines: bytes) -> bytes:
    lines = (INITIALIZE, THREAD_STARTED, usage_line(30_500, 30_500), *lines, SENTINEL)
    return b"".join(line + b"\n" for line in lines)


def written(events: list[object]) -> list[Write]:
    """The writes the events make on replay's clock: one step per event, drops included."""
    pipeline = Pipeline(SPEC.make_producer(), WriteGuard("replay", incarnation="replay"))
    writes: list[Write] = []
    for index, event in enumerate(events, start=1):
        writes += pipeline.feed(event, index * UNTIMED_STEP_MS)
    return writes


def ended(events: list[object]) -> bool:
    return any(isinstance(event, Dropped) and "Expecting value" in event.reason for event in events)


async def until_ended(events: list[object]) -> None:
    with trio.fail_after(10):
        while not ended(events):  # noqa: ASYNC110 - a list has no event to await
            await trio.sleep(0.01)


async def through_the_tap(data: bytes, channel_dir: Path) -> list[object]:
    """(i) The real stdout tap into the real channel, decoded as the sidecar decodes it."""
    events: list[object] = []
    path = channel_dir / "s"
    send, receive = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(channel.serve, path, partial(channel_decoder, SPEC.channel_frames), events.append)

        async def harness_stdout() -> None:
            async with send:
                for piece in range(0, len(data), 37):  # the pipe breaks lines anywhere
                    await send.send_all(data[piece : piece + 37])

        nursery.start_soon(harness_stdout)
        await tap_stream(receive, "codex", path)
        await until_ended(events)
        nursery.cancel_scope.cancel()
    return events


async def through_the_relay(data: bytes) -> list[object]:
    """(ii) The real relay: a stand-in app-server sends each stdout line as one text message."""
    events: list[object] = []

    async def app_server(request: WebSocketRequest) -> None:
        connection = await request.accept()
        for line in data.splitlines():
            await connection.send_message(line.decode())
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(trio_websocket.serve_websocket, app_server, LOOPBACK, 0, None)
        listeners = await nursery.start(
            serve_relay, Address(LOOPBACK, 0), Address(LOOPBACK, upstream.port), Streams(SPEC, events.append)
        )
        port = listeners[0].socket.getsockname()[1]
        async with trio_websocket.open_websocket(LOOPBACK, port, "/", use_ssl=False) as client:
            received = [await client.get_message() for _ in data.splitlines()]
            assert "\n".join(str(text) for text in received).encode() + b"\n" == data  # relayed unchanged
            await until_ended(events)
        nursery.cancel_scope.cancel()
    return events


async def through_a_replay(data: bytes) -> list[Write]:
    """(iii) `hctx replay` of a recording of the stdout bytes, a line a chunk, a second apart."""
    return await replayed_in_a_thread(SPEC, [Chunk(None, "stdout", line) for line in data.splitlines(keepends=True)])


@pytest.mark.parametrize("name", DIVERGENT)
async def test_a_token_usage_message_is_judged_alike_by_the_tap_the_relay_and_a_replay(
    name: str, channel_dir: Path, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    data = stdout_bytes(DIVERGENT[name])
    tapped = await through_the_tap(data, channel_dir)
    assert capfdbinary.readouterr().out == data  # the tap's copy is untouched
    relayed = await through_the_relay(data)
    replayed_writes = await through_a_replay(data)

    expected = [outcome(write) for write in replayed_writes]
    assert [outcome(write) for write in written(tapped)] == expected  # (i) == (iii)
    assert [outcome(write) for write in written(relayed)] == expected  # (ii) == (iii)
    # And what they agree on: the non-finite message is a drop, never the 44% it would have said.
    assert [(w["usedTokens"], w["harnessVersion"]) for w in expected] == [(30_500, "0.171.0")]
    for events in (tapped, relayed):
        assert any(isinstance(e, Dropped) and "malformed JSON" in e.reason for e in events[2:-1])


async def test_a_valid_capture_is_the_same_on_every_path(
    channel_dir: Path, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    data = stdout_bytes(usage_line(90_800, 121_300, ',"emittedAtMs":1795991471985'))
    tapped = await through_the_tap(data, channel_dir)
    capfdbinary.readouterr()
    relayed = await through_the_relay(data)
    expected = [outcome(write) for write in await through_a_replay(data)]
    assert [outcome(write) for write in written(tapped)] == [outcome(write) for write in written(relayed)] == expected
    assert [w["usedPercent"] for w in expected] == [10, 44]


@pytest.mark.parametrize(
    "line",
    [
        usage_line(90_800, 121_300, ',"note":"x"').replace(b'"x"', b'"\xff"'),  # a byte that is not UTF-8
        usage_line(90_800, 121_300, ',"note":"x"').replace(b'"x"', b'"\xed\xa0\x80"'),  # a surrogate, UTF-8-encoded
    ],
    ids=["stray-byte", "encoded-surrogate"],
)
async def test_bytes_no_websocket_can_carry_are_judged_alike_by_the_tap_and_a_replay(
    line: bytes, channel_dir: Path, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    """Not UTF-8 (a websocket text message cannot hold these): the tap carries the very bytes, so
    the channel refuses what a replay of stdout refuses (HEAD's channel took the surrogate)."""
    data = stdout_bytes(line)
    tapped = await through_the_tap(data, channel_dir)
    assert capfdbinary.readouterr().out == data
    expected = [outcome(write) for write in await through_a_replay(data)]
    assert [outcome(write) for write in written(tapped)] == expected
    assert [w["usedTokens"] for w in expected] == [30_500]
