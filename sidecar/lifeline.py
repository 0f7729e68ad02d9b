"""The wrapper's lifeline, and the duty it carries: the harness's group goes with its wrapper.

The wrapper holds the only write end of a pipe whose read end each sidecar inherits. End of file
means the wrapper is gone. On it, the wrapper writes orders, one per line:

- `group PGID DEADLINE`: the harness runs in that process group;
- `done`: the wrapper saw to that group itself (it ends a harness's own group at the harness's end,
  and never the terminal's job it shares with the harness while it lives).

End of file after a `group` with no `done` since means the wrapper vanished (SIGKILLed, OOM-killed)
and left the harness behind: the sidecar ends that group, SIGTERM and SIGCONT (a stopped member
could not act on the SIGTERM), then SIGKILL for whatever is left after DEADLINE seconds. So no
process of its own watches the wrapper; between a dead sidecar and its replacement the harness
still has its death signal (PR_SET_PDEATHSIG, set by the wrapper) for a SIGKILLed wrapper.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

import trio

from guard.groups import POLL_S, group_alive, signal_group, start_ending

__all__ = [
    "MAX_ORDERS_BYTES",
    "Orders",
    "end_group",
    "follow",
]

MAX_ORDERS_BYTES = 4096


@dataclass
class Orders:
    """What the wrapper said: the group to end (and its deadline) unless it said `done`."""

    group: int | None = None
    deadline_s: float = 3.0
    done: bool = False
    _partial: bytes = b""

    def receive_data(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-MAX_ORDERS_BYTES:]
        for line in lines:
            word, *values = line.split()[:3] or [b""]
            if word == b"group" and values and values[0].isdigit() and int(values[0]) > 1:
                self.group, self.done = int(values[0]), False
                with contextlib.suppress(IndexError, ValueError):
                    self.deadline_s = min(max(float(values[1]), 0.0), 60.0)
            elif word == b"done":
                self.done = True

    @property
    def group_left(self) -> int | None:
        """The group to end now that the wrapper is gone, if any."""
        return None if self.done else self.group


async def follow(fd: int) -> Orders:
    """The wrapper's orders, once the lifeline reaches end of file (the wrapper exited or died)."""
    orders = Orders()
    os.set_blocking(fd, False)
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not data:
            return orders
        orders.receive_data(data)


async def end_group(pgid: int, deadline_s: float) -> bool:
    """SIGTERM the group, SIGKILL what is left after `deadline_s`; True if it took the SIGKILL."""
    if not start_ending(pgid):
        return False
    with trio.move_on_after(deadline_s):
        while group_alive(pgid):  # noqa: ASYNC110 - a process group has no event to await
            await trio.sleep(POLL_S)
        return False
    return signal_group(pgid, signal.SIGKILL)
