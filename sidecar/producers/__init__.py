"""The producer registry: the `harness` discriminator selects one module's producer."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
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


def producer_for(harness: Harness) -> Producer:
    return _module(harness).make_producer(harness)


def recording_for(harness: Harness) -> Recording:
    return _module(harness).decode_recording


def read_recordings(harness: Harness, paths: Sequence[Path]) -> list[bytes]:
    """What `hctx replay` decodes: each file's bytes, unless the harness's module merges its own
    capture files (`load_recordings(paths)`, e.g. Claude's status-line and hook captures and their
    `.times` siblings, into one timed stream)."""
    load = getattr(_module(harness), "load_recordings", None)
    if load is None:
        return [path.read_bytes() for path in paths]
    recordings: list[bytes] = load(paths)
    return recordings
