"""The harnesses, in one explicit table: each name to the `HarnessSpec` its module defines.

A spec is everything the sidecar, `hctx replay` and the wrapper need to know about one harness:
its producer, one decoder per wire it is read from, the transport that moves those bytes (if the
unix-socket channel is not the only one), the wrapper's launch plan, how a recording on disk
becomes the timed bytes replay feeds, and the builds its arithmetic was verified against.

Specs load lazily, by module path, so a sidecar imports only its own harness: its HTTP client
(`sidecar.http`, on h11) only for OpenCode, trio-websocket only for Codex's relay. A harness outside
this package registers the same `module:attribute` path under the `hctx.harnesses` entry-point
group; docs/sixth-harness.md has the recipe, and tests/sixth_harness/ is one defined entirely in
the tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from guard.errors import UnknownHarness
from sidecar.decoding import CHANNEL, ChannelFrames, Decoder, channel_decoder
from sidecar.producer import Producer

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "REGISTERED",
    "Chunk",
    "HarnessSpec",
    "each_file",
    "harness_names",
    "rescan",
    "spec_for",
    "verified_versions",
]

ENTRY_POINT_GROUP = "hctx.harnesses"

# name -> "module:attribute" of its HarnessSpec. pi and omp share one extension channel and module.
BUILT_IN: Mapping[str, str] = {
    "claude": "sidecar.harnesses.claude.producer:SPEC",
    "codex": "sidecar.harnesses.codex.producer:SPEC",
    "pi": "sidecar.harnesses.pi.producer:PI",
    "omp": "sidecar.harnesses.pi.producer:OMP",
    "opencode": "sidecar.harnesses.opencode.producer:SPEC",
}


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes one wire carried, and when they arrived (ms) if the recording says."""

    at_ms: int | None
    wire: str
    data: bytes


@dataclass(frozen=True)
class HarnessSpec:
    name: str
    make_producer: Callable[[], Producer]
    # The harness's frames on the unix-socket channel: (envelope type, object) -> typed events.
    channel_frames: ChannelFrames
    # Every other wire -> a fresh decoder for one stream of it (a connection, a file).
    decoders: Mapping[str, Callable[[], Decoder]]
    # Recording files -> the timed chunks they hold, in order.
    read_recording: Callable[[Sequence[Path]], Iterable[Chunk]]
    verified_versions: tuple[str, ...]
    # The wrapper module whose `plan` launches the harness, and the sidecar transport module whose
    # `run(config, streams)` moves its native stream's bytes (None: the channel is the only wire).
    launch: str
    transport: str | None = None
    # How its program is called, and its npm package as `npx` or `bunx` runs it (`hctx wrap`'s
    # inference of the harness from a command line).
    programs: tuple[str, ...] = ()
    # The model of the transport's config: the wrapper's launch plan builds one, the sidecar
    # validates its JSON (`--transport`) with the same model.
    transport_config: type[BaseModel] | None = None

    def wires(self) -> tuple[str, ...]:
        return (CHANNEL, *self.decoders)

    def decoder(self, wire: str) -> Decoder:
        """A fresh decoder for one stream of `wire`."""
        if wire == CHANNEL:
            return channel_decoder(self.channel_frames)
        try:
            return self.decoders[wire]()
        except KeyError:
            raise UnknownHarness(f"the {self.name} harness has no wire {wire!r}") from None


@cache
def _entry_points() -> dict[str, str]:
    # Imported here: a built-in harness never needs it, and it costs a sidecar 1 MB.
    from importlib.metadata import entry_points

    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


def rescan() -> None:
    """Forget what was found: after a harness was installed (or removed) in this process."""
    _entry_points.cache_clear()
    spec_for.cache_clear()


def harness_names() -> tuple[str, ...]:
    """Every harness hctx can run: the built-in table, then the registered ones."""
    return (*BUILT_IN, *(name for name in sorted(_entry_points()) if name not in BUILT_IN))


@cache
def spec_for(name: str) -> HarnessSpec:
    path = BUILT_IN.get(name) or _entry_points().get(name)
    if path is None:
        raise UnknownHarness(f"no harness {name!r}: known are {', '.join(harness_names())}")
    module_name, _, attribute = path.partition(":")
    spec = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(spec, HarnessSpec) or spec.name != name:
        raise UnknownHarness(f"{path} is not the HarnessSpec of {name!r}")
    return spec


class _Registered:
    """The names `spec_for` answers, as a container: the readers' set of harnesses they know."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in BUILT_IN or name in _entry_points())


REGISTERED = _Registered()


def verified_versions(name: str) -> tuple[str, ...]:
    return spec_for(name).verified_versions


def each_file(wire: str) -> Callable[[Sequence[Path]], Iterable[Chunk]]:
    """The plainest recording: each file is the untimed bytes `wire` carried."""

    def read(paths: Sequence[Path]) -> Iterable[Chunk]:
        return [Chunk(None, wire, path.read_bytes()) for path in paths]

    return read
