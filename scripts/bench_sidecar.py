#!/usr/bin/env python3
"""Sidecar footprint, each number against a baseline measured in the same run.

Default (issue 14): RSS of the real sidecar (`python -m sidecar`, started the way `hctx wrap` starts
it: lifeline and ready pipes, a transport config) per harness, once it signalled ready and again
after a few of a fixture's frames went over its channel, against a bare `python -c "import trio"`
that signalled ready the same way. The median of --repeat runs; ratio = sidecar / baseline.
The OpenCode and Codex-relay transports run against 127.0.0.1 sockets that listen and never answer,
so their modules and libraries really load. Only 127.0.0.1 and a temp dir are used; only the
processes started here are stopped.

  targets: <= 33 MB after start for pi and Claude, <= 38 MB for every harness

--speed (issue 3, pi only):
  RSS after start, and after 100,000 frames   vs a bare `python -c 'sleep'` process
  idle CPU over --idle seconds (default 60)    vs that same bare process
  frame -> record latency p50 / p99            vs a unix-socket echo round trip to a bare process
  targets: RSS < 40 MB, idle CPU < 0.1 %, p99 latency < 5 ms.

Usage: python scripts/bench_sidecar.py [--repeat N] [--only NAME ...] [--check]
       python scripts/bench_sidecar.py --speed [--idle SECONDS] [--frames N] [--samples N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ECHO = (
    "import os, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)\n"
    "c, _ = s.accept()\n"
    "while data := c.recv(65536): c.sendall(data)\n"
)
# The baseline: trio imported, then the same ready / lifeline handshake as the sidecar.
BASELINE = "import os, sys, trio\nos.write(int(sys.argv[1]), b'ready\\n')\nwhile os.read(int(sys.argv[2]), 1): pass\n"
START_TIMEOUT_S = 20.0
SETTLE_S = 0.5  # after ready: the transport task starts beside the channel
FIXTURES = REPO / "fixtures"
FRAMES_FED = 50


@dataclass(frozen=True)
class Case:
    name: str
    harness: str
    target_mb: float
    fixture: str  # a recording of channel frames, decoded by the harness's own module


CASES = (
    Case("claude", "claude", 33.0, "claude/statusline-2.1.332-sonnet45.rec"),
    Case("codex-stdio", "codex", 38.0, "codex/codex-0.171.0-stdio-main.rec"),
    Case("codex-relay", "codex", 38.0, "codex/codex-0.171.0-ws-main.rec"),
    Case("codex-rollout", "codex", 38.0, "codex/codex-0.171.0-stdio-main.rec"),
    Case("pi", "pi", 33.0, "pi/live/pi-1.6.0.channel.rec"),
    Case("omp", "omp", 38.0, "pi/live/omp-18.2.3.channel.rec"),
    Case("opencode", "opencode", 38.0, "opencode/v1.18.33/events.rec"),
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
            for _ in range(1000):  # the path exists from bind(); connect() is refused until listen()
                try:
                    client.connect(str(path))
                    break
                except ConnectionRefusedError:
                    time.sleep(0.005)
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


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A 127.0.0.1 port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def transport_wire(case: Case, work: Path, upstream_port: int) -> dict[str, Any]:
    if case.name == "codex-relay":
        return {
            "mode": "relay",
            "listen": f"ws://127.0.0.1:{free_port()}",
            "upstream": f"ws://127.0.0.1:{upstream_port}",
        }
    if case.name == "codex-rollout":
        home = work / "codex-home"
        home.mkdir(exist_ok=True)
        return {"mode": "rollout", "codexHome": str(home), "cwd": str(work), "startedAtMs": time.time_ns() // 10**6,
                "rootPid": os.getpid()}  # fmt: skip
    if case.name == "codex-stdio":
        return {"mode": "channel"}
    if case.name == "opencode":
        return {"base_url": f"http://127.0.0.1:{upstream_port}"}
    return {}


def fixture_frames(case: Case) -> list[bytes]:
    """The first FRAMES_FED frames of the case's recording (fixtures/recordings/) as the channel
    carries them: Claude's status lines in the tee's envelope, pi's and omp's extension frames as
    they are, Codex's stdout lines in the envelope the wrapper's tap puts them in, and OpenCode's
    event objects (its channel takes them as the SSE stream carries them)."""
    from sidecar.harnesses.codex.producer import tap_frame
    from sidecar.replay import read_chunks

    lines: list[bytes] = []
    for chunk in read_chunks((FIXTURES / "recordings" / case.fixture).read_bytes()):
        for line in chunk.data.splitlines():
            if chunk.wire == "sse":  # OpenCode's events: the channel takes each event's data whole
                line = line.removeprefix(b"data: ") if line.startswith(b"data: ") else b""
            if line.strip():
                lines.append((tap_frame(line) if chunk.wire == "stdout" else line) + b"\n")
    return lines[:FRAMES_FED]


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    lifeline: int


def start(argv: list[str], env: dict[str, str], cwd: Path, ready_read: int, keep: tuple[int, ...]) -> Started:
    """Start with a ready pipe and a lifeline; return once `ready` came (or raise, after stopping it)."""
    lifeline_read, lifeline_write = os.pipe()
    argv = [part.replace("{LIFELINE}", str(lifeline_read)) for part in argv]
    process = subprocess.Popen(argv, env=env, cwd=cwd, pass_fds=(lifeline_read, *keep), process_group=0)
    os.close(lifeline_read)
    for fd in keep:
        os.close(fd)
    started = Started(process, lifeline_write)
    try:
        wait_ready(ready_read, process)
    except BaseException:
        stop(started)
        raise
    return started


def wait_ready(fd: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    data = b""
    try:
        os.set_blocking(fd, False)
        while not data.endswith(b"ready\n"):
            if process.poll() is not None:
                raise RuntimeError(f"exited with {process.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError("not ready in time")
            try:
                chunk = os.read(fd, 16)
            except BlockingIOError:
                time.sleep(0.005)
                continue
            if not chunk:
                raise RuntimeError("closed its ready pipe without saying ready")
            data += chunk
    finally:
        os.close(fd)


def stop(started: Started) -> None:
    """Close the lifeline (the sidecar exits on its own); kill this one process if it lingers."""
    with contextlib.suppress(OSError):
        os.close(started.lifeline)
    try:
        started.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        started.process.kill()
        started.process.wait()


def feed(channel: Path, lines: list[bytes], record: Path) -> bool:
    """Send the lines; True once they made the sidecar write the agent's record."""
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(channel))
        client.sendall(b"".join(lines))
        deadline = time.monotonic() + 3.0
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(SETTLE_S)
    return record.exists()


def measure_sidecar(case: Case, work: Path, env: dict[str, str], frames: list[bytes]) -> tuple[float, float, bool]:
    """RSS after ready, and after `frames` went over the channel; whether they made a record."""
    run = Path(tempfile.mkdtemp(prefix=f"{case.name}-", dir=work))
    catalog, channel = run / "catalog", run / "ch"
    with silent_listener() as upstream_port:
        config = transport_wire(case, run, upstream_port)
        ready_read, ready_write = os.pipe()
        argv = [sys.executable, "-m", "sidecar", "--harness", case.harness, "--catalog", str(catalog),
                "--host", "bench", "--agent", "a", "--incarnation", "bench", "--channel", str(channel),
                "--lifeline-fd", "{LIFELINE}", "--ready-fd", str(ready_write),
                "--transport", json.dumps(config)]  # fmt: skip
        started = start(argv, env, run, ready_read, (ready_write,))
        try:
            if case.name == "codex-relay":  # the relay listens: its module and libraries are loaded
                wait_listening(config["listen"])
            time.sleep(SETTLE_S)
            after_start = rss_mb(started.process.pid)
            wrote = feed(channel, frames, catalog / "agents" / "bench" / "a" / "harness-context")
            after_frames = rss_mb(started.process.pid)
        finally:
            stop(started)
    if started.process.returncode != 0:
        raise RuntimeError(
            f"{case.name}: the sidecar exited with {started.process.returncode}; see {catalog}/.st2/logs"
        )
    shutil.rmtree(run, ignore_errors=True)
    return after_start, after_frames, wrote


def wait_listening(url: str) -> None:
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the relay never listened on {url}") from None
            time.sleep(0.01)


def measure_baseline(work: Path, env: dict[str, str]) -> float:
    ready_read, ready_write = os.pipe()
    argv = [sys.executable, "-c", BASELINE, str(ready_write), "{LIFELINE}"]
    started = start(argv, env, work, ready_read, (ready_write,))
    try:
        time.sleep(SETTLE_S)
        return rss_mb(started.process.pid)
    finally:
        stop(started)


def footprint(args: argparse.Namespace) -> int:
    cases = [case for case in CASES if not args.only or case.name in args.only]
    work = Path(tempfile.mkdtemp(prefix="hctx-bench-"))
    env = os.environ | {"PYTHONPATH": str(REPO)}
    frames = {case.name: fixture_frames(case) for case in cases}
    baseline: list[float] = []
    starts: dict[str, list[float]] = {case.name: [] for case in cases}
    fed: dict[str, list[float]] = {case.name: [] for case in cases}
    wrote: dict[str, bool] = {}
    try:
        for _ in range(args.repeat):  # interleaved, so a drifting machine drifts for all rows alike
            baseline.append(measure_baseline(work, env))
            for case in cases:
                after_start, after_frames, record = measure_sidecar(case, work, env, frames[case.name])
                starts[case.name].append(after_start)
                fed[case.name].append(after_frames)
                wrote[case.name] = wrote.get(case.name, True) and record
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(baseline)
    print(f"RSS in MB, median of {args.repeat}; ratio: to the baseline; fed: after {FRAMES_FED} fixture frames")
    row = "{:<14} {:>7} {:>6} {:>7} {:>5} {:>7} {:>6} {:>6}"
    print(row.format("harness", "start", "ratio", "target", "", "fed", "ratio", "record"))
    missed = []
    for case in cases:
        value, after = statistics.median(starts[case.name]), statistics.median(fed[case.name])
        ok = value <= case.target_mb
        if not ok:
            missed.append(case.name)
        target, verdict = f"<= {case.target_mb:.0f}", "pass" if ok else "FAIL"
        made = "yes" if wrote[case.name] else "no"
        print(row.format(case.name, f"{value:.1f}", f"{value / base:.2f}", target, verdict, f"{after:.1f}",
                         f"{after / base:.2f}", made))  # fmt: skip
    print(row.format("baseline", f"{base:.1f}", "1.00", "", "", "", "", ""))
    print("record: whether the fed frames made the sidecar write the agent's record (every run)")
    print("baseline: python -c 'import trio', ready and lifeline pipes like the sidecar's")
    if missed:
        print(f"target missed: {', '.join(missed)}")
    return 1 if missed and args.check else 0


def speed(args: argparse.Namespace) -> int:
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
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'measure':<34} {'sidecar':>10} {'baseline':>10} {'ratio':>8}  target")
    for name, value, base, target in rows:
        ratio = f"{value / base:8.2f}" if base else "       -"
        print(f"{name:<34} {value:>10.3f} {base:>10.3f} {ratio}  {target}")
    print("baseline: a bare python process (RSS, CPU); a unix-socket echo round trip (latency)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per harness; the median is shown")
    parser.add_argument("--only", nargs="+", choices=[case.name for case in CASES], help="these rows only")
    parser.add_argument("--check", action="store_true", help="exit 1 when a row misses its target")
    parser.add_argument("--speed", action="store_true", help="issue 3's pi measures instead (see above)")
    parser.add_argument("--idle", type=float, default=60.0, help="--speed: idle CPU window in seconds")
    parser.add_argument("--frames", type=int, default=100_000, help="--speed: frames in the burst")
    parser.add_argument("--samples", type=int, default=500, help="--speed: latency samples")
    args = parser.parse_args()
    return speed(args) if args.speed else footprint(args)


if __name__ == "__main__":
    sys.exit(main())
