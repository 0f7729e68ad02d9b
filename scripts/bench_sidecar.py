#!/usr/bin/env python3
"""Sidecar footprint and speed, each against a baseline measured in the same run.

  RSS after start, and after 100,000 frames   vs a bare `python -c 'sleep'` process
  idle CPU over --idle seconds (default 60)    vs that same bare process
  frame -> record latency p50 / p99            vs a unix-socket echo round trip to a bare process

Targets (issue 3): RSS < 40 MB, idle CPU < 0.1 %, p99 latency < 5 ms.
Usage: python scripts/bench_sidecar.py [--idle SECONDS] [--frames N] [--samples N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ECHO = (
    "import os, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)\n"
    "c, _ = s.accept()\n"
    "while data := c.recv(65536): c.sendall(data)\n"
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def frame(tokens: int, window: int) -> bytes:
    reading = {"tokens": tokens, "contextWindow": window, "percent": tokens * 100 / window, "model": "m",
               "costUsd": None}  # fmt: skip
    return json.dumps({"type": "context", "reading": reading, "compaction": None}).encode() + b"\n"


def wait_path(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} never appeared")
        time.sleep(0.005)


def measure_latency(channel: Path, record: Path, samples: int) -> list[float]:
    latencies = []
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(channel))
        for i in range(samples):
            before = record.stat().st_ino if record.exists() else None
            # Alternate between two buckets so every frame is a write.
            data = frame(10_000 + (i % 2) * 5_000, 100_000)
            start = time.perf_counter()
            client.sendall(data)
            while True:
                try:
                    if record.stat().st_ino != before:
                        break
                except FileNotFoundError:
                    pass
                # Yield the CPU: a spinning client on a 2-core machine would steal it from the sidecar.
                time.sleep(0.0001)
            latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def echo_latency(path: Path, samples: int) -> list[float]:
    server = subprocess.Popen([sys.executable, "-c", ECHO, str(path)])
    try:
        wait_path(path)
        latencies = []
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
            data = frame(1, 2)
            for _ in range(samples):
                start = time.perf_counter()
                client.sendall(data)
                received = 0
                while received < len(data):
                    received += len(client.recv(65536))
                latencies.append((time.perf_counter() - start) * 1000)
        return latencies
    finally:
        server.kill()
        server.wait()


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--idle", type=float, default=60.0, help="idle CPU window in seconds")
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=500, help="latency samples")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hctx-bench-"))
    channel = work / "ch"
    catalog = work / "catalog"
    lifeline_read, lifeline_write = os.pipe()
    env = os.environ | {"PYTHONPATH": str(REPO)}
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "--harness", "pi", "--catalog", str(catalog), "--host", "bench",
         "--agent", "a", "--incarnation", "bench", "--channel", str(channel), "--lifeline-fd", str(lifeline_read)],
        env=env, pass_fds=(lifeline_read,),
    )  # fmt: skip
    baseline = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(100000)"])
    os.close(lifeline_read)
    try:
        wait_path(channel)
        time.sleep(0.5)
        rows: list[tuple[str, float, float, str]] = []
        rss_start, rss_base = rss_mb(sidecar.pid), rss_mb(baseline.pid)
        rows.append(("RSS after start (MB)", rss_start, rss_base, "< 40 MB"))

        cpu0, base0, t0 = cpu_seconds(sidecar.pid), cpu_seconds(baseline.pid), time.monotonic()
        time.sleep(args.idle)
        elapsed = time.monotonic() - t0
        idle = (cpu_seconds(sidecar.pid) - cpu0) / elapsed * 100
        idle_base = (cpu_seconds(baseline.pid) - base0) / elapsed * 100
        rows.append((f"idle CPU over {args.idle:.0f} s (%)", idle, idle_base, "< 0.1 %"))

        record = catalog / "agents" / "bench" / "a" / "harness-context"
        latencies = measure_latency(channel, record, args.samples)
        echo = echo_latency(work / "echo", args.samples)
        rows.append(("frame->record p50 (ms)", percentile(latencies, 50), percentile(echo, 50), ""))
        rows.append(("frame->record p99 (ms)", percentile(latencies, 99), percentile(echo, 99), "< 5 ms"))

        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(channel))
            # Same bucket throughout: the sidecar decodes and judges every frame, writing none.
            batch = b"".join(frame(50_000 + i % 7, 100_000) for i in range(1000))
            for _ in range(args.frames // 1000):
                client.sendall(batch)
        time.sleep(1.0)
        rows.append((f"RSS after {args.frames:,} frames (MB)", rss_mb(sidecar.pid), rss_base, "< 40 MB"))
    finally:
        os.close(lifeline_write)
        sidecar.wait(timeout=10)
        baseline.kill()
        baseline.wait()

    print(f"{'measure':<34} {'sidecar':>10} {'baseline':>10} {'ratio':>8}  target")
    for name, value, base, target in rows:
        ratio = f"{value / base:8.2f}" if base else "       -"
        print(f"{name:<34} {value:>10.3f} {base:>10.3f} {ratio}  {target}")
    print("baseline: a bare python process (RSS, CPU); a unix-socket echo round trip (latency)")


if __name__ == "__main__":
    main()
