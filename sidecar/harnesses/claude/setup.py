"""Claude Code's user-level setup (issue 36): hctx's status line and hooks in the user's settings.

The file is `$CLAUDE_CONFIG_DIR/settings.json`, else `~/.claude/settings.json`, the lowest of
Claude's settings files (a project's `.claude/settings.json` and `.claude/settings.local.json`, the
managed file and `--settings` rank above it). Setup renders into it exactly what a wrapped launch
renders into `.claude/settings.local.json` (`launch.render_settings`: `statusLine`,
`subagentStatusLine` and the PreCompact/PostCompact/SessionStart/SubagentStart/SubagentStop
hooks, every other key and hook kept), and takes it out with `launch.unrender_settings`. A session
started plainly then runs hctx's tee; without `HCTX_CHANNEL` in its environment the tee starts the
session's adopting wrapper (issue 36's adoption, the tee's side).

The user's own status line keeps drawing: Claude runs only the winning `statusLine`, now hctx's,
so the one it replaced (and the `subagentStatusLine`) is kept beside the settings in
`hctx-renderers.json` (a second edit), which the tee chains where the user's settings file
would (`sidecar.harnesses.claude.tee.resolve_renderer`: below a project's own status line, and only
while the user's settings still run hctx's tee). `--undo` puts the user's lines back into
settings.json from the journal.

A wrapped seat under setup still works: the project's `.claude/settings.local.json` that `hctx wrap`
renders beats the user file, its tee runs with `HCTX_CHANNEL` and records to the wrapped sidecar.
Claude merges hooks across its settings files and runs an identical command once (measured below),
so the wrapped seat's hooks are not doubled; its tee has `HCTX_CHANNEL`, so nothing adopts it.

Measured 2026-12-05 on the pinned 2.1.250 and 2.1.332 binaries (tests/live/test_setup_claude_live.py:
isolated HOME, the fake Messages API on 127.0.0.1, Claude started plainly in tmux after `hctx setup
claude`): Claude runs the user-level statusLine and SessionStart hook setup wrote (their frames
reach `$HCTX_CHANNEL`), the tee draws the user's own line from hctx-renderers.json, the user's own
SessionStart hook still runs once, and with a wrapped seat's `.claude/settings.local.json` holding
the same commands the SessionStart hook runs once, not twice; `--undo` leaves settings.json
byte-equal to before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from guard.walk import read_within
from sidecar.harnesses.claude.launch import SettingsError, is_hctx_entry, render_settings, unrender_settings
from sidecar.harnesses.claude.tee import RENDERERS_FILE
from sidecar.setup_plan import (
    MAX_USER_FILE_BYTES,
    BuildPoint,
    HarnessSetup,
    SetupRefused,
    UserFile,
    json_bytes,
    json_object,
)

__all__ = [
    "BUILDS",
    "LINES",
    "RENDERERS",
    "SETTINGS",
    "RenderersEdit",
    "SettingsEdit",
    "config_root",
    "setup",
]

SETTINGS = PurePosixPath("settings.json")
RENDERERS = PurePosixPath(RENDERERS_FILE)
# The settings hctx's take over whose user values setup keeps for the tee to chain.
LINES = ("statusLine", "subagentStatusLine")
_HOW = "user settings.json: statusLine, subagentStatusLine, SessionStart/compaction/subagent hooks"
BUILDS = (
    BuildPoint("2.1.250", True, _HOW),
    BuildPoint("2.1.332", True, _HOW),
)


def config_root(home: Path, environ: Mapping[str, str]) -> Path:
    """Claude's config dir: `$CLAUDE_CONFIG_DIR`, else `~/.claude`."""
    configured = environ.get("CLAUDE_CONFIG_DIR")
    return Path(configured) if configured else home / ".claude"


@dataclass(frozen=True)
class SettingsEdit:
    """hctx's status lines and hooks in the user's settings.json."""

    file: UserFile

    def apply(self, current: bytes | None) -> bytes:
        settings = json_object(current, self.file.path)
        try:
            rendered = render_settings(settings)
        except SettingsError as exc:
            raise SetupRefused(f"{self.file.path}: {exc}; left as it is") from None
        if current is not None and rendered == settings:
            return current  # in place already: the user's formatting kept
        return json_bytes(rendered)

    def remove(self, current: bytes, original: bytes | None) -> bytes | None:
        settings = json_object(current, self.file.path)
        before = json_object(original, self.file.path) if original is not None else {}
        kept = unrender_settings(settings, before)
        if kept == settings:
            return current
        if not kept and original is None:
            return None
        return json_bytes(kept)


@dataclass(frozen=True)
class RenderersEdit:
    """The user's own status lines, which hctx's replace in settings.json, kept where the tee reads
    them (`moved`: what setup found in settings.json this time; empty once hctx's is there)."""

    file: UserFile
    moved: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, current: bytes | None) -> bytes:
        renderers = json_object(current, self.file.path)
        updated = {**renderers, **self.moved}
        if current is not None and updated == renderers:
            return current
        return json_bytes(updated)

    def remove(self, current: bytes, original: bytes | None) -> bytes | None:
        renderers = json_object(current, self.file.path)
        before = json_object(original, self.file.path) if original is not None else {}
        kept = {key: value for key, value in renderers.items() if key not in LINES}
        kept.update({key: before[key] for key in LINES if key in before})
        if kept == renderers:
            return current
        if not kept and original is None:
            return None
        return json_bytes(kept)


def _users_lines(root: Path) -> dict[str, Any]:
    """The user's own status lines in settings.json now (not hctx's); {} when the file is absent or
    unreadable (the settings edit then says why it refuses it)."""
    raw = read_within(root, SETTINGS.parts, MAX_USER_FILE_BYTES)
    try:
        settings = json_object(raw.data, root / SETTINGS)
    except SetupRefused:
        return {}
    return {key: settings[key] for key in LINES if key in settings and not is_hctx_entry(settings[key])}


def setup(home: Path, environ: Mapping[str, str]) -> HarnessSetup:
    root = config_root(home, environ)
    edits: list[SettingsEdit | RenderersEdit] = [SettingsEdit(UserFile(root, SETTINGS))]
    moved = _users_lines(root)
    if moved or not read_within(root, RENDERERS.parts, MAX_USER_FILE_BYTES).absent:
        edits.append(RenderersEdit(UserFile(root, RENDERERS), moved))
    installed = shutil.which("claude", path=environ.get("PATH", os.defpath)) is not None or root.is_dir()
    return HarnessSetup(harness="claude", installed=installed, edits=tuple(edits), builds=BUILDS)
