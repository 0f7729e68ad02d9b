"""What a harness's setup module builds for `hctx setup` (issue 36): the kernel types (the standard
library and guard's JSON rule only).

`hctx setup` arranges, through each harness's own user-level extension point (a settings file, a
hooks file, an extension or plugin directory), that a session started without `hctx wrap` adopts
itself. A harness's folder may hold `setup.py` with

    def setup(home: Path, environ: Mapping[str, str]) -> HarnessSetup

which names the user files it edits (`UserFile`) and how (`Edit`), and what each pinned build
offers (`BuildPoint`). It reads nothing of the user's and writes nothing: the wrapper's engine
(`wrapper.launch.userfiles`) opens each file through descriptors from its `root`, refuses what it
will not touch, runs the edit, writes atomically, keeps the undo journal and undoes. The registry
finds the module (`sidecar.registry.setup_module`).

An edit is pure: bytes in, bytes out, so `--dry-run`, `hctx doctor` and the tests run the very
code that writes. The engine applies a plan's edits in their order.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from guard.errors import JsonRefused, Refused
from guard.json_rule import loads

__all__ = [
    "ADOPT_MODULE",
    "MAX_JSON_DEPTH",
    "MAX_USER_FILE_BYTES",
    "BuildPoint",
    "Edit",
    "HarnessSetup",
    "OwnedFile",
    "SetupModule",
    "SetupRefused",
    "UserFile",
    "adopt_command",
    "json_bytes",
    "json_object",
]

# The largest user file setup reads: settings are kilobytes; a file past this is refused, not read.
MAX_USER_FILE_BYTES = 1024 * 1024
# What every adoption trigger runs (`adopt_command`): the adopting wrapper (issue 36).
ADOPT_MODULE = "wrapper.launch.adopt"


class SetupRefused(Refused):
    """A user file `hctx setup` will not touch; the reason is shown to the user verbatim (a
    ValueError, as every Refused is)."""


@dataclass(frozen=True)
class UserFile:
    """One file of the user's for a harness: `root/relative`."""

    # The user's config dir for this harness (e.g. $CLAUDE_CONFIG_DIR or ~/.claude); nothing is read
    # or written through a symlink out of it.
    root: Path
    # The file inside root (its missing parent dirs are created, mode 0700, and removed by --undo).
    relative: PurePosixPath

    @property
    def path(self) -> Path:
        return self.root / self.relative


class Edit(Protocol):
    """hctx's part of one user file."""

    @property
    def file(self) -> UserFile: ...

    def apply(self, current: bytes | None) -> bytes:
        """The file (`current`, None when absent) with hctx's part in place, the user's keys and
        entries kept; idempotent (`apply(apply(x)) == apply(x)`); raises SetupRefused(reason) on
        content it will not touch."""
        ...

    def remove(self, current: bytes, original: bytes | None) -> bytes | None:
        """hctx's part taken out of `current`, the user's later changes kept; `original` is the file
        before setup (None: there was none, or it is not known). None: delete the file (it held only
        hctx's part). Raises SetupRefused on content it will not touch."""
        ...


@dataclass(frozen=True)
class OwnedFile:
    """A file that is hctx's whole (OpenCode's plugin, pi's and omp's loader), never merged: told from
    a user's file of the same name by its first bytes, `mark`. Written when absent or hctx's (an
    older build's included); removed only while it is still hctx's."""

    file: UserFile
    content: bytes
    mark: bytes
    kind: str  # what it is, in a refusal: "plugin", "loader"
    blocked: str | None = None  # why it would not be loaded where it goes: refused with that

    def apply(self, current: bytes | None) -> bytes:
        if self.blocked is not None:
            raise SetupRefused(self.blocked)
        if current is not None and not current.startswith(self.mark):
            raise SetupRefused(
                f"{self.file.path} exists and is not hctx's {self.kind}; move it away and run `hctx setup` again"
            )
        return self.content

    def remove(self, current: bytes, original: bytes | None) -> bytes | None:
        if not current.startswith(self.mark):
            return current  # the user replaced it with their own: theirs now, kept
        if original is not None and not original.startswith(self.mark):
            return original  # never the case (apply refuses a file of the user's), kept for safety
        return None


@dataclass(frozen=True)
class BuildPoint:
    """One pinned build's answer, for --dry-run, doctor and the README table."""

    build: str  # "2.1.332"
    offered: bool
    how: str  # "user settings.json statusLine + hooks", or why there is no point


@dataclass(frozen=True)
class HarnessSetup:
    harness: str
    installed: bool  # its program or config dir found
    edits: tuple[Edit, ...]
    builds: tuple[BuildPoint, ...]
    # What a person should know while this setup is in place (`hctx doctor` says it beside the
    # in-place line), e.g. a harness that stalls on something of its own the setup brought about.
    advice: tuple[str, ...] = ()


class SetupModule(Protocol):
    """A harness's `setup.py`, as `sidecar.registry.setup_module` returns it."""

    def setup(self, home: Path, environ: Mapping[str, str]) -> HarnessSetup: ...


def adopt_command(harness: str, *args: str) -> list[str]:
    """What a hook/extension/plugin runs to adopt its session: this interpreter by absolute path
    (harnesses run hooks with whatever PATH they have), isolated (`-I`)."""
    return [sys.executable, "-I", "-m", ADOPT_MODULE, "--harness", harness, *args]


# --- JSON user files: what every JSON edit reads and writes -------------------------------------

# No harness's settings nest anywhere near this; a file that does is refused rather than walked
# (json.dumps recurses, and a few hundred levels exhaust its stack).
MAX_JSON_DEPTH = 64


def _depth(value: object) -> int:
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                pending += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def json_object(data: bytes | None, shown: Path) -> dict[str, Any]:
    """The JSON object the user file `shown` holds, read by the one JSON rule (`guard.json_rule`: a
    byte-order mark, NaN, a lone surrogate refused); {} when it is absent or blank. SetupRefused,
    saying why, for anything else."""
    if data is None or not data.strip():
        return {}
    try:
        value = loads(data)
    except JsonRefused as exc:
        raise SetupRefused(f"{shown} is not JSON hctx will edit: {exc}") from None
    if not isinstance(value, dict):
        raise SetupRefused(f"{shown} holds a JSON {type(value).__name__}, not an object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise SetupRefused(f"{shown} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def json_bytes(value: Mapping[str, Any]) -> bytes:
    """How setup writes a JSON user file: 2-space indented, UTF-8, one trailing newline."""
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
