"""The harnesses, in one explicit table: each name to the `HarnessSpec` its module defines.

A spec (`sidecar.spec.HarnessSpec`, re-exported here) is everything the sidecar, `hctx replay`,
`hctx scan` and the wrapper need to know about one harness. The registry is the one door to them:
the wrapper and the readers import this module, never a harness package.

Specs load lazily, by module path, so a sidecar imports only its own harness: its HTTP client
(httpx) only for OpenCode, trio-websocket only for Codex's relay. A harness outside
this package registers the same `module:attribute` path under the `hctx.harnesses` entry-point
group; docs/sixth-harness.md has the recipe, and tests/sixth_harness/ is one defined entirely in
the tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, cast

from guard.errors import UnknownHarness
from sidecar.spec import (
    HarnessSpec,
    TranscriptFile,
    TranscriptReader,
    TranscriptReading,
    WindowSource,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "REGISTERED",
    "HarnessSpec",
    "TranscriptFile",
    "TranscriptReader",
    "TranscriptReading",
    "WindowSource",
    "harness_names",
    "rescan",
    "spec_for",
    "transcript_readers",
    "transport_config",
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


def transport_config(name: str, fields: Mapping[str, object]) -> BaseModel:
    """The config a launch plan hands the harness's transport: `fields` validated by the harness's
    own `transport_config` model, the one the sidecar validates `--transport` with."""
    model = spec_for(name).transport_config
    if model is None:
        raise UnknownHarness(f"the {name} harness has no transport config")
    return model.model_validate(fields)


def transcript_readers() -> dict[str, TranscriptReader]:
    """Each harness whose own transcripts `hctx scan` reads, to its reader module."""
    readers: dict[str, TranscriptReader] = {}
    for name in harness_names():
        module = spec_for(name).transcripts
        if module is not None:
            readers[name] = cast("TranscriptReader", importlib.import_module(module))
    return readers
