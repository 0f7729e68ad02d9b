"""The wrapper's side of the sidecar: start it, notice it die, replace it, stop it.

A sidecar that dies while the harness runs is replaced for the same incarnation and channel (the
new one rebinds the socket path), after a back-off that grows while deaths come soon after starts
and ends in giving up, so a crash-looping sidecar cannot spin. Each death is one line in the agent's
log, and the stretch without a sidecar is kept in the claim (`unobserved`, shown by `hctx inspect`);
the terminal, which is the harness's, gets one line per incarnation and one more on giving up.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from guard.record import Harness
from guard.state import UNOBSERVED_LIMIT, HarnessState, Unobserved, update_claim
from guard.store import AgentDir, append_log_line

__all__ = [
    "SIDECAR_EXIT_TIMEOUT_S",
    "SIDECAR_READY_TIMEOUT_S",
    "SIDECAR_RESTART_DELAYS_S",
    "SIDECAR_STABLE_S",
    "Note",
    "SidecarSpec",
    "Sidecars",
    "checkout_env",
    "now_ms",
    "sidecar_restart_delay",
]

SIDECAR_READY_TIMEOUT_S = 10.0
SIDECAR_EXIT_TIMEOUT_S = 5.0
# The wait before each replacement while the sidecar keeps dying soon after its start; past the last
# the session runs unobserved. A sidecar that lived SIDECAR_STABLE_S starts the count afresh.
SIDECAR_RESTART_DELAYS_S = (0.25, 1.0, 4.0, 16.0)
SIDECAR_STABLE_S = 60.0

Note = Callable[[str], None]


def sidecar_restart_delay(quick_deaths: int) -> float | None:
    """The back-off before the next sidecar after `quick_deaths` quick deaths; None: give up."""
    return SIDECAR_RESTART_DELAYS_S[quick_deaths] if quick_deaths < len(SIDECAR_RESTART_DELAYS_S) else None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def checkout_env() -> dict[str, str]:
    """A child Python imports this checkout's packages even when hctx runs from a source tree."""
    root = os.fspath(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


@dataclass(frozen=True)
class SidecarSpec:
    """What every sidecar of one incarnation is started with."""

    agent: AgentDir
    harness: Harness
    incarnation: str
    channel: Path
    transport: str | None  # its JSON (`wrapper.harnesses.transport_json`)
    account: str | None = None  # the account the harness states, as JSON (`wrapper.harnesses.account_json`)
    record: Path | None = None  # `hctx wrap --record`'s file

    def argv(self, lifeline_fd: int, ready_fd: int) -> list[str]:
        agent = self.agent
        return [
            *(sys.executable, "-m", "sidecar", "--harness", self.harness),
            *("--catalog", os.fspath(agent.catalog), "--host", agent.host, "--agent", agent.identity),
            *("--incarnation", self.incarnation, "--channel", os.fspath(self.channel)),
            *("--lifeline-fd", str(lifeline_fd), "--ready-fd", str(ready_fd)),
            *(() if self.transport is None else ("--transport", self.transport)),
            *(() if self.account is None else ("--account", self.account)),
            *(() if self.record is None else ("--record", os.fspath(self.record))),
        ]


class Sidecars:
    """The incarnation's sidecar: one at a time, replaced while the harness runs."""

    def __init__(self, spec: SidecarSpec, note: Note) -> None:
        self.spec = spec
        self.note = note
        self.process: trio.Process | None = None
        self._lifeline: int | None = None  # the write end: closing it ends the sidecar
        self._started_at = 0.0
        self._told_terminal = False

    async def start(self) -> bool:
        """Start a sidecar; True once its channel listens, False if it did not in time."""
        lifeline_read, self._lifeline = os.pipe()
        ready_read, ready_write = os.pipe()
        try:
            self.process = await trio.lowlevel.open_process(
                self.spec.argv(lifeline_read, ready_write),
                pass_fds=(lifeline_read, ready_write),
                process_group=0,  # its own group: the terminal's Ctrl-C is the harness's, not the sidecar's
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=checkout_env(),
            )
        except BaseException:
            os.close(ready_read)
            self._close_lifeline()
            raise
        finally:
            os.close(lifeline_read)
            os.close(ready_write)
        self._started_at = trio.current_time()
        return await _wait_ready(ready_read)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def keep_alive(self) -> None:
        """Run beside the harness until cancelled: replace the sidecar each time it dies."""
        quick_deaths = 0
        while self.process is not None:
            returncode = await self.process.wait()
            pid, self.process = self.process.pid, None
            self._close_lifeline()
            if trio.current_time() - self._started_at >= SIDECAR_STABLE_S:
                quick_deaths = 0
            delay = sidecar_restart_delay(quick_deaths)
            quick_deaths += 1
            self._died(pid, returncode, delay)
            if delay is None:
                return
            await trio.sleep(delay)
            try:
                ready = await self.start()
            except OSError as exc:
                self.note(f"cannot start another sidecar ({exc}); the session runs unobserved from here")
                return
            if ready:
                self._record(lambda state: _close_gap(state, now_ms()))

    async def stop(self) -> None:
        """Close the lifeline (the sidecar drains what it has and exits); kill one that lingers."""
        self._close_lifeline()
        process, self.process = self.process, None
        if process is None:
            return
        with trio.move_on_after(SIDECAR_EXIT_TIMEOUT_S) as waited:
            await process.wait()
        if waited.cancelled_caught:
            self.note("the sidecar did not exit in time; killed")
            process.kill()
            await process.wait()

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def _died(self, pid: int, returncode: int, delay: float | None) -> None:
        gap = Unobserved(since_ms=now_ms(), sidecar_pid=pid, sidecar_exit=returncode)
        then = "giving up: the session runs unobserved" if delay is None else f"replacing it in {delay:g}s"
        self._log(pid, returncode, delay, f"sidecar died ({gap.how_it_ended()}); {then}")
        self._record(lambda state: _open_gap(state, gap))
        if delay is None:
            self.note(f"the sidecar keeps dying ({gap.how_it_ended()}); the session runs unobserved from here")
        elif not self._told_terminal:
            self._told_terminal = True  # later deaths go to the agent's log and the claim only
            self.note(f"the sidecar (pid {pid}) died ({gap.how_it_ended()}); replacing it (hctx inspect shows when)")

    def _log(self, pid: int, returncode: int, delay: float | None, message: str) -> None:
        agent = self.spec.agent
        stamp = time.time()
        line = {
            "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) + f",{int(stamp * 1000) % 1000:03d}",
            "level": "WARNING",
            "logger": "wrapper",
            "message": message,
            "event": "sidecar-died",
            "pid": pid,
            "returncode": returncode,
            "incarnation": self.spec.incarnation,
            "retryInS": delay,
            "agent": agent.identity,
            "host": agent.host,
        }
        with contextlib.suppress(OSError):  # a full disk: the claim and the terminal still say it
            append_log_line(agent.catalog, agent.host, agent.identity, (json.dumps(line) + "\n").encode())

    def _record(self, change: Callable[[HarnessState], HarnessState]) -> None:
        with contextlib.suppress(OSError):  # a full disk: the log and the terminal still say it
            update_claim(self.spec.agent, self.spec.incarnation, change)


def _open_gap(state: HarnessState, gap: Unobserved) -> HarnessState:
    return state.model_copy(update={"unobserved": [*state.unobserved, gap][-UNOBSERVED_LIMIT:]})


def _close_gap(state: HarnessState, until_ms: int) -> HarnessState:
    gaps = state.unobserved
    if not gaps or gaps[-1].until_ms is not None:
        return state
    closed = gaps[-1].model_copy(update={"until_ms": until_ms})
    return state.model_copy(update={"unobserved": [*gaps[:-1], closed]})


async def _wait_ready(ready_read: int) -> bool:
    with trio.move_on_after(SIDECAR_READY_TIMEOUT_S):
        async with trio.lowlevel.FdStream(ready_read) as stream:
            return await stream.receive_some(16) == b"ready\n"
    return False
