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

The working directory is left as it was found. Every wrapper launching here holds a seat in
`.claude/hctx-seats.json` (its pid and process start time, under a flock on the directory), and the
first seat records the file as it was, or that there was none. When the last live seat leaves (or a
later launch or leave finds every recorded seat dead: a SIGKILLed wrapper), hctx's entries come out
of the file as it is then: if what remains is what was there before, those exact bytes are put back
(or the file and a `.claude/` hctx created are removed); if the user or Claude changed the file
during the session, it keeps their changes, written as 2-space JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from guard.account import Account, account_key, id_text, json_object, label_of, plan_text, read_account_file, shown_dir
from guard.errors import SettingsError  # the settings file exists but cannot be merged without losing data
from guard.store import proc_stat
from wrapper.harnesses import LaunchPlan

__all__ = [
    "EARLIER_TEE_MODULES",
    "HOOK_EVENTS",
    "PROJECT_DIR_ENV",
    "REFRESH_INTERVAL_S",
    "RENDERER_ENV",
    "SEATS_PATH",
    "SETTINGS_PATH",
    "TEE_MODULE",
    "Seats",
    "claude_account",
    "claude_env_account",
    "leave_seat",
    "prepare",
    "render_settings",
    "seat_account",
    "status_line",
    "take_seat",
    "teardown",
    "tee_command",
    "unrender_settings",
    "write_settings",
]

SETTINGS_PATH = Path(".claude") / "settings.local.json"
# Who runs here and what the settings file was before the first of them (see the module doc).
SEATS_PATH = Path(".claude") / "hctx-seats.json"
RENDERER_ENV = "ST_CLAUDE_STATUSLINE_RENDERER"
# Tells the tee where this project's `.claude/settings.json` is (it chains that file's statusLine).
PROJECT_DIR_ENV = "HCTX_CLAUDE_PROJECT_DIR"
HOOK_EVENTS = ("PreCompact", "PostCompact", "SessionStart")
REFRESH_INTERVAL_S = 5
# Every command hctx renders names this module; it is how our earlier entries are recognised.
TEE_MODULE = "sidecar.harnesses.claude.tee"
# What an earlier install rendered (the tee was `sidecar.claude_tee` until the harness packages).
EARLIER_TEE_MODULES = ("sidecar.claude_tee",)


def _sidecar_root() -> str:
    """The directory holding the `sidecar` package, found without importing it."""
    spec = importlib.util.find_spec("sidecar")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise SettingsError("the sidecar package is not importable; is hctx installed?")
    return str(Path(locations[0]).resolve().parent)


def tee_command(entry: str) -> str:
    """The shell command line that runs `sidecar.harnesses.claude.tee` `entry` ("statusline" or "hook")."""
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
    command = str(hook.get("command", "")) if isinstance(hook, dict) else ""
    return any(module in command for module in (TEE_MODULE, *EARLIER_TEE_MODULES))


def _without_ours(groups: list[Any]) -> list[Any]:
    """Hook `groups` less hctx's commands; a group that held only ours goes with them."""
    kept = []
    for group in groups:
        if isinstance(group, dict) and isinstance(group.get("hooks"), list):
            theirs = [hook for hook in group["hooks"] if not _is_ours(hook)]
            if not theirs and group["hooks"]:
                continue
            group = {**group, "hooks": theirs}
        kept.append(group)
    return kept


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
        hooks[event] = [*_without_ours(groups), {"hooks": [{"type": "command", "command": command}]}]
    rendered["hooks"] = hooks
    return rendered


def unrender_settings(settings: dict[str, Any], original: dict[str, Any]) -> dict[str, Any]:
    """`settings` less hctx's status line and hooks, everything else as it is now.

    `original` is the file before hctx: its status line comes back where ours still is, and an
    event list or `hooks` object that only removing ours emptied is kept only if it had one.
    Nothing changes unless something of ours was there, so `unrender_settings(s, {}) == s` says
    that `s` holds nothing of hctx's; and `unrender_settings(render_settings(o), o) == o`.
    """
    restored = dict(settings)
    if _is_ours(restored.get("statusLine")):
        if "statusLine" in original:
            restored["statusLine"] = original["statusLine"]
        else:
            del restored["statusLine"]
    hooks = restored.get("hooks")
    if not isinstance(hooks, dict):
        return restored
    had = original.get("hooks")
    had = had if isinstance(had, dict) else {}
    kept_hooks = dict(hooks)
    for event in HOOK_EVENTS:
        groups = hooks.get(event)
        if isinstance(groups, list) and (kept := _without_ours(groups)) != groups:
            if kept or event in had:
                kept_hooks[event] = kept
            else:
                del kept_hooks[event]
    if kept_hooks == hooks:
        return restored
    if kept_hooks or "hooks" in original:
        restored["hooks"] = kept_hooks
    else:
        del restored["hooks"]
    return restored


def _dumps(settings: dict[str, Any]) -> str:
    return json.dumps(settings, indent=2, ensure_ascii=False) + "\n"


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise SettingsError(f"{path} is not UTF-8 text; hctx will not overwrite it") from None


def _parse(path: Path, text: str) -> dict[str, Any]:
    """The settings object in `text`; an empty file is no settings."""
    if not text.strip():
        return {}
    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{path} is not JSON ({exc}); fix or remove it, hctx will not overwrite it") from None
    if not isinstance(settings, dict):
        raise SettingsError(f"{path} is not a JSON object; hctx will not overwrite it")
    return settings


def _replace_text(path: Path, text: str, keep_mode: bool) -> None:
    """Write `text` to `path` atomically; a symlink is written through, never replaced by a copy."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".settings.", delete=False) as tmp:
        try:
            tmp.write(text)
            tmp.flush()
            if keep_mode:
                os.chmod(tmp.name, target.stat().st_mode & 0o7777)
            os.replace(tmp.name, target)
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise


def write_settings(cwd: Path) -> Path:
    """Render into `<cwd>/.claude/settings.local.json`, atomically, only if it changes.

    A symlinked settings file (dotfiles) is written through, never replaced by a copy.
    """
    path = cwd / SETTINGS_PATH
    text = _read_text(path)
    settings = _parse(path, text) if text is not None else {}
    try:
        rendered = _dumps(render_settings(settings))
    except SettingsError as exc:
        raise SettingsError(f"{path}: {exc}; hctx will not overwrite it") from None
    if rendered != text:
        _replace_text(path, rendered, keep_mode=text is not None)
    return path


# --- seats: who runs in this directory, and what to put back after the last -------------------


@dataclasses.dataclass
class Seats:
    # The settings file's text before hctx rendered into it (less what an earlier hctx left there);
    # None when there was no file.
    original: str | None
    created_dir: bool  # hctx created `.claude/`
    held: list[tuple[int, int]]  # (wrapper pid, its start time in clock ticks since boot)


def _process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None when none runs: a pid with its
    start time names one process, even after the pid is reused."""
    stat = proc_stat(pid)
    return None if stat is None or stat.state in ("Z", "X") else stat.started


@contextlib.contextmanager
def _locked(cwd: Path) -> Iterator[None]:
    """One seat change at a time per directory: a flock on the directory itself, so no lock file."""
    fd = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # NFS refuses flock on a directory; unlocked, only two launches in the same instant race.
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load_seats(cwd: Path) -> Seats | None:
    path = cwd / SEATS_PATH
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
        original = value["original"]
        seats = Seats(
            original=original if isinstance(original, str) else None,
            created_dir=value["createdClaudeDir"] is True,
            held=[(int(seat["pid"]), int(seat["startTime"])) for seat in value["seats"]],
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"hctx wrap: ignoring the unreadable {path} ({exc!r})", file=sys.stderr)
        return None
    return seats


def _save_seats(cwd: Path, seats: Seats) -> None:
    value = {
        "original": seats.original,
        "createdClaudeDir": seats.created_dir,
        "seats": [{"pid": pid, "startTime": start} for pid, start in seats.held],
    }
    # mkstemp's 0600: the user's settings may hold secrets (an env block).
    _replace_text(cwd / SEATS_PATH, json.dumps(value, indent=2, ensure_ascii=False) + "\n", keep_mode=False)


def _original(path: Path, text: str | None) -> str | None:
    """What to put back after the last seat: the file as found, less what an earlier hctx left in it."""
    if text is None:
        return None
    settings = _parse(path, text)
    clean = unrender_settings(settings, {})
    if clean == settings:
        return text
    return _dumps(clean) if clean else None


def _live(cwd: Path) -> Seats | None:
    """The seats here with the dead ones dropped; the file put back first if none is left alive."""
    seats = _load_seats(cwd)
    if seats is None:
        return None
    seats.held = [seat for seat in seats.held if _process_start(seat[0]) == seat[1]]
    if seats.held:
        return seats
    _restore(cwd, seats)
    return None


def _restore(cwd: Path, seats: Seats) -> None:
    """hctx's entries out of the settings file as it is now; the exact old bytes if nothing else changed."""
    path = cwd / SETTINGS_PATH
    text = _read_text(path)
    if text is not None:
        original = _parse(path, seats.original) if seats.original is not None else {}
        kept = unrender_settings(_parse(path, text), original)
        restored = seats.original if kept == original else _dumps(kept)
        if restored is None:
            Path(os.path.realpath(path)).unlink(missing_ok=True)
        elif restored != text:
            _replace_text(path, restored, keep_mode=True)
    (cwd / SEATS_PATH).unlink(missing_ok=True)
    if seats.created_dir:
        with contextlib.suppress(OSError):  # not empty: something else lives there now
            (cwd / SEATS_PATH).parent.rmdir()


def take_seat(cwd: Path) -> Seats:
    """This process's seat in `cwd`, the settings rendered; the first seat records the file as found."""
    me = (os.getpid(), _process_start(os.getpid()) or 0)  # /proc is always there on Linux, hctx's only OS
    with _locked(cwd):
        seats = _live(cwd)
        if seats is None:
            path = cwd / SETTINGS_PATH
            created_dir = not path.parent.exists()
            seats = Seats(original=_original(path, _read_text(path)), created_dir=created_dir, held=[])
        seats.held = [seat for seat in seats.held if seat[0] != me[0]] + [me]
        _save_seats(cwd, seats)  # before rendering: a crash in between leaves a record to repair from
        try:
            write_settings(cwd)
        except BaseException:
            _leave(cwd, seats, me[0])
            raise
    return seats


def leave_seat(cwd: Path) -> None:
    """This process's seat in `cwd` given up (and dead ones with it); the last one puts the file back."""
    with _locked(cwd):
        seats = _live(cwd)
        if seats is not None:
            _leave(cwd, seats, os.getpid())


def _leave(cwd: Path, seats: Seats, pid: int) -> None:
    seats.held = [seat for seat in seats.held if seat[0] != pid]
    if seats.held:
        _save_seats(cwd, seats)
    else:
        _restore(cwd, seats)


def _status_line_command(seats: Seats) -> str | None:
    """The command of the status line the user had in the file hctx renders, if any."""
    status = _parse(SETTINGS_PATH, seats.original or "").get("statusLine")
    command = status.get("command") if isinstance(status, dict) else None
    return command if isinstance(command, str) and command.strip() else None


# The account the seat's own login states (issue 29).
# The account a Claude seat's config states (issue 29): `$CLAUDE_CONFIG_DIR/.claude.json` (else
# `~/.claude.json`) `oauthAccount.accountUuid` with `organizationUuid`, else Claude's own env seeding.
#
# 2.1.250 and 2.1.332 send that `accountUuid` with every request and keep the stored `oauthAccount`
# (tests/live/test_accounts_live.py). An API-key seat states no account.


def claude_account(claude_json: bytes, where: str | None = None, plan: str | None = None) -> Account | None:
    """A Claude config dir's `.claude.json` -> the seat's account (`oauthAccount.accountUuid` with
    `organizationUuid`), or None (an API-key seat, or a file that is not Claude's). `plan`: the
    subscription the seat's credentials name (`subscriptionType`), when the caller read one."""
    config = json_object(claude_json)
    oauth = None if config is None else config.get("oauthAccount")
    if not isinstance(oauth, dict):
        return None
    account_uuid, organization_uuid = id_text(oauth.get("accountUuid")), id_text(oauth.get("organizationUuid"))
    if account_uuid is None or organization_uuid is None:
        return None
    key = account_key("claude", account_uuid, organization_uuid)
    return Account(key=key, label=label_of("claude", plan_text(plan), where))


def claude_env_account(env: Mapping[str, str], where: str | None = None, plan: str | None = None) -> Account | None:
    """Claude's own fallback: `CLAUDE_CODE_ACCOUNT_UUID`, `CLAUDE_CODE_ORGANIZATION_UUID` and
    `CLAUDE_CODE_USER_EMAIL` seed `oauthAccount` when the config stores none (2.1.250 and 2.1.332
    both require all three); the email is only a condition, never read into anything."""
    account_uuid = id_text(env.get("CLAUDE_CODE_ACCOUNT_UUID"))
    organization_uuid = id_text(env.get("CLAUDE_CODE_ORGANIZATION_UUID"))
    if account_uuid is None or organization_uuid is None or not env.get("CLAUDE_CODE_USER_EMAIL"):
        return None
    key = account_key("claude", account_uuid, organization_uuid)
    return Account(key=key, label=label_of("claude", plan_text(plan), where))


def seat_account(plan: LaunchPlan) -> Account | None:
    """The account the seat's config states (issue 29): `$CLAUDE_CONFIG_DIR/.claude.json`, else
    `~/.claude.json`, `oauthAccount`; else Claude's own env seeding. None for an API-key seat."""
    env = {**os.environ, **plan.env}
    config_dir = env.get("CLAUDE_CONFIG_DIR")
    path = os.path.join(config_dir, ".claude.json") if config_dir else os.path.expanduser("~/.claude.json")
    where = shown_dir(config_dir) if config_dir else "~"
    plan_name = env.get("CLAUDE_CODE_SUBSCRIPTION_TYPE")
    data = read_account_file(path)
    stored = None if data is None else claude_account(data, where, plan_name)
    return stored or claude_env_account(env, where, plan_name)


def prepare(plan: LaunchPlan) -> LaunchPlan:
    seats = take_seat(plan.cwd)
    env = {PROJECT_DIR_ENV: os.fspath(plan.cwd)}
    # A status line the user had in this very file still draws: the tee runs it as the renderer.
    renderer = _status_line_command(seats)
    if renderer is not None and not os.environ.get(RENDERER_ENV):
        env[RENDERER_ENV] = renderer
    return dataclasses.replace(plan, env={**plan.env, **env}, account=seat_account(plan))


def teardown(plan: LaunchPlan) -> None:
    try:
        leave_seat(plan.cwd)
    except (OSError, SettingsError) as exc:
        print(f"hctx wrap: could not put {plan.cwd / SETTINGS_PATH} back: {exc}", file=sys.stderr)
