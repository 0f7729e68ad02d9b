"""The sidecar's streams: what a transport's bytes go through, into the harness's decoders.

A harness whose spec names a transport module (`HarnessSpec.transport`) gets, beside the always-on
unix-socket channel, that module's `async def run(config, streams)`: it reads the harness's own
stream (Codex's app-server websocket or rollout file, OpenCode's SSE) and hands the bytes to
`streams.open(wire)`, one `Stream` per connection or file. It decodes nothing itself: the decoder is
the harness's, the one `hctx replay` runs. `config` is what the wrapper's launch plan put in
`LaunchPlan.transport`: an instance of the spec's `transport_config` model, built by the wrapper
and validated from its JSON by the sidecar. A transport knows these only as the protocols of
`sidecar.spec` (`Stream`, `Streams`): this runtime module implements them, below nothing a harness
imports.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable
from contextvars import ContextVar
from typing import TYPE_CHECKING

import trio

from sidecar.decoding import Decoder, Dropped
from sidecar.spec import HarnessSpec, Submit, Transport, Wants

if TYPE_CHECKING:
    from sidecar.recorder import Recorder

__all__ = [
    "CHUNK_MS",
    "Stream",
    "Streams",
    "transport_for",
    "wall_ms",
]

log = logging.getLogger(__name__)


class Stream:
    """One stream of one wire: its bytes through its own decoder, each event submitted at once,
    and with a recorder, the bytes (and the stream's end) offered to it first: the one place the
    sidecar's input is recorded."""

    def __init__(self, decoder: Decoder, submit: Submit, wire: str, recorder: Recorder | None = None) -> None:
        self.decoder = decoder
        self._submit = submit
        self.wire = wire
        self._recorder = recorder
        self._id = 0 if recorder is None else recorder.new_stream()

    def receive_data(self, data: bytes) -> int:
        """How many events the bytes completed (each already submitted)."""
        at = wall_ms()
        if self._recorder is not None:
            self._recorder.chunk(at, self.wire, self._id, data)
        return self._each(self.decoder.receive_data, data, at)

    def end_of_data(self) -> int:
        at = wall_ms()
        if self._recorder is not None:
            self._recorder.line({"at_ms": at, "wire": self.wire, "stream": self._id, "end": True})
        return self._each(lambda _: self.decoder.end_of_data(), b"", at)

    def _each(self, decode: Callable[[bytes], list[object]], data: bytes, at: int) -> int:
        try:
            events = decode(data)
        except Exception:  # a decoder bug costs these bytes, never the transport
            log.exception("decoder failed; bytes dropped", extra={"event": "decoder-failed", "wire": self.wire})
            events = [Dropped("decoder failed", self.wire)]
        arrived = CHUNK_MS.set(at)
        try:
            for event in events:
                self._submit(event)
        finally:
            CHUNK_MS.reset(arrived)
        return len(events)


def _nothing() -> frozenset[Hashable]:
    return frozenset()


class Streams:
    """What a transport is handed: fresh streams of its harness's wires, the sidecar's own facts
    (settings the wrapper read) as events, and what the producer wants pulled, if it says
    (a producer's optional `wants()`): the transport never decodes to find out."""

    def __init__(
        self, spec: HarnessSpec, submit: Submit, wants: Wants = _nothing, recorder: Recorder | None = None
    ) -> None:
        self.spec = spec
        self._events = submit  # what a stream's decoder made: recorded as the bytes it came from
        self.submit = submit if recorder is None else _recording_facts(submit, recorder)
        self.wants = wants
        self.recorder = recorder
        self._fed = trio.Event()

    def nudge(self) -> None:
        """The producer was fed (from any task): what it wants may have changed."""
        self._fed.set()

    async def fed(self, timeout_s: float | None) -> None:
        """Until the producer is next fed, or `timeout_s` (None: no timeout) passed."""
        with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
            await self._fed.wait()
        self._fed = trio.Event()

    def open(self, wire: str, decoder: Decoder | None = None) -> Stream:
        return Stream(self.spec.decoder(wire) if decoder is None else decoder, self._events, wire, self.recorder)


def wall_ms() -> int:
    """A recorded chunk's time: the wall clock the writer stamps records with (sidecar.app)."""
    return time.time_ns() // 1_000_000


# While a chunk's events are submitted, the time its bytes arrived (the time its recording holds):
# every event of one chunk is taken at that one time, live as in replay, so a second reading the
# same bytes carried is never a millisecond newer live than it replays (sidecar.app.SystemClock).
CHUNK_MS: ContextVar[int | None] = ContextVar("CHUNK_MS", default=None)


def _recording_facts(submit: Submit, recorder: Recorder) -> Submit:
    """A transport's own facts (settings the wrapper read) are recorded as such, then submitted."""
    from sidecar.recorder import fact_line

    def recorded(event: object) -> None:
        if (line := fact_line(wall_ms(), event)) is not None:
            recorder.line(line)
        submit(event)

    return recorded


def transport_for(spec: HarnessSpec) -> Transport | None:
    """The `run` of the spec's transport module; None for a harness the channel alone carries."""
    if spec.transport is None:
        return None
    run: Transport = spec.module(spec.transport).run
    return run
