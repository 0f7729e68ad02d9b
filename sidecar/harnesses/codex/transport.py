"""Codex's transport: what runs beside the channel depends on how Codex was launched.

The wrapper's launch plan says which (`sidecar.harnesses.codex.producer.CodexTransport`):

- `channel`: the app-server on stdio. The wrapper taps its stdout onto the channel; nothing runs here.
- `relay`: the app-server listens on a websocket. `sidecar.harnesses.codex.relay` listens where the
  client asked, forwards, and taps each server message.
- `rollout`: an interactive seat. `sidecar.harnesses.codex.rollout` follows the rollout file Codex writes.

Every mode first hands the producer the compaction settings the wrapper read, so every reading
carries them.
"""

from __future__ import annotations

from sidecar.harnesses.codex.producer import CodexTransport, Relay, Rollout
from sidecar.spec import Streams

__all__ = [
    "run",
]


async def run(config: CodexTransport, streams: Streams) -> None:
    mode = config.root
    streams.submit(mode.compaction())
    if isinstance(mode, Relay):
        from sidecar.harnesses.codex.relay import run_relay  # trio-websocket: only for a relay

        await run_relay(mode, streams)
    elif isinstance(mode, Rollout):
        from sidecar.harnesses.codex.rollout import follow_rollout

        await follow_rollout(mode, streams)
