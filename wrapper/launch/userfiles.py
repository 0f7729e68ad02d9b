"""The safe user-file engine of `hctx setup` (issue 36): read, refuse, write, journal, undo.

A harness's setup plan (`sidecar.setup_plan.HarnessSetup`) names user files and pure edits; this
module is the only code that touches the files:

- Read through descriptors from the file's root (`sidecar.setup_state.read_user_file`, which
  `hctx doctor` reads with too): every directory below the root opened without following a link;
  the file itself a regular file (a FIFO or device is refused without blocking: O_NONBLOCK), at
  most 1 MiB, through a symlink only to a file inside the root; a UTF-8 byte-order mark and bytes
  that are not UTF-8 refused for every format. The edit refuses what its format will not hold
  (`sidecar.setup_plan.json_object`: invalid JSON, a top level that is no object, nesting past the
  cap). A refusal names the file and why, and the file is left byte for byte as it was.
- Written atomically: a temporary file in the same directory (its descriptor), fsynced, renamed
  over the name, the directory fsynced; the file's mode kept (0600 for a new one: settings may hold
  secrets). Missing directories are created 0700 and journaled.
- Journaled, under `$XDG_STATE_HOME/hctx/setup/` (default ~/.local/state/hctx/setup/, 0700): per
  file, its bytes before the first setup (or that it was absent), the bytes setup last wrote and
  the directories setup created. The journal is written before the file, so a crash in between
  leaves a record undo can act on. One setup or undo at a time: a flock on the journal's lock file.
- Setup twice is setup once: a file the edit leaves unchanged is not written, and its journal
  entry keeps the first original.
- Undo: a file still byte-equal to what setup wrote gets its original bytes back exactly (or is
  removed, with the directories setup created for it when they are empty); one the user (or the
  harness) changed since keeps their change and loses only hctx's part (`Edit.remove`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import difflib
import fcntl
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.atomic import write_json_atomic
from guard.errors import JsonRefused
from guard.files import read_bounded
from guard.json_rule import loads
from guard.walk import open_parent_within, resolve_within
from sidecar.setup_plan import Edit, HarnessSetup, SetupRefused, UserFile
from sidecar.setup_state import read_user_file

__all__ = [
    "JOURNAL_NAME",
    "MAX_JOURNAL_BYTES",
    "Change",
    "JournalEntry",
    "Undone",
    "apply_setup",
    "journal_dir",
    "plan_changes",
    "render_diff",
    "undo_setup",
]

MAX_JOURNAL_BYTES = 64 * 1024 * 1024
JOURNAL_NAME = "journal.json"
_LOCK_NAME = "lock"


def journal_dir(environ: dict[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/hctx/setup`, else `~/.local/state/hctx/setup`."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(state) / "hctx" / "setup"


# --- planning: what each edit would do ------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One file of a plan: as it is, and as the edit would leave it."""

    edit: Edit
    current: bytes | None
    new: bytes

    @property
    def changes(self) -> bool:
        return self.new != self.current


def plan_changes(setup: HarnessSetup) -> list[Change]:
    """Each edit of the plan against its file as it is now, in the plan's order. SetupRefused for the
    first file refused: nothing of the plan is written then."""
    changes = []
    for edit in setup.edits:
        current = read_user_file(edit.file)
        changes.append(Change(edit, current, edit.apply(current)))
    return changes


def _text(data: bytes | None) -> list[str]:
    return [] if data is None else data.decode("utf-8", "replace").splitlines(keepends=True)


def render_diff(path: Path, before: bytes | None, after: bytes | None) -> str:
    """A unified diff of one file (`/dev/null` for an absent side), every line ending in a newline."""
    lines = difflib.unified_diff(
        _text(before), _text(after),
        fromfile="/dev/null" if before is None else str(path), tofile="/dev/null" if after is None else str(path),
    )  # fmt: skip
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


# --- the journal ------------------------------------------------------------------------------------


class JournalEntry(BaseModel):
    """One file setup changed: what was there first, what setup last wrote, what it created."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    harness: str
    original: str | None  # base64 of the bytes before the first setup; None: there was no file
    written: str  # base64 of the bytes setup last wrote
    created_dirs: list[str] = Field(default_factory=list, alias="createdDirs", max_length=64)

    @staticmethod
    def encode(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    def original_bytes(self) -> bytes | None:
        return None if self.original is None else base64.b64decode(self.original, validate=True)

    def written_bytes(self) -> bytes:
        return base64.b64decode(self.written, validate=True)


class _JournalWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int = Field(strict=True, ge=1)
    files: dict[str, JournalEntry] = Field(max_length=4096)


@dataclass
class _Journal:
    dir_fd: int
    shown: Path
    files: dict[str, JournalEntry] = field(default_factory=dict)

    def save(self) -> None:
        wire = _JournalWire(version=1, files=self.files).model_dump_json(by_alias=True, indent=2)
        write_json_atomic(self.dir_fd, JOURNAL_NAME, wire.encode("utf-8"), self.dir_fd, mode=0o600)


@contextlib.contextmanager
def _journal(directory: Path, *, create: bool) -> Iterator[_Journal]:
    """The journal, held under its lock (concurrent setups and undos take turns) for the block; an
    empty one, and nothing created, when there is none and not `create`."""
    try:
        fd, _ = open_parent_within(directory, ("lock",), create=create)
    except FileNotFoundError:
        if create:
            raise
        yield _Journal(-1, directory / JOURNAL_NAME)
        return
    try:
        lock = os.open(_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield _Journal(fd, directory / JOURNAL_NAME, _load(fd, directory / JOURNAL_NAME))
        finally:
            os.close(lock)  # releases the flock
    finally:
        os.close(fd)


def _load(dir_fd: int, shown: Path) -> dict[str, JournalEntry]:
    raw = read_bounded(dir_fd, JOURNAL_NAME, MAX_JOURNAL_BYTES)
    if raw.absent:
        return {}
    try:
        if raw.data is None:
            raise SetupRefused(raw.problem or "unreadable")
        wire = _JournalWire.model_validate(loads(raw.data))
        for entry in wire.files.values():  # every blob decodes, or none is trusted
            entry.original_bytes()
            entry.written_bytes()
        return dict(wire.files)
    except (JsonRefused, ValidationError, SetupRefused, binascii.Error, ValueError) as exc:
        reason = str(exc).splitlines()[0]
        raise SetupRefused(
            f"{shown}: hctx's setup journal is unreadable ({reason}); left as it is: move it aside to go on "
            "(without it, --undo takes hctx's part out of each file but cannot restore the exact bytes)"
        ) from None


# --- writing ----------------------------------------------------------------------------------------


def _write(file: UserFile, data: bytes | None, *, create_dirs: bool) -> list[Path]:
    """`file` replaced by `data` atomically (mode kept), or removed (None); the directories created."""
    root, parts = resolve_within(file.root, file.relative.parts)
    dir_fd, created = open_parent_within(root, parts, create=create_dirs and data is not None)
    try:
        name = parts[-1]
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise SetupRefused(f"{file.path}: is no longer a regular file; left as it is")
            mode: int | None = info.st_mode & 0o7777
        except FileNotFoundError:
            mode = None
        if data is None:
            if mode is not None:
                os.unlink(name, dir_fd=dir_fd)
                os.fsync(dir_fd)
        else:
            write_json_atomic(dir_fd, name, data, dir_fd, mode=0o600 if mode is None else mode)
    finally:
        os.close(dir_fd)
    return created


def _remove_dirs(directories: Sequence[str]) -> None:
    """The directories setup created, innermost first, each only if it is empty now."""
    for directory in sorted(directories, key=len, reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _key(file: UserFile) -> str:
    return os.path.abspath(file.path)


def apply_setup(setup: HarnessSetup, journal: Path | None = None) -> list[Change]:
    """Every edit of the plan in place, under the journal's lock; the changes (those that changed
    nothing included). SetupRefused (nothing written) when a file is refused."""
    plan_changes(setup)  # a refusal before anything (the journal's directory too) is created
    with _journal(journal or journal_dir(), create=True) as held:
        changes = plan_changes(setup)  # again under the lock: a concurrent setup's writes are seen
        for change in changes:
            if not change.changes:
                continue
            key = _key(change.edit.file)
            first = held.files.get(key)
            original = change.current if first is None else first.original_bytes()
            created = list(first.created_dirs) if first is not None else []
            held.files[key] = JournalEntry(
                harness=setup.harness,
                original=None if original is None else JournalEntry.encode(original),
                written=JournalEntry.encode(change.new),
                created_dirs=created,
            )
            held.save()  # before the file: a crash in between leaves a record to undo from
            made = _write(change.edit.file, change.new, create_dirs=True)
            if made:
                held.files[key] = held.files[key].model_copy(update={"created_dirs": [*created, *map(str, made)]})
                held.save()
    return changes


@dataclass(frozen=True)
class Undone:
    """One file undo looked at: as it was, as undo left it."""

    file: UserFile
    before: bytes | None
    after: bytes | None
    how: str  # "restored", "removed", "hctx's part taken out, your changes kept", "unchanged"


def undo_setup(setup: HarnessSetup, journal: Path | None = None, *, dry_run: bool = False) -> list[Undone]:
    """hctx's part out of each of the plan's files and of every file the journal holds for this
    harness. SetupRefused for a file it will not touch (nothing is written then)."""
    with _journal(journal or journal_dir(), create=False) as held:
        edits = {_key(edit.file): edit for edit in setup.edits}
        files = {key: edit.file for key, edit in edits.items()}
        for key, journaled in held.files.items():
            if journaled.harness == setup.harness and key not in files:
                files[key] = UserFile(Path(key).parent, PurePosixPath(Path(key).name))
        steps: list[tuple[str, Undone, JournalEntry | None]] = []
        for key, file in files.items():
            current = read_user_file(file)
            entry = held.files.get(key)
            edit = edits.get(key)
            after, how = _undone(file, current, entry, edit)
            steps.append((key, Undone(file, current, after, how), entry))
        if dry_run:
            return [undone for _, undone, _ in steps]
        for key, undone, entry in steps:
            if undone.after != undone.before:
                _write(undone.file, undone.after, create_dirs=False)
            if entry is not None:
                if undone.after is None:
                    _remove_dirs(entry.created_dirs)
                del held.files[key]
                held.save()
    return [undone for _, undone, _ in steps]


def _undone(
    file: UserFile, current: bytes | None, entry: JournalEntry | None, edit: Edit | None
) -> tuple[bytes | None, str]:
    if entry is not None and current == entry.written_bytes():
        original = entry.original_bytes()
        return original, "removed (setup created it)" if original is None else "restored byte for byte"
    if current is None:
        return None, "absent"
    if edit is None:
        return current, "changed since setup and no longer in hctx's plan; left as it is"
    after = edit.remove(current, entry.original_bytes() if entry is not None else None)
    if after == current:
        return current, "holds nothing of hctx's"
    return after, "hctx's part taken out, your later changes kept"
