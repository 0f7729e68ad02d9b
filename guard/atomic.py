"""Atomic replace: a file staged outside the replicated subtree, fsynced, renamed over its name;
and the sweep of what a killed writer left staged."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

from guard.constants import CONTROL_DIR_NAME, STAGING_DIR_NAME
from guard.errors import CatalogError
from guard.layout import AgentDir
from guard.procs import pid_alive
from guard.walk import agent_dirs, open_chain

__all__ = [
    "sweep_staging",
    "write_agent_file",
    "write_json_atomic",
]


def write_json_atomic(
    dir_fd: int, name: str, data: bytes, staging_fd: int, *, mode: int | None = None, durable: bool = True
) -> None:
    """Stage in `staging_fd`, fsync, rename over `name` in `dir_fd`, fsync the directory. The file
    is 0644 less the umask, or exactly `mode`; the rename replaces a symlink named `name`, never
    what it points at. `durable=False` skips both fsyncs, for a cache a crash may cost (readers
    still see the old file or the new one, never half of one)."""
    temp = f"{name}.{os.getpid()}.{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o644 if mode is None else 0o600, dir_fd=staging_fd)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=staging_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=staging_fd)
        raise
    if durable:
        os.fsync(dir_fd)


_STAGED_NAME = re.compile(r"[a-z-]+\.([0-9]+)\.[0-9a-f]+")


def sweep_staging(catalog: Path) -> int:
    """Remove staging files whose writer is gone (SIGKILLed mid-write); returns how many.

    A staging file names its writer's pid; a live writer's file is never touched.
    """
    removed = 0
    try:
        staging_fd = open_chain(catalog, (CONTROL_DIR_NAME, STAGING_DIR_NAME))
    except (FileNotFoundError, CatalogError):
        return 0
    try:
        for name in os.listdir(staging_fd):
            match = _STAGED_NAME.fullmatch(name)
            if match is None or pid_alive(int(match.group(1))):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=staging_fd)
                removed += 1
    finally:
        os.close(staging_fd)
    return removed


def write_agent_file(agent: AgentDir, name: str, data: bytes) -> None:
    """Another record of the agent directory (harness-state), staged the same safe way."""
    with agent_dirs(agent, create=True) as (agent_fd, staging_fd):
        write_json_atomic(agent_fd, name, data, staging_fd)
