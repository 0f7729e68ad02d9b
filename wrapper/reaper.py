"""wrapper/reaper.py, run as a script: a harness's process group goes with its wrapper, even a SIGKILLed one.

`hctx wrap` starts it before the harness, in a process group of its own, holding the read end of a
pipe whose write end only the wrapper holds. The wrapper writes `group PGID` once the harness runs
and `done` once it has seen to that group itself. End of file without `done` (the wrapper exited
or was SIGKILLed) ends the group: SIGTERM and SIGCONT (a stopped member could not act on the
SIGTERM), then SIGKILL for whatever is left after the deadline.

A plain blocking loop on purpose: one pipe, one group, no other work, nothing to schedule.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence

__all__ = [
    "MAX_ORDERS_BYTES",
    "POLL_S",
    "end_group",
    "main",
    "read_orders",
]

POLL_S = 0.02
MAX_ORDERS_BYTES = 4096


def read_orders(fd: int) -> tuple[int | None, bool]:
    """Until end of file: the group to end, and whether the wrapper said it was done with it."""
    data = b""
    while chunk := os.read(fd, 512):
        data = (data + chunk)[-MAX_ORDERS_BYTES:]
    group: int | None = None
    done = False
    for line in data.splitlines():
        word, _, value = line.partition(b" ")
        if word == b"group" and value.isdigit() and int(value) > 1:
            group, done = int(value), False
        elif word == b"done":
            done = True
    return group, done


def _signal_group(pgid: int, signum: int) -> bool:
    """False once no process of the group is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member that is not ours: nothing to do about it, but the group is not gone
    return True


def end_group(pgid: int, deadline_s: float) -> bool:
    """SIGTERM the group, SIGKILL what is left after `deadline_s`; True if it took the SIGKILL."""
    if not _signal_group(pgid, signal.SIGTERM):
        return False
    _signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        if not _signal_group(pgid, 0):
            return False
    return _signal_group(pgid, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wrapper/reaper.py", description=__doc__)
    parser.add_argument("--lifeline-fd", type=int, required=True)
    parser.add_argument("--deadline", type=float, required=True, help="seconds from SIGTERM to SIGKILL")
    args = parser.parse_args(argv)
    # Not ours to act on: a Ctrl-C or hang-up meant for the session must not cut the watch short.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    group, done = read_orders(args.lifeline_fd)
    if group is not None and not done:
        end_group(group, args.deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
