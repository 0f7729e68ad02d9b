"""The agent directory's lock files (flock), held for a block."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from guard.constants import CONTEXT_LOCK_NAME
from guard.layout import AgentDir
from guard.walk import agent_dirs

__all__ = [
    "agent_locked",
    "locked",
]


@contextlib.contextmanager
def locked(agent_fd: int, name: str = CONTEXT_LOCK_NAME) -> Iterator[None]:
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=agent_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def agent_locked(agent: AgentDir, lock_name: str) -> Iterator[None]:
    """Hold one of the agent directory's lock files (created as needed) for the block."""
    with agent_dirs(agent, create=True) as (agent_fd, _), locked(agent_fd, lock_name):
        yield
