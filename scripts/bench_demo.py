#!/usr/bin/env python3
"""Time `hctx demo --no-top` as a user runs it, phase by phase, from its own output.

The demo prints a line the moment it starts, one per agent as its wrapper claims it ("launched"),
one per record as it lands, then the roster. From those: how long until the first line, until
every agent is launched, until the first record, and the whole run; the play itself is the
demo's `--duration` (15 s by default). The CPU time of all its processes is what the run costs on
any machine; the wall times grow with the load. The yardstick, measured in the same run, is a bare
`python -c pass`: the start-up every one of the demo's dozen processes pays at least once.

Usage: scripts/bench_demo.py [--runs 3] [--duration 15]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\s*(?P<at>\d+\.\d)s  demo/\S+\s+\S+\s+(?P<what>.*)$")


def python_start_s(repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def one_run(duration_s: float | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="hctx-bench-demo-") as tmp:
        argv = [sys.executable, "-m", "wrapper.cli", "demo", "--no-top", "--catalog", f"{tmp}/catalog"]
        argv += [] if duration_s is None else ["--duration", str(duration_s)]
        cpu_before = _children_cpu_s()
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
        assert process.stdout is not None
        first_line = time.perf_counter() - started
        lines = []
        for index, line in enumerate(process.stdout):
            if index == 0:
                first_line = time.perf_counter() - started
            lines.append(line)
        if process.wait() != 0:
            raise SystemExit(f"the demo failed:\n{''.join(lines)}")
        total = time.perf_counter() - started
        cpu = _children_cpu_s() - cpu_before
    marks = [(float(match["at"]), match["what"]) for line in lines if (match := LINE.match(line))]
    launched = [at for at, what in marks if what == "launched"]
    records = [at for at, what in marks if what != "launched"]
    return {
        "first line": first_line,
        "every agent launched": max(launched),
        "first record": min(records),
        "last record": max(records),
        "whole run": total,
        # Every process the demo started, reaped: what the run costs whatever the machine's load.
        "CPU, all processes": cpu,
    }


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=None, help="the demo's --duration (default: its own)")
    args = parser.parse_args()
    baseline = python_start_s()
    runs = [one_run(args.duration) for _ in range(args.runs)]
    load = os.getloadavg()[0]
    print(f"hctx demo --no-top, {args.runs} runs, {os.cpu_count()} cores, load {load:.1f}")
    print(f"{'phase':<22} {'median s':>9} {'min s':>7} {'max s':>7} {'x python -c pass':>17}")
    print(f"{'python -c pass':<22} {baseline:>9.2f} {'':>7} {'':>7} {1.0:>17.1f}")
    for phase in runs[0]:
        samples = [run[phase] for run in runs]
        median = statistics.median(samples)
        print(f"{phase:<22} {median:>9.2f} {min(samples):>7.2f} {max(samples):>7.2f} {median / baseline:>17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
