"""Sans-I/O reading of the harnesses' own transcripts, line by line: the part every harness shares.

Nothing here opens a file: a caller hands in `read_at(offset, size) -> bytes` and the file's size,
and `BackwardLines` walks lines from the END in fixed blocks within a byte budget, so a 1 GB
transcript costs what its last few megabytes cost. What a line means is the harness's own
transcript module (`sidecar.harnesses.claude.transcript`, `sidecar.harnesses.codex.transcript`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

from pydantic import Field

from guard.errors import JsonRefused
from guard.json_rule import loads_object

__all__ = [
    "BLOCK_BYTES",
    "HEAD_BYTES",
    "MAX_LINE_BYTES",
    "TAIL_BUDGET_BYTES",
    "BackwardLines",
    "ModelId",
    "Percent",
    "ReadAt",
    "Tokens",
    "forward_lines",
    "json_object",
]

ReadAt = Callable[[int, int], bytes]

BLOCK_BYTES: Final = 64 * 1024
# A line longer than this is skipped unparsed: the lines these readers want (an assistant message's
# usage, a token_count event, a compact_boundary) are kilobytes, while a tool result can be anything.
MAX_LINE_BYTES: Final = 4 * 1024 * 1024
# How far from the end a tail read looks. Beyond it a reading is not found and a count is unknown.
TAIL_BUDGET_BYTES: Final = 32 * 1024 * 1024

_I64_MAX: Final = 2**63 - 1
Tokens = Annotated[int, Field(ge=0, le=_I64_MAX, strict=True)]
Percent = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
_MAX_MODEL_ID: Final = 256
ModelId = Annotated[str, Field(min_length=1, max_length=_MAX_MODEL_ID, strict=True)]


# ---------------------------------------------------------------------------------------------
# Lines, newest first, within a budget


# Of a line too long to parse, this much of its beginning is kept: enough to see what kind it was.
HEAD_BYTES: Final = 1024


@dataclass
class BackwardLines:
    """Complete lines of a file from its end: `(offset of the line's first byte, line)`, newest first.

    A final line without its newline is still yielded (the reader decides whether it parses: a
    writer mid-line gives a truncated one). Lines longer than `max_line` are not yielded and never
    held whole: only their first HEAD_BYTES land in `skipped_heads`, so a reader that counts can
    still recognise a line of its kind by its prefix. Reading stops after `budget` bytes;
    `reached_start` then says whether the whole file was covered, which makes a count over it exact.
    """

    read_at: ReadAt
    size: int
    budget: int = TAIL_BUDGET_BYTES
    block: int = BLOCK_BYTES
    max_line: int = MAX_LINE_BYTES
    bytes_read: int = field(default=0, init=False)
    reached_start: bool = field(default=False, init=False)
    skipped_heads: list[tuple[int, bytes]] = field(default_factory=list, init=False)
    # Set by a reader mid-iteration once only lines holding one of these byte strings can matter to
    # it: whole blocks without any are then passed over without being split into lines.
    only_containing: tuple[bytes, ...] | None = field(default=None, init=False)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        position = max(self.size, 0)
        later: list[bytes] = []  # pieces of the line being assembled, newest piece first
        later_bytes = 0
        head = b""  # the first HEAD_BYTES of what has been assembled so far
        oversized = False
        while position > 0:
            if self.bytes_read >= self.budget:
                return
            size = min(self.block, position, self.budget - self.bytes_read)
            chunk = self.read_at(position - size, size)
            if len(chunk) != size:
                return  # the file shrank under us: what is left is not the file we sized
            position -= size
            self.bytes_read += size
            end = len(chunk)
            newline = chunk.rfind(b"\n", 0, end)
            wanted = self.only_containing
            while newline >= 0:
                start = newline + 1
                if not oversized and later_bytes + (end - start) <= self.max_line:
                    line = chunk[start:end] + b"".join(reversed(later)) if later else chunk[start:end]
                    if line.strip():
                        yield position + start, line
                else:
                    self.skipped_heads.append((position + start, _head(chunk[start:end], head)))
                later, later_bytes, head, oversized = [], 0, b"", False
                end = newline
                if wanted is not None:
                    # Only lines holding a wanted marker matter: those wholly inside this block are
                    # found by the markers themselves, the rest of the block is never split.
                    first = chunk.find(b"\n", 0, end + 1)
                    for start, stop in _lines_with(chunk, first + 1, end, wanted):
                        if stop - start <= self.max_line:
                            yield position + start, chunk[start:stop]
                        else:
                            self.skipped_heads.append((position + start, chunk[start : start + HEAD_BYTES]))
                    end = first
                    break
                newline = chunk.rfind(b"\n", 0, end)
            head = _head(chunk[:end], head)
            if not oversized:
                later.append(chunk[:end])
                later_bytes += end
                if later_bytes > self.max_line:
                    later, later_bytes, oversized = [], 0, True
        self.reached_start = True
        if oversized:
            self.skipped_heads.append((0, head))
        elif later_bytes:
            line = b"".join(reversed(later))
            if line.strip():
                yield 0, line


def _lines_with(chunk: bytes, low: int, high: int, markers: tuple[bytes, ...]) -> list[tuple[int, int]]:
    """(start, stop) of the lines within chunk[low:high] (whole lines) holding a marker, newest first."""
    found: set[tuple[int, int]] = set()
    for marker in markers:
        at = chunk.find(marker, low, high)
        while at >= 0:
            start = chunk.rfind(b"\n", low, at) + 1 or low
            stop = chunk.find(b"\n", at, high)
            stop = high if stop < 0 else stop
            found.add((max(start, low), stop))
            at = chunk.find(marker, stop, high)
    return sorted(found, reverse=True)


def _head(earlier: bytes, head: bytes) -> bytes:
    """The first HEAD_BYTES of `earlier + head` without copying more than that."""
    if len(earlier) >= HEAD_BYTES:
        return earlier[:HEAD_BYTES]
    return earlier + head[: HEAD_BYTES - len(earlier)]


def forward_lines(data: bytes, max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """`(offset, line)` of every non-blank line in `data`, oldest first, oversized ones skipped."""
    start = 0
    while start < len(data):
        newline = data.find(b"\n", start)
        end = len(data) if newline < 0 else newline
        if end - start <= max_line and data[start:end].strip():
            yield start, data[start:end]
        start = end + 1


def json_object(line: bytes) -> dict[str, Any] | None:
    """The JSON object a transcript line holds under the one rule; None for any other line."""
    try:
        return loads_object(line)
    except JsonRefused:
        return None
