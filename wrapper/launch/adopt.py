"""`hctx adopt` (`python -I -m wrapper.launch.adopt`): give a harness session started without
`hctx wrap` the wrapper's claim, a new incarnation and its own sidecar, for its lifetime (issue 36).

A person does not run this: the harness-side trigger `hctx setup` installs does (Claude's status
line and hooks, or the hook, extension or plugin of another harness), on the session's first call, with
`--harness H --pid P`, P the harness's own process. The harness waits on its hooks, so the command
checks its arguments and returns at once; a detached child does the rest, and what goes wrong is
written to the adoption log (`<catalog>/.st2/logs/adopt.log`, `ADOPT_LOG`), never to the harness's
screen. The child:

1. checks P: this user's, alive, and the process that started at the time `/proc` gives now (its
   pid and start time name it, `sidecar.adoption`); exits when P's environment has HCTX_CHANNEL (a
   wrapped seat: the wrapped seat wins, nothing is counted twice);
2. takes the flock in P's adoption directory: one adopter per process. One that finds it held
   (the status line and a hook fired at once) delivers its `--frame-stdin` line to the channel
   once the sidecar listens, and exits;
3. builds the plan through the harness's `launch.py: adopted(pid, cwd, hints)` (a harness without
   one is refused), names the agent as `hctx wrap` names one (`free_seat`: the working directory,
   then NAME-2, ...) once the adoptions of processes that have just ended are over (their residents
   hold their seats while their sidecars drain: a session restarted at once is the same agent, as
   a wrapped one is), claims it with a new incarnation marked `adopted`, and
4. becomes the resident (`wrapper.launch.resident`, adopt mode, by `exec`: the claim's pid stays
   its own), which starts the sidecar on P's adoption channel, watches P through a pidfd (P is not
   its child: nothing is spawned, P is never signalled), and on P's exit drains the sidecar, marks
   the claim stopped and removes the adoption directory. Two processes per adopted agent, as wrapped.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from guard.constants import CHANNEL_MAX_SOCKET_PATH as MAX_SOCKET_PATH
from guard.errors import HctxError, Unusable
from sidecar.adoption import (
    ADOPT_LOG,
    ADOPT_LOG_BYTES,
    LOCK_NAME,
    REFUSED_NAME,
    adoption_base,
    adoption_channel,
    adoption_dir,
    process_start_ticks,
    wrapped_environ,
)
from wrapper.arguments import KNOWN

__all__ = [
    "ADOPT_LOG",
    "ADOPT_LOG_BYTES",
    "DELIVER_TIMEOUT_S",
    "DESCRIPTION",
    "ENDING_WAIT_S",
    "MAX_FRAME_BYTES",
    "AdoptRefused",
    "add_arguments",
    "adopt",
    "build_parser",
    "check_process",
    "main",
    "make_adoption_dir",
    "parse_hints",
    "register",
]

# How long an adopter that lost the flock waits for the winner's sidecar to take its line.
DELIVER_TIMEOUT_S = 15.0
# The most an adopter waits for the adoptions of processes that have ended to be over before it names
# its seat: a resident finishing holds its seat until its sidecar has drained (at most the resident's
# SIDECAR_EXIT_TIMEOUT_S, 5 s) and its claim is marked stopped (a step of its own, a Python start):
# on a loaded one-core machine that took over 10 s. The adopter is detached: the harness never waits.
ENDING_WAIT_S = 30.0
# The most `--frame-stdin` reads: a status-line payload is a few kilobytes.
MAX_FRAME_BYTES = 1024 * 1024
_WRAPPED = 0  # the status of an adopter that stands down (a wrapped seat, a second adopter): nothing wrong


class AdoptRefused(Unusable):
    """Why this process is not adopted; the message goes to the adoption log."""


DESCRIPTION = (
    "Adopt a harness session started without `hctx wrap`: claim an agent for it (named as `hctx wrap` "
    "names one: its working directory, then NAME-2, ...), with a new incarnation marked adopted, and run "
    "its sidecar until the process exits. You do not normally run this yourself: the harness hook, "
    "extension or plugin `hctx setup` installs runs it on a session's first call. It returns at once (the "
    f"harness waits on its hooks) and writes what goes wrong to <catalog>/.st2/logs/{ADOPT_LOG}. A process "
    "started by `hctx wrap` (HCTX_CHANNEL in its environment) is never adopted: the wrapped seat wins."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--harness", required=True, help=f"the harness P runs ({KNOWN})")
    parser.add_argument("--pid", required=True, type=int, metavar="P", help="the harness's own process")
    parser.add_argument("--cwd", type=Path, metavar="DIR", help="its working directory (default: P's)")
    parser.add_argument(
        "--hint", action="append", default=[], metavar="KEY=VALUE",
        help="what the trigger knows of the session, for the harness's plan (e.g. rollout=PATH, url=URL)",
    )  # fmt: skip
    parser.add_argument(
        "--frame-stdin", action="store_true",
        help="stdin holds channel lines the trigger could not deliver (no sidecar listened yet): "
        "they go to the sidecar once it listens",
    )  # fmt: skip
    parser.add_argument(
        "--no-detach", action="store_true",
        help="stay in the foreground with errors on stderr (for diagnosis; the exit status says refused)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hctx adopt", description=DESCRIPTION)
    add_arguments(parser)
    return parser


def parse_hints(words: Sequence[str]) -> dict[str, str]:
    hints: dict[str, str] = {}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise AdoptRefused(f"--hint {word!r} is not KEY=VALUE")
        hints[key] = value
    return hints


def check_process(pid: int) -> int:
    """P's start time, once P is seen to be this user's live process and not a wrapped seat's;
    AdoptRefused otherwise; `_Wrapped` (one of them) for a wrapped seat's, where `adopt` stands down
    without a word rather than refuses."""
    start = process_start_ticks(pid)
    if start is None:
        raise AdoptRefused(f"pid {pid} is not running")
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        raise AdoptRefused(f"pid {pid} is not running") from None
    if owner != os.getuid():
        raise AdoptRefused(f"pid {pid} belongs to uid {owner}, not to this user (uid {os.getuid()})")
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            environ = file.read(4 * 1024 * 1024)
    except OSError as exc:
        raise AdoptRefused(f"pid {pid}'s environment cannot be read ({exc.strerror or exc})") from None
    if process_start_ticks(pid) != start:
        raise AdoptRefused(f"pid {pid} exited while it was being checked")
    pairs = dict(entry.partition(b"=")[::2] for entry in environ.split(b"\0") if entry)
    if wrapped_environ(pairs):
        raise _Wrapped(f"pid {pid} runs under `hctx wrap` or with HCTX_NO_ADOPT (its environment says so); "
                       "not adopting it")  # fmt: skip
    return start


class _Wrapped(AdoptRefused):
    """P is a wrapped seat's harness: nothing to adopt, and nothing wrong."""


class _Adopted(AdoptRefused):
    """Another adopter holds P's flock: it adopts P."""


def make_adoption_dir(pid: int, start_ticks: int) -> str:
    """P's adoption directory (`sidecar.adoption.adoption_dir`), created 0700 with its per-user parent,
    each checked after the fact to be a real directory (not a symlink) owned by this user and open
    to nobody else: in /tmp another user could have made either first. AdoptRefused otherwise."""
    base, directory = adoption_base(), adoption_dir(pid, start_ticks)
    for path in (base, directory):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        found = os.lstat(path)
        if not stat.S_ISDIR(found.st_mode):
            raise AdoptRefused(f"{path} is not a directory (a symlink or a file is there)")
        if found.st_uid != os.getuid():
            raise AdoptRefused(f"{path} belongs to uid {found.st_uid}, not to this user")
        if found.st_mode & 0o077:
            raise AdoptRefused(f"{path} is open to other users (mode {found.st_mode & 0o777:o})")
        if path == base:
            _sweep_refusals(base)
    return directory


def _ended_adoptions(base: str) -> list[str]:
    """The adoption directories in `base` (`adopt-<pid>-<start>`) of processes that have ended."""
    ended = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid, _, start = entry.name.removeprefix("adopt-").partition("-")
            if not (entry.name.startswith("adopt-") and pid.isdigit() and start.isdigit()):
                continue
            if process_start_ticks(int(pid)) != int(start) and entry.is_dir(follow_symlinks=False):
                ended.append(entry.path)
    return ended


def _sweep_refusals(base: str) -> None:
    """The adoption directories of processes that have ended, left holding only a refusal
    (`_mark_refused`): removed, so refusals do not pile up in the runtime directory between logins.
    Anything else there (a live adoption, a refusal of a process that still runs) is left as it is."""
    for path in _ended_adoptions(base):
        with contextlib.suppress(OSError):
            if os.listdir(path) == [REFUSED_NAME]:
                os.unlink(os.path.join(path, REFUSED_NAME))
                os.rmdir(path)


def _await_ending_adoptions(base: str) -> None:
    """Returns once every resident of a process that has ended has exited, or after ENDING_WAIT_S.
    A resident holds its adoption's flock for its whole life, and with it its seat: it drains its
    sidecar, removes the adoption's directory, marks its claim stopped and exits. The lock files are
    held open here, so their flocks are still watched once that directory is gone. One nobody holds
    was left by a resident that was killed: no wait."""
    locks = [fd for fd in map(_open_lock, _ended_adoptions(base)) if fd is not None]
    try:
        ending = [fd for fd in locks if _flock_held(fd)]
        if not ending:
            return
        _log(f"waiting for the adoptions of {len(ending)} ended process(es) to be over before naming a seat")
        deadline = time.monotonic() + ENDING_WAIT_S
        while any(map(_flock_held, ending)):
            if time.monotonic() > deadline:
                _log(f"still not over after {ENDING_WAIT_S:g} s; naming a seat all the same")
                return
            time.sleep(0.05)
    finally:
        for fd in locks:
            os.close(fd)


def _open_lock(directory: str) -> int | None:
    try:
        return os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None


def _flock_held(fd: int) -> bool:
    """Whether another process holds the adopter's flock on this lock file, probed with a shared one
    let go at once. Its process has ended: only an adopter that checked it just before its end could
    take the flock now, and only in the microseconds between creating the lock file and locking it
    would the probe turn it away (it would stand down as if another adopter had the process)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _take_flock(directory: str) -> int:
    """The adopter's flock in P's adoption directory, held (the descriptor stays open across the
    resident's exec); _Adopted when another adopter holds it."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _Adopted("another adopter holds this process's adoption") from None
    return fd


def _deliver_later(channel: str, pending: bytes, start: int, pid: int) -> None:
    """A second adopter's line, handed to the first's sidecar once it listens (while P lives)."""
    from wrapper.launch.resident import send_lines

    deadline = time.monotonic() + DELIVER_TIMEOUT_S
    while time.monotonic() < deadline and process_start_ticks(pid) == start:
        if send_lines(channel, pending):
            return
        time.sleep(0.1)


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError):
        print(f"{stamp} hctx adopt: {message}", file=sys.stderr, flush=True)


def adopt(harness: str, pid: int, cwd: Path | None, hints: Mapping[str, str], pending: bytes) -> int:
    """Adopt P (the module's steps 1-4); returns only when it is not adopted (exec'd otherwise)."""
    from guard.layout import default_catalog_origin, default_host

    try:
        start = check_process(pid)
        # Read while P is surely there: a session over within a second (a short one-shot run) may be
        # gone by the claim, and is still adopted, its sidecar reading what it left.
        where = cwd if cwd is not None else Path(os.readlink(f"/proc/{pid}/cwd"))
        channel = adoption_channel(pid, start)
        if len(os.fsencode(channel)) > MAX_SOCKET_PATH:
            raise AdoptRefused(f"its channel path {channel} is too long for a unix socket; set XDG_RUNTIME_DIR shorter")
        directory = make_adoption_dir(pid, start)
        try:
            lock_fd = _take_flock(directory)
        except _Adopted:
            if pending:
                _deliver_later(channel, pending, start, pid)
            raise
    except _Wrapped:
        return _WRAPPED
    except _Adopted:
        return _WRAPPED
    except (AdoptRefused, OSError) as exc:
        _log(f"not adopting {harness} pid {pid}: {exc}")
        return 1
    try:
        _await_ending_adoptions(adoption_base())
        catalog = default_catalog_origin()[0].absolute()
        return _claim_and_watch(harness, pid, start, where, hints, pending, catalog, default_host(), directory,
                                channel, lock_fd)  # fmt: skip
    except (OSError, HctxError) as exc:
        _log(f"not adopting {harness} pid {pid}: {exc}")
        _mark_refused(directory, str(exc))
    os.close(lock_fd)
    return 1


def _mark_refused(directory: str, why: str) -> None:
    """The refusal, left in P's adoption directory (`REFUSED_NAME`): the trigger starts no other
    adopter for P, which would only refuse again on every status-line refresh. The directory stays
    while P runs; the next adoption after P's end removes it (`_sweep_refusals`)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
        fd = os.open(os.path.join(directory, REFUSED_NAME), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)  # fmt: skip
        try:
            os.write(fd, why.encode(errors="replace") + b"\n")
        finally:
            os.close(fd)


def _claim_and_watch(
    harness: str,
    pid: int,
    start: int,
    where: Path,
    hints: Mapping[str, str],
    pending: bytes,
    catalog: Path,
    host: str,
    directory: str,
    channel: str,
    adoption_lock: int,
) -> int:
    from guard.layout import AgentDir
    from guard.state import AgentLock, ClaimHeld
    from sidecar.registry import adopted_plan, spec_for
    from wrapper.launch.launcher import WrapOptions, claim, exec_resident, free_seat, planned_incarnation
    from wrapper.launch.spec import Adoption, Spec

    spec_for(harness)  # UnknownHarness, naming the known ones
    plan = adopted_plan(harness, pid, where, hints)
    taken: set[str] = set()
    while True:
        agent = AgentDir(catalog, host, free_seat(catalog, host, where, taken))
        options = WrapOptions(agent=agent, harness=harness, argv=())
        lock = AgentLock(agent)
        try:
            incarnation = claim(options, lock, adopted=True)
            break
        except ClaimHeld:  # another launch took this seat this very moment: the next one
            lock.close()
            taken.add(agent.identity)
    it = planned_incarnation(options, incarnation, plan, Path(directory), Path(channel))
    assert it.plan is not None
    it.plan.teardown = False  # nothing was prepared in the working directory: nothing to undo
    _log(f"adopted {harness} pid {pid} as {host}/{agent.identity} (incarnation {incarnation})")
    lock_fd, lock_held = lock.across_exec()
    # The adoption's flock goes along too (the same open file): one adopter per process for the
    # resident's whole life. The resident never hands it on (its children get only what it keeps).
    os.set_inheritable(adoption_lock, True)
    exec_resident(Spec(options.for_resident(), it, lock_fd, lock_held, adoption=Adoption(pid, start, pending)))
    raise AssertionError("unreachable: exec returned")  # pragma: no cover


def _read_pending() -> bytes:
    """Whole lines from stdin (a partial last line, a frame cut short, is dropped)."""
    data = bytearray()
    with contextlib.suppress(OSError):
        while len(data) <= MAX_FRAME_BYTES and (chunk := os.read(0, 65536)):
            data.extend(chunk)
    if len(data) > MAX_FRAME_BYTES:
        return b""
    return bytes(data[: data.rfind(b"\n") + 1])


def _detach(catalog_log: bool) -> bool:
    """Fork: the parent returns False (and exits: the harness's hook is done); the child, in a session
    of its own with stdin and stdout on /dev/null and stderr on the adoption log, returns True."""
    if os.fork() != 0:
        return False
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    log = devnull
    if catalog_log:
        from guard.layout import default_catalog_origin
        from guard.walk import open_log

        with contextlib.suppress(OSError, ValueError):
            log = open_log(default_catalog_origin()[0].absolute(), ADOPT_LOG, ADOPT_LOG_BYTES)
    os.dup2(log, 2)
    for fd in {devnull, log}:
        if fd > 2:
            os.close(fd)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        hints = parse_hints(args.hint)
        if args.pid <= 0:
            raise AdoptRefused(f"--pid {args.pid} is no process")
    except AdoptRefused as exc:
        print(f"hctx adopt: {exc}", file=sys.stderr)
        return 2
    pending = _read_pending() if args.frame_stdin else b""
    if not args.no_detach:
        try:
            child = _detach(catalog_log=True)
        except OSError as exc:
            print(f"hctx adopt: cannot detach ({exc.strerror or exc})", file=sys.stderr)
            return 1
        if not child:
            return 0
        try:
            adopt(args.harness, args.pid, args.cwd, hints, pending)
        except BaseException as exc:  # nobody sees a traceback here: the log says it
            _log(f"not adopting {args.harness} pid {args.pid}: {type(exc).__name__}: {exc}")
        os._exit(0)
    return adopt(args.harness, args.pid, args.cwd, hints, pending)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "adopt",
        help="adopt a harness session started without `hctx wrap` (the hook `hctx setup` installs runs it)",
        description=DESCRIPTION,
    )
    add_arguments(command)
    command.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    words = ["--harness", args.harness, "--pid", str(args.pid)]
    if args.cwd is not None:
        words += ["--cwd", os.fspath(args.cwd)]
    for hint in args.hint:
        words += ["--hint", hint]
    words += [flag for flag, on in (("--frame-stdin", args.frame_stdin), ("--no-detach", args.no_detach)) if on]
    return main(words)


if __name__ == "__main__":
    sys.exit(main())
