"""OpenCode: make the server (`opencode serve`, `web`, or the TUI's own) listen where the sidecar knows.

OpenCode's default `--port` is 0, a random port nobody outside learns, so when the user gave none
(or 0) a free loopback port is chosen here and `--port P --hostname 127.0.0.1` are injected. A port
the user did give is kept, and so is their hostname; the sidecar connects to loopback unless that
hostname names another interface. `plan.transport` gets `base_url` (and `directory` when the TUI was
started on a project path, since `/event` follows one directory's instance).

A session `hctx setup`'s plugin adopts (issue 36) has nothing to spawn: `adopted` builds the same
transport from the plugin's hints, `url` (the plugin's loopback event bridge, `hctx-adopt.ts`) and
`directory` (its instance), and refuses any URL that is not plain http to 127.0.0.1 or ::1.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from sidecar.harnesses.opencode.producer import OpenCodeTransport
from sidecar.launching import LOOPBACK, LaunchPlan, free_loopback_port, program_index
from sidecar.spec import ConfigError

__all__ = [
    "ANY_INTERFACE",
    "OTHER_COMMANDS",
    "SERVER_COMMANDS",
    "VALUE_OPTIONS",
    "adopted",
    "prepare",
]

# Subcommands that run the HTTP server and take --port/--hostname; no subcommand is the TUI.
SERVER_COMMANDS: Final = frozenset({"serve", "web"})
OTHER_COMMANDS: Final = frozenset({
    "completion", "acp", "mcp", "attach", "run", "debug", "providers", "auth", "agent", "upgrade",
    "uninstall", "models", "stats", "export", "import", "github", "pr", "session", "plugin", "plug", "db",
})  # fmt: skip
# Options of the TUI / serve that take a value, so their value is not mistaken for a positional.
VALUE_OPTIONS: Final = frozenset({
    "--port", "--hostname", "--log-level", "--mdns-domain", "--cors", "-m", "--model", "-s",
    "--session", "--prompt", "--agent", "--replay-limit",
})  # fmt: skip
ANY_INTERFACE: Final = frozenset({"0.0.0.0", "::", "", "localhost"})


@dataclasses.dataclass(frozen=True)
class _Args:
    command: str | None  # "serve", "web", another subcommand, or None for the TUI
    project: str | None
    port: int | None
    hostname: str | None
    end: int  # where injected options go: before a literal `--`, else at the end
    port_span: tuple[int, int] | None  # argv[start:stop] of a given --port, replaced when it is 0


def _scan(argv: tuple[str, ...]) -> _Args:
    command: str | None = None
    project: str | None = None
    options: dict[str, str] = {}
    port_span: tuple[int, int] | None = None
    end = len(argv)
    program = program_index(argv, "opencode")
    index = 1 if program is None else program + 1  # `npx opencode-ai serve` reads from `serve`
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            end = index
            break
        name, eq, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            start = index
            if not eq:
                index += 1
                value = argv[index] if index < len(argv) else ""
            options[name] = value
            if name == "--port":
                port_span = (start, index + 1)
        elif not arg.startswith("-"):
            if command is None and project is None and arg in SERVER_COMMANDS | OTHER_COMMANDS:
                command = arg
            elif command is None and project is None:
                project = arg
        index += 1
    port = options.get("--port")
    return _Args(
        command=command,
        project=project,
        port=int(port) if port is not None and port.isdigit() else None,
        hostname=options.get("--hostname"),
        end=end,
        port_span=port_span,
    )


def prepare(plan: LaunchPlan) -> LaunchPlan:
    args = _scan(plan.argv)
    if args.command is not None and args.command not in SERVER_COMMANDS:
        return plan  # no server of its own to follow (run, models, attach, ...)
    argv = list(plan.argv)
    port = args.port
    host = LOOPBACK if args.hostname is None or args.hostname in ANY_INTERFACE else args.hostname
    if not port:
        port = free_loopback_port()
        injected = ["--port", str(port)]
        if args.hostname is None:
            injected += ["--hostname", LOOPBACK]
        if args.port_span is not None:  # `--port 0` (random) or unreadable: ours replaces it
            start, stop = args.port_span
            argv[start:stop] = injected
        else:
            argv[args.end : args.end] = injected
    directory = None
    if args.command is None and args.project is not None:
        directory = str((plan.cwd / Path(args.project)).resolve())
    transport = OpenCodeTransport(base_url=f"http://{_url_host(host)}:{port}", directory=directory)
    return dataclasses.replace(plan, argv=tuple(argv), transport=transport)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def adopted(pid: int, cwd: Path, hints: Mapping[str, str]) -> LaunchPlan:
    """The plan for a session the plugin adopted: nothing to spawn, the bridge's URL to follow.

    Raises ConfigError (its message the sentence to log) for a missing or non-loopback `url` or a
    `directory` that is not an absolute path: hints come from a process, not from hctx."""
    url = hints.get("url")
    if url is None:
        raise ConfigError("the OpenCode plugin gave no url hint")
    directory = hints.get("directory") or None
    if directory is not None and (not os.path.isabs(directory) or "\0" in directory):
        raise ConfigError(f"the OpenCode plugin's directory hint is not an absolute path: {directory[:200]!r}")
    try:
        transport = OpenCodeTransport(base_url=_loopback_url(url), directory=directory)
    except ValidationError:
        raise _not_loopback(url) from None
    return LaunchPlan("opencode", (), cwd, transport=transport)


def _not_loopback(url: str) -> ConfigError:
    return ConfigError(f"the OpenCode plugin's url hint is not http://127.0.0.1:PORT/...: {url[:200]!r}")


def _loopback_url(url: str) -> str:
    """`url` itself when it is http:// to a loopback address by number with a port; else ConfigError."""
    refused = _not_loopback(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        address = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        raise refused from None
    # By number only: a name (even `localhost`) is whatever the resolver says it is.
    if parts.scheme != "http" or port is None or not address.is_loopback or parts.username is not None:
        raise refused
    if parts.query or parts.fragment:
        raise refused
    return url
