"""Whether a harness's setup is in place (issue 36), and the one read of a user file it rests on.

`hctx setup` (wrapper.launch.userfiles) and `hctx doctor` read a user file the same way
(`read_user_file`): through descriptors from its root (`guard.walk.read_within`: no link followed
below the root, a symlink only to a file inside it, a regular file only, never blocking on a FIFO,
at most 1 MiB), then a UTF-8 byte-order mark and bytes that are not UTF-8 refused for every
format. A refusal names the file and why; nothing is changed.

A plan's state is read from its own edits, with no journal: in place and current when every edit
would leave its file as it is; not set up when no file holds anything of hctx's (`remove` would
change nothing); else stale: hctx's part is there but not as this hctx writes it (an older hctx's
command, a moved venv, a hook the user dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from guard.walk import read_within
from sidecar.setup_plan import MAX_USER_FILE_BYTES, HarnessSetup, SetupRefused, UserFile

__all__ = ["SetupState", "State", "read_user_file", "setup_state"]

_BOM = b"\xef\xbb\xbf"


def _parts(file: UserFile) -> tuple[str, ...]:
    parts = file.relative.parts
    if not parts or file.relative.is_absolute() or any(part in ("", ".", "..") for part in parts):
        raise SetupRefused(f"{file.path}: a user file is a plain path inside its root")  # a plan's bug, said plainly
    return parts


def read_user_file(file: UserFile) -> bytes | None:
    """The file's bytes, None when absent; SetupRefused (the reason; the file untouched) for one
    hctx setup will not edit."""
    raw = read_within(file.root, _parts(file), MAX_USER_FILE_BYTES)
    if raw.problem is not None:
        problem = raw.problem.replace(f"{file.path} ", "", 1)  # a walk's message may name the path itself
        raise SetupRefused(f"{file.path}: {problem}; left as it is")
    data = raw.data
    if data is not None:
        if data.startswith(_BOM):
            raise SetupRefused(f"{file.path}: starts with a UTF-8 byte-order mark; left as it is (remove the mark)")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SetupRefused(
                f"{file.path}: not UTF-8 text ({exc.reason} at byte {exc.start}); left as it is"
            ) from None
    return data


State = Literal["current", "not set up", "stale", "refused"]


@dataclass(frozen=True)
class SetupState:
    harness: str
    state: State
    detail: str  # the files, or why one cannot be read
    advice: tuple[str, ...] = ()  # the plan's, while hctx's part is in its files (current or stale)


def setup_state(setup: HarnessSetup) -> SetupState:
    behind: list[str] = []
    holding: list[str] = []
    try:
        for edit in setup.edits:
            current = read_user_file(edit.file)
            if edit.apply(current) != current:
                behind.append(str(edit.file.path))
            if current is not None and edit.remove(current, None) != current:
                holding.append(str(edit.file.path))
    except SetupRefused as exc:
        return SetupState(setup.harness, "refused", str(exc))
    files = ", ".join(str(edit.file.path) for edit in setup.edits)
    if not behind:
        return SetupState(setup.harness, "current", files, setup.advice)
    if not holding:
        return SetupState(setup.harness, "not set up", files)
    return SetupState(setup.harness, "stale", ", ".join(behind), setup.advice)
