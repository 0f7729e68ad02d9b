"""Conformance helpers: the writes a recording makes, whole, split, or lived through a transport.

`replayed` runs chunks through the registry's spec exactly as `hctx replay` does; `outcome`
reduces a write to what must agree on every path (the reason and the record's reading fields, not
the clock it was taken by). `split_at` cuts every chunk of a recording at the given byte offsets, so
a test can prove that where the bytes break never changes what is written.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from guard.policy import Write
from sidecar.registry import Chunk, HarnessSpec
from sidecar.replay import replay

# The fields that depend on when, not what: the replay clock and the live one differ.
CLOCK_FIELDS = frozenset({"observedAtMs", "writtenAtMs", "lastCompactionMs", "incarnation", "agent"})
# What a sidecar's `write` log line carries of each write: all a live run can be compared on (the
# compaction point too: the web board plots it from the log).
LOGGED_FIELDS = ("reason", "usedTokens", "windowTokens", "usedPercent", "compactions", "compactAtTokens")


def outcome(write: Write) -> dict[str, Any]:
    record = write.record.model_dump(mode="json", by_alias=True)
    return {"reason": write.reason} | {key: value for key, value in record.items() if key not in CLOCK_FIELDS}


def logged(write: Write) -> tuple[Any, ...]:
    """The write as the sidecar's log line states it."""
    return tuple(outcome(write).get(key) for key in LOGGED_FIELDS)


def replayed(spec: HarnessSpec, chunks: Iterable[Chunk]) -> list[Write]:
    return list(replay(spec, chunks))


def untimed(chunks: Iterable[Chunk]) -> list[Chunk]:
    """The same bytes on a clock of their own: one replay-second per event, wherever they break."""
    return [Chunk(None, chunk.wire, chunk.data) for chunk in chunks]


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
        pieces += [Chunk(chunk.at_ms, chunk.wire, chunk.data[a:b]) for a, b in itertools.pairwise(edges)]
        start = end
    return pieces


def bytewise(chunks: Sequence[Chunk], cuttable: Callable[[Chunk], bool] = _every_chunk) -> list[Chunk]:
    """Every byte its own chunk: a split at every boundary at once."""
    return split_at(chunks, range(sum(len(chunk.data) for chunk in chunks)), cuttable)


def joined(chunks: Sequence[Chunk]) -> list[Chunk]:
    """Consecutive chunks of one wire and one time as one: the recording fed whole."""
    whole: list[Chunk] = []
    for chunk in chunks:
        if whole and (whole[-1].wire, whole[-1].at_ms) == (chunk.wire, chunk.at_ms):
            whole[-1] = Chunk(chunk.at_ms, chunk.wire, whole[-1].data + chunk.data)
        else:
            whole.append(chunk)
    return whole
