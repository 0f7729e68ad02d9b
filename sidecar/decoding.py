"""Decoders, sans-I/O in the manner of h11: bytes in, typed events out, one per harness wire.

A decoder owns the framing of its wire (`sidecar.framing`) and the one JSON rule (`guard.json_rule`),
and turns each whole frame into the harness's typed events through the harness's own `parse`
function. Transports only move bytes into `receive_data`; `hctx replay` moves a recording's bytes
into the very same decoder, so a capture replayed is the session lived. What a decoder cannot turn
into an event becomes a `Dropped` event: the pipeline logs and counts it, the producer never sees it.

Three framings cover the harnesses:

- `LineDecoder`: JSONL streams (the unix-socket channel, Codex's stdout, Codex's rollout file);
- `MessageDecoder`: a wire whose transport already frames messages (Codex's websocket): each
  `receive_data` call is one whole message;
- `SseDecoder`: a `text/event-stream` body (OpenCode's `/event`).

The channel carries envelopes, `{"type": ..., ...}` objects, from several processes of one harness;
`channel_parse` checks the envelope (the sidecar's own `hctx.` types are refused there, except a
tap's drop report) and hands the object to the harness's `on_frame`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from guard.constants import CHANNEL_DROP_REPORT, CHANNEL_MAX_FRAME_BYTES, OWN_FRAME_PREFIX
from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads_object
from sidecar.framing import Line, LineFramer, Oversized, SseFramer

__all__ = [
    "CHANNEL",
    "PROVIDERS",
    "ChannelFrames",
    "Decoder",
    "Dropped",
    "LineByLine",
    "LineDecoder",
    "MessageDecoder",
    "Parse",
    "SseDecoder",
    "channel_decoder",
    "channel_parse",
]

_MAX_REPORTED_DROPS = 2**31


@dataclass(frozen=True, slots=True)
class Dropped:
    """Input that became no event: why, where (the log's `where`), and how many frames it stands
    for (a tap's report counts the lines it could not deliver)."""

    reason: str
    where: str = "decoder"
    count: int = 1


class Decoder(Protocol):
    """One wire's decoder; a new one per stream (a connection, a file, a recording)."""

    def receive_data(self, data: bytes) -> list[object]:
        """The events the bytes complete, oldest first; an incomplete frame waits for more."""
        ...

    def end_of_data(self) -> list[object]:
        """The stream ended: what its unfinished tail amounts to (a drop, for a cut frame)."""
        ...


# A whole frame's bytes to the harness's events; raises FrameRejected (the drop's reason) for a
# frame it refuses. Never raises anything else, never invents a number the bytes did not carry.
Parse = Callable[[bytes], list[object]]


def _parsed(parse: Parse, frame: bytes, where: str) -> list[object]:
    if not frame.strip():
        return []
    try:
        return parse(frame)
    except FrameRejected as exc:
        return [Dropped(str(exc), where)]


class LineByLine(ABC):
    """A JSONL decoder that reads each line its `framer` completes (whole, or the head of one over
    the limit) with its own `_line`; what the stream's cut tail means is each wire's own."""

    framer: LineFramer

    def receive_data(self, data: bytes) -> list[object]:
        events: list[object] = []
        for line in self.framer.receive_data(data):
            events += self._line(line)
        return events

    @abstractmethod
    def _line(self, line: Line | Oversized) -> list[object]: ...

    @abstractmethod
    def end_of_data(self) -> list[object]: ...


class LineDecoder(LineByLine):
    def __init__(self, parse: Parse, *, where: str, max_bytes: int = CHANNEL_MAX_FRAME_BYTES) -> None:
        self.framer = LineFramer(max_bytes)
        self._parse = parse
        self._where = where

    def _line(self, line: Line | Oversized) -> list[object]:
        if isinstance(line, Oversized):
            return [Dropped(f"frame over {line.limit} bytes", self._where)]
        return _parsed(self._parse, line.data, self._where)

    def end_of_data(self) -> list[object]:
        tail = self.framer.end_of_data()
        if isinstance(tail, Oversized):
            return self._line(tail)
        if tail is None or not tail.data.strip():
            return []
        return [Dropped(f"truncated frame ({len(tail.data)} bytes without a newline)", self._where)]


class MessageDecoder:
    def __init__(self, parse: Parse, *, where: str, max_bytes: int = CHANNEL_MAX_FRAME_BYTES) -> None:
        self._parse = parse
        self._where = where
        self._max_bytes = max_bytes

    def receive_data(self, data: bytes) -> list[object]:
        if len(data) > self._max_bytes:
            return [Dropped(f"message over {self._max_bytes} bytes", self._where)]
        return _parsed(self._parse, data, self._where)

    def end_of_data(self) -> list[object]:
        return []


class SseDecoder:
    def __init__(self, parse: Parse, *, where: str, max_bytes: int) -> None:
        self.framer = SseFramer(max_bytes)
        self._parse = parse
        self._where = where

    def receive_data(self, data: bytes) -> list[object]:
        return self._events(self.framer.receive_data(data))

    def end_of_data(self) -> list[object]:
        return self._events(self.framer.end_of_data())

    def _events(self, payloads: list[bytes | Oversized]) -> list[object]:
        events: list[object] = []
        for payload in payloads:
            if isinstance(payload, Oversized):
                events.append(Dropped(f"event over {payload.limit} bytes", self._where))
            else:
                events += _parsed(self._parse, payload, self._where)
        return events


# The harness's frames on the channel: (envelope `type`, the whole object) -> typed events.
ChannelFrames = Callable[[str, dict[str, Any]], list[object]]
CHANNEL = "channel"
# A wire carrying a model catalog's context windows (OpenCode's `GET /config/providers` answer).
PROVIDERS = "providers"


def channel_decoder(on_frame: ChannelFrames) -> LineDecoder:
    """The unix-socket channel's decoder for one connection (or one recording of it)."""
    return LineDecoder(channel_parse(on_frame), where=CHANNEL)


def channel_parse(on_frame: ChannelFrames) -> Parse:
    """The channel's envelope around a harness's frames: an object with a string `type`."""

    def parse(data: bytes) -> list[object]:
        frame = loads_object(data, error=MalformedFrame)
        kind = frame.get("type")
        if not isinstance(kind, str):
            raise FrameRejected("no string 'type'")
        if kind == CHANNEL_DROP_REPORT:
            return [_drop_report(frame)]
        if kind.startswith(OWN_FRAME_PREFIX):
            raise FrameRejected(f"frame type {kind[:40]!r} is the sidecar's own: only its transport supplies it")
        return on_frame(kind, frame)

    return parse


def _drop_report(frame: dict[str, Any]) -> Dropped:
    """A tap's count of lines it could not deliver (its queue overflowed): counted where it says."""
    count, where = frame.get("count"), frame.get("where")
    if type(count) is not int or not 0 < count <= _MAX_REPORTED_DROPS or not isinstance(where, str):
        raise FrameRejected("malformed drop report")
    return Dropped(f"{count} lines not tapped: the tap's queue was full", where[:64], count)
