#!/usr/bin/env python3
"""How fast `hctx status` and `hctx agents --json` start, as ratios to a bare interpreter, in one run.

A status bar runs its command every few seconds (tmux's status-interval, waybar's interval), so what
it costs is the process's start more than its work. On one 100-agent catalog (four hosts, each record
with its claim), the median wall time of each process, and its ratio to `python3 -c pass` timed in the
same run, interleaved so a busy machine weighs on all alike. Targets: status <= 3x, agents --json <= 5x.
The hctx commands run as the console script does (`hctx`, beside this interpreter), so its
site-packages start-up is theirs; the bare interpreter is the system's `python3`. The checkout's
modules are compiled first, as installing a wheel compiles them: where PYTHONDONTWRITEBYTECODE is
set (it is on the machine issue 38 was measured on) a module edited since its .pyc was written is
otherwise compiled again by every run, and the bench times the compiler with it.

Usage: scripts/bench_status.py [--agents 100] [--repeat 21]
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from tests.web_board import many  # noqa: E402

TARGETS = {"hctx status": 3.0, "hctx agents --json": 5.0}
# The console script pip writes for `hctx` (its two lines), run with the installed package on the path.
CONSOLE_SCRIPT = "import re, sys; from wrapper.cli import main; sys.exit(main())"


def site_packages() -> str:
    return next(path for path in sys.path if path.endswith("site-packages") and Path(path).is_relative_to(sys.prefix))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=21, help="runs of each command (the first is not timed)")
    options = parser.parse_args()
    hctx = shutil.which("hctx", path=str(Path(sys.executable).parent)) or "hctx"
    # The interpreter this environment is built on, bare: the same build the commands run in.
    bare = getattr(sys, "_base_executable", sys.executable)
    for package in ("guard", "sidecar", "wrapper"):
        compileall.compile_dir(REPO / package, quiet=1)
    with tempfile.TemporaryDirectory(prefix="hctx-bench-status-") as scratch:
        catalog = Path(scratch)
        many(catalog, options.agents)
        env = {**os.environ, "HCTX_CATALOG": str(catalog), "NO_COLOR": "1"}
        # As a wheel installs it: the package and its dependencies on the path, no editable finder
        # (this checkout's `pip install -e` adds one to every start, 5-20 ms here).
        wheel_env = {**env, "PYTHONPATH": os.pathsep.join((str(REPO), site_packages()))}
        runs: dict[str, tuple[list[str], dict[str, str]]] = {
            "python3 -c pass": ([bare, "-c", "pass"], env),
            "hctx status": ([bare, "-c", CONSOLE_SCRIPT, "status"], wheel_env),
            "hctx status --json": ([bare, "-c", CONSOLE_SCRIPT, "status", "--json"], wheel_env),
            "hctx agents --json": ([bare, "-c", CONSOLE_SCRIPT, "agents", "--json"], wheel_env),
            "hctx status (editable)": ([hctx, "status"], env),
            "hctx agents --json (editable)": ([hctx, "agents", "--json"], env),
        }
        samples: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for attempt in range(options.repeat + 1):
            for name, (argv, environ) in runs.items():
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=environ)
                wall = (time.perf_counter() - started) * 1000
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if attempt:
                    samples[name].append(wall)
                    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                    cpu[name].append(used * 1000)
    base = statistics.median(samples["python3 -c pass"])
    base_cpu = statistics.median(cpu["python3 -c pass"])
    print(f"{options.agents} agents, {options.repeat} runs each, interleaved; medians (the wall time is judged;")
    print("the CPU time, user + system, is steadier on a busy machine)")
    print(f"{'command':<32}{'wall ms':>9}{'ratio':>8}{'cpu ms':>8}{'ratio':>8}{'target':>8}  verdict")
    failed = False
    for name, times in samples.items():
        median, used = statistics.median(times), statistics.median(cpu[name])
        ratio = median / base
        target = TARGETS.get(name.removesuffix(" --json") if name == "hctx status --json" else name)
        verdict = "" if target is None else ("ok" if ratio <= target else "OVER")
        failed |= verdict == "OVER"
        shown = "" if target is None else f"{target:.0f}x"
        print(f"{name:<32}{median:>9.1f}{ratio:>7.2f}x{used:>8.1f}{used / base_cpu:>7.2f}x{shown:>8}  {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
