"""pi's and omp's captures (channel frames a test recorder stamped `atMs`, and the lab's probe
captures, translated into the frame the shipped asset sends): moved out of the product by issue
30, run once by convert_fixtures."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from guard.errors import FrameRejected, MalformedFrame
from guard.json_rule import loads_object
from sidecar.decoding import CHANNEL
from sidecar.producer import instant_ms
from sidecar.recorder import Chunk
from sidecar.spec import recording_bytes

# The events the shipped asset emits on; `session_compact` also carries the edge.
EMITTING_EVENTS = frozenset(
    {"session_start", "message_end", "turn_end", "agent_end", "agent_settled", "session_stop", "session_compact"}
)


def read_recording(paths: Sequence[Path]) -> Iterator[Chunk]:
    """A pi/omp recording as the channel bytes the shipped asset sent, one JSON object a line, in
    either of two shapes.

    - channel frames as the asset sends them, optionally stamped `atMs` by whoever recorded them
      (tests/fakes/pi_channel.py): each line is those bytes, timed by its stamp; a line that is no
      frame at all goes to the decoder like any the channel carried, which drops it;
    - the lab's probe capture (`lab-capture.ts`: one line per harness event with the raw
      `contextUsage`, `model`, `entries` and `payload`): each line is turned into the frame the
      shipped asset sends for the same event and ctx, stamped with the line's `t`. That is a format
      conversion (the asset is TypeScript): the frame is serialised here with `json.dumps`, compact
      as `JSON.stringify` writes it. That is how the producer is tested on the verbatim captures of
      the real builds.
    """
    for path in paths:
        yield from recorded_chunks(recording_bytes(path))


def recorded_chunks(data: bytes) -> Iterator[Chunk]:
    """One recording file's bytes as `read_recording` reads them."""
    probe = _ProbeTranslator()
    lines = data.split(b"\n")
    for index, line in enumerate(lines):
        sent = line if index == len(lines) - 1 else line + b"\n"  # a cut tail stays cut
        try:
            item = loads_object(line, error=MalformedFrame) if line.strip() else None
        except FrameRejected:
            item = None
        if item is not None and "event" in item and "type" not in item:
            translated = probe.frame(item)
            if translated is not None:
                at_ms, frame = translated
                yield Chunk(at_ms, CHANNEL, _as_sent(frame))
        elif sent:
            at_ms = item.get("atMs") if item is not None else None
            yield Chunk(at_ms if _is_millis(at_ms) else None, CHANNEL, sent)


def _as_sent(frame: dict[str, Any]) -> bytes:
    """The line `JSON.stringify(frame)` and a newline make: compact, non-ASCII as itself."""
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _is_millis(value: object) -> bool:
    return type(value) is int and value >= 0


class _ProbeTranslator:
    """The asset's own bookkeeping (cost hold, omp's pending reason) replayed over probe lines."""

    def __init__(self) -> None:
        self.cost_usd: float | None = None
        self.pending_reason: str | None = None

    def frame(self, line: dict[str, Any]) -> tuple[int | None, dict[str, Any]] | None:
        event = _string(line.get("event"))
        payload = _object(line.get("payload"))
        entries = _object(line.get("entries"))
        if event == "auto_compaction_start":
            self.pending_reason = _string(payload.get("reason"))
        elif event == "auto_compaction_end":
            self.pending_reason = None
        if event not in EMITTING_EVENTS:
            return None
        if event == "session_start":
            last_assistant = _object(entries.get("lastAssistant"))
            self.cost_usd = _number(_object(last_assistant.get("usage")).get("costTotal"))
        message = _object(payload.get("message"))
        if event == "message_end" and message.get("role") == "assistant":
            cost = _number(_object(message.get("usage")).get("costTotal"))
            if cost is not None:
                self.cost_usd = cost
        count = entries.get("compactionCount") if _is_millis(entries.get("compactionCount")) else None
        compaction = None
        if event == "session_compact":
            compaction = {"reason": _string(payload.get("reason")) or self.pending_reason, "count": count}
            self.pending_reason = None
        frame: dict[str, Any] = {
            "type": "context",
            "event": event,
            "reading": self._reading(line),
            "compaction": compaction,
            "compactions": count,
        }
        return instant_ms(line.get("t")), frame

    def _reading(self, line: dict[str, Any]) -> dict[str, Any] | None:
        usage = line.get("contextUsage")
        if not isinstance(usage, dict) or "error" in usage:
            return None
        return {
            "tokens": usage.get("tokens"),
            "contextWindow": usage.get("contextWindow"),
            "percent": usage.get("percent"),
            "model": _string(_object(line.get("model")).get("id")),
            "costUsd": self.cost_usd,
        }


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None
