"""Claude Code: render the status-line tee and compaction hooks into `.claude/settings.local.json`.

Claude reads `<cwd>/.claude/settings.local.json` above the project and user settings, and the
winning `statusLine` replaces the others outright (measured on 2.1.250, spec "claude"), so hctx owns
that one slot and chains the operator's renderer from the tee. Everything else in the file is the
user's and survives: every other key, and every hook that is not ours. A relaunch rewrites our
entries in place instead of adding a second copy.

The commands name this interpreter and the directory `sidecar` is installed in by absolute path,
because Claude runs them through its own shell with whatever PATH it has. They run the tee with
`-I -S` (no site, no environment): it needs only the standard library, and site alone costs
several times the tee's own start-up.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from wrapper.harnesses import LaunchPlan

SETTINGS_PATH = Path(".claude") / "settings.local.json"
# Where a status line the user had in that file is kept when hctx takes the slot, so it still
# draws: the tee runs it as the renderer (through ST_CLAUDE_STATUSLINE_RENDERER).
DISPLACED_STATUS_LINE = Path(".claude") / "statusline-before-hctx.json"
RENDERER_ENV = "ST_CLAUDE_STATUSLINE_RENDERER"
HOOK_EVENTS = ("PreCompact", "PostCompact", "SessionStart")
REFRESH_INTERVAL_S = 5
# Every command hctx renders names this module; it is how our earlier entries are recognised.
TEE_MODULE = "sidecar.claude_tee"


class SettingsError(ValueError):
    """The settings file exists but is not something hctx can merge into without losing data."""


def _sidecar_root() -> str:
    """The directory holding the `sidecar` package, found without importing it."""
    spec = importlib.util.find_spec("sidecar")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise SettingsError("the sidecar package is not importable; is hctx installed?")
    return str(Path(locations[0]).resolve().parent)


def tee_command(entry: str) -> str:
    """The shell command line that runs `sidecar.claude_tee` `entry` ("statusline" or "hook")."""
    # A JSON string is also a Python literal, and its double quotes need no escaping inside shlex's single ones.
    root = json.dumps(_sidecar_root())
    code = f"import sys;sys.path.append({root});from {TEE_MODULE} import main;sys.exit(main(sys.argv[1:]))"
    return shlex.join([sys.executable, "-I", "-S", "-c", code, entry])


def status_line() -> dict[str, Any]:
    return {
        "type": "command",
        "command": tee_command("statusline"),
        "padding": 0,
        "refreshInterval": REFRESH_INTERVAL_S,
    }


def _is_ours(hook: object) -> bool:
    return isinstance(hook, dict) and TEE_MODULE in str(hook.get("command", ""))


def render_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` with hctx's status line and hooks, every other key and hook left as it was."""
    rendered = dict(settings)
    rendered["statusLine"] = status_line()
    hooks = rendered.get("hooks", {})
    if not isinstance(hooks, dict):
        raise SettingsError(f'"hooks" is a {type(hooks).__name__}, not an object')
    hooks = dict(hooks)
    command = tee_command("hook")
    for event in HOOK_EVENTS:
        groups = hooks.get(event, [])
        if not isinstance(groups, list):
            raise SettingsError(f'"hooks.{event}" is a {type(groups).__name__}, not a list')
        kept = []
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                theirs = [hook for hook in group["hooks"] if not _is_ours(hook)]
                if not theirs and group["hooks"]:
                    continue  # a group that held only our command
                group = {**group, "hooks": theirs}
            kept.append(group)
        kept.append({"hooks": [{"type": "command", "command": command}]})
        hooks[event] = kept
    rendered["hooks"] = hooks
    return rendered


def write_settings(cwd: Path) -> Path:
    """Render into `<cwd>/.claude/settings.local.json`, atomically, only if it changes.

    A symlinked settings file (dotfiles) is written through, never replaced by a copy.
    """
    path = cwd / SETTINGS_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = None
    except UnicodeDecodeError:
        raise SettingsError(f"{path} is not UTF-8 text; hctx will not overwrite it") from None
    settings: Any = {}
    if text is not None and text.strip():
        try:
            settings = json.loads(text)
        except ValueError as exc:
            raise SettingsError(f"{path} is not JSON ({exc}); fix or remove it, hctx will not overwrite it") from None
        if not isinstance(settings, dict):
            raise SettingsError(f"{path} is not a JSON object; hctx will not overwrite it")
    try:
        rendered = json.dumps(render_settings(settings), indent=2, ensure_ascii=False) + "\n"
    except SettingsError as exc:
        raise SettingsError(f"{path}: {exc}; hctx will not overwrite it") from None
    if rendered != text:
        _keep_displaced_status_line(cwd, settings.get("statusLine"))
        target = Path(os.path.realpath(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".settings.", delete=False) as tmp:
            try:
                tmp.write(rendered)
                tmp.flush()
                if text is not None:
                    os.chmod(tmp.name, target.stat().st_mode & 0o7777)
                os.replace(tmp.name, target)
            except BaseException:
                Path(tmp.name).unlink(missing_ok=True)
                raise
    return path


def _keep_displaced_status_line(cwd: Path, status_line: object) -> None:
    """The user's own status line in the file hctx renders: saved once, and said so on stderr."""
    if not isinstance(status_line, dict) or _is_ours(status_line) or not status_line.get("command"):
        return
    saved = cwd / DISPLACED_STATUS_LINE
    if saved.exists():
        return
    saved.write_text(json.dumps(status_line, indent=2) + "\n", encoding="utf-8")
    print(
        f"hctx: {cwd / SETTINGS_PATH} had its own statusLine; hctx's tee now holds that slot and runs "
        f"yours as its renderer (kept in {saved})",
        file=sys.stderr,
    )


def displaced_renderer(cwd: Path) -> str | None:
    try:
        saved = json.loads((cwd / DISPLACED_STATUS_LINE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = saved.get("command") if isinstance(saved, dict) else None
    return command if isinstance(command, str) and command.strip() else None


def prepare(plan: LaunchPlan) -> LaunchPlan:
    write_settings(plan.cwd)
    renderer = displaced_renderer(plan.cwd)
    if renderer is None or os.environ.get(RENDERER_ENV):
        return plan
    return dataclasses.replace(plan, env={**plan.env, RENDERER_ENV: renderer})
