"""Codex: tap the app-server's server→client JSON-RPC stream, on stdio or on a websocket listener.

- `codex app-server` (stdio, the default): the wrapper copies the harness's stdout byte for byte to
  its own and hands the sidecar each line (`tap_stdout`). The client's stdin goes straight through.
- `codex app-server --listen ws://IP:PORT`: the harness is moved to a free private loopback port and
  the sidecar's relay listens where the client asked, forwarding every connection to the harness
  (`sidecar.transports.codex`).

Anything else (the interactive TUI, `app-server generate-ts`, a `unix://` listener) has no stream
this project can read, so it launches unchanged and publishes no record.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Final

from wrapper.harnesses import LaunchPlan

FRAME_TYPE: Final = "codex.rpc"
APP_SERVER: Final = "app-server"
LOOPBACK: Final = "127.0.0.1"

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


def prepare(plan: LaunchPlan) -> LaunchPlan:
    at = _app_server_index(plan.argv)
    if at is None:
        return plan
    listen = _listen_option(plan.argv, at + 1)
    if listen is None:
        return dataclasses.replace(plan, tap_stdout=FRAME_TYPE)
    index, inline, url = listen
    if url.startswith("stdio://"):
        return dataclasses.replace(plan, tap_stdout=FRAME_TYPE)
    if not url.startswith("ws://"):
        return plan
    upstream = f"ws://{LOOPBACK}:{free_loopback_port()}"
    argv = list(plan.argv)
    if inline:
        argv[index] = f"--listen={upstream}"
    else:
        argv[index + 1] = upstream
    transport = {**plan.transport, "listen": url, "upstream": upstream}
    return dataclasses.replace(plan, argv=tuple(argv), transport=transport)


def free_loopback_port() -> int:
    """A port the kernel just handed out on loopback; the harness binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def _app_server_index(argv: tuple[str, ...]) -> int | None:
    """Where `app-server` is the subcommand that runs a server (not `app-server generate-ts` ...).

    Searched rather than expected at argv[1], so `npx codex app-server` and `node codex.js
    app-server` are recognised too.
    """
    for index, word in enumerate(argv[1:], start=1):
        if word == APP_SERVER and argv[index - 1] not in _TOP_VALUED_OPTIONS:
            return index if _subcommand(argv, index + 1, _VALUED_OPTIONS) is None else None
    return None


def _subcommand(argv: tuple[str, ...], start: int, valued: frozenset[str]) -> int | None:
    index = start
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return None
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
