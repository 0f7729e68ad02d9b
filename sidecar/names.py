"""The harnesses' names, without their specs: the built-in table, the registered entry points and
the container readers check a record's harness against. Stdlib only, so a reader that must start
fast (`hctx status`, `hctx --help`) knows the names without loading a spec (or pydantic);
sidecar.registry re-exports all of it and is the door to the specs themselves."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "REGISTERED", "entry_point_paths", "harness_names"]

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
def entry_point_paths() -> dict[str, str]:
    # Imported here: a built-in harness never needs it, and it costs a sidecar 1 MB.
    from importlib.metadata import entry_points

    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


def harness_names() -> tuple[str, ...]:
    """Every harness hctx can run: the built-in table, then the registered ones."""
    return (*BUILT_IN, *(name for name in sorted(entry_point_paths()) if name not in BUILT_IN))


class _Registered:
    """The names `sidecar.registry.spec_for` answers, as a container: the readers' set of harnesses
    they know."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in BUILT_IN or name in entry_point_paths())


REGISTERED = _Registered()
