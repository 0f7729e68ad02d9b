"""The records of the wrapper's side of the sidecar: a death, and the replacement that came up.

The resident (wrapper/launch/resident.py) starts the sidecar, notices it die and replaces it; these are the
steps it runs for the two moments that change the claim (`python -m wrapper.launch.launcher sidecar-died`
and `sidecar-back`). Each death is one line in the agent's log, and the stretch without a sidecar
is kept in the claim (`unobserved`, shown by `hctx inspect`); the terminal, which is the harness's,
gets one line per incarnation and one more on giving up.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

from guard.layout import AgentDir
from guard.state import UNOBSERVED_LIMIT, HarnessState, Unobserved, update_claim
from guard.store import append_log_line
from wrapper.launch.loop import say
from wrapper.launch.resident import (
    SIDECAR_EXIT_TIMEOUT_S,
    SIDECAR_READY_TIMEOUT_S,
    SIDECAR_RESTART_DELAYS_S,
    SIDECAR_STABLE_S,
    sidecar_restart_delay,
)

__all__ = [
    "SIDECAR_EXIT_TIMEOUT_S",
    "SIDECAR_READY_TIMEOUT_S",
    "SIDECAR_RESTART_DELAYS_S",
    "SIDECAR_STABLE_S",
    "now_ms",
    "record_death",
    "record_recovery",
    "sidecar_restart_delay",
]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def record_death(
    agent: AgentDir,
    incarnation: str,
    pid: int,
    returncode: int,
    delay: float | None,
    *,
    tell_terminal: bool,
    died_at_ms: int,
) -> None:
    """The sidecar `pid` died (at `died_at_ms`, as the resident saw it): a line in the
    agent's log, a gap opened in the claim, and on the terminal the first death of the incarnation
    and the giving up. The step that records it may run after the replacement is up, so the gap's
    start is the death's time, never the step's."""
    gap = Unobserved(since_ms=died_at_ms, sidecar_pid=pid, sidecar_exit=returncode)
    then = "giving up: the session runs unobserved" if delay is None else f"replacing it in {delay:g}s"
    _log(agent, incarnation, pid, returncode, delay, f"sidecar died ({gap.how_it_ended()}); {then}")
    _record(agent, incarnation, lambda state: _open_gap(state, gap))
    if not tell_terminal:
        return
    if delay is None:
        say(f"the sidecar keeps dying ({gap.how_it_ended()}); the session runs unobserved from here")
    else:
        say(f"the sidecar (pid {pid}) died ({gap.how_it_ended()}); replacing it (hctx inspect shows when)")


def record_recovery(agent: AgentDir, incarnation: str, until_ms: int) -> None:
    """A replacement sidecar listens: the open gap ends at `until_ms`."""
    _record(agent, incarnation, lambda state: _close_gap(state, until_ms))


def _log(agent: AgentDir, incarnation: str, pid: int, returncode: int, delay: float | None, message: str) -> None:
    stamp = time.time()
    line = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) + f",{int(stamp * 1000) % 1000:03d}",
        "level": "WARNING",
        "logger": "wrapper",
        "message": message,
        "event": "sidecar-died",
        "pid": pid,
        "returncode": returncode,
        "incarnation": incarnation,
        "retryInS": delay,
        "agent": agent.identity,
        "host": agent.host,
    }
    with contextlib.suppress(OSError):  # a full disk: the claim and the terminal still say it
        append_log_line(agent.catalog, agent.host, agent.identity, (json.dumps(line) + "\n").encode())


def _record(agent: AgentDir, incarnation: str, change: Callable[[HarnessState], HarnessState]) -> None:
    with contextlib.suppress(OSError):  # a full disk: the log and the terminal still say it
        update_claim(agent, incarnation, change)


def _open_gap(state: HarnessState, gap: Unobserved) -> HarnessState:
    return state.model_copy(update={"unobserved": [*state.unobserved, gap][-UNOBSERVED_LIMIT:]})


def _close_gap(state: HarnessState, until_ms: int) -> HarnessState:
    gaps = state.unobserved
    if not gaps or gaps[-1].until_ms is not None:
        return state
    closed = gaps[-1].model_copy(update={"until_ms": until_ms})
    return state.model_copy(update={"unobserved": [*gaps[:-1], closed]})
