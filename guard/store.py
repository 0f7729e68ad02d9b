"""The catalog on disk: layout, lock, staging outside the replicated subtree, atomic replace.

Every directory below the catalog root is opened component by component with O_NOFOLLOW and
used through its descriptor (`open_chain`, the one such walk, which the readers share), so a
symlink anywhere in the ancestry is refused rather than followed and cannot be swapped in between
the check and the rename. Listing the catalog is the read side's, guard.catalog.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from guard.constants import (
    AGENTS_DIR_NAME,
    CONTEXT_LOCK_NAME,
    CONTEXT_RECORD_NAME,
    CONTROL_DIR_NAME,
    HARNESS_CONTEXT_FUTURE_SKEW_MS,
    LOGS_DIR_NAME,
    STAGING_DIR_NAME,
)
from guard.errors import CatalogError, RecordRefused
from guard.files import read_bounded
from guard.projection import MAX_RECORD_BYTES
from guard.record import HarnessContext, parse_record

__all__ = [
    "LOG_NAME_BYTES",
    "SYNCTHING_CONFLICT_NAME",
    "AgentDir",
    "ProcStat",
    "agent_locked",
    "append_log_line",
    "as_name",
    "check_name",
    "control_dir",
    "default_catalog",
    "default_catalog_origin",
    "default_host",
    "device_of",
    "is_agent_tree_name",
    "log_name",
    "log_path",
    "open_append",
    "open_chain",
    "open_logs_dir",
    "pid_alive",
    "proc_stat",
    "remove_context",
    "staging_dir",
    "sweep_staging",
    "write_agent_file",
    "write_context",
    "write_json_atomic",
]

# A Syncthing conflict copy (`<stem>.sync-conflict-<YYYYMMDD>-<HHMMSS>-<short device id><ext>`,
# lib/model/folder_sendrecv.go) is never an agent-tree name; guard.catalog passes over the rest of
# Syncthing's own entries.
SYNCTHING_CONFLICT_NAME = re.compile(r".+\.sync-conflict-[0-9]{8}-[0-9]{6}-[A-Z2-7]{7}(?:\..*)?")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def default_catalog() -> Path:
    """`$HCTX_CATALOG`, else the XDG state directory: what every command uses without --catalog."""
    return default_catalog_origin()[0]


def default_catalog_origin() -> tuple[Path, str]:
    """The default catalog and where it comes from, for a message that has to name it."""
    if explicit := os.environ.get("HCTX_CATALOG"):
        return Path(explicit), "$HCTX_CATALOG"
    if state_home := os.environ.get("XDG_STATE_HOME"):
        return Path(state_home) / "hctx", "the default, $XDG_STATE_HOME/hctx"
    return Path(os.path.expanduser("~/.local/state")) / "hctx", "the default, ~/.local/state/hctx"


def default_host() -> str:
    """This machine's short host name, made a valid catalog component."""
    return as_name(socket.gethostname().split(".")[0], fallback="localhost")


def as_name(text: str, *, fallback: str, room: int = 0) -> str:
    """`text` made a valid host or identity name (see `check_name`), `room` characters short of the
    longest so a suffix still fits."""
    name = re.sub(r"[^A-Za-z0-9_.@+-]", "-", text).lstrip(".-@+")[: 128 - room] or fallback
    return name if is_agent_tree_name(name) else fallback


def check_name(kind: str, name: str) -> str:
    """Host and identity names become path components: one plain component, nothing else."""
    if not is_agent_tree_name(name):
        raise CatalogError(f"{kind} {name!r} is not a valid name (letters, digits, _ . @ + -; no sync-conflict copy)")
    return name


@dataclass(frozen=True, slots=True)
class AgentDir:
    catalog: Path
    host: str
    identity: str

    def __post_init__(self) -> None:
        check_name("host", self.host)
        check_name("identity", self.identity)

    @property
    def path(self) -> Path:
        return self.catalog / AGENTS_DIR_NAME / self.host / self.identity

    @property
    def context_path(self) -> Path:
        return self.path / CONTEXT_RECORD_NAME


def control_dir(catalog: Path) -> Path:
    """`<catalog>/.st2`: host-local, outside the replicated `agents/` subtree."""
    return catalog / CONTROL_DIR_NAME


def log_path(catalog: Path, host: str, identity: str) -> Path:
    """The agent's JSON-lines log: host-local, outside the replicated subtree."""
    return control_dir(catalog) / LOGS_DIR_NAME / log_name(host, identity)


# Longer pairs are shortened to readable prefixes and a digest of the whole pair: a name of at most
# LOG_NAME_BYTES leaves a file system's 255 bytes room for the rotation suffix (`.3`).
LOG_NAME_BYTES = 200
_LOG_PREFIX_CHARS = 80


def log_name(host: str, identity: str) -> str:
    """`<host>~<identity>.jsonl`, injective: `~` is in neither name's alphabet, so `a.b`+`c` and
    `a`+`b.c` never share a file; a pair too long for one file name keeps two `~` and a digest."""
    stem = f"{check_name('host', host)}~{check_name('identity', identity)}"
    if len(stem) + len(".jsonl") > LOG_NAME_BYTES:
        digest = hashlib.sha256(f"{host}/{identity}".encode()).hexdigest()[:32]
        stem = f"{host[:_LOG_PREFIX_CHARS]}~{identity[:_LOG_PREFIX_CHARS]}~{digest}"
    return stem + ".jsonl"


def open_logs_dir(catalog: Path) -> int:
    """`<catalog>/.st2/logs`, created, opened without following a symlink at any step."""
    return open_chain(catalog, (CONTROL_DIR_NAME, LOGS_DIR_NAME), create=True)


def open_append(dir_fd: int, name: str) -> int:
    """A regular file in `dir_fd` opened to append, created if absent; never a symlink, never a FIFO
    (which would block the opener), never anything else."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise CatalogError(f"{name} is not a regular file (symlink or FIFO); refusing") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CatalogError(f"{name} is not a regular file; refusing")
    return fd


def staging_dir(catalog: Path) -> Path:
    return control_dir(catalog) / STAGING_DIR_NAME


def _open_dir(parent_fd: int | None, name: str, path: Path, *, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CatalogError(f"{path} is not a real directory (symlink or file); refusing") from None
        raise


def open_chain(root: Path, components: tuple[str, ...], *, create: bool = False, parent_fd: int | None = None) -> int:
    """Open `root/components...` without following a symlink at any step; the caller closes.

    A component that is a symlink or a file is a CatalogError; anything else the system refuses
    (absent, permission) is its own OSError. With `parent_fd`, the walk starts at that already
    open directory (`root` is then its path, for messages), which stays open.
    """
    root = Path(os.path.abspath(root))
    if parent_fd is None:
        if create:
            os.makedirs(root, mode=0o755, exist_ok=True)
        # The catalog root is the user's to place (a symlinked ~/.local/state is common); everything
        # below it, the replicated ancestry and the staging directory, must be real directories.
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        fd = parent_fd
    path = root
    try:
        for name in components:
            path = path / name
            child = _open_dir(fd, name, path, create=create)
            if fd != parent_fd:
                os.close(fd)
            fd = child
    except BaseException:
        if fd != parent_fd:
            os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _dirs(agent: AgentDir, *, create: bool) -> Iterator[tuple[int, int]]:
    """The agent directory and its staging directory, both checked, on the same device."""
    agent_fd = open_chain(agent.catalog, (AGENTS_DIR_NAME, agent.host, agent.identity), create=create)
    try:
        staging_fd = open_chain(agent.catalog, (CONTROL_DIR_NAME, STAGING_DIR_NAME), create=create)
        try:
            if device_of(staging_fd) != device_of(agent_fd):
                raise CatalogError(
                    f"{staging_dir(agent.catalog)} and {agent.path} are on different filesystems; "
                    "an atomic rename between them is impossible, so nothing is written"
                )
            yield agent_fd, staging_fd
        finally:
            os.close(staging_fd)
    finally:
        os.close(agent_fd)


def device_of(fd: int) -> int:
    return os.fstat(fd).st_dev


@contextlib.contextmanager
def _locked(agent_fd: int, name: str = CONTEXT_LOCK_NAME) -> Iterator[None]:
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=agent_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_json_atomic(dir_fd: int, name: str, data: bytes, staging_fd: int, *, mode: int | None = None) -> None:
    """Stage in `staging_fd`, fsync, rename over `name` in `dir_fd`, fsync the directory. The file
    is 0644 less the umask, or exactly `mode`; the rename replaces a symlink named `name`, never
    what it points at."""
    temp = f"{name}.{os.getpid()}.{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o644 if mode is None else 0o600, dir_fd=staging_fd)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=staging_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=staging_fd)
        raise
    os.fsync(dir_fd)


_STAGED_NAME = re.compile(r"[a-z-]+\.([0-9]+)\.[0-9a-f]+")


def sweep_staging(catalog: Path) -> int:
    """Remove staging files whose writer is gone (SIGKILLed mid-write); returns how many.

    A staging file names its writer's pid; a live writer's file is never touched.
    """
    removed = 0
    try:
        staging_fd = open_chain(catalog, (CONTROL_DIR_NAME, STAGING_DIR_NAME))
    except (FileNotFoundError, CatalogError):
        return 0
    try:
        for name in os.listdir(staging_fd):
            match = _STAGED_NAME.fullmatch(name)
            if match is None or pid_alive(int(match.group(1))):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=staging_fd)
                removed += 1
    finally:
        os.close(staging_fd)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here. pid 0 and negatives would address groups."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it exists, it is just not ours
    except (OSError, OverflowError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What /proc/<pid>/stat says of a process: the one place it is parsed."""

    state: str  # R, S, D, Z (a zombie), X (dead), ...
    parent: int
    started: int  # clock ticks since boot: with the pid, it names one process even after reuse


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None where there is none (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            # After the command's name, which may itself hold spaces and parentheses.
            fields = stat_file.read().rsplit(b")", 1)[1].split()
        return ProcStat(fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def _read_existing(agent_fd: int) -> HarnessContext | None:
    data = read_bounded(agent_fd, CONTEXT_RECORD_NAME, MAX_RECORD_BYTES).data
    if data is None:
        return None
    try:
        return parse_record(data)
    except RecordRefused:
        return None


def write_context(agent: AgentDir, record: HarnessContext) -> HarnessContext:
    """Publish `record` atomically under the agent's lock; returns what was written.

    `writtenAtMs` is raised above whatever record is on disk, so it stays strictly monotonic even
    across writers (a straggler from an old incarnation) and within one millisecond.
    """
    with _dirs(agent, create=True) as (agent_fd, staging_fd), _locked(agent_fd):
        existing = _read_existing(agent_fd)
        # A record dated past the skew bound (planted, or a clock stepped back) is not followed:
        # readers ignore it, and carried +1 it would date every later write in the future.
        future = time.time_ns() // 1_000_000 + HARNESS_CONTEXT_FUTURE_SKEW_MS
        if existing is not None and record.written_at_ms <= existing.written_at_ms <= future:
            record = record.model_copy(update={"written_at_ms": existing.written_at_ms + 1})
        write_json_atomic(agent_fd, CONTEXT_RECORD_NAME, record.to_json().encode(), staging_fd)
    return record


def remove_context(agent: AgentDir) -> bool:
    """The relaunch claim's removal: a reader sees `null`, not the previous incarnation's fill."""
    with _dirs(agent, create=True) as (agent_fd, _), _locked(agent_fd):
        try:
            os.unlink(CONTEXT_RECORD_NAME, dir_fd=agent_fd)
        except FileNotFoundError:
            return False
        os.fsync(agent_fd)
        return True


@contextlib.contextmanager
def agent_locked(agent: AgentDir, lock_name: str) -> Iterator[None]:
    """Hold one of the agent directory's lock files (created as needed) for the block."""
    with _dirs(agent, create=True) as (agent_fd, _), _locked(agent_fd, lock_name):
        yield


def append_log_line(catalog: Path, host: str, identity: str, line: bytes) -> None:
    """Append one whole line to the agent's log (a note of the wrapper's, beside the sidecar's):
    in one write, never through a symlink, never blocking on a FIFO planted under the log's name."""
    dir_fd = open_logs_dir(catalog)
    try:
        fd = open_append(dir_fd, log_name(host, identity))
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def write_agent_file(agent: AgentDir, name: str, data: bytes) -> None:
    """Another record of the agent directory (harness-state), staged the same safe way."""
    with _dirs(agent, create=True) as (agent_fd, staging_fd):
        write_json_atomic(agent_fd, name, data, staging_fd)


def is_agent_tree_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and name not in {".", ".."} and not SYNCTHING_CONFLICT_NAME.fullmatch(name)
