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
- the harness's stdout tap, for a harness that speaks on stdout (`wrapper.launch.tap`);
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
import marshal
import os
import sys
import time

from wrapper.launch.loop import READ, ROOT, STOP_SIGNALS, Loop, checkout_env, prog, say, spawn, suppress
from wrapper.launch.spec import (
    Adoption,
    Begin,
    Incarnation,
    Options,
    SidecarBack,
    SidecarDied,
    Spec,
    SpecError,
    Step,
    Stopped,
    Teardown,
)
from wrapper.launch.tap import Tap

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
    "SIDECAR_EXIT_TIMEOUT_S",
    "SIDECAR_READY_TIMEOUT_S",
    "SIDECAR_RESTART_DELAYS_S",
    "SIDECAR_STABLE_S",
    "STEP_NICENESS",
    "STEP_TIMEOUT_S",
    "Keeper",
    "Session",
    "Sidecars",
    "Steps",
    "WrapperLock",
    "adopt_supervise",
    "end_group",
    "exit_status",
    "harness_group",
    "main",
    "run_incarnation",
    "send_lines",
    "sidecar_argv",
    "sidecar_restart_delay",
    "supervise",
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


def exit_status(returncode: int) -> int:
    """The shell's convention: a harness killed by signal N exits the wrapper with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def sidecar_restart_delay(quick_deaths: int) -> float | None:
    """The back-off before the next sidecar after `quick_deaths` quick deaths; None: give up."""
    return SIDECAR_RESTART_DELAYS_S[quick_deaths] if quick_deaths < len(SIDECAR_RESTART_DELAYS_S) else None


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
        end = (sys.executable, "-I", "-S", "-c", KEEPER_END, ROOT, f"{self.deadline_s:g}")
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
    sys.path[0] = ROOT
    sys.exit(main())
