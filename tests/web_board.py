"""`hctx web` as a user starts it, and Debian's Chromium as a user opens it, for the board's tests.

The server is the real command in a process of its own (`--listen 127.0.0.1:0`), its URL read from
its first stdout line; it is stopped with SIGTERM (then SIGKILL) by the test that started it. The
browser is /usr/bin/chromium driven by Playwright (its own browser download is not reachable here),
headless and kept off the network.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def require_chromium() -> None:
    """Skipped on a machine without it; failed in CI, where scripts/install_system_deps.sh put it."""
    if not CHROMIUM.is_file():
        message = f"{CHROMIUM} missing: scripts/install_system_deps.sh installs Debian's chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class Served:
    process: subprocess.Popen[str]
    url: str

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url.rstrip("/") + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as refused:
            return refused.code, dict(refused.headers), refused.read()

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (status, body[:300])
        return json.loads(body)

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def web_argv(catalog: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "wrapper.cli", "web", "--catalog", str(catalog), "--host", "box", *extra]


def web_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def first_line(process: subprocess.Popen[str], timeout: float = 90) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            return process.stdout.readline()
        if process.poll() is not None:
            break
    stderr = process.stderr.read() if process.stderr is not None and process.poll() is not None else ""
    raise AssertionError(f"hctx web printed no URL (exit {process.poll()}): {stderr}")


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


@contextmanager
def serving(catalog: Path, *extra: str) -> Iterator[Served]:
    process = subprocess.Popen(
        web_argv(catalog, "--listen", "127.0.0.1:0", *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=web_env(), cwd=REPO,
    )  # fmt: skip
    try:
        url = first_line(process).strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/"), url
        yield Served(process, url)
    finally:
        stop(process)


def replace_file(path: Path, data: bytes) -> None:
    """As the store writes a record: staged beside nothing the reader reads, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.staged")
    staged.write_bytes(data)
    os.replace(staged, path)


@contextmanager
def driver() -> Iterator[Any]:
    """Playwright, once per module: one driver can launch several browsers, a second cannot start."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


@contextmanager
def browser(playwright: Any, *extra_args: str) -> Iterator[Any]:
    """A headless Debian Chromium; closed on the way out."""
    launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *extra_args])
    try:
        yield launched
    finally:
        launched.close()


# ---------------------------------------------------------------------------------------------
# Catalogs

HERE = "box"
REPLICA = "replica"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def record_bytes(identity: str, **fields: Any) -> bytes:
    from guard_factory import wire

    stamp = fields.pop("observedAtMs", now_ms() - 5_000)
    body = wire(agent=identity, observedAtMs=stamp, writtenAtMs=stamp, lastCompactionMs=stamp - 60_000)
    return (json.dumps({**body, **fields}) + "\n").encode()


def put(catalog: Path, identity: str, host: str = HERE, *, raw: bytes | None = None, **fields: Any) -> Path:
    path = catalog / "agents" / host / identity / "harness-context"
    replace_file(path, record_bytes(identity, **fields) if raw is None else raw)
    return path


def put_claim(catalog: Path, identity: str, host: str = HERE, **fields: Any) -> Path:
    stamp = now_ms()
    claim = {
        "schema": "st2.harness-state.v1", "agent": identity, "host": host, "harness": "codex",
        "incarnation": "inc-7f3a", "claimedAtMs": stamp - 600_000, "wrapperPid": 999_999_999,
        "desiredState": "stopped", "history": [], **fields,
    }  # fmt: skip
    path = catalog / "agents" / host / identity / "harness-state"
    replace_file(path, (json.dumps(claim) + "\n").encode())
    return path


def fleet(catalog: Path) -> None:
    """Each case the fleet page words differently, on this host and on a replicated one."""
    put(catalog, "amber", usedTokens=170_000, windowTokens=200_000, usedPercent=85.0, compactAtTokens=182_000,
        compactions=1, costUsd=1.35, model="gpt-5.1-codex", rateLimits={"fiveHour": 31.0, "sevenDay": 55.0},
        observedAtMs=now_ms() - 3_000)  # fmt: skip
    put_claim(catalog, "amber", wrapperPid=os.getpid(), desiredState="running")
    put(catalog, "red", usedTokens=192_000, windowTokens=200_000, usedPercent=96.0, rateLimits=None, compactions=0)
    put(catalog, "calm", usedTokens=66_000, windowTokens=200_000, usedPercent=33.0, rateLimits=None, compactions=0)
    put(catalog, "withheld", harness="claude", usedTokens=None, windowTokens=200_000, usedPercent=None,
        rateLimits=None, compactions=0, model="claude-opus-4-5")  # fmt: skip
    put(catalog, "stale", usedPercent=41.0, rateLimits=None, observedAtMs=now_ms() - 2 * 3_600_000)
    put(catalog, "broken", raw=b'{"schema": "st2.harness-context.v1", "usedTok')
    put(catalog, "far", REPLICA, usedPercent=12.0, rateLimits={"fiveHour": 70.0, "sevenDay": 20.0},
        observedAtMs=now_ms() - 60_000)  # fmt: skip


def many(catalog: Path, agents: int, hosts: tuple[str, ...] = ("alpha", "bravo", "charlie", "delta")) -> list[Path]:
    """`agents` codex records over four hosts, each with its claim."""
    paths = []
    for index in range(agents):
        host, identity = hosts[index % len(hosts)], f"agent-{index:05d}"
        paths.append(put(catalog, identity, host, usedTokens=1000 + index, usedPercent=float(index % 100)))
        put_claim(catalog, identity, host)
    return paths
