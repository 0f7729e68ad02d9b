"""The catalog's read side: what every reader opens, lists and decodes in a tree it cannot trust.

A replicated directory tree may hold anything. Every directory below the catalog root is opened
through `guard.walk.open_chain` (component by component, never following a symlink), every file
through `guard.files.read_bounded` (regular files only, never blocking on a FIFO, never past its
bound), and every listing goes through one walker, `agent_tree_children`, which passes over
Syncthing's own entries. Two strictnesses share that walker: the readers' (`list_agents`: an entry
that is not an agent directory is a warning, a host that cannot be listed is skipped) and the
store's (`iter_hosts`, `iter_identities`: such an entry is a CatalogError). Nothing here writes, and
nothing here raises on a hostile tree except `CatalogError` for a catalog not readable at all.

The layering is catalog -> layout and walk, not the reverse: the claim's parser and bound
(guard.state) build on the store's modules, and the read side needs them.
"""

from __future__ import annotations

import errno
import gc
import os
import re
import stat
import time
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from guard.constants import AGENTS_DIR_NAME, CONTEXT_RECORD_NAME, MAX_RECORD_BYTES, MAX_STATE_BYTES, STATE_RECORD_NAME
from guard.errors import CatalogError, RecordRefused
from guard.files import RawFile, read_bounded
from guard.layout import SYNCTHING_CONFLICT_NAME, check_name, is_agent_tree_name
from guard.walk import open_chain

if TYPE_CHECKING:
    from guard.state import HarnessState

__all__ = [
    "LEGACY_STAGING_NAME",
    "PROBLEM_CHARS",
    "RACY_NS",
    "SYNCTHING_DIR_NAME",
    "SYNCTHING_FILE_NAME",
    "AgentFiles",
    "CatalogCache",
    "CatalogSnapshot",
    "agent_tree_children",
    "decode_claim",
    "is_syncthing_entry",
    "iter_hosts",
    "iter_identities",
    "list_agents",
    "open_host_dir",
    "printable",
    "read_agent_files",
    "short",
]

# Earlier writers staged beside the record and could leave exactly this behind after a crash.
LEGACY_STAGING_NAME = re.compile(r"\.harness-context\.tmp-[0-9]+-[0-9]+")
# What Syncthing itself puts in a tree it syncs: the folder marker and the versions directory
# (directories), and as regular files the ignore file, its temporaries while it receives (Unix and
# Windows prefixes, lib/fs/tempname.go) and the conflict copies a losing version is renamed to
# (`<stem>.sync-conflict-<YYYYMMDD>-<HHMMSS>-<short device id><ext>`, lib/model/folder_sendrecv.go).
SYNCTHING_DIR_NAME = re.compile(r"\.stfolder|\.stversions")
SYNCTHING_FILE_NAME = re.compile(
    rf"\.stfolder|\.stignore|(?:\.syncthing\.|~syncthing~).+\.tmp|{SYNCTHING_CONFLICT_NAME.pattern}"
)
# A problem quoted from a hostile file is cut here: a warning line, not a dump.
PROBLEM_CHARS = 200


# ---------------------------------------------------------------------------------------------
# Text a hostile tree supplies


def printable(text: str) -> str:
    """`text` with terminal controls shown escaped, so a hostile field cannot drive the terminal:
    every character Python calls unprintable but the space (C0/C1 controls, bidi overrides, isolates
    and marks, line and paragraph separators, which break a line as a newline does, zero-width and
    other format characters, unassigned and private-use code points), as Python would spell it."""
    if text.isprintable():
        return text
    return "".join(char if char == " " or char.isprintable() else _escaped(ord(char)) for char in text)


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def short(text: str) -> str:
    """A problem as a warning shows it: printable, and at most PROBLEM_CHARS long."""
    text = printable(text)
    return text if len(text) <= PROBLEM_CHARS else text[: PROBLEM_CHARS - 1] + "…"


# ---------------------------------------------------------------------------------------------
# The walker


def is_syncthing_entry(name: str, *, regular: bool, real_dir: bool) -> bool:
    """One of Syncthing's own names, as the kind of entry Syncthing makes it (never a symlink)."""
    pattern = SYNCTHING_FILE_NAME if regular else SYNCTHING_DIR_NAME if real_dir else None
    return pattern is not None and pattern.fullmatch(name) is not None


def agent_tree_children(directory: Path, kind: str, *, legacy_ok: bool) -> tuple[list[str], list[str]]:
    """The real subdirectories of `directory` that are valid `kind` names, sorted, and one line for
    every other entry (symlinks, files, bad names, near misses of the legacy name).

    With `legacy_ok` the exact legacy staging name is passed over silently, but only as a regular
    non-symlink file: possibly a live old writer's, and left untouched. Syncthing's own names are
    passed over silently at every level, each only as the kind of entry Syncthing makes; a conflict
    copy is never an agent, whatever it is.
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
            if is_syncthing_entry(entry.name, regular=regular, real_dir=real_dir):
                continue
            if real_dir and is_agent_tree_name(entry.name):
                names.append(entry.name)
            else:
                passed_over.append(f"unexpected entry {Path(directory, entry.name)!s} (not a {kind} directory)")
    return sorted(names), sorted(passed_over)


def _is_real_dir(path: Path) -> bool:
    """False when absent; CatalogError when it is a symlink or not a directory."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        raise CatalogError(f"{path} is not a real directory (symlink or file)")
    return True


# ---------------------------------------------------------------------------------------------
# The store's strictness: any entry that is not an agent directory is refused


def iter_hosts(catalog: Path) -> list[str]:
    return _strict_children(catalog / AGENTS_DIR_NAME, "host", legacy_ok=False)


def iter_identities(catalog: Path, host: str) -> list[str]:
    """Identity directories of one host, passing over exactly the legacy staging file."""
    agents = catalog / AGENTS_DIR_NAME
    if not _is_real_dir(agents):  # a symlinked `agents/` is refused here too, not walked through
        return []
    return _strict_children(agents / check_name("host", host), "identity", legacy_ok=True)


def _strict_children(directory: Path, kind: str, *, legacy_ok: bool) -> list[str]:
    if not _is_real_dir(directory):
        return []
    names, passed_over = agent_tree_children(directory, kind, legacy_ok=legacy_ok)
    if passed_over:
        raise CatalogError(passed_over[0])
    return names


# ---------------------------------------------------------------------------------------------
# The readers' strictness: a warning for what is passed over, never a traceback


def _agents_root(catalog: Path) -> Path | None:
    """`<catalog>/agents`, None when there is no catalog yet; raises when it cannot be read at all."""
    try:
        catalog_info = os.stat(catalog)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CatalogError(f"{catalog}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(catalog_info.st_mode):
        raise CatalogError(f"{catalog} is not a directory")
    root = catalog / AGENTS_DIR_NAME
    try:
        return root if _is_real_dir(root) else None
    except CatalogError:
        raise  # already says where and why
    except OSError as exc:
        raise CatalogError(f"{root}: {exc.strerror or exc}") from None


def _named_dirs(directory: Path, kind: str, warnings: list[str], *, legacy_ok: bool) -> list[str]:
    """Subdirectories that can be agent-tree names; everything else is named in a warning."""
    names, passed_over = agent_tree_children(directory, kind, legacy_ok=legacy_ok)
    warnings.extend(f"{printable(line)}; ignored" for line in passed_over)
    return names


def list_agents(catalog: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Every (host, identity) under `<catalog>/agents`, sorted, and warnings for what was passed over."""
    root = _agents_root(catalog)
    if root is None:
        return [], []
    warnings: list[str] = []
    try:
        hosts = _named_dirs(root, "host", warnings, legacy_ok=False)
    except OSError as exc:
        raise CatalogError(f"{root}: {exc.strerror or exc}") from None
    agents: list[tuple[str, str]] = []
    for host in hosts:
        try:
            identities = _named_dirs(root / host, "identity", warnings, legacy_ok=True)
        except OSError as exc:
            warnings.append(f"{root / host}: {exc.strerror or exc}; host skipped")
            continue
        agents.extend((host, identity) for identity in identities)
    return agents, warnings


def open_host_dir(catalog: Path, host: str) -> int | None:
    """`<catalog>/agents/<host>` held open (the caller closes), so its agents are read without
    re-walking the catalog; None when it cannot be, and each of its agents then names why."""
    try:
        return open_chain(catalog, (AGENTS_DIR_NAME, host))
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# One agent's files


@dataclass(frozen=True, slots=True)
class AgentFiles:
    """The two records of one agent directory as read, before any interpretation."""

    record: RawFile
    claim: RawFile
    problem: str | None = None  # the directory itself could not be opened


def read_agent_files(catalog: Path, host: str, identity: str, host_fd: int | None = None) -> AgentFiles:
    """`host_fd`, when the caller holds the host directory open, saves re-walking the catalog per agent."""
    try:
        if host_fd is None:
            dir_fd = open_chain(catalog, (AGENTS_DIR_NAME, host, identity))
        else:
            # The host's path as text: only a refusal's message reads it, and building a Path for
            # each of thousands of agents is time a one-shot reader's start-up pays (issue 38).
            dir_fd = open_chain(f"{catalog}/{AGENTS_DIR_NAME}/{host}", (identity,), parent_fd=host_fd)
    except OSError as exc:
        if isinstance(exc, CatalogError) or exc.errno in (errno.ELOOP, errno.ENOTDIR):
            reason = "is not a real directory (symlink or file)"
        elif exc.errno == errno.ENOENT:
            reason = "does not exist"
        else:
            reason = f"unreadable: {exc.strerror or exc}"
        problem = f"agent directory {reason}"
        return AgentFiles(RawFile(problem=problem), RawFile(problem=problem), problem)
    try:
        return AgentFiles(
            record=read_bounded(dir_fd, CONTEXT_RECORD_NAME, MAX_RECORD_BYTES),
            claim=read_bounded(dir_fd, STATE_RECORD_NAME, MAX_STATE_BYTES),
        )
    finally:
        os.close(dir_fd)


def decode_claim(raw: RawFile, harnesses: Container[str] | None = None) -> tuple[HarnessState | None, str | None]:
    """The harness-state claim, or None and why (None, None for a plain absence); `harnesses` as
    for `guard.record.parse_record`."""
    # Imported here: the claim's model is pydantic's, and a fast reader (`hctx status`) lists and
    # reads the catalog through this module without decoding a claim.
    from guard.state import parse_state

    if raw.data is None:
        return None, None if raw.problem is None else f"harness-state claim {raw.problem}"
    try:
        return parse_state(raw.data, harnesses=harnesses), None
    except RecordRefused as exc:
        return None, short(f"harness-state claim refused: {exc}")


# ---------------------------------------------------------------------------------------------
# Reading only what changed


# A file modified this close to the moment it was looked at may change again within the same tick
# of the file system's timestamp clock, keeping its mtime, ctime and size (and, after a rename over
# it, possibly a reused inode): such an entry is read again next time (git's "racily clean" rule,
# on the modification time, which is what a write sets).
RACY_NS = 1_000_000_000

# A file as `lstat` sees it: (device, inode, size, mtime, ctime); None when absent; the errno when
# it could not be looked at.
_Signature = tuple[int, int, int, int, int] | int | None

_Value = TypeVar("_Value")


def _signature(host_fd: int | None, identity: str, name: str) -> _Signature:
    if host_fd is None:
        return -1
    try:
        info = os.stat(f"{identity}/{name}", dir_fd=host_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.errno or -1
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _racy(signature: _Signature, since_ns: int) -> bool:
    return isinstance(signature, tuple) and signature[3] >= since_ns


@dataclass(frozen=True, slots=True)
class _Entry(Generic[_Value]):
    signature: tuple[_Signature, _Signature]
    racy: bool
    value: _Value


@dataclass(frozen=True, slots=True)
class CatalogSnapshot(Generic[_Value]):
    """Every agent of the catalog with its value, sorted by host then identity, the listing's
    warnings, and which agents were read again for this snapshot (all of them the first time)."""

    agents: list[tuple[str, str, _Value]]
    warnings: list[str]
    changed: list[tuple[str, str]]


class CatalogCache(Generic[_Value]):
    """The catalog's agents, each turned into a value by `load` from its two files, and read again
    only when one of those files changed: each refresh lists the tree and `lstat`s the two records
    of every agent; an agent whose files look as they did is not opened. The exporter, `hctx watch`
    and the board read a live catalog through this; a one-shot reader needs none of it.

    `load(host, identity, files)` must not depend on the clock: what changes with time alone (age,
    staleness, whether a wrapper still lives) is the caller's to derive from the value."""

    def __init__(self, catalog: Path, load: Callable[[str, str, AgentFiles], _Value], *, remember: bool = True) -> None:
        # `remember=False`: a reader that refreshes once keeps nothing and looks at no signature.
        self.catalog, self._load, self._remember = catalog, load, remember
        self._entries: dict[tuple[str, str], _Entry[_Value]] = {}
        self.reads = 0  # agents (re)read since the cache was made

    def refresh(self) -> CatalogSnapshot[_Value]:
        """CatalogError when the catalog cannot be listed at all (the cache is kept)."""
        collecting = gc.isenabled()
        gc.disable()  # a read allocates and keeps a few dozen objects per agent and makes no cycles:
        try:  # the collector's passes over them cost a third of a 10,000-agent read, and find nothing
            return self._refresh()
        finally:
            if collecting:
                gc.enable()

    def held(self) -> list[tuple[str, str, _Value]]:
        """Every agent's value as the refreshes so far left it, sorted by host and identity; reads nothing."""
        return [(host, identity, entry.value) for (host, identity), entry in sorted(self._entries.items())]

    def refresh_agents(self, keys: Iterable[tuple[str, str]]) -> CatalogSnapshot[_Value]:
        """Only these agents (named by a file event, or a part of a listing read in parts), without
        listing the catalog: each is looked at and read again if its files changed; one whose
        directory is gone is dropped. The next `refresh` lists everything again."""
        found: list[tuple[str, str, _Value]] = []
        changed: list[tuple[str, str]] = []
        host_fd: int | None = None
        current_host: str | None = None
        try:
            for host, identity in sorted(set(keys)):
                if not (is_agent_tree_name(host) and is_agent_tree_name(identity)):
                    continue
                if host != current_host:  # one descriptor per host, not per agent: a part is hundreds
                    if host_fd is not None:
                        os.close(host_fd)
                    host_fd, current_host = open_host_dir(self.catalog, host), host
                if host_fd is None or not _is_dir_at(host_fd, identity):
                    self._entries.pop((host, identity), None)
                    continue
                entry, reread = self._look(host, identity, host_fd)
                self._entries[host, identity] = entry
                found.append((host, identity, entry.value))
                if reread:
                    changed.append((host, identity))
        finally:
            if host_fd is not None:
                os.close(host_fd)
        return CatalogSnapshot(found, [], changed)

    def held_keys(self) -> set[tuple[str, str]]:
        """The agents the refreshes so far left held; reads nothing."""
        return set(self._entries)

    def _look(self, host: str, identity: str, host_fd: int | None) -> tuple[_Entry[_Value], bool]:
        """The agent's entry, read again when its files changed (and whether it was)."""
        looked_ns = time.time_ns() - RACY_NS
        signature = (
            _signature(host_fd, identity, CONTEXT_RECORD_NAME),
            _signature(host_fd, identity, STATE_RECORD_NAME),
        ) if self._remember else (None, None)  # fmt: skip
        entry = self._entries.get((host, identity))
        if entry is not None and not entry.racy and entry.signature == signature:
            return entry, False
        files = read_agent_files(self.catalog, host, identity, host_fd)
        racy = any(_racy(part, looked_ns) for part in signature)
        self.reads += 1
        return _Entry(signature, racy, self._load(host, identity, files)), True

    def _refresh(self) -> CatalogSnapshot[_Value]:
        agents, warnings = list_agents(self.catalog)
        entries: dict[tuple[str, str], _Entry[_Value]] = {}
        found: list[tuple[str, str, _Value]] = []
        changed: list[tuple[str, str]] = []
        host_fd: int | None = None
        current_host: str | None = None
        try:
            for host, identity in agents:
                if host != current_host:
                    if host_fd is not None:
                        os.close(host_fd)
                    host_fd, current_host = open_host_dir(self.catalog, host), host
                entry, reread = self._look(host, identity, host_fd)
                if reread:
                    changed.append((host, identity))
                if self._remember:
                    entries[host, identity] = entry
                found.append((host, identity, entry.value))
        finally:
            if host_fd is not None:
                os.close(host_fd)
        self._entries = entries
        return CatalogSnapshot(found, warnings, changed)


def _is_dir_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
