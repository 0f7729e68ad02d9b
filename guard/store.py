"""The context record on disk: written atomically under the agent's lock, removed on a relaunch
claim, and the wrapper's note appended to the agent's log.

The catalog's other jobs have their own modules, each imported from where it is defined:
`guard.layout` (names, defaults, the log layout), `guard.procs` (/proc probing), `guard.walk`
(descriptors without following a symlink), `guard.locks`, `guard.atomic` (atomic replace, the
staging sweep). Listing the catalog is the read side's, guard.catalog.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from guard.atomic import write_json_atomic
from guard.constants import CONTEXT_RECORD_NAME, HARNESS_CONTEXT_FUTURE_SKEW_MS
from guard.errors import RecordRefused
from guard.files import read_bounded
from guard.layout import AgentDir, log_name
from guard.locks import locked
from guard.projection import MAX_RECORD_BYTES
from guard.record import HarnessContext, parse_record
from guard.walk import agent_dirs, open_append, open_logs_dir

__all__ = ["append_log_line", "remove_context", "write_context"]


def _read_existing(agent_fd: int) -> HarnessContext | None:
    data = read_bounded(agent_fd, CONTEXT_RECORD_NAME, MAX_RECORD_BYTES).data
    if data is None:
        return None
    try:
        return parse_record(data)
    except RecordRefused:
        return None


def write_context(agent: AgentDir, record: HarnessContext) -> HarnessContext:
    """Publish `record` atomically under the agent's lock; returns what was written.

    `writtenAtMs` is raised above whatever record is on disk, so it stays strictly monotonic even
    across writers (a straggler from an old incarnation) and within one millisecond.
    """
    with agent_dirs(agent, create=True) as (agent_fd, staging_fd), locked(agent_fd):
        existing = _read_existing(agent_fd)
        # A record dated past the skew bound (planted, or a clock stepped back) is not followed:
        # readers ignore it, and carried +1 it would date every later write in the future.
        future = time.time_ns() // 1_000_000 + HARNESS_CONTEXT_FUTURE_SKEW_MS
        if existing is not None and record.written_at_ms <= existing.written_at_ms <= future:
            record = record.model_copy(update={"written_at_ms": existing.written_at_ms + 1})
        write_json_atomic(agent_fd, CONTEXT_RECORD_NAME, record.to_json().encode(), staging_fd)
    return record


def remove_context(agent: AgentDir) -> bool:
    """The relaunch claim's removal: a reader sees `null`, not the previous incarnation's fill."""
    with agent_dirs(agent, create=True) as (agent_fd, _), locked(agent_fd):
        try:
            os.unlink(CONTEXT_RECORD_NAME, dir_fd=agent_fd)
        except FileNotFoundError:
            return False
        os.fsync(agent_fd)
        return True


def append_log_line(catalog: Path, host: str, identity: str, line: bytes) -> None:
    """Append one whole line to the agent's log (a note of the wrapper's, beside the sidecar's):
    in one write, never through a symlink, never blocking on a FIFO planted under the log's name."""
    dir_fd = open_logs_dir(catalog)
    try:
        fd = open_append(dir_fd, log_name(host, identity))
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
