"""The resident's own runtime, the standard library only: a selector loop (`Loop`), fork and exec
as subprocess would (`spawn`), and the few stand-ins that keep heavier modules out of the process.
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the typing module is not worth its import here
    import signal
    from collections.abc import Callable, Sequence
    from typing import Any
else:
    import _signal as signal  # `signal` without its enum module: the same functions, plain int constants

__all__ = ["READ", "ROOT", "STOP_SIGNALS", "WRITE", "Loop", "checkout_env", "prog", "say", "spawn", "suppress"]

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
# The folder `wrapper` and `guard` are in (site-packages, or a checkout), for child interpreters.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def checkout_env() -> dict[str, str]:
    """A child Python imports this checkout's packages even when hctx runs from a source tree."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ) | {"PYTHONPATH": ROOT if not path else f"{ROOT}{os.pathsep}{path}"}


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
