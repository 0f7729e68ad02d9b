"""`hctx replay`: recorded bytes through the very decoders, producer and write guard the sidecar
runs, no disk involved.

A recording is the chunks of bytes each wire carried, in order, with their arrival times where it
has them (`sidecar.registry.Chunk`). Each wire's bytes go through one decoder for the whole
recording, as one connection's would, so a frame split across chunks is still one frame.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from guard.errors import CatalogError, MalformedFrame, RecordingError
from guard.json_rule import loads_object
from guard.policy import Write, WriteGuard
from guard.record import HarnessContext
from sidecar.decoding import Decoder, Dropped
from sidecar.pipeline import Pipeline
from sidecar.recorder import FORMAT
from sidecar.registry import Chunk, HarnessSpec
from sidecar.spec import recording_bytes

if TYPE_CHECKING:
    from sidecar.app import Writer
    from sidecar.streams import Stream

__all__ = [
    "UNTIMED_STEP_MS",
    "MemoryStore",
    "Summary",
    "Tally",
    "is_recording",
    "read_header",
    "replay",
    "replay_recording",
    "write_line",
]

# Events a recording does not timestamp arrive one replay-second apart: a simulated clock.
UNTIMED_STEP_MS = 1000


@dataclass
class Tally:
    """What a replay made of its input: enough to say so when none of it was the harness's."""

    events: int = 0  # events the decoders made, drops included
    recognised: int = 0  # events the producer accepted


def replay(
    spec: HarnessSpec, chunks: Iterable[Chunk], *, agent: str = "replay", tally: Tally | None = None
) -> Iterator[Write]:
    """The writes, in order."""
    pipeline = Pipeline(spec.make_producer(), WriteGuard(agent, incarnation="replay"))
    tally = Tally() if tally is None else tally
    decoders: dict[str, Decoder] = {}
    clock = 0
    for chunk in chunks:
        decoder = decoders.get(chunk.wire)
        if decoder is None:
            decoder = decoders[chunk.wire] = spec.decoder(chunk.wire)
        for event in decoder.receive_data(chunk.data):
            clock = _arrival(clock, chunk.at_ms, event)
            yield from _fed(pipeline, event, clock, tally)
    for decoder in decoders.values():
        for event in decoder.end_of_data():
            yield from _fed(pipeline, event, _arrival(clock, None, event), tally)


def _arrival(clock: int, at_ms: int | None, event: object) -> int:
    """When `event` arrived: its chunk's time, never before an earlier one's; untimed, a step after
    the last event (a drop takes no time: a damaged line does not shift the ones after it)."""
    if at_ms is not None:
        return max(clock, at_ms)
    return clock if isinstance(event, Dropped) else clock + UNTIMED_STEP_MS


def _fed(pipeline: Pipeline, event: object, clock: int, tally: Tally) -> list[Write]:
    dropped = pipeline.dropped
    writes = pipeline.feed(event, clock)
    tally.events += 1
    if pipeline.dropped == dropped and not isinstance(event, Dropped):
        tally.recognised += 1
    return writes


def write_line(write: Write) -> str:
    """One JSON line: the record exactly as it would be written, with the policy's reason first."""
    return f'{{"reason": "{write.reason}", {write.record.to_json()[1:]}'


# --- a recording the product made (`hctx wrap --record`): through the live driver -------------------


@dataclass
class Summary:
    """What a recording held besides its chunks: said on stderr by `hctx replay`."""

    sidecars: int = 0  # header lines: each a sidecar (a replacement, a relaunch) starting afresh
    lost_chunks: int = 0  # the recorder's gap lines: chunks it dropped for want of room
    truncated: bool = False  # the recorder reached its byte cap
    drops: Counter[str] = field(default_factory=Counter)  # what the pipelines dropped, by where, as live
    problems: list[str] = field(default_factory=list)  # lines that are not a recording's


def is_recording(head: bytes) -> bool:
    """Whether a file starting with `head` is a recording the product made: its header line."""
    first = head.split(b"\n", 1)[0]
    try:
        header = _object(first)
    except MalformedFrame:
        return False
    return header.get("format") == FORMAT


def read_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as file:
        first = file.readline()
    try:
        header = _object(first.rstrip(b"\n"))
    except MalformedFrame as exc:
        raise RecordingError(f"{path}: its first line is no recording header: {exc}") from None
    if header.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a {FORMAT} recording (its header names {header.get('format')!r})")
    return header


def replay_recording(spec: HarnessSpec, path: Path, *, agent: str = "replay") -> tuple[list[Write], Summary]:
    """The writes a recording makes through the live sidecar's `Stream`s, `Writer` and write
    guard, on trio's MockClock (autojump: a recorded hour takes no time) and an in-memory store,
    so the outbox, the refresh of the newest write and a decoder's failure all run as they ran live."""
    summary = Summary()
    landed: list[Write] = []
    lines = recording_bytes(path).split(b"\n")  # a FIFO, a device or a huge file is refused
    if lines and not lines[-1]:
        lines.pop()
    trio.run(_drive, spec, lines, agent, landed, summary, clock=MockClock(autojump_threshold=0))
    return landed, summary


class MemoryStore:
    """Records land in memory, `writtenAtMs` strictly monotonic as the catalog's store keeps it.

    A write lands when the recording says it did (its `write` lines, in order): the replay driver
    releases each, so frames that came while a write was in flight live come while it is in flight
    here too, and the outbox and the refresh decide as they did. A failed one raises, as a full
    disk did. Past the recorded ones (or with none), a write lands at once."""

    def __init__(self) -> None:
        self.last: HarnessContext | None = None
        self._outcomes: deque[str] = deque()
        self._released = trio.Event()
        self.unbounded = False

    def release(self, outcome: str) -> None:
        self._outcomes.append(outcome)
        self._released.set()

    def release_all(self) -> None:
        self.unbounded = True
        self._released.set()

    async def write(self, record: HarnessContext) -> HarnessContext:
        while not self._outcomes and not self.unbounded:
            await self._released.wait()
            self._released = trio.Event()
        if self._outcomes and self._outcomes.popleft() == "failed":
            raise CatalogError("the recorded write failed (as it did live)")
        if self.last is not None and record.written_at_ms <= self.last.written_at_ms:
            record = record.model_copy(update={"written_at_ms": self.last.written_at_ms + 1})
        self.last = record
        return record


class _MockWall:
    """The recorded wall clock, on trio's (mock) clock: `origin_ms` at the start of the replay."""

    def __init__(self, origin_ms: int) -> None:
        self.origin_ms = origin_ms
        self.start = trio.current_time()

    def wall_ms(self) -> int:
        return self.origin_ms + round((trio.current_time() - self.start) * 1000)

    def at(self, at_ms: int) -> float:
        return self.start + max(0, at_ms - self.origin_ms) / 1000


async def _drive(
    spec: HarnessSpec, lines: list[bytes], agent: str, landed: list[Write], summary: Summary
) -> None:
    segment: list[tuple[int, dict[str, Any]]] = []
    header: dict[str, Any] | None = None
    for number, line in enumerate(lines, 1):
        try:
            entry = _object(line)
        except MalformedFrame as exc:
            summary.problems.append(f"line {number}: {exc}")
            continue
        if entry.get("format") == FORMAT:  # a sidecar starts (a replacement, a relaunch): afresh, as live
            if header is not None:
                await _sidecar(spec, header, segment, agent, landed, summary)
            header, segment = entry, []
        elif header is None:
            raise RecordingError(f"line {number}: a recording starts with its header")
        else:
            segment.append((number, entry))
    if header is not None:
        await _sidecar(spec, header, segment, agent, landed, summary)


async def _sidecar(
    spec: HarnessSpec,
    header: dict[str, Any],
    entries: list[tuple[int, dict[str, Any]]],
    agent: str,
    landed: list[Write],
    summary: Summary,
) -> None:
    """One sidecar's lines: its writer runs beside them, and lands what is owed once they end
    (a stream still open then was cut, as live, with no end of its data)."""
    from sidecar.app import Writer

    summary.sidecars += 1
    origin, incarnation = header.get("started_ms"), header.get("incarnation")
    wall = _MockWall(origin if isinstance(origin, int) else 0)
    guard = WriteGuard(agent, incarnation if isinstance(incarnation, str) else "replay")
    store = MemoryStore()
    writer = Writer(Pipeline(spec.make_producer(), guard), store, wall)
    writer.on_landed = landed.append
    streams: dict[int, Stream] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        for number, entry in entries:
            at_ms = entry.get("at_ms")
            if isinstance(at_ms, int) and not isinstance(at_ms, bool):
                await trio.sleep_until(wall.at(at_ms))
            if (outcome := entry.get("write")) in ("landed", "failed"):
                store.release(outcome)
            elif (problem := _play(spec, entry, writer, streams)) is not None:
                summary.problems.append(f"line {number}: {problem}")
            # Everything this line set going (a write taken, refreshed, landed) runs before the next.
            await wait_all_tasks_blocked()
            if isinstance(gap := entry.get("gap"), dict) and isinstance(chunks := gap.get("chunks"), int):
                summary.lost_chunks += chunks
            summary.truncated = summary.truncated or "truncated" in entry
        store.release_all()
        writer.close()
    summary.drops.update(writer.pipeline.drops)


def _play(spec: HarnessSpec, entry: dict[str, Any], writer: Writer, streams: dict[int, Stream]) -> str | None:
    """One line into the live path; what is wrong with it, if anything."""
    if "gap" in entry or "truncated" in entry:
        return None
    if "fact" in entry:
        return _fact(spec, entry, writer)
    wire, stream_id = entry.get("wire"), entry.get("stream")
    if not isinstance(wire, str) or not isinstance(stream_id, int) or wire not in spec.wires():
        return f"no wire of the {spec.name} harness: {wire!r}"
    stream = streams.get(stream_id)
    if stream is None:
        from sidecar.app import transport_streams

        stream = streams[stream_id] = transport_streams(spec, writer).open(wire)
    if entry.get("end") is True:
        stream.end_of_data()
        del streams[stream_id]
        return None
    try:
        data = base64.b64decode(entry.get("b64", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        return "its b64 is not base64"
    stream.receive_data(data)
    return None


def _fact(spec: HarnessSpec, entry: dict[str, Any], writer: Writer) -> str | None:
    """A fact a transport submitted: rebuilt only as a type of the harness's own package."""
    from pydantic import TypeAdapter, ValidationError

    name = entry.get("fact")
    module_name, _, qualname = name.partition(":") if isinstance(name, str) else ("", "", "")
    package = type(writer.pipeline.producer).__module__.rpartition(".")[0]
    if not package or (not module_name.startswith(f"{package}.") and module_name != package):
        return f"a fact of no type of the {spec.name} harness: {name!r}"
    try:
        kind = getattr(importlib.import_module(module_name), qualname)
        writer.submit(TypeAdapter(kind).validate_python(entry.get("value")))
    except (ImportError, AttributeError, ValidationError, TypeError) as exc:
        return f"fact {name!r} not rebuilt: {str(exc)[:120]}"
    return None


def _object(data: bytes) -> dict[str, Any]:
    """One line of a recording by the one JSON rule; MalformedFrame says why it is none."""
    return loads_object(data, error=MalformedFrame)
