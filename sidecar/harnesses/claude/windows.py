"""Claude's model -> window table: its transcripts and its subagents' name a model, never a window.

`model_windows.json` beside this module is the shipped table; the user's `hctx/models.json` (under
`$XDG_CONFIG_HOME`, else `~/.config`) extends and overrides it, a null there removing an id. The
spec names this module (`HarnessSpec.model_windows`): `hctx scan` reads a transcript's window from
it, and the launch plan hands it to the subagent transport.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Final

from guard.errors import JsonRefused, Unusable
from guard.json_rule import loads
from guard.record import MAX_COUNT

__all__ = [
    "MODEL_TABLE_SCHEMA",
    "USER_MODEL_TABLE",
    "ModelTableError",
    "model_table",
    "shipped_model_table",
    "user_model_table_path",
]


class ModelTableError(Unusable):
    """Claude's model-window table (ours or the user's) is unreadable."""


MODEL_TABLE_SCHEMA: Final = "hctx.model-windows.v1"
USER_MODEL_TABLE: Final = Path("hctx") / "models.json"
_USER_TABLE_LIMIT: Final = 1024 * 1024


def _windows(data: object, where: str) -> dict[str, int | None]:
    if not isinstance(data, dict) or data.get("schema") != MODEL_TABLE_SCHEMA:
        raise ModelTableError(f"{where}: not a {MODEL_TABLE_SCHEMA} object")
    windows = data.get("windows")
    if not isinstance(windows, dict):
        raise ModelTableError(f"{where}: 'windows' is not an object")
    table: dict[str, int | None] = {}
    for model, window in windows.items():
        valid = window is None or (isinstance(window, int) and not isinstance(window, bool) and 0 < window <= MAX_COUNT)
        if not valid:
            raise ModelTableError(f"{where}: window of {model!r} is not a positive integer up to 2**53, or null")
        table[model] = window
    return table


def shipped_model_table() -> dict[str, int]:
    text = resources.files(__package__ or __name__).joinpath("model_windows.json").read_text(encoding="utf-8")
    return {model: window for model, window in _windows(loads(text), "shipped table").items() if window}


def user_model_table_path(environ: Mapping[str, str]) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(config) / USER_MODEL_TABLE


def model_table(environ: Mapping[str, str], warnings: list[str]) -> dict[str, int]:
    """The shipped table, extended and overridden by the user's file (a null there removes an id)."""
    table = shipped_model_table()
    path = user_model_table_path(environ)
    try:
        # A config file may be a dotfiles symlink; it may not be a FIFO that hangs the scan.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return table
    except OSError as exc:
        warnings.append(f"model table {path}: {exc.strerror or exc}; using the shipped table")
        return table
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            warnings.append(f"model table {path}: not a regular file; using the shipped table")
            return table
        data = handle.read(_USER_TABLE_LIMIT + 1)
    try:
        if len(data) > _USER_TABLE_LIMIT:
            raise ModelTableError(f"{path}: larger than {_USER_TABLE_LIMIT} bytes")
        try:
            parsed = loads(data)
        except JsonRefused as exc:
            raise ModelTableError(f"{path}: not JSON ({exc})") from None
        for model, window in _windows(parsed, str(path)).items():
            if window is None:
                table.pop(model, None)
            else:
                table[model] = window
    except ModelTableError as exc:
        warnings.append(f"model table {exc}; using the shipped table")
    return table
