"""`hctx wrap`: claim, remove, fork the sidecar, run the harness, forward signals, relaunch."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import trio

import wrapper.reaper
from guard.constants import CHANNEL_DROP_REPORT
from guard.constants import CHANNEL_MAX_FRAME_BYTES as MAX_FRAME_BYTES
from guard.constants import CHANNEL_MAX_SOCKET_PATH as MAX_SOCKET_PATH
from guard.errors import ChannelPathError, ClaimHeld, UnknownHarness, UsageError
from guard.record import Harness
from guard.state import (
    AgentLock,
    HarnessState,
    claim_agent,
    held_by_live_wrapper,
    read_state,
    update_claim,
    wrapper_lock_evidence,
)
from guard.store import AgentDir, as_name
from wrapper.harnesses import LaunchPlan, account_json, prepare, teardown, transport_json
from wrapper.sidecars import SIDECAR_EXIT_TIMEOUT_S, Sidecars, SidecarSpec

__all__ = [
    "CLAIM_REFUSED_STATUS",
    "FINAL_STATE_RETRIES_S",
    "HARNESS_KILL_DEADLINE_S",
    "SEAT_SUFFIX_ROOM",
    "TAKEOVER_WAIT_S",
    "TAP_QUEUE_BYTES",
    "TAP_RECONNECT_S",
    "GroupMode",
    "Reaper",
    "RestartPolicy",
    "Session",
    "TapQueue",
    "WrapOptions",
    "claim",
    "exit_status",
    "free_seat",
    "parse_command",
    "run_incarnation",
    "run_wrap",
    "say",
    "tap_stdout_lines",
    "unrunnable",
    "wrap",
]

RestartPolicy = Literal["no", "on-failure", "always"]
# From the SIGTERM (or SIGHUP) a harness is sent to the SIGKILL of whatever of its group is left.
HARNESS_KILL_DEADLINE_S = 3.0
# How long a takeover waits for the wrapper it stops: its harness's deadline, its sidecar's drain.
TAKEOVER_WAIT_S = HARNESS_KILL_DEADLINE_S + SIDECAR_EXIT_TIMEOUT_S + 2.0
# A claim refused because a live wrapper holds it: the wrapper's own usage-error status.
CLAIM_REFUSED_STATUS = 2
# Back-off between attempts at the final harness-state write (a full disk may clear meanwhile).
FINAL_STATE_RETRIES_S = (0.1, 0.5)
TAP_QUEUE_BYTES = 4 * 1024 * 1024
TAP_RECONNECT_S = 0.5


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
    record: Path | None = None  # `--record`: a file `create_recording` made; every sidecar appends to it


def say(message: str) -> None:
    print(f"hctx wrap: {message}", file=sys.stderr, flush=True)


def exit_status(returncode: int) -> int:
    """The shell's convention: a harness killed by signal N exits the wrapper with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Session:
    """Signals that arrive while the wrapper supervises; any of them stops further relaunches."""

    def __init__(self) -> None:
        self.stopped = trio.Event()
        self.process: subprocess.Popen[bytes] | None = None
        # The harness's own process group, when it has one (see _harness_group): signals go to all of it.
        self.group: int | None = None
        # A signal that came while no harness ran (during a claim, a back-off or a slow sidecar):
        # the harness about to start gets it, so it is neither lost nor outlived.
        self.unforwarded: int | None = None
        # A SIGTERM or SIGHUP came: the harness has HARNESS_KILL_DEADLINE_S to go, then SIGKILL.
        self.terminating = trio.Event()

    @property
    def stop_requested(self) -> bool:
        return self.stopped.is_set()

    async def forward_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                self.stopped.set()
                if signum != signal.SIGINT:
                    self.terminating.set()
                process = self.process
                if process is None or process.poll() is not None:
                    self.unforwarded = signum
                    continue
                if signum == signal.SIGINT and self.group is None and _terminal_delivers_sigint():
                    continue  # the terminal already sent it to the harness: a second would double it
                self.signal(signum)

    def signal(self, signum: int) -> None:
        """To the harness's whole group when it has its own, else to the harness."""
        if self.group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.group, signum)
        elif self.process is not None:
            self.process.send_signal(signum)

    def started(self, process: subprocess.Popen[bytes], group: int | None) -> None:
        self.process, self.group = process, group
        if self.unforwarded is not None:
            self.signal(self.unforwarded)

    async def kill_after_deadline(self) -> None:
        """Beside a running harness: once it is told to terminate, SIGKILL it if it outlives the deadline."""
        await self.terminating.wait()
        await trio.sleep(HARNESS_KILL_DEADLINE_S)
        say(f"the harness outlived its SIGTERM by {HARNESS_KILL_DEADLINE_S:g}s; killing it")
        self.signal(signal.SIGKILL)


def _terminal_delivers_sigint() -> bool:
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


def _open_terminal() -> int | None:
    try:
        return os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None


GroupMode = Literal["own", "wrapper's", "shared"]


def _harness_group() -> GroupMode:
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


async def wrap(options: WrapOptions) -> int:
    if (refused := unrunnable(options.argv, os.environ.get("PATH"))) is not None:
        not_started, why = refused
        say(f"cannot start {options.argv[0]!r}: {why}; nothing claimed, no sidecar started")
        return not_started
    session = Session()
    status: int | None = None  # None until a harness ran
    incarnation: str | None = None
    lock = AgentLock(options.agent)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.forward_signals)
        restarts = 0
        while True:
            try:
                incarnation = await _claim(options, lock, relaunch_of=incarnation)
            except ClaimHeld as held:
                say(_held_text(options.agent, held.holder, relaunch=status is not None))
                break
            except OSError as exc:
                if status is None:
                    raise  # nothing ran yet: the wrapper's own failure
                say(f"cannot claim {_name(options.agent)} for relaunch {restarts} ({exc}); not relaunching")
                break
            status = await run_incarnation(options, session, incarnation)
            if session.stop_requested or not _relaunch_wanted(options, status, restarts):
                break
            delay = min(options.restart_delay_s * 2**restarts, options.restart_delay_max_s)
            restarts += 1
            say(f"harness exited with {status}; relaunch {restarts} in {delay:.2f}s")
            with trio.move_on_after(delay):
                await session.stopped.wait()
            if session.stop_requested:
                break
        if incarnation is not None:
            await _mark_stopped(options.agent, incarnation)
        nursery.cancel_scope.cancel()
    lock.close()
    return CLAIM_REFUSED_STATUS if status is None else status


def _relaunch_wanted(options: WrapOptions, status: int, restarts: int) -> bool:
    if options.max_restarts is not None and restarts >= options.max_restarts:
        return False
    return options.restart == "always" or (options.restart == "on-failure" and status != 0)


async def _mark_stopped(agent: AgentDir, incarnation: str) -> None:
    """The claim reads `stopped` once its wrapper is done, unless it was taken over meanwhile. A write
    that fails (a full disk) is retried, then reported; the exit status stays the harness's."""
    for delay in (*FINAL_STATE_RETRIES_S, None):
        try:
            update_claim(agent, incarnation, lambda state: state.model_copy(update={"desired_state": "stopped"}))
            return
        except OSError as exc:
            if delay is None:
                say(f"cannot record the stop in {_name(agent)}'s harness-state ({exc}); the claim is left whole, "
                    "reading running under this wrapper's pid, which readers see gone once it exits")  # fmt: skip
                return
            await trio.sleep(delay)


def claim(options: WrapOptions, lock: AgentLock, *, relaunch_of: str | None = None, takeover: bool = False) -> str:
    """A fresh incarnation, claimed under the state lock, the old record removed; ClaimHeld while
    another wrapper holds the agent (its wrapper lock), unless `takeover`."""
    incarnation = secrets.token_hex(16)
    now = time.time_ns() // 1_000_000
    locked = lock.take()
    claim_agent(options.agent, options.harness, incarnation, now, os.getpid(), locked=locked,
                relaunch_of=relaunch_of, takeover=takeover)  # fmt: skip
    return incarnation


async def _claim(options: WrapOptions, lock: AgentLock, *, relaunch_of: str | None) -> str:
    """`claim`; a first claim with --takeover stops the wrapper holding the agent, then claims. Only
    a process proven to hold the agent's wrapper lock is signalled; otherwise it is refused, saying why."""
    try:
        return claim(options, lock, relaunch_of=relaunch_of)
    except ClaimHeld as held:
        if relaunch_of is not None or not options.takeover or held.holder is None:
            raise
        pid = held.holder.wrapper_pid
        why = await _stop_wrapper(options.agent, pid)
        if why is not None:
            say(f"not taking {_name(options.agent)} over: {why}; nothing was signalled")
            raise
        with trio.move_on_after(TAKEOVER_WAIT_S):
            while not lock.take():  # noqa: ASYNC110 (a lock released by a process's exit has no event)
                await trio.sleep(0.05)
        if not lock.held:
            say(f"wrapper pid {pid} did not stop within {TAKEOVER_WAIT_S:g}s; taking the claim regardless")
        return claim(options, lock, takeover=True)


async def _stop_wrapper(agent: AgentDir, pid: int) -> str | None:
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
        with trio.move_on_after(TAKEOVER_WAIT_S):
            await trio.lowlevel.wait_readable(pidfd)
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


async def run_incarnation(options: WrapOptions, session: Session, incarnation: str) -> int:
    try:
        plan = prepare(LaunchPlan(harness=options.harness, argv=options.argv, cwd=Path.cwd()))
    except (OSError, ValueError) as exc:
        say(f"cannot prepare the {options.harness} launch: {exc}")
        return 2
    try:
        directory, channel = _channel_path()
        try:
            return await _run_with_sidecar(options, session, plan, incarnation, channel)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        teardown(plan)  # what prepare left in the working directory, undone


async def _run_with_sidecar(
    options: WrapOptions, session: Session, plan: LaunchPlan, incarnation: str, channel: Path
) -> int:
    agent = options.agent
    group = _harness_group()
    reaper = None if group == "shared" else await Reaper.start()
    spec = SidecarSpec(agent, options.harness, incarnation, channel, transport_json(plan), account_json(plan),
                       options.record)  # fmt: skip
    sidecars = Sidecars(spec, say)
    try:
        if not await sidecars.start() and sidecars.running:  # one that died is keep_alive's to report
            say("the sidecar did not come up; the harness runs without context telemetry")
        env = os.environ | plan.env | {
            "HCTX_CHANNEL": os.fspath(channel),
            "HCTX_AGENT": agent.identity,
            "HCTX_INCARNATION": incarnation,
            "HCTX_CATALOG": os.fspath(agent.catalog),
        }  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sidecars.keep_alive)  # a sidecar that dies is replaced while the harness runs
            status = await _run_harness(plan, env, channel, session, group, reaper)
            nursery.cancel_scope.cancel()
        return status
    finally:
        with trio.CancelScope(shield=True):
            await sidecars.stop()  # first: a last hook process of the harness's group still lands its frame
            if reaper is not None:
                await reaper.finish(group_done=group == "wrapper's")


class Reaper:
    """This incarnation's wrapper/reaper.py process (see there): it ends the harness's process group
    when the wrapper is gone, SIGKILLed or not, and at the harness's end when the group is its own."""

    def __init__(self, process: trio.Process, lifeline: int) -> None:
        self.process = process
        self._lifeline = lifeline

    @classmethod
    async def start(cls) -> Reaper:
        lifeline_read, lifeline_write = os.pipe()
        try:
            process = await trio.lowlevel.open_process(
                # Isolated and without site: it needs only the standard library, and starts in ~10 ms.
                [sys.executable, "-I", "-S", wrapper.reaper.__file__, "--lifeline-fd", str(lifeline_read),
                 "--deadline", str(HARNESS_KILL_DEADLINE_S)],
                pass_fds=(lifeline_read,),
                process_group=0,  # outside the group it ends, and out of the terminal's reach
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            os.close(lifeline_write)
            raise
        finally:
            os.close(lifeline_read)
        return cls(process, lifeline_write)

    def watch(self, group: int) -> None:
        self._order(b"group %d\n" % group)

    async def finish(self, *, group_done: bool) -> None:
        """Close the lifeline, saying `done` when the group is not to be ended, and wait (bounded)."""
        if group_done:
            self._order(b"done\n")
        os.close(self._lifeline)
        with trio.move_on_after(HARNESS_KILL_DEADLINE_S + 2.0):
            await self.process.wait()

    def _order(self, line: bytes) -> None:
        with contextlib.suppress(OSError):  # a reaper that is gone cannot be told; PDEATHSIG remains
            os.write(self._lifeline, line)


_PR_SET_PDEATHSIG = 1


def _die_with_wrapper() -> None:
    """Runs in the forked harness: a SIGKILLed wrapper takes its harness along, leaving no orphan.

    The death signal follows the forking *thread*, so the harness must be forked from the main
    thread (not from a trio worker thread, which retires when idle and would take the harness).
    """
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def _run_harness(
    plan: LaunchPlan, env: dict[str, str], channel: Path, session: Session, group: GroupMode, reaper: Reaper | None
) -> int:
    try:
        # Forked here, on the main thread, on purpose: see _die_with_wrapper.
        process = subprocess.Popen(  # noqa: ASYNC220
            list(plan.argv),
            env=env,
            cwd=plan.cwd,
            stdout=subprocess.PIPE if plan.tap_stdout else None,
            preexec_fn=_die_with_wrapper,
            process_group=0 if group == "own" else None,
        )
    except OSError as exc:
        say(f"cannot start {plan.argv[0]!r}: {exc.strerror or exc}")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    session.started(process, process.pid if group == "own" else None)
    if reaper is not None:
        reaper.watch(process.pid if group == "own" else os.getpgrp())
    try:
        async with trio.open_nursery() as nursery:
            if plan.tap_stdout and process.stdout is not None:
                stdout = trio.lowlevel.FdStream(os.dup(process.stdout.fileno()))
                process.stdout.close()
                nursery.start_soon(tap_stdout_lines, stdout, plan.harness, channel)
            async with trio.open_nursery() as watch:
                watch.start_soon(session.kill_after_deadline)
                returncode = await _wait_exit(process)
                watch.cancel_scope.cancel()
    finally:
        session.process = None
        session.group = None
    return exit_status(returncode)


async def _wait_exit(process: subprocess.Popen[bytes]) -> int:
    """Sleep until the process exits (a pidfd becomes readable), then reap it."""
    pidfd = os.pidfd_open(process.pid)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return process.wait()


async def tap_stdout_lines(stdout: trio.abc.ReceiveStream, harness: Harness, channel: Path) -> None:
    """Copy the harness's stdout to ours untouched; send each line to the sidecar on the side.

    Lines are framed by the sidecar's own `LineFramer` at the channel's limit, and each goes as the
    harness's tap frame (its spec's `tap_frame`, which carries the line's very bytes), so the
    sidecar decodes exactly the bytes a replay of the same stdout does. The copy never waits on the
    sidecar: tapped lines queue up to TAP_QUEUE_BYTES, and past that the oldest give way, so after a
    burst (thousands of deltas) the newest lines, the usage update among them, still go. What gave
    way is counted and reported to the sidecar, which logs it. A line over the limit, or one whose
    frame would be (the sidecar refuses those on every wire), is not sent.
    """
    from sidecar.framing import Line, LineFramer
    from sidecar.registry import spec_for

    tap_frame = spec_for(harness).tap_frame
    if tap_frame is None:
        raise UnknownHarness(f"the {harness} harness has no stdout tap")
    queue = TapQueue(f"{harness} stdout tap")
    framer = LineFramer(MAX_FRAME_BYTES)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_send_tapped, queue, channel)
        try:
            async with trio.lowlevel.FdStream(os.dup(sys.stdout.fileno())) as out:
                while chunk := await stdout.receive_some(65536):
                    await out.send_all(chunk)
                    for line in framer.receive_data(bytes(chunk)):
                        if isinstance(line, Line) and line.data.strip():
                            frame = tap_frame(line.data)
                            if len(frame) <= MAX_FRAME_BYTES:
                                queue.put(frame + b"\n")
        finally:
            queue.close()


class TapQueue:
    """Tapped lines owed to the sidecar, bounded in bytes; when full, the oldest give way."""

    def __init__(self, where: str) -> None:
        self.where = where  # what the drop report names
        self.lines: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.dropped = 0  # lines that gave way (or were lost with the sidecar) since the last report
        self.closed = False
        self._changed = trio.Event()

    def put(self, line: bytes) -> None:
        self.lines.append(line)
        self.size += len(line)
        while self.size > TAP_QUEUE_BYTES:
            self.size -= len(self.lines.popleft())
            self.dropped += 1
        self._changed.set()

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    async def wait(self) -> None:
        """Until there is something to send, or the copy ended."""
        if not self.lines and not self.closed:
            await self._changed.wait()
            self._changed = trio.Event()

    def take(self) -> tuple[bytes, int]:
        """Everything queued in one batch, led by a drop report when lines gave way; and how many
        lines the batch carries, to count them if it is lost."""
        report = b""
        if self.dropped:
            frame = {"type": CHANNEL_DROP_REPORT, "where": self.where, "count": self.dropped}
            report = json.dumps(frame).encode() + b"\n"
        batch, count = report + b"".join(self.lines), len(self.lines) + self.dropped
        self.lines.clear()
        self.size = self.dropped = 0
        return batch, count


async def _send_tapped(queue: TapQueue, channel: Path) -> None:
    """Send tapped lines to the sidecar in batches; when it is gone, try again (a sidecar started
    again listens on the same channel) while the queue keeps the newest lines. Nothing is printed
    here: a write to a stderr nobody drains would stall the copy, and the wrapper already says when
    its sidecar died; the lines lost meanwhile reach the sidecar's log as a drop report."""
    stream: trio.SocketStream | None = None
    while True:
        await queue.wait()
        if stream is None:
            try:
                stream = await trio.open_unix_socket(os.fspath(channel))
            except OSError:
                if queue.closed:
                    return
                await trio.sleep(TAP_RECONNECT_S)
                continue
        if queue.closed and not queue.lines and not queue.dropped:
            break
        batch, count = queue.take()
        try:
            await stream.send_all(batch)
        except (OSError, trio.BrokenResourceError):
            queue.dropped += count
            await stream.aclose()
            if queue.closed:
                return
            stream = None
    await stream.aclose()


def run_wrap(options: WrapOptions) -> int:
    return trio.run(wrap, options)


def parse_command(command: Sequence[str]) -> tuple[str, ...]:
    argv = tuple(command[1:] if command and command[0] == "--" else command)
    if not argv:
        raise UsageError("no harness command given after --")
    return argv


SEAT_SUFFIX_ROOM = 4  # "-999"


def free_seat(catalog: Path, host: str, cwd: Path) -> str:
    """The agent name for a launch that gave none: the working directory's name, or, while a live
    wrapper on this host holds that seat, the first of NAME-2, NAME-3, ... that none holds."""
    base = as_name(cwd.name, fallback="agent", room=SEAT_SUFFIX_ROOM)
    for seat in (base, *(f"{base}-{n}" for n in range(2, 10**SEAT_SUFFIX_ROOM // 10))):
        if not held_by_live_wrapper(read_state(AgentDir(catalog, host, seat)), host):
            return seat
    raise UsageError(f"every seat {base}, {base}-2, ... in {catalog} is held by a live wrapper")
