"""What this host says of a process: alive or not, its /proc stat line (the one place it is
parsed), its command line and environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

from guard.files import read_bounded

__all__ = [
    "PROC_WORDS_BYTES",
    "ProcStat",
    "pid_alive",
    "proc_stat",
    "proc_words",
]

PROC_WORDS_BYTES = 1 << 20  # the most of a process's command line or environment read


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here. pid 0 and negatives would address groups."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it exists, it is just not ours
    except (OSError, OverflowError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What /proc/<pid>/stat says of a process: the one place it is parsed."""

    state: str  # R, S, D, Z (a zombie), X (dead), ...
    parent: int
    started: int  # clock ticks since boot: with the pid, it names one process even after reuse


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None where there is none (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            # After the command's name, which may itself hold spaces and parentheses.
            fields = stat_file.read().rsplit(b")", 1)[1].split()
        return ProcStat(fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def proc_words(pid: int, name: str) -> list[str]:
    """/proc/<pid>/<name> (`cmdline`, `environ`): its NUL-separated words, the empty ones left out;
    none when the process is gone, not ours, or says more than PROC_WORDS_BYTES."""
    raw = read_bounded(None, f"/proc/{pid}/{name}", PROC_WORDS_BYTES)
    if raw.data is None:
        return []
    return [word.decode(errors="surrogateescape") for word in raw.data.split(b"\0") if word]
