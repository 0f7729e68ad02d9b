#!/usr/bin/env python3
"""`hctx web` under load, as ratios against `hctx agents --json` measured in the same run.

One catalog (bench_roster.py's: one record and one claim per agent), one `hctx web` serving it:

- `agents --json`: the whole process, median wall time: the baseline the times are divided by;
- idle: a new page (GET / to its last byte: the page carries the whole snapshot) and one
  `/api/agents`, with nothing else going on;
- loaded: `--streams` event streams open and read (a process of their own) while `--writes`
  records a second are replaced (as the sidecar replaces them): a new page, and a replaced record
  to its `rows` event on one more stream (p50, p99);
- `--concurrent` `/api/agents` at once: the slowest, and the server's memory after;
- `--silent` streams that never read: the server's memory per such page while they are held, and
  how long until the write timeout drops them.

Targets (issue 40): a new page and write -> event p99 within 1 s at 10,000 agents under 100
writes/s with 1,000 open streams.

Usage: scripts/bench_board.py [--agents 10000] [--streams 1000] [--writes 100] [--samples 40]
       [--concurrent 50] [--silent 100] [--write-timeout 5] [--identity]

The streams ask for gzip, as every browser does (`--identity`: they do not).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import ENV, agent_dirs, free_port, process_cpu_ms, replace_record, run_process
from bench_roster import REPO, build_catalog

# The reading pages: one process holding `argv[2]` streams, reading and dropping what they are sent.
READERS = r"""
import selectors, socket, sys
port, count, since, accept = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
pick = selectors.DefaultSelector()
closed = 0

def read(timeout):
    for key, _ in pick.select(timeout):
        try:
            data = key.fileobj.recv(1 << 20)
        except BlockingIOError:
            continue
        except ConnectionError:
            data = b""
        if not data:
            pick.unregister(key.fileobj)
            global closed
            closed += 1

for _ in range(count):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"GET /api/events?since={since} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{accept}\r\n".encode())
    sock.setblocking(False)
    pick.register(sock, selectors.EVENT_READ)
    read(0)  # the pages opened so far read on while the others open
print(f"open {closed}", flush=True)
while True:
    read(None)
"""


def status(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=60) as answer:
        found: dict[str, object] = json.loads(answer.read())
        return found


def timed_get(port: int, path: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as answer:
        body = answer.read()
    return (time.perf_counter() - started) * 1000, body


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")  # every sample missed: said below
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


class Probe:
    """One more fleet stream, read in a thread: when each awaited `usedTokens` figure arrived
    (unpacked first when the stream is gzip, as a browser unpacks it)."""

    def __init__(self, port: int, since: str, gzip: bool) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port)
        self.connection.request("GET", f"/api/events?since={since}", headers=accept_header(gzip))
        self.answer = self.connection.getresponse()
        self.unpack = zlib.decompressobj(16 + zlib.MAX_WBITS) if self.answer.getheader("content-encoding") else None
        if gzip != (self.unpack is not None):
            raise SystemExit(f"gzip asked: {gzip}; the stream: {self.answer.getheader('content-encoding')}")
        self.seen: dict[int, float] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def close(self) -> None:
        self.connection.close()

    def _read(self) -> None:
        tail = b""
        while True:
            try:
                data = self.answer.read1(1 << 20)
            except (OSError, ValueError, AttributeError, http.client.HTTPException):  # closed by the benchmark
                return
            if not data:
                return
            now = time.time()
            if self.unpack is not None:
                data = self.unpack.decompress(data)
            found = re.findall(rb'"usedTokens": (\d+)', tail + data)
            with self.lock:
                for figure in found:
                    self.seen.setdefault(int(figure), now)
            tail = data[-64:]

    def when(self, figure: int, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if figure in self.seen:
                    return self.seen[figure]
            time.sleep(0.002)
        return None


def accept_header(gzip: bool) -> dict[str, str]:
    """What a browser asks for (every one takes gzip), or nothing (`--identity`)."""
    return {"Accept-Encoding": "gzip, deflate, br"} if gzip else {}


def writer(directories: list[Path], per_second: int, stop: threading.Event, counter: list[int]) -> None:
    pick = random.Random(7)
    period = 1 / per_second
    due = time.monotonic()
    while not stop.is_set():
        replace_record(pick.choice(directories), pick.choice((12.5, 44.0, 71.5, 88.0)))
        counter[0] += 1
        due += period
        time.sleep(max(0.0, due - time.monotonic()))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--silent", type=int, default=100)
    parser.add_argument("--write-timeout", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--identity", action="store_true", help="streams that do not take gzip (a browser does)")
    parser.add_argument("--profile", metavar="PATH", help="run the server under cProfile, its stats written here")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.streams + args.silent + 512)), hard))

    with tempfile.TemporaryDirectory(prefix="hctx-bench-board-") as scratch:
        catalog = Path(scratch) / "catalog"
        build_catalog(catalog, args.agents, time.time_ns() // 1_000_000)
        directories = agent_dirs(catalog, args.agents)
        probe_dir, directories = directories[-1], directories[:-1]
        base, _ = run_process([sys.executable, "-m", "wrapper.cli", "agents", "--json", "--host", "alpha",
                               "--catalog", str(catalog)], args.repeat)  # fmt: skip

        port = free_port()
        profiled = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        server = subprocess.Popen(
            [sys.executable, *profiled, "-m", "wrapper.cli", "web", "--catalog", str(catalog), "--host", "alpha",
             "--listen", f"127.0.0.1:{port}", "--write-timeout", str(args.write_timeout)],
            env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        readers: subprocess.Popen[str] | None = None
        stop = threading.Event()
        try:
            assert server.stdout is not None
            if not server.stdout.readline().startswith("http://"):
                raise SystemExit("hctx web did not start")
            print("serving; idle figures", file=sys.stderr, flush=True)
            idle_page = min(timed_get(port, "/")[0] for _ in range(args.pages))
            page_bytes = len(timed_get(port, "/")[1])
            idle_agents = min(timed_get(port, "/api/agents")[0] for _ in range(args.pages))
            idle_rss = rss_mb(server.pid)

            # The pages open before the writes start, each holding the current snapshot.
            _, board = timed_get(port, "/api/board")
            since = str(json.loads(board)["version"])
            accept = "".join(f"{name}: {value}\r\n" for name, value in accept_header(not args.identity).items())
            readers = subprocess.Popen([sys.executable, "-c", READERS, str(port), str(args.streams), since, accept],
                                       stdout=subprocess.PIPE, text=True)  # fmt: skip
            assert readers.stdout is not None
            opened = readers.stdout.readline().split()
            if opened[:1] != ["open"]:
                raise SystemExit("the reading pages did not open")
            if opened[1] != "0":
                print(f"{opened[1]} streams closed by the server while the pages opened", file=sys.stderr)
            probe = Probe(port, since, not args.identity)
            deadline = time.monotonic() + 120
            while status(port)["streams"] != args.streams + 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            print(f"{status(port)['streams']} streams open; writing", file=sys.stderr, flush=True)
            written = [0]
            threading.Thread(target=writer, args=(directories, args.writes, stop, written), daemon=True).start()
            time.sleep(3)  # the writes under way
            cpu_before, wall_before, written_before = process_cpu_ms(server.pid), time.perf_counter(), written[0]
            pages = [timed_get(port, "/")[0] for _ in range(args.pages)]
            latencies, missed = [], 0
            for sample in range(args.samples):
                percent = 50.0 + (sample + 1) / 1000
                figure = int(percent * 2584)
                started = time.time()
                replace_record(probe_dir, percent)
                seen = probe.when(figure, timeout=10)
                if seen is None:
                    missed += 1
                else:
                    latencies.append((seen - started) * 1000)
                time.sleep(random.uniform(0.1, 0.4))
            loaded_cpu = (process_cpu_ms(server.pid) - cpu_before) / ((time.perf_counter() - wall_before) * 1000)
            rate = (written[0] - written_before) / (time.perf_counter() - wall_before)
            loaded_rss = rss_mb(server.pid)
            open_streams = status(port)["streams"]
            stop.set()

            print(f"latency samples done ({missed} missed); concurrent /api/agents", file=sys.stderr, flush=True)
            with ThreadPoolExecutor(args.concurrent) as pool:
                started = time.perf_counter()
                answers = list(pool.map(lambda _: timed_get(port, "/api/agents"), range(args.concurrent)))
                burst = (time.perf_counter() - started) * 1000
            whole = sum(len(json.loads(body)) == args.agents for _, body in answers)
            burst_rss = rss_mb(server.pid)

            readers.send_signal(signal.SIGTERM)
            readers.wait(30)
            readers = None
            probe.close()
            time.sleep(1)
            before_silent = rss_mb(server.pid)
            silent = []
            for _ in range(args.silent):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                silent.append(sock)
            time.sleep(2)
            held = (rss_mb(server.pid) - before_silent) / args.silent
            started = time.monotonic()
            while status(port)["streams"] and time.monotonic() - started < 120:
                time.sleep(0.2)
            dropped = time.monotonic() - started + 2
            left = status(port)["streams"]
            for sock in silent:
                sock.close()
        finally:
            stop.set()
            if readers is not None:
                readers.kill()
            server.terminate()
            _, stderr = server.communicate(timeout=30)

    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    print(
        f"{args.agents} agents; `hctx agents --json` {base:.0f} ms (the baseline); a page is {page_bytes / 1e6:.1f} MB;"
        f" streams {'identity' if args.identity else 'gzip (as a browser asks)'}"
    )
    print()
    print("| measured | ms | over `agents --json` |")
    print("|---|---:|---:|")
    rows = [
        ("new page, idle", idle_page),
        ("`/api/agents`, idle", idle_agents),
        (f"new page, {args.streams} streams open, {rate:.0f} writes/s (median)", statistics.median(pages)),
        ("  the slowest of them", max(pages)),
        ("write -> event on a page, p50", p50),
        ("write -> event on a page, p99", p99),
        (f"{args.concurrent} concurrent `/api/agents`, the last answered", burst),
    ]
    for name, ms in rows:
        print(f"| {name} | {ms:.0f} | {ms / base:.2f}x |")
    print()
    print(f"streams open under load: {open_streams}; events missed: {missed} of {args.samples}; "
          f"server CPU under load {loaded_cpu:.2f} cores")  # fmt: skip
    print(f"server RSS: idle {idle_rss:.0f} MB, under load {loaded_rss:.0f} MB "
          f"({(loaded_rss - idle_rss) * 1024 / args.streams:.0f} KB per open stream), after the burst "
          f"{burst_rss:.0f} MB; {whole} of {args.concurrent} answers whole")  # fmt: skip
    print(f"{args.silent} pages that never read: {held * 1024:.0f} KB each while held; all dropped within "
          f"{dropped:.1f} s (write timeout {args.write_timeout:g} s), {left} left")  # fmt: skip
    tracebacks = stderr.count("Traceback")
    print(f"stderr: {len(stderr.splitlines())} lines, {tracebacks} tracebacks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
