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

import importlib
import logging
from collections.abc import Callable, Hashable

from sidecar.decoding import Decoder, Dropped
from sidecar.spec import HarnessSpec, Submit, Transport, Wants

__all__ = [
    "Stream",
    "Streams",
    "transport_for",
]

log = logging.getLogger(__name__)


class Stream:
    """One stream of one wire: its bytes through its own decoder, each event submitted at once."""

    def __init__(self, decoder: Decoder, submit: Submit, wire: str) -> None:
        self._decoder = decoder
        self._submit = submit
        self.wire = wire

    def receive_data(self, data: bytes) -> int:
        """How many events the bytes completed (each already submitted)."""
        return self._each(self._decoder.receive_data, data)

    def end_of_data(self) -> int:
        return self._each(lambda _: self._decoder.end_of_data(), b"")

    def _each(self, decode: Callable[[bytes], list[object]], data: bytes) -> int:
        try:
            events = decode(data)
        except Exception:  # a decoder bug costs these bytes, never the transport
            log.exception("decoder failed; bytes dropped", extra={"event": "decoder-failed", "wire": self.wire})
            events = [Dropped("decoder failed", self.wire)]
        for event in events:
            self._submit(event)
        return len(events)


def _nothing() -> frozenset[Hashable]:
    return frozenset()


class Streams:
    """What a transport is handed: fresh streams of its harness's wires, the sidecar's own facts
    (settings the wrapper read) as events, and what the producer wants pulled, if it says
    (a producer's optional `wants()`): the transport never decodes to find out."""

    def __init__(self, spec: HarnessSpec, submit: Submit, wants: Wants = _nothing) -> None:
        self.spec = spec
        self.submit = submit
        self.wants = wants

    def open(self, wire: str, decoder: Decoder | None = None) -> Stream:
        return Stream(self.spec.decoder(wire) if decoder is None else decoder, self.submit, wire)


def transport_for(spec: HarnessSpec) -> Transport | None:
    """The `run` of the spec's transport module; None for a harness the channel alone carries."""
    if spec.transport is None:
        return None
    run: Transport = importlib.import_module(spec.transport).run
    return run
