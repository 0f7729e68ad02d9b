"""Where the real harness binaries live and how to run them, for the live tests.

The binaries are installed by ``scripts/install_harnesses.sh`` into one npm prefix per harness and version,
``<repo>/.harnesses/<name>-<version>/`` (``HCTX_HARNESSES_DIR`` overrides the root, for the script too).
``HCTX_LIVE_VERSIONS=name=version[,name=version...]`` makes the live tests run those builds of those
harnesses instead of the pinned pair (``scripts/drift_check.py`` runs the newest served builds so).
A prefix counts as installed once its marker file ``.hctx-installed`` exists; the script writes it last,
after the binary answered ``--version``.

pi runs on the npm ``node`` 22 (its engines need node >= 22.19; the system node may be 20) and omp on the
npm ``bun``: :func:`harness_command` starts their ``cli.js`` through that runtime explicitly, and
:func:`harness_env` puts the runtime first on ``PATH`` for the child processes they spawn. The returned
paths are absolute, so the command works from any cwd.

Typical use::

    cmd = require_harness("pi", "0.84.2")   # skips (or fails under CI) when not installed
    env = {**os.environ, **harness_env("pi", "0.84.2")}
    subprocess.run([*cmd, "--mode", "rpc"], env=env, cwd=tmp_path)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = "scripts/install_harnesses.sh"
MARKER = ".hctx-installed"

#: harness name -> (version the design doc measured, newest version installed/captured); the producers'
#: verified sets (``sidecar.registry.verified_versions``, asserted equal in tests/test_versions_and_sessions.py)
PINNED_VERSIONS: dict[str, tuple[str, ...]] = {
    "claude": ("2.1.250", "2.1.332"),
    "codex": ("0.151.0", "0.171.0"),
    "opencode": ("1.18.25", "1.18.33"),
    "pi": ("0.84.2", "1.6.0"),
    "omp": ("18.1.16", "18.2.3"),
}


def live_versions(pinned: dict[str, tuple[str, ...]], override: str) -> dict[str, tuple[str, ...]]:
    """``pinned`` with each harness ``override`` names (``name=version,...``) running that build alone."""
    versions = dict(pinned)
    for entry in filter(None, (part.strip() for part in override.split(","))):
        name, _, version = entry.partition("=")
        if name not in pinned or not version:
            raise ValueError(f"HCTX_LIVE_VERSIONS: {entry!r} is not NAME=VERSION of {', '.join(pinned)}")
        versions[name] = (version,)
    return versions


#: what the live tests run: the pinned builds, or the ones ``HCTX_LIVE_VERSIONS`` names
HARNESS_VERSIONS: dict[str, tuple[str, ...]] = live_versions(PINNED_VERSIONS, os.environ.get("HCTX_LIVE_VERSIONS", ""))

#: every (name, version) pair the install script provides, e.g. for ``pytest.mark.parametrize``
ALL_HARNESSES: tuple[tuple[str, str], ...] = tuple(
    (name, version) for name, versions in HARNESS_VERSIONS.items() for version in versions
)

# harness name -> (npm package, bin name)
_PACKAGES: dict[str, tuple[str, str]] = {
    "claude": ("@anthropic-ai/claude-code", "claude"),
    "codex": ("@openai/codex", "codex"),
    "opencode": ("opencode-ai", "opencode"),
    "pi": ("@earendil-works/pi-coding-agent", "pi"),
    "omp": ("@oh-my-pi/pi-coding-agent", "omp"),
}

# harness name -> (runtime prefix id, runtime bin name); the runtimes are npm packages too
_RUNTIMES: dict[str, tuple[str, str]] = {
    "pi": ("node-22.23.3", "node"),
    "omp": ("bun-1.4.5", "bun"),
}


def harnesses_dir() -> Path:
    """The install root: ``$HCTX_HARNESSES_DIR`` or ``<repo>/.harnesses``."""
    override = os.environ.get("HCTX_HARNESSES_DIR")
    return Path(override) if override else REPO_ROOT / ".harnesses"


def harness_prefix(name: str, version: str) -> Path:
    """The npm prefix of one harness version (whether or not it is installed)."""
    _check_name(name)
    return harnesses_dir() / f"{name}-{version}"


def _check_name(name: str) -> None:
    if name not in _PACKAGES:
        raise ValueError(f"unknown harness {name!r}; known: {', '.join(_PACKAGES)}")


def _bin(prefix: Path, bin_name: str) -> Path:
    """``node_modules/.bin/<bin_name>`` resolved to the file it links to (unresolved if absent)."""
    link = prefix / "node_modules" / ".bin" / bin_name
    return link.resolve() if link.exists() else link


def _runtime_bin_dir(name: str) -> Path | None:
    runtime = _RUNTIMES.get(name)
    if runtime is None:
        return None
    return harnesses_dir() / runtime[0] / "node_modules" / ".bin"


def harness_command(name: str, version: str) -> list[str]:
    """The argv prefix that runs ``name`` at ``version``; append the harness's own arguments.

    claude/opencode: the native binary the package's postinstall put in place; codex: its bin script
    (``#!/usr/bin/env node``, fine on the system node); pi: ``[<npm node 22>, <pi cli.js>]``;
    omp: ``[<npm bun>, <omp cli.js>]``. Pair it with :func:`harness_env`.
    """
    _check_name(name)
    command = [str(_bin(harness_prefix(name, version), _PACKAGES[name][1]))]
    runtime = _RUNTIMES.get(name)
    if runtime is not None:
        command.insert(0, str(_bin(harnesses_dir() / runtime[0], runtime[1])))
    return command


def harness_env(name: str, version: str) -> dict[str, str]:
    """Environment entries to add (``{**os.environ, **harness_env(...)}``) when running the harness.

    For pi and omp, ``PATH`` with the npm runtime's bin directory first (followed by the current ``PATH``),
    so processes they spawn find node 22 / bun too. Empty for the others.
    """
    _check_name(name)
    bin_dir = _runtime_bin_dir(name)
    if bin_dir is None:
        return {}
    current = os.environ.get("PATH", os.defpath)
    return {"PATH": f"{bin_dir}{os.pathsep}{current}" if current else str(bin_dir)}


def harness_missing(name: str, version: str) -> str | None:
    """Why the harness can't run, or None when it is installed (marker present and files in place)."""
    _check_name(name)
    prefix = harness_prefix(name, version)
    if not (prefix / MARKER).is_file():
        return f"{name} {version} is not installed (no {prefix / MARKER})"
    runtime = _RUNTIMES.get(name)
    if runtime is not None and not (harnesses_dir() / runtime[0] / MARKER).is_file():
        return f"{name} {version} needs the runtime {runtime[0]}, which is not installed"
    for part in harness_command(name, version):
        if not os.access(part, os.F_OK):
            return f"{name} {version}: {part} is missing"
    return None


def require_harness(name: str, version: str) -> list[str]:
    """:func:`harness_command` if the harness is installed; otherwise skip the test, or fail it under CI.

    ``CI`` set to a non-empty value turns the skip into ``pytest.fail``, so a CI job can't go green by
    skipping every live test.
    """
    reason = harness_missing(name, version)
    if reason is None:
        return harness_command(name, version)
    _not_installed(name, reason)


def _not_installed(name: str, reason: str) -> NoReturn:
    hint = f"run {INSTALL_SCRIPT} --only {name} (installs from the npm registry)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI requires the real harnesses: {hint}", pytrace=False)
    pytest.skip(f"{reason}; {hint}")


def require_opencode_plugin_sdk(version: str) -> Path:
    """``<opencode prefix>/plugin-sdk``: what OpenCode ``version`` installs into its config directory at
    every start (``package.json``, ``package-lock.json``, ``node_modules/`` of ``@opencode-ai/plugin`` at
    its version), fetched once by the install script; missing, it skips the test (fails it under CI).

    Copied into an isolated config dir it keeps OpenCode off the npm registry (see the install script's
    step and tests/live/test_opencode_offline_live.py).
    """
    sdk = harness_prefix("opencode", version) / "plugin-sdk"
    if not (sdk / MARKER).is_file():
        _not_installed("opencode", f"opencode {version}: its plugin SDK is not installed (no {sdk / MARKER})")
    return sdk
