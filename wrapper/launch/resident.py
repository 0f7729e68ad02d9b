"""The part of `hctx wrap` that stays: the standard library only, run as `python -I -S` (see below).

`hctx wrap` claims the agent and prepares the launch with everything it needs (pydantic, the
registry), then replaces itself with this module (`exec`: the same pid, so the claim's wrapper pid
and start time stay true). What holds the terminal and the harness for hours is a plain selector
loop with nothing else loaded: a few megabytes, where a trio process costs three times that.

It runs the incarnation the claim named, and the ones a restart policy asks for:

- the harness, in the group `harness_group` picks, with a death signal should this process vanish;
- signals: SIGINT, SIGTERM and SIGHUP go to the harness (its whole group when it has its own), stop
  further relaunches, and after a SIGTERM or SIGHUP the harness has HARNESS_KILL_DEADLINE_S before
  SIGKILL. A signal that comes while no harness runs is owed to the next one, so it is never lost;
- the sidecar (`python -m sidecar`), in a group of its own, replaced while the harness runs if it
  dies, with a back-off that ends in giving up (SIDECAR_RESTART_DELAYS_S);
- the harness's stdout tap, for a harness that speaks on stdout (`Tap`);
- the reaper's duty, twice: the sidecar holds this process's lifeline, is told the harness's group
  (`group PGID DEADLINE`) and, when the lifeline ends without `done` (this process was SIGKILLed),
  ends that group; and a keeper (`Keeper`, a shell blocked on a pipe) does the same should this
  process and its sidecar be killed together. When this process ends a harness's own group itself
  (at its exit), it says `done` to both.

The agent's wrapper lock (`guard.state.AgentLock`, what `--takeover` proves a wrapper by) comes
across the exec as the same open file, so the claim's pid holds it until this process ends; a
relaunch's claim runs under it (`WrapperLock`).

The rare steps that need the claim or the registry (a relaunch's claim and launch plan, a launch's
teardown, the record of a dead sidecar, the final `stopped`) run in a short-lived
`python -m wrapper.launch.launcher STEP` (`Steps`), one at a time, in order.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import marshal
import os
import select
import sys
import time

from guard.errors import Unusable  # a module that imports nothing: the resident stays the standard library

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the typing module is not worth its import here
    import signal
    from collections.abc import Callable, Sequence
    from typing import Any
else:
    import _signal as signal  # `signal` without its enum module: the same functions, plain int constants

__all__ = [
    "ADOPT_SEND_TIMEOUT_S",
    "HARNESS_KILL_DEADLINE_S",
    "KEEPER_END",
    "KEEPER_RESTART_S",
    "KEEPER_SCRIPT",
    "READ",
    "SIDECAR_EXIT_TIMEOUT_S",
    "SIDECAR_READY_TIMEOUT_S",
    "SIDECAR_RESTART_DELAYS_S",
    "SIDECAR_STABLE_S",
    "STEP_NICENESS",
    "STEP_TIMEOUT_S",
    "STOP_SIGNALS",
    "TAP_QUEUE_BYTES",
    "TAP_RECONNECT_S",
    "WRITE",
    "Adoption",
    "AgentRef",
    "Begin",
    "Incarnation",
    "Keeper",
    "Loop",
    "Options",
    "Plan",
    "Session",
    "SidecarBack",
    "SidecarDied",
    "Sidecars",
    "Spec",
    "SpecError",
    "Step",
    "Steps",
    "Stopped",
    "Tap",
    "TapQueue",
    "Teardown",
    "WrapperLock",
    "adopt_supervise",
    "checkout_env",
    "end_group",
    "exit_status",
    "harness_group",
    "main",
    "prog",
    "run_incarnation",
    "run_tap",
    "say",
    "send_lines",
    "sidecar_argv",
    "sidecar_restart_delay",
    "spawn",
    "supervise",
    "suppress",
    "terminal_delivers_sigint",
    "watch_adopted",
]

# From the SIGTERM (or SIGHUP) a harness is sent to the SIGKILL of whatever of its group is left.
HARNESS_KILL_DEADLINE_S = 3.0
SIDECAR_READY_TIMEOUT_S = 10.0
SIDECAR_EXIT_TIMEOUT_S = 5.0
# The wait before each replacement while the sidecar keeps dying soon after its start; past the last
# the session runs unobserved. A sidecar that lived SIDECAR_STABLE_S starts the count afresh.
SIDECAR_RESTART_DELAYS_S = (0.25, 1.0, 4.0, 16.0)
SIDECAR_STABLE_S = 60.0
TAP_QUEUE_BYTES = 4 * 1024 * 1024
TAP_RECONNECT_S = 0.5
# The keeper (`Keeper`): a shell that reads its stdin to the end and, when the last line is a
# process group (not `done`), becomes its arguments and that group: `python -I -S -c KEEPER_END ROOT
# DEADLINE PGID`.
KEEPER_SCRIPT = (
    'while IFS= read -r line; do said=$line; done; case $said in ""|*[!0-9]*) ;; *) exec "$@" "$said";; esac'
)
KEEPER_END = (
    "import sys; sys.path[0] = sys.argv.pop(1); from guard.groups import end; end(int(sys.argv[2]), float(sys.argv[1]))"
)
KEEPER_RESTART_S = 1.0
# A step (`python -m wrapper.launch.launcher STEP`) that takes longer than this is killed and reported.
STEP_TIMEOUT_S = 60.0
# The niceness of the bookkeeping steps (all but a relaunch's `begin`, which the session waits on):
# they yield the CPU to the sidecar draining beside them (it has SIDECAR_EXIT_TIMEOUT_S) and to the
# harness. A step's interpreter with pydantic costs three times a sidecar's exit, and a fleet
# stopped at once would otherwise spend the sidecars' deadline starting them.
STEP_NICENESS = 10
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
# The folder `wrapper` and `guard` are in (site-packages, or a checkout), for child interpreters.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- the launcher -> resident spec --------------------------------------------------------------
# Typed here, beside its one reader: plain classes (dataclasses would bring inspect and re into this
# process, a megabyte), carried in `marshal` as dicts of plain values and checked field by field on
# read, so a spec from another hctx version is a clear refusal, never a KeyError mid-session.


class SpecError(Unusable):
    """A spec (or a step's answer) that is not one this resident can run; the message says which field."""


def _field(data: object, key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise SpecError(f"{where}: no {key!r}")
    value = data[key]
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):  # a bool is an int
        raise SpecError(f"{where}: {key!r} is {type(value).__name__}")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise SpecError(f"{where}: not a list of strings")
    return tuple(value)


class AgentRef:
    """The agent an incarnation runs as (`guard.catalog.AgentDir`'s three names)."""

    __slots__ = ("catalog", "host", "identity")

    def __init__(self, catalog: str, host: str, identity: str) -> None:
        self.catalog, self.host, self.identity = catalog, host, identity

    def to_wire(self) -> dict[str, object]:
        return {"catalog": self.catalog, "host": self.host, "identity": self.identity}

    @classmethod
    def from_wire(cls, data: object) -> AgentRef:
        return cls(*(_field(data, key, str, "agent") for key in ("catalog", "host", "identity")))


class Options:
    """`hctx wrap`'s options the resident keeps for its relaunches (`wrapper.launch.launcher.WrapOptions`)."""

    __slots__ = (
        "agent",
        "argv",
        "harness",
        "heartbeat_s",
        "max_restarts",
        "record",
        "record_raw",
        "restart",
        "restart_delay_max_s",
        "restart_delay_s",
        "takeover",
    )

    def __init__(
        self,
        agent: AgentRef,
        harness: str,
        argv: tuple[str, ...],
        restart: str,
        max_restarts: int | None,
        restart_delay_s: float,
        restart_delay_max_s: float,
        takeover: bool,
        record: str | None,
        record_raw: bool = False,
        heartbeat_s: int | None = None,
    ) -> None:
        self.agent, self.harness, self.argv, self.restart = agent, harness, argv, restart
        self.max_restarts, self.restart_delay_s, self.restart_delay_max_s = (
            max_restarts,
            restart_delay_s,
            restart_delay_max_s,
        )
        self.takeover, self.record, self.record_raw = takeover, record, record_raw
        self.heartbeat_s = heartbeat_s  # HCTX_HEARTBEAT_S, checked by `hctx wrap`: each sidecar's heartbeat

    def to_wire(self) -> dict[str, object]:
        return {
            "agent": self.agent.to_wire(),
            "harness": self.harness,
            "argv": list(self.argv),
            "restart": self.restart,
            "maxRestarts": self.max_restarts,
            "restartDelayS": self.restart_delay_s,
            "restartDelayMaxS": self.restart_delay_max_s,
            "takeover": self.takeover,
            "record": self.record,
            "recordRaw": self.record_raw,
            "heartbeatS": self.heartbeat_s,
        }

    @classmethod
    def from_wire(cls, data: object) -> Options:
        where = "options"
        restart = _field(data, "restart", str, where)
        if restart not in ("no", "on-failure", "always"):
            raise SpecError(f"{where}: restart {restart!r}")
        return cls(
            AgentRef.from_wire(_field(data, "agent", dict, where)),
            _field(data, "harness", str, where),
            _strings(_field(data, "argv", (list, tuple), where), where + ".argv"),
            restart,
            _field(data, "maxRestarts", (int, type(None)), where),
            float(_field(data, "restartDelayS", (int, float), where)),
            float(_field(data, "restartDelayMaxS", (int, float), where)),
            _field(data, "takeover", bool, where),
            _field(data, "record", (str, type(None)), where),
            _field(data, "recordRaw", bool, where),
            _field(data, "heartbeatS", (int, type(None)), where),
        )


class Plan:
    """A prepared launch (`sidecar.launch.LaunchPlan`, as far as the resident runs it)."""

    __slots__ = ("argv", "cwd", "env", "owner", "tap", "teardown")

    def __init__(
        self, argv: tuple[str, ...], cwd: str, env: dict[str, str], tap: str | None, teardown: bool, owner: int
    ) -> None:
        self.argv, self.cwd, self.env, self.tap, self.teardown, self.owner = argv, cwd, env, tap, teardown, owner

    def to_wire(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "tap": self.tap,
            "teardown": self.teardown,
            "owner": self.owner,
        }

    @classmethod
    def from_wire(cls, data: object) -> Plan:
        where = "plan"
        env = _field(data, "env", dict, where)
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in env.items()):
            raise SpecError(f"{where}: env holds a name or value that is not a string")
        return cls(
            _strings(_field(data, "argv", (list, tuple), where), where + ".argv"),
            _field(data, "cwd", str, where),
            env,
            _field(data, "tap", (str, type(None)), where),
            _field(data, "teardown", bool, where),
            _field(data, "owner", int, where),
        )


class Incarnation:
    """The claimed incarnation as the resident runs it (`wrapper.launch.launcher.begin_incarnation`):
    its prepared launch and channel, or, when the launch could not be prepared, the status it ends with.
    `record_fd`, `record_raw` and `heartbeat_s` (`--record`'s open file, `--record-raw`,
    HCTX_HEARTBEAT_S) are the resident's to set: they come with the spec once, not with each
    incarnation."""

    __slots__ = (
        "account",
        "agent",
        "channel",
        "channel_dir",
        "harness",
        "heartbeat_s",
        "incarnation",
        "plan",
        "record_fd",
        "record_raw",
        "status",
        "transport",
    )

    def __init__(
        self,
        agent: AgentRef,
        harness: str,
        incarnation: str,
        plan: Plan | None = None,
        status: int | None = 2,
        transport: str | None = None,
        account: str | None = None,
        channel_dir: str = "",
        channel: str = "",
    ) -> None:
        self.agent, self.harness, self.incarnation, self.plan, self.status = agent, harness, incarnation, plan, status
        self.transport, self.account = transport, account
        self.channel_dir, self.channel = channel_dir, channel
        self.record_fd: int | None = None
        self.record_raw = False
        self.heartbeat_s: int | None = None

    def to_wire(self) -> dict[str, object]:
        return {
            "agent": self.agent.to_wire(),
            "harness": self.harness,
            "incarnation": self.incarnation,
            "plan": None if self.plan is None else self.plan.to_wire(),
            "status": self.status,
            "transport": self.transport,
            "account": self.account,
            "channelDir": self.channel_dir,
            "channel": self.channel,
        }

    @classmethod
    def from_wire(cls, data: object) -> Incarnation:
        where = "incarnation"
        plan = _field(data, "plan", (dict, type(None)), where)
        status = _field(data, "status", (int, type(None)), where)
        if (plan is None) == (status is None):
            raise SpecError(f"{where}: a plan and a status, or neither")
        return cls(
            AgentRef.from_wire(_field(data, "agent", dict, where)),
            _field(data, "harness", str, where),
            _field(data, "incarnation", str, where),
            None if plan is None else Plan.from_wire(plan),
            status,
            _field(data, "transport", (str, type(None)), where),
            _field(data, "account", (str, type(None)), where),
            _field(data, "channelDir", str, where),
            _field(data, "channel", str, where),
        )


class Adoption:
    """A harness this resident adopted (`hctx adopt`, wrapper.launch.adopt) rather than launched: the
    process it watches (its pid and start time in clock ticks since boot, which together name one
    process) and the channel lines the trigger could not deliver before the sidecar listened."""

    __slots__ = ("pending", "pid", "start_ticks")

    def __init__(self, pid: int, start_ticks: int, pending: bytes = b"") -> None:
        self.pid, self.start_ticks, self.pending = pid, start_ticks, pending

    def to_wire(self) -> dict[str, object]:
        return {"pid": self.pid, "startTicks": self.start_ticks, "pending": self.pending}

    @classmethod
    def from_wire(cls, data: object) -> Adoption:
        where = "adoption"
        return cls(_field(data, "pid", int, where), _field(data, "startTicks", int, where),
                   _field(data, "pending", bytes, where))  # fmt: skip


class Spec:
    """What `hctx wrap` (or `hctx adopt`, with `adoption`) hands the resident across its exec."""

    __slots__ = ("adoption", "incarnation", "lock_fd", "lock_held", "options", "record_fd")

    def __init__(
        self,
        options: Options,
        incarnation: Incarnation,
        lock_fd: int,
        lock_held: bool,
        record_fd: int | None = None,
        adoption: Adoption | None = None,
    ) -> None:
        self.options, self.incarnation, self.lock_fd, self.lock_held = options, incarnation, lock_fd, lock_held
        self.record_fd = record_fd  # `--record`'s file, open: every sidecar of every incarnation gets it
        self.adoption = adoption

    def dumps(self) -> bytes:
        return marshal.dumps(
            {
                "options": self.options.to_wire(),
                "incarnation": self.incarnation.to_wire(),
                "lockFd": self.lock_fd,
                "lockHeld": self.lock_held,
                "recordFd": self.record_fd,
                "adoption": None if self.adoption is None else self.adoption.to_wire(),
            }
        )

    @classmethod
    def loads(cls, data: bytes) -> Spec:
        try:
            wire = marshal.loads(data)
        except (EOFError, ValueError, TypeError) as exc:
            raise SpecError(f"not a spec: {exc}") from None
        return cls(
            Options.from_wire(_field(wire, "options", dict, "spec")),
            Incarnation.from_wire(_field(wire, "incarnation", dict, "spec")),
            _field(wire, "lockFd", int, "spec"),
            _field(wire, "lockHeld", bool, "spec"),
            _field(wire, "recordFd", (int, type(None)), "spec"),
            None if (adopted := _field(wire, "adoption", (dict, type(None)), "spec")) is None
            else Adoption.from_wire(adopted),
        )  # fmt: skip


# --- the resident -> step payloads (`python -m wrapper.launch.launcher STEP`), typed the same way ----------


class Step:
    """A step's payload; `name` is the step `wrapper.launch.launcher` runs with it."""

    __slots__ = ()
    name = ""

    def to_wire(self) -> dict[str, object]:
        raise NotImplementedError


class Begin(Step):
    """A relaunch: claim the agent again and prepare; the answer is an `Incarnation`."""

    __slots__ = ("options", "relaunch_of", "restarts")
    name = "begin"

    def __init__(self, options: Options, restarts: int, relaunch_of: str) -> None:
        self.options, self.restarts, self.relaunch_of = options, restarts, relaunch_of

    def to_wire(self) -> dict[str, object]:
        return {"options": self.options.to_wire(), "restarts": self.restarts, "relaunchOf": self.relaunch_of}

    @classmethod
    def from_wire(cls, data: object) -> Begin:
        return cls(Options.from_wire(_field(data, "options", dict, "begin")), _field(data, "restarts", int, "begin"),
                   _field(data, "relaunchOf", str, "begin"))  # fmt: skip


class Teardown(Step):
    """What a launch's `prepare` left behind, to undo."""

    __slots__ = ("harness", "plan")
    name = "teardown"

    def __init__(self, plan: Plan, harness: str) -> None:
        self.plan, self.harness = plan, harness

    def to_wire(self) -> dict[str, object]:
        return {"plan": self.plan.to_wire(), "harness": self.harness}

    @classmethod
    def from_wire(cls, data: object) -> Teardown:
        return cls(Plan.from_wire(_field(data, "plan", dict, "teardown")), _field(data, "harness", str, "teardown"))


class Stopped(Step):
    """The claim's final `stopped`."""

    __slots__ = ("agent", "incarnation")
    name = "stopped"

    def __init__(self, agent: AgentRef, incarnation: str) -> None:
        self.agent, self.incarnation = agent, incarnation

    def to_wire(self) -> dict[str, object]:
        return {"agent": self.agent.to_wire(), "incarnation": self.incarnation}

    @classmethod
    def from_wire(cls, data: object) -> Stopped:
        return cls(AgentRef.from_wire(_field(data, "agent", dict, "stopped")),
                   _field(data, "incarnation", str, "stopped"))  # fmt: skip


class SidecarDied(Step):
    """A sidecar died while its harness ran: the log line, the claim's gap, maybe a terminal line."""

    __slots__ = ("agent", "died_at_ms", "incarnation", "pid", "retry_in_s", "returncode", "tell_terminal")
    name = "sidecar-died"

    def __init__(self, agent: AgentRef, incarnation: str, pid: int, returncode: int, retry_in_s: float | None,
                 tell_terminal: bool, died_at_ms: int) -> None:  # fmt: skip
        self.agent, self.incarnation, self.pid, self.returncode = agent, incarnation, pid, returncode
        self.retry_in_s, self.tell_terminal, self.died_at_ms = retry_in_s, tell_terminal, died_at_ms

    def to_wire(self) -> dict[str, object]:
        return {"agent": self.agent.to_wire(), "incarnation": self.incarnation, "pid": self.pid,
                "returncode": self.returncode, "retryInS": self.retry_in_s, "tellTerminal": self.tell_terminal,
                "diedAtMs": self.died_at_ms}  # fmt: skip

    @classmethod
    def from_wire(cls, data: object) -> SidecarDied:
        where = "sidecar-died"
        retry = _field(data, "retryInS", (int, float, type(None)), where)
        return cls(AgentRef.from_wire(_field(data, "agent", dict, where)), _field(data, "incarnation", str, where),
                   _field(data, "pid", int, where), _field(data, "returncode", int, where),
                   None if retry is None else float(retry), _field(data, "tellTerminal", bool, where),
                   _field(data, "diedAtMs", int, where))  # fmt: skip


class SidecarBack(Step):
    """A replacement is ready: the claim's gap closes."""

    __slots__ = ("agent", "incarnation", "until_ms")
    name = "sidecar-back"

    def __init__(self, agent: AgentRef, incarnation: str, until_ms: int) -> None:
        self.agent, self.incarnation, self.until_ms = agent, incarnation, until_ms

    def to_wire(self) -> dict[str, object]:
        return {"agent": self.agent.to_wire(), "incarnation": self.incarnation, "untilMs": self.until_ms}

    @classmethod
    def from_wire(cls, data: object) -> SidecarBack:
        where = "sidecar-back"
        return cls(AgentRef.from_wire(_field(data, "agent", dict, where)), _field(data, "incarnation", str, where),
                   _field(data, "untilMs", int, where))  # fmt: skip


READ = select.EPOLLIN
WRITE = select.EPOLLOUT


class suppress:
    """contextlib.suppress, which would bring collections, functools and types along (a megabyte)."""

    def __init__(self, *kinds: type[BaseException]) -> None:
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, self.kinds)


# Who speaks in `say`'s lines: `hctx adopt`'s resident says so (its stderr is the adoption log).
prog = ["hctx wrap"]


def say(message: str) -> None:
    """One line on the terminal; one it cannot take now (a full pipe, output suspended) is lost, never
    the session."""
    with suppress(OSError):
        print(f"{prog[0]}: {message}", file=sys.stderr, flush=True)


def exit_status(returncode: int) -> int:
    """The shell's convention: a harness killed by signal N exits the wrapper with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def sidecar_restart_delay(quick_deaths: int) -> float | None:
    """The back-off before the next sidecar after `quick_deaths` quick deaths; None: give up."""
    return SIDECAR_RESTART_DELAYS_S[quick_deaths] if quick_deaths < len(SIDECAR_RESTART_DELAYS_S) else None


def checkout_env() -> dict[str, str]:
    """A child Python imports this checkout's packages even when hctx runs from a source tree."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ) | {"PYTHONPATH": _ROOT if not path else f"{_ROOT}{os.pathsep}{path}"}


class Loop:
    """Readiness callbacks on file descriptors and timers, and nothing else: `run_until` sleeps in
    one `select` until a descriptor is ready or the next timer is due, so an idle session costs no
    wake-ups at all."""

    def __init__(self) -> None:
        self.epoll = select.epoll()  # selectors' own choice here, without its imports
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._timers: list[tuple[float, int, list[Any]]] = []
        self._order = itertools.count()

    def watch(self, fd: int, events: int, callback: Callable[[], None]) -> None:
        self.epoll.register(fd, events)
        self._callbacks[fd] = callback

    def unwatch(self, fd: int) -> None:
        if self._callbacks.pop(fd, None) is not None:
            with suppress(OSError):
                self.epoll.unregister(fd)

    def call_later(self, delay: float, callback: Callable[[], None]) -> list[Any]:
        """A timer; `cancel` it with the handle returned."""
        handle: list[Any] = [callback]
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), handle))
        return handle

    @staticmethod
    def cancel(handle: list[Any] | None) -> None:
        if handle is not None:
            handle[0] = None

    def run_until(self, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Serve callbacks until `done()`; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                callback = heapq.heappop(self._timers)[2][0]
                if callback is not None:
                    callback()
            if done():
                break
            if deadline is not None and now >= deadline:
                return False
            wakes = [when for when, _, handle in self._timers[:1] if handle[0] is not None]
            if deadline is not None:
                wakes.append(deadline)
            wait = max(0.0, min(wakes) - now) if wakes else -1
            for fd, _ in self.epoll.poll(wait):
                callback = self._callbacks.get(fd)
                if callback is not None:  # an earlier callback of this batch may have unwatched it
                    callback()
        return True

    def watch_exit(self, pid: int, exited: Callable[[int], None]) -> None:
        """`exited(returncode)` once the child `pid` ends (reaped here), as subprocess reports it."""
        pidfd = os.pidfd_open(pid)

        def readable() -> None:
            self.unwatch(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            exited(os.waitstatus_to_exitcode(status))

        self.watch(pidfd, READ, readable)


def spawn(
    argv: Sequence[str],
    env: dict[str, str],
    *,
    cwd: str | None = None,
    new_group: bool = False,
    keep: Sequence[int] = (),
    stdin: int | None = None,
    stdout: int | None = None,
    death_signal: bool = False,
    niceness: int = 0,
    forked: Callable[[int], None] | None = None,
) -> int:
    """Fork and exec `argv` (found on PATH), as subprocess would: default signal dispositions, only
    0-2 and `keep` inherited; an OSError here when the exec fails. `death_signal`: the child gets
    SIGTERM should this process die first (the death signal follows the forking thread, and this
    process has only the one). `forked(pid)` is called at once, the child's group (`new_group`)
    made already, before its exec is waited for."""
    error_read, error_write = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return
        try:
            signal.set_wakeup_fd(-1)
            for signum in (*STOP_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            if new_group:
                os.setpgid(0, 0)
            if niceness:
                os.nice(niceness)
            if death_signal:
                import ctypes  # in the child alone: the resident never pays for it

                ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # this process died before the death signal was set
                    os._exit(128 + signal.SIGTERM)
            for source, target in ((stdin, 0), (stdout, 1)):
                if source is not None:
                    os.dup2(source, target)
            for fd in keep:
                os.set_inheritable(fd, True)
            low = 3
            for fd in sorted({*keep, error_write}):
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 1 << 20)
            if cwd is not None:
                os.chdir(cwd)
            os.execvpe(argv[0], list(argv), env)
        except OSError as exc:
            os.write(error_write, f"{exc.errno}:{exc.strerror}".encode())
        finally:
            os._exit(127)
    os.close(error_write)
    if new_group:
        with suppress(OSError):  # the child's own setpgid, or its exec, came first
            os.setpgid(pid, pid)
    if forked is not None:
        forked(pid)
    with os.fdopen(error_read, "rb") as errors:
        failure = errors.read()
    if failure:
        os.waitpid(pid, 0)
        number, _, text = failure.decode().partition(":")
        failed = OSError(int(number), text)  # the child's own exec error, as subprocess re-raises it
        raise failed
    return pid


class Steps:
    """`python -m wrapper.launch.launcher STEP`, one at a time and in order: a step that needs the claim or
    the registry (pydantic and the rest, which this process never imports). The payload goes on its
    stdin and its answer comes on its stdout, both in `marshal` (the same interpreter on both ends,
    and a module the interpreter has built in, where `json` would cost this process a megabyte)."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.queue: list[tuple[Step, Callable[[bytes, int], None] | None]] = []
        self.running = False

    def submit(self, step: Step, done: Callable[[bytes, int], None] | None = None) -> None:
        self.queue.append((step, done))
        if not self.running:
            self._next()

    def run(self, step: Step) -> tuple[bytes, int]:
        """Run `step` after those queued; its stdout and exit status once it is done."""
        result: list[tuple[bytes, int]] = []
        self.submit(step, lambda out, status: result.append((out, status)))
        self.loop.run_until(lambda: bool(result))
        return result[0]

    def drain(self) -> None:
        self.loop.run_until(lambda: not self.running)

    def _next(self) -> None:
        if not self.queue:
            self.running = False
            return
        self.running = True
        step, done = self.queue.pop(0)
        out_read, out_write = os.pipe2(os.O_CLOEXEC)
        payload_fd = os.memfd_create("hctx-step", os.MFD_CLOEXEC)  # the step's stdin
        os.write(payload_fd, marshal.dumps(step.to_wire()))
        os.lseek(payload_fd, 0, os.SEEK_SET)
        argv = [sys.executable, "-m", "wrapper.launch.launcher", step.name]
        try:
            pid = spawn(argv, checkout_env(), stdin=payload_fd, stdout=out_write,
                        niceness=0 if isinstance(step, Begin) else STEP_NICENESS)  # fmt: skip
        except OSError as exc:
            os.close(out_read)
            say(f"cannot run the {step.name} step ({exc.strerror or exc})")
            self._finished(done, b"", 127)
            return
        finally:
            os.close(out_write)
            os.close(payload_fd)
        output = bytearray()
        open_fds = [out_read]
        os.set_blocking(out_read, False)

        def readable() -> None:
            while open_fds:
                try:
                    chunk = os.read(out_read, 65536)
                except BlockingIOError:
                    return
                if not chunk:
                    self.loop.unwatch(out_read)
                    os.close(open_fds.pop())
                    return
                output.extend(chunk)

        def timed_out() -> None:
            say(f"the {step.name} step took over {STEP_TIMEOUT_S:g}s; killed")
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

        timer = self.loop.call_later(STEP_TIMEOUT_S, timed_out)

        def exited(status: int) -> None:
            Loop.cancel(timer)
            readable()  # what is left in the pipe (a child of the step may hold it open: not waited for)
            if open_fds:
                self.loop.unwatch(out_read)
                os.close(open_fds.pop())
            self._finished(done, bytes(output), status)

        self.loop.watch(out_read, READ, readable)
        self.loop.watch_exit(pid, exited)

    def _finished(self, done: Callable[[bytes, int], None] | None, output: bytes, status: int) -> None:
        if done is not None:
            done(output, status)
        self._next()


def _open_terminal() -> int | None:
    try:
        return os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None


def terminal_delivers_sigint() -> bool:
    """True when Ctrl-C on our terminal reaches the harness directly (we share its foreground group).

    Asked of the controlling terminal itself: stdin may be a pipe (a client driving an app-server)
    while the terminal still delivers Ctrl-C to the whole foreground group.
    """
    tty = _open_terminal()
    if tty is None:
        return False  # no controlling terminal: whoever sent SIGINT sent it to us alone
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)


def harness_group() -> str:
    """Which process group the harness runs in, and so which group goes with its session.

    - "own": no controlling terminal. A group of its own: every signal and the final kill reach all
      of it (a harness behind `sh`, its children) and nothing else.
    - "wrapper's": a terminal, and the wrapper leads its group (the shell's job). The harness stays
      in it, the terminal's foreground, so Ctrl-C, Ctrl-Z and reads work as for any job; the group
      is ended once the wrapper is gone without finishing (SIGKILLed), never under a live wrapper.
    - "shared": a terminal, and the group is someone else's (a script's): left alone.
    """
    tty = _open_terminal()
    if tty is None:
        return "own"
    os.close(tty)
    return "wrapper's" if os.getpgrp() == os.getpid() else "shared"


class Session:
    """Signals that arrive while the wrapper supervises; any of them stops further relaunches."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.stopped = False
        self.pid: int | None = None  # the harness, while it runs
        # The harness's own process group, when it has one: signals go to all of it.
        self.group: int | None = None
        # A signal that came while no harness ran (during a claim, a back-off or a slow sidecar):
        # the harness about to start gets it, so it is neither lost nor outlived.
        self.unforwarded: int | None = None
        # A SIGTERM or SIGHUP came: the harness has HARNESS_KILL_DEADLINE_S to go, then SIGKILL.
        self.terminating = False
        self._kill_timer: list[Any] | None = None

    def listen(self) -> None:
        """Take SIGINT, SIGTERM and SIGHUP from here on (they were blocked across the exec, so one
        that came meanwhile is delivered now)."""
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: None)  # the wake-up byte carries it to the loop
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)

        def readable() -> None:
            with suppress(BlockingIOError):
                for signum in os.read(wake_read, 64):
                    self.on_signal(signum)

        self.loop.watch(wake_read, READ, readable)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def on_signal(self, signum: int) -> None:
        self.stopped = True
        if signum != signal.SIGINT and not self.terminating:
            self.terminating = True
            self._arm_kill()
        if self.pid is None:
            self.unforwarded = signum
            return
        if signum == signal.SIGINT and self.group is None and terminal_delivers_sigint():
            return  # the terminal already sent it to the harness: a second would double it
        self.signal(signum)

    def signal(self, signum: int) -> None:
        """To the harness's whole group when it has its own, else to the harness."""
        with suppress(ProcessLookupError):
            if self.group is not None:
                os.killpg(self.group, signum)
            elif self.pid is not None:
                os.kill(self.pid, signum)

    def started(self, pid: int, group: int | None) -> None:
        self.pid, self.group = pid, group
        if self.unforwarded is not None:
            self.signal(self.unforwarded)
        self._arm_kill()

    def ended(self) -> None:
        self.pid = self.group = None
        Loop.cancel(self._kill_timer)
        self._kill_timer = None

    def _arm_kill(self) -> None:
        """Beside a running harness: once it is told to terminate, SIGKILL it if it outlives the deadline."""
        if self.terminating and self.pid is not None and self._kill_timer is None:
            self._kill_timer = self.loop.call_later(HARNESS_KILL_DEADLINE_S, self._kill)

    def _kill(self) -> None:
        say(f"the harness outlived its SIGTERM by {HARNESS_KILL_DEADLINE_S:g}s; killing it")
        self.signal(signal.SIGKILL)


class Keeper:
    """The harness's group once this process is gone without finishing (SIGKILLed, OOM-killed, its
    sidecar with it or not): nothing of the resident or the sidecar can act then, so a third
    process waits beside the harness for exactly that. It is `/bin/sh` (a tenth of a forked
    resident's private memory), in a group of its own (the terminal's Ctrl-C and Ctrl-Z are the
    harness's), reading its stdin: a pipe whose write end only this process holds. It starts before
    the harness and is told its group the moment that exists (`watch`, from `spawn`'s `forked`). End
    of file with `done` last: this process saw to the group, and the keeper exits. With the group
    last: it becomes `python -I -S` running `guard.groups.end` on it (SIGTERM and SIGCONT, SIGKILL
    after the deadline). A keeper killed by someone else is replaced, at most once a second."""

    def __init__(self, loop: Loop, deadline_s: float) -> None:
        self.loop = loop
        self.deadline_s = deadline_s
        self.pgid: int | None = None
        self.pid: int | None = None
        self._write_end: int | None = None
        self._started = 0.0
        self._dismissed = False
        self._start()

    def watch(self, pgid: int) -> None:
        """The harness's group: the keeper ends it should this process vanish."""
        self.pgid = pgid
        self._say(b"%d\n" % pgid)

    def dismiss(self) -> None:
        """The group is seen to here: `done`, and the keeper exits."""
        self._dismissed = True
        self._say(b"done\n")
        self._close()

    def _start(self) -> None:
        if self._dismissed:
            return
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        end = (sys.executable, "-I", "-S", "-c", KEEPER_END, _ROOT, f"{self.deadline_s:g}")
        try:
            self.pid = spawn(["/bin/sh", "-c", KEEPER_SCRIPT, "hctx-keeper", *end], dict(os.environ),
                             new_group=True, stdin=read_end, stdout=devnull)  # fmt: skip
        except OSError as exc:
            os.close(write_end)
            say(f"cannot start a keeper for the harness's group ({exc.strerror or exc}); should this "
                "wrapper and its sidecar be killed together, the harness's children would be left")  # fmt: skip
            return
        finally:
            os.close(read_end)
            os.close(devnull)
        self._write_end = write_end
        self._started = time.monotonic()
        if self.pgid is not None:
            self._say(b"%d\n" % self.pgid)
        self.loop.watch_exit(self.pid, self._exited)

    def _exited(self, _: int) -> None:
        self.pid = None
        self._close()
        if not self._dismissed:
            self.loop.call_later(max(0.0, self._started + KEEPER_RESTART_S - time.monotonic()), self._start)

    def _say(self, line: bytes) -> None:
        if self._write_end is not None:
            with suppress(OSError):  # a keeper that is gone hears nothing; its replacement is told
                os.write(self._write_end, line)

    def _close(self) -> None:
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None


def end_group(loop: Loop, pgid: int, deadline_s: float) -> None:
    """SIGTERM the group (and SIGCONT), SIGKILL what is left after `deadline_s`; returns once it is gone."""
    from guard.groups import POLL_S, group_alive, signal_group, start_ending

    if not start_ending(pgid):
        return
    gone = [False]

    def look() -> None:
        if gone[0]:
            return
        if group_alive(pgid):
            loop.call_later(POLL_S, look)
        else:
            gone[0] = True

    loop.call_later(POLL_S, look)
    if not loop.run_until(lambda: gone[0], timeout=deadline_s):
        signal_group(pgid, signal.SIGKILL)
    gone[0] = True  # no more looks


def sidecar_argv(it: Incarnation, lifeline_fd: int, ready_fd: int) -> list[str]:
    """The command every sidecar of the incarnation `it` (`wrapper.launch.launcher.begin_incarnation`) runs."""
    agent = it.agent
    return [
        *(sys.executable, "-m", "sidecar", "--harness", it.harness),
        *("--catalog", agent.catalog, "--host", agent.host, "--agent", agent.identity),
        *("--incarnation", it.incarnation, "--channel", it.channel),
        *("--lifeline-fd", str(lifeline_fd), "--ready-fd", str(ready_fd)),
        *(() if it.transport is None else ("--transport", it.transport)),
        *(() if it.account is None else ("--account", it.account)),
        *(() if it.record_fd is None else ("--record-fd", str(it.record_fd))),
        *(("--record-raw",) if it.record_raw else ()),
        *(() if it.heartbeat_s is None else ("--heartbeat-s", str(it.heartbeat_s))),
    ]


class Sidecars:
    """The incarnation's sidecar: one at a time, replaced while the harness runs.

    A sidecar that dies while the harness runs is replaced for the same incarnation and channel (the
    new one rebinds the socket path), after a back-off that grows while deaths come soon after starts
    and ends in giving up, so a crash-looping sidecar cannot spin. Each death is one line in the
    agent's log, and the stretch without a sidecar is kept in the claim (`unobserved`, shown by
    `hctx inspect`); the terminal, which is the harness's, gets one line per incarnation and one
    more on giving up (the `sidecar-died` step writes all three)."""

    def __init__(self, loop: Loop, steps: Steps, incarnation: Incarnation) -> None:
        self.loop = loop
        self.steps = steps
        self.incarnation = incarnation
        self.pid: int | None = None
        self.ready: bool | None = None  # None while a started sidecar has not said
        self.group: bytes | None = None  # the order naming the harness's group, for each sidecar
        self.stopping = False
        self._lifeline: int | None = None  # the write end: closing it ends the sidecar
        self._started_at = 0.0
        self._quick_deaths = 0
        self._told_terminal = False
        self._replacing = False

    def start(self) -> None:
        """Start a sidecar; `ready` turns True once its channel listens (False: not in time)."""
        lifeline_read, self._lifeline = os.pipe2(os.O_CLOEXEC)
        ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            # Its own group: the terminal's Ctrl-C and Ctrl-Z are the harness's, not the sidecar's.
            # `--record`'s file goes to each sidecar as this same open file, never by its name.
            record = () if self.incarnation.record_fd is None else (self.incarnation.record_fd,)
            self.pid = spawn(sidecar_argv(self.incarnation, lifeline_read, ready_write), checkout_env(), new_group=True,
                             keep=(lifeline_read, ready_write, *record), stdin=devnull, stdout=devnull)  # fmt: skip
        except OSError:
            os.close(ready_read)
            self._close_lifeline()
            raise
        finally:
            for fd in (lifeline_read, ready_write, devnull):
                os.close(fd)
        self.ready = None
        self._started_at = time.monotonic()
        if self.group is not None:
            self._order(self.group)
        self._wait_ready(ready_read)
        self.loop.watch_exit(self.pid, self._exited)

    def _wait_ready(self, ready_read: int) -> None:
        said = bytearray()

        def finish(ready: bool) -> None:
            Loop.cancel(timer)
            self.loop.unwatch(ready_read)
            os.close(ready_read)
            if self.ready is None:
                self.ready = ready
                if ready and self._replacing:
                    self._replacing = False
                    it = self.incarnation
                    self.steps.submit(SidecarBack(it.agent, it.incarnation, time.time_ns() // 1_000_000))

        def readable() -> None:
            chunk = os.read(ready_read, 16)
            said.extend(chunk)
            if said == b"ready\n" or not chunk or len(said) >= 6:
                finish(said == b"ready\n")

        timer = self.loop.call_later(SIDECAR_READY_TIMEOUT_S, lambda: finish(False))
        self.loop.watch(ready_read, READ, readable)

    @property
    def running(self) -> bool:
        return self.pid is not None

    def watch_group(self, pgid: int) -> None:
        """The harness's group, which each sidecar ends should the lifeline close without `done`."""
        self.group = b"group %d %g\n" % (pgid, HARNESS_KILL_DEADLINE_S)
        self._order(self.group)

    def _exited(self, returncode: int) -> None:
        pid, self.pid = self.pid, None
        if self.ready is None:
            self.ready = False
        self._close_lifeline()
        if self.stopping:
            return
        if time.monotonic() - self._started_at >= SIDECAR_STABLE_S:
            self._quick_deaths = 0
        delay = sidecar_restart_delay(self._quick_deaths)
        self._quick_deaths += 1
        tell = delay is None or not self._told_terminal
        self._told_terminal = True  # later deaths go to the agent's log and the claim only
        it = self.incarnation
        assert pid is not None  # an exit is watched only for the sidecar that runs
        self.steps.submit(SidecarDied(it.agent, it.incarnation, pid, returncode, delay, tell,
                                      time.time_ns() // 1_000_000))  # fmt: skip
        if delay is not None:
            self.loop.call_later(delay, self._replace)

    def _replace(self) -> None:
        if self.stopping:
            return
        self._replacing = True
        try:
            self.start()
        except OSError as exc:
            say(f"cannot start another sidecar ({exc.strerror or exc}); the session runs unobserved from here")

    def stop(self, *, group_done: bool) -> None:
        """Close the lifeline (the sidecar drains what it has and exits), saying `done` first when
        the harness's group is seen to here; kill one that lingers."""
        self.stopping = True
        if group_done:
            self._order(b"done\n")
        self._close_lifeline()
        if self.pid is None:
            return
        if not self.loop.run_until(lambda: self.pid is None, timeout=SIDECAR_EXIT_TIMEOUT_S):
            say("the sidecar did not exit in time; killed")
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.loop.run_until(lambda: self.pid is None)

    def _order(self, line: bytes) -> None:
        if self._lifeline is not None:
            with suppress(OSError):  # a sidecar that is gone cannot be told
                os.write(self._lifeline, line)

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None


class TapQueue:
    """Tapped lines owed to the sidecar, bounded in bytes; when full, the oldest give way."""

    def __init__(self, where: str) -> None:
        import collections  # a tapped harness only

        self.where = where  # the drop report's `where`
        self.lines: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.dropped = 0  # lines that gave way (or were lost with the sidecar) since the last report

    def put(self, line: bytes) -> None:
        self.lines.append(line)
        self.size += len(line)
        while self.size > TAP_QUEUE_BYTES:
            self.size -= len(self.lines.popleft())
            self.dropped += 1

    def __bool__(self) -> bool:
        return bool(self.lines or self.dropped)

    def take(self) -> tuple[bytes, int]:
        """Everything queued in one batch, led by a drop report when lines gave way; and how many
        lines the batch carries, to count them if it is lost."""
        import json  # a tapped harness only

        from guard.constants import CHANNEL_DROP_REPORT

        report = b""
        if self.dropped:
            frame = {"type": CHANNEL_DROP_REPORT, "where": self.where, "count": self.dropped}
            report = json.dumps(frame).encode() + b"\n"
        batch, count = report + b"".join(self.lines), len(self.lines) + self.dropped
        self.lines.clear()
        self.size = self.dropped = 0
        return batch, count


class Tap:
    """Copy the harness's stdout to ours untouched; send each line to the sidecar on the side.

    Lines are framed by the sidecar's own `LineFramer` at the channel's limit, and each goes as the
    harness's tap frame (its spec's `tap_frame`, named `module:name` by the launch: the line's very
    bytes; that harness's module brings its decoding along, so a tapped resident costs more), so
    the sidecar decodes exactly the bytes a replay of the same stdout does. The copy never waits on
    the sidecar: tapped lines queue up to TAP_QUEUE_BYTES, and past that the oldest give way, so
    after a burst (thousands of deltas) the newest lines, the usage update among them, still go.
    What gave way is counted and reported to the sidecar, which logs it. A line over the limit, or
    one whose frame would be (the sidecar refuses those on every wire), is not sent.

    When the sidecar is gone, its channel is tried again (a sidecar started again listens on the
    same path) while the queue keeps the newest lines. Nothing is printed here: a write to a stderr
    nobody drains would stall the copy, and the wrapper already says when its sidecar died; the
    lines lost meanwhile reach the sidecar's log as a drop report.
    """

    def __init__(
        self, loop: Loop, source: int, frame: str, channel: str, out: int = 1, where: str = "stdout tap"
    ) -> None:
        import socket

        from guard.constants import CHANNEL_MAX_FRAME_BYTES
        from sidecar.framing import LineFramer

        self._socket_module = socket
        self.loop, self.source, self.out = loop, source, out
        from sidecar.framing import tap_frame

        self.tap_frame: Callable[[bytes], bytes] = lambda line: tap_frame(line, frame)
        self.channel = channel
        self.max_frame = CHANNEL_MAX_FRAME_BYTES
        self.framer = LineFramer(CHANNEL_MAX_FRAME_BYTES)
        self.queue = TapQueue(where)
        self.copy = bytearray()  # owed to `out`
        self.ended = False  # the harness's stdout reached its end
        self.sock: Any = None
        self.batch = b""
        self.batch_count = 0
        self._retry: list[Any] | None = None
        self._out_was_blocking = os.get_blocking(out)
        os.set_blocking(source, False)
        os.set_blocking(out, False)
        loop.watch(source, READ, self._read)

    @property
    def done(self) -> bool:
        """The copy is complete and every line sent, or given up with the sidecar."""
        return self.ended and not self.copy and not self.batch and (not self.queue or self._given_up)

    _given_up = False

    def close(self) -> None:
        for fd in (self.source, self.out):
            self.loop.unwatch(fd)
        with suppress(OSError):
            os.close(self.source)
        with suppress(OSError):
            os.set_blocking(self.out, self._out_was_blocking)
        Loop.cancel(self._retry)
        if self.sock is not None:
            self.loop.unwatch(self.sock.fileno())
            self.sock.close()
            self.sock = None

    def _read(self) -> None:
        from sidecar.framing import Line

        try:
            chunk = os.read(self.source, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.ended = True
            self.loop.unwatch(self.source)
            self._send()
            return
        self.copy.extend(chunk)
        for line in self.framer.receive_data(chunk):
            if isinstance(line, Line) and line.data.strip():
                frame = self.tap_frame(line.data)
                if len(frame) <= self.max_frame:
                    self.queue.put(frame + b"\n")
        self.loop.unwatch(self.source)  # read on once the copy is out: the harness waits on us, not on the sidecar
        self._write()
        self._send()

    def _write(self) -> None:
        try:
            while self.copy:
                del self.copy[: os.write(self.out, self.copy)]
        except BlockingIOError:
            self.loop.unwatch(self.out)
            self.loop.watch(self.out, WRITE, self._write)
            return
        except OSError:
            self.copy.clear()  # our stdout is gone: the harness's output has nowhere to go
        self.loop.unwatch(self.out)
        if not self.ended:
            self.loop.unwatch(self.source)
            self.loop.watch(self.source, READ, self._read)

    def _send(self) -> None:
        socket = self._socket_module
        if not self.batch and self.queue:
            self.batch, self.batch_count = self.queue.take()
        if not self.batch or self._retry is not None:
            return
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            try:
                sock.connect(self.channel)
            except OSError:
                sock.close()
                if self.ended:  # no sidecar to take what is left, and nothing more to come
                    self._lose()
                    self._given_up = True
                    return
                self._retry = self.loop.call_later(TAP_RECONNECT_S, self._retried)
                return
            self.sock = sock
        try:
            while self.batch:
                self.batch = self.batch[self.sock.send(self.batch) :]
        except BlockingIOError:
            self.loop.unwatch(self.sock.fileno())
            self.loop.watch(self.sock.fileno(), WRITE, self._send)
            return
        except OSError:
            self._lose()
            self.loop.unwatch(self.sock.fileno())
            self.sock.close()
            self.sock = None
            if not self.ended:
                self._retry = self.loop.call_later(TAP_RECONNECT_S, self._retried)
            else:
                self._given_up = True
            return
        self.batch_count = 0
        self.loop.unwatch(self.sock.fileno())
        if self.queue:
            self._send()

    def _lose(self) -> None:
        self.queue.dropped += self.batch_count
        self.batch, self.batch_count = b"", 0

    def _retried(self) -> None:
        self._retry = None
        self._send()


def run_tap(
    source: int, frame: str, channel: str, out: int = 1, where: str = "stdout tap", timeout: float = 30.0
) -> None:
    """The tap on its own loop until `source` ends and its lines are sent (a test drives it so)."""
    loop = Loop()
    tap = Tap(loop, source, frame, channel, out, where)
    try:
        loop.run_until(lambda: tap.done, timeout=timeout)
    finally:
        tap.close()


def _remove_channel_dir(directory: str) -> None:
    with suppress(OSError):
        for name in os.listdir(directory):
            with suppress(OSError):
                os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def run_incarnation(
    loop: Loop, session: Session, steps: Steps, it: Incarnation, exited: Callable[[int], None] = lambda _: None
) -> int:
    """One harness run beside its sidecar; the harness's exit status. `exited(status)` is told the
    moment the harness is gone, while the sidecar still drains (a step started then runs meanwhile)."""
    plan = it.plan
    assert plan is not None  # an incarnation without a plan only has a status (`supervise`)
    group = harness_group()
    sidecars = Sidecars(loop, steps, it)
    tap: Tap | None = None
    keeper: Keeper | None = None
    try:
        try:
            sidecars.start()
            loop.run_until(lambda: sidecars.ready is not None)
        except OSError as exc:
            say(f"cannot start the sidecar ({exc.strerror or exc})")
        if not sidecars.ready and sidecars.running:  # one that died is its step's to report
            say("the sidecar did not come up; the harness runs without context telemetry")
        env = dict(os.environ) | plan.env | {
            "HCTX_CHANNEL": it.channel,
            "HCTX_AGENT": it.agent.identity,
            "HCTX_INCARNATION": it.incarnation,
            "HCTX_CATALOG": it.agent.catalog,
        }  # fmt: skip
        stdout_read = stdout_write = None
        if plan.tap:
            stdout_read, stdout_write = os.pipe2(os.O_CLOEXEC)
        if group != "shared":  # before the harness: it is told the group the moment that exists
            keeper = Keeper(loop, HARNESS_KILL_DEADLINE_S)

        def group_made(child: int) -> None:
            if keeper is not None:
                keeper.watch(child if group == "own" else os.getpgrp())

        try:
            pid = spawn(plan.argv, env, cwd=plan.cwd, new_group=group == "own", stdout=stdout_write,
                        death_signal=True, forked=group_made)  # fmt: skip
        except OSError as exc:
            say(f"cannot start {plan.argv[0]!r}: {exc.strerror or exc}")
            if stdout_read is not None:
                os.close(stdout_read)
            return 127 if exc.errno == errno.ENOENT else 126
        finally:
            if stdout_write is not None:
                os.close(stdout_write)
        if stdout_read is not None and plan.tap is not None:
            tap = Tap(loop, stdout_read, plan.tap, it.channel, where=f"{it.harness} stdout tap")
        returncode: list[int] = []
        loop.watch_exit(pid, returncode.append)
        session.started(pid, pid if group == "own" else None)
        if group != "shared":
            sidecars.watch_group(pid if group == "own" else os.getpgrp())
        loop.run_until(lambda: bool(returncode))
        session.ended()
        exited(exit_status(returncode[0]))
        if tap is not None:
            loop.run_until(lambda: tap is not None and tap.done, timeout=SIDECAR_EXIT_TIMEOUT_S)
        # First the sidecar: a last hook process of the harness's group still lands its frame.
        sidecars.stop(group_done=group != "shared")
        if group == "own":
            end_group(loop, pid, HARNESS_KILL_DEADLINE_S)  # what the harness left behind in its group
        return exit_status(returncode[0])
    finally:
        if keeper is not None:  # only now: the group is ended above, or left to the terminal's job
            keeper.dismiss()
        if tap is not None:
            tap.close()
        sidecars.stopping = True
        _remove_channel_dir(it.channel_dir)
        if plan.teardown:
            steps.submit(Teardown(plan, it.harness))


def _relaunch_wanted(options: Options, status: int, restarts: int) -> bool:
    if options.max_restarts is not None and restarts >= options.max_restarts:
        return False
    return options.restart == "always" or (options.restart == "on-failure" and status != 0)


class WrapperLock:
    """The agent's wrapper lock (`guard.state.AgentLock`), its descriptor inherited across the exec:
    held here, by the claim's pid, until this process ends; never passed to a child. One the claim
    went on without (a takeover whose old wrapper did not stop in time) is taken before a relaunch."""

    def __init__(self, fd: int, held: bool) -> None:
        self.fd = fd
        self.held = held
        os.set_inheritable(fd, False)

    def take(self) -> bool:
        if not self.held:
            import fcntl  # the rare takeover that went on regardless: not worth a load otherwise

            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            self.held = True
        return True


def supervise(
    options: Options, first: Incarnation, lock: WrapperLock | None = None, record_fd: int | None = None
) -> int:
    """The first incarnation (claimed before the exec), then the ones the restart policy wants. A
    relaunch's `begin` step claims under `lock`, which this process holds: the step takes none.
    `record_fd`: `--record`'s open file, handed to every sidecar of every incarnation."""
    if record_fd is not None:
        os.set_inheritable(record_fd, False)  # a sidecar's alone: never the harness's, never a step's
    loop = Loop()
    session = Session(loop)
    session.listen()
    steps = Steps(loop)
    it = first
    restarts = 0
    stopped: list[str] = []  # the incarnation whose `stopped` step was started

    def stop(status: int) -> None:
        """Once no relaunch will follow, the claim's `stopped` goes at once: beside the sidecar's
        drain rather than after it, so the wrapper's exit does not wait for a step's start."""
        if not stopped and (session.stopped or not _relaunch_wanted(options, status, restarts)):
            stopped.append(it.incarnation)
            steps.submit(Stopped(first.agent, it.incarnation))

    while True:
        it.record_fd, it.record_raw, it.heartbeat_s = record_fd, options.record_raw, options.heartbeat_s
        status = it.status if it.status is not None else run_incarnation(loop, session, steps, it, stop)
        if session.stopped or not _relaunch_wanted(options, status, restarts):
            break
        delay = min(options.restart_delay_s * 2**restarts, options.restart_delay_max_s)
        restarts += 1
        say(f"harness exited with {status}; relaunch {restarts} in {delay:.2f}s")
        loop.run_until(lambda: session.stopped, timeout=delay)
        if session.stopped:
            break
        if lock is not None:
            lock.take()
        output, code = steps.run(Begin(options, restarts, it.incarnation))
        if code != 0:
            break  # the step said why
        try:
            it = Incarnation.from_wire(marshal.loads(output))
        except (SpecError, EOFError, ValueError, TypeError) as exc:
            say(f"the relaunch's claim step answered what this resident cannot run ({exc}); not relaunching")
            break
    if not stopped:  # a relaunch was wanted, and a signal or a failed claim ended the session instead
        steps.submit(Stopped(first.agent, it.incarnation))
    steps.drain()
    return status


ADOPT_SEND_TIMEOUT_S = 1.0


def send_lines(channel: str, lines: bytes) -> bool:
    """`lines` (whole channel frames) sent to the sidecar at `channel`; False when none takes them."""
    from sidecar.adoption import deliver  # posix only, as process_start_ticks

    return deliver(channel, lines, ADOPT_SEND_TIMEOUT_S) is None


def _same_process(pid: int, start_ticks: int) -> int | None:
    """A pidfd of `pid`, once it is seen to be the process that started at `start_ticks` (checked
    after the pidfd is open, so the process watched is the one checked); None when it is gone."""
    from sidecar.adoption import process_start_ticks  # posix only: nothing of the resident's weight

    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    if process_start_ticks(pid) != start_ticks:
        os.close(pidfd)
        return None
    return pidfd


def watch_adopted(loop: Loop, session: Session, steps: Steps, it: Incarnation, adoption: Adoption) -> None:
    """An adopted harness's life beside its sidecar: the harness is watched through a pidfd (it is
    not this process's child: nothing is spawned, no group is ended, no signal is ever sent to it);
    when it exits (or this resident is told to stop) the claim's `stopped` is started, the sidecar
    drains and exits, and the adoption's directory (its channel, the adopter's lock) goes."""
    sidecars = Sidecars(loop, steps, it)
    gone: list[bool] = []
    pidfd = _same_process(adoption.pid, adoption.start_ticks)
    try:
        if pidfd is None:
            # A session over before this resident came (a one-shot run of a second): its sidecar
            # still starts and drains, so what the harness left (its rollout, the trigger's first
            # lines) is read once and the record written, as a wrapped seat's drain does.
            say(f"pid {adoption.pid} exited before its sidecar started; reading what it left")
            gone.append(True)
        else:
            loop.watch(pidfd, READ, lambda: gone.append(True))
        try:
            sidecars.start()
            # Not cut short by the harness's exit: the trigger's first lines and what it left are
            # still this sidecar's to read before it drains.
            loop.run_until(lambda: sidecars.ready is not None or session.stopped)
        except OSError as exc:
            say(f"cannot start the sidecar ({exc.strerror or exc})")
        if sidecars.ready and adoption.pending and not send_lines(it.channel, adoption.pending):
            say("the sidecar did not take the trigger's first lines; they are lost")
        elif not sidecars.ready and sidecars.running:
            say("the sidecar did not come up; the session runs without context telemetry")
        loop.run_until(lambda: bool(gone) or session.stopped)
    finally:
        if pidfd is not None:
            loop.unwatch(pidfd)
            os.close(pidfd)
        steps.submit(Stopped(it.agent, it.incarnation))  # beside the sidecar's drain, not after it
        sidecars.stop(group_done=False)  # no group of the harness's was ever ordered: none is ended
        _remove_channel_dir(it.channel_dir)


def adopt_supervise(options: Options, first: Incarnation, adoption: Adoption, record_fd: int | None = None) -> int:
    """`hctx adopt`'s resident: one incarnation, never relaunched (the harness is the user's, started
    by them); 0 once it is over."""
    if record_fd is not None:
        os.set_inheritable(record_fd, False)
    loop = Loop()
    session = Session(loop)
    session.listen()
    steps = Steps(loop)
    first.record_fd, first.record_raw, first.heartbeat_s = record_fd, options.record_raw, options.heartbeat_s
    watch_adopted(loop, session, steps, first, adoption)
    steps.drain()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "--spec-fd":
        print("usage: resident.py --spec-fd FD (started by `hctx wrap`, not by hand)", file=sys.stderr)
        return 2
    with os.fdopen(int(args[1]), "rb") as spec_file:
        try:
            spec = Spec.loads(spec_file.read())
        except SpecError as exc:
            print(f"hctx wrap: the resident cannot run this spec: {exc}", file=sys.stderr)
            return 2
    lock = WrapperLock(spec.lock_fd, spec.lock_held)  # held for this process's life, adopted or not
    if spec.adoption is not None:
        prog[0] = "hctx adopt"
        return adopt_supervise(spec.options, spec.incarnation, spec.adoption, spec.record_fd)
    return supervise(spec.options, spec.incarnation, lock, spec.record_fd)


if __name__ == "__main__":  # by hand, for a look; the wrapper runs `wrapper.launch.launcher.RESIDENT_COMMAND`
    sys.path[0] = _ROOT
    sys.exit(main())
