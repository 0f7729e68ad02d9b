"""Per-harness launch preparation: how `hctx wrap` adapts the command, env and settings.

A module `wrapper.harnesses.<name>` may define `prepare(plan: LaunchPlan) -> LaunchPlan`, which
returns the plan to launch (a changed argv, extra env, rendered settings files, a transport config
for the sidecar), and `teardown(plan: LaunchPlan) -> None`, run when that launch has ended, to undo
what `prepare` left in the working directory. A harness without such a module launches its command
unchanged.
"""

from __future__ import annotations

import importlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
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


# How each harness's program is called, and its npm package as `npx` or `bunx` runs it.
PROGRAMS: dict[str, Harness] = {
    "claude": "claude",
    "@anthropic-ai/claude-code": "claude",
    "codex": "codex",
    "@openai/codex": "codex",
    "pi": "pi",
    "@earendil-works/pi-coding-agent": "pi",
    "omp": "omp",
    "@oh-my-pi/pi-coding-agent": "omp",
    "opencode": "opencode",
    "opencode-ai": "opencode",
}
PACKAGE_RUNNERS = frozenset({"npx", "bunx", "pnpx"})


def _package_name(spec: str) -> str:
    """`@openai/codex@0.171.0` -> `@openai/codex`; `opencode-ai@latest` -> `opencode-ai`."""
    scope = "@" if spec.startswith("@") else ""
    return scope + spec.removeprefix("@").partition("@")[0]


def infer_harness(argv: tuple[str, ...]) -> Harness | None:
    """The harness `argv` runs: its program's name, or the package behind `npx`/`bunx`; else None."""
    if not argv:
        return None
    program = Path(argv[0]).name
    if program in PACKAGE_RUNNERS:
        package = next((word for word in argv[1:] if not word.startswith("-")), "")
        return PROGRAMS.get(_package_name(package))
    return PROGRAMS.get(program)


def _module(harness: Harness) -> ModuleType | None:
    name = "pi" if harness == "omp" else harness
    try:
        return importlib.import_module(f"wrapper.harnesses.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"wrapper.harnesses.{name}":
            raise
        return None


def prepare(plan: LaunchPlan) -> LaunchPlan:
    module = _module(plan.harness)
    if module is None:
        return plan
    prepared: LaunchPlan = module.prepare(plan)
    return prepared


def teardown(plan: LaunchPlan) -> None:
    """After the launch `plan` (as `prepare` returned it) has ended. A module's teardown reports its
    own failures and never raises: the wrapper's exit status is the harness's."""
    module = _module(plan.harness)
    if module is not None and hasattr(module, "teardown"):
        module.teardown(plan)
