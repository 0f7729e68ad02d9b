"""Framing shared by every wire, sans-I/O: bytes in, whole frames out.

`LineFramer` splits a byte stream at newlines (JSONL: the channel, the Codex stdio tap and rollout,
recordings); `SseFramer` turns a `text/event-stream` body into the `data:` payload of each event.
Both keep at most `max_bytes` of a partial frame: one that outgrows it is skipped to its end and
reported as `Oversized`, never buffered without bound. Neither reads, writes, logs nor sleeps, so
the transports that move the bytes and `hctx replay` frame them the same way, split anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "Line",
    "LineFramer",
    "Oversized",
    "SseFramer",
    "tap_frame",
]


def tap_frame(line: bytes, frame_type: str) -> bytes:
    """The channel frame (no newline) a stdout tap sends for one stdout line: the line's very bytes
    as the string `payload`. A byte that is not UTF-8 travels as its surrogate escape (`\\udc80`),
    so the channel decoder parses the bytes stdout carried. Here, with the framers, because the
    wrapper's resident part (the standard library only) builds it."""
    text = json.dumps(line.decode("utf-8", "surrogateescape"), ensure_ascii=False)
    kind = json.dumps(frame_type).encode()
    return b'{"type":' + kind + b',"payload":' + text.encode("utf-8", "backslashreplace") + b"}"


@dataclass(frozen=True, slots=True)
class Line:
    """One whole frame, its newline removed, and the stream offset of its first byte."""

    data: bytes
    start: int


@dataclass(frozen=True, slots=True)
class Oversized:
    """A frame over the limit was skipped whole; the stream goes on after it. `head` keeps its
    first bytes, as many as the framer was asked to keep (a frame's kind is often all in them)."""

    limit: int
    start: int = 0
    head: bytes = b""


class LineFramer:
    """Newline-terminated frames, the newline removed. A final line without its newline is only
    complete when the stream ends (`end_of_data`): it may be a frame cut short. `offset` is where
    the stream starts (a file followed from the middle); `head_bytes`, how much of an oversized
    frame to keep for its `Oversized`, reported when the frame ends."""

    def __init__(self, max_bytes: int, *, offset: int = 0, head_bytes: int = 0) -> None:
        self.max_bytes = max_bytes
        self.head_bytes = head_bytes
        self.offset = offset  # of the next byte fed
        self.completed = 0  # frames ended so far, skipped and blank ones included
        self._partial = bytearray()
        self._start = offset  # of the frame in progress
        self._skipping = False  # inside a frame given up: discard to its newline
        self._skipped: Oversized | None = None  # what to report of it then (None: nothing)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the partial frame held."""
        return 0 if self._skipping else len(self._partial)

    @property
    def held_bytes(self) -> int:
        """All this framer holds: the partial frame, or the head kept of one being skipped."""
        return self.pending_bytes + (0 if self._skipped is None else len(self._skipped.head))

    @property
    def mid_frame(self) -> bool:
        """A frame has begun and not ended (held or being skipped)."""
        return bool(self._partial) or self._skipping

    def discard_partial(self) -> None:
        """Give up the frame in progress (a budget or a deadline ran out: the caller says why),
        skipping to its newline."""
        self._skip(None)

    def receive_data(self, data: bytes) -> list[Line | Oversized]:
        frames: list[Line | Oversized] = []
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if not self._skipping and len(self._partial) + end - start > self.max_bytes:
                self._skip_oversized(data[start:end])
            if self._skipping:
                if self._skipped is not None:
                    frames.append(self._skipped)
                self._skipping, self._skipped = False, None
            else:
                self._partial += data[start:end]
                frames.append(Line(bytes(self._partial), self._start))
            self._partial.clear()
            self.completed += 1
            start = end + 1
            self._start = self.offset + start
        if not self._skipping:
            if len(self._partial) + len(data) - start > self.max_bytes:
                self._skip_oversized(data[start:])
            else:
                self._partial += data[start:]
        self.offset += len(data)
        return frames

    def end_of_data(self) -> Line | Oversized | None:
        """The unterminated tail the stream ended with, if any (a frame cut short, or the report of
        an oversized one); the framer is then empty."""
        tail: Line | Oversized | None = self._skipped
        if not self._skipping and self._partial:
            tail = Line(bytes(self._partial), self._start)
        self._partial.clear()
        self._skipping, self._skipped = False, None
        self._start = self.offset
        return tail

    def _skip_oversized(self, more: bytes) -> None:
        head = (bytes(self._partial) + more[: self.head_bytes])[: self.head_bytes]
        self._skip(Oversized(self.max_bytes, self._start, head))

    def _skip(self, report: Oversized | None) -> None:
        self._partial.clear()
        self._skipping, self._skipped = True, report


class SseFramer:
    """Server-sent events (`text/event-stream`): the `data:` payload of each event as it ends.

    Lines end in LF or CRLF; a comment (`:`) and fields other than `data` are ignored (OpenCode
    sends neither `event:` nor `id:`). An event is over `max_bytes` as a whole, not line by line.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lines = LineFramer(max_bytes)
        self._data: list[bytes] = []
        self._size = 0
        self._oversized = False

    @property
    def pending_bytes(self) -> int:
        return self._lines.pending_bytes + self._size

    def receive_data(self, data: bytes) -> list[bytes | Oversized]:
        events: list[bytes | Oversized] = []
        for line in self._lines.receive_data(data):
            self._take(line, events)
        return events

    def end_of_data(self) -> list[bytes | Oversized]:
        """The event the stream ended inside, if it carried data: the server closed mid-event."""
        events: list[bytes | Oversized] = []
        tail = self._lines.end_of_data()
        if tail is not None:
            self._take(tail, events)
        event = self._finish()
        if event is not None:
            events.append(event)
        return events

    def _take(self, line: Line | Oversized, events: list[bytes | Oversized]) -> None:
        if isinstance(line, Oversized):
            self._oversize(events)
            return
        event = self._line(line.data.removesuffix(b"\r"), events)
        if event is not None:
            events.append(event)

    def _line(self, line: bytes, events: list[bytes | Oversized]) -> bytes | None:
        if not line:
            return self._finish()
        if line.startswith(b":"):
            return None
        name, _, value = line.partition(b":")
        if name != b"data" or self._oversized:
            return None
        value = value.removeprefix(b" ")
        self._size += len(value) + 1
        if self._size > self.max_bytes:
            self._oversize(events)
        else:
            self._data.append(value)
        return None

    def _oversize(self, events: list[bytes | Oversized]) -> None:
        if not self._oversized:
            events.append(Oversized(self.max_bytes))
        self._oversized, self._data, self._size = True, [], 0

    def _finish(self) -> bytes | None:
        payload = b"\n".join(self._data) if self._data and not self._oversized else None
        self._data, self._size, self._oversized = [], 0, False
        return payload
