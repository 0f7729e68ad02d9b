"""`hctx replay`: recorded bytes through the very decoders, producer and write guard the sidecar
runs, no disk involved.

A recording is the chunks of bytes each wire carried, in order, with their arrival times where it
has them (`sidecar.registry.Chunk`). Each wire's bytes go through one decoder for the whole
recording, as one connection's would, so a frame split across chunks is still one frame.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from guard.policy import Write, WriteGuard
from sidecar.decoding import Decoder, Dropped
from sidecar.pipeline import Pipeline
from sidecar.registry import Chunk, HarnessSpec

__all__ = [
    "UNTIMED_STEP_MS",
    "Tally",
    "replay",
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
