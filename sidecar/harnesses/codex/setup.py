"""Codex's user-level extension point (issue 36): a `SessionStart` hook in `$CODEX_HOME/hooks.json`,
trusted in `$CODEX_HOME/config.toml`, whose command adopts the session it starts.

Measured on codex-cli 0.151.0 and 0.171.0 (2026-12-05, isolated HOME and CODEX_HOME, the fake
Responses server on 127.0.0.1; fixtures/codex/hooks/README.md):

- Hooks are a stable feature, on by default in both (`codex features list`: `hooks stable true`);
  no `[features]` flag is needed. A user who turned them off (`hooks = false`, or the legacy
  `codex_hooks = false`) is told so and left as they are: hctx does not turn them back on.
- A user hook runs only once trusted: Codex skips an untrusted one without a word (`codex exec` ran,
  the hook did not). Trust is `[hooks.state."<key>"] trusted_hash = "sha256:…"` in the user's
  config.toml (what the TUI's hook review writes), the key `<real path of hooks.json>:session_start:
  <group index>:<handler index>` (a symlinked CODEX_HOME is resolved), the hash Codex's
  `version_for_toml` of the hook's normalized identity (`trusted_hash`; equal to the `currentHash`
  both binaries' `hooks/list` report, fixtures/codex/hooks/hooks-list-*.json).
- `SessionStart` fires for the TUI, `codex exec` and their resume (`source`: `startup`, `resume`),
  before the first turn, and the session waits for the hook (a hook sleeping 3 s made `codex exec`
  3 s longer). Its stdin is one JSON object: `session_id`, `transcript_path` (the rollout, already
  created), `cwd`, `hook_event_name`, `model`, `permission_mode`, `source`.
- The command runs as `$SHELL -lc <command>` (`/bin/sh` without SHELL), in the session's cwd, with
  Codex's environment; the shell execs a lone command, so the hook's parent is the process running
  the session: `codex` itself for 0.151.0 (TUI, exec) and 0.171.0's `codex exec` and
  `codex --no-daemon`.
- 0.171.0's TUI runs its sessions in a background app-server (`codex app-server --listen unix://
  --managed-daemon`, copied under `$CODEX_HOME/packages/`), shared by every TUI and outliving them
  (it still held the rollout open after the TUI quit): there the hook's parent is that daemon, and
  no process of the session's own lifetime is in the hook's ancestry, so that session is not adopted
  (`codex --no-daemon` is).

The hook command is this module: `python -I -m sidecar.harnesses.codex.setup` (`hook_main`) reads the
payload, finds the session's process and runs the adopting wrapper (`adopt_command`) with its rollout.
The edits are the wrapper process's (`wrapper.launch.userfiles` runs them); the hook process imports
only the standard library, `guard` and `sidecar.setup_plan`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from guard.errors import HctxError, JsonRefused
from guard.files import read_bounded
from guard.json_rule import loads_object
from guard.procs import proc_stat, proc_words
from sidecar.adoption import ADOPT_ENV_GUARDS, ADOPT_LOG, ADOPT_LOG_BYTES
from sidecar.setup_plan import BuildPoint, HarnessSetup, SetupRefused, UserFile, adopt_command

__all__ = [
    "ADOPT_LOG",
    "BUILDS",
    "CONFIG_FILE",
    "EVENT",
    "EVENT_KEY",
    "HOOKS_FILE",
    "HOOK_MODULE",
    "HOOK_TIMEOUT_S",
    "MAX_FILE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "HooksJsonEdit",
    "SessionStart",
    "TrustEdit",
    "decode_session_start",
    "hook_command",
    "hook_main",
    "note",
    "session_process",
    "setup",
    "trust_key",
    "trusted_hash",
]

HOOK_MODULE: Final = "sidecar.harnesses.codex.setup"
# Codex waits for the hook; the adopting wrapper detaches within a fraction of a second, so a hook
# still running after this is stuck, and Codex (not the user) gives up on it.
HOOK_TIMEOUT_S: Final = 10
EVENT: Final = "SessionStart"
EVENT_KEY: Final = "session_start"  # Codex's key label of the event (trust keys, hashes)
HOOKS_FILE: Final = "hooks.json"
CONFIG_FILE: Final = "config.toml"
MAX_FILE_BYTES: Final = 1 << 20
MAX_PAYLOAD_BYTES: Final = 1 << 20
# What the hook's command holds, so hctx's own entry is found again (an older interpreter's too).
_MARK: Final = f"-m {HOOK_MODULE}"

BUILDS: Final = (
    BuildPoint("0.151.0", True, "user hooks.json SessionStart hook, trusted in config.toml [hooks.state]: "
                                "the TUI, `codex exec` and resume"),
    BuildPoint("0.171.0", True, "user hooks.json SessionStart hook, trusted in config.toml [hooks.state]: "
                                "`codex exec`, `codex --no-daemon` and resume; not the TUI's default "
                                "background app-server daemon, which outlives its sessions"),
)  # fmt: skip


def setup(home: Path, environ: Mapping[str, str]) -> HarnessSetup:
    """The hook in `$CODEX_HOME/hooks.json` (default `~/.codex`) and its trust in config.toml."""
    codex_home = Path(environ.get("CODEX_HOME") or home / ".codex")
    hooks = HooksJsonEdit(UserFile(codex_home, PurePosixPath(HOOKS_FILE)), hook_command())
    installed = shutil.which("codex", path=environ.get("PATH", "")) is not None or codex_home.is_dir()
    # The trust key names the group's place in hooks.json: where the hook is, or will be appended.
    raw = read_bounded(None, codex_home / HOOKS_FILE, MAX_FILE_BYTES)
    try:
        index = hooks.index_in(raw.data) if raw.problem is None else None
        problem = raw.problem
    except SetupRefused as refused:
        index, problem = None, str(refused)
    trust = TrustEdit(
        UserFile(codex_home, PurePosixPath(CONFIG_FILE)),
        key=None if index is None else trust_key(codex_home, index),
        hash=trusted_hash(hooks.group()),
        problem=None if problem is None else f"{codex_home / HOOKS_FILE} {problem}",
    )
    return HarnessSetup("codex", installed, (hooks, trust), BUILDS)


def hook_command(python: str | None = None) -> str:
    """The hook's command line (Codex hands it to `$SHELL -lc`): this interpreter by absolute path,
    isolated, running this module."""
    return shlex.join([python or sys.executable, "-I", "-m", HOOK_MODULE])


def trust_key(codex_home: Path, group: int) -> str:
    """Codex's key of the hook at `group` of hooks.json's SessionStart (its only handler)."""
    return f"{os.path.realpath(codex_home / HOOKS_FILE)}:{EVENT_KEY}:{group}:0"


def trusted_hash(group: Mapping[str, Any]) -> str:
    """Codex's `version_for_toml` of a one-handler group's normalized identity: the event's key
    label with the group (matcher, its handler with the timeout Codex defaults and `async`), keys
    sorted at every depth, compact JSON, SHA-256. A field absent from the group stays absent (TOML
    has no null), as in Codex."""
    [handler] = group["hooks"]
    normalized = {
        "type": "command",
        "command": handler["command"],
        "timeout": max(int(handler.get("timeout", 600)), 1),
        "async": bool(handler.get("async", False)),
    }
    if handler.get("statusMessage") is not None:
        normalized["statusMessage"] = handler["statusMessage"]
    identity: dict[str, Any] = {"event_name": EVENT_KEY, "hooks": [normalized]}
    if group.get("matcher") is not None:
        identity["matcher"] = group["matcher"]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _is_ours(group: object) -> bool:
    if not isinstance(group, dict) or not isinstance(handlers := group.get("hooks"), list):
        return False
    return any(isinstance(h, dict) and _MARK in str(h.get("command", "")) for h in handlers)


@dataclass(frozen=True)
class HooksJsonEdit:
    """hctx's SessionStart group in hooks.json, after the user's own (appending never moves their
    groups, so the trust Codex keyed by their places stays theirs)."""

    file: UserFile
    command: str

    def group(self) -> dict[str, Any]:
        return {"hooks": [{"type": "command", "command": self.command, "timeout": HOOK_TIMEOUT_S}]}

    def _load(self, current: bytes | None) -> tuple[dict[str, Any], list[Any]]:
        doc = {} if current is None else loads_object(current, error=SetupRefused)
        hooks = doc.setdefault("hooks", {})
        if not isinstance(hooks, dict):
            raise SetupRefused(f'"hooks" is not an object but {type(hooks).__name__}; not touched')
        groups = hooks.setdefault(EVENT, [])
        if not isinstance(groups, list):
            raise SetupRefused(f'"hooks.{EVENT}" is not a list but {type(groups).__name__}; not touched')
        return doc, groups

    def index_in(self, current: bytes | None) -> int:
        """Where hctx's group is in `apply(current)`."""
        _, groups = self._load(current)
        return next((i for i, group in enumerate(groups) if _is_ours(group)), len(groups))

    def apply(self, current: bytes | None) -> bytes:
        doc, groups = self._load(current)
        ours = self.group()
        at = next((i for i, group in enumerate(groups) if _is_ours(group)), None)
        if at is not None and groups[at] == ours and current is not None:
            return current  # in place already: the user's bytes untouched
        if at is None:
            groups.append(ours)
        else:
            groups[at] = ours  # an older interpreter's command: replaced where it stands
        return _dump(doc)

    def remove(self, current: bytes, original: bytes | None) -> bytes | None:
        doc, groups = self._load(current)
        kept = [group for group in groups if not _is_ours(group)]
        if len(kept) == len(groups) and original is not None:
            return current
        hooks = doc["hooks"]
        hooks[EVENT] = kept
        # What setup added to hold the group goes with it: an empty list or object the user had stays.
        had_hooks, had_event = _holds(original)
        if not kept and not had_event:
            del hooks[EVENT]
        if not hooks and not had_hooks:
            del doc["hooks"]
        return None if not doc and original is None else _dump(doc)


def _holds(original: bytes | None) -> tuple[bool, bool]:
    """Whether the file before setup had a "hooks" object and, in it, a SessionStart list."""
    try:
        doc = {} if original is None else loads_object(original)
    except JsonRefused:
        return False, False
    hooks = doc.get("hooks")
    return isinstance(hooks, dict), isinstance(hooks, dict) and EVENT in hooks


def _dump(doc: dict[str, Any]) -> bytes:
    try:
        return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()
    except RecursionError:
        raise SetupRefused("is nested too deeply to write back; not touched") from None


def _table(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SetupRefused(f"holds {name} that is not a table ({type(value).__name__}); not touched")
    return value


@dataclass(frozen=True)
class TrustEdit:
    """The hook's trust in config.toml: `[hooks.state."<key>"] trusted_hash`. The file is edited with
    tomlkit, which keeps every other byte of the user's (comments, order, layout)."""

    file: UserFile
    key: str | None
    hash: str
    problem: str | None = None  # why hooks.json could not be read, so no key is known

    def _parse(self, current: bytes) -> dict[str, Any]:
        try:
            return tomllib.loads(current.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise SetupRefused(f"is not UTF-8 ({exc.reason} at byte {exc.start}); not touched") from None
        except tomllib.TOMLDecodeError as exc:
            raise SetupRefused(f"is not valid TOML ({exc}); not touched") from None

    def apply(self, current: bytes | None) -> bytes:
        import tomlkit  # the wrapper's `hctx setup` only, never the hook

        if self.key is None:
            raise SetupRefused(f"not trusted: {self.problem}")
        parsed = self._parse(current or b"")
        features = parsed.get("features")
        for flag in ("hooks", "codex_hooks"):
            if isinstance(features, dict) and features.get(flag) is False:
                raise SetupRefused(f"turns Codex's hooks off ([features] {flag} = false); hctx leaves that "
                                   "as it is, so Codex sessions are not adopted")  # fmt: skip
        state = _table(_table(parsed.get("hooks", {}), "hooks").get("state", {}), "hooks.state")
        entry = _table(state.get(self.key, {}), f'hooks.state."{self.key}"')
        if current is not None and entry.get("trusted_hash") == self.hash:
            return current
        doc = tomlkit.parse((current or b"").decode())
        hooks = doc.get("hooks")
        if hooks is None:
            hooks = doc["hooks"] = tomlkit.table(is_super_table=True)
        hook_state = hooks.get("state")
        if hook_state is None:
            hook_state = hooks["state"] = tomlkit.table(is_super_table=True)
        if self.key in hook_state:
            hook_state[self.key]["trusted_hash"] = self.hash
        else:
            table = tomlkit.table()
            table["trusted_hash"] = self.hash
            hook_state[self.key] = table
        return tomlkit.dumps(doc).encode()

    def remove(self, current: bytes, original: bytes | None) -> bytes | None:
        import tomlkit

        parsed = self._parse(current)
        hooks = parsed.get("hooks")
        state = hooks.get("state") if isinstance(hooks, dict) else None
        entry = state.get(self.key) if isinstance(state, dict) and self.key is not None else None
        if not isinstance(entry, dict) or entry.get("trusted_hash") != self.hash:
            return current  # no trust of hctx's here (the user's own is never taken)
        doc = tomlkit.parse(current.decode())
        hook_state = doc["hooks"]["state"]
        table = hook_state[self.key]
        del table["trusted_hash"]
        if not table:  # the user added nothing beside it (an `enabled`)
            del hook_state[self.key]
        # The tables setup added to hold it go with it: an empty one the user had stays.
        try:
            before = tomllib.loads(original.decode()) if original is not None else {}
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            before = {}
        had_hooks = isinstance(before.get("hooks"), dict)
        if not hook_state and not (had_hooks and "state" in before["hooks"]):
            del doc["hooks"]["state"]
        if not doc["hooks"] and not had_hooks:
            del doc["hooks"]
        # The blank line tomlkit set before the table goes with it.
        text = tomlkit.dumps(doc).rstrip("\n")
        return None if not text.strip() and original is None else (text + "\n" if text else "").encode()


# The hook (Codex runs it as `$SHELL -lc '<python> -I -m sidecar.harnesses.codex.setup'`).


@dataclass(frozen=True)
class SessionStart:
    """What Codex hands a SessionStart hook on stdin (0.151.0, 0.171.0)."""

    session_id: str
    transcript_path: str | None  # the rollout; None for a session that keeps none
    cwd: str
    source: str  # startup, resume, clear


def decode_session_start(data: bytes) -> SessionStart | str:
    """The payload, or why it is not one (hostile input is a reason, never an exception)."""
    try:
        payload = loads_object(data)
    except JsonRefused as refused:
        return f"not a hook payload: {refused}"
    if payload.get("hook_event_name") != EVENT:
        return f"not a {EVENT} payload: hook_event_name is {payload.get('hook_event_name')!r}"
    session, rollout, cwd = payload.get("session_id"), payload.get("transcript_path"), payload.get("cwd")
    if not isinstance(session, str) or not session:
        return "no session_id"
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        return f"cwd is not an absolute path: {cwd!r}"
    if rollout is not None and (not isinstance(rollout, str) or not rollout.startswith("/")):
        return f"transcript_path is not an absolute path: {rollout!r}"
    source = payload.get("source")
    return SessionStart(session, rollout, cwd, source if isinstance(source, str) else "")


def session_process(parent: int) -> int | str:
    """The process running the session whose hook this is, from the hook's parent; else why none.

    Codex runs the command as `$SHELL -lc <command>`: a shell that forked rather than exec'd it is
    the parent, recognized by that very command line, and the session's process is above it.
    """
    words = proc_words(parent, "cmdline")
    if len(words) == 3 and words[1] == "-lc" and _MARK in words[2]:
        stat = proc_stat(parent)
        if stat is None:
            return "the hook's shell ended"
        parent = stat.parent
        words = proc_words(parent, "cmdline")
    if not words:
        return f"the session's process {parent} is gone"
    if "--managed-daemon" in words[1:] and "app-server" in words[1:]:
        return ("the session runs in Codex's shared background app-server (0.171.0's TUI), which outlives it; "
                "`codex --no-daemon` sessions are adopted")  # fmt: skip
    return parent


def _read_payload(fd: int) -> bytes:
    """Stdin to its end (a pipe hands it over in pieces), at most MAX_PAYLOAD_BYTES + 1."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_PAYLOAD_BYTES and (chunk := os.read(fd, MAX_PAYLOAD_BYTES + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def note(message: str) -> None:
    """A line in the adoption log (`<catalog>/.st2/logs/adopt.log`, where the adopter writes why it
    does not adopt): why this hook started no adopter. Never raises: the hook must not fail Codex."""
    from guard.layout import default_catalog_origin
    from guard.walk import open_log

    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError, HctxError):
        fd = open_log(default_catalog_origin()[0].absolute(), ADOPT_LOG, ADOPT_LOG_BYTES)
        try:
            os.write(fd, f"{stamp} hctx adopt: codex hook: {message}\n".encode(errors="replace"))
        finally:
            os.close(fd)


def hook_main(stdin: int = 0, environ: Mapping[str, str] = os.environ) -> int:
    """The SessionStart hook: adopt the session unless a wrapped seat already publishes it (or
    HCTX_NO_ADOPT keeps it plain: `sidecar.adoption.ADOPT_ENV_GUARDS`).

    Always exits 0 with nothing on stdout (a SessionStart hook's stdout becomes model context in
    Codex); the adopting wrapper runs in a child of the hook's own and logs its own errors, its stdio
    /dev/null, so Codex, which waits for the hook and its pipes, is not held by it.
    """
    if any(environ.get(name) for name in ADOPT_ENV_GUARDS):
        return 0  # `hctx wrap` started this codex (the wrapped seat publishes it), or it is to stay plain
    payload = decode_session_start(_read_payload(stdin))
    if isinstance(payload, str):
        note(f"not adopting: {payload}")
        return 0
    pid = session_process(os.getppid())
    if isinstance(pid, str):
        note(f"not adopting session {payload.session_id}: {pid}")
        return 0
    argv = adopt_command("codex", "--pid", str(pid), "--cwd", payload.cwd, "--hint", f"session={payload.session_id}")
    if payload.transcript_path is not None:
        argv += ["--hint", f"rollout={payload.transcript_path}"]
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # Codex waits for the hook: the adopter starts in a child of its own, and the hook is done (its
    # interpreter's start-up was the whole wait; the adopter's checks run beside the session).
    if os.fork() == 0:
        try:
            os.setsid()
            os.execv(argv[0], argv)
        finally:
            os._exit(1)  # the exec failed (the interpreter gone): nothing more to do for this session
    return 0


if __name__ == "__main__":
    raise SystemExit(hook_main())
