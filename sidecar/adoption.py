"""Where an adopted harness process's sidecar listens, computable by anyone who knows its pid.

A harness session started without `hctx wrap` is adopted (issue 36): the harness-side trigger
(Claude's tee, a Codex hook, pi's extension, OpenCode's plugin) runs `python -I -m
wrapper.launch.adopt --harness H --pid P`, and that adopter claims an agent for P and starts its
sidecar. Both sides must agree on where that sidecar listens without ever having talked, so the
place is a function of the one process they both see: P's pid and its start time (clock ticks
since boot, `/proc/<pid>/stat` field 22), which together name one process even after the pid is
reused:

    <$XDG_RUNTIME_DIR, else /tmp>/hctx-<uid>/adopt-<pid>-<start ticks>/channel

The adopter (wrapper.launch.adopt) creates the directory (0700, checked to be this user's alone)
and holds its flock (`LOCK_NAME`): one adopter per process; the adoption's resident removes the
directory when P exits. A TypeScript extension computes the same
path from `/proc/<pid>/stat`.

The standard library only, and only modules a `python -I -S` interpreter has loaded or builds in
(`posix`, no `os`, no `pathlib`): Claude's tee imports this on every status-line refresh.
"""

import posix

__all__ = [
    "ADOPT_ENV_GUARDS",
    "ADOPT_LOG",
    "ADOPT_LOG_BYTES",
    "CHANNEL_NAME",
    "LOCK_NAME",
    "REFUSED_NAME",
    "adoption_base",
    "adoption_channel",
    "adoption_dir",
    "deliver",
    "process_start_ticks",
    "process_stat",
    "wrapped_environ",
]

# A process whose environment holds any of these (non-empty) is never adopted: HCTX_CHANNEL is a
# wrapped seat's (`hctx wrap` sets it: the wrapped seat wins, nothing is counted twice), and
# HCTX_NO_ADOPT=1 keeps a plain session plain (a test's tee, or a person who wants one unseen).
ADOPT_ENV_GUARDS = ("HCTX_CHANNEL", "HCTX_NO_ADOPT")
CHANNEL_NAME = "channel"
# Why a process was not adopted, written by the adopter and the triggers that start none (Codex's
# hook), in `<catalog>/.st2/logs/`: no agent log is named so (theirs are host~agent.jsonl).
ADOPT_LOG = "adopt.log"
ADOPT_LOG_BYTES = 1024 * 1024  # past this the log starts afresh, its predecessor kept as adopt.log.1
LOCK_NAME = "adopter.lock"
# Left in the adoption directory by an adopter that refused the process (the reason inside): the
# trigger sees it and starts no other adopter for that process, which would only refuse again.
REFUSED_NAME = "refused"
_S_IFMT, _S_IFDIR = 0o170000, 0o040000


def process_stat(pid: int) -> "tuple[str, int, int] | None":
    """What `/proc/<pid>/stat` says of a live process: its command name (`comm`), its parent's pid
    and when it started (clock ticks since boot, field 22); None when no such process runs (or it
    is a zombie: it has exited, only its status is left)."""
    if pid <= 0:
        return None
    try:
        fd = posix.open(f"/proc/{pid}/stat", posix.O_RDONLY | posix.O_CLOEXEC)
    except OSError:
        return None
    try:
        stat = posix.read(fd, 4096)
    except OSError:
        return None
    finally:
        posix.close(fd)
    # The command's name sits in parentheses and may itself hold spaces and parentheses.
    head, _, tail = stat.rpartition(b")")
    fields = tail.split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return head.partition(b"(")[2].decode(errors="replace"), int(fields[1]), int(fields[19])
    except ValueError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (`/proc/<pid>/stat` field 22): with the
    pid, it names one process even after the pid is reused. None when no such process runs."""
    stat = process_stat(pid)
    return None if stat is None else stat[2]


def adoption_base(environ: "dict[bytes, bytes] | None" = None) -> str:
    """`<$XDG_RUNTIME_DIR, else /tmp>/hctx-<uid>`: the directory holding this user's adoptions."""
    env = posix.environ if environ is None else environ
    runtime = env.get(b"XDG_RUNTIME_DIR", b"").decode(errors="surrogateescape").rstrip("/")
    if not runtime or not runtime.startswith("/") or not _is_dir(runtime):
        runtime = "/tmp"
    return f"{runtime}/hctx-{posix.getuid()}"


def adoption_dir(pid: int, start_ticks: int, environ: "dict[bytes, bytes] | None" = None) -> str:
    """The adoption directory of the process `pid` that started at `start_ticks`."""
    return f"{adoption_base(environ)}/adopt-{int(pid)}-{int(start_ticks)}"


def adoption_channel(pid: int, start_ticks: int, environ: "dict[bytes, bytes] | None" = None) -> str:
    """The unix socket the adopted process's sidecar listens on."""
    return f"{adoption_dir(pid, start_ticks, environ)}/{CHANNEL_NAME}"


def wrapped_environ(environ: "dict[bytes, bytes]") -> bool:
    """Whether an environment is a wrapped seat's (`ADOPT_ENV_GUARDS`)."""
    return any(environ.get(name.encode()) for name in ADOPT_ENV_GUARDS)


def _is_dir(path: str) -> bool:
    try:
        return posix.stat(path).st_mode & _S_IFMT == _S_IFDIR
    except OSError:
        return False


def deliver(path: str, data: bytes, timeout_s: float) -> "str | None":
    """`data` (whole channel lines) sent to the sidecar listening at `path`; None once sent, else
    why not. The one client of a channel both the tee (each frame) and an adopted resident (the
    trigger's first lines) use; `_socket`, since socket.py would bring enum along."""
    import _socket

    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(data)
        finally:
            sock.close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
