#!/usr/bin/env python3
"""Time `hctx agents --json` as a whole process on catalogs of 10 to 10,000 agents.

Each catalog holds one record and one harness-state claim per agent, written the way the wrapper
and the sidecar write them. The fixed start-up is the same command on an empty catalog; the
per-agent cost is what a catalog adds above it. A bare `python -c pass` in the same run is the
yardstick for the start-up (target: within 10x of it; per agent under 0.1 ms).

Usage: scripts/bench_roster.py [--sizes 10,100,1000,10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOSTS = ("alpha", "bravo", "charlie", "delta")


def build_catalog(root: Path, agents: int, now_ms: int) -> None:
    for index in range(agents):
        host = HOSTS[index % len(HOSTS)]
        identity = f"agent-{index:05d}"
        directory = root / "agents" / host / identity
        directory.mkdir(parents=True)
        record = {
            "schema": "st2.harness-context.v1", "agent": identity, "harness": "codex",
            "usedTokens": 1000 + index, "windowTokens": 258400, "usedPercent": (index % 100) + 0.5,
            "model": "gpt-5", "costUsd": None, "sessionTotalTokens": 2235329,
            "rateLimits": {"fiveHour": 31.0, "sevenDay": 55.0}, "compactions": index % 4,
            "lastCompactionMs": now_ms - 60_000, "lastCompactionTrigger": "auto",
            "incarnation": f"inc-{index}", "observedAtMs": now_ms - 5000, "writtenAtMs": now_ms - 5000,
        }  # fmt: skip
        claim = {
            "schema": "st2.harness-state.v1", "agent": identity, "host": host, "harness": "codex",
            "incarnation": f"inc-{index}", "claimedAtMs": now_ms - 600_000, "wrapperPid": 999_999_999,
            "desiredState": "running", "history": [],
        }  # fmt: skip
        (directory / "harness-context").write_text(json.dumps(record) + "\n")
        (directory / "harness-state").write_text(json.dumps(claim) + "\n")


def timed(argv: list[str], repeat: int) -> float:
    """Median wall time in ms of `repeat` runs, after one warm-up run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    samples = []
    for attempt in range(repeat + 1):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
        if attempt:
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def in_process_cpu_ms(catalog: Path, now_ms: int) -> float:
    """CPU time of collecting and rendering the roster inside one process: the per-agent cost
    without process start-up, and steadier than wall time on a busy machine."""
    sys.path.insert(0, str(REPO))
    from guard.layout import default_host
    from wrapper.readers.render import render_agents_json
    from wrapper.readers.roster import collect_roster

    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        render_agents_json(collect_roster(catalog, now_ms, here=default_host()).rows)
        best = min(best, (time.process_time() - started) * 1000)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    now_ms = time.time_ns() // 1_000_000
    hctx = [sys.executable, "-m", "wrapper.cli", "agents", "--json", "--catalog"]

    with tempfile.TemporaryDirectory(prefix="hctx-bench-") as scratch:
        bare = timed([sys.executable, "-c", "pass"], args.repeat)
        empty = Path(scratch) / "empty"
        empty.mkdir()
        startup = timed([*hctx, str(empty)], args.repeat)
        print(f"python -c pass           {bare:8.1f} ms")
        print(f"hctx agents --json, 0    {startup:8.1f} ms  ({startup / bare:.1f}x bare interpreter)")
        print()
        print("| agents | wall ms | above start-up ms | ms per agent | in-process CPU ms per agent |")
        print("|-------:|--------:|------------------:|-------------:|----------------------------:|")
        for size in sizes:
            catalog = Path(scratch) / f"c{size}"
            build_catalog(catalog, size, now_ms)
            wall = timed([*hctx, str(catalog)], args.repeat)
            above = wall - startup
            cpu = in_process_cpu_ms(catalog, now_ms) / size
            print(f"| {size:6d} | {wall:7.1f} | {above:17.1f} | {above / size:12.4f} | {cpu:27.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
