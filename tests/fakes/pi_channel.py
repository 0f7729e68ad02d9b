"""A recording stand-in for the sidecar's channel: a unix stream socket that keeps every frame.

The extension asset is tested against this rather than against a mock of its socket code, so the
bytes it really writes (newline framing included) are what the tests assert.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from guard.errors import FrameRejected
from guard.policy import Reading
from sidecar.decoding import CHANNEL, Dropped
from sidecar.harnesses.pi.producer import PI, PiProducer
from sidecar.recorder import Chunk
from tests.conftest import channel_readings


@dataclass
class ChannelRecording:
    path: Path
    lines: list[bytes] = field(default_factory=list)
    # (arrival ms, frame) for every line that parsed as a JSON object
    frames: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)
    # how many connections were made to the channel
    connections: int = 0

    def record(self, line: bytes) -> None:
        self.lines.append(line)
        try:
            frame = json.loads(line)
        except ValueError:
            return
        if isinstance(frame, dict):
            self.frames.append((int(time.time() * 1000), frame))
            self.arrived.set()
            self.arrived = trio.Event()

    def jsonl(self) -> bytes:
        """The frames as a replayable recording: each stamped with its arrival time as `atMs`."""
        return b"".join(
            json.dumps({**frame, "atMs": at_ms}, separators=(",", ":")).encode() + b"\n" for at_ms, frame in self.frames
        )

    async def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
        """The first frame `match` accepts, waiting for it; fails the test after `timeout_s`."""
        with trio.fail_after(timeout_s):
            while True:
                for _, frame in self.frames:
                    if match(frame):
                        return frame
                await self.arrived.wait()


async def _serve(listener: trio.SocketListener, recording: ChannelRecording) -> None:
    async def connection(stream: trio.SocketStream) -> None:
        recording.connections += 1
        buffer = b""
        async with stream:
            async for chunk in stream:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    recording.record(line)

    await trio.serve_listeners(connection, [listener])


@asynccontextmanager
async def recording_channel(path: Path) -> AsyncIterator[ChannelRecording]:
    """Listen on `path` for the duration of the block; the recording fills as frames arrive."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(os.fspath(path))
    sock.listen(16)
    recording = ChannelRecording(path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, trio.SocketListener(sock), recording)
        try:
            yield recording
        finally:
            nursery.cancel_scope.cancel()
            path.unlink(missing_ok=True)


# --- the channel's bytes through the spec's own decoder ----------------------------------------------


def feed(producer: PiProducer, frame: Any, now_ms: int = 1_000) -> list[Reading]:
    """`frame` as the extension sends it (one JSON line), through the channel decoder into
    `producer`; FrameRejected for a frame the decoder drops (its reason), as the producer would."""
    return fed(producer, json.dumps(frame).encode() + b"\n", now_ms)


def fed(producer: PiProducer, data: bytes, now_ms: int = 1_000) -> list[Reading]:
    return channel_readings(PI, producer, data, now_ms)


def channel_lines(data: bytes) -> list[Chunk]:
    """The lines of what `ChannelRecording.jsonl` keeps (the frames as the asset sent them, each
    stamped `atMs`), each timed by its stamp (None without one); a cut tail stays cut. The product
    replays recordings only: scripts/convert_fixtures.py converts these (fixtures/pi/live/)."""
    chunks = []
    lines = data.split(b"\n")
    for index, line in enumerate(lines):
        sent = line if index == len(lines) - 1 else line + b"\n"
        if not sent:
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            item = None
        at_ms = item.get("atMs") if isinstance(item, dict) else None
        chunks.append(Chunk(at_ms if type(at_ms) is int and at_ms >= 0 else None, CHANNEL, sent))
    return chunks


def recorded_frames(data: bytes) -> list[tuple[int | None, dict[str, Any]]]:
    """(time, frame) of each line of `ChannelRecording.jsonl`'s bytes (`channel_lines`), lines
    that are no JSON object left out."""
    return frames_of(channel_lines(data))


def frames_of(chunks: list[Chunk]) -> list[tuple[int | None, dict[str, Any]]]:
    """(time, frame) of each chunk that is one JSON object."""
    frames = []
    for chunk in chunks:
        try:
            frame = json.loads(chunk.data)
        except (ValueError, RecursionError):
            continue
        if isinstance(frame, dict):
            frames.append((chunk.at_ms, frame))
    return frames


def replayed_readings(producer: PiProducer, data: bytes) -> list[Reading]:
    """`ChannelRecording.jsonl`'s lines through one channel decoder into `producer`, each at its own
    time (0 untimed); drops and refusals cost their frame, as in `hctx replay`."""
    decoder = PI.decoder(CHANNEL)
    readings: list[Reading] = []
    for chunk in channel_lines(data):
        for event in decoder.receive_data(chunk.data):
            if not isinstance(event, Dropped):
                try:
                    readings += producer.feed(event, chunk.at_ms or 0)
                except FrameRejected:
                    continue
    return readings
