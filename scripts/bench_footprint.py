#!/usr/bin/env python3
"""What watching an agent costs: N seats under `hctx wrap`, against N bare trio processes (issue 24).

For each harness (pi, OpenCode, Claude) it starts N real `hctx wrap` seats whose harness is a
stand-in, and N adopted seats (a sleeping stand-in started plainly, then `hctx adopt` for it as
Claude's tee runs it: "adopted") (pi and Claude: a sleeping process; OpenCode: a small loopback server with `/event`,
heartbeats every 10 s as OpenCode's do, `/config/providers` and `/config`), and beside them, in the
same run, N bare `python -c "import trio"` processes. Once every seat's sidecar listens and the
machine settled, it reads per agent the PSS and RSS (/proc/PID/smaps_rollup) and the number of
processes of everything hctx runs for it (the wrapper, its sidecar and a wrapped seat's keeper; the
stand-in harness and its children are excluded), then the CPU they use while idle over --idle seconds. Ratios are to the
bare trio process measured in the same run. Only 127.0.0.1 and temp directories are used; only the
processes started here are stopped.

  targets: PSS <= 2.0x bare trio for pi and Claude, <= 2.3x for OpenCode (httpx loaded);
           idle CPU <= 0.05 % of a core per agent.

Usage: python scripts/bench_footprint.py [--seats N [N ...]] [--idle SECONDS] [--only NAME ...] [--check]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from guard.layout import default_host

REPO = Path(__file__).resolve().parent.parent
ADOPT = f"import sys;sys.path.insert(0,{str(REPO)!r});from wrapper.launch.adopt import main;sys.exit(main())"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 180.0
SETTLE_S = 5.0
# "adopted": a Claude started without `hctx wrap` that `hctx adopt` adopted (issue 36): the adopter's
# resident watching it by pidfd, and its sidecar.
TARGETS = {"pi": 2.0, "claude": 2.0, "opencode": 2.3, "adopted": 2.0}
IDLE_CPU_TARGET = 0.05  # percent of one core, per agent
SLEEPER = "import time; time.sleep(1e6)"
BASELINE = "import trio, time; time.sleep(1e6)"
# OpenCode's server, as much of it as the sidecar reads.
OPENCODE = r"""
import http.server, json, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/event":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            event = {"type": "server.connected", "properties": {}}
            try:
                while True:
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(10)
                    event = {"type": "server.heartbeat", "properties": {}}
            except OSError:  # the sidecar went away: so does this stream
                return
        body = json.dumps({"providers": [], "default": {}} if path == "/config/providers" else {}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@dataclass
class Usage:
    pss_kb: int = 0
    rss_kb: int = 0
    processes: int = 0
    cpu_ticks: int = 0

    def add(self, pid: int) -> None:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:]}
        self.pss_kb += fields["Pss"]
        self.rss_kb += fields["Rss"]
        self.processes += 1
        self.cpu_ticks += cpu_ticks(pid)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def hctx_processes(wrapper: int) -> list[int]:
    """The wrapper and what hctx started under it (its sidecar; a wrapped seat's keeper, the shell
    whose $0 is `hctx-keeper`), not the stand-in harness's tree."""
    ours = ("-m sidecar", " hctx-keeper ")
    return [wrapper, *(child for child in children(wrapper) if any(mark in command(child) for mark in ours))]


@dataclass
class Seat:
    harness: str
    process: subprocess.Popen[bytes]  # the wrapper; an adopted seat's: the stand-in harness it adopted
    catalog: Path
    name: str
    host: str = "bench"

    def log(self) -> Path:
        return self.catalog / ".st2" / "logs" / f"{self.host}~{self.name}.jsonl"

    def wrapper(self) -> int:
        """The wrapper's pid: an adopted seat's resident is the one its claim names."""
        if self.harness != "adopted":
            return self.process.pid
        with contextlib.suppress(OSError, ValueError, KeyError):
            claim = self.catalog / "agents" / self.host / self.name / "harness-state"
            return int(json.loads(claim.read_text())["wrapperPid"])
        return 0

    def ready(self) -> bool:
        log, wrapper = self.log(), self.wrapper()
        return log.exists() and b'"event": "start"' in log.read_bytes() and len(hctx_processes(wrapper)) > 1


def opencode_program(bin_dir: Path) -> Path:
    program = bin_dir / "opencode"
    program.write_text(f"#!{sys.executable}\n{OPENCODE}")
    program.chmod(0o755)
    return program


def start_seat(harness: str, n: int, work: Path, env: dict[str, str], program: Path) -> Seat:
    cwd = work / f"{harness}-{n}"
    cwd.mkdir()
    catalog = work / "catalog"
    name = f"{harness}-{n}"
    if harness == "adopted":  # a plain session, then what Claude's tee runs on its first call
        plain = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, cwd=cwd, start_new_session=True)
        adopt = ["--harness", "claude", "--pid", str(plain.pid)]
        subprocess.run([sys.executable, "-I", "-c", ADOPT, *adopt], env=env | {"HCTX_CATALOG": str(catalog)},
                       check=True)  # fmt: skip
        return Seat(harness, plain, catalog, name, default_host())
    stand_in = [str(program), "serve"] if harness == "opencode" else [sys.executable, "-c", SLEEPER]
    argv = [sys.executable, "-m", "wrapper.cli", "wrap", "--agent", name, "--harness", harness,
            "--catalog", str(catalog), "--host", "bench", "--", *stand_in]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    return Seat(harness, process, catalog, name)


def wait_ready(seats: list[Seat], work: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(seat.ready() for seat in seats):
        dead = [seat.name for seat in seats if seat.process.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"seats not up: {dead or [s.name for s in seats if not s.ready()]}; see {work}")
        time.sleep(0.2)
    died = [seat.name for seat in seats if b"sidecar-died" in seat.log().read_bytes()]
    if died:
        raise RuntimeError(f"a sidecar died: {died}; see {work}")


def stop(baseline: list[subprocess.Popen[bytes]], seats: list[Seat]) -> None:
    """What this run started, and only that: the bare processes killed, every wrapper told SIGTERM
    at once (it stops its harness and sidecar), any left after a shared deadline SIGKILLed (its
    sidecar then ends the harness's group). An adopted seat's stand-in is told SIGTERM: its
    resident sees it exit and ends its sidecar and itself."""
    for process in baseline:
        process.kill()
    residents = [seat.wrapper() for seat in seats if seat.harness == "adopted"]
    for seat in seats:
        with contextlib.suppress(ProcessLookupError):
            seat.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for seat in seats:
        try:
            seat.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            seat.process.kill()
    for process in [*baseline, *(seat.process for seat in seats)]:
        process.wait()
    deadline = time.monotonic() + 30
    while any(pid and Path(f"/proc/{pid}").exists() for pid in residents) and time.monotonic() < deadline:
        time.sleep(0.1)


@contextlib.contextmanager
def fleet(seats: int, harnesses: list[str]) -> Iterator[tuple[dict[str, list[Seat]], list[subprocess.Popen[bytes]]]]:
    work = Path(tempfile.mkdtemp(prefix="hctx-footprint-"))
    keep = False
    env = os.environ | {"PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(work)}  # adoptions' channels in here
    (work / "bin").mkdir()
    program = opencode_program(work / "bin")
    fleets: dict[str, list[Seat]] = {harness: [] for harness in harnesses}
    baseline: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(seats):  # interleaved, so a drifting machine drifts for all rows alike
            baseline.append(subprocess.Popen([sys.executable, "-c", BASELINE], env=env, start_new_session=True))
            started = [start_seat(harness, n, work, env, program) for harness in harnesses]
            for seat in started:
                fleets[seat.harness].append(seat)
            wait_ready(started, work)  # a few at a time: a machine that starts 150 Pythons at once stalls
        every = [seat for group in fleets.values() for seat in group]
        wait_ready(every, work)
        time.sleep(SETTLE_S)  # imports done, first pulls made: the steady state
        yield fleets, baseline
    except BaseException:
        keep = True  # what went wrong stays readable in the logs
        raise
    finally:
        stop(baseline, [seat for group in fleets.values() for seat in group])
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def measure(seats: int, harnesses: list[str], idle_s: float) -> list[tuple[str, int, Usage, float]]:
    """Per harness and for the baseline: the usage per agent and idle CPU in % of a core per agent."""
    with fleet(seats, harnesses) as (fleets, baseline):
        groups = {harness: [hctx_processes(seat.wrapper()) for seat in fleets[harness]] for harness in harnesses}
        groups["bare trio"] = [[process.pid] for process in baseline]
        before = {name: sum(cpu_ticks(pid) for pids in group for pid in pids) for name, group in groups.items()}
        started = time.monotonic()
        time.sleep(idle_s)
        elapsed = time.monotonic() - started
        rows = []
        for name, group in groups.items():
            usage = Usage()
            for pids in group:
                for pid in pids:
                    usage.add(pid)
            idle = (usage.cpu_ticks - before[name]) / CLOCK_TICKS / elapsed * 100 / len(group)
            rows.append((name, len(group), usage, idle))
        return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seats", type=int, nargs="+", default=[10], help="seats per harness; one run per value")
    parser.add_argument("--idle", type=float, default=60.0, help="idle CPU window in seconds")
    parser.add_argument("--only", nargs="+", choices=list(TARGETS), default=list(TARGETS), help="these harnesses")
    parser.add_argument("--check", action="store_true", help="exit 1 when a row misses its target")
    args = parser.parse_args()
    missed: list[str] = []
    row = "{:>5} {:<9} {:>9} {:>6} {:>9} {:>6} {:>6} {:>9} {:>7}  {}"
    print(row.format("seats", "harness", "PSS MB", "ratio", "RSS MB", "ratio", "procs", "idle CPU%", "target", ""))
    for seats in args.seats:
        rows = measure(seats, args.only, args.idle)
        base = next(usage for name, _, usage, _ in rows if name == "bare trio")
        base_pss, base_rss = base.pss_kb / seats, base.rss_kb / seats
        for name, count, usage, idle in rows:
            pss, rss = usage.pss_kb / count, usage.rss_kb / count
            verdict, target = "", ""
            if name in TARGETS:
                ok = pss / base_pss <= TARGETS[name] and idle <= IDLE_CPU_TARGET
                verdict = "pass" if ok else "FAIL"
                target = f"<= {TARGETS[name]:.1f}x"
                if not ok:
                    missed.append(f"{name} at {seats}")
            print(row.format(seats, name, f"{pss / 1024:.1f}", f"{pss / base_pss:.2f}", f"{rss / 1024:.1f}",
                             f"{rss / base_rss:.2f}", f"{usage.processes / count:.1f}", f"{idle:.3f}", target,
                             verdict))  # fmt: skip
    print("per agent: the wrapper, its sidecar and a wrapped seat's keeper (the stand-in harness excluded); "
          f"idle CPU over {args.idle:g} s, % of one core; targets: PSS ratio as shown, "
          f"idle CPU <= {IDLE_CPU_TARGET} %")  # fmt: skip
    if missed:
        print(f"target missed: {', '.join(missed)}")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
