"""`hctx replay FILE`: a recording `hctx wrap --record` made (docs/recording.md), through the very
`Stream`s, `Writer` and write guard the live sidecar runs, on trio's MockClock and an in-memory store.

Only a recording is replayed: a harness's captures (the lab's files) were converted into
recordings once, by scripts/convert_fixtures.py, and the product reads no other shape.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from guard.errors import CatalogError, MalformedFrame
from guard.json_rule import loads_object
from guard.policy import Write
from guard.record import HarnessContext, describe_validation_error
from sidecar.recorder import FORMAT, Chunk
from sidecar.spec import HarnessSpec, RecordingError, recording_bytes

if TYPE_CHECKING:
    from sidecar.app import Outcome, Sidecar, SidecarSettings, Writer
    from sidecar.streams import Stream

__all__ = [
    "MemoryStore",
    "Recorded",
    "RecordedSchedule",
    "Summary",
    "header_of",
    "read_chunks",
    "read_header",
    "replay_bytes",
    "replay_recording",
    "write_line",
]


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


def header_of(data: bytes, name: object = "the file") -> dict[str, Any]:
    """A recording's header: its first line. RecordingError for anything else, saying what it is
    (a harness's own capture is converted into a recording by scripts/convert_fixtures.py)."""
    first = data.split(b"\n", 1)[0]
    try:
        header = _object(first)
    except MalformedFrame:
        header = None
    if header is None or header.get("format") != FORMAT:
        said = "its first line is no JSON object" if header is None else f"its first line names no format {FORMAT!r}"
        raise RecordingError(
            f"{name} is not a recording `hctx wrap --record` made ({said}); hctx replays only recordings"
        )
    return header


def read_header(path: Path) -> dict[str, Any]:
    """The header of the recording at `path` (a FIFO, a device or a huge file refused, OSError)."""
    return header_of(recording_bytes(path), path)


def read_chunks(data: bytes) -> list[Chunk]:
    """The chunks a recording holds, in order, each with its time, wire and stream (the demo plays
    them; tests cut them): the lines that are no chunk, and a damaged one, left out."""
    chunks: list[Chunk] = []
    for line in data.split(b"\n"):
        try:
            entry = _object(line)
            at_ms, wire, stream = entry["at_ms"], entry["wire"], entry["stream"]
            payload = base64.b64decode(entry["b64"], validate=True)
        except (MalformedFrame, KeyError, TypeError, binascii.Error, ValueError):
            continue
        if isinstance(at_ms, int) and isinstance(wire, str) and isinstance(stream, int):
            chunks.append(Chunk(at_ms, wire, payload, stream))
    return chunks


def replay_recording(spec: HarnessSpec, path: Path, *, agent: str | None = None) -> tuple[list[Write], Summary]:
    """`replay_bytes` of the file at `path` (a FIFO, a device or a huge file refused, OSError)."""
    return replay_bytes(spec, recording_bytes(path), agent=agent, name=path)


def replay_bytes(
    spec: HarnessSpec, data: bytes, *, agent: str | None = None, name: object = "the recording"
) -> tuple[list[Write], Summary]:
    """The writes a recording makes through the live sidecar's own setup (`sidecar.app.assemble`:
    its `Stream`s, `Writer` and write guard, configured as each header says the live sidecar was),
    on trio's MockClock (autojump: a recorded hour takes no time) and an in-memory store, so the
    outbox, the refresh of the newest write and a decoder's failure all run as they ran live.
    `agent`, given, replaces the recorded one. RecordingError for bytes that are no recording (no
    header first, or a header whose `config` is no sidecar's)."""
    header_of(data, name)
    summary = Summary()
    landed: list[Write] = []
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    trio.run(_drive, spec, lines, agent, landed, summary, clock=MockClock(autojump_threshold=0))
    return landed, summary


class Recorded:
    """What a recording says the live writer did, one line at a time (a write taken, a write landed
    or failed), released in order by the replay driver to the writer waiting for it. Past the
    recorded ones (`release_all`), or for a recording that holds none, each comes at once (None)."""

    def __init__(self) -> None:
        self._said: deque[str] = deque()
        self._released = trio.Event()
        self.unbounded = False

    def release(self, said: str) -> None:
        self._said.append(said)
        self._released.set()

    def release_all(self) -> None:
        self.unbounded = True
        self._released.set()

    async def next(self) -> str | None:
        while not self._said and not self.unbounded:
            await self._released.wait()
            self._released = trio.Event()
        return self._said.popleft() if self._said else None


class MemoryStore(Recorded):
    """Records land in memory, `writtenAtMs` strictly monotonic as the catalog's store keeps it.

    A write lands when the recording says it did (its `write` lines, in order): the replay driver
    releases each, so frames that came while a write was in flight live come while it is in flight
    here too, and the outbox and the refresh decide as they did. A failed one raises, as a full
    disk did. Past the recorded ones (or with none), a write lands at once."""

    def __init__(self) -> None:
        super().__init__()
        self.last: HarnessContext | None = None

    async def write(self, record: HarnessContext) -> HarnessContext:
        if await self.next() == "failed":
            raise CatalogError("the recorded write failed (as it did live)")
        if self.last is not None and record.written_at_ms <= self.last.written_at_ms:
            record = record.model_copy(update={"written_at_ms": self.last.written_at_ms + 1})
        self.last = record
        return record


class RecordedSchedule:
    """The live writer's schedule, as its recording says (sidecar.app.Schedule): records stamped by
    the recorded wall clock; a write taken at its `taken` line (`taken`); late where a `late` line
    says the live one was found late (`found_late`, set by the driver), never by the replay's own
    clock, so it folds exactly the writes the live outbox folded however near the bound the recorded
    times fell; each write that landed kept, in order (`landed`)."""

    def __init__(self, wall: _MockWall, taken: Recorded) -> None:
        self.wall = wall
        self.taken = taken
        self.found_late = False
        self.landed: list[Write] = []

    def wall_ms(self) -> int:
        return self.wall.wall_ms()

    async def take(self) -> None:
        await self.taken.next()

    def late(self, in_flight_s: float) -> bool:
        return self.found_late

    def said(self, outcome: Outcome, write: Write) -> None:
        if outcome == "landed":
            self.landed.append(write)
        if outcome in ("landed", "failed"):
            self.found_late = False


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
    spec: HarnessSpec, lines: list[bytes], agent: str | None, landed: list[Write], summary: Summary
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


def _settings_of(spec: HarnessSpec, header: dict[str, Any], agent: str | None = None) -> SidecarSettings:
    """What the sidecar a header starts was started with (its `config`); a header without one (a
    recording made before it held it, a converted capture) the defaults, with its incarnation.
    RecordingError for a `config` that is no sidecar's."""
    from pydantic import ValidationError

    from sidecar.app import SidecarSettings

    config, incarnation = header.get("config"), header.get("incarnation")
    try:
        if config is None:
            settings = SidecarSettings(
                harness=spec.name, incarnation=incarnation if isinstance(incarnation, str) else "replay"
            )
        else:
            settings = SidecarSettings.model_validate(config)
    except ValidationError as exc:
        raise RecordingError(f"its header's config is no sidecar's: {describe_validation_error(exc)}") from None
    return settings if agent is None else settings.model_copy(update={"agent": agent})


async def _sidecar(
    spec: HarnessSpec,
    header: dict[str, Any],
    entries: list[tuple[int, dict[str, Any]]],
    agent: str | None,
    landed: list[Write],
    summary: Summary,
) -> None:
    """One sidecar's lines: its writer runs beside them, and lands what is owed once they end
    (a stream still open then was cut, as live, with no end of its data)."""
    from sidecar.app import assemble

    summary.sidecars += 1
    settings = _settings_of(spec, header, agent)
    origin = header.get("started_ms")
    wall = _MockWall(origin if isinstance(origin, int) else 0)
    store = MemoryStore()
    # A recording that says when no write landed (a capture converted into one) lands each at once.
    # The writer's own lines the recording holds (a hostile one's non-string `write` is none of them).
    said = {said for _, entry in entries if isinstance(said := entry.get("write"), str)}
    store.unbounded = not said & {"landed", "failed"}
    # A write is taken (refreshed with the newest reading held, and sent) when its `taken` line
    # says: live, the frames the channel read before the writer got to it decided what it carried.
    taken = Recorded()
    taken.unbounded = "taken" not in said
    schedule = RecordedSchedule(wall, taken)
    sidecar = assemble(spec, settings, store, schedule)
    writer = sidecar.writer
    streams: dict[int, Stream] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        for at, (number, entry) in enumerate(entries):
            at_ms = entry.get("at_ms")
            if isinstance(at_ms, int) and not isinstance(at_ms, bool) and wall.at(at_ms) > trio.current_time():
                await trio.sleep_until(wall.at(at_ms))
            quiet = False  # a chunk that completed no event set nothing going
            # Live, the outbox found the write in flight late while it took this line's event in, and
            # said so right after this line: the event is taken in as it was, folded.
            found_late = at + 1 < len(entries) and entries[at + 1][1].get("write") == "late"
            if found_late and writer.outbox.in_flight is not None:
                schedule.found_late = True
            if (outcome := entry.get("write")) in ("landed", "failed"):
                store.release(outcome)
            elif outcome == "taken":
                taken.release(outcome)
            elif outcome == "late":
                pass  # taken with the line before it
            elif isinstance(problem := _play(sidecar, entry, streams), str):
                summary.problems.append(f"line {number}: {problem}")
            else:
                quiet = problem == 0
            if not quiet:  # everything this line set going (a write taken, refreshed, landed) runs before the next
                await wait_all_tasks_blocked()
            if isinstance(gap := entry.get("gap"), dict) and isinstance(chunks := gap.get("chunks"), int):
                summary.lost_chunks += chunks
            summary.truncated = summary.truncated or "truncated" in entry
        store.release_all()
        taken.release_all()
        writer.close()
    landed += schedule.landed
    summary.drops.update(writer.pipeline.drops)


def _play(sidecar: Sidecar, entry: dict[str, Any], streams: dict[int, Stream]) -> str | int | None:
    """One line into the live path: what is wrong with it, if anything, else how many events a
    chunk completed (None for any other line)."""
    spec = sidecar.spec
    if "gap" in entry or "truncated" in entry:
        return None
    if "fact" in entry:
        return _fact(spec, entry, sidecar.writer)
    wire, stream_id = entry.get("wire"), entry.get("stream")
    if not isinstance(wire, str) or not isinstance(stream_id, int) or wire not in spec.wires():
        return f"no wire of the {spec.name} harness: {wire!r}"
    stream = streams.get(stream_id)
    if stream is None:
        stream = streams[stream_id] = sidecar.streams.open(wire)
    if entry.get("end") is True:
        del streams[stream_id]
        return stream.end_of_data()
    try:
        data = base64.b64decode(entry.get("b64", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        return "its b64 is not base64"
    return stream.receive_data(data)


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
        fact = TypeAdapter(kind).validate_python(entry.get("value"))
    except ValidationError as exc:
        return f"fact {name!r} not rebuilt: {str(exc)[:120]}"
    except Exception as exc:  # hostile input: a name of no fact's type is a refused line
        # A class pydantic builds no schema for (a producer, a transport), a name that is no class,
        # a constructor that raises: the recording names it, so it costs the line, never the replay.
        return f"fact {name!r} not rebuilt: it names no type a fact is ({type(exc).__name__})"
    writer.submit(fact)
    return None


def _object(data: bytes) -> dict[str, Any]:
    """One line of a recording by the one JSON rule; MalformedFrame says why it is none."""
    return loads_object(data, error=MalformedFrame)
