"""What a launch plan is: the `LaunchPlan` type every harness's `launch` module takes and returns,
and the helpers they share.

A harness's launch plan is the module its spec names (`HarnessSpec.launch`, `launch` in its own
package: `sidecar/harnesses/<name>/launch.py`). It defines `prepare(plan: LaunchPlan) -> LaunchPlan`,
which returns the plan to launch (a changed argv, extra env, rendered settings files, a transport
config for the sidecar, built by the harness's own model), and may define
`teardown(plan: LaunchPlan) -> None`, run when that launch has ended, to undo what `prepare` left in
the working directory. The wrapper reaches it through the registry (`sidecar.registry.prepare`).

Launch plans run only in the wrapper process: a sidecar never imports this module or a launch plan
(tests/test_sidecar_imports.py, tests/test_import_graph.py). It sits in the kernel, below the
harness packages, so each harness's launch plan can live in its package.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from guard.account import Account
from guard.record import Harness

__all__ = [
    "LOOPBACK",
    "LaunchModule",
    "LaunchPlan",
    "account_json",
    "free_loopback_port",
    "program_index",
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


class LaunchModule(Protocol):
    """A harness's launch plan module (its optional `teardown` is looked up, not required)."""

    def prepare(self, plan: LaunchPlan) -> LaunchPlan: ...


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
