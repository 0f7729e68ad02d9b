"""What a `hctx watch --exec` command leaves behind: found, ended and reaped.

Each command runs in a session and process group of its own, its environment marked with
`HCTX_EXEC_ID=<mark>`, which every descendant inherits. Its group alone would miss a child that
called `setsid` (a daemonising notifier): so on Linux the watch is a child subreaper
(`PR_SET_CHILD_SUBREAPER`), every orphan of a command is re-parented to the watch instead of init,
and none escapes into the session as a stray holding the watch's stdout open. When a command
returns, times out, or the watch stops, every process carrying its mark is sent SIGTERM (and
SIGCONT), SIGKILL after END_GRACE_S, and those that became the watch's children are reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Container, Iterable

import trio

from guard.procs import proc_stat

__all__ = [
    "END_GRACE_S",
    "MARK_ENV",
    "become_subreaper",
    "end",
    "marked",
    "orphans",
    "reap_zombies",
]

MARK_ENV = "HCTX_EXEC_ID"
END_GRACE_S = 1.0
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.02


def become_subreaper() -> bool:
    """This process adopts its descendants' orphans (Linux); False where the system has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def marked(mark: str) -> list[int]:
    """The processes whose environment carries `HCTX_EXEC_ID=mark` (this user's, as /proc lets us see)."""
    entry = f"{MARK_ENV}={mark}".encode()
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if entry in environ.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def orphans(running: Container[int]) -> list[int]:
    """This process's children that are not in `running`: orphans it adopted as a subreaper."""
    me = os.getpid()
    return [pid for pid in _pids() if pid not in running and (proc := proc_stat(pid)) is not None and proc.parent == me]


def _gone(pid: int) -> bool:
    """Not running any more; a zombie child of ours is reaped on the way."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    proc = proc_stat(pid)
    return proc is None or proc.state in ("Z", "X")


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


async def end(pids: Iterable[int], grace_s: float = END_GRACE_S) -> int:
    """SIGTERM and SIGCONT `pids`, SIGKILL what is left after `grace_s`, reap our children among
    them; how many there were. Runs to the end even when cancelled (the watch is stopping)."""
    left = [pid for pid in pids if not _gone(pid)]
    count = len(left)
    with trio.CancelScope(shield=True):
        _signal(left, signal.SIGTERM)
        _signal(left, signal.SIGCONT)
        left = await _until_gone(left, grace_s)
        _signal(left, signal.SIGKILL)
        await _until_gone(left, grace_s)
    return count


async def _until_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Those of `pids` still running after at most `timeout_s`. Polled: the end of a process that
    is not (or not yet) our child gives us nothing to wait on."""
    with trio.move_on_after(timeout_s):
        while pids := [pid for pid in pids if not _gone(pid)]:  # noqa: ASYNC110
            await trio.sleep(_POLL_S)
    return pids


def reap_zombies(running: Container[int]) -> None:
    """Reap the adopted orphans that ended on their own (never a child in `running`, whose status
    its waiter collects): a subreaper that did not would collect zombies for as long as it runs."""
    for pid in orphans(running):
        if (proc := proc_stat(pid)) is not None and proc.state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
