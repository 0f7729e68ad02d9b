#!/usr/bin/env python3
"""Whole-process time of the Claude status-line tee against a bare interpreter, in one run.

Claude spawns the status-line command every few seconds per seat and waits for it, so what counts
is the process from fork to exit. Every variant gets the same captured 2.1.250 payload on stdin,
a listening channel socket (so the frame is really sent) and a trivial renderer (`echo ok`);
variants run round-robin so they share the machine's noise. Ratios are medians over medians; the CPU
columns (user + system of the whole process tree) are the load-proof view of the same cost.

    python scripts/bench_statusline.py [--runs 60]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sidecar.adoption import adoption_channel, process_start_ticks
from sidecar.harnesses.claude.launch import tee_command

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = (REPO / "fixtures" / "claude" / "statusline-2.1.250.jsonl").read_bytes().splitlines()[1]
PRE_COMPACT = (REPO / "fixtures" / "claude" / "precompact-2.1.250.jsonl").read_bytes().splitlines()[0]


ADOPTED = "tee: adopted statusLine (no HCTX_CHANNEL)"


def variants() -> dict[str, tuple[list[str], bytes]]:
    python = sys.executable
    found = {
        "python -S -c pass (bare)": ([python, "-S", "-c", "pass"], b""),
        "python -c pass": ([python, "-c", "pass"], b""),
        "sh -c python -S -c pass": (["/bin/sh", "-c", f"{python} -S -c pass"], b""),
        # What sidecar.harnesses.claude.launch renders into .claude/settings.local.json.
        "tee: rendered statusLine command": (["/bin/sh", "-c", tee_command("statusline")], PAYLOAD),
        "hook: rendered hook command": (["/bin/sh", "-c", tee_command("hook")], PRE_COMPACT),
        # What `hctx setup` renders into the user's settings, in a Claude started without `hctx wrap`:
        # the tee finds its Claude (here this process, past the `sh -c`) and sends to its adoption
        # channel, which this script listens on as the adopted sidecar would (issue 36).
        ADOPTED: (["/bin/sh", "-c", tee_command("statusline")], PAYLOAD),
        "tee: python -m sidecar.harnesses.claude.tee": (
            [python, "-m", "sidecar.harnesses.claude.tee", "statusline"],
            PAYLOAD,
        ),
    }
    console = shutil.which("hctx-statusline")
    if console:
        found["tee: hctx-statusline (console script)"] = ([console], PAYLOAD)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    runs = variants()
    with tempfile.TemporaryDirectory() as scratch:
        channel = os.path.join(scratch, "channel.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(channel)
        listener.listen(128)
        listener.setblocking(False)
        env = os.environ | {
            "HCTX_CHANNEL": channel,
            "ST_CLAUDE_STATUSLINE_RENDERER": "echo ok",
            "PYTHONPATH": str(REPO),
            "XDG_RUNTIME_DIR": scratch,
        }
        adopted_env = {key: value for key, value in env.items() if key != "HCTX_CHANNEL"}
        start = process_start_ticks(os.getpid())
        assert start is not None
        adopted = adoption_channel(os.getpid(), start, {b"XDG_RUNTIME_DIR": os.fsencode(scratch)})
        os.makedirs(os.path.dirname(adopted), mode=0o700)
        adopted_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        adopted_listener.bind(adopted)
        adopted_listener.listen(128)
        adopted_listener.setblocking(False)
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        received = 0
        for _ in range(args.runs):
            for name, (argv, stdin) in runs.items():
                cpu_before = _children_cpu_ms()
                start = time.perf_counter()
                done = subprocess.run(argv, input=stdin, env=adopted_env if name == ADOPTED else env,
                                      capture_output=True, check=False)  # fmt: skip
                times[name].append((time.perf_counter() - start) * 1000)
                cpu[name].append(_children_cpu_ms() - cpu_before)
                if done.returncode != 0 or (name.startswith("tee") and done.stdout != b"ok\n"):
                    print(f"{name} failed: rc={done.returncode} {done.stdout!r} {done.stderr!r}")
                    return 1
                received += _drain(listener) + _drain(adopted_listener)
        listener.close()
        adopted_listener.close()
    bare = statistics.median(times["python -S -c pass (bare)"])
    plain = statistics.median(times["python -c pass"])
    bare_cpu = statistics.median(cpu["python -S -c pass (bare)"])
    print(
        f"{args.runs} runs each, round-robin; frames received by the channel: {received}; load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'variant':42} {'median ms':>10} {'p90 ms':>8} {'x bare -S':>10} {'x python':>9} {'cpu ms':>7} {'cpu x':>6}"
    )
    for name, samples in times.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        used = statistics.median(cpu[name])
        print(
            f"{name:42} {median:10.2f} {p90:8.2f} {median / bare:10.2f} {median / plain:9.2f}"
            f" {used:7.2f} {used / bare_cpu:6.2f}"
        )
    return 0


def _children_cpu_ms() -> float:
    """User + system CPU of every waited-for descendant; unlike wall time, barely moved by load."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _drain(listener: socket.socket) -> int:
    frames = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return frames
        with conn:
            conn.setblocking(True)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            frames += data.count(b"\n")


if __name__ == "__main__":
    sys.exit(main())
