"""The channel under hostile input, in-process: what is dropped, what survives, who is refused."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import channel
from sidecar.decoding import Dropped
from sidecar.spec import ChannelPathError
from tests.conftest import Received, raw_channel_decoder

Frame = dict[str, Any]


@pytest.fixture
def socket_path(channel_dir: Path) -> Path:
    return channel_dir / "s"


async def _serve(nursery: trio.Nursery, path: Path) -> Received:
    received = Received()
    await nursery.start(channel.serve, path, raw_channel_decoder, received.submit)
    return received


async def _send(path: Path, *chunks: bytes) -> None:
    stream = await trio.open_unix_socket(os.fspath(path))
    async with stream:
        for chunk in chunks:
            await stream.send_all(chunk)


async def _settle(received: Received, count: int) -> None:
    with trio.fail_after(10):
        while len(received) < count:
            await received.changed.wait()


async def test_the_socket_is_private_to_its_owner(socket_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        await _serve(nursery, socket_path)
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        nursery.cancel_scope.cancel()
    assert not socket_path.exists()


async def test_the_bind_leaves_the_process_umask_alone(socket_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The umask is the whole process's: narrowed for the bind, it left a directory another thread
    made meanwhile 0600 (CI met it as `hctx setup`'s config dir). The socket is private all the same."""
    touched: list[int] = []
    monkeypatch.setattr(os, "umask", lambda mask: touched.append(mask) or 0o022)
    async with trio.open_nursery() as nursery:
        await _serve(nursery, socket_path)
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        nursery.cancel_scope.cancel()
    assert touched == []


def test_a_world_readable_directory_or_an_overlong_path_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(ChannelPathError, match="0700"):
        channel.check_channel_path(open_dir / "s")
    deep = tmp_path / ("d" * 100)
    deep.mkdir(mode=0o700)
    with pytest.raises(ChannelPathError, match="longer than 107"):
        channel.check_channel_path(deep / "s")


async def test_garbage_oversized_and_half_frames_are_dropped_and_the_good_ones_arrive(socket_path: Path) -> None:
    good = {"type": "context", "n": 1}
    async with trio.open_nursery() as nursery:
        received = await _serve(nursery, socket_path)
        await _send(socket_path, b"\x00\xff garbage\n", b"[1,2]\n", b'{"no":"type"}\n', b'{"type":7}\n')
        await _send(socket_path, b"x" * (10 * 1024 * 1024) + b"\n" + json.dumps(good).encode() + b"\n")
        await _send(socket_path, json.dumps(good).encode() + b"\n" + b'{"type":"context","half')
        await _send(socket_path, b"[" * 100_000 + b"\n")
        await _settle(received, 2)
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert received == [good, good]
    reasons = " | ".join(drop.reason for drop in received.dropped)
    for why in ("malformed JSON", "not a JSON object but list", "no string 'type'", "over 1048576 bytes",
                "truncated frame"):  # fmt: skip
        assert why in reasons


async def test_a_frame_split_across_many_writes_arrives_whole(socket_path: Path) -> None:
    frame = json.dumps({"type": "context", "payload": "y" * 200_000}).encode() + b"\n"
    async with trio.open_nursery() as nursery:
        received = await _serve(nursery, socket_path)
        await _send(socket_path, *(frame[i : i + 7919] for i in range(0, len(frame), 7919)))
        await _settle(received, 1)
        nursery.cancel_scope.cancel()
    assert received[0]["payload"] == "y" * 200_000


async def test_a_peer_of_another_uid_is_refused_before_a_byte_is_read(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(channel, "peer_uid", lambda sock: os.getuid() + 1)
    async with trio.open_nursery() as nursery:
        received = await _serve(nursery, socket_path)
        await _send(socket_path, b'{"type":"context"}\n')
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert received == []
    assert any("refused" in r.getMessage() for r in caplog.records)


async def test_a_thousand_connections_in_a_burst_all_land(socket_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        received = await _serve(nursery, socket_path)
        async with trio.open_nursery() as clients:
            for n in range(1000):
                clients.start_soon(_send, socket_path, json.dumps({"type": "t", "n": n}).encode() + b"\n")
        await _settle(received, 1000)
        nursery.cancel_scope.cancel()
    assert sorted(frame["n"] for frame in received) == list(range(1000))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_the_channel_decoder_answers_every_input_with_frames_or_reasons(data: bytes) -> None:
    decoder = raw_channel_decoder()
    events = decoder.receive_data(data) + decoder.end_of_data()
    for event in events:
        assert (isinstance(event, Dropped) and event.reason) or (
            isinstance(event, dict) and isinstance(event["type"], str)
        )
    lines = [line for line in data.split(b"\n") if line.strip()]
    assert len(events) == len(lines)  # every line is one frame or one drop, never silently lost
