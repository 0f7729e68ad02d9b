"""Reading small files a hostile tree may hold: regular files only, never a symlink, bounded.

A FIFO named like a record must not hang a reader, a symlink must not be followed, and a huge file
must not be read whole: every reader of the catalog goes through here.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SYMLINK_PROBLEM",
    "RawFile",
    "open_regular",
    "read_bounded",
    "set_aside",
]

SYMLINK_PROBLEM = "is a symlink; not followed"
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class RawFile:
    """A file as found: absent (`data` and `problem` None), read (`data`), or refused (`problem`)."""

    data: bytes | None = None
    problem: str | None = None

    @property
    def absent(self) -> bool:
        return self.data is None and self.problem is None


def open_regular(name: str | Path, dir_fd: int | None = None, *, follow: bool = False) -> tuple[int, int] | str | None:
    """`(fd, size)` of a regular file, which the caller closes; None when absent; else why not.
    A symlink is refused unless `follow` (a path the user named, not one a hostile tree holds)."""
    try:
        fd = os.open(name, _FILE_FLAGS & ~os.O_NOFOLLOW if follow else _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return SYMLINK_PROBLEM if exc.errno == errno.ELOOP else f"unreadable: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        return f"unreadable: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return "is not a regular file"
    return fd, info.st_size


def read_bounded(dir_fd: int | None, name: str | Path, limit: int, *, follow: bool = False) -> RawFile:
    """A regular file named `name` in `dir_fd`, whole if it is at most `limit` bytes."""
    opened = open_regular(name, dir_fd, follow=follow)
    if not isinstance(opened, tuple):
        return RawFile(problem=opened)
    fd, size = opened
    try:
        if size > limit:
            return RawFile(problem=f"is {size} bytes, over the {limit}-byte bound; not read")
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        return RawFile(problem=f"unreadable: {exc.strerror or exc}")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # grew between fstat and read
        return RawFile(problem=f"is over the {limit}-byte bound; not read")
    return RawFile(data=data)


def set_aside(dir_fd: int, name: str) -> str:
    """Rename a file of hctx's own that cannot be used (a symlink, a FIFO, hostile bytes) out of the
    way, beside it, without following it: the evidence stays and the name is free. The new name."""
    aside = f"{name}.unreadable-{time.time_ns() // 1_000_000}"
    os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return aside
