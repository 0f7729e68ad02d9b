"""Process groups, as the wrapper and the sidecar end a harness's: the standard library only (the
wrapper's resident part imports this)."""

from __future__ import annotations

import os
import signal
import time

__all__ = ["POLL_S", "end", "group_alive", "signal_group", "start_ending"]

# How often a group being ended is looked at until it is gone or its deadline passes.
POLL_S = 0.02


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to the group; False once no process of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member that is not ours: nothing to do about it, but the group is not gone
    return True


def group_alive(pgid: int) -> bool:
    """Whether a member of the group still runs. A zombie does not: once its parent is gone it waits
    for init to reap it, which may take seconds, and it holds nothing."""
    if not signal_group(pgid, 0):
        return False
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == b"%d" % pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def start_ending(pgid: int) -> bool:
    """SIGTERM the group, and SIGCONT (a stopped member could not act on the SIGTERM); False when
    there was no group left to end."""
    if not signal_group(pgid, signal.SIGTERM):
        return False
    signal_group(pgid, signal.SIGCONT)
    return True


def end(pgid: int, deadline_s: float) -> None:
    """End the group, blocking: `start_ending`, then SIGKILL for what is left after `deadline_s`.
    The keeper's last act (`wrapper.launch.resident.Keeper`), run as its own `python -I -S`."""
    if not start_ending(pgid):
        return
    deadline = time.monotonic() + deadline_s
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            signal_group(pgid, signal.SIGKILL)
            return
        time.sleep(POLL_S)
