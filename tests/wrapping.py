"""Helpers for tests that run `hctx wrap` and the sidecar as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guard.layout import log_path
from scripts.bench_footprint import children as process_children
from scripts.bench_footprint import command
from tests.conftest import REPO

HOST = "testhost"


def children(pid: int) -> set[int]:
    """The children of `pid` past their exec (a fork of the resident holds its descriptors until
    then), and still there."""
    return {
        child for child in process_children(pid) if (line := command(child)) and "wrapper.launch.resident" not in line
    }


def hctx(*args: str) -> list[str]:
    return [sys.executable, "-m", "wrapper.cli", *args]


def wrap_argv(catalog: Path, agent: str, harness: str, *command: str, extra: tuple[str, ...] = ()) -> list[str]:
    return hctx(
        "wrap", "--agent", agent, "--harness", harness, "--catalog", str(catalog), "--host", HOST, *extra,
        "--", *command,
    )  # fmt: skip


def env() -> dict[str, str]:
    """The suite's own environment: its venv's commands (`hctx`, ...) first on PATH, the checkout importable."""
    return os.environ | {"PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def agent_dir(catalog: Path, agent: str) -> Path:
    return catalog / "agents" / HOST / agent


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def log_events(catalog: Path, agent: str, host: str = HOST) -> list[dict[str, Any]]:
    path = log_path(catalog, host, agent)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_lines(catalog: Path, agent: str, host: str = HOST) -> list[dict[str, Any]]:
    """The agent's `write` log lines, oldest first."""
    return [event for event in log_events(catalog, agent, host) if event.get("event") == "write"]


async def writes_once_logged(
    catalog: Path, agent: str, landed: Callable[[dict[str, Any]], bool], what: str, host: str = HOST
) -> list[dict[str, Any]]:
    """The agent's `write` log lines, once one of them is `landed`. The sidecar replaces the record
    before it logs the write that put it there, so a test that saw a record waits for the line (a
    liveness bound, as `wait_for`'s)."""
    import trio

    with trio.move_on_after(30):
        while True:
            writes = write_lines(catalog, agent, host)
            if any(landed(write) for write in writes):
                return writes
            await trio.sleep(0.05)
    raise AssertionError(f"{agent}: no write line {what} within 30s")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """`predicate()` once it is true, looked at every 20 ms. The default deadline is generous: it
    bounds a wait for an event (a process started, a file written), never a duration under test, and
    the suite runs on parallel workers of a machine that may be busy with other work."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_chars(pid: int | None = None) -> int:
    """The bytes process `pid` (None: this one) has read through read(2) and its kin so far, as
    /proc says (`rchar`): how a test proves a reader left a huge file unread, whatever the load."""
    for line in Path(f"/proc/{'self' if pid is None else pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/io has no rchar")


def pid_gone(pid: int) -> bool:
    """Dead or a zombie nobody reaped yet: either way, not a running process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except FileNotFoundError:
        return True


def run(argv: list[str], timeout: float = 60.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=timeout, **kwargs)


# A stand-in harness: sends the frames given as JSON arguments to the channel, one connection each.
STANDIN = r"""
import json, os, socket, sys, time
for frame in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["HCTX_CHANNEL"])
    s.sendall(frame.encode() + b"\n")
    s.close()
"""


def context_frame(tokens: int, window: int, percent: float) -> str:
    """A pi extension frame, the simplest real channel frame a stand-in can send."""
    reading = {"tokens": tokens, "contextWindow": window, "percent": percent, "model": "m", "costUsd": None}
    return json.dumps({"type": "context", "reading": reading, "compaction": None})


async def coalesced_once_exited(catalog: Path, agent: str, host: str = HOST) -> int:
    """`coalesced_writes` of the agent's log once the sidecar that logged its last write has logged
    its exit (after the session's end: an adopted sidecar drains after its harness has gone), a
    liveness bound as `wait_for`'s."""
    import trio

    with trio.move_on_after(30):
        while True:
            events = log_events(catalog, agent, host)
            kinds = [event.get("event") for event in events]
            last_write = max((at for at, kind in enumerate(kinds) if kind == "write"), default=-1)
            if "exit" in kinds[last_write + 1 :]:
                return coalesced_writes(events)
            await trio.sleep(0.05)
    raise AssertionError(f"{agent}: the sidecar of its last write logged no exit within 30s")


def coalesced_writes(events: list[dict[str, Any]], since: int = 0) -> int:
    """How many writes the sidecars of a log's `events` folded into a newer one (a write stalled
    past STALLED_WRITE_S on a loaded machine), as their exit lines count them: those of the sidecars
    that exited after the log's `since`-th write."""
    writes = coalesced = 0
    for event in events:
        if event.get("event") == "write":
            writes += 1
        elif event.get("event") == "exit" and writes > since:
            coalesced += int(event.get("coalesced") or 0)
    return coalesced


async def assert_replays_as_logged(catalog: Path, agent: str, recording: Path, *, since: int = 0) -> None:
    """The recording `hctx wrap --record` made replays (through the live driver, in a thread: it
    runs a trio loop of its own) to the writes the sidecar logged, whole records (every field but
    `writtenAtMs`), from the `since`-th write of the agent's log on (an earlier wrap's are before)."""
    import trio

    from sidecar.registry import spec_for
    from sidecar.replay import read_header, replay_recording
    from tests.conformance import assert_lived_as_replayed, logged
    from tests.conformance import lived as lived_write

    events = log_events(catalog, agent)
    lived = [lived_write(event) for event in events if event.get("event") == "write"][since:]
    coalesced = coalesced_writes(events, since)
    harness = str(read_header(recording)["harness"])
    writes, summary = await trio.to_thread.run_sync(replay_recording, spec_for(harness), recording)
    assert_lived_as_replayed(lived, [logged(write) for write in writes], coalesced)
    assert lived and not summary.problems and not summary.lost_chunks and not summary.truncated
    keep_recording(recording, harness)


# `HCTX_KEEP_RECORDINGS=1` (or a directory): each recording a live test made with `hctx wrap
# --record`, and held to its live writes, is kept as a fixture (docs/recording.md).
KEEP_RECORDINGS_ENV = "HCTX_KEEP_RECORDINGS"


def keep_recording(recording: Path, harness: str) -> Path | None:
    """With $HCTX_KEEP_RECORDINGS set, `recording` copied to <it>/<harness>/wrapped/<test>.rec
    (`1`: fixtures/recordings/), named by the test that made it; the path, or None unset."""
    import re
    import shutil

    keep = os.environ.get(KEEP_RECORDINGS_ENV)
    if not keep:
        return None
    root = REPO / "fixtures" / "recordings" if keep == "1" else Path(keep)
    test = os.environ.get("PYTEST_CURRENT_TEST", "session").split("::")[-1].removesuffix(" (call)")
    destination = root / harness / "wrapped" / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', test).strip('-')}.rec"
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recording, destination)
    return destination


def logged_writes(catalog: Path, agent: str) -> int:
    """How many writes the agent's log holds so far (`assert_replays_as_logged`'s `since`)."""
    return len(write_lines(catalog, agent))
