"""The producer registry: the `harness` discriminator selects one module's producer."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

from guard.record import Harness
from sidecar.producers.base import Producer, Recording

# pi and omp share one extension channel and one module; the harness picks the arithmetic row.
_MODULES: dict[Harness, str] = {
    "claude": "claude",
    "codex": "codex",
    "pi": "pi",
    "omp": "pi",
    "opencode": "opencode",
}


class _ProducerModule(Protocol):
    def make_producer(self, harness: Harness) -> Producer: ...

    decode_recording: Recording


def _module(harness: Harness) -> _ProducerModule:
    return cast(_ProducerModule, importlib.import_module(f"sidecar.producers.{_MODULES[harness]}"))


def verified_versions(harness: Harness) -> tuple[str, ...]:
    """The builds whose channel and arithmetic were measured: each producer's own constant."""
    from sidecar.producers import claude, codex, opencode, pi

    return {
        "claude": claude.VERIFIED_VERSIONS,
        "codex": codex.CODEX_CONTEXT_VERIFIED_VERSIONS,
        "pi": pi.PI_VERIFIED_VERSIONS,
        "omp": pi.OMP_VERIFIED_VERSIONS,
        "opencode": opencode.OPENCODE_CONTEXT_VERIFIED_VERSIONS,
    }[harness]


def producer_for(harness: Harness) -> Producer:
    return _module(harness).make_producer(harness)


def recording_for(harness: Harness) -> Recording:
    return _module(harness).decode_recording


@dataclass
class Tally:
    """What a replay made of its files: enough to say so when none of it was the harness's."""

    lines: int = 0  # lines in the files as read
    recognised: int = 0  # frames the producer accepted


def read_recordings(harness: Harness, paths: Sequence[Path], tally: Tally | None = None) -> list[bytes]:
    """What `hctx replay` decodes: each file's bytes, unless the harness's module merges its own
    capture files (`load_recordings(paths)`, e.g. Claude's status-line and hook captures and their
    `.times` siblings, into one timed stream). `tally` counts the lines read."""
    raw = [path.read_bytes() for path in paths]  # a module that merges its captures reads them again
    if tally is not None:
        tally.lines += sum(len(data.splitlines()) for data in raw)
    load = getattr(_module(harness), "load_recordings", None)
    if load is None:
        return raw
    recordings: list[bytes] = load(paths)
    return recordings
