"""`hctx replay`: a recorded stream through the very pipeline the sidecar runs, no disk involved."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from guard.policy import Write, WriteGuard
from guard.record import Harness
from sidecar.pipeline import Pipeline
from sidecar.producers import Tally, producer_for, recording_for

# Frames a recording does not timestamp arrive one replay-second apart; it is a simulated clock.
UNTIMED_STEP_MS = 1000


def replay(
    harness: Harness, recordings: Iterable[bytes], *, agent: str = "replay", tally: Tally | None = None
) -> Iterator[Write]:
    """The writes, in order; `tally` counts the frames the producer accepted (not dropped)."""
    pipeline = Pipeline(producer_for(harness), WriteGuard(agent, incarnation="replay"))
    decode = recording_for(harness)
    clock = 0
    for data in recordings:
        for at_ms, frame in decode(data):
            clock = max(clock, at_ms) if at_ms is not None else clock + UNTIMED_STEP_MS
            dropped = pipeline.dropped
            yield from pipeline.feed(frame, clock)
            if tally is not None and pipeline.dropped == dropped:
                tally.recognised += 1


def write_line(write: Write) -> str:
    """One JSON line: the record exactly as it would be written, with the policy's reason first."""
    return f'{{"reason": "{write.reason}", {write.record.to_json()[1:]}'
