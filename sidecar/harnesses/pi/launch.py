"""pi and omp: load the shipped channel extension for this one launch.

Both harnesses take `--extension PATH` (repeatable; explicit paths load even beside
`--no-extensions`), so the asset rides on the command line: nothing is written into the user's
extension directories, settings or sessions, and the user's own extensions load as before.
The extension finds the sidecar through $HCTX_CHANNEL, which the wrapper sets. It ships beside this
module, in pi's package (`hctx-channel.ts`); both harnesses' specs name this launch plan.

A session started without hctx is adopted (issue 36, `adopted`): the loader `hctx setup` placed in
the user's extension directory (sidecar/harnesses/pi/setup.py) runs the same extension, which starts
the adopter for its own process and reports to the adoption's channel. Nothing is launched then: the
plan carries no argv, and the extension (already running) needs no flag, environment or transport.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Literal

from guard.errors import Refused
from sidecar.launching import LaunchPlan

__all__ = [
    "ASSET_NAME",
    "END_OF_OPTIONS",
    "EXTENSION_FLAG",
    "HARNESS_HINT",
    "adopted",
    "channel_extension",
    "prepare",
]

ASSET_NAME = "hctx-channel.ts"
EXTENSION_FLAG = "--extension"
# Everything after a bare `--` is positional to pi and omp; our flag must precede it.
END_OF_OPTIONS = "--"
# The adoption hint naming which of the two harnesses this launch plan serves the process is.
HARNESS_HINT = "harness"
_HOSTS: dict[str, Literal["pi", "omp"]] = {"pi": "pi", "omp": "omp"}


def channel_extension() -> Path:
    """The shipped asset's path on disk (package data of pi's harness package, beside this module)."""
    return Path(str(files(__package__ or __name__).joinpath(ASSET_NAME)))


def prepare(plan: LaunchPlan) -> LaunchPlan:
    asset = str(channel_extension())
    argv = list(plan.argv)
    if _already_loads(argv, asset):
        return plan
    at = argv.index(END_OF_OPTIONS, 1) if END_OF_OPTIONS in argv[1:] else len(argv)
    argv[at:at] = [EXTENSION_FLAG, asset]
    return dataclasses.replace(plan, argv=tuple(argv))


def _already_loads(argv: list[str], asset: str) -> bool:
    return (
        any(value == asset and flag in ("-e", EXTENSION_FLAG, "--hook") for flag, value in itertools.pairwise(argv))
        or f"{EXTENSION_FLAG}={asset}" in argv
    )


def adopted(pid: int, cwd: Path, hints: Mapping[str, str]) -> LaunchPlan:
    """The plan of a plain pi or omp session the extension asked hctx to adopt: nothing to spawn
    (`argv=()`); the extension sends its frames to the adoption's channel itself. `hints` carries
    `harness=pi|omp` (the extension reads its host's package); pi and omp state no account."""
    del pid  # the adopter watches the process; nothing in the plan depends on it
    name = hints.get(HARNESS_HINT, "")
    harness = _HOSTS.get(name)
    if harness is None:
        raise Refused(f"adopting a pi or omp session needs the hint {HARNESS_HINT}=pi|omp, got {name!r}")
    return LaunchPlan(harness=harness, argv=(), cwd=cwd)
