"""Per-harness launch preparation: how `hctx wrap` adapts the command, env and settings.

A module `wrapper.harnesses.<name>` may define `prepare(plan: LaunchPlan) -> LaunchPlan`, which
returns the plan to launch (a changed argv, extra env, rendered settings files, a transport config
for the sidecar). A harness without such a module launches its command unchanged.
"""

from __future__ import annotations

import importlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.record import Harness


@dataclass(frozen=True)
class LaunchPlan:
    harness: Harness
    argv: tuple[str, ...]
    cwd: Path
    # Added to the harness's environment (beside HCTX_CHANNEL, HCTX_AGENT, ...).
    env: dict[str, str] = field(default_factory=dict)
    # Handed to the sidecar's transport for this harness (see sidecar.transports).
    transport: dict[str, Any] = field(default_factory=dict)
    # When set, the harness's stdout is a pipe the wrapper copies byte for byte to its own stdout
    # and, line by line, to the sidecar's channel as {"type": tap_stdout, "payload": <line>}.
    tap_stdout: str | None = None


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


def prepare(plan: LaunchPlan) -> LaunchPlan:
    name = "pi" if plan.harness == "omp" else plan.harness
    try:
        module = importlib.import_module(f"wrapper.harnesses.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"wrapper.harnesses.{name}":
            raise
        return plan
    prepared: LaunchPlan = module.prepare(plan)
    return prepared
