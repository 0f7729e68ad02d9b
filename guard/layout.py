"""The catalog's names and places: what a host or identity may be called, where the catalog,
an agent's directory, its log and the staging directory are, and the defaults every command uses.
Pure paths: nothing here opens a file."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from guard.constants import AGENTS_DIR_NAME, CONTEXT_RECORD_NAME, CONTROL_DIR_NAME, LOGS_DIR_NAME, STAGING_DIR_NAME
from guard.errors import CatalogError

__all__ = [
    "LOG_BACKUPS",
    "LOG_NAME_BYTES",
    "SYNCTHING_CONFLICT_NAME",
    "AgentDir",
    "as_name",
    "check_name",
    "control_dir",
    "default_catalog",
    "default_catalog_origin",
    "default_host",
    "is_agent_tree_name",
    "log_files",
    "log_name",
    "log_path",
    "staging_dir",
]

# A Syncthing conflict copy (`<stem>.sync-conflict-<YYYYMMDD>-<HHMMSS>-<short device id><ext>`,
# lib/model/folder_sendrecv.go) is never an agent-tree name; guard.catalog passes over the rest of
# Syncthing's own entries.
SYNCTHING_CONFLICT_NAME = re.compile(r".+\.sync-conflict-[0-9]{8}-[0-9]{6}-[A-Z2-7]{7}(?:\..*)?")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}")


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
    return as_name(os.uname().nodename.split(".")[0], fallback="localhost")  # gethostname(2)'s own name


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


# The rotations kept beside the live log (`<log>.1` the newest, `<log>.3` the oldest): the sidecar
# rotates into them, the fill history (guard.history) reads them back.
LOG_BACKUPS = 3


def log_files(catalog: Path, host: str, identity: str) -> list[Path]:
    """The agent's log and its rotations, oldest first."""
    live = log_path(catalog, host, identity)
    return [live.with_name(f"{live.name}.{n}") for n in range(LOG_BACKUPS, 0, -1)] + [live]


# Longer pairs are shortened to readable prefixes and a digest of the whole pair: a name of at most
# LOG_NAME_BYTES leaves a file system's 255 bytes room for the rotation suffix (`.3`).
LOG_NAME_BYTES = 200
_LOG_PREFIX_CHARS = 80


def log_name(host: str, identity: str) -> str:
    """`<host>~<identity>.jsonl`, injective: `~` is in neither name's alphabet, so `a.b`+`c` and
    `a`+`b.c` never share a file; a pair too long for one file name keeps two `~` and a digest."""
    stem = f"{check_name('host', host)}~{check_name('identity', identity)}"
    if len(stem) + len(".jsonl") > LOG_NAME_BYTES:
        import hashlib  # only for a name too long to be a file name

        digest = hashlib.sha256(f"{host}/{identity}".encode()).hexdigest()[:32]
        stem = f"{host[:_LOG_PREFIX_CHARS]}~{identity[:_LOG_PREFIX_CHARS]}~{digest}"
    return stem + ".jsonl"


def staging_dir(catalog: Path) -> Path:
    return control_dir(catalog) / STAGING_DIR_NAME


def is_agent_tree_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and name not in {".", ".."} and not SYNCTHING_CONFLICT_NAME.fullmatch(name)
