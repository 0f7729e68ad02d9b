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
import errno
import fcntl
import importlib.util
import json
import os
import re
import shlex
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.account import Account, read_account_file, shown_dir
from guard.atomic import write_json_atomic
from guard.errors import CatalogError, JsonRefused, Unusable
from guard.files import SYMLINK_PROBLEM, read_bounded, set_aside
from guard.json_rule import loads
from guard.procs import proc_stat
from guard.record import describe_validation_error
from guard.walk import open_chain
from sidecar.harnesses.claude.account import claude_account, claude_env_account
from sidecar.harnesses.claude.compaction import MAX_CONFIGURED, MIN_CONFIGURED, ClaudeCompaction
from sidecar.harnesses.claude.subagents import ClaudeTransport
from sidecar.harnesses.claude.windows import model_table
from sidecar.launching import LaunchPlan
from sidecar.setup_plan import SetupRefused, json_object

__all__ = [
    "CLAUDE_DIR",
    "EARLIER_TEE_MODULES",
    "HOOK_EVENTS",
    "MAX_SEATS_BYTES",
    "MAX_SETTINGS_BYTES",
    "PROJECT_DIR_ENV",
    "REFRESH_INTERVAL_S",
    "RENDERER_ENV",
    "SEATS_PATH",
    "SETTINGS_PATH",
    "SUBAGENT_RENDERER_ENV",
    "TEE_MODULE",
    "Seats",
    "SettingsError",
    "adopted",
    "compaction_settings",
    "is_hctx_entry",
    "leave_seat",
    "prepare",
    "render_settings",
    "seat_account",
    "status_line",
    "subagent_status_line",
    "subagent_transport",
    "take_seat",
    "teardown",
    "tee_command",
    "unrender_settings",
    "write_settings",
]


class SettingsError(Unusable):
    """A harness's settings file cannot be merged; hctx leaves it as it is."""


CLAUDE_DIR = ".claude"
SETTINGS_PATH = Path(CLAUDE_DIR) / "settings.local.json"
# Who runs here and what the settings file was before the first of them (see the module doc).
SEATS_PATH = Path(CLAUDE_DIR) / "hctx-seats.json"
RENDERER_ENV = "ST_CLAUDE_STATUSLINE_RENDERER"
# Issue 37: the user's own `subagentStatusLine`, which the subagent tee runs for the rows Claude draws.
SUBAGENT_RENDERER_ENV = "ST_CLAUDE_SUBAGENT_STATUSLINE_RENDERER"
# Tells the tee where this project's `.claude/settings.json` is (it chains that file's statusLine).
PROJECT_DIR_ENV = "HCTX_CLAUDE_PROJECT_DIR"
# SubagentStart/SubagentStop (issue 28): a subagent's id, type and finish; they carry no usage.
HOOK_EVENTS = ("PreCompact", "PostCompact", "SessionStart", "SubagentStart", "SubagentStop")
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


def subagent_status_line() -> dict[str, Any]:
    """Claude runs it with each Task subagent's row as Claude states it (issue 37): recorded, and
    the user's own `subagentStatusLine` answers for the rows drawn."""
    return {"type": "command", "command": tee_command("subagentstatusline")}


def _is_ours(hook: object) -> bool:
    command = str(hook.get("command", "")) if isinstance(hook, dict) else ""
    return any(module in command for module in (TEE_MODULE, *EARLIER_TEE_MODULES))


def is_hctx_entry(entry: object) -> bool:
    """Whether a statusLine or hook entry runs hctx's tee (this install's or an earlier one's)."""
    return _is_ours(entry)


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
    rendered["subagentStatusLine"] = subagent_status_line()
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
    for key in ("statusLine", "subagentStatusLine"):
        if _is_ours(restored.get(key)):
            if key in original:
                restored[key] = original[key]
            else:
                del restored[key]
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


def _parse(path: Path, text: str) -> dict[str, Any]:
    """The settings object in `text`, read as `hctx setup` reads the user file; an empty file is no settings."""
    try:
        return json_object(text.encode(errors="surrogateescape"), path)
    except SetupRefused as exc:
        raise SettingsError(f"{exc}; fix or remove it, hctx will not overwrite it") from None


# --- the files, opened without following a symlink ------------------------------------------------
# Everything hctx writes here is written into `<cwd>/.claude`, a real directory, through descriptors:
# a `.claude/` or a seats file that is a symlink is refused, and the user's settings file is written
# through a symlink only to a file inside this same directory tree (a link out of the project is the
# same attack as a linked seats file: a cloned repository can carry `../../victim`).

MAX_SETTINGS_BYTES = 4 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclasses.dataclass
class _ClaudeDir:
    cwd: Path
    cwd_fd: int
    fd: int
    created: bool  # by this opening


@contextlib.contextmanager
def _claude_dir(cwd: Path, *, create: bool) -> Iterator[_ClaudeDir | None]:
    """`<cwd>/.claude`, a real directory (created when `create`), or None when there is none."""
    cwd_fd = os.open(cwd, _DIR_FLAGS)
    try:
        created = False
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(CLAUDE_DIR, 0o755, dir_fd=cwd_fd)
                created = True
        try:
            fd = os.open(CLAUDE_DIR, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=cwd_fd)
        except FileNotFoundError:
            yield None
            return
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise SettingsError(
                f"{cwd / CLAUDE_DIR} is a symlink or a file{_pointing(cwd / CLAUDE_DIR)}: hctx writes Claude's "
                "settings and its seats only into a real .claude directory here, never through a link; refusing"
            ) from None
        try:
            yield _ClaudeDir(cwd, cwd_fd, fd, created)
        finally:
            os.close(fd)
    finally:
        os.close(cwd_fd)


def _pointing(path: Path) -> str:
    with contextlib.suppress(OSError):
        return f" (-> {os.readlink(path)})"
    return ""


@dataclasses.dataclass
class _File:
    """One file hctx reads and replaces: a name in a directory it holds open."""

    dir_fd: int
    name: str
    shown: Path  # for messages

    def read(self) -> str | None:
        raw = read_bounded(self.dir_fd, self.name, MAX_SETTINGS_BYTES)
        if raw.problem is not None:
            raise SettingsError(f"{self.shown} {raw.problem}; hctx will not overwrite it")
        if raw.data is None:
            return None
        try:
            return raw.data.decode("utf-8")
        except UnicodeDecodeError:
            raise SettingsError(f"{self.shown} is not UTF-8 text; hctx will not overwrite it") from None

    def replace(self, text: str, *, keep_mode: bool) -> None:
        """Atomically; 0600 for a new file (the user's settings may hold secrets: an env block)."""
        mode = 0o600
        if keep_mode:
            with contextlib.suppress(FileNotFoundError):
                mode = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False).st_mode & 0o7777
        write_json_atomic(self.dir_fd, self.name, text.encode("utf-8"), self.dir_fd, mode=mode)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.name, dir_fd=self.dir_fd)


@contextlib.contextmanager
def _settings_file(claude: _ClaudeDir) -> Iterator[_File]:
    """`.claude/settings.local.json`, or the file inside the project its symlink names."""
    name, shown = SETTINGS_PATH.name, claude.cwd / SETTINGS_PATH
    try:
        linked = stat.S_ISLNK(os.stat(name, dir_fd=claude.fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        linked = False
    if not linked:
        yield _File(claude.fd, name, shown)
        return
    root = Path(os.path.realpath(claude.cwd))
    target = Path(os.path.realpath(shown))
    if not target.is_relative_to(root) or target == root:
        raise SettingsError(
            f"{shown} is a symlink to {target}, outside {root}: hctx renders Claude's settings into this "
            "directory's file only and never writes through a link to a file elsewhere; refusing (make it a "
            "file of its own, or point the link at a file inside the project)"
        )
    parts = target.relative_to(root).parts
    try:
        dir_fd = open_chain(root, parts[:-1])
    except (CatalogError, FileNotFoundError) as exc:
        raise SettingsError(f"{shown} -> {target}: {exc}; hctx will not write through it") from None
    try:
        yield _File(dir_fd, parts[-1], target)
    finally:
        os.close(dir_fd)


def _render_into(settings: _File) -> None:
    text = settings.read()
    current = _parse(settings.shown, text) if text is not None else {}
    try:
        rendered = _dumps(render_settings(current))
    except SettingsError as exc:
        raise SettingsError(f"{settings.shown}: {exc}; hctx will not overwrite it") from None
    if rendered != text:
        settings.replace(rendered, keep_mode=text is not None)


def write_settings(cwd: Path) -> Path:
    """Render into `<cwd>/.claude/settings.local.json`, atomically, only if it changes.

    A settings file symlinked to a file inside `cwd` is written through, never replaced by a copy;
    one linked out of `cwd` is refused (SettingsError), as is a symlinked `.claude`.
    """
    with _claude_dir(cwd, create=True) as claude:
        assert claude is not None
        with _settings_file(claude) as settings:
            _render_into(settings)
    return cwd / SETTINGS_PATH


# --- seats: who runs in this directory, and what to put back after the last -------------------


@dataclasses.dataclass
class Seats:
    # The settings file's text before hctx rendered into it (less what an earlier hctx left there);
    # None when there was no file.
    original: str | None
    created_dir: bool  # hctx created `.claude/`
    held: list[tuple[int, int]]  # (wrapper pid, its start time in clock ticks since boot)


class _SeatWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int = Field(strict=True, gt=0)
    start_time: int = Field(strict=True, ge=0, alias="startTime")


class _SeatsWire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    original: str | None
    created_dir: bool = Field(strict=True, alias="createdClaudeDir")
    seats: list[_SeatWire] = Field(max_length=4096)


MAX_SEATS_BYTES = 1024 * 1024


def _process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None when none runs: a pid with its
    start time names one process, even after the pid is reused."""
    proc = proc_stat(pid)
    return None if proc is None or proc.state in ("Z", "X") else proc.started


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


def _load_seats(claude: _ClaudeDir) -> Seats | None:
    """The seats record; None when there is none. A symlink in its place is refused (SettingsError);
    anything else unreadable (a FIFO, a huge or hostile file) is set aside, said so, and left."""
    name, shown = SEATS_PATH.name, claude.cwd / SEATS_PATH
    raw = read_bounded(claude.fd, name, MAX_SEATS_BYTES)
    if raw.absent:
        return None
    if raw.problem == SYMLINK_PROBLEM:
        raise SettingsError(
            f"{shown} is a symlink{_pointing(shown)}; it is hctx's own file and never a link, so hctx "
            "will neither follow nor replace it: refusing (remove the link)"
        )
    problem = raw.problem
    if raw.data is not None:
        try:
            wire = _SeatsWire.model_validate(loads(raw.data))  # the rule refuses a lone surrogate too
            return Seats(wire.original, wire.created_dir, [(seat.pid, seat.start_time) for seat in wire.seats])
        except JsonRefused as exc:
            problem = f"is not a seats record ({exc})"
        except ValidationError as exc:
            problem = f"is not a seats record ({describe_validation_error(exc)})"
    try:
        aside = set_aside(claude.fd, name)
        print(f"hctx wrap: {shown} {problem}; set aside as {aside}, starting a new one", file=sys.stderr)
    except OSError as exc:
        raise SettingsError(f"{shown} {problem}, and cannot be set aside ({exc.strerror}); remove it") from None
    return None


def _save_seats(claude: _ClaudeDir, seats: Seats) -> None:
    value = {
        "original": seats.original,
        "createdClaudeDir": seats.created_dir,
        "seats": [{"pid": pid, "startTime": start} for pid, start in seats.held],
    }
    # 0600: the user's settings it holds may hold secrets (an env block).
    text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    _File(claude.fd, SEATS_PATH.name, claude.cwd / SEATS_PATH).replace(text, keep_mode=False)


def _original(path: Path, text: str | None) -> str | None:
    """What to put back after the last seat: the file as found, less what an earlier hctx left in it."""
    if text is None:
        return None
    settings = _parse(path, text)
    clean = unrender_settings(settings, {})
    if clean == settings:
        return text
    return _dumps(clean) if clean else None


def _live(claude: _ClaudeDir) -> Seats | None:
    """The seats here with the dead ones dropped; the file put back first if none is left alive."""
    seats = _load_seats(claude)
    if seats is None:
        return None
    seats.held = [seat for seat in seats.held if _process_start(seat[0]) == seat[1]]
    if seats.held:
        return seats
    _restore(claude, seats)
    return None


def _restore(claude: _ClaudeDir, seats: Seats) -> None:
    """hctx's entries out of the settings file as it is now; the exact old bytes if nothing else changed."""
    with _settings_file(claude) as settings:
        text = settings.read()
        if text is not None:
            original = _parse(settings.shown, seats.original) if seats.original is not None else {}
            kept = unrender_settings(_parse(settings.shown, text), original)
            restored = seats.original if kept == original else _dumps(kept)
            if restored is None:
                settings.remove()
            elif restored != text:
                settings.replace(restored, keep_mode=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SEATS_PATH.name, dir_fd=claude.fd)
    if seats.created_dir:
        with contextlib.suppress(OSError):  # not empty: something else lives there now
            os.rmdir(CLAUDE_DIR, dir_fd=claude.cwd_fd)


def take_seat(cwd: Path, pid: int) -> Seats:
    """The seat of the wrapper `pid` in `cwd`, the settings rendered; the first seat records the file
    as found."""
    me = (pid, _process_start(pid) or 0)  # /proc is always there on Linux, hctx's only OS
    with _locked(cwd), _claude_dir(cwd, create=True) as claude:
        assert claude is not None
        try:
            seats = _live(claude)
            if seats is None:
                with _settings_file(claude) as settings:
                    seats = Seats(_original(settings.shown, settings.read()), claude.created, held=[])
        except BaseException:
            if claude.created:
                with contextlib.suppress(OSError):
                    os.rmdir(CLAUDE_DIR, dir_fd=claude.cwd_fd)
            raise
        seats.held = [seat for seat in seats.held if seat[0] != me[0]] + [me]
        _save_seats(claude, seats)  # before rendering: a crash in between leaves a record to repair from
        try:
            with _settings_file(claude) as settings:
                _render_into(settings)
        except BaseException:
            _leave(claude, seats, me[0])
            raise
    return seats


def leave_seat(cwd: Path, pid: int) -> None:
    """The seat of the wrapper `pid` in `cwd` given up (and dead ones with it); the last one puts the
    file back."""
    with _locked(cwd), _claude_dir(cwd, create=False) as claude:
        if claude is None:
            return
        seats = _live(claude)
        if seats is not None:
            _leave(claude, seats, pid)


def _leave(claude: _ClaudeDir, seats: Seats, pid: int) -> None:
    seats.held = [seat for seat in seats.held if seat[0] != pid]
    if seats.held:
        _save_seats(claude, seats)
    else:
        _restore(claude, seats)


def _status_line_command(seats: Seats, key: str = "statusLine") -> str | None:
    """The command of the status line (`key`) the user had in the file hctx renders, if any."""
    status = _parse(SETTINGS_PATH, seats.original or "").get(key)
    command = status.get("command") if isinstance(status, dict) else None
    return command if isinstance(command, str) and command.strip() else None


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


_DIGITS = re.compile(r"[0-9]{1,12}")
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?")
_TRUE = ("1", "true", "yes", "on")  # Claude's truthy environment words (2.1.250 `Pe`)


def _settings_chain(plan: LaunchPlan, seats: Seats, env: dict[str, str]) -> list[dict[str, Any]]:
    """The settings objects Claude merges for this seat, the winning one first: the user's own
    `.claude/settings.local.json` (as it was before hctx), the project's, the user's. A file that is
    absent, unreadable or no JSON object says nothing."""
    config_dir = env.get("CLAUDE_CONFIG_DIR") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".claude")
    texts = [seats.original or ""]
    for path in (plan.cwd / CLAUDE_DIR / "settings.json", Path(config_dir) / "settings.json"):
        data = read_bounded(None, path, MAX_SETTINGS_BYTES).data
        texts.append(data.decode("utf-8", "replace") if data is not None else "")
    chain: list[dict[str, Any]] = []
    for text in texts:
        with contextlib.suppress(JsonRefused):
            value = loads(text) if text.strip() else None
            if isinstance(value, dict):
                chain.append(value)
    return chain


def compaction_settings(plan: LaunchPlan, seats: Seats) -> ClaudeCompaction | None:
    """Claude's auto-compaction as this seat's Claude will read it (issue 37,
    `sidecar.harnesses.claude.compaction` quotes the rule): None where hctx cannot read an input as
    Claude would (then no point is published)."""
    env = {**os.environ, **plan.env}
    chain = _settings_chain(plan, seats, env)
    home = env.get("HOME") or os.path.expanduser("~")
    config_dir = env.get("CLAUDE_CONFIG_DIR")
    legacy = read_account_file(os.path.join(config_dir or home, ".claude.json"))
    with contextlib.suppress(JsonRefused, UnicodeDecodeError):
        parsed = loads(legacy.decode("utf-8")) if legacy else None
        if isinstance(parsed, dict):
            chain.append(parsed)  # the global config: where `autoCompactEnabled` was kept before settings
    switch = next((s["autoCompactEnabled"] for s in chain if isinstance(s.get("autoCompactEnabled"), bool)), True)
    if not switch or (env.get("DISABLE_COMPACT") or "").strip().lower() in _TRUE:
        return ClaudeCompaction(enabled=False)
    pct = (env.get("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE") or "").strip()
    output = (env.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS") or "").strip()
    if (pct and not _DECIMAL.fullmatch(pct)) or (output and not _DIGITS.fullmatch(output)):
        return None  # a value Claude parses leniently (parseFloat, parseInt): not read as a guess
    configured = _configured_window(env, chain)
    if configured is None:
        return None
    percent = float(pct) if pct and 0 < float(pct) <= 100 else None
    return ClaudeCompaction(enabled=True, configured_window=configured, pct_override=percent,
                            max_output_tokens=int(output) if output and int(output) > 0 else None)  # fmt: skip


def _configured_window(env: dict[str, str], chain: list[dict[str, Any]]) -> int | None:
    """CLAUDE_CODE_AUTO_COMPACT_WINDOW (a positive integer, capped at 1,000,000, raised to
    100,000), else the first settings file whose `autoCompactWindow` is an integer in
    100,000..1,000,000 (Claude drops any other value of it file by file); None for the 2.1.332
    per-model object, or where nothing states one."""
    raw = (env.get("CLAUDE_CODE_AUTO_COMPACT_WINDOW") or "").strip()
    if raw:
        if not _DIGITS.fullmatch(raw):
            return None
        if int(raw) > 0:
            return max(MIN_CONFIGURED, min(int(raw), MAX_CONFIGURED))
    for settings in chain:
        value = settings.get("autoCompactWindow")
        if isinstance(value, dict):
            return None
        if isinstance(value, int) and not isinstance(value, bool) and MIN_CONFIGURED <= value <= MAX_CONFIGURED:
            return value
    return None


def subagent_transport(plan: LaunchPlan, compaction: ClaudeCompaction | None = None) -> ClaudeTransport:
    """The sidecar's subagent transport (issue 28): where this seat's Claude writes its projects
    (`$CLAUDE_CONFIG_DIR/projects`, else `~/.claude/projects`), the only place it reads a subagent's
    transcript, and Claude's model table (`windows`, the one `hctx scan` uses: shipped, extended by
    the user's file), which gives a subagent's window by its model id."""
    env = {**os.environ, **plan.env}
    config_dir = env.get("CLAUDE_CONFIG_DIR") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".claude")
    warnings: list[str] = []
    windows = model_table(env, warnings)
    for warning in warnings:
        print(f"hctx wrap: {warning}", file=sys.stderr)
    return ClaudeTransport(projects_dir=os.path.join(os.path.abspath(config_dir), "projects"), windows=windows,
                           compaction=compaction)  # fmt: skip


def prepare(plan: LaunchPlan) -> LaunchPlan:
    seats = take_seat(plan.cwd, plan.owner_pid)
    env = {PROJECT_DIR_ENV: os.fspath(plan.cwd)}
    # A status line the user had in this very file still draws: the tee runs it as the renderer.
    renderer = _status_line_command(seats)
    if renderer is not None and not os.environ.get(RENDERER_ENV):
        env[RENDERER_ENV] = renderer
    rows = _status_line_command(seats, "subagentStatusLine")
    if rows is not None and not os.environ.get(SUBAGENT_RENDERER_ENV):
        env[SUBAGENT_RENDERER_ENV] = rows
    return dataclasses.replace(plan, env={**plan.env, **env}, account=seat_account(plan),
                               transport=subagent_transport(plan, compaction_settings(plan, seats)))  # fmt: skip


def adopted(pid: int, cwd: Path, hints: Mapping[str, str]) -> LaunchPlan:
    """The plan of a Claude session `hctx adopt` adopts (issue 36): nothing to launch (`argv=()`,
    the process `pid` runs already) and nothing rendered here (the user-level settings `hctx setup`
    wrote run the tee); the transport (projects dir, model windows, compaction settings) and the
    account as `prepare` gives a wrapped seat in `cwd`. The adopter runs with the environment of the
    hook or status line that started it, which is Claude's own: the same CLAUDE_CONFIG_DIR, HOME
    and compaction variables `prepare` reads from the wrapper's. The settings chain starts from
    `.claude/settings.local.json` as it stands (less anything of a wrapped seat's hctx there)."""
    del pid, hints  # Claude's tee states everything else on its channel
    plan = LaunchPlan(harness="claude", argv=(), cwd=cwd)
    local = read_bounded(None, cwd / SETTINGS_PATH, MAX_SETTINGS_BYTES).data
    try:
        original = _original(cwd / SETTINGS_PATH, None if local is None else local.decode("utf-8", "replace"))
    except SettingsError:
        original = None  # a file Claude itself cannot read either says nothing
    seats = Seats(original, created_dir=False, held=[])
    return dataclasses.replace(plan, account=seat_account(plan),
                               transport=subagent_transport(plan, compaction_settings(plan, seats)))  # fmt: skip


def teardown(plan: LaunchPlan) -> None:
    try:
        leave_seat(plan.cwd, plan.owner_pid)
    except (OSError, SettingsError) as exc:
        print(f"hctx wrap: could not put {plan.cwd / SETTINGS_PATH} back: {exc}", file=sys.stderr)
