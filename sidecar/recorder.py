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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import trio

if TYPE_CHECKING:
    from sidecar.redaction import Redactor

__all__ = [
    "DEFAULT_CAP_BYTES",
    "FORMAT",
    "QUEUE_BYTES",
    "Chunk",
    "Recorder",
    "create_recording",
    "encode_line",
    "fact_line",
    "redact_recording",
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
    with O_CREAT never follows one), 0600: a session's bytes are the user's. Appended to only: each
    sidecar of the session writes through this one open file (`hctx wrap` hands it down by
    descriptor), never through the path, which whoever may rename in its directory could swap."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "ab")


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


# A chunk queued: its time, wire, stream and bytes, and whether bytes of its stream were dropped
# before it (its redactor must not trust where it thought it was).
_Queued = tuple[int, str, int, bytes, bool]


@dataclass
class Recorder:
    """Offered chunks queued for `run` to write to `file`, first the `header`. With `redactor`
    (a fresh `sidecar.redaction.Redactor` for a wire), each stream's chunks are redacted on their
    way to the file, in the worker thread (the default; `hctx wrap --record-raw` records none)."""

    file: BinaryIO
    header: dict[str, Any]
    cap_bytes: int = DEFAULT_CAP_BYTES
    written: int = 0
    lost_chunks: int = 0
    lost_bytes: int = 0
    truncated: bool = False
    last_at_ms: int = 0  # the newest chunk's time: a gap said at the end is dated by it
    redactor: Callable[[str], Redactor] | None = None
    _queue: deque[dict[str, Any] | _Queued] = field(default_factory=deque)
    _queued_bytes: int = 0
    _streams: int = 0
    _lost_streams: set[int] = field(default_factory=set)
    _redactors: dict[int, Redactor] = field(default_factory=dict)  # the worker thread's alone
    _wake: trio.Event = field(default_factory=trio.Event)
    _closed: bool = False
    _broken: bool = False

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
            self._lost_streams.add(stream)
            return
        self._gap_if_lost(at_ms)
        after_loss = stream in self._lost_streams
        self._lost_streams.discard(stream)
        self._queue.append((at_ms, wire, stream, data, after_loss))
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
        """Write the header, then each batch queued, in a worker thread, until closed and drained.
        A file that cannot be written (a full disk, an I/O error) ends the recording, logged, and
        never the sidecar: closing it again is not allowed to raise either."""
        try:
            header: list[dict[str, Any] | _Queued] = [self.header]
            await trio.to_thread.run_sync(self._write, header)
            while True:
                if not self._queue:
                    if self._closed:
                        break
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                await trio.to_thread.run_sync(self._write, self._drain())
            if self.lost_chunks:
                self._gap_if_lost(self.last_at_ms)
                await trio.to_thread.run_sync(self._write, self._drain())
        except OSError as exc:
            self._failed(exc)
        finally:
            self._queue.clear()
            try:
                self.file.close()  # a buffered file flushes on close: the disk-full error again
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if not self._broken:  # once: a close after a failed write fails again the same way
            log.error("recording stopped: %s", exc, extra={"event": "recording-failed"})
        self._broken = self.truncated = True

    def _drain(self) -> list[dict[str, Any] | _Queued]:
        batch = list(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        return batch

    def _write(self, entries: list[dict[str, Any] | _Queued]) -> None:
        for entry in entries:
            if self.truncated:
                return
            line = self._line(entry)
            if line is None:
                continue
            if self.written + len(line) > self.cap_bytes:
                self.truncated = True
                line = encode_line({"truncated": {"cap_bytes": self.cap_bytes, "written_bytes": self.written}})
            self.file.write(line)
            self.written += len(line)
        self.file.flush()

    def _line(self, entry: dict[str, Any] | _Queued) -> bytes | None:
        """The entry's line, its chunk redacted when the recorder redacts (None: nothing to write
        yet, the redactor holds the chunk's bytes for a later one of its stream)."""
        if not isinstance(entry, tuple):
            if entry.get("end") is True:
                self._redactors.pop(entry.get("stream", 0), None)
            return encode_line(entry)
        at_ms, wire, stream, data, after_loss = entry
        if self.redactor is not None:
            redactor = self._redactors.get(stream)
            if redactor is None:
                redactor = self._redactors[stream] = self.redactor(wire)
            if after_loss:
                redactor.lost()
            data = redactor.redact(data)
            if not data:
                return None
        return encode_line((at_ms, wire, stream, data))


def encode_line(entry: dict[str, Any] | tuple[int, str, int, bytes]) -> bytes:
    """One line of a recording: an entry, or a chunk as (at_ms, wire, stream, bytes)."""
    if isinstance(entry, tuple):
        at_ms, wire, stream, data = entry
        entry = {"at_ms": at_ms, "wire": wire, "stream": stream, "b64": base64.b64encode(data).decode("ascii")}
    return json.dumps(entry, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def redact_recording(data: bytes) -> bytes:
    """A whole recording (`--record-raw`'s, or one made before redaction) as `hctx wrap --record`
    would have recorded it: each header's harness redacts its sidecar's streams; a gap leaves every
    stream's redactor unsure where it was. Lines that are not chunks are kept as they were."""
    from sidecar.redaction import redactors
    from sidecar.registry import spec_for

    out: list[bytes] = []
    make: Callable[[str], Redactor] | None = None
    streams: dict[int, Redactor] = {}
    for line in data.splitlines():
        entry = json.loads(line)
        if "format" in entry:
            make, streams = redactors(spec_for(entry["harness"])), {}
            entry["redacted"] = True
        elif "gap" in entry:
            for redactor in streams.values():
                redactor.lost()
        elif "b64" in entry and make is not None:
            stream = entry["stream"]
            redactor = streams.get(stream) or streams.setdefault(stream, make(entry["wire"]))
            redacted = redactor.redact(base64.b64decode(entry["b64"], validate=True))
            if not redacted:
                continue  # held for a later chunk of its stream (a string of JSON text, cut)
            entry["b64"] = base64.b64encode(redacted).decode("ascii")
        elif entry.get("end") is True:
            streams.pop(entry.get("stream", 0), None)
        out.append(encode_line(entry))
    return b"".join(out)
