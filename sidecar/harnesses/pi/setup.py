"""pi and omp: `hctx setup` places one small loader in the user's own extension directory.

Measured 2026-12-05 on the pinned builds (isolated HOME, no PI_CODING_AGENT_DIR, fake model on
127.0.0.1, `-p`; a probe extension recording its process and loads):

- pi 0.84.2 and 1.6.0 load every `*.ts`/`*.js` in `<agent dir>/extensions/` for every session
  (`~/.pi/agent`, or $PI_CODING_AGENT_DIR with `~` expanded: pi's `getAgentDir`); the factory runs
  once per process, in the harness's own process (`process.pid` is node running pi's cli.js; its
  parent is whatever started pi). Unless that directory itself holds `index.ts`, `index.js` or a
  `package.json`: pi then loads only what those name (package-manager.js
  `collectAutoExtensionEntries`), and the loader would be ignored, so setup refuses with that reason.
- omp 18.1.16 and 18.2.3 load every `*.ts`/`*.js` in `<agent dir>/extensions/` the same way
  (`~/.omp/agent`, `~/.omp/profiles/<OMP_PROFILE or PI_PROFILE>/agent`, else $PI_CODING_AGENT_DIR;
  `~/.omp` is $PI_CONFIG_DIR when set: pi-utils dirs.ts), once per process, in bun's process.
- Both await an async factory, so the loader can import hctx's extension dynamically and a failed
  import stays inside it.

The loader (`hctx-adopt.ts`) imports the extension hctx ships (`hctx-channel.ts`, beside this module)
by absolute path and calls its `adopt`, with the adopting command for each harness
(`adopt_command`). It is a loader, not a copy: an upgrade of hctx in place (the same interpreter and
site-packages) is live in the next session with no new `hctx setup`, so the extension and the
sidecar reading its frames are always the same build. A copy would keep sending the old build's
frames to the new sidecar until setup ran again. Where hctx moved or was removed, the import fails
inside the loader and the session runs untouched; `hctx doctor` then finds the file not current
(it differs from what setup writes now). The loader is the same text for pi and omp (the extension
tells which host it runs in), so one agent directory shared by both ($PI_CODING_AGENT_DIR) holds one
file that serves both.

A session under `hctx wrap` loads the extension twice (`--extension`, and through the loader):
`adopt` does nothing where $HCTX_CHANNEL is set, so the wrapped seat reports once.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Literal

from sidecar.harnesses.pi.launch import channel_extension
from sidecar.setup_plan import BuildPoint, HarnessSetup, OwnedFile, UserFile, adopt_command

__all__ = [
    "HOSTS",
    "LOADER",
    "LOADER_MARK",
    "Host",
    "agent_dir",
    "loader_source",
    "setup",
    "setup_for",
]

Host = Literal["pi", "omp"]
HOSTS: tuple[Host, ...] = ("pi", "omp")  # the harnesses this package serves

LOADER = PurePosixPath("extensions/hctx-adopt.ts")
# The first line of every loader setup writes: how a later setup (or --undo) knows the file is hctx's.
LOADER_MARK = b"// hctx-adopt: written by `hctx setup`"

# What each pinned build offers (measured as the module's docstring says).
_POINTS: dict[Host, tuple[tuple[str, str], ...]] = {
    "pi": (
        ("0.84.2", "user extension <agent dir>/extensions/hctx-adopt.ts, loaded by every session"),
        ("1.6.0", "user extension <agent dir>/extensions/hctx-adopt.ts, loaded by every session"),
    ),
    "omp": (
        ("18.1.16", "user extension <agent dir>/extensions/hctx-adopt.ts, loaded by every session"),
        ("18.2.3", "user extension <agent dir>/extensions/hctx-adopt.ts, loaded by every session"),
    ),
}
_CONFIG_DIR: dict[Host, str] = {"pi": ".pi", "omp": ".omp"}
# A pi extensions directory holding one of these is a package: pi loads only what it names.
_PI_PACKAGE_ENTRIES = ("index.ts", "index.js", "package.json")


def _expand(value: str, home: Path) -> Path:
    if value == "~" or value.startswith("~/"):
        return home / value[2:]
    return Path(value)


def agent_dir(host: Host, home: Path, environ: Mapping[str, str]) -> Path:
    """Where the harness reads its user configuration and extensions, as its own `getAgentDir` does."""
    override = environ.get("PI_CODING_AGENT_DIR", "")
    if host == "pi":
        return _expand(override, home) if override else home / _CONFIG_DIR["pi"] / "agent"
    root = home / (environ.get("PI_CONFIG_DIR") or _CONFIG_DIR["omp"])
    profile = (environ.get("OMP_PROFILE") if "OMP_PROFILE" in environ else environ.get("PI_PROFILE", "")) or ""
    profile = profile.strip()
    if profile and profile != "default":
        return root / "profiles" / profile / "agent"
    return Path(os.path.abspath(override)) if override else root / "agent"


def loader_source(asset: Path, commands: Mapping[str, list[str]]) -> bytes:
    """The loader's text: the extension's absolute path and each harness's adopting command, as
    JSON (a valid TypeScript literal)."""
    lines = [
        LOADER_MARK.decode() + " (`hctx setup --undo` removes it).",
        "// A pi or omp session started without `hctx wrap` is adopted by hctx: this loads hctx's own",
        "// extension from where hctx is installed and lets it start the adopting wrapper for this",
        "// process. If hctx is no longer there, it does nothing and the session runs as without it.",
        f"const EXTENSION = {json.dumps(str(asset))};",
        f"const ADOPT: Record<string, string[]> = {json.dumps(dict(commands))};",
        "",
        "export default async function hctxAdopt(pi: any): Promise<void> {",
        "\ttry {",
        "\t\tconst extension: any = await import(EXTENSION);",
        '\t\tif (typeof extension.adopt === "function") extension.adopt(pi, ADOPT);',
        "\t} catch {",
        "\t\t// hctx moved or was removed: nothing to adopt with",
        "\t}",
        "}",
        "",
    ]
    return "\n".join(lines).encode()


def _blocked(host: Host, extensions: Path) -> str | None:
    if host != "pi":
        return None
    for name in _PI_PACKAGE_ENTRIES:
        if (extensions / name).exists():
            return (
                f"{extensions / name} makes {extensions} one package: pi loads only what it names, "
                f"so a file hctx placed beside it would never load; not set up for pi"
            )
    return None


def _installed(host: Host, root: Path, environ: Mapping[str, str]) -> bool:
    return root.is_dir() or shutil.which(host, path=environ.get("PATH", os.defpath)) is not None


def setup_for(host: Host, home: Path, environ: Mapping[str, str]) -> HarnessSetup:
    root = agent_dir(host, home, environ)
    source = loader_source(channel_extension(), {name: adopt_command(name) for name in HOSTS})
    # Blocked where it would not load (a pi extensions dir that is a package).
    loader = OwnedFile(UserFile(root, LOADER), source, LOADER_MARK, "loader", _blocked(host, root / LOADER.parent))
    builds = tuple(BuildPoint(build, True, how) for build, how in _POINTS[host])
    return HarnessSetup(host, _installed(host, root, environ), (loader,), builds)


def setup(home: Path, environ: Mapping[str, str]) -> HarnessSetup:
    """pi's setup (`setup_for("omp", …)` is omp's: both harnesses' specs share this package)."""
    return setup_for("pi", home, environ)
