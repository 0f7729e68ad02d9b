"""Codex's lab captures (app-server stdout lines, `.timed.jsonl` both ways, rollout files) as the
bytes each wire carried: moved out of the product by issue 30, run once by convert_fixtures."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads, loads_object
from sidecar.harnesses.codex.producer import ROLLOUT, STDOUT
from sidecar.producer import instant_ms
from sidecar.recorder import Chunk
from sidecar.spec import recording_bytes


def read_recording(paths: Sequence[Path]) -> Iterable[Chunk]:
    """The bytes each recording's wire carried, with Codex's own clock.

    - `<name>.jsonl` (the lab's verbatim inbound messages, one a line): the `stdout` wire, each line
      at its `emittedAtMs`; a response carries none and keeps the previous line's time, so it neither
      rewinds the clock nor pushes it ahead of Codex's.
    - `<name>.timed.jsonl` (`{"t": seconds, "dir": "in"|"out", "frame": message}`): each inbound
      message as the stdout line it was, at its `emittedAtMs` (the first `t` until one comes); the
      client's own requests are not the server's stream.
    - a rollout file (`{"timestamp", "type": "session_meta"|"event_msg"|..., "payload"}` lines): the
      `rollout` wire, each line at its own timestamp.
    """
    for path in paths:
        data = recording_bytes(path)
        if _is_rollout(data):
            yield from _rollout_chunks(data)
        else:
            yield from _stdout_chunks(data)


def _lines(data: bytes) -> Iterator[bytes]:
    return (line for line in data.split(b"\n") if line.strip())


def _stdout_chunks(data: bytes) -> Iterator[Chunk]:
    clock: int | None = None
    for line in _lines(data):
        try:
            message: Any = loads(line, error=MalformedFrame)
        except FrameRejected:
            yield Chunk(clock, STDOUT, line + b"\n")  # as it was: its decoder drops it
            continue
        if _is_timed_line(message):
            if message["dir"] != "in":
                continue  # the client's own requests: the server→client stream only
            if clock is None:
                clock = _seconds_to_ms(message["t"])
            message = message["frame"]
            line = json.dumps(message, separators=(",", ":")).encode()
        if isinstance(message, dict) and _is_millis(emitted := message.get("emittedAtMs")):
            clock = emitted
        yield Chunk(clock, STDOUT, line + b"\n")


_ROLLOUT_TYPES: Final = frozenset({"session_meta", "event_msg", "response_item", "turn_context", "compacted"})


def _is_rollout(data: bytes) -> bool:
    first = next(_lines(data), None)
    try:
        head = loads_object(first, error=MalformedFrame) if first is not None else None
    except FrameRejected:
        return False
    return head is not None and "timestamp" in head and head.get("type") in _ROLLOUT_TYPES


def _rollout_chunks(data: bytes) -> Iterator[Chunk]:
    clock: int | None = None
    for line in _lines(data):
        try:
            stamp = instant_ms(loads_object(line, error=MalformedFrame).get("timestamp"))
        except FrameRejected:
            stamp = None  # its decoder says what it is
        clock = clock if stamp is None else stamp
        yield Chunk(clock, ROLLOUT, line + b"\n")


def _is_timed_line(message: Any) -> bool:
    return isinstance(message, dict) and set(message) == {"t", "dir", "frame"}


def _seconds_to_ms(value: Any) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return int(value * 1000)
    return None


def _is_millis(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
