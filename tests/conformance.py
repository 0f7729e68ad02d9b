"""Conformance helpers: the writes a recording makes, whole, split, or lived through a transport.

Every fixture a test replays is a recording (`fixtures/recordings/`, converted once from the lab's
captures by scripts/convert_fixtures.py), and every replay runs the product's own driver
(`sidecar.replay`: the live `Stream` → `Writer` → guard path on MockClock). `replayed` turns chunks
a test holds (cut, damaged, made up) into a recording and replays it; `outcome` reduces a write to
what must agree on every path (the reason and the record's reading fields, not the clock it was
taken by). `split_at` cuts every chunk of a recording at the given byte offsets, so a test can
prove that where the bytes break never changes what is written.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import guard
from guard.policy import Write
from sidecar.recorder import FORMAT, Chunk, encode_line
from sidecar.registry import HarnessSpec, spec_for
from sidecar.replay import read_chunks, replay_bytes, replay_recording
from tests.conftest import FIXTURE_ROOT

RECORDINGS = FIXTURE_ROOT / "recordings"
# What a chunk with no time of its own is given: a second after the one before.
UNTIMED_STEP_MS = 1000

# The fields that depend on when, not what: the replay clock and the live one differ.
CLOCK_FIELDS = frozenset({"observedAtMs", "writtenAtMs", "lastCompactionMs", "incarnation", "agent"})
# What a live write and its replay may differ in: when it landed (stamped under the catalog's
# lock live, by the in-memory store in a replay). Every other field of every write is compared.
LANDED_FIELD = "writtenAtMs"


def outcome(write: Write) -> dict[str, Any]:
    record = write.record.model_dump(mode="json", by_alias=True)
    return {"reason": write.reason} | {key: value for key, value in record.items() if key not in CLOCK_FIELDS}


def whole(reason: object, record: object) -> tuple[Any, ...]:
    """A write as the live-against-replay check holds it: its reason, then the whole record (every
    field but when it landed), as one canonical JSON text."""
    assert isinstance(record, dict), record
    fields = {key: value for key, value in record.items() if key != LANDED_FIELD}
    return (reason, json.dumps(fields, sort_keys=True))


def logged(write: Write) -> tuple[Any, ...]:
    """A replayed write as `whole` holds it (the record as the sidecar's `write` log line states it)."""
    return whole(write.reason, write.record.model_dump(mode="json", by_alias=True))


def lived(event: dict[str, Any]) -> tuple[Any, ...]:
    """A live write, from the sidecar's `write` log line (its `record`), as `whole` holds it."""
    return whole(event.get("reason"), event.get("record"))


def assert_lived_as_replayed(lived: list[tuple[Any, ...]], replayed: list[tuple[Any, ...]], coalesced: int) -> None:
    """The writes a live sidecar logged are those its recording replays to. On a loaded machine a
    write in flight past STALLED_WRITE_S made the live outbox fold each newer write into the one
    waiting (the sidecar's exit line counts them, `coalesced`); the recording says when each write
    was taken, found late and landed, so the replay folds the same ones. Where the sidecar folded
    any, the check allows the live writes to be the replayed ones with at most that many folded
    away: in order, each with a replayed write's numbers (its reason may be the folded one's), and
    the last one the same."""
    if not coalesced:
        assert replayed == lived, {"lived": lived, "replayed": replayed}
        return
    numbers = [write[1:] for write in replayed]
    at = 0
    for write in lived:
        try:
            at = numbers.index(write[1:], at) + 1
        except ValueError:
            raise AssertionError((write, "not among the replayed writes after", at)) from None
    assert lived and replayed and lived[-1][1:] == numbers[-1]
    # None missing: the replay folded them too.
    assert 0 <= len(replayed) - len(lived) <= coalesced, (len(replayed), len(lived), coalesced)


# Where the live tests keep the recordings `hctx wrap --record` made of real sessions (one folder
# per harness, `HCTX_KEEP_RECORDINGS`, tests/wrapping.py): not conversions of the lab's captures.
WRAPPED = "wrapped"


def converted_recordings() -> list[Path]:
    """Every recording under fixtures/recordings/ converted from the lab's captures (the wrapped
    sessions' recordings aside: tests/test_wrapped_recordings.py holds those)."""
    return [path for path in sorted(RECORDINGS.rglob("*.rec")) if WRAPPED not in path.relative_to(RECORDINGS).parts]


def recording_path(name: str) -> Path:
    """A converted fixture by its path under fixtures/recordings/ (`claude/session-2.1.332.rec`)."""
    path = RECORDINGS / name
    assert path.is_file(), f"no recording {name}: run scripts/convert_fixtures.py"
    return path


def recording_of(capture: Path) -> Path:
    """The recording one capture under fixtures/ was converted into (scripts/convert_fixtures.py)."""
    name = capture.relative_to(FIXTURE_ROOT).as_posix()
    for suffix in (".jsonl", ".sse", ".json"):
        name = name.removesuffix(suffix)
    return recording_path(f"{name}.rec")


def chunks_of(name: str | Path) -> list[Chunk]:
    """The chunks a recording holds (a name under fixtures/recordings/, or a path)."""
    path = name if isinstance(name, Path) else recording_path(name)
    return read_chunks(path.read_bytes())


def fixture_writes(harness: str, name: str) -> list[Write]:
    """The writes a converted fixture replays to, through the product's driver."""
    writes, summary = replay_recording(spec_for(harness), recording_path(name))
    assert not summary.problems, summary.problems
    return writes


def recorded(harness: str, chunks: Iterable[Chunk]) -> bytes:
    """`chunks` as a recording of `harness`: a chunk with no time a second after the one before,
    each wire one stream unless a chunk names its own, every stream ended after the last chunk."""
    lines: list[bytes] = []
    clock = 0
    streams: dict[tuple[str, int | None], int] = {}
    for chunk in chunks:
        clock = clock + UNTIMED_STEP_MS if chunk.at_ms is None else max(clock, chunk.at_ms)
        stream = streams.setdefault((chunk.wire, chunk.stream), chunk.stream or len(streams) + 1)
        lines.append(encode_line((clock, chunk.wire, stream, chunk.data)))
    ends = [encode_line({"at_ms": clock, "wire": wire, "stream": stream, "end": True})
            for (wire, _), stream in streams.items()]  # fmt: skip
    header = {"format": FORMAT, "harness": harness, "hctx": guard.__version__, "incarnation": "replay", "started_ms": 0}
    return encode_line(header) + b"".join(lines + ends)


def replayed(spec: HarnessSpec, chunks: Iterable[Chunk]) -> list[Write]:
    """The writes `chunks` make, as a recording, through the product's driver."""
    return replay_bytes(spec, recorded(spec.name, chunks))[0]


async def replayed_in_a_thread(spec: HarnessSpec, chunks: Iterable[Chunk]) -> list[Write]:
    """`replayed` from a trio test: the replay runs trio (on its MockClock) in a thread of its own."""
    import trio

    chunks = list(chunks)
    return await trio.to_thread.run_sync(replayed, spec, chunks)


def untimed(chunks: Iterable[Chunk]) -> list[Chunk]:
    """The same bytes on a clock of their own: a second per chunk, wherever they break."""
    return [Chunk(None, chunk.wire, chunk.data, chunk.stream) for chunk in chunks]


def _every_chunk(chunk: Chunk) -> bool:
    return True


def split_at(
    chunks: Sequence[Chunk], cuts: Iterable[int], cuttable: Callable[[Chunk], bool] = _every_chunk
) -> list[Chunk]:
    """Each chunk cut at every offset in `cuts` that falls inside it (offsets into the whole); a chunk
    `cuttable` refuses (a message its transport frames) stays whole."""
    offsets = sorted(set(cuts))
    pieces: list[Chunk] = []
    start = 0
    for chunk in chunks:
        end = start + len(chunk.data)
        inside = (
            offsets[bisect.bisect_right(offsets, start) : bisect.bisect_left(offsets, end)] if cuttable(chunk) else []
        )
        edges = [0, *(cut - start for cut in inside), len(chunk.data)]
        pieces += [Chunk(chunk.at_ms, chunk.wire, chunk.data[a:b], chunk.stream) for a, b in itertools.pairwise(edges)]
        start = end
    return pieces


def bytewise(chunks: Sequence[Chunk], cuttable: Callable[[Chunk], bool] = _every_chunk) -> list[Chunk]:
    """Every byte its own chunk: a split at every boundary at once."""
    return split_at(chunks, range(sum(len(chunk.data) for chunk in chunks)), cuttable)


def joined(chunks: Sequence[Chunk]) -> list[Chunk]:
    """Consecutive chunks of one stream and one time as one: the recording fed whole."""
    whole: list[Chunk] = []
    for chunk in chunks:
        if whole and (whole[-1].wire, whole[-1].stream, whole[-1].at_ms) == (chunk.wire, chunk.stream, chunk.at_ms):
            whole[-1] = Chunk(chunk.at_ms, chunk.wire, whole[-1].data + chunk.data, chunk.stream)
        else:
            whole.append(chunk)
    return whole
