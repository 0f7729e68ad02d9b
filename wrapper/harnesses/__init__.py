"""Per-harness launch preparation: how `hctx wrap` adapts the command, env and settings.

The harness's launch plan is the module its spec names (`HarnessSpec.launch`, usually
`wrapper.harnesses.<name>`). It defines `prepare(plan: LaunchPlan) -> LaunchPlan`, which returns the
plan to launch (a changed argv, extra env, rendered settings files, a transport config for the
sidecar), and may define `teardown(plan: LaunchPlan) -> None`, run when that launch has ended, to
undo what `prepare` left in the working directory.
"""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from guard.account import Account
from guard.record import Harness
from sidecar.registry import harness_names, spec_for

__all__ = [
    "LOOPBACK",
    "PACKAGE_RUNNERS",
    "LaunchPlan",
    "account_json",
    "free_loopback_port",
    "has_teardown",
    "infer_harness",
    "prepare",
    "program_index",
    "programs",
    "teardown",
    "transport_json",
]


@dataclass(frozen=True)
class LaunchPlan:
    harness: Harness
    argv: tuple[str, ...]
    cwd: Path
    # Added to the harness's environment (beside HCTX_CHANNEL, HCTX_AGENT, ...).
    env: dict[str, str] = field(default_factory=dict)
    # Handed to the sidecar's transport for this harness (see sidecar.streams): an instance of
    # the harness's `transport_config` model, which the sidecar validates its JSON with.
    transport: BaseModel | None = None
    # When set, the harness's stdout is a pipe the wrapper copies byte for byte to its own stdout
    # and, line by line, to the sidecar's channel, each line as its spec's `tap_frame` frames it.
    tap_stdout: bool = False
    # The account the harness's own login states (guard.account), read when the launch is planned;
    # the sidecar stamps it on every reading. None: the harness states none.
    account: Account | None = None
    # The wrapper whose launch this is: what `prepare` takes (a Claude seat) is held in its name and
    # given back in it by `teardown`, which runs in a short-lived step the resident starts, not in
    # the wrapper itself (its pid survives the exec into the resident).
    owner_pid: int = field(default_factory=os.getpid)


def account_json(plan: LaunchPlan) -> str | None:
    """The plan's account as the sidecar gets it (`--account`); None when the harness states none."""
    return None if plan.account is None else plan.account.model_dump_json()


def transport_json(plan: LaunchPlan) -> str | None:
    """The plan's transport config as the sidecar gets it (`--transport`); None when it has none."""
    if plan.transport is None:
        return None
    return plan.transport.model_dump_json(by_alias=True, exclude_none=True)


LOOPBACK = "127.0.0.1"


def free_loopback_port() -> int:
    """A port the kernel just handed out on loopback; the harness binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def program_index(argv: tuple[str, ...], name: str) -> int | None:
    """Where the harness's own program is in `argv`: `opencode`, or behind `npx`, `bunx`, `node`."""
    return next((i for i, word in enumerate(argv) if Path(word).name.startswith(name)), None)


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


def _module(harness: Harness) -> ModuleType:
    return importlib.import_module(spec_for(harness).launch)


def prepare(plan: LaunchPlan) -> LaunchPlan:
    prepared: LaunchPlan = _module(plan.harness).prepare(plan)
    return prepared


def has_teardown(plan: LaunchPlan) -> bool:
    """Whether the plan's module undoes anything after the launch (most have nothing to undo)."""
    return hasattr(_module(plan.harness), "teardown")


def teardown(plan: LaunchPlan) -> None:
    """After the launch `plan` (as `prepare` returned it) has ended. A module's teardown reports its
    own failures and never raises: the wrapper's exit status is the harness's."""
    module = _module(plan.harness)
    if hasattr(module, "teardown"):
        module.teardown(plan)
