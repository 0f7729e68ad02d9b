"""Catalogs on disk for the reader tests: records and claims written as raw bytes, hostile or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from guard_factory import wire

from tests.conftest import REPO

HOST = "box"
# The spec's Exposure example: observed at 1788000100000 and read 4210 ms later.
NOW = 1_788_000_104_210
MINUTE = 60_000
HOUR = 60 * MINUTE


def agent_path(catalog: Path, identity: str, host: str = HOST) -> Path:
    path = catalog / "agents" / host / identity
    path.mkdir(parents=True, exist_ok=True)
    return path


def put_record(catalog: Path, identity: str, host: str = HOST, raw: bytes | None = None, **fields: Any) -> Path:
    """The record file: `raw` verbatim, or the spec example with camelCase `fields` overridden."""
    path = agent_path(catalog, identity, host) / "harness-context"
    if raw is None:
        raw = (json.dumps({**wire(agent=identity), **fields}) + "\n").encode()
    path.write_bytes(raw)
    return path


def claim(identity: str, host: str = HOST, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema": "st2.harness-state.v1",
        "agent": identity,
        "host": host,
        "harness": "codex",
        "incarnation": "inc-7f3a",
        "claimedAtMs": NOW - 10 * MINUTE,
        "wrapperPid": 999_999_999,
        "desiredState": "stopped",
        "history": [],
    }
    base.update(fields)
    return base


def put_claim(catalog: Path, identity: str, host: str = HOST, raw: bytes | None = None, **fields: Any) -> Path:
    path = agent_path(catalog, identity, host) / "harness-state"
    path.write_bytes((json.dumps(claim(identity, host, **fields)) + "\n").encode() if raw is None else raw)
    return path


def hctx(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`hctx` as a whole process, the way a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "wrapper.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO,
        check=False,
    )


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path below `root` with its mode, size and mtime: what a reader must leave unchanged."""
    seen: dict[str, tuple[int, int, int]] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            seen[os.path.relpath(path, root)] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return seen
