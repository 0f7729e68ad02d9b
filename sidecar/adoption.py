"""Where an adopted harness process's sidecar listens, computable by anyone who knows its pid.

A harness session started without `hctx wrap` is adopted (issue 36): the harness-side trigger
(Claude's tee, a Codex hook, pi's extension, OpenCode's plugin) runs `python -I -m
wrapper.launch.adopt --harness H --pid P`, and that adopter claims an agent for P and starts its
sidecar. Both sides must agree on where that sidecar listens without ever having talked, so the
place is a function of the one process they both see: P's pid and its start time (clock ticks
since boot, `/proc/<pid>/stat` field 22), which together name one process even after the pid is
reused:

    <$XDG_RUNTIME_DIR, else /tmp>/hctx-<uid>/adopt-<pid>-<start ticks>/channel

The adopter's flock (`LOCK_NAME` in the same directory) makes it one adopter per process; the
adoption's resident removes the directory when P exits. A TypeScript extension computes the same
path from `/proc/<pid>/stat`.

The standard library only, and only modules a `python -I -S` interpreter has loaded or builds in
(`posix`, no `os`, no `pathlib`): Claude's tee imports this on every status-line refresh.
"""

import posix

from guard.errors import Unavailable  # a module that imports nothing: the status line's path stays posix

__all__ = [
    "ADOPT_ENV_GUARDS",
    "CHANNEL_NAME",
    "LOCK_NAME",
    "AdoptionDirError",
    "adoption_base",
    "adoption_channel",
    "adoption_dir",
    "make_adoption_dir",
    "process_start_ticks",
    "wrapped_environ",
]

# A process whose environment holds any of these was started by `hctx wrap` (its seat sets them
# all): the wrapped seat wins, nothing adopts it, so nothing is counted twice.
ADOPT_ENV_GUARDS = ("HCTX_CHANNEL",)
CHANNEL_NAME = "channel"
LOCK_NAME = "adopter.lock"
_PRIVATE = 0o700
_S_IFMT, _S_IFDIR = 0o170000, 0o040000


class AdoptionDirError(Unavailable):
    """The adoption directory (or the per-user one above it) is not a private directory of this user's."""


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (`/proc/<pid>/stat` field 22); None
    when no such process runs (or it is a zombie: it has exited, only its status is left)."""
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
    # After the command's name, which may itself hold spaces and parentheses: field 3 on.
    fields = stat.rpartition(b")")[2].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


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


def make_adoption_dir(pid: int, start_ticks: int, environ: "dict[bytes, bytes] | None" = None) -> str:
    """`adoption_dir`, created 0700 with its per-user parent, each checked after the fact to be a
    real directory (not a symlink) owned by this user and reachable by nobody else: in /tmp another
    user could have made either first. AdoptionDirError otherwise."""
    base = adoption_base(environ)
    directory = adoption_dir(pid, start_ticks, environ)
    for path in (base, directory):
        try:  # noqa: SIM105 - contextlib costs an import on the status line's path
            posix.mkdir(path, _PRIVATE)
        except FileExistsError:
            pass
        stat = posix.lstat(path)
        if stat.st_mode & _S_IFMT != _S_IFDIR:
            raise AdoptionDirError(f"{path} is not a directory (a symlink or a file is there); not adopting")
        if stat.st_uid != posix.getuid():
            raise AdoptionDirError(f"{path} belongs to uid {stat.st_uid}, not this user's; not adopting")
        if stat.st_mode & 0o077:
            raise AdoptionDirError(f"{path} is open to other users (mode {stat.st_mode & 0o777:o}); not adopting")
    return directory


def _is_dir(path: str) -> bool:
    try:
        return posix.stat(path).st_mode & _S_IFMT == _S_IFDIR
    except OSError:
        return False
