"""The agent's own Codex threads for synthetic streams.

A real app-server announces every thread a client starts (`thread/started`, and the `thread/start`
result) before any of its usage, and the producer publishes a reading only for a thread so
announced (issue 28: a subagent's thread is never announced). A synthetic stream made of bare usage
messages states that first, with `THREAD_STARTED` (its bytes) or `own_producer` (its event).
"""

from __future__ import annotations

import json

from sidecar.harnesses.codex.events import ThreadOpened
from sidecar.harnesses.codex.producer import CodexProducer

# The thread ids the synthetic streams use.
SYNTHETIC_THREADS = ("t", "th", "A", "B")


def thread_started(thread_id: str) -> bytes:
    """A `thread/started` line in the shape 0.151.0 and 0.171.0 send (no newline)."""
    thread = {"id": thread_id, "parentThreadId": None, "forkedFromId": None, "preview": ""}
    return json.dumps({"method": "thread/started", "params": {"thread": thread}}, separators=(",", ":")).encode()


THREAD_STARTED = thread_started("t")


def own_producer(*threads: str) -> CodexProducer:
    """A Codex producer told that `threads` (the synthetic ones by default) are the agent's own."""
    producer = CodexProducer()
    for thread in threads or SYNTHETIC_THREADS:
        assert producer.feed(ThreadOpened(thread_id=thread), 0) == []
    return producer
