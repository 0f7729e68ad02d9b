"""`hctx watch --exec` against a stand-in pi session under the real `hctx wrap` and sidecar: it
crosses 80 and 95, watch is restarted, it compacts, drops back and rises past 80 again. The
re-read is ten minutes, so every event here came through a file notification."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.wrapping import HOST, agent_dir, context_frame, env, hctx, read_json, wait_for, wrap_argv

# Sends its frames one at a time, each when the test creates go-N; exits when it creates `done`.
# (The wrapper appends `--extension PATH` for pi: only the JSON arguments are frames.)
STANDIN = r"""
import os, socket, sys, time
go = sys.argv[1]
def wait(name):
    while not os.path.exists(os.path.join(go, name)):
        time.sleep(0.02)
for index, frame in enumerate(arg for arg in sys.argv[2:] if arg.startswith("{")):
    wait(f"go-{index}")
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["HCTX_CHANNEL"])
    s.sendall(frame.encode() + b"\n")
    s.close()
wait("done")
"""

WINDOW = 100_000


def compaction_frame(count: int) -> str:
    """pi's `session_compact`: the edge, with the reading it emptied withheld in the same frame."""
    reading = {"tokens": None, "contextWindow": WINDOW, "percent": None, "model": "m", "costUsd": None}
    return json.dumps({"type": "context", "reading": reading, "compaction": {"reason": "threshold", "count": count}})


FRAMES = [
    context_frame(50_000, WINDOW, 50.0),
    context_frame(82_000, WINDOW, 82.0),
    context_frame(96_000, WINDOW, 96.0),
    compaction_frame(1),
    context_frame(30_000, WINDOW, 30.0),
    context_frame(85_000, WINDOW, 85.0),
]


def _start_watch(catalog: Path, command: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    watch = subprocess.Popen(
        hctx("watch", "--catalog", str(catalog), "--host", HOST, "--exec", command, "--reread", "600"),
        stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert watch.stderr is not None
        for line in watch.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    assert "following" in lines.get(timeout=20)
    time.sleep(1.0)  # the watcher is set up right after that line; leave it time to arm
    return watch, lines


def _stop(watch: subprocess.Popen[str], lines: queue.Queue[str]) -> list[str]:
    watch.send_signal(signal.SIGTERM)
    assert watch.wait(timeout=20) == 0
    return list(lines.queue)


def test_watch_exec_tells_each_crossing_once_in_order_through_the_real_wrapper(tmp_path: Path) -> None:
    catalog, go, got = tmp_path / "catalog", tmp_path / "go", tmp_path / "events.jsonl"
    go.mkdir()
    catalog.mkdir()
    command = f"cat >> {got}"
    record = agent_dir(catalog, "stand") / "harness-context"

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in got.read_text().splitlines()] if got.exists() else []

    def send(index: int) -> None:
        (go / f"go-{index}").touch()

    wrapper = subprocess.Popen(wrap_argv(catalog, "stand", "pi", sys.executable, "-c", STANDIN, str(go), *FRAMES),
                               env=env())  # fmt: skip
    watch = None
    try:
        send(0)
        wait_for(lambda: record.exists() and read_json(record)["usedPercent"] == 50.0, 20, "the 50% record")
        watch, lines = _start_watch(catalog, command)
        send(1)
        wait_for(lambda: len(events()) == 1, 20, "the 80% event")
        send(2)
        wait_for(lambda: len(events()) == 2, 20, "the 95% event")

        logged = _stop(watch, lines)  # a restart: the new watch reads what the old one told
        watch, lines = _start_watch(catalog, command)
        send(3)
        wait_for(lambda: len(events()) == 3, 20, "the compaction event")
        send(4)
        state = catalog / ".st2" / "watch" / "default.json"
        wait_for(lambda: read_json(state)["agents"][f"{HOST}/stand"]["fired"] == [], 20, "80 and 95 re-armed")
        send(5)
        wait_for(lambda: len(events()) == 4, 20, "the second 80% event")
        time.sleep(1.0)  # nothing more is coming
        logged += _stop(watch, lines)
        watch = None
        (go / "done").touch()
        assert wrapper.wait(timeout=30) == 0
    finally:
        (go / "done").touch()
        for process in (watch, wrapper):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)

    told = [(e["event"], e["threshold"], e["usedPercent"], e["compactions"]) for e in events()]
    assert told == [
        ("fill", 80.0, 82.0, 0),
        ("fill", 95.0, 96.0, 0),
        ("compaction", None, None, 1),
        ("fill", 80.0, 85.0, 1),
    ]
    incarnation = read_json(agent_dir(catalog, "stand") / "harness-state")["incarnation"]
    assert {(e["host"], e["agent"], e["harness"], e["incarnation"]) for e in events()} == {
        (HOST, "stand", "pi", incarnation)
    }
    assert events()[1]["message"] == f"{HOST}/stand: context 96% full (96k/100k), at or above 95%"
    assert not [line for line in logged if "timed out" in line or "exited with status" in line], logged
