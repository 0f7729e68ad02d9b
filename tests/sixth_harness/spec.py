"""A sixth harness, defined entirely in the tests, by the recipe in docs/sixth-harness.md.

Its agent (`agent.py`) reports `{"type": "sixth.usage", "used": N, "window": W}` lines on the
channel and `{"type": "sixth.compacted"}` when it compacts. This module is all hctx needs of it:
typed events, a decoder for its channel frames, a producer, and the spec; `launch.py` is its launch
plan, and the entry point under `registered/` is its line in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from guard.errors import FrameRejected
from guard.policy import Reading
from guard.record import ContextFields, Count, describe_validation_error
from sidecar.held import Held
from sidecar.spec import HarnessSpec

NAME = "sixth"


@dataclass(frozen=True, slots=True)
class Usage:
    used: int
    window: int


@dataclass(frozen=True, slots=True)
class Compacted:
    pass


class _UsageFrame(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    type: Literal["sixth.usage"]
    used: Count
    window: Count


def channel_frames(kind: str, frame: dict[str, Any]) -> list[object]:
    if kind == "sixth.compacted":
        return [Compacted()]
    if kind != "sixth.usage":
        raise FrameRejected(f"not a frame of the {NAME} harness: {kind[:40]!r}")
    try:
        usage = _UsageFrame.model_validate(frame)
    except ValidationError as exc:
        raise FrameRejected(describe_validation_error(exc)) from None
    return [Usage(usage.used, usage.window)]


class SixthProducer:
    harness = NAME

    def __init__(self) -> None:
        # The shared producer kernel holds the reading and the compaction ledger: a new reading
        # carries the count, when the last compaction was and its trigger; an edge restates the
        # held numbers with their own time.
        self.held = Held(NAME)

    def feed(self, event: Usage | Compacted, now_ms: int) -> list[Reading]:
        if isinstance(event, Usage):
            percent = round(event.used * 100 / event.window, 1) if event.window else None
            usage = ContextFields(harness=NAME, used_tokens=event.used, window_tokens=event.window or None,
                                  used_percent=percent, observed_at_ms=now_ms)  # fmt: skip
            return [self.held.measured(usage)]
        return self.held.compacted(now_ms)  # it names no trigger: "unknown"


SPEC = HarnessSpec(
    name=NAME,
    make_producer=SixthProducer,
    channel_frames=channel_frames,
    decoders={},
    verified_versions=("1.0",),
    package=__name__.rpartition(".")[0],  # tests.sixth_harness: its launch plan is `launch.py` beside this
    programs=("sixth-agent",),
)
