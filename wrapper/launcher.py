"""`hctx wrap`: claim, remove, fork the sidecar, run the harness, forward signals, relaunch."""

from __future__ import annotations

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

from guard.constants import CHANNEL_MAX_FRAME_BYTES as MAX_FRAME_BYTES
from guard.constants import CHANNEL_MAX_SOCKET_PATH as MAX_SOCKET_PATH
from guard.record import Harness
from guard.state import new_claim, read_state, write_state
from guard.store import AgentDir, remove_context
from wrapper.harnesses import LaunchPlan, prepare

RestartPolicy = Literal["no", "on-failure", "always"]
SIDECAR_READY_TIMEOUT_S = 10.0
SIDECAR_EXIT_TIMEOUT_S = 5.0
TAP_QUEUE = 256


@dataclass(frozen=True)
class WrapOptions:
    agent: AgentDir
    harness: Harness
    argv: tuple[str, ...]
    restart: RestartPolicy = "no"
    max_restarts: int | None = None
    restart_delay_s: float = 1.0
    restart_delay_max_s: float = 60.0


def say(message: str) -> None:
    print(f"hctx: {message}", file=sys.stderr, flush=True)


def exit_status(returncode: int) -> int:
    """The shell's convention: a harness killed by signal N exits the wrapper with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Session:
    """Signals that arrive while the wrapper supervises; any of them stops further relaunches."""

    def __init__(self) -> None:
        self.stopped = trio.Event()
        self.process: subprocess.Popen[bytes] | None = None
        # A signal that came while no harness ran (during a claim, a back-off or a slow sidecar):
        # the harness about to start gets it, so it is neither lost nor outlived.
        self.unforwarded: int | None = None

    @property
    def stop_requested(self) -> bool:
        return self.stopped.is_set()

    async def forward_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                self.stopped.set()
                process = self.process
                if process is None or process.poll() is not None:
                    self.unforwarded = signum
                    continue
                if signum == signal.SIGINT and _terminal_delivers_sigint():
                    continue  # the terminal already sent it to the harness: a second would double it
                process.send_signal(signum)

    def started(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        if self.unforwarded is not None:
            process.send_signal(self.unforwarded)


def _terminal_delivers_sigint() -> bool:
    """True when Ctrl-C on our terminal reaches the harness directly (we share its foreground group).

    Asked of the controlling terminal itself: stdin may be a pipe (a client driving an app-server)
    while the terminal still delivers Ctrl-C to the whole foreground group.
    """
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False  # no controlling terminal: whoever sent SIGINT sent it to us alone
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)


async def wrap(options: WrapOptions) -> int:
    session = Session()
    status = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.forward_signals)
        restarts = 0
        while True:
            status = await run_incarnation(options, session)
            if session.stop_requested or not _relaunch_wanted(options, status, restarts):
                break
            delay = min(options.restart_delay_s * 2**restarts, options.restart_delay_max_s)
            restarts += 1
            say(f"harness exited with {status}; relaunch {restarts} in {delay:.2f}s")
            with trio.move_on_after(delay):
                await session.stopped.wait()
            if session.stop_requested:
                break
        _mark_stopped(options)
        nursery.cancel_scope.cancel()
    return status


def _relaunch_wanted(options: WrapOptions, status: int, restarts: int) -> bool:
    if options.max_restarts is not None and restarts >= options.max_restarts:
        return False
    return options.restart == "always" or (options.restart == "on-failure" and status != 0)


def _mark_stopped(options: WrapOptions) -> None:
    state = read_state(options.agent)
    if state is not None and state.wrapper_pid == os.getpid():
        write_state(options.agent, state.model_copy(update={"desired_state": "stopped"}))


def claim(options: WrapOptions) -> str:
    """A fresh incarnation: the claim written atomically, then the old record removed."""
    incarnation = secrets.token_hex(16)
    previous = read_state(options.agent)
    now = time.time_ns() // 1_000_000
    state = new_claim(options.agent, options.harness, incarnation, now, os.getpid(), previous)
    write_state(options.agent, state)
    remove_context(options.agent)
    return incarnation


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
    raise OSError("no directory short enough for a unix socket path")


async def run_incarnation(options: WrapOptions, session: Session) -> int:
    incarnation = claim(options)
    try:
        plan = prepare(LaunchPlan(harness=options.harness, argv=options.argv, cwd=Path.cwd()))
    except (OSError, ValueError) as exc:
        say(f"cannot prepare the {options.harness} launch: {exc}")
        return 2
    directory, channel = _channel_path()
    try:
        return await _run_with_sidecar(options, session, plan, incarnation, channel)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _run_with_sidecar(
    options: WrapOptions, session: Session, plan: LaunchPlan, incarnation: str, channel: Path
) -> int:
    agent = options.agent
    lifeline_read, lifeline_write = os.pipe()
    ready_read, ready_write = os.pipe()
    try:
        sidecar = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-m", "sidecar", "--harness", options.harness),
                *("--catalog", os.fspath(agent.catalog), "--host", agent.host, "--agent", agent.identity),
                *("--incarnation", incarnation, "--channel", os.fspath(channel)),
                *("--lifeline-fd", str(lifeline_read), "--ready-fd", str(ready_write)),
                *("--transport", json.dumps(plan.transport)),
            ],
            pass_fds=(lifeline_read, ready_write),
            process_group=0,  # its own group: the terminal's Ctrl-C is the harness's, not the sidecar's
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=_sidecar_env(),
        )
    except BaseException:
        os.close(lifeline_write)
        os.close(ready_read)
        raise
    finally:
        os.close(lifeline_read)
        os.close(ready_write)
    try:
        if not await _wait_ready(ready_read):
            say("the sidecar did not come up; the harness runs without context telemetry")
        env = os.environ | plan.env | {
            "HCTX_CHANNEL": os.fspath(channel),
            "HCTX_AGENT": agent.identity,
            "HCTX_INCARNATION": incarnation,
            "HCTX_CATALOG": os.fspath(agent.catalog),
        }  # fmt: skip
        return await _run_harness(plan, env, channel, session)
    finally:
        os.close(lifeline_write)  # the sidecar drains what it has and exits
        with trio.move_on_after(SIDECAR_EXIT_TIMEOUT_S) as waited:
            await sidecar.wait()
        if waited.cancelled_caught:
            say("the sidecar did not exit in time; killed")
            sidecar.kill()
            await sidecar.wait()


def _sidecar_env() -> dict[str, str]:
    """The sidecar imports this checkout's packages even when hctx runs from a source tree."""
    root = os.fspath(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


async def _wait_ready(ready_read: int) -> bool:
    with trio.move_on_after(SIDECAR_READY_TIMEOUT_S):
        async with trio.lowlevel.FdStream(ready_read) as stream:
            return await stream.receive_some(16) == b"ready\n"
    return False


_PR_SET_PDEATHSIG = 1


def _die_with_wrapper() -> None:
    """Runs in the forked harness: a SIGKILLed wrapper takes its harness along, leaving no orphan.

    The death signal follows the forking *thread*, so the harness must be forked from the main
    thread (not from a trio worker thread, which retires when idle and would take the harness).
    """
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def _run_harness(plan: LaunchPlan, env: dict[str, str], channel: Path, session: Session) -> int:
    try:
        # Forked here, on the main thread, on purpose: see _die_with_wrapper.
        process = subprocess.Popen(  # noqa: ASYNC220
            list(plan.argv),
            env=env,
            cwd=plan.cwd,
            stdout=subprocess.PIPE if plan.tap_stdout else None,
            preexec_fn=_die_with_wrapper,
        )
    except OSError as exc:
        say(f"cannot start {plan.argv[0]!r}: {exc.strerror or exc}")
        return 127 if isinstance(exc, FileNotFoundError) else 126
    session.started(process)
    try:
        async with trio.open_nursery() as nursery:
            if plan.tap_stdout and process.stdout is not None:
                stdout = trio.lowlevel.FdStream(os.dup(process.stdout.fileno()))
                process.stdout.close()
                nursery.start_soon(_tap_stdout, stdout, plan.tap_stdout, channel)
            returncode = await _wait_exit(process)
    finally:
        session.process = None
    return exit_status(returncode)


async def _wait_exit(process: subprocess.Popen[bytes]) -> int:
    """Sleep until the process exits (a pidfd becomes readable), then reap it."""
    pidfd = os.pidfd_open(process.pid)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return process.wait()


async def _tap_stdout(stdout: trio.abc.ReceiveStream, frame_type: str, channel: Path) -> None:
    """Copy the harness's stdout to ours untouched; send each line to the sidecar on the side.

    The copy never waits on the sidecar: lines that find the tap queue full are not tapped.
    """
    send, receive = trio.open_memory_channel[bytes](TAP_QUEUE)
    prefix = b'{"type":' + json.dumps(frame_type).encode() + b',"payload":'
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_send_tapped, receive, channel)
        async with send, trio.lowlevel.FdStream(os.dup(sys.stdout.fileno())) as out:
            pending = b""
            while chunk := await stdout.receive_some(65536):
                await out.send_all(chunk)
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                if len(pending) > MAX_FRAME_BYTES:
                    pending = b""
                for line in lines:
                    if line.strip() and len(line) <= MAX_FRAME_BYTES:
                        with contextlib.suppress(trio.WouldBlock):
                            send.send_nowait(prefix + line + b"}\n")


async def _send_tapped(frames: trio.MemoryReceiveChannel[bytes], channel: Path) -> None:
    """Send tapped lines to the sidecar; if it is gone, keep draining so the copy never stalls."""
    async with frames:
        try:
            stream: trio.SocketStream | None = await trio.open_unix_socket(os.fspath(channel))
        except OSError as exc:
            say(f"stdout tap cannot reach the sidecar: {exc}")
            stream = None
        async for frame in frames:
            if stream is None:
                continue
            try:
                await stream.send_all(frame)
            except (OSError, trio.BrokenResourceError) as exc:
                say(f"stdout tap lost the sidecar: {exc}; the harness's output still flows")
                await stream.aclose()
                stream = None
        if stream is not None:
            await stream.aclose()


def run_wrap(options: WrapOptions) -> int:
    return trio.run(wrap, options)


def parse_command(command: Sequence[str]) -> tuple[str, ...]:
    argv = tuple(command[1:] if command and command[0] == "--" else command)
    if not argv:
        raise ValueError("no harness command given after --")
    return argv
