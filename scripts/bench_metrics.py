#!/usr/bin/env python3
"""The exporter and `hctx watch` on large catalogs, as ratios against `hctx agents --json`.

In one run, per catalog size (bench_roster.py's catalogs: one record and one claim per agent, as
the wrapper and sidecar write them):

- `agents --json`: the whole process, the baseline every other figure is divided by;
- `--textfile`: `hctx metrics --textfile` as a whole process, the same one-shot job;
- cold scrape: the first GET /metrics of a fresh exporter (it reads every record);
- warm scrape: a GET of the unchanged catalog (each agent costs two `lstat` calls);
- 1% changed: a GET after 1% of the records were replaced (as the sidecar replaces them).

Each is shown as wall time and as CPU time (the process's own, read from /proc or rusage), since
on a shared machine the CPU time is the steadier figure. Then `hctx watch`: the p99 from a
record's replacement to its event on stdout, at 1 agent and at the largest watch size, and their
ratio (the watch debounces file events for 400 ms, included in both).

Targets (issue 25): warm scrape <= 0.3x and --textfile <= 1.2x `agents --json` at 10,000 agents;
watch p99 at 1,000 agents within 1.5x of its p99 at 1 agent.

Usage: scripts/bench_metrics.py [--sizes 1000,10000] [--repeat 5] [--watch-sizes 1,1000] [--events 40]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_roster import HOSTS, REPO, build_catalog

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run_process(argv: list[str], repeat: int) -> tuple[float, float]:
    """Median wall and CPU ms of `repeat` runs of a whole process, after one warm-up."""
    walls, cpus = [], []
    for attempt in range(repeat + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=ENV, cwd=REPO)
        wall = (time.perf_counter() - started) * 1000
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if attempt:
            walls.append(wall)
            cpus.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def process_cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


def replace_record(directory: Path, percent: float) -> None:
    """What the sidecar does: a new file renamed over the record."""
    path = directory / "harness-context"
    record = json.loads(path.read_text())
    stamp = time.time_ns() // 1_000_000
    record.update(usedPercent=percent, usedTokens=int(percent * 2584), observedAtMs=stamp, writtenAtMs=stamp)
    staging = directory / ".bench-staging"
    staging.write_text(json.dumps(record) + "\n")
    os.replace(staging, path)


def agent_dirs(catalog: Path, size: int) -> list[Path]:
    return [catalog / "agents" / HOSTS[index % len(HOSTS)] / f"agent-{index:05d}" for index in range(size)]


class Exporter:
    def __init__(self, catalog: Path) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "wrapper.cli", "metrics", "--catalog", str(catalog), "--host", "alpha"]
        self.process = subprocess.Popen([*argv, "--listen", f"127.0.0.1:{port}"], env=ENV, cwd=REPO,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
        self.url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise SystemExit("hctx metrics did not start") from None
                time.sleep(0.05)

    def scrape(self) -> tuple[float, float, int]:
        """Wall ms, the exporter's CPU ms, the body's bytes: one GET as Prometheus sends it."""
        request = urllib.request.Request(self.url, headers={
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            "Accept-Encoding": "gzip"})  # fmt: skip
        cpu = process_cpu_ms(self.process.pid)
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=300) as response:
            size = len(response.read())
        return (time.perf_counter() - started) * 1000, process_cpu_ms(self.process.pid) - cpu, size

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def scrapes(catalog: Path, size: int, repeat: int) -> dict[str, tuple[float, float]]:
    exporter = Exporter(catalog)
    try:
        cold = exporter.scrape()
        time.sleep(1.1)  # past the racy second of the catalog's newest files
        exporter.scrape()
        warm = [exporter.scrape() for _ in range(repeat)]
        changed = []
        directories = agent_dirs(catalog, size)
        for _ in range(repeat):
            for directory in random.sample(directories, max(1, size // 100)):
                replace_record(directory, random.choice((12.5, 44.0, 71.5)))
            changed.append(exporter.scrape())
            time.sleep(1.1)
            exporter.scrape()  # the changed ones, read again once past their racy second
    finally:
        exporter.stop()

    def median(runs: list[tuple[float, float, int]]) -> tuple[float, float]:
        return statistics.median(run[0] for run in runs), statistics.median(run[1] for run in runs)

    return {"cold": (cold[0], cold[1]), "warm": median(warm), "changed": median(changed)}


def watch_p99(scratch: Path, size: int, events: int) -> float:
    """p99 ms from replacing one record (50% -> 85%) to its `fill` event on the watch's stdout."""
    catalog = scratch / f"w{size}"
    build_catalog(catalog, size, time.time_ns() // 1_000_000)
    directories = agent_dirs(catalog, size)
    for directory in directories:
        replace_record(directory, 50.0)
    watch = subprocess.Popen(
        [sys.executable, "-m", "wrapper.cli", "watch", "--catalog", str(catalog), "--host", "alpha", "--reread", "600"],
        env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert watch.stdout is not None and watch.stderr is not None
    threading.Thread(target=lambda: [lines.put(line) for line in watch.stdout], daemon=True).start()  # type: ignore[union-attr]
    if "following" not in watch.stderr.readline():
        raise SystemExit("hctx watch did not start")
    latencies = []
    try:
        # Until its file watching is set up (after its first read) a write goes unseen until the
        # re-read: probe with the last agent until an event comes, then measure from then on.
        probe, deadline = directories[-1], time.monotonic() + 180
        while True:
            replace_record(probe, 85.0)
            with contextlib.suppress(queue.Empty):
                lines.get(timeout=2)
                break
            if time.monotonic() > deadline:
                raise SystemExit("hctx watch never reported the probe")
            replace_record(probe, 50.0)
        replace_record(probe, 50.0)
        time.sleep(1)
        with contextlib.suppress(queue.Empty):
            while True:
                lines.get_nowait()  # a late event of the probe
        for index in range(events):
            directory = directories[index % max(1, len(directories) - 1)]
            started = time.perf_counter()
            replace_record(directory, 85.0)
            event = json.loads(lines.get(timeout=60))
            latencies.append((time.perf_counter() - started) * 1000)
            assert event["event"] == "fill" and event["agent"] == directory.name, event
            replace_record(directory, 50.0)  # re-arms it; no event
            time.sleep(0.6)
    finally:
        watch.terminate()
        watch.wait(timeout=20)
    latencies.sort()
    return latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def ratio(figure: tuple[float, float], base: tuple[float, float]) -> str:
    return f"{figure[0] / base[0]:.2f}x ({figure[1] / base[1]:.2f}x)"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--watch-sizes", default="1,1000")
    parser.add_argument("--events", type=int, default=40)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    now_ms = time.time_ns() // 1_000_000
    print("| agents | `agents --json` ms (CPU) | `--textfile` | cold scrape | warm scrape | 1% changed |")
    print("|-------:|-------------------------:|-------------:|------------:|------------:|-----------:|")
    with tempfile.TemporaryDirectory(prefix="hctx-bench-metrics-") as scratch:
        for size in sizes:
            catalog = Path(scratch) / f"c{size}"
            build_catalog(catalog, size, now_ms)
            base = run_process([sys.executable, "-m", "wrapper.cli", "agents", "--json", "--host", "alpha",
                                "--catalog", str(catalog)], args.repeat)  # fmt: skip
            out = str(Path(scratch) / "hctx.prom")
            textfile = run_process([sys.executable, "-m", "wrapper.cli", "metrics", "--host", "alpha", "--catalog",
                                    str(catalog), "--textfile", out], args.repeat)  # fmt: skip
            scraped = scrapes(catalog, size, args.repeat)
            cells = [ratio(figure, base) for figure in (textfile, scraped["cold"], scraped["warm"], scraped["changed"])]
            print(f"| {size:6d} | {base[0]:10.0f} ({base[1]:6.0f}) | " + " | ".join(cells) + " |", flush=True)
        print()
        print("Each cell: wall time over `agents --json`'s (CPU time over its CPU time).")
        print()
        watch_sizes = [int(size) for size in args.watch_sizes.split(",")]
        p99 = {size: watch_p99(Path(scratch), size, args.events) for size in watch_sizes}
        print("| watched agents | p99 write -> event ms | over the smallest |")
        print("|---------------:|----------------------:|------------------:|")
        for size, value in p99.items():
            print(f"| {size:14d} | {value:21.0f} | {value / p99[watch_sizes[0]]:16.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
