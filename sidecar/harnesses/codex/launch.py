"""Codex: tap the app-server's server→client JSON-RPC stream, on stdio or on a websocket listener.

- `codex app-server` (stdio, the default): the wrapper copies the harness's stdout byte for byte to
  its own and hands the sidecar each line (`tap_stdout`, as the spec's `tap_frame` frames it). The
  client's stdin goes straight through.
- `codex app-server --listen ws://IP:PORT`: the harness is moved to a free private loopback port and
  the sidecar's relay listens where the client asked, forwarding every connection to the harness
  (`sidecar.harnesses.codex.transport`).

- an interactive session (`codex`, `codex exec|resume|fork|review …`): no stream to tap, but the
  rollout file it writes is followed by the sidecar (`sidecar.harnesses.codex.rollout`, issue 8's transport).

Anything else (`app-server generate-ts`, a `unix://` listener, `codex login`) launches unchanged and
publishes no record.

Every mode's transport config (the spec's `transport_config`, the model the sidecar validates it
with) also carries the compaction settings the harness will load
(`compaction_settings`, the typed `CompactionConfig`): `model_auto_compact_token_limit` and
`model_context_window` as the last
`-c KEY=VALUE` sets them, else the selected profile (`--profile`/`-p`, else the file's `profile`),
else `$CODEX_HOME/config.toml` (default `~/.codex`). The transport hands them to the producer as a
typed event.
An adopted session (issue 36: a `codex` started without hctx, adopted by the SessionStart hook
`hctx setup` installs, `sidecar.harnesses.codex.setup`) gets the interactive seat's plan from
`adopted`: the rollout its own process holds open, with the settings and account read from that
process's own command line and CODEX_HOME.

A project's own `.codex/config.toml` is not read (its trust-gated layering is not measured here), so a
limit set only there is not published.
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from guard.account import Account, read_account_file, shown_dir
from guard.files import read_bounded
from guard.procs import proc_stat, proc_words
from sidecar.harnesses.codex.account import codex_account
from sidecar.harnesses.codex.events import CompactionConfig
from sidecar.harnesses.codex.producer import ChannelOnly, CodexTransport, Relay, Rollout
from sidecar.launching import LOOPBACK, LaunchPlan, free_loopback_port, program_index

__all__ = [
    "APP_SERVER",
    "COMPACTION_KEYS",
    "MAX_CONFIG_BYTES",
    "adopted",
    "compaction_settings",
    "prepare",
    "seat_account",
]

APP_SERVER: Final = "app-server"
# Far above any real config.toml; a bigger file is not Codex's settings but a mistake or an attack.
MAX_CONFIG_BYTES: Final = 1 << 20

# `codex app-server` options that take a value (codex-cli 0.151.0 and 0.171.0 `app-server --help`),
# so a value is never mistaken for the subcommand.
_VALUED_OPTIONS: Final = frozenset({
    "-c", "--config", "--enable", "--disable", "--code-mode-host", "--listen", "--ws-auth",
    "--ws-token-file", "--ws-token-sha256", "--ws-shared-secret-file", "--ws-issuer", "--ws-audience",
    "--ws-max-clock-skew-seconds",
})  # fmt: skip
# The same for the top-level `codex` options that may precede the subcommand.
_TOP_VALUED_OPTIONS: Final = frozenset({
    "-c", "--config", "--enable", "--disable", "-m", "--model", "-p", "--profile", "-s", "--sandbox",
    "-a", "--ask-for-approval", "-C", "--cd", "--add-dir", "-i", "--image", "--local-provider",
    "--remote", "--remote-auth-token-env",
})  # fmt: skip


# `codex --help` (0.151.0, 0.171.0) subcommands that run no session of their own. Everything else
# (the bare TUI, a prompt, `exec`, `resume`, `fork`, `review`) writes a rollout.
_SESSIONLESS_SUBCOMMANDS: Final = frozenset({
    "agents", "login", "logout", "mcp", "plugin", "mcp-server", "app-server", "remote-control", "completion",
    "update", "doctor", "sandbox", "debug", "apply", "a", "queue", "archive", "delete", "migrate-rollouts",
    "unarchive", "cloud", "exec-server", "features", "help",
})  # fmt: skip


# The settings the producer needs (issue 18): Codex's config keys.
COMPACTION_KEYS: Final = ("model_auto_compact_token_limit", "model_context_window")


def seat_account(plan: LaunchPlan) -> Account | None:
    """The account `$CODEX_HOME/auth.json` states (issue 29): its workspace with its ChatGPT user;
    None for an API key or a provider's key, which state none."""
    home = _codex_home(plan)
    data = read_account_file(os.path.join(home, "auth.json"))
    return None if data is None else codex_account(data, shown_dir(home))


def prepare(plan: LaunchPlan) -> LaunchPlan:
    prepared = _prepare(plan)
    return prepared if prepared.transport is None else dataclasses.replace(prepared, account=seat_account(plan))


def _prepare(plan: LaunchPlan) -> LaunchPlan:
    settings = compaction_settings(plan)
    at = _app_server_index(plan.argv)
    if at is None:
        return _follow_rollout(plan, settings)
    listen = _listen_option(plan.argv, at + 1)
    channel = CodexTransport(ChannelOnly(auto_compact_token_limit=settings.auto_compact_token_limit,
                                         model_context_window=settings.model_context_window))  # fmt: skip
    if listen is None:
        return dataclasses.replace(plan, tap_stdout=True, transport=channel)
    index, inline, url = listen
    if url.startswith("stdio://"):
        return dataclasses.replace(plan, tap_stdout=True, transport=channel)
    if not url.startswith("ws://"):
        return plan  # a listener hctx cannot read (unix://, off): no transport
    upstream = f"ws://{LOOPBACK}:{free_loopback_port()}"
    argv = list(plan.argv)
    if inline:
        argv[index] = f"--listen={upstream}"
    else:
        argv[index + 1] = upstream
    relay = CodexTransport(Relay(listen=url, upstream=upstream,
                                 auto_compact_token_limit=settings.auto_compact_token_limit,
                                 model_context_window=settings.model_context_window))  # fmt: skip
    return dataclasses.replace(plan, argv=tuple(argv), transport=relay)


def _codex_home(plan: LaunchPlan) -> str:
    return plan.env.get("CODEX_HOME") or os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")


def compaction_settings(plan: LaunchPlan) -> CompactionConfig:
    """The compaction settings Codex will load; a key no layer sets, or sets to anything but a
    positive integer, is None."""
    # The user's own file, so a symlink (a dotfiles manager's) is followed; a FIFO or a huge file
    # there must not hang or flood the launch, so it is read bounded and as a regular file only.
    raw = read_bounded(None, Path(_codex_home(plan)) / "config.toml", MAX_CONFIG_BYTES, follow=True)
    try:
        config: dict[str, Any] = tomllib.loads(raw.data.decode()) if raw.data is not None else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        config = {}
    overrides: dict[str, Any] = {}
    profile = config.get("profile")
    words = plan.argv
    for index, word in enumerate(words[:-1]):
        if word in ("-p", "--profile"):
            profile = words[index + 1]
        elif word in ("-c", "--config"):
            name, _, text = words[index + 1].partition("=")
            if name.strip() in COMPACTION_KEYS:
                try:
                    overrides[name.strip()] = tomllib.loads(f"v = {text}")["v"]
                except tomllib.TOMLDecodeError:
                    overrides[name.strip()] = text
    profiles = config.get("profiles")
    chosen = profiles.get(profile) if isinstance(profiles, dict) and isinstance(profile, str) else None
    layers = [overrides, chosen if isinstance(chosen, dict) else {}, config]
    found: dict[str, int | None] = {}
    for key in COMPACTION_KEYS:
        value = next((layer[key] for layer in layers if key in layer), None)
        found[key] = value if type(value) is int and value > 0 else None
    return CompactionConfig(auto_compact_token_limit=found["model_auto_compact_token_limit"],
                            model_context_window=found["model_context_window"])  # fmt: skip


def _follow_rollout(plan: LaunchPlan, settings: CompactionConfig) -> LaunchPlan:
    program = program_index(plan.argv, "codex")
    index = None if program is None else _subcommand(plan.argv, program + 1, _TOP_VALUED_OPTIONS)
    if program is None or (index is not None and plan.argv[index] in _SESSIONLESS_SUBCOMMANDS):
        return plan  # no session, nothing to read: no transport
    rollout = Rollout(
        codex_home=_codex_home(plan),
        cwd=os.fspath(plan.cwd),
        started_at_ms=time.time_ns() // 1_000_000,
        # The wrapper (this process) is the harness's parent: the rollout its descendants hold open
        # is this seat's, whichever other seat in the same directory started later.
        root_pid=os.getpid(),
        auto_compact_token_limit=settings.auto_compact_token_limit,
        model_context_window=settings.model_context_window,
    )
    return dataclasses.replace(plan, transport=CodexTransport(rollout))


def adopted(pid: int, cwd: Path, hints: Mapping[str, str]) -> LaunchPlan:
    """The plan of a session codex process `pid` runs, which hctx did not launch: nothing to spawn
    (`argv` empty), its rollout followed as a wrapped interactive seat's is.

    The rollout is the one `pid` itself holds open for writing (`root_pid`: the codex process, where
    a wrapped seat names the wrapper above it), the launch instant is the process's start, so a
    resumed session's older rollout is followed from its end as a wrapped `codex resume` is. The
    compaction settings come from `pid`'s own `-c`/`--profile` and the CODEX_HOME in its
    environment, the account from that CODEX_HOME's auth.json. `hints` (the hook's `rollout`,
    `session`) are not needed to find the file: the process holding it is exact.
    """
    del hints
    argv = tuple(proc_words(pid, "cmdline"))
    environ = dict(word.partition("=")[::2] for word in proc_words(pid, "environ"))
    env = {"CODEX_HOME": environ["CODEX_HOME"]} if environ.get("CODEX_HOME") else {}
    plan = LaunchPlan(harness="codex", argv=argv, cwd=cwd, env=env)
    settings = compaction_settings(plan)
    rollout = Rollout(
        codex_home=_codex_home(plan),
        cwd=os.fspath(cwd),
        started_at_ms=_started_at_ms(pid),
        root_pid=pid,
        auto_compact_token_limit=settings.auto_compact_token_limit,
        model_context_window=settings.model_context_window,
    )
    return dataclasses.replace(plan, argv=(), env={}, transport=CodexTransport(rollout), account=seat_account(plan))


def _started_at_ms(pid: int) -> int:
    """When process `pid` started (its clock ticks since boot, and the boot time); now when unknown."""
    stat = proc_stat(pid)
    boot = next((line.split()[1] for line in _proc_lines("/proc/stat") if line.startswith(b"btime ")), None)
    if stat is None or boot is None:
        return time.time_ns() // 1_000_000
    return int(boot) * 1000 + stat.started * 1000 // os.sysconf("SC_CLK_TCK")


def _proc_lines(path: str) -> list[bytes]:
    raw = read_bounded(None, path, MAX_CONFIG_BYTES)
    return [] if raw.data is None else raw.data.splitlines()


def _app_server_index(argv: tuple[str, ...]) -> int | None:
    """Where `app-server` is the subcommand that runs a server (not `app-server generate-ts` ...).

    The program may be `codex`, `codex.js` behind `node`, or `npx codex`: the subcommand is read
    after the first word naming codex, or searched for when no word does.
    """
    program = program_index(argv, "codex")
    if program is not None:
        index = _subcommand(argv, program + 1, _TOP_VALUED_OPTIONS)
    else:
        index = next((i for i, word in enumerate(argv) if i and word == APP_SERVER), None)
    if index is None or argv[index] != APP_SERVER:
        return None
    return index if _subcommand(argv, index + 1, _VALUED_OPTIONS) is None else None


def _subcommand(argv: tuple[str, ...], start: int, valued: frozenset[str]) -> int | None:
    index = start
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return None  # what follows is a prompt, never a subcommand
        if not word.startswith("-"):
            return index
        index += 2 if word in valued else 1
    return None


def _listen_option(argv: tuple[str, ...], start: int) -> tuple[int, bool, str] | None:
    """(index, written as `--listen=URL`, URL) of the last `--listen` (clap keeps the last)."""
    found: tuple[int, bool, str] | None = None
    index = start
    while index < len(argv):
        word = argv[index]
        if word == "--stdio":
            found = None
        elif word == "--listen" and index + 1 < len(argv):
            found = (index, False, argv[index + 1])
        elif word.startswith("--listen="):
            found = (index, True, word.removeprefix("--listen="))
        index += 2 if word in _VALUED_OPTIONS else 1
    return found
