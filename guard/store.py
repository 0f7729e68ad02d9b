"""The catalog on disk: layout, lock, staging outside the replicated subtree, atomic replace.

Every directory below the catalog root is opened component by component with O_NOFOLLOW and
used through its descriptor, so a symlink anywhere in the ancestry is refused rather than followed
and cannot be swapped in between the check and the rename.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from guard.constants import (
    AGENTS_DIR_NAME,
    CONTEXT_LOCK_NAME,
    CONTEXT_RECORD_NAME,
    CONTROL_DIR_NAME,
    LOGS_DIR_NAME,
    STAGING_DIR_NAME,
)
from guard.files import read_bounded
from guard.projection import MAX_RECORD_BYTES
from guard.record import HarnessContext, RecordRefused, parse_record

# Earlier writers staged beside the record and could leave exactly this behind after a crash.
LEGACY_STAGING_NAME = re.compile(r"\.harness-context\.tmp-[0-9]+-[0-9]+")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def default_catalog() -> Path:
    """`$HCTX_CATALOG`, else the XDG state directory: what every command uses without --catalog."""
    if explicit := os.environ.get("HCTX_CATALOG"):
        return Path(explicit)
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state_home) / "hctx"


def default_host() -> str:
    """This machine's short host name, made a valid catalog component."""
    short = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.@+-]", "-", short).lstrip(".-") or "localhost"


class CatalogError(OSError):
    """The catalog cannot be used safely as laid out; the message names the path and the reason."""


def check_name(kind: str, name: str) -> str:
    """Host and identity names become path components: one plain component, nothing else."""
    if not _NAME.fullmatch(name) or name in {".", ".."}:
        raise CatalogError(f"{kind} {name!r} is not a valid name (letters, digits, _ . @ + -)")
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
    return control_dir(catalog) / LOGS_DIR_NAME / f"{host}.{identity}.jsonl"


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


def _open_chain(root: Path, components: tuple[str, ...], *, create: bool) -> int:
    """Open `root/components...` without following a symlink at any step; the caller closes."""
    root = Path(os.path.abspath(root))
    if create:
        os.makedirs(root, mode=0o755, exist_ok=True)
    # The catalog root is the user's to place (a symlinked ~/.local/state is common); everything
    # below it, the replicated ancestry and the staging directory, must be real directories.
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = root
    try:
        for name in components:
            path = path / name
            child = _open_dir(fd, name, path, create=create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _dirs(agent: AgentDir, *, create: bool) -> Iterator[tuple[int, int]]:
    """The agent directory and its staging directory, both checked, on the same device."""
    agent_fd = _open_chain(agent.catalog, (AGENTS_DIR_NAME, agent.host, agent.identity), create=create)
    try:
        staging_fd = _open_chain(agent.catalog, (CONTROL_DIR_NAME, STAGING_DIR_NAME), create=create)
        try:
            if _device(staging_fd) != _device(agent_fd):
                raise CatalogError(
                    f"{staging_dir(agent.catalog)} and {agent.path} are on different filesystems; "
                    "an atomic rename between them is impossible, so nothing is written"
                )
            yield agent_fd, staging_fd
        finally:
            os.close(staging_fd)
    finally:
        os.close(agent_fd)


def _device(fd: int) -> int:
    return os.fstat(fd).st_dev


@contextlib.contextmanager
def _locked(agent_fd: int) -> Iterator[None]:
    fd = os.open(CONTEXT_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=agent_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_json_atomic(dir_fd: int, name: str, data: bytes, staging_fd: int) -> None:
    """Stage in `staging_fd`, fsync, rename over `name` in `dir_fd`, fsync the directory."""
    temp = f"{name}.{os.getpid()}.{secrets.token_hex(6)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=staging_fd)
    try:
        try:
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
        staging_fd = _open_chain(catalog, (CONTROL_DIR_NAME, STAGING_DIR_NAME), create=False)
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
        if existing is not None and record.written_at_ms <= existing.written_at_ms:
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


def write_agent_file(agent: AgentDir, name: str, data: bytes) -> None:
    """Another record of the agent directory (harness-state), staged the same safe way."""
    with _dirs(agent, create=True) as (agent_fd, staging_fd):
        write_json_atomic(agent_fd, name, data, staging_fd)


def iter_hosts(catalog: Path) -> list[str]:
    return _strict_children(catalog / AGENTS_DIR_NAME, "host", legacy_ok=False)


def iter_identities(catalog: Path, host: str) -> list[str]:
    """Identity directories of one host, passing over exactly the legacy staging file."""
    agents = catalog / AGENTS_DIR_NAME
    if not _is_real_dir(agents):  # a symlinked `agents/` is refused here too, not walked through
        return []
    return _strict_children(agents / check_name("host", host), "identity", legacy_ok=True)


def _is_real_dir(path: Path) -> bool:
    """False when absent; CatalogError when it is a symlink or not a directory."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        raise CatalogError(f"{path} is not a real directory")
    return True


def agent_tree_children(directory: Path, kind: str, *, legacy_ok: bool) -> tuple[list[str], list[str]]:
    """The real subdirectories of `directory` that are valid `kind` names, sorted, and one line for
    every other entry (symlinks, files, bad names, near misses of the legacy name).

    With `legacy_ok` the exact legacy staging name is passed over silently, but only as a regular
    non-symlink file: possibly a live old writer's, and left untouched.
    """
    names: list[str] = []
    passed_over: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                regular = entry.is_file(follow_symlinks=False)
                real_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                regular = real_dir = False
            if legacy_ok and regular and LEGACY_STAGING_NAME.fullmatch(entry.name):
                continue
            if real_dir and _NAME.fullmatch(entry.name) and entry.name not in {".", ".."}:
                names.append(entry.name)
            else:
                passed_over.append(f"unexpected entry {Path(directory, entry.name)!s} (not a {kind} directory)")
    return sorted(names), sorted(passed_over)


def _strict_children(directory: Path, kind: str, *, legacy_ok: bool) -> list[str]:
    if not _is_real_dir(directory):
        return []
    names, passed_over = agent_tree_children(directory, kind, legacy_ok=legacy_ok)
    if passed_over:
        raise CatalogError(passed_over[0])
    return names
