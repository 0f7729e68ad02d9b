"""pi and omp: load the shipped channel extension for this one launch.

Both harnesses take `--extension PATH` (repeatable; explicit paths load even beside
`--no-extensions`), so the asset rides on the command line: nothing is written into the user's
extension directories, settings or sessions, and the user's own extensions load as before.
The extension finds the sidecar through $HCTX_CHANNEL, which the wrapper sets. It ships beside this
module, in pi's package (`hctx-channel.ts`); both harnesses' specs name this launch plan.
"""

from __future__ import annotations

import dataclasses
import itertools
from importlib.resources import files
from pathlib import Path

from sidecar.launching import LaunchPlan

__all__ = [
    "ASSET_NAME",
    "END_OF_OPTIONS",
    "EXTENSION_FLAG",
    "channel_extension",
    "prepare",
]

ASSET_NAME = "hctx-channel.ts"
EXTENSION_FLAG = "--extension"
# Everything after a bare `--` is positional to pi and omp; our flag must precede it.
END_OF_OPTIONS = "--"


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
