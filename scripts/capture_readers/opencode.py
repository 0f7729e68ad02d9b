"""OpenCode's lab captures (the `/config` and `/config/providers` answers, the lab's `events.jsonl`,
SSE text, JSONL of events) as the bytes each wire carried: moved out of the product by issue 30,
run once by convert_fixtures."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from guard.errors import MalformedFrame
from guard.json_rule import loads
from sidecar.harnesses.opencode.producer import CONFIG_SCHEMA_PREFIX, CONFIG_WIRE, PROVIDERS_WIRE, SSE_WIRE, sse_event
from sidecar.recorder import Chunk
from sidecar.spec import recording_bytes


def read_recording(paths: Sequence[Path]) -> Iterator[Chunk]:
    """Every recording shape the lab and the transport produce, as the bytes of the wire it is:

    - a `GET /config/providers` answer (one JSON object with `providers`): the `providers` wire;
    - a `GET /config` answer (one JSON object naming OpenCode's config `$schema`): the `config` wire;
    - raw SSE text (`data:` lines, blank-line separated): the `sse` wire as it is, untimed;
    - the lab's `events.jsonl` (`{"seq","t","stream","event","id","raw"}` per line): the `/event`
      stream's only (`stream == "event"`), each `raw` as the SSE event it came in, `t` (s) its time;
    - plain JSONL of event objects: each line as an SSE event, untimed (a JSONL line holding a
      providers answer, without a `type`, is one on the `providers` wire).

    A line that is none of these goes on as an SSE event of its own, for the decoder to drop.
    """
    for path in paths:
        yield from recording_chunks(recording_bytes(path))


def recording_chunks(data: bytes) -> Iterator[Chunk]:
    """One recording file's bytes as `read_recording` reads them (for a test holding the bytes)."""
    whole = _json_or_none(data) if data.lstrip().startswith(b"{") else None
    if isinstance(whole, dict) and "providers" in whole:
        yield Chunk(None, PROVIDERS_WIRE, data)
        return
    if isinstance(whole, dict) and str(whole.get("$schema", "")).startswith(CONFIG_SCHEMA_PREFIX):
        yield Chunk(None, CONFIG_WIRE, data)
        return
    lines = data.splitlines()
    if any(line.startswith(b"data:") for line in lines):
        # One file is one stream: its end ends the event it ended in (as a closed connection does).
        yield Chunk(None, SSE_WIRE, data if data.endswith((b"\n\n", b"\r\n\r\n")) else data + b"\n\n")
        return
    for line in lines:
        if not line.strip():
            continue
        value = _json_or_none(line)
        if isinstance(value, dict) and {"stream", "raw"} <= value.keys():
            if value["stream"] != "event":
                continue  # /global/event and the v2 stream repeat the same events in other envelopes
            raw = value["raw"]
            at_ms = _seconds_to_ms(value.get("t"))
            # A `raw` that is not the event's text is no event: the whole line goes on, to be dropped.
            event = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else line
            yield Chunk(at_ms, SSE_WIRE, sse_event(event))
        elif isinstance(value, dict) and "providers" in value and "type" not in value:
            yield Chunk(None, PROVIDERS_WIRE, line)
        else:
            yield Chunk(None, SSE_WIRE, sse_event(line))


def _json_or_none(data: bytes) -> object:
    try:
        return loads(data, error=MalformedFrame)
    except MalformedFrame:
        return None


def _seconds_to_ms(value: object) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return round(value * 1000)
    return None
