"""Codex's transport: what runs beside the channel depends on how Codex was launched.

The wrapper's launch plan says which (`sidecar.producers.codex.CodexTransport`):

- `channel`: the app-server on stdio. The wrapper taps its stdout onto the channel; nothing runs here.
- `relay`: the app-server listens on a websocket. `sidecar.transports.codex_relay` listens where the
  client asked, forwards, and taps each server message.
- `rollout`: an interactive seat. `sidecar.rollout` follows the rollout file Codex writes.

Every mode first hands the producer the compaction settings the wrapper read, so every reading
carries them.
"""

from __future__ import annotations

from sidecar.producers.codex import CodexTransport, Relay, Rollout
from sidecar.transports import Streams

__all__ = [
    "run",
]


async def run(config: CodexTransport, streams: Streams) -> None:
    mode = config.root
    streams.submit(mode.compaction())
    if isinstance(mode, Relay):
        from sidecar.transports.codex_relay import run_relay  # trio-websocket: only for a relay

        await run_relay(mode, streams)
    elif isinstance(mode, Rollout):
        from sidecar.rollout import follow_rollout

        await follow_rollout(mode, streams.submit)
