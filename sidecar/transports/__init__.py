"""Harness-specific transports the sidecar runs beside the always-on unix-socket channel.

A transport module `sidecar.transports.<name>` defines `async def run(config, submit)`: it reads
the harness's native stream (Codex app-server, OpenCode SSE, ...) and calls `submit(frame)` for
every decoded frame. `config` is the JSON object the wrapper's launch plan put in
`LaunchPlan.transport`. A harness without such a module uses the channel alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from guard.record import Harness
from sidecar.producers.base import Frame

Submit = Callable[[Frame], None]
Transport = Callable[[dict[str, Any], Submit], Awaitable[None]]


def transport_for(harness: Harness) -> Transport | None:
    name = "pi" if harness == "omp" else harness
    try:
        module = importlib.import_module(f"sidecar.transports.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"sidecar.transports.{name}":
            raise
        return None
    run: Transport = module.run
    return run
