"""OpenCode's user-level extension point for `hctx setup` (issue 36): one plugin file of hctx's own.

OpenCode loads every `{plugin,plugins}/*.{ts,js}` in its config directories, the user-level one
being `$XDG_CONFIG_HOME/opencode` (else `~/.config/opencode`), so setup places `plugin/hctx-adopt.ts`
there: the shipped asset (`hctx-adopt.ts`, package data beside this module) with the adopting
command (`sidecar.setup_plan.adopt_command`) written in. The user's `opencode.json`, its `plugin`
list and their own plugin files are never opened. A file of that name that hctx did not write is
refused, and `--undo` deletes the file (a file the user has since replaced is left as it is).

Measured on 1.18.25 and 1.18.33 (2026-12-05, isolated HOME/XDG dirs, the fake provider on
127.0.0.1; `opencode run`, the TUI on a pseudo-terminal and `opencode serve`): a plugin file in
`~/.config/opencode/plugin/` is loaded by all three (the TUI loads it in its worker thread), its
`process.pid` is the harness's own process (the TUI's and `run`'s, no child), `directory` is the
instance's directory, and `serverUrl` is `http://localhost:4096/`, a constant fallback, wherever
the server does not listen, which the plain TUI and `opencode run` never do; hence the plugin's own
event bridge (see the asset's header).

OpenCode itself, at every start, plugin or not, installs its `@opencode-ai/plugin` (at its own
version) into each config directory from the npm registry (its Npm.install: npm's Arborist inside
the binary, reading npm's config: `npm_config_*`, `~/.npmrc`, the directory's `.npmrc`), unless the
directory has a `node_modules/` and a `package-lock.json` whose root lists each `package.json`
dependency and that package, by name only. With a plugin file there it waits for that install
before loading any plugin: with the registry unreachable, 74 s a start (1.18.33; 78 s on 1.18.25)
instead of 2-4 s; with the SDK in place (one online install, or `npm install --prefix <dir>
--save-exact --ignore-scripts @opencode-ai/plugin@<version>`) no request and no wait; with
`offline=true` in the directory's `.npmrc` the install fails at once. hctx's plugin imports
nothing from the SDK; setup leaves all of this to OpenCode and the user (docs/setup.md), and
`--undo` leaves what OpenCode wrote (tests/live/test_opencode_offline_live.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path, PurePosixPath
from typing import Final

from sidecar.setup_plan import BuildPoint, HarnessSetup, OwnedFile, UserFile, adopt_command

__all__ = [
    "ASSET_NAME",
    "BUILDS",
    "COMMAND_LINE",
    "HOW",
    "MARK",
    "PLUGIN_FILE",
    "SDK_LOCK",
    "SDK_PACKAGE",
    "config_dir",
    "plugin_source",
    "sdk_advice",
    "setup",
]

ASSET_NAME: Final = "hctx-adopt.ts"
PLUGIN_FILE: Final = PurePosixPath("plugin") / ASSET_NAME
# What OpenCode's install of its plugin SDK leaves in a config directory (the module's doc).
SDK_LOCK: Final = "package-lock.json"
SDK_PACKAGE: Final = "node_modules/@opencode-ai/plugin"
# The asset's one line setup replaces: the adopting command, as a JSON array (a TypeScript literal).
COMMAND_LINE: Final = "const ADOPT_COMMAND: string[] = []; // hctx: adopt command"
# What every file hctx writes starts with, and what tells one from a user's file of the same name.
MARK: Final = b"// hctx-adopt.ts: the OpenCode plugin `hctx setup` places"
HOW: Final = "user plugin file ~/.config/opencode/plugin/hctx-adopt.ts (OpenCode loads {plugin,plugins}/*.{ts,js})"
BUILDS: Final = (BuildPoint("1.18.25", True, HOW), BuildPoint("1.18.33", True, HOW))


def plugin_source(command: list[str]) -> bytes:
    """The plugin as setup writes it: the shipped asset with `command` in its command line."""
    asset = files(__package__ or __name__).joinpath(ASSET_NAME).read_text(encoding="utf-8")
    if asset.count(COMMAND_LINE) != 1:
        raise RuntimeError(f"{ASSET_NAME}: the command line to fill is not there exactly once")
    filled = f"const ADOPT_COMMAND: string[] = {json.dumps(command)}; // hctx: adopt command"
    return asset.replace(COMMAND_LINE, filled).encode()


def config_dir(home: Path, environ: Mapping[str, str]) -> Path:
    """OpenCode's user-level config dir, as it computes it (xdg-basedir: an empty variable is unset)."""
    base = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    return Path(base) / "opencode"


def setup(home: Path, environ: Mapping[str, str]) -> HarnessSetup:
    root = config_dir(home, environ)
    installed = root.is_dir() or any(
        shutil.which(program, path=environ.get("PATH", os.defpath)) for program in ("opencode", "opencode-ai")
    )
    edit = OwnedFile(UserFile(root, PLUGIN_FILE), plugin_source(adopt_command("opencode")), MARK, "plugin")
    return HarnessSetup(harness="opencode", installed=installed, edits=(edit,), builds=BUILDS, advice=sdk_advice(root))


def sdk_advice(root: Path) -> tuple[str, ...]:
    """The stall a plugin file brings about while OpenCode's own plugin SDK is not installed in `root`
    (the module's doc): said by `hctx doctor` while setup is in place; nothing once it is there."""
    if (root / SDK_LOCK).is_file() and (root / SDK_PACKAGE).is_dir():
        return ()
    return (
        f"OpenCode has not installed its plugin SDK in {root} yet, and with a plugin there each start "
        "waits for that npm install (74 s a start where the registry cannot be reached): install it "
        "once, or set offline=true in its .npmrc (docs/setup.md, OpenCode)",
    )
