#!/usr/bin/env python3
"""Time a Prometheus scrape of `hctx metrics` against `hctx agents --json` on the same catalogs.

The catalogs are bench_roster.py's (one record and one claim per agent, as the wrapper and sidecar
write them). A scrape is an HTTP GET of a running exporter, which reads the whole catalog each time;
`hctx agents --json` is a whole process, so it is also shown above its start-up (the same command
on an empty catalog). In-process CPU per agent compares the two renderings of one roster without
HTTP or start-up: reading it is shared, so the difference is the exposition itself.

Usage: scripts/bench_metrics.py [--sizes 1000,10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_roster import REPO, build_catalog, timed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape_ms(catalog: Path, repeat: int) -> tuple[float, float, int]:
    """Median wall times of a GET /metrics (after one warm-up), plain and gzip-encoded the way
    Prometheus asks for it, and the plain exposition's size in bytes."""
    port = free_port()
    argv = [sys.executable, "-m", "wrapper.cli", "metrics", "--catalog", str(catalog), "--host", "alpha"]
    server = subprocess.Popen(
        [*argv, "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("hctx metrics did not start") from None
                time.sleep(0.05)
        medians, size = [], 0
        for headers in ({}, {"Accept-Encoding": "gzip"}):
            samples = []
            for attempt in range(repeat + 1):
                started = time.perf_counter()
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as response:
                    size = len(response.read()) if not headers else size
                if attempt:
                    samples.append((time.perf_counter() - started) * 1000)
            medians.append(statistics.median(samples))
        return medians[0], medians[1], size
    finally:
        server.terminate()
        server.wait(timeout=10)


def cpu_us_per_agent(catalog: Path, now_ms: int) -> tuple[float, float]:
    """Best-of-3 process CPU per agent of roster + JSON and of roster + exposition."""
    sys.path.insert(0, str(REPO))
    from prometheus_client import CollectorRegistry, generate_latest

    from wrapper.metrics import CatalogCollector
    from wrapper.render import render_agents_json
    from wrapper.roster import collect_roster

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CatalogCollector(lambda: catalog, "alpha"))
    agents = len(collect_roster(catalog, now_ms, here="alpha").rows)

    def best(work: Callable[[], object]) -> float:
        runs = []
        for _ in range(3):
            started = time.process_time()
            work()
            runs.append(time.process_time() - started)
        return min(runs) * 1e6 / agents

    as_json = best(lambda: render_agents_json(collect_roster(catalog, now_ms, here="alpha").rows))
    return as_json, best(lambda: generate_latest(registry))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    now_ms = time.time_ns() // 1_000_000
    agents_json = [sys.executable, "-m", "wrapper.cli", "agents", "--json", "--host", "alpha", "--catalog"]

    with tempfile.TemporaryDirectory(prefix="hctx-bench-metrics-") as scratch:
        empty = Path(scratch) / "empty"
        empty.mkdir()
        startup = timed([*agents_json, str(empty)], args.repeat)
        print(f"hctx agents --json on an empty catalog (start-up): {startup:.1f} ms")
        print()
        print("| agents | exposition | `agents --json` ms | above start-up ms | scrape ms | scrape / above "
              "| gzip scrape ms | scrape µs/agent | CPU µs/agent: json | CPU µs/agent: exposition |")  # fmt: skip
        print("|-------:|-----------:|-------------------:|------------------:|----------:|---------------:"
              "|--------------:|----------------:|-------------------:|-------------------------:|")  # fmt: skip
        per_agent = []
        for size in sizes:
            catalog = Path(scratch) / f"c{size}"
            build_catalog(catalog, size, now_ms)
            wall = timed([*agents_json, str(catalog)], args.repeat)
            above = wall - startup
            scrape, gzipped, exposition_bytes = scrape_ms(catalog, args.repeat)
            cpu_json, cpu_exposition = cpu_us_per_agent(catalog, now_ms)
            per_agent.append(scrape * 1000 / size)
            print(f"| {size:6d} | {exposition_bytes / 1e6:7.1f} MB | {wall:18.1f} | {above:17.1f} | {scrape:9.1f} "
                  f"| {scrape / above:13.2f}x | {gzipped:13.1f} | {scrape * 1000 / size:15.1f} | {cpu_json:18.1f} "
                  f"| {cpu_exposition:24.1f} |")  # fmt: skip
        if len(per_agent) > 1:
            print()
            print(f"scrape cost per agent, largest over smallest catalog: {per_agent[-1] / per_agent[0]:.2f}x "
                  "(1.00x is linear)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
