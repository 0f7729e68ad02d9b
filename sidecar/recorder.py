"""`hctx wrap --record FILE`: every byte a stream hands its decoder, with its time and wire.

The sidecar's `Stream.receive_data` (sidecar.streams) is the one place bytes meet a decoder, on
every wire and the channel alike; with a recorder it also offers the bytes here. Offering never
blocks and costs a deque append: the lines are encoded and written by `Recorder.run`, a task of
its own, in a worker thread. What waits is bounded (`QUEUE_BYTES`): past that, chunks are dropped
and counted, and one "gap" line says how many before the next chunk that is kept. The file is
bounded too (`cap_bytes`): the line that would pass it is replaced by one "truncated" line, and
nothing more is written. docs/recording.md describes the format; `sidecar.replay` reads it back.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import trio

__all__ = [
    "DEFAULT_CAP_BYTES",
    "FORMAT",
    "QUEUE_BYTES",
    "Chunk",
    "Recorder",
    "create_recording",
    "encode_line",
    "fact_line",
]

log = logging.getLogger(__name__)

FORMAT = "hctx.recording.v1"
DEFAULT_CAP_BYTES = 64 * 1024 * 1024
# Bytes offered and not yet written: a stalled disk costs recorded chunks, never a decoder's time.
QUEUE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes one stream of a wire carried, and when they arrived (ms, the wall clock): a chunk line
    of a recording (`sidecar.replay.read_chunks` reads them back)."""

    at_ms: int | None
    wire: str
    data: bytes
    stream: int | None = None  # None: the wire's one stream


def create_recording(path: str | os.PathLike[str]) -> BinaryIO:
    """A new file at `path`, refused if anything is there already (a symlink included: O_EXCL
    with O_CREAT never follows one), 0600: a session's bytes are the user's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "wb")


def fact_line(at_ms: int, event: object) -> dict[str, Any] | None:
    """A fact the sidecar submitted itself (not bytes: a setting the wrapper read), as a line;
    None for an event that is not a pydantic model or dataclass of its harness's package."""
    from pydantic import TypeAdapter  # loaded only when a transport submits a fact to a recorder

    kind = type(event)
    try:
        value = TypeAdapter(kind).dump_python(event, mode="json")
    except Exception:  # not a type pydantic can dump: the recording says so, the sidecar goes on
        return None
    return {"at_ms": at_ms, "fact": f"{kind.__module__}:{kind.__qualname__}", "value": value}


@dataclass
class Recorder:
    """Offered chunks queued for `run` to write to `file`, first the `header`."""

    file: BinaryIO
    header: dict[str, Any]
    cap_bytes: int = DEFAULT_CAP_BYTES
    written: int = 0
    lost_chunks: int = 0
    lost_bytes: int = 0
    truncated: bool = False
    last_at_ms: int = 0  # the newest chunk's time: a gap said at the end is dated by it
    _queue: deque[dict[str, Any] | tuple[int, str, int, bytes]] = field(default_factory=deque)
    _queued_bytes: int = 0
    _streams: int = 0
    _wake: trio.Event = field(default_factory=trio.Event)
    _closed: bool = False

    def new_stream(self) -> int:
        self._streams += 1
        return self._streams

    def chunk(self, at_ms: int, wire: str, stream: int, data: bytes) -> None:
        if self.truncated or self._closed or not data:
            return
        self.last_at_ms = at_ms
        if self._queued_bytes + len(data) > QUEUE_BYTES:
            self.lost_chunks += 1
            self.lost_bytes += len(data)
            return
        self._gap_if_lost(at_ms)
        self._queue.append((at_ms, wire, stream, data))
        self._queued_bytes += len(data)
        self._wake.set()

    def line(self, entry: dict[str, Any]) -> None:
        """A line of its own (a stream's end, a fact): small, so never dropped for room."""
        if not (self.truncated or self._closed):
            self._gap_if_lost(entry.get("at_ms", 0))
            self._queue.append(entry)
            self._wake.set()

    def _gap_if_lost(self, at_ms: int) -> None:
        if self.lost_chunks:
            self._queue.append({"at_ms": at_ms, "gap": {"chunks": self.lost_chunks, "bytes": self.lost_bytes}})
            self.lost_chunks = self.lost_bytes = 0

    def close(self) -> None:
        """No more chunks: `run` writes what is queued, then returns."""
        self._closed = True
        self._wake.set()

    async def run(self) -> None:
        """Write the header, then each batch queued, in a worker thread, until closed and drained."""
        try:
            await trio.to_thread.run_sync(self._write, [encode_line(self.header)])
            while True:
                if not self._queue:
                    if self._closed:
                        break
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                batch = [encode_line(entry) for entry in self._drain()]
                await trio.to_thread.run_sync(self._write, batch)
            if self.lost_chunks:
                self._gap_if_lost(self.last_at_ms)
                await trio.to_thread.run_sync(self._write, [encode_line(entry) for entry in self._drain()])
        except OSError as exc:  # a full disk costs the recording, never the session
            log.error("recording stopped: %s", exc, extra={"event": "recording-failed"})
            self.truncated = True
        finally:
            self._queue.clear()
            self.file.close()

    def _drain(self) -> list[dict[str, Any] | tuple[int, str, int, bytes]]:
        batch = list(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        return batch

    def _write(self, lines: list[bytes]) -> None:
        for line in lines:
            if self.truncated:
                return
            if self.written + len(line) > self.cap_bytes:
                self.truncated = True
                line = encode_line({"truncated": {"cap_bytes": self.cap_bytes, "written_bytes": self.written}})
            self.file.write(line)
            self.written += len(line)
        self.file.flush()


def encode_line(entry: dict[str, Any] | tuple[int, str, int, bytes]) -> bytes:
    """One line of a recording: an entry, or a chunk as (at_ms, wire, stream, bytes)."""
    if isinstance(entry, tuple):
        at_ms, wire, stream, data = entry
        entry = {"at_ms": at_ms, "wire": wire, "stream": stream, "b64": base64.b64encode(data).decode("ascii")}
    return json.dumps(entry, separators=(",", ":"), allow_nan=False).encode() + b"\n"
