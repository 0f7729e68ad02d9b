"""The harnesses, in one explicit table: each name to the `HarnessSpec` its module defines.

A spec (`sidecar.spec.HarnessSpec`, re-exported here) is everything the sidecar, `hctx replay`,
`hctx scan` and the wrapper need to know about one harness. The registry is the one door to them:
the wrapper and the readers import this module, never a harness package. A harness's launch plan
(`prepare`, `teardown`), its model-window table and whether its percent can run past 100 are reached
here through its spec; a launch plan loads only when the wrapper asks for one, never in a sidecar.

Specs load lazily, by module path, so a sidecar imports only its own harness: its HTTP client
(httpx) only for OpenCode, trio-websocket only for Codex's relay. A harness outside
this package registers the same `module:attribute` path under the `hctx.harnesses` entry-point
group; docs/sixth-harness.md has the recipe, and tests/sixth_harness/ is one defined entirely in
the tests.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sidecar.names import BUILT_IN, ENTRY_POINT_GROUP, REGISTERED, entry_point_paths, harness_names
from sidecar.spec import (
    HarnessSpec,
    ModelWindows,
    NotAdoptable,
    TranscriptFile,
    TranscriptReader,
    TranscriptReading,
    UnknownHarness,
    WindowSource,
)

if TYPE_CHECKING:
    from guard.record import Harness
    from sidecar.launching import LaunchModule, LaunchPlan
    from sidecar.setup_plan import SetupModule
    from sidecar.setup_state import SetupState

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "PACKAGE_RUNNERS",
    "REGISTERED",
    "HarnessSpec",
    "NotAdoptable",
    "TranscriptFile",
    "TranscriptReader",
    "TranscriptReading",
    "WindowSource",
    "adopted_plan",
    "harness_names",
    "has_teardown",
    "infer_harness",
    "launch_plan",
    "model_table",
    "overrun_harnesses",
    "prepare",
    "programs",
    "rescan",
    "setup_module",
    "setup_state",
    "spec_for",
    "teardown",
    "transcript_readers",
    "verified_versions",
]


def rescan() -> None:
    """Forget what was found: after a harness was installed (or removed) in this process."""
    entry_point_paths.cache_clear()
    spec_for.cache_clear()


@cache
def spec_for(name: str) -> HarnessSpec:
    path = BUILT_IN.get(name) or entry_point_paths().get(name)
    if path is None:
        raise UnknownHarness(f"no harness {name!r}: known are {', '.join(harness_names())}")
    module_name, _, attribute = path.partition(":")
    spec = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(spec, HarnessSpec) or spec.name != name:
        raise UnknownHarness(f"{path} is not the HarnessSpec of {name!r}")
    return spec


def verified_versions(name: str) -> tuple[str, ...]:
    return spec_for(name).verified_versions


def transcript_readers() -> dict[str, TranscriptReader]:
    """Each harness whose own transcripts `hctx scan` reads, to its reader module."""
    readers: dict[str, TranscriptReader] = {}
    for name in harness_names():
        module = spec_for(name).transcripts
        if module is not None:
            readers[name] = cast("TranscriptReader", spec_for(name).module(module))
    return readers


def model_table(name: str, environ: Mapping[str, str], warnings: list[str]) -> dict[str, int]:
    """The harness's model id -> window table (`HarnessSpec.model_windows`); {} when it has none."""
    spec = spec_for(name)
    if spec.model_windows is None:
        return {}
    return cast("ModelWindows", spec.module(spec.model_windows)).model_table(environ, warnings)


def overrun_harnesses() -> tuple[str, ...]:
    """The harnesses whose usedPercent can run past 100 (`HarnessSpec.overruns`)."""
    return tuple(name for name in harness_names() if spec_for(name).overruns)


# ---------------------------------------------------------------------------------------------
# Launching: the wrapper's door to each harness's launch plan (`sidecar.launching`)


def launch_plan(name: str) -> LaunchModule:
    """The harness's launch plan module (`HarnessSpec.launch`, in its own package)."""
    spec = spec_for(name)
    return cast("LaunchModule", spec.module(spec.launch))


def prepare(plan: LaunchPlan) -> LaunchPlan:
    return launch_plan(plan.harness).prepare(plan)


def adopted_plan(name: str, pid: int, cwd: Path, hints: Mapping[str, str]) -> LaunchPlan:
    """The plan of a harness session `hctx adopt` adopts (issue 36): the harness's launch module's
    `adopted(pid, cwd, hints) -> LaunchPlan`, with `argv=()` (nothing to spawn: process `pid` runs
    already) and the transport and account a wrapped launch of it would have. NotAdoptable for a
    harness whose module defines none."""
    adopt = getattr(launch_plan(name), "adopted", None)
    if adopt is None:
        raise NotAdoptable(f"the {name} harness cannot be adopted: its launch plan defines no adoption; "
                           "run it under `hctx wrap` instead")  # fmt: skip
    plan: LaunchPlan = adopt(pid, cwd, hints)
    return plan


def has_teardown(plan: LaunchPlan) -> bool:
    """Whether the plan's module undoes anything after the launch (most have nothing to undo)."""
    return hasattr(launch_plan(plan.harness), "teardown")


def teardown(plan: LaunchPlan) -> None:
    """After the launch `plan` (as `prepare` returned it) has ended. A module's teardown reports its
    own failures and never raises: the wrapper's exit status is the harness's."""
    undo = getattr(launch_plan(plan.harness), "teardown", None)
    if undo is not None:
        undo(plan)


def setup_module(harness: str) -> SetupModule | None:
    """The harness's setup module (`setup.py` in its own package, issue 36: `setup(home, environ) ->
    sidecar.setup_plan.HarnessSetup`), or None when it has none: no user-level extension point was
    measured for it. A module that exists but fails to import raises, as any broken module does."""
    spec = spec_for(harness)
    try:
        found = importlib.util.find_spec(f"{spec.package}.{spec.setup}")
    except ModuleNotFoundError:  # its package is a plain module (or gone): nothing inside it
        return None
    if found is None:
        return None
    return cast("SetupModule", spec.module(spec.setup))


def setup_state(harness: str, home: Path, environ: Mapping[str, str]) -> SetupState | None:
    """Whether the harness's setup is in place and current, not set up, or stale (`hctx doctor`);
    None when it has no setup module or is not installed."""
    module = setup_module(harness)
    if module is None:
        return None
    plan = module.setup(home, environ)
    if not plan.installed or not plan.edits:
        return None
    from sidecar.setup_state import setup_state as state_of

    return state_of(plan)


def programs() -> dict[str, Harness]:
    """Every harness's program names and npm packages (each spec's `programs`), to its name."""
    return {program: name for name in harness_names() for program in spec_for(name).programs}


PACKAGE_RUNNERS = frozenset({"npx", "bunx", "pnpx"})


def _package_name(spec: str) -> str:
    """`@scope/agent@1.2.3` -> `@scope/agent`; `opencode-ai@latest` -> `opencode-ai`."""
    scope = "@" if spec.startswith("@") else ""
    return scope + spec.removeprefix("@").partition("@")[0]


def infer_harness(argv: tuple[str, ...]) -> Harness | None:
    """The harness `argv` runs: its program's name, or the package behind `npx`/`bunx`; else None."""
    if not argv:
        return None
    program = Path(argv[0]).name
    if program in PACKAGE_RUNNERS:
        program = _package_name(next((word for word in argv[1:] if not word.startswith("-")), ""))
    return programs().get(program)
