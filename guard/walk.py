"""Directories of the catalog opened component by component with O_NOFOLLOW and used through
their descriptors (`open_chain`, the one such walk, which the readers share), so a symlink anywhere
in the ancestry is refused rather than followed and cannot be swapped in between the check and the
rename."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from guard.constants import AGENTS_DIR_NAME, CONTROL_DIR_NAME, LOGS_DIR_NAME, STAGING_DIR_NAME
from guard.errors import CatalogError
from guard.files import RawFile, read_bounded
from guard.layout import AgentDir, staging_dir

__all__ = [
    "agent_dirs",
    "device_of",
    "open_append",
    "open_chain",
    "open_log",
    "open_logs_dir",
    "open_parent_within",
    "read_within",
    "resolve_within",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_logs_dir(catalog: Path) -> int:
    """`<catalog>/.st2/logs`, created, opened without following a symlink at any step."""
    return open_chain(catalog, (CONTROL_DIR_NAME, LOGS_DIR_NAME), create=True)


def open_log(catalog: Path, name: str, max_bytes: int) -> int:
    """`<catalog>/.st2/logs/<name>` opened to append (as `open_append`); a log past `max_bytes` is
    renamed to `<name>.1` first, so it starts afresh and its predecessor is kept."""
    dir_fd = open_logs_dir(catalog)
    try:
        with contextlib.suppress(OSError):
            if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size > max_bytes:
                os.rename(name, name + ".1", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return open_append(dir_fd, name)
    finally:
        os.close(dir_fd)


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


def _open_dir(parent_fd: int | None, name: str, where: Callable[[], Path], *, create: bool) -> int:
    """`where`: the directory's path, made only for a refusal's message (a reader walks thousands)."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CatalogError(f"{where()} is not a real directory (symlink or file); refusing") from None
        raise


def open_chain(
    root: Path | str, components: tuple[str, ...], *, create: bool = False, parent_fd: int | None = None
) -> int:
    """Open `root/components...` without following a symlink at any step; the caller closes.

    A component that is a symlink or a file is a CatalogError; anything else the system refuses
    (absent, permission) is its own OSError. With `parent_fd`, the walk starts at that already
    open directory (`root` is then its path, for messages), which stays open.
    """
    if parent_fd is None:
        root = os.path.abspath(root)
        if create:
            os.makedirs(root, mode=0o755, exist_ok=True)
        # The catalog root is the user's to place (a symlinked ~/.local/state is common); everything
        # below it, the replicated ancestry and the staging directory, must be real directories.
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        fd = parent_fd
    try:
        for index, name in enumerate(components):
            where = functools.partial(_joined, root, components[: index + 1])
            child = _open_dir(fd, name, where, create=create)
            if fd != parent_fd:
                os.close(fd)
            fd = child
    except BaseException:
        if fd != parent_fd:
            os.close(fd)
        raise
    return fd


def _joined(root: Path | str, components: tuple[str, ...]) -> Path:
    return Path(os.path.abspath(root), *components)


@contextlib.contextmanager
def agent_dirs(agent: AgentDir, *, create: bool) -> Iterator[tuple[int, int]]:
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


# --- a user's file under a directory of theirs (`hctx setup`, issue 36) -----------------------------
# The root (e.g. ~/.claude) is the user's to place, a symlink included; below it hctx opens every
# directory without following a link. Only the file itself may be a symlink, and only to a file
# inside the same root (a settings file kept in a subdirectory): a link out of it (a dotfiles
# repository, another user's file, /etc) is never read through or written through.


def resolve_within(root: Path, parts: tuple[str, ...]) -> tuple[Path, tuple[str, ...]]:
    """(the root, the parts) of the file `root/parts` names: itself, or the file inside the root its
    symlink names (then the root's real path and the target's parts below it). CatalogError for a
    symlink out of the root."""
    path = root.joinpath(*parts)
    try:
        linked = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:  # absent, or a parent that is not a directory: the walk says which
        return root, parts
    if not linked:
        return root, parts
    real_root = Path(os.path.realpath(root))
    target = Path(os.path.realpath(path))
    if target == real_root or not target.is_relative_to(real_root):
        raise CatalogError(
            f"{path} is a symlink to {target}, outside {root}: hctx never reads or writes through a link out of it"
        )
    return real_root, target.relative_to(real_root).parts


def open_parent_within(
    root: Path, parts: tuple[str, ...], *, create: bool = False, mode: int = 0o700
) -> tuple[int, list[Path]]:
    """The directory holding `root/parts` opened (every step below the root without following a
    link, as `open_chain`) and the directories this call created for it (mode `mode`, the root
    itself included when it was missing), outermost first; the caller closes. Absent and not
    `create`: FileNotFoundError."""
    created: list[Path] = []
    root = Path(os.path.abspath(root))
    if create:
        missing, directory = [], root
        while not os.path.lexists(directory):
            missing.append(directory)
            directory = directory.parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory, mode)
            except FileExistsError:  # another process made it meanwhile (two setups at once): not ours
                continue
            created.append(directory)
            _exact_mode(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), mode)
    fd = open_chain(root, ())
    path = root
    try:
        for name in parts[:-1]:
            path = path / name
            made = False
            if create:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                    created.append(path)
                    made = True
                except FileExistsError:
                    pass
            child = open_chain(path.parent, (name,), parent_fd=fd)
            os.close(fd)
            fd = child
            if made:
                os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def _exact_mode(fd: int, mode: int) -> None:
    """`mode` on the directory open at `fd`, whatever the umask took from mkdir's (a umask another
    thread narrowed for a moment, as a channel's bind does, would leave 0600: a directory no one can
    enter); the descriptor is closed."""
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def read_within(root: Path, parts: tuple[str, ...], limit: int) -> RawFile:
    """The file `root/parts`, read as `guard.files.read_bounded` reads (a regular file only, never
    blocking on a FIFO, at most `limit` bytes), through a symlink only to a file inside the root."""
    try:
        real_root, real_parts = resolve_within(root, parts)
        fd, _ = open_parent_within(real_root, real_parts)
    except FileNotFoundError:
        return RawFile()
    except CatalogError as exc:
        return RawFile(problem=str(exc))
    except OSError as exc:
        return RawFile(problem=f"unreadable: {exc.strerror or exc}")
    try:
        return read_bounded(fd, real_parts[-1], limit)
    finally:
        os.close(fd)
