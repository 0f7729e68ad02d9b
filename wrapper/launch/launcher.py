"""`hctx wrap`: claim, remove, prepare the launch; then become the resident supervisor.

The claim and the launch plan need pydantic and the registry; holding a terminal and a harness for
hours needs neither. So `run_wrap` takes the agent's wrapper lock and claims the agent (stopping
the wrapper proven to hold that lock on `--takeover`), prepares the first incarnation and `exec`s
`wrapper.launch.resident` under `python -I -S` with it: the same process (the claim's pid and start time
stay its own, and the lock's open file goes along), a few megabytes from then on. The steps
the resident needs later (a relaunch's claim and plan, a launch's teardown, a dead sidecar's record,
the final `stopped`) are `python -m wrapper.launch.launcher STEP` (its payload on stdin), run by the resident (`main`).

SIGINT, SIGTERM and SIGHUP are blocked from the start of `run_wrap` to the resident's first loop:
one that comes during the claim is kept pending across the exec and handled there (it stops the
session, and the harness about to start gets it), as it was while the wrapper was one process.
"""

from __future__ import annotations

import marshal
import os
import secrets
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, cast

from guard.constants import CHANNEL_MAX_SOCKET_PATH as MAX_SOCKET_PATH
from guard.layout import AgentDir, as_name
from guard.record import Harness
from guard.state import (
    AgentLock,
    ClaimHeld,
    HarnessState,
    claim_agent,
    held_by_live_wrapper,
    read_state,
    update_claim,
    wrapper_lock_evidence,
)
from sidecar.launching import LaunchPlan, account_json, transport_json
from sidecar.registry import has_teardown, prepare, teardown
from sidecar.spec import ChannelPathError, UnknownHarness
from wrapper.arguments import UsageError
from wrapper.launch.loop import ROOT, STOP_SIGNALS, say
from wrapper.launch.resident import HARNESS_KILL_DEADLINE_S, SIDECAR_EXIT_TIMEOUT_S, exit_status
from wrapper.launch.spec import (
    AgentRef,
    Begin,
    Incarnation,
    Options,
    Plan,
    SidecarBack,
    SidecarDied,
    Spec,
    SpecError,
    Step,
    Stopped,
    Teardown,
)

__all__ = [
    "CLAIM_REFUSED_STATUS",
    "FINAL_STATE_RETRIES_S",
    "HARNESS_KILL_DEADLINE_S",
    "RESIDENT_COMMAND",
    "SEAT_SUFFIX_ROOM",
    "STEPS",
    "TAKEOVER_WAIT_S",
    "RestartPolicy",
    "WrapOptions",
    "begin_incarnation",
    "claim",
    "exec_resident",
    "exit_status",
    "free_seat",
    "main",
    "parse_command",
    "planned_incarnation",
    "run_wrap",
    "say",
    "tap_frame_path",
    "unrunnable",
]

RestartPolicy = Literal["no", "on-failure", "always"]
_StepT = TypeVar("_StepT", bound=Step)
# How long a takeover waits for the wrapper it stops: its harness's deadline, its sidecar's drain.
TAKEOVER_WAIT_S = HARNESS_KILL_DEADLINE_S + SIDECAR_EXIT_TIMEOUT_S + 2.0
# A claim refused because a live wrapper holds it: the wrapper's own usage-error status.
CLAIM_REFUSED_STATUS = 2
# Back-off between attempts at the final harness-state write (a full disk may clear meanwhile).
FINAL_STATE_RETRIES_S = (0.1, 0.5)


@dataclass(frozen=True)
class WrapOptions:
    agent: AgentDir
    harness: Harness
    argv: tuple[str, ...]
    restart: RestartPolicy = "no"
    max_restarts: int | None = None
    restart_delay_s: float = 1.0
    restart_delay_max_s: float = 60.0
    takeover: bool = False
    record: Path | None = None  # `--record`: a file `create_recording` made (its path, for messages)
    record_raw: bool = False  # `--record-raw`: every sidecar records the session unredacted
    heartbeat_s: int | None = None  # HCTX_HEARTBEAT_S: every sidecar's heartbeat; None the spec's

    def for_resident(self) -> Options:
        """As the resident carries them, and hands them back to a `begin` step."""
        return Options(_agent_ref(self.agent), self.harness, self.argv, self.restart, self.max_restarts,
                       self.restart_delay_s, self.restart_delay_max_s, self.takeover,
                       None if self.record is None else os.fspath(self.record), self.record_raw,
                       self.heartbeat_s)  # fmt: skip

    @classmethod
    def from_resident(cls, options: Options) -> WrapOptions:
        return cls(
            agent=_agent_dir(options.agent),
            harness=options.harness,
            argv=options.argv,
            restart=cast(RestartPolicy, options.restart),
            max_restarts=options.max_restarts,
            restart_delay_s=options.restart_delay_s,
            restart_delay_max_s=options.restart_delay_max_s,
            takeover=options.takeover,
            record=None if options.record is None else Path(options.record),
            record_raw=options.record_raw,
            heartbeat_s=options.heartbeat_s,
        )


def _agent_ref(agent: AgentDir) -> AgentRef:
    return AgentRef(os.fspath(agent.catalog), agent.host, agent.identity)


def _agent_dir(agent: AgentRef) -> AgentDir:
    return AgentDir(Path(agent.catalog), agent.host, agent.identity)


def unrunnable(argv: tuple[str, ...], path: str | None) -> tuple[int, str] | None:
    """Why `argv` cannot start, with the shell's status for it (127 not found, 126 not runnable),
    or None. Checked before the claim, so a program that is not there leaves no agent and starts no
    sidecar. A script's `#!` interpreter is checked too: an npm-installed harness whose `node` is
    not on PATH fails the same way, only after its exec."""
    program = argv[0]
    found = program if "/" in program else shutil.which(program, path=path)
    if found is None:
        return 127, f"no {program!r} on PATH"
    if not os.path.isfile(found):
        return (126, "it is not a file") if os.path.lexists(found) else (127, "No such file or directory")
    if not os.access(found, os.X_OK):
        return 126, "Permission denied"
    try:
        with open(found, "rb") as file:
            first = file.readline(256)
    except OSError as exc:
        return 126, exc.strerror or str(exc)
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    if not words:
        return None
    interpreter, shebang = words[0], first.decode(errors="replace").strip()
    if not os.access(interpreter, os.X_OK):
        return 127, f"its interpreter {interpreter} ({shebang}) is not there"
    if Path(interpreter).name == "env":
        wanted = next((word for word in words[1:] if not word.startswith("-") and "=" not in word), None)
        if wanted is not None and shutil.which(wanted, path=path) is None:
            return 127, f"its interpreter {wanted!r} ({shebang}) is not on PATH"
    return None


def run_wrap(options: WrapOptions, record_fd: int | None = None) -> int:
    """Claim and prepare the first incarnation, then exec the resident (it returns only a refusal).
    `record_fd`: `--record`'s file, open: the resident holds it and hands it to each sidecar."""
    if (refused := unrunnable(options.argv, os.environ.get("PATH"))) is not None:
        not_started, why = refused
        say(f"cannot start {options.argv[0]!r}: {why}; nothing claimed, no sidecar started")
        return not_started
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    lock = AgentLock(options.agent)
    try:
        incarnation = _claim_first(options, lock)
    except ClaimHeld as held:
        say(_held_text(options.agent, held.holder, relaunch=False))
        lock.close()
        return CLAIM_REFUSED_STATUS
    first = begin_incarnation(options, incarnation, os.getpid())  # the resident keeps this pid
    lock_fd, lock_held = lock.across_exec()
    if record_fd is not None:
        os.set_inheritable(record_fd, True)  # across the exec; the resident hands it on, to sidecars only
    exec_resident(Spec(options.for_resident(), first, lock_fd, lock_held, record_fd))
    raise AssertionError("unreachable: exec returned")  # pragma: no cover


# Imports the resident from its compiled module: a script (`python resident.py`) is compiled from
# source at every start, and the compiler's garbage would stay in the heap for the session (2 MB).
RESIDENT_COMMAND = (
    "import sys; sys.path[0] = sys.argv.pop(1); from wrapper.launch.resident import main; sys.exit(main())"
)


def exec_resident(spec: Spec) -> None:
    """Become the resident: `python -I -S` (the standard library only, not even site), its spec in an
    inherited memfd, so `ps` shows a short command. The agent's wrapper lock goes along (the same
    open file, so the same flock, under the same pid): the resident holds it for its whole life."""
    spec_fd = os.memfd_create("hctx-wrap", 0)  # no MFD_CLOEXEC: the resident reads it
    os.write(spec_fd, spec.dumps())
    os.lseek(spec_fd, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", RESIDENT_COMMAND, ROOT, "--spec-fd", str(spec_fd)])


def claim(
    options: WrapOptions,
    lock: AgentLock,
    *,
    relaunch_of: str | None = None,
    takeover: bool = False,
    pid: int | None = None,
    adopted: bool = False,
) -> str:
    """A fresh incarnation, claimed under the state lock, the old record removed; ClaimHeld while
    another wrapper holds the agent (its wrapper lock), unless `takeover`. `pid`: the wrapper's (by
    default this process's; a relaunch's `begin` step claims for the resident that runs it).
    `adopted`: `hctx adopt`'s claim, for a harness it did not launch (wrapper.launch.adopt)."""
    incarnation = secrets.token_hex(16)
    now = time.time_ns() // 1_000_000
    locked = lock.take()
    claim_agent(options.agent, options.harness, incarnation, now, os.getpid() if pid is None else pid,
                locked=locked, relaunch_of=relaunch_of, takeover=takeover, adopted=adopted)  # fmt: skip
    return incarnation


def _claim_first(options: WrapOptions, lock: AgentLock) -> str:
    """`claim`; with --takeover, the wrapper holding the agent is stopped first, then the claim taken.
    Only a process proven to hold the agent's wrapper lock is signalled; otherwise it is refused,
    saying why."""
    try:
        return claim(options, lock)
    except ClaimHeld as held:
        if not options.takeover or held.holder is None:
            raise
        pid = held.holder.wrapper_pid
        why = _stop_wrapper(options.agent, pid)
        if why is not None:
            say(f"not taking {_name(options.agent)} over: {why}; nothing was signalled")
            raise
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while not lock.take() and time.monotonic() < deadline:  # a lock freed by an exit has no event
            time.sleep(0.05)
        if not lock.held:
            say(f"wrapper pid {pid} did not stop within {TAKEOVER_WAIT_S:g}s; taking the claim regardless")
        return claim(options, lock, takeover=True)


def _stop_wrapper(agent: AgentDir, pid: int) -> str | None:
    """SIGTERM the wrapper `pid` (it stops its harness and sidecar) once it is proven to hold the
    agent's wrapper lock; None once it is stopping, else why it was not signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return f"its claim's wrapper pid {pid} is not running, yet another process holds the agent's lock"
    try:
        # Checked with the pidfd open: the process signalled is the one the evidence is about.
        if (evidence := wrapper_lock_evidence(agent, pid)) is not None:
            return evidence
        say(f"taking {_name(agent)} over from wrapper pid {pid}: stopping it")
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        poll = select.poll()
        poll.register(pidfd, select.POLLIN)
        poll.poll(TAKEOVER_WAIT_S * 1000)
        return None
    except ProcessLookupError:
        return None
    except PermissionError:
        return f"wrapper pid {pid} is not this user's to signal"
    finally:
        os.close(pidfd)


def _name(agent: AgentDir) -> str:
    return f"{agent.host}/{agent.identity}"


def _held_text(agent: AgentDir, holder: HarnessState | None, *, relaunch: bool) -> str:
    if holder is None:
        return f"{_name(agent)} is held by another wrapper starting now; stop that one, or pass --takeover"
    if relaunch:
        return f"{_name(agent)} was taken over by wrapper pid {holder.wrapper_pid}; not relaunching"
    since = max(0, time.time_ns() // 1_000_000 - holder.claimed_at_ms) // 1000
    return (
        f"{_name(agent)} is already wrapped by pid {holder.wrapper_pid} ({holder.harness}, claimed {since}s "
        "ago); a second wrapper would fight it over one record. Stop that one, or pass --takeover to "
        "stop it and take the agent over"
    )


def _channel_path() -> tuple[Path, Path]:
    """A fresh 0700 directory for the socket, on a path short enough for AF_UNIX."""
    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp"):
        if not base or not os.path.isdir(base):
            continue
        directory = Path(tempfile.mkdtemp(prefix="hctx-", dir=base))
        path = directory / "channel"
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return directory, path
        directory.rmdir()
    raise ChannelPathError("no directory short enough for a unix socket path")


def begin_incarnation(options: WrapOptions, incarnation: str, wrapper_pid: int) -> Incarnation:
    """The claimed incarnation as the resident `wrapper_pid` runs it: the prepared launch (or, when it
    cannot be prepared, the status 2 it ends with), the sidecar's transport config and the channel's
    path."""
    begun = Incarnation(_agent_ref(options.agent), options.harness, incarnation, plan=None, status=2)
    try:
        plan = prepare(LaunchPlan(harness=options.harness, argv=options.argv, cwd=Path.cwd(), owner_pid=wrapper_pid))
    except (OSError, ValueError) as exc:
        say(f"cannot prepare the {options.harness} launch: {exc}")
        return begun
    try:
        directory, channel = _channel_path()
        return planned_incarnation(options, incarnation, plan, directory, channel)
    except OSError:
        teardown(plan)
        raise


def planned_incarnation(
    options: WrapOptions, incarnation: str, plan: LaunchPlan, directory: Path, channel: Path
) -> Incarnation:
    """The claimed `incarnation` with its prepared (or, adopted, its watched) launch `plan`, as the
    resident runs it, its sidecar listening on `channel` in `directory`. The claim names the plan's
    account now, before any reading: `hctx accounts` counts the seat from its launch (issue 35). A
    claim taken over meanwhile is left as it is."""
    if plan.account is not None:
        update_claim(options.agent, incarnation, lambda state: state.model_copy(update={"account": plan.account}))
    return Incarnation(
        _agent_ref(options.agent), options.harness, incarnation,
        plan=Plan(plan.argv, os.fspath(plan.cwd), dict(plan.env),
                  tap_frame_path(options.harness) if plan.tap_stdout else None, has_teardown(plan), plan.owner_pid),
        status=None,
        transport=transport_json(plan),
        account=account_json(plan),
        channel_dir=os.fspath(directory),
        channel=os.fspath(channel),
    )  # fmt: skip


def tap_frame_path(harness: Harness) -> str:
    """The envelope type of the harness's `tap_frame` (its spec's), which the resident frames each
    stdout line in with `sidecar.framing.tap_frame`: it can import neither the registry nor the
    harness's module (pydantic), so the spec's frame must be that envelope."""
    import json

    from sidecar.registry import spec_for

    frame = spec_for(harness).tap_frame
    if frame is None:
        raise UnknownHarness(f"the {harness} harness has no stdout tap")
    kind: str = json.loads(frame(b""))["type"]
    return kind


def parse_command(command: Sequence[str]) -> tuple[str, ...]:
    argv = tuple(command[1:] if command and command[0] == "--" else command)
    if not argv:
        raise UsageError("no harness command given after --")
    return argv


SEAT_SUFFIX_ROOM = 4  # "-999"


def free_seat(catalog: Path, host: str, cwd: Path, taken: Container[str] = ()) -> str:
    """The agent name for a launch that gave none: the working directory's name, or, while a live
    wrapper on this host holds that seat, the first of NAME-2, NAME-3, ... that none holds. `taken`:
    seats found held meanwhile (an adopter that lost a seat's lock to another starting at once)."""
    base = as_name(cwd.name, fallback="agent", room=SEAT_SUFFIX_ROOM)
    for seat in (base, *(f"{base}-{n}" for n in range(2, 10**SEAT_SUFFIX_ROOM // 10))):
        if seat not in taken and not held_by_live_wrapper(read_state(AgentDir(catalog, host, seat)), host):
            return seat
    raise UsageError(f"every seat {base}, {base}-2, ... in {catalog} is held by a live wrapper")


# ---------------------------------------------------------------------------------------------
# The resident's steps: `python -m wrapper.launch.launcher STEP`, a child of the resident.


class _ResidentLock(AgentLock):
    """The wrapper lock as a step sees it: its parent, the resident, holds it (or not) for its life.
    Never taken here, never dropped: a step's own flock would go with the step."""

    def __init__(self, agent: AgentDir, resident: int) -> None:
        super().__init__(agent)
        self.resident_holds = wrapper_lock_evidence(agent, resident) is None

    def take(self) -> bool:
        return self.resident_holds

    def close(self) -> None:
        pass


def _begin_step(step: Begin) -> int:
    """A relaunch: claim for the resident (this step's parent), under the wrapper lock it holds, and
    prepare; the incarnation on stdout. Refused once another wrapper took the claim over."""
    options = WrapOptions.from_resident(step.options)
    resident = os.getppid()
    try:
        incarnation = claim(options, _ResidentLock(options.agent, resident), relaunch_of=step.relaunch_of,
                            pid=resident)  # fmt: skip
    except ClaimHeld as held:
        say(_held_text(options.agent, held.holder, relaunch=True))
        return 1
    except OSError as exc:
        say(f"cannot claim {_name(options.agent)} for relaunch {step.restarts} ({exc}); not relaunching")
        return 1
    try:
        begun = begin_incarnation(options, incarnation, resident)
    except OSError as exc:
        say(f"cannot relaunch {_name(options.agent)} ({exc}); not relaunching")
        return 1
    sys.stdout.buffer.write(marshal.dumps(begun.to_wire()))
    return 0


def _teardown_step(step: Teardown) -> int:
    """What `prepare` left in the working directory, undone (the module reports its own failures)."""
    plan = step.plan
    teardown(LaunchPlan(harness=step.harness, argv=plan.argv, cwd=Path(plan.cwd), env=plan.env,
                        tap_stdout=plan.tap is not None, owner_pid=plan.owner))  # fmt: skip
    return 0


def _stopped_step(step: Stopped) -> int:
    """The claim reads `stopped` once its wrapper is done, unless it was taken over meanwhile. A write
    that fails (a full disk) is retried, then reported; the exit status stays the harness's."""
    agent = _agent_dir(step.agent)
    for delay in (*FINAL_STATE_RETRIES_S, None):
        try:
            update_claim(agent, step.incarnation,
                         lambda state: state.model_copy(update={"desired_state": "stopped"}))  # fmt: skip
            return 0
        except OSError as exc:
            if delay is None:
                say(f"cannot record the stop in {_name(agent)}'s harness-state ({exc}); the claim is left whole, "
                    "reading running under this wrapper's pid, which readers see gone once it exits")  # fmt: skip
                return 1
            time.sleep(delay)
    return 1


def _sidecar_died_step(step: SidecarDied) -> int:
    from wrapper.launch.sidecars import record_death

    record_death(_agent_dir(step.agent), step.incarnation, step.pid, step.returncode, step.retry_in_s,
                 tell_terminal=step.tell_terminal, died_at_ms=step.died_at_ms)  # fmt: skip
    return 0


def _sidecar_back_step(step: SidecarBack) -> int:
    from wrapper.launch.sidecars import record_recovery

    record_recovery(_agent_dir(step.agent), step.incarnation, step.until_ms)
    return 0


def _typed(run: Callable[[_StepT], int], read: Callable[[object], _StepT]) -> Callable[[object], int]:
    return lambda payload: run(read(payload))


# Each step: its payload read (and checked) from the resident's marshal, then run.
STEPS: dict[str, Callable[[object], int]] = {
    Begin.name: _typed(_begin_step, Begin.from_wire),
    Teardown.name: _typed(_teardown_step, Teardown.from_wire),
    Stopped.name: _typed(_stopped_step, Stopped.from_wire),
    SidecarDied.name: _typed(_sidecar_died_step, SidecarDied.from_wire),
    SidecarBack.name: _typed(_sidecar_back_step, SidecarBack.from_wire),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in STEPS:
        print(f"usage: python -m wrapper.launch.launcher {{{','.join(STEPS)}}} < PAYLOAD (the resident's steps, "
              "their payload in marshal)", file=sys.stderr)  # fmt: skip
        return 2
    # The resident's signals are its own: a Ctrl-C meant for the harness must not cut a step short.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        return STEPS[args[0]](marshal.loads(sys.stdin.buffer.read()))
    except (SpecError, EOFError, ValueError, TypeError) as exc:
        say(f"the {args[0]} step's payload is not one this hctx reads ({exc})")
        return 2


if __name__ == "__main__":
    sys.exit(main())
