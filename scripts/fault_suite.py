#!/usr/bin/env python3
"""Issue 15's fault campaign, repeated: one function per fault, one row of the table each.

    FAULT                    TRIED SURVIVED LOST TORN FABRICATED OUTSIDE  MEASURED
    sigkill-mid-write          220      220    0    0          0       0  ...

- TRIED      injections made (kills, frames refused by a full disk, held connections, ...)
- SURVIVED   injections after which the sidecar (or wrapper) was still serving, or was served again
- LOST       readings owed that never landed (the newest reading after the fault, above all)
- TORN       record reads that did not parse
- FABRICATED records carrying a number no frame sent
- OUTSIDE    files changed or created outside what hctx owns (a symlink's target, a victim file)
- MEASURED   the figure the fault is about (peak RSS, latency, bytes outside the catalog, ...)

A row passes when SURVIVED == TRIED, LOST == TORN == FABRICATED == OUTSIDE == 0 and its own bound holds
(`Row.failed` says which did not). `--scale full` repeats the campaign's figures (220 kills, 150
1 MiB frames, 20,000-frame bursts, 2,000 held connections); `--scale ci` (the default, run by
`tests/test_fault_suite.py` under the `fault` marker) keeps each row to seconds.

Adding a row: a function `(work: Path, scale: Scale) -> Row` (or a list of rows) decorated with
`@fault("name")`. The wrapper's rows (points 3, 7, 8, 9) are the `wrapper-*`, `two-wrappers-*`,
`sigkill-wrapper-*` and `full-disk-exit-status` rows below; issue 26's (the newer surfaces: Claude's
project files, watch, takeover, the Codex seat, hostile local files, --exec's children, the
.stignore) are the rows after them; issue 40's (a recording redacted, held by descriptor, on a full
disk; a subagent that is the agent; labels, readers' unprintables, the newest subagents) the last.
Usage: python scripts/fault_suite.py [--scale ci|full] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import trio  # noqa: E402

from guard.catalog import RACY_NS  # noqa: E402
from guard.errors import RecordRefused  # noqa: E402
from guard.layout import AgentDir, log_path  # noqa: E402
from guard.record import HarnessContext, parse_record  # noqa: E402

Scale = Literal["ci", "full"]
HOST = "faulthost"
RSS_BOUND_MB = 200
# A liveness bound, as tests/test_sidecar_faults.py's: the frame queues behind 2,000 connections in
# the listen backlog, each accepted (most an eviction, logged) before it; a loaded 2-core machine took
# up to 5.6 s (132 ms idle). A channel that stopped accepting while full would keep it out for a
# silent cut (sidecar.channel.SILENT_TIMEOUT_S, 10 s) or more.
HELD_FRAME_LATENCY_S = 9.0
# What a loaded machine may add, past the keeper's SIGKILL at HARNESS_KILL_DEADLINE_S, before the
# harness is seen gone (the rows catch a harness never ended; the time is measured, not bounded).
KILL_SLACK_S = 10.0


@dataclass
class Row:
    fault: str
    tried: int
    survived: int
    lost: int = 0
    torn: int = 0
    fabricated: int = 0
    measured: str = ""
    failed: str | None = None  # a row-specific bound that did not hold
    outside: int = 0

    @property
    def ok(self) -> bool:
        clean = not (self.lost or self.torn or self.fabricated or self.outside)
        return self.failed is None and self.survived == self.tried and clean


Fault = Callable[[Path, Scale], "Row | list[Row]"]
FAULTS: dict[str, Fault] = {}


def fault(name: str) -> Callable[[Fault], Fault]:
    def register(function: Fault) -> Fault:
        FAULTS[name] = function
        return function

    return register


def pick(scale: Scale, *, ci: int, full: int) -> int:
    return full if scale == "full" else ci


# --- a real sidecar -----------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": str(REPO) if not path else f"{REPO}{os.pathsep}{path}"}


class Sidecar:
    """`python -m sidecar` for a pi agent, its channel in a private directory, its lifeline held.
    `start` again after `kill` is the restart the wrapper makes: the same arguments, the same channel."""

    def __init__(
        self, catalog: Path, agent: str, *, host: str = HOST, record_fd: int | None = None, **popen: Any
    ) -> None:
        self.catalog, self.agent, self.host = catalog, agent, host
        self.directory = Path(tempfile.mkdtemp(prefix="hctx-fault-"))
        self.channel = self.directory / "ch"
        self.argv = [
            *(sys.executable, "-m", "sidecar", "--harness", "pi", "--catalog", str(catalog), "--host", host),
            *("--agent", agent, "--incarnation", "inc", "--channel", str(self.channel)),
            *(() if record_fd is None else ("--record-fd", str(record_fd))),
        ]
        self.keep = () if record_fd is None else (record_fd,)
        self.popen = popen
        self.process: subprocess.Popen[bytes] | None = None
        self.lifeline: int | None = None

    def start(self) -> Sidecar:
        read, self.lifeline = os.pipe()
        self.process = subprocess.Popen(
            [*self.argv, "--lifeline-fd", str(read)], env=child_env(), pass_fds=(read, *self.keep), **self.popen
        )
        os.close(read)
        wait_for(self.listening, what="the channel")
        return self

    def listening(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"sidecar exited {self.process.returncode}")
        try:
            send(self.channel, b"")
        except OSError:
            return False
        return True

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 20) -> int:
        assert self.process is not None and self.lifeline is not None
        os.close(self.lifeline)
        self.lifeline = None
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        assert self.process is not None and self.lifeline is not None
        self.process.kill()
        self.process.wait()
        os.close(self.lifeline)
        self.lifeline = None

    def record(self) -> HarnessContext | None:
        try:
            data = AgentDir(self.catalog, self.host, self.agent).context_path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_record(data)

    def wait_percent(self, percent: float, timeout: float = 10.0) -> HarnessContext | None:
        """The record once it reads `percent`; None if it did not within `timeout`."""
        with contextlib.suppress(TimeoutError):
            found: HarnessContext = wait_for(
                lambda: (r := self.record()) is not None and r.used_percent == percent and r, timeout=timeout
            )
            return found
        return None

    def close(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait()
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def running(catalog: Path, agent: str, **kwargs: Any) -> Iterator[Sidecar]:
    sidecar = Sidecar(catalog, agent, **kwargs)
    try:
        yield sidecar.start()
    finally:
        sidecar.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def send(path: Path, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        client.sendall(data)


def frame(percent: float, window: int = 100_000) -> bytes:
    tokens = int(window * percent / 100)
    reading = {"tokens": tokens, "contextWindow": window, "percent": percent, "model": "m", "costUsd": None}
    return json.dumps({"type": "context", "reading": reading, "compaction": None}).encode() + b"\n"


def alternating(count: int) -> bytes:
    """`count` frames, each in another 1% bucket than the one before: every one owes a write."""
    return b"".join(frame(10.0 if i % 2 else 60.0) for i in range(count))


def fabricated(record: HarnessContext | None, sent: set[float]) -> int:
    """1 when the record carries a percent no frame sent, or tokens that do not match it."""
    if record is None:
        return 0
    percent = record.used_percent
    return int(percent not in sent or record.used_tokens != int(100_000 * (percent or 0) / 100))


def log_events(catalog: Path, agent: str, host: str = HOST) -> list[dict[str, Any]]:
    path = log_path(catalog, host, agent)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Reads:
    """Reads of the record, as a foreign reader would make them, counting torn and fabricated."""

    sidecar: Sidecar
    sent: set[float]
    reads: int = 0
    torn: int = 0
    fabricated: int = 0

    def once(self) -> None:
        try:
            record = self.sidecar.record()
        except RecordRefused:
            self.torn += 1
            return
        self.reads += 1
        self.fabricated += fabricated(record, self.sent)

    def during(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.once()


# --- the sidecar's faults -----------------------------------------------------------------------


@fault("sigkill-mid-write")
def sigkill_mid_write(work: Path, scale: Scale) -> Row:
    """SIGKILL the sidecar at a random moment of a stream of writes, start it again with the same
    arguments (the wrapper's restart), and read the record all along."""
    kills = pick(scale, ci=12, full=220)
    sidecar = Sidecar(work, "killed")
    sent = {10.0, 60.0} | {float(n) for n in range(1, kills + 2)}
    reader = Reads(sidecar, sent)
    survived = lost = mid_write = 0
    staging = work / ".st2" / "harness-context-staging"
    try:
        sidecar.start()
        for n in range(1, kills + 1):
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(sidecar.channel))
                client.sendall(alternating(200) + frame(float(n)))
                reader.during(random.uniform(0.0, 0.05))
                sidecar.kill()
            mid_write += bool(list(staging.iterdir())) if staging.exists() else 0  # a staged file left behind
            reader.during(0.01)
            sidecar.start()
            send(sidecar.channel, frame(float(n + 1)))
            if sidecar.wait_percent(float(n + 1)) is not None:
                survived += 1
            else:
                lost += 1
        sidecar.stop()
    finally:
        sidecar.close()
    return Row("sigkill-mid-write", kills, survived, lost, reader.torn, reader.fabricated,
               f"{reader.reads} reads; {mid_write} kills inside a write; each restart on the same channel")  # fmt: skip


@contextlib.contextmanager
def tiny_filesystem(path: Path, size: str = "4m") -> Iterator[Path | None]:
    path.mkdir()
    mounted = (
        os.geteuid() == 0
        and not subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
    )
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


@fault("full-disk-stderr-pipe")
def full_disk(work: Path, scale: Scale) -> Row:
    """The catalog's disk fills while the sidecar's stderr is a pipe nobody drains; space returns."""
    bursts = pick(scale, ci=20, full=200)
    with tiny_filesystem(work / "disk") as disk:
        if disk is None:
            return Row("full-disk-stderr-pipe", 0, 0, measured="skipped: needs root for a tmpfs")
        with running(disk, "full", stderr=subprocess.PIPE) as sidecar:
            send(sidecar.channel, frame(5.0))
            sidecar.wait_percent(5.0)
            filler = fill(disk)
            for _ in range(bursts):
                send(sidecar.channel, alternating(100))
            send(sidecar.channel, frame(42.0))
            filler.unlink()
            started = time.monotonic()
            landed = sidecar.wait_percent(42.0, timeout=15)
            caught_up = time.monotonic() - started
            assert sidecar.process is not None and sidecar.process.stderr is not None
            os.set_blocking(sidecar.process.stderr.fileno(), False)
            stderr = sidecar.process.stderr.read() or b""
            alive = sidecar.alive()
            sidecar.stop()
        failures = [e for e in log_events(disk, "full") if e["event"] == "write-failed"]
    tried = bursts * 100
    return Row(
        "full-disk-stderr-pipe", tried, tried if alive else 0, int(landed is None),
        fabricated=fabricated(landed, {42.0}),
        measured=f"{len(stderr)} B on stderr; newest landed {caught_up:.1f}s after space returned; "
        f"{len(failures)} write-failed lines",
        failed="wrote to stderr" if stderr else None,
    )  # fmt: skip


HOSTILE_FRAME = b'{"type":"context","reading":[' + b"{}," * (1024 * 1024 // 3 - 20) + b"{}]}\n"


@contextlib.contextmanager
def held_lock(catalog: Path, agent: str, host: str = HOST) -> Iterator[None]:
    fd = os.open(AgentDir(catalog, host, agent).path / ".harness-context.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def waits_for_lock(catalog: Path, agent: str, pid: int, host: str = HOST) -> bool:
    """Whether process `pid` waits for the agent's record lock (`held_lock`'s): a blocked flock, a
    `->` line of /proc/locks."""
    lock = os.stat(AgentDir(catalog, host, agent).path / ".harness-context.lock")
    device = f"{os.major(lock.st_dev):02x}:{os.minor(lock.st_dev):02x}:{lock.st_ino}"
    waiting = ["->", "FLOCK", "ADVISORY", "WRITE", str(pid), device]
    return any(line.split()[1:7] == waiting for line in Path("/proc/locks").read_text().splitlines())


def address_space_limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # an unbounded queue must not take the machine


@fault("stalled-lock-1mib-frames")
def stalled_lock(work: Path, scale: Scale) -> Row:
    """Another process holds the record's lock while 1 MiB frames of `[{},{},...]` (~24 MB each once
    decoded) arrive between real readings; RSS must stay under RSS_BOUND_MB and the newest land."""
    frames = pick(scale, ci=40, full=150)
    with running(work, "stalled", preexec_fn=address_space_limit) as sidecar:
        send(sidecar.channel, frame(1.0))
        sidecar.wait_percent(1.0)
        with held_lock(work, "stalled"):
            started = time.monotonic()
            # One connection, as a harness's extension keeps: frames on separate connections have
            # no order between them, and "the newest" must mean the last one sent.
            stream = b"".join(HOSTILE_FRAME + frame(float(2 + i % 90)) for i in range(frames))
            send(sidecar.channel, stream + frame(95.0))
            elapsed = time.monotonic() - started
            alive = sidecar.alive()
            peak = peak_rss_mb(sidecar.pid) if alive else 0.0
        landed = sidecar.wait_percent(95.0)
        sidecar.stop()
    writes = sum(e["event"] == "write" for e in log_events(work, "stalled"))
    return Row(
        "stalled-lock-1mib-frames", frames, frames if alive else 0, int(landed is None),
        fabricated=fabricated(landed, {95.0}),
        measured=f"peak RSS {peak:.0f} MB (bound {RSS_BOUND_MB}) over {frames} MiB in {elapsed:.1f}s; {writes} writes",
        failed=f"peak RSS {peak:.0f} MB" if peak >= RSS_BOUND_MB else None,
    )  # fmt: skip


@fault("burst-channel-20k")
def burst_channel(work: Path, scale: Scale) -> Row:
    """20,000 frames back to back on one connection, each owing a write; then the harness idles."""
    count = pick(scale, ci=20_000, full=20_000)
    with running(work, "burst") as sidecar:
        started = time.monotonic()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sidecar.channel))
            client.sendall(alternating(count) + frame(77.0))
        landed = sidecar.wait_percent(77.0, timeout=30)
        took = time.monotonic() - started
        sidecar.stop()
    exits = [e for e in log_events(work, "burst") if e["event"] == "exit"]
    dropped = exits[-1]["dropped"] if exits else -1
    return Row(
        "burst-channel-20k", count, count - max(dropped, 0), int(landed is None),
        fabricated=fabricated(landed, {77.0}),
        measured=f"newest landed after {took:.1f}s; exit line dropped={dropped}, coalesced="
        f"{exits[-1].get('coalesced') if exits else '?'}",
    )  # fmt: skip


class Burst(trio.abc.ReceiveStream):
    """A harness's stdout with everything ready at once: the tap sees one long burst."""

    def __init__(self, data: bytes, chunk: int = 65536) -> None:
        self.data, self.chunk = data, chunk

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        piece, self.data = self.data[: self.chunk], self.data[self.chunk :]
        return piece

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def tap_stream(stdout: trio.abc.ReceiveStream, harness: str, channel: Path) -> None:
    """The wrapper's real stdout tap (`wrapper.launch.tap.Tap`, on its own loop in a worker thread,
    framing with the harness's spec's `tap_frame`), fed from `stdout` through a pipe as a harness's
    stdout would be; returns once the tap is done."""
    from wrapper.launch.launcher import tap_frame_path
    from wrapper.launch.tap import run_tap

    read_fd, write_fd = os.pipe()
    frame, where = tap_frame_path(harness), f"{harness} stdout tap"
    tap = partial(trio.to_thread.run_sync, run_tap, read_fd, frame, str(channel), 1, where, abandon_on_cancel=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tap)
        async with trio.lowlevel.FdStream(write_fd) as pipe:
            while chunk := await stdout.receive_some(65536):
                await pipe.send_all(chunk)


@contextlib.contextmanager
def stdout_to_devnull() -> Iterator[None]:
    """The tap copies the harness's stdout to ours: the table must not drown in it."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def codex_burst(deltas: int, rounds: int = 5) -> tuple[bytes, list[dict[str, Any]]]:
    """`rounds` times `deltas` app-server delta lines then one tokenUsage line; and those usages."""
    delta = b'{"method":"item/agentMessage/delta","params":{"threadId":"t","delta":"' + b"x" * 120 + b'"}}\n'
    usage = [
        {"method": "thread/tokenUsage/updated", "params": {"threadId": "t", "tokenUsage": {
            "total": {"totalTokens": 1000 * n}, "last": {"totalTokens": 1000 * n}, "modelContextWindow": 200_000}}}
        for n in range(1, rounds + 1)
    ]  # fmt: skip
    return b"".join(delta * deltas + json.dumps(line).encode() + b"\n" for line in usage), usage


@fault("burst-codex-tap-20k")
def burst_codex_tap(work: Path, scale: Scale) -> Row:
    """Five rounds of 20,000 delta lines then a tokenUsage line through the wrapper's stdout tap
    into a channel: every usage update, and above all the newest, must reach the sidecar."""
    from functools import partial

    from sidecar import channel
    from sidecar.decoding import channel_decoder

    deltas = pick(scale, ci=20_000, full=20_000)
    data, usage = codex_burst(deltas)
    directory = Path(tempfile.mkdtemp(prefix="hctx-fault-"))
    received: list[Any] = []  # the message each tapped line carries (its payload: the line as a string)

    def tapped(kind: str, frame: dict[str, Any]) -> list[object]:
        payload = frame.get("payload")
        return [json.loads(payload) if isinstance(payload, str) else None]

    async def scenario() -> float:
        async with trio.open_nursery() as nursery:
            await nursery.start(channel.serve, directory / "s", partial(channel_decoder, tapped), received.append)
            started = trio.current_time()
            await tap_stream(Burst(data), "codex", directory / "s")
            with trio.move_on_after(15):
                while not received or received[-1] != usage[-1]:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
            return trio.current_time() - started

    try:
        with stdout_to_devnull():
            took = trio.run(scenario)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    landed = [line for line in usage if line in received]
    newest = bool(received) and received[-1] == usage[-1]
    return Row(
        "burst-codex-tap-20k", len(usage), len(landed), len(usage) - len(landed),
        measured=f"{len(received)} of {len(usage) * (deltas + 1)} lines tapped in {took:.1f}s; newest landed: {newest}",
        failed=None if newest else "the newest usage line did not land",
    )  # fmt: skip


def _raise_fd_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@fault("held-connections-2000")
def held_connections(work: Path, scale: Scale) -> Row:
    """2,000 idle connections, then 128 half-open ones holding 1 MiB each: the harness's frame must
    land within HELD_FRAME_LATENCY_S each time, and the half-open bytes stay bounded."""
    idle_count = pick(scale, ci=2000, full=2000)
    idle_count = min(idle_count, _raise_fd_limit(idle_count + 300) - 300)
    held: list[socket.socket] = []
    latencies: list[float] = []
    lost = 0
    with running(work, "held") as sidecar:
        try:
            for _ in range(idle_count):
                idle = socket.socket(socket.AF_UNIX)
                idle.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    idle.connect(str(sidecar.channel))
                held.append(idle)
            for half_open in range(128):
                partial = socket.socket(socket.AF_UNIX)
                partial.setblocking(False)
                with contextlib.suppress(BlockingIOError, OSError):
                    partial.connect(str(sidecar.channel))
                    partial.send(b'{"type":"context","x":"' + b"y" * (1024 * 1024 - 100))
                held.append(partial)
                if half_open in (0, 127):
                    started = time.monotonic()
                    send(sidecar.channel, frame(float(20 + half_open % 50)))
                    if sidecar.wait_percent(float(20 + half_open % 50), timeout=3 * HELD_FRAME_LATENCY_S) is None:
                        lost += 1
                    latencies.append(time.monotonic() - started)
            peak = peak_rss_mb(sidecar.pid)
            alive = sidecar.alive()
        finally:
            for sock in held:
                sock.close()
        sidecar.stop()
    worst = max(latencies)
    return Row(
        "held-connections-2000", idle_count + 128, idle_count + 128 if alive else 0, lost,
        measured=f"harness frame landed in {worst * 1000:.0f} ms at worst; peak RSS {peak:.0f} MB",
        failed=f"a frame took {worst:.2f}s" if worst > HELD_FRAME_LATENCY_S else None,
    )  # fmt: skip


@fault("symlinked-log-paths")
def symlinked_log_paths(work: Path, scale: Scale) -> Row:
    """`.st2/logs` a symlink, then the log file a symlink: nothing may be written outside."""
    outside = work / "outside"
    outside.mkdir()
    target = outside / "target"
    target.write_bytes(b"")
    cases = []
    for case in ("logs-dir", "log-file"):
        catalog = work / case
        if case == "logs-dir":
            (catalog / ".st2").mkdir(parents=True)
            (catalog / ".st2" / "logs").symlink_to(outside)
        else:
            path = log_path(catalog, HOST, "linked")
            path.parent.mkdir(parents=True)
            path.symlink_to(target)
        with running(catalog, "linked") as sidecar:
            send(sidecar.channel, frame(33.0))
            landed = sidecar.wait_percent(33.0)
            sidecar.stop()
        cases.append(landed)
    leaked = sum(p.stat().st_size for p in outside.iterdir()) + len(list(outside.iterdir())) - 1
    return Row(
        "symlinked-log-paths", len(cases), sum(landed is not None for landed in cases),
        sum(landed is None for landed in cases),
        measured=f"{leaked} bytes/files written outside the catalog", outside=leaked,
    )  # fmt: skip


# --- the exporter's bounds (issue 26 point 5) ---------------------------------------------------

METRICS_THREADS_BOUND = 3  # the trio thread, one worker reading the catalog, and one spare of trio's cache
METRICS_RSS_BOUND_MB = {"ci": 150, "full": 400}


def _proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


@fault("metrics-bounds")
def metrics_bounds(work: Path, scale: Scale) -> Row:
    """Held connections (silent, and with a request head that never ends) while concurrent scrapes
    of a large catalog run: every scrape is answered whole, the threads and the memory stay within
    their bounds, and every held connection is closed by the exporter within its timeouts."""
    from concurrent.futures import ThreadPoolExecutor

    from scripts.bench_roster import build_catalog

    agents, held_count, concurrent = pick(scale, ci=2000, full=10000), pick(scale, ci=400, full=2000), pick(
        scale, ci=20, full=50)  # fmt: skip
    held_count = min(held_count, _raise_fd_limit(held_count + 300) - 300)
    catalog = work / "catalog"
    build_catalog(catalog, agents, int(time.time() * 1000))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    header_s, idle_s = 2.0, 3.0
    argv = [sys.executable, "-m", "wrapper.cli", "metrics", "--catalog", str(catalog), "--host", "alpha",
            "--listen", f"127.0.0.1:{port}", "--header-timeout", str(header_s), "--idle-timeout", str(idle_s),
            "--max-connections", "64"]  # fmt: skip
    exporter = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held: list[socket.socket] = []
    try:
        wait_for(lambda: _connectable(port), timeout=60, what="the exporter listening")
        for index in range(held_count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if index % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # a head that never ends
            held.append(sock)
        threads_peak = _proc_status(exporter.pid, "Threads")

        def scrape(_: int) -> tuple[bool, float]:
            started = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as response:
                body = response.read().decode()
            whole = body.count("hctx_context_used_tokens{") == agents and "hctx_catalog_readable 1.0" in body
            return whole, time.monotonic() - started

        with ThreadPoolExecutor(concurrent) as pool:
            futures = [pool.submit(scrape, index) for index in range(concurrent)]
            while not all(future.done() for future in futures):
                threads_peak = max(threads_peak, _proc_status(exporter.pid, "Threads"))
                time.sleep(0.05)
            answers = [future.result() for future in futures]
        rss_peak_mb = _proc_status(exporter.pid, "VmHWM") / 1024
        threads_peak = max(threads_peak, _proc_status(exporter.pid, "Threads"))
        deadline = time.monotonic() + header_s + 5
        open_after = held_count
        while time.monotonic() < deadline and open_after:
            open_after = sum(not _closed(sock) for sock in held)
            time.sleep(0.2)
        alive = exporter.poll() is None
    finally:
        for sock in held:
            sock.close()
        exporter.terminate()
        exporter.wait(timeout=20)
    whole = sum(ok for ok, _ in answers)
    slowest = max(took for _, took in answers)
    failed = None
    if threads_peak > METRICS_THREADS_BOUND:
        failed = f"{threads_peak} threads"
    elif rss_peak_mb > METRICS_RSS_BOUND_MB[scale]:
        failed = f"peak RSS {rss_peak_mb:.0f} MB"
    elif open_after:
        failed = f"{open_after} held connections still open after {header_s + 5:g} s"
    return Row(
        "metrics-bounds", held_count + concurrent, (held_count - open_after) + whole if alive else 0,
        lost=concurrent - whole,
        measured=f"{agents} agents, {concurrent} concurrent scrapes: slowest {slowest:.1f} s, peak RSS "
        f"{rss_peak_mb:.0f} MB (bound {METRICS_RSS_BOUND_MB[scale]}), threads {threads_peak} (bound "
        f"{METRICS_THREADS_BOUND}); {held_count} held connections, {open_after} open {header_s + 5:g} s later",
        failed=failed,
    )  # fmt: skip


@fault("metrics-head-bound")
def metrics_head_bound(work: Path, scale: Scale) -> Row:
    """Request heads around the documented 16 KiB, each sent whole in one write (so it can arrive in
    one read): every head within the bound is answered 200, every head past it is refused (431, or
    the connection closed) and never served."""
    from wrapper.readers.metrics_server import MAX_HEAD_BYTES

    catalog = work / "catalog"
    catalog.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "wrapper.cli", "metrics", "--catalog", str(catalog), "--host", "alpha",
            "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    exporter = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sizes = [MAX_HEAD_BYTES - 512, MAX_HEAD_BYTES, MAX_HEAD_BYTES + 1, MAX_HEAD_BYTES + 512, 20 * 1024,
             31 * 1024, 48 * 1024, 63 * 1024]  # fmt: skip
    wrong: list[str] = []
    try:
        wait_for(lambda: _connectable(port), timeout=60, what="the exporter listening")
        for size in sizes:
            start = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
            head = start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"
            assert len(head) == size
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(head)
                answer = b""
                with contextlib.suppress(OSError):
                    while chunk := sock.recv(65536):
                        answer += chunk
            served = answer.startswith(b"HTTP/1.1 200")
            if served != (size <= MAX_HEAD_BYTES):
                wrong.append(f"{size} B {'served' if served else 'refused'}")
        alive = exporter.poll() is None
    finally:
        exporter.terminate()
        exporter.wait(timeout=20)
    return Row("metrics-head-bound", len(sizes), len(sizes) - len(wrong) if alive else 0, lost=len(wrong),
               measured=f"heads of {min(sizes)}..{max(sizes)} B in one write; bound {MAX_HEAD_BYTES} B; "
               + (", ".join(wrong) or "each answered as the bound says"))  # fmt: skip


def _connectable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _closed(sock: socket.socket) -> bool:
    """True once the peer closed: a read returns b"" (or the connection was reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


# --- the wrapper's faults -----------------------------------------------------------------------
# Real `hctx wrap` processes (a stand-in pi harness) under each fault of points 3, 7, 8 and 9.


def wrap_argv(catalog: Path, agent: str, *command: str, harness: str = "pi") -> list[str]:
    return [sys.executable, "-m", "wrapper.cli", "wrap", "--agent", agent, "--harness", harness,
            "--catalog", str(catalog), "--host", HOST, "--", *command]  # fmt: skip


def starts(catalog: Path, agent: str) -> list[dict[str, Any]]:
    return [e for e in log_events(catalog, agent) if e["event"] == "start"]


def claim_of(catalog: Path, agent: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((AgentDir(catalog, HOST, agent).path / "harness-state").read_text())
    return state


def gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped yet: either way not running."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except FileNotFoundError:
        return True


# Sends each frame 50 ms apart (failures ignored: its sidecar may be dead just then), then the last
# one until the record (argv[1]) reads it: exit 0 once it does, 9 if it never does.
STREAMER = r"""
import json, os, socket, sys, time
record, frames = sys.argv[1], json.loads(sys.argv[2])
def send(frame):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.environ["HCTX_CHANNEL"])
        s.sendall(frame.encode())
        s.close()
    except OSError:
        pass
for frame in frames:
    send(frame)
    time.sleep(0.05)
last = json.loads(frames[-1])["reading"]["percent"]
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    try:
        if json.load(open(record))["usedPercent"] == last:
            sys.exit(0)
    except (OSError, ValueError, KeyError):
        pass
    send(frames[-1])
    time.sleep(0.2)
sys.exit(9)
"""


def streamer(catalog: Path, agent: str, count: int) -> tuple[list[str], set[float]]:
    sent = [float(n) for n in range(1, count + 1)]
    frames = [frame(percent).decode() for percent in sent]
    record = AgentDir(catalog, HOST, agent).context_path
    return wrap_argv(catalog, agent, sys.executable, "-c", STREAMER, str(record), json.dumps(frames)), set(sent)


def read_record(catalog: Path, agent: str) -> tuple[HarnessContext | None, int]:
    """The record and 1 if it was torn."""
    try:
        data = AgentDir(catalog, HOST, agent).context_path.read_bytes()
    except FileNotFoundError:
        return None, 0
    try:
        return parse_record(data), 0
    except RecordRefused:
        return None, 1


@fault("wrapper-dead-sidecar")
def dead_sidecar(work: Path, scale: Scale) -> Row:
    """SIGKILL the sidecar mid-stream: the wrapper replaces it for the same incarnation and channel,
    the gap is on the claim, and the newest reading lands through the replacement."""
    trials = pick(scale, ci=3, full=20)
    survived = lost = torn = fake = 0
    gaps: list[int] = []
    for trial in range(trials):
        catalog = work / f"dead-{trial}"
        argv, sent = streamer(catalog, "a", 60)
        wrapper = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = wait_for(lambda c=catalog: starts(c, "a"), timeout=30, what="a sidecar")[0]  # type: ignore[misc]
        time.sleep(0.5 + 0.1 * (trial % 5))  # somewhere in the stream
        os.kill(int(first["pid"]), signal.SIGKILL)
        status = wrapper.wait(timeout=60)
        state = claim_of(catalog, "a")
        record, was_torn = read_record(catalog, "a")
        torn += was_torn
        fake += fabricated(record, sent) + int(record is not None and record.incarnation != state["incarnation"])
        replaced = [s["incarnation"] for s in starts(catalog, "a")] == [state["incarnation"]] * 2
        closed = [g["untilMs"] - g["sinceMs"] for g in state.get("unobserved", []) if g.get("untilMs")]
        gaps.extend(closed)
        if status == 0 and replaced and closed and record is not None and record.used_percent == max(sent):
            survived += 1
        else:
            lost += 1
    return Row("wrapper-dead-sidecar", trials, survived, lost, torn, fake,
               f"replaced and ready {max(gaps, default=0)} ms after the kill at worst; gap on the claim")  # fmt: skip


@fault("wrapper-crash-looping-sidecar")
def crash_looping_sidecar(work: Path, scale: Scale) -> Row:
    """Every sidecar SIGKILLed as it starts: the wrapper backs off, gives up after a bounded number,
    says so in at most two lines, and still exits with the harness's status."""
    from wrapper.launch.sidecars import SIDECAR_RESTART_DELAYS_S

    trials = pick(scale, ci=1, full=3)
    bound = 1 + len(SIDECAR_RESTART_DELAYS_S)
    survived = 0
    killed: set[int] = set()
    notes: list[str] = []
    for trial in range(trials):
        catalog = work / f"loop-{trial}"
        script = f"import sys, time; time.sleep({sum(SIDECAR_RESTART_DELAYS_S) + 8}); sys.exit(5)"
        wrapper = subprocess.Popen(wrap_argv(catalog, "a", sys.executable, "-c", script), env=child_env(),
                                   stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        killed = set()
        while wrapper.poll() is None:
            for start in starts(catalog, "a"):
                if start["pid"] not in killed:
                    killed.add(start["pid"])
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(start["pid"], signal.SIGKILL)
            time.sleep(0.02)
        notes = [line for line in wrapper.communicate()[1].splitlines() if "sidecar" in line]
        recorded = len(claim_of(catalog, "a").get("unobserved", [])) == len(killed)
        survived += wrapper.returncode == 5 and len(killed) <= bound and len(notes) <= 2 and recorded
    measured = f"{len(killed)} sidecars started (bound {bound}), {len(notes)} lines on the terminal"
    return Row("wrapper-crash-looping-sidecar", trials, survived, trials - survived, measured=measured)


@fault("two-wrappers-one-agent")
def two_wrappers(work: Path, scale: Scale) -> Row:
    """Four wrappers for one agent at once: one runs, three are refused (exit 2), and the record,
    read all along, never carries another incarnation than the one that runs."""
    trials = pick(scale, ci=2, full=10)
    survived = torn = fake = 0
    reads = 0
    for trial in range(trials):
        catalog = work / f"two-{trial}"
        argv, sent = streamer(catalog, "a", 40)
        wrappers = [subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for _ in range(4)]  # fmt: skip
        seen: set[str] = set()
        while any(w.poll() is None for w in wrappers):
            record, was_torn = read_record(catalog, "a")
            torn += was_torn
            reads += 1
            if record is not None:
                seen.add(record.incarnation)
                fake += fabricated(record, sent)
            time.sleep(0.005)
        incarnation = claim_of(catalog, "a")["incarnation"]
        fake += len(seen - {incarnation})
        codes = sorted(w.returncode for w in wrappers)
        survived += codes == [0, 2, 2, 2] and len(starts(catalog, "a")) == 1 and seen == {incarnation}
    return Row("two-wrappers-one-agent", trials, survived, trials - survived, torn, fake,
               f"{reads} reads; the record never switched incarnation")  # fmt: skip


STUBBORN = (
    "import os, signal, sys, time; [signal.signal(s, signal.SIG_IGN) for s in (1, 15)]; "
    "open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(120)"
)


def stubborn_harness(kind: str, pids: Path) -> tuple[list[str], int]:
    """A harness ignoring SIGTERM and SIGHUP, alone or behind `sh`; and how many pids it writes."""
    python = f'{sys.executable} -c "{STUBBORN}" {pids}'
    if kind == "behind sh":
        return ["sh", "-c", f"echo $$ >> {pids}; {python}; echo after"], 2
    if kind == "sh's background child":
        return ["sh", "-c", f"echo $$ >> {pids}; {python} & wait"], 2
    return [sys.executable, "-c", STUBBORN, str(pids)], 1


@fault("sigkill-wrapper-no-orphans")
def sigkill_wrapper(work: Path, scale: Scale) -> Row:
    """SIGKILL the wrapper (no terminal) of a harness that ignores SIGTERM and SIGHUP, alone, behind
    `sh`, or as `sh`'s background child: nothing of the harness is left past the deadline."""
    from wrapper.launch.launcher import HARNESS_KILL_DEADLINE_S

    trials = pick(scale, ci=1, full=3)
    kinds = ("ignoring SIGTERM", "behind sh", "sh's background child")
    survived = orphans = 0
    worst = 0.0
    for kind in kinds:
        for trial in range(trials):
            pids = work / f"pids-{kinds.index(kind)}-{trial}"
            command, count = stubborn_harness(kind, pids)
            wrapper = subprocess.Popen(wrap_argv(work / f"c-{pids.name}", "a", *command), env=child_env(),
                                       stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            wait_for(lambda p=pids, n=count: p.exists() and len(p.read_text().split()) >= n,  # type: ignore[misc]
                     timeout=30, what="the harness's pids")  # fmt: skip
            harness = [int(pid) for pid in pids.read_text().split()]
            wrapper.kill()
            wrapper.wait()
            killed = time.monotonic()
            while time.monotonic() - killed < HARNESS_KILL_DEADLINE_S + KILL_SLACK_S and not all(map(gone, harness)):
                time.sleep(0.02)
            worst = max(worst, time.monotonic() - killed)
            left = [pid for pid in harness if not gone(pid)]
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            survived += not left
            orphans += len(left)
    tried = trials * len(kinds)
    return Row("sigkill-wrapper-no-orphans", tried, survived, orphans,
               measured=f"{orphans} orphans; all gone {worst:.1f}s after the SIGKILL at worst "
               f"(SIGTERM, then SIGKILL at {HARNESS_KILL_DEADLINE_S:g}s)")  # fmt: skip


def running_sidecar(resident: int) -> int | None:
    """The resident's sidecar child, if one runs."""
    from scripts.bench_footprint import children, command

    return next((child for child in children(resident) if " -m sidecar " in command(child)), None)


def double_kill_trial(work: Path, kind: str, when: str) -> tuple[list[int], float]:
    """One wrapped harness (`stubborn_harness(kind)`) whose resident and sidecar are both SIGKILLed:
    `together` (one right after the other), or `in back-off` (the sidecar first, the resident 0.1 s
    later, inside the replacement's first delay); what is left of the harness past the deadline."""
    from wrapper.launch.resident import HARNESS_KILL_DEADLINE_S

    pids = work / "pids"
    command, count = stubborn_harness(kind, pids)
    catalog = work / "catalog"
    resident = subprocess.Popen(wrap_argv(catalog, "a", *command), env=child_env(), stdin=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    wait_for(lambda: starts(catalog, "a"), timeout=30, what="a sidecar")
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) >= count, timeout=30, what="the harness's pids")
    harness = [int(pid) for pid in pids.read_text().split()]
    # The sidecar running now (a first one that died under load was replaced: its pid is no target).
    sidecar = wait_for(lambda: running_sidecar(resident.pid), timeout=30, what="the running sidecar")
    if when == "together":
        resident.kill()
        os.kill(sidecar, signal.SIGKILL)
    else:
        os.kill(sidecar, signal.SIGKILL)
        time.sleep(0.1)
        resident.kill()
    resident.wait()
    killed = time.monotonic()
    while time.monotonic() - killed < HARNESS_KILL_DEADLINE_S + KILL_SLACK_S and not all(map(gone, harness)):
        time.sleep(0.02)
    took = time.monotonic() - killed
    left = [pid for pid in harness if not gone(pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left, took


@fault("double-kill-no-orphans")
def double_kill(work: Path, scale: Scale) -> list[Row]:
    """The resident and its sidecar both SIGKILLed, together or the resident inside the sidecar's
    replacement back-off, with a harness that ignores SIGTERM and SIGHUP, alone and as `sh`'s
    background child: nothing of the harness is left past the deadline (the resident's keeper ends
    the group)."""
    trials = pick(scale, ci=2, full=25)
    rows = []
    for when in ("together", "in back-off"):
        tried = survived = orphans = 0
        worst = 0.0
        for number, kind in enumerate(("ignoring SIGTERM", "sh's background child")):
            for trial in range(trials):
                place = work / f"{when.replace(' ', '-')}-{number}-{trial}"
                place.mkdir(parents=True)
                left, took = double_kill_trial(place, kind, when)
                tried += 1
                survived += not left
                orphans += len(left)
                worst = max(worst, took)
        measured = f"{orphans} orphans; all gone {worst:.1f}s after the second SIGKILL at worst"
        rows.append(Row(f"double-kill-{when.replace(' ', '-')}", tried, survived, orphans, measured=measured))
    return rows


FILL_THE_DISK = r"""
import os, sys
with open(os.path.join(os.environ["HCTX_CATALOG"], "filler"), "wb") as out:
    try:
        while True:
            out.write(b"x" * 65536)
            out.flush()
    except OSError:
        pass
sys.exit(3)
"""


@fault("full-disk-exit-status")
def full_disk_exit_status(work: Path, scale: Scale) -> Row:
    """The catalog on a 2 MiB tmpfs (in a user and mount namespace) that the harness fills before it
    exits 3: the wrapper exits 3, and the claim left on disk parses."""
    trials = pick(scale, ci=2, full=5)
    harness = work / "fill.py"
    harness.write_text(FILL_THE_DISK)
    survived = torn = 0
    codes: list[int] = []
    for trial in range(trials):
        catalog = work / f"full-{trial}"
        catalog.mkdir()
        claim = AgentDir(catalog, HOST, "a").path / "harness-state"
        wrap = " ".join(wrap_argv(catalog, "a", sys.executable, str(harness)))
        # The claim is printed inside the namespace, before its tmpfs goes with it.
        script = f"mount -t tmpfs -o size=2m tmpfs {catalog} || exit 99; {wrap}; s=$?; cat {claim}; exit $s"
        try:
            result = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=child_env(),
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
        except FileNotFoundError:
            result = subprocess.CompletedProcess([], 99, "", "")
        if result.returncode == 99:
            return Row("full-disk-exit-status", 0, 0, measured="skipped: needs unshare -rm and a tmpfs mount")
        codes.append(result.returncode)
        try:
            json.loads(result.stdout.splitlines()[-1])
        except (ValueError, IndexError):
            torn += 1
        survived += result.returncode == 3
    return Row("full-disk-exit-status", trials, survived, trials - survived, torn,
               measured=f"wrapper exit statuses {sorted(set(codes))} for a harness that exited 3")  # fmt: skip


# --- issue 26: the newer surfaces -----------------------------------------------------------------


def hctx_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "wrapper.cli", *args]


def files_below(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below `root` (symlinks not followed) with its bytes and mode: what must not change."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode)
    return found


def changed(before: dict[str, tuple[bytes, int]], after: dict[str, tuple[bytes, int]]) -> int:
    """Files changed, created or removed between two `files_below`."""
    return sum(before.get(name) != after.get(name) for name in before.keys() | after.keys())


def claude_case(work: Path, case: str) -> tuple[Path, str]:
    """A project directory for `case`, carrying the links a cloned repository could; and the text the
    refusal must name (empty: the launch must run)."""
    project = work / "repo" / "sub"
    claude = project / ".claude"
    if case == ".claude linked":
        project.mkdir(parents=True)
        (work / "outside" / "dir").mkdir()
        claude.symlink_to(work / "outside" / "dir")
        return project, ".claude is a symlink"
    claude.mkdir(parents=True)
    if case == "seats linked (absolute)":
        (claude / "hctx-seats.json").symlink_to(work / "outside" / "victim.json")
        return project, "hctx-seats.json is a symlink"
    if case == "seats linked (../../victim)":
        (claude / "hctx-seats.json").symlink_to(Path("../../../outside/victim.json"))
        return project, "hctx-seats.json is a symlink"
    if case == "settings linked out":
        (claude / "settings.local.json").symlink_to(Path("../../../outside/victim.json"))
        return project, "outside"
    if case == "settings linked out (dangling)":
        (claude / "settings.local.json").symlink_to(Path("../../../outside/new.json"))
        return project, "outside"
    (project / "conf").mkdir()  # settings linked inside the project: written through, put back
    (project / "conf" / "local.json").write_bytes(b'{"model": "x"}\n')
    (claude / "settings.local.json").symlink_to(Path("../conf/local.json"))
    return project, ""


@fault("claude-symlinked-project-files")
def claude_symlinked_project_files(work: Path, scale: Scale) -> Row:
    """Issue 26.1: `hctx wrap --harness claude` in a directory whose `.claude/`, seats file or
    settings file is a symlink out of it (absolute, or relative as a cloned repository carries it):
    refused, saying why, and not one byte or mode outside changes; a link inside the project is
    written through and put back byte for byte."""
    cases = [
        "seats linked (absolute)",
        "seats linked (../../victim)",
        ".claude linked",
        "settings linked out",
        "settings linked out (dangling)",
        "settings linked inside",
    ]
    rounds = pick(scale, ci=1, full=5)
    survived = outside_changes = 0
    for round_ in range(rounds):
        for index, case in enumerate(cases):
            root = work / f"{round_}-{index}"
            (root / "outside").mkdir(parents=True)
            (root / "outside" / "victim.json").write_bytes(b'{"victim": true}\n')
            (root / "outside" / "victim.json").chmod(0o644)
            project, refusal = claude_case(root, case)
            before, inside = files_below(root / "outside"), files_below(project)
            argv = wrap_argv(root / "catalog", "c", sys.executable, "-c", "print('RAN')", harness="claude")
            done = subprocess.run(argv, cwd=project, env=child_env(), capture_output=True, text=True, timeout=60)
            outside_changes += changed(before, files_below(root / "outside"))
            clean = "Traceback" not in done.stderr
            if refusal:
                survived += clean and done.returncode != 0 and refusal in done.stderr and "RAN" not in done.stdout
            else:
                survived += clean and done.returncode == 0 and files_below(project) == inside
    tried = rounds * len(cases)
    return Row(
        "claude-symlinked-project-files",
        tried,
        survived,
        outside=outside_changes,
        measured=f"{tried - rounds} refused with the reason, {rounds} written through inside the project "
        f"and put back; {outside_changes} files changed outside",
    )


def put_watch_record(catalog: Path, host: str, agent: str, percent: float, incarnation: str = "i") -> None:
    stamp = time.time_ns() // 1_000_000
    record = {
        "schema": "st2.harness-context.v1",
        "agent": agent,
        "harness": "pi",
        "usedTokens": int(percent * 1000),
        "windowTokens": 100_000,
        "usedPercent": percent,
        "model": "m",
        "costUsd": None,
        "sessionTotalTokens": None,
        "rateLimits": None,
        "compactions": 0,
        "lastCompactionMs": None,
        "lastCompactionTrigger": None,
        "incarnation": incarnation,
        "observedAtMs": stamp,
        "writtenAtMs": stamp,
    }
    path = catalog / "agents" / host / agent
    path.mkdir(parents=True, exist_ok=True)
    (path / "harness-context").write_text(json.dumps(record) + "\n")


def watch_process(catalog: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        hctx_argv("watch", "--catalog", str(catalog), "--host", HOST, *args),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_watch(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@fault("watch-hostile-record")
def watch_hostile_record(work: Path, scale: Scale) -> Row:
    """Issue 26.2: agents at 96% beside a peer host's agent whose incarnation is "x\u0000y" (and one
    with a lone surrogate): `hctx watch --exec` must deliver every good agent's events, outlive its
    re-reads, save no hostile agent as told, and a restart must tell nothing twice."""
    agents = pick(scale, ci=5, full=50)
    catalog, got = work / "catalog", work / "got.jsonl"
    for n in range(agents):
        put_watch_record(catalog, HOST, f"a{n}", 96.0)
    put_watch_record(catalog, "peer", "nul", 96.0, incarnation="x\u0000y")
    put_watch_record(catalog, "peer", "surrogate", 96.0, incarnation="x\ud800y")
    owed = 2 * agents
    process = watch_process(catalog, "--exec", f'cat >> {got}; : "$HCTX_INCARNATION"', "--reread", "0.5")
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: len(jsonl(got)) >= owed, timeout=30)
    time.sleep(2.0)  # four re-reads of the hostile records
    alive = process.poll() is None
    status, _, err = stop_watch(process)
    delivered = len(jsonl(got))
    told = json.loads((catalog / ".st2" / "watch" / "default.json").read_text())["agents"]
    again = watch_process(catalog, "--exec", f"cat >> {got}", "--reread", "600")
    time.sleep(2.0)
    stop_watch(again)
    repeated = len(jsonl(got)) - delivered
    hostile_told = sum(name.startswith("peer/") for name in told)
    return Row(
        "watch-hostile-record",
        owed,
        min(delivered, owed) if alive and status == 0 else 0,
        owed - min(delivered, owed),
        fabricated=hostile_told + repeated,
        measured=f"{delivered} of {owed} events delivered beside 2 hostile records; alive after 4 re-reads; "
        f"{repeated} repeated by a restart; tracebacks: {err.count('Traceback')}",
        failed="traceback" if "Traceback" in err else None,
    )


@fault("watch-stopped-mid-delivery")
def watch_stopped_mid_delivery(work: Path, scale: Scale) -> Row:
    """Issue 26.2: the watch stops while an agent's 80 runs and its 95 waits behind it: the 80 is not
    told again (its delivery was attempted), the 95 is told by the next watch (it never was)."""
    trials = pick(scale, ci=2, full=10)
    survived = lost = twice = 0
    for trial in range(trials):
        catalog, got, hung = work / f"c{trial}", work / f"got{trial}.jsonl", work / f"hung{trial}"
        put_watch_record(catalog, HOST, "a", 96.0)
        script = (
            f'line=$(cat); printf "%s\\n" "$line" >> {got}; '
            f'[ "$HCTX_THRESHOLD" = 80 ] && touch {hung} && sleep 60; true'
        )
        first = watch_process(catalog, "--exec", script, "--exec-timeout", "60", "--reread", "600")
        wait_for(hung.exists, timeout=30)
        stop_watch(first)
        second = watch_process(catalog, "--exec", f"cat >> {got}", "--reread", "600")
        with contextlib.suppress(TimeoutError):
            wait_for(lambda g=got: len(jsonl(g)) >= 2, timeout=15)  # type: ignore[misc]
        time.sleep(0.5)
        stop_watch(second)
        thresholds = [event["threshold"] for event in jsonl(got)]
        survived += thresholds == [80, 95]
        lost += 95 not in thresholds
        twice += max(0, thresholds.count(80) - 1)
    return Row(
        "watch-stopped-mid-delivery",
        trials,
        survived,
        lost,
        fabricated=twice,
        measured=f"queued events lost: {lost}; attempted events told twice: {twice}",
    )


@fault("takeover-planted-claim")
def takeover_planted_claim(work: Path, scale: Scale) -> Row:
    """Issue 26.3: a planted harness-state names an unrelated `sleep` as its wrapper (no identity; the
    identity anyone can compute; a live wrapper holding the agent while the claim names the sleep):
    `--takeover` never signals the sleep; it takes a free agent and refuses a held one with evidence."""
    from guard.state import process_identity

    trials = pick(scale, ci=1, full=3)
    cases = ("no identity", "computed identity", "held by a live wrapper")
    survived = signalled = 0
    for trial in range(trials):
        for index, case in enumerate(cases):
            catalog = work / f"t{trial}-{index}"
            sleeper = subprocess.Popen(["sleep", "60"])
            holder = None
            try:
                if case == "held by a live wrapper":
                    holder = subprocess.Popen(
                        wrap_argv(catalog, "a", sys.executable, "-c", "import time; time.sleep(60)"),
                        env=child_env(),
                        stdin=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    wait_for(lambda c=catalog: starts(c, "a"), timeout=30)  # type: ignore[misc]
                    state = claim_of(catalog, "a") | {"wrapperPid": sleeper.pid}
                else:
                    identity = process_identity(sleeper.pid) if case == "computed identity" else None
                    state = {
                        "schema": "st2.harness-state.v1",
                        "agent": "a",
                        "host": HOST,
                        "harness": "pi",
                        "incarnation": "planted",
                        "claimedAtMs": 1,
                        "wrapperPid": sleeper.pid,
                        "desiredState": "running",
                        "history": [],
                        "wrapperIdentity": identity,
                    }
                    AgentDir(catalog, HOST, "a").path.mkdir(parents=True, exist_ok=True)
                (AgentDir(catalog, HOST, "a").path / "harness-state").write_text(json.dumps(state))
                argv = [*wrap_argv(catalog, "a", sys.executable, "-c", "print('RAN')")]
                argv.insert(argv.index("--"), "--takeover")
                done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=60)
                time.sleep(0.2)
                hit = sleeper.poll() is not None
                signalled += hit
                if holder is None:
                    survived += not hit and done.returncode == 0 and "RAN" in done.stdout
                else:
                    survived += (
                        not hit
                        and done.returncode == 2
                        and f"held by pid {holder.pid}" in done.stderr
                        and holder.poll() is None
                    )
            finally:
                for process in (sleeper, holder):
                    if process is not None:
                        process.kill()
                        process.wait()
    tried = trials * len(cases)
    return Row(
        "takeover-planted-claim",
        tried,
        survived,
        fabricated=signalled,
        measured=f"the unrelated process signalled in {signalled} of {tried}; the held agent refused with "
        "the lock holder named",
    )


def rollout_line(thread: str, tokens: int) -> bytes:
    usage = {
        "input_tokens": tokens,
        "cached_input_tokens": 0,
        "output_tokens": 0,
        "reasoning_output_tokens": 0,
        "total_tokens": tokens,
    }
    info = {"total_token_usage": usage, "last_token_usage": usage, "model_context_window": 200_000}
    event = {
        "timestamp": "2026-11-29T22:34:22.129Z",
        "type": "event_msg",
        "payload": {"type": "token_count", "info": info, "rate_limits": None},
    }
    return json.dumps(event).encode() + b"\n"


def rollout_file(home: Path, thread: str, started: str, tokens: int) -> Path:
    path = home / "sessions" / "2026" / "11" / "29" / f"rollout-2026-11-29T22-34-15-{thread}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "timestamp": started,
        "type": "session_meta",
        "payload": {"id": thread, "timestamp": started, "cwd": "/work", "cli_version": "0.171.0", "source": "cli"},
    }
    path.write_bytes(json.dumps(meta).encode() + b"\n" + rollout_line(thread, tokens))
    return path


async def follow_seat(settings: Any, ours: Path, go: Path) -> list[Any]:
    """The usages the seat submits: its first reading, then `go` (the tool opens the other file) and
    a second later its codex's 22222, until that lands (10 s at most)."""
    from sidecar.harnesses.codex import rollout
    from sidecar.harnesses.codex.events import TokenUsage
    from sidecar.harnesses.codex.producer import SPEC
    from sidecar.streams import Streams

    usages: list[TokenUsage] = []
    async with trio.open_nursery() as nursery:
        submit = lambda e: usages.append(e) if isinstance(e, TokenUsage) else None  # noqa: E731
        nursery.start_soon(rollout.follow_rollout, settings, Streams(SPEC, submit))
        with trio.move_on_after(10):
            while not usages:  # noqa: ASYNC110
                await trio.sleep(0.05)
        go.touch()
        await trio.sleep(1.0)  # ten rescans while the tool holds the other session's file
        with ours.open("ab") as handle:
            handle.write(rollout_line("ours", 22222))
        with trio.move_on_after(10):
            while not usages or usages[-1].tokens_in_window != 22222:  # noqa: ASYNC110
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    return usages


@fault("codex-foreign-rollout")
def codex_foreign_rollout(work: Path, scale: Scale) -> Row:
    """Issue 26.4: the seat's codex writes its rollout (11111); a tool it runs opens another session's
    newer rollout (99999), to read it or to append: the seat never moves, and its codex's later
    22222 is published."""
    from sidecar.harnesses.codex import rollout
    from sidecar.harnesses.codex.producer import Rollout

    modes = ("exec 3<", "exec 3>>") * pick(scale, ci=1, full=5)
    survived = lost = moved = 0
    saved = rollout.RESCAN_EVERY_S
    rollout.RESCAN_EVERY_S = 0.1  # type: ignore[misc]  # ten rescans a second, for this row only
    try:
        for index, mode in enumerate(modes):
            home = work / f"home{index}"
            ours = rollout_file(home, "ours", "2026-11-29T22:34:15.000Z", 11111)
            other = rollout_file(home, "other", "2026-11-29T22:34:16.000Z", 99999)
            go = work / f"go{index}"
            tool = f"while [ ! -e {go} ]; do sleep 0.02; done; {mode}{other}; sleep 60"
            codex = subprocess.Popen(["sh", "-c", f'exec 4>>{ours}; sh -c "{tool}" & wait'], start_new_session=True)
            settings = Rollout(codex_home=str(home), cwd="/work", started_at_ms=1_795_991_000_000, root_pid=codex.pid)
            try:
                usages = trio.run(follow_seat, settings, ours, go)
            finally:
                os.killpg(codex.pid, signal.SIGKILL)
                codex.wait()
            threads = {usage.thread_id for usage in usages}
            moved += threads != {"ours"}
            landed = bool(usages) and usages[-1].tokens_in_window == 22222
            lost += not landed
            survived += landed and threads == {"ours"}
    finally:
        rollout.RESCAN_EVERY_S = saved  # type: ignore[misc]
    return Row(
        "codex-foreign-rollout",
        len(modes),
        survived,
        lost,
        fabricated=moved,
        measured=f"seat moved to the other session in {moved} of {len(modes)} (a tool reading, a tool "
        f"appending); its own later reading lost in {lost}",
    )


WATCH_UNTIL_FIRST_EVENT = "watch-until-first-event"
BOUNDED_RUN_S = 60


def bounded_run(argv: list[str], **kwargs: Any) -> tuple[int | None, str, float]:
    """Exit status (None: still running after BOUNDED_RUN_S, then killed), stderr, seconds taken.
    `[WATCH_UNTIL_FIRST_EVENT, CATALOG]`: `hctx watch` on CATALOG, stopped once it printed an event."""
    started = time.monotonic()
    if argv[0] == WATCH_UNTIL_FIRST_EVENT:
        process = watch_process(Path(argv[1]), "--reread", "600")
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], BOUNDED_RUN_S)
        status, _, err = stop_watch(process)
        return (status if ready else None), err, time.monotonic() - started
    try:
        done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=BOUNDED_RUN_S, **kwargs)
    except subprocess.TimeoutExpired as exc:
        return None, str(exc.stderr or ""), time.monotonic() - started
    return done.returncode, done.stderr, time.monotonic() - started


@fault("hostile-local-files")
def hostile_local_files(work: Path, scale: Scale) -> Row:
    """Issue 26.6 and 24: seats with `"pid": 1e400`, 100,000-deep nesting or a FIFO in their place; the
    watch state or lock file a symlink or a FIFO; `hctx replay` of a FIFO or /dev/zero. Each ends in a
    clear message and the tool going on (or refusing), never a traceback or a hang."""
    outside = work / "outside"
    outside.write_text("not hctx's\n")
    cases: list[tuple[str, Callable[[Path], list[str]], int]] = []

    def seats(content: bytes | None) -> Callable[[Path], list[str]]:
        def make(root: Path) -> list[str]:
            (root / ".claude").mkdir(parents=True)
            if content is None:
                os.mkfifo(root / ".claude" / "hctx-seats.json")
            else:
                (root / ".claude" / "hctx-seats.json").write_bytes(content)
            return wrap_argv(root / "catalog", "c", sys.executable, "-c", "print('RAN')", harness="claude")

        return make

    def watch_file(name: str, kind: str) -> Callable[[Path], list[str]]:
        def make(root: Path) -> list[str]:
            directory = root / "catalog" / ".st2" / "watch"
            directory.mkdir(parents=True)
            put_watch_record(root / "catalog", HOST, "a", 85.0)
            if kind == "symlink":
                (directory / name).symlink_to(outside)
            else:
                os.mkfifo(directory / name)
            return [WATCH_UNTIL_FIRST_EVENT, str(root / "catalog")]

        return make

    def replay(path: str) -> Callable[[Path], list[str]]:
        def make(root: Path) -> list[str]:
            root.mkdir(parents=True)
            if path == "fifo":
                os.mkfifo(root / "fifo")
            return hctx_argv("replay", "--harness", "codex", str(root / "fifo") if path == "fifo" else path)

        return make

    cases += [
        (
            "seats 1e400",
            seats(b'{"original": null, "createdClaudeDir": false, "seats": [{"pid": 1e400, "startTime": 1}]}'),
            0,
        ),
        ("seats nested 100,000 deep", seats(b"[" * 100_000 + b"]" * 100_000), 0),
        ("seats a FIFO", seats(None), 0),
        ("watch state a symlink", watch_file("default.json", "symlink"), 0),
        ("watch state a FIFO", watch_file("default.json", "fifo"), 0),
        ("watch lock a symlink", watch_file("default.lock", "symlink"), 0),
        ("watch lock a FIFO", watch_file("default.lock", "fifo"), 0),
        ("replay a FIFO", replay("fifo"), 2),
        ("replay /dev/zero", replay("/dev/zero"), 2),
    ]
    survived = 0
    slowest = 0.0
    failures = []
    for index, (name, make, expected) in enumerate(cases):
        root = work / f"case{index}"
        argv = make(root)
        status, err, took = bounded_run(argv, cwd=root)
        slowest = max(slowest, took)
        ok = status == expected and "Traceback" not in err and ("set aside" in err or "not a regular file" in err)
        survived += ok
        if not ok:
            failures.append(f"{name}: exit {status}")
    changed_outside = int(outside.read_text() != "not hctx's\n")
    return Row(
        "hostile-local-files",
        len(cases),
        survived,
        outside=changed_outside,
        measured=f"each refused or set aside with a message, slowest {slowest:.1f}s; "
        + ("; ".join(failures) or "no traceback, no hang"),
    )


LEAVER = (
    "sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; "
    "(setsid sh -c 'sleep 300 & echo $! >> {pids}; wait' &); "
    "nohup sleep 300 >/dev/null 2>&1 & echo $! >> {pids}; {tail}"
)
# The command returns once all four children wrote their pids: the double-forked one writes its
# own, and one not written by the return would be ended before it could.
RETURNS = "while [ $(wc -l < {pids}) -lt 4 ]; do sleep 0.05; done; exit 0"


@fault("exec-leftovers")
def exec_leftovers(work: Path, scale: Scale) -> Row:
    """Issue 26.7: an --exec command backgrounds, `setsid`s, double-forks and nohups four children,
    then returns, or is still running when the watch stops: all four go, and a reader of the watch's
    stdout sees end of file."""
    rounds = pick(scale, ci=1, full=5)
    tried = left = 0
    slowest_eof = 0.0
    for round_ in range(rounds):
        for tail in (RETURNS, "exec sleep 300"):
            catalog, pids = work / f"c{round_}-{len(tail)}", work / f"pids{round_}-{len(tail)}"
            put_watch_record(catalog, HOST, "a", 85.0)
            command = LEAVER.format(pids=pids, tail=tail.format(pids=pids))
            process = watch_process(catalog, "--exec", command, "--reread", "600")
            wait_for(lambda p=pids: p.exists() and len(p.read_text().split()) == 4, timeout=30)  # type: ignore[misc]
            children = [int(pid) for pid in pids.read_text().split()]
            if tail == RETURNS:  # the command returned: its children go then, the watch runs on
                with contextlib.suppress(TimeoutError):
                    wait_for(lambda c=children: all(map(gone, c)), timeout=10)  # type: ignore[misc]
            started = time.monotonic()
            stop_watch(process)  # communicate() returns only once every holder of stdout has closed it
            slowest_eof = max(slowest_eof, time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda c=children: all(map(gone, c)), timeout=5)  # type: ignore[misc]
            running = [pid for pid in children if not gone(pid)]
            for pid in running:
                os.kill(pid, signal.SIGKILL)
            tried += len(children)
            left += len(running)
    return Row(
        "exec-leftovers",
        tried,
        tried - left,
        left,
        measured=f"{left} of {tried} children left running; stdout EOF {slowest_eof:.1f}s after SIGTERM at worst",
    )


@fault("stignore-control-chars")
def stignore_control_chars(work: Path, scale: Scale) -> Row:
    """Issue 26.8: a catalog path with a newline (or another control or line-separator character)
    must not put a live pattern (`!*`) into the printed .stignore."""
    paths = ["fleet\n!*\n", "fleet\r\n!*", "a\x1b[2Jb", "x\u2028!*", "x\u0085!*", "tab\t!*"]
    survived = injected = 0
    for path in paths:
        for extra in ((), ("--json",)):
            done = subprocess.run(
                hctx_argv("replication", "syncthing", *extra, "--catalog", str(work / path)),
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
            text = json.loads(done.stdout)["stignore"] if extra and done.returncode == 0 else done.stdout
            injected += any(line.strip() == "!*" for line in text.splitlines())
            survived += done.returncode == 2 and not done.stdout and "control characters" in done.stderr
    tried = 2 * len(paths)
    return Row(
        "stignore-control-chars",
        tried,
        survived,
        fabricated=injected,
        measured=f"{injected} live patterns injected; {survived} of {tried} refused (exit 2)",
    )


# --- the board's bounds (issue 40) -------------------------------------------------------------

BOARD_HELD_PER_PAGE_KB = 1024  # one page that never reads; a copy of the snapshot was 1.7 KB per agent


@contextlib.contextmanager
def board_serving(
    catalog: Path, *extra: str, descriptors: int | None = None
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`hctx web` on `catalog` (its stderr kept for the row), its port; `descriptors`: its RLIMIT_NOFILE."""

    def limit() -> None:
        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    board = subprocess.Popen(
        [sys.executable, "-m", "wrapper.cli", "web", "--catalog", str(catalog), "--host", "alpha",
         "--listen", "127.0.0.1:0", "--reread", "600", *extra],
        env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=limit,
    )  # fmt: skip
    try:
        assert board.stdout is not None
        url = board.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"hctx web did not start: {url!r}")
        yield board, int(url.rstrip("/").rsplit(":", 1)[1])
    finally:
        if board.poll() is None:
            board.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                board.wait(timeout=20)
        if board.poll() is None:
            board.kill()
            board.wait()


def _board_status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=60) as answer:
        found: dict[str, Any] = json.loads(answer.read())
        return found


def _open_event_stream(port: int, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


def _stderr_of(board: subprocess.Popen[str]) -> str:
    board.terminate()
    _, stderr = board.communicate(timeout=30)
    return stderr


@fault("board-silent-streams")
def board_silent_streams(work: Path, scale: Scale) -> Row:
    """Pages that open the event stream and never read, on a large catalog: each holds at most a
    piece of the snapshot (never its own copy), and the write timeout drops every one of them."""
    from scripts.bench_roster import build_catalog

    agents, silent = pick(scale, ci=2000, full=10000), pick(scale, ci=30, full=100)
    _raise_fd_limit(silent + 300)
    catalog = work / "catalog"
    build_catalog(catalog, agents, int(time.time() * 1000))
    timeout_s = 2.0
    with board_serving(catalog, "--write-timeout", str(timeout_s)) as (board, port):
        wait_for(lambda: _board_status(port)["agents"] == agents, timeout=120, what="the board's first read")
        with _open_event_stream(port) as warm, contextlib.suppress(OSError):  # the snapshot encoded, once
            warm.settimeout(1)  # for every page: read for 3 s (the ages tick every second)
            warmed = time.monotonic() + 3
            while warm.recv(1 << 20) and time.monotonic() < warmed:
                pass
        before = _proc_status(board.pid, "VmRSS")
        socks = [_open_event_stream(port, receive_buffer=4096) for _ in range(silent)]
        try:
            wait_for(lambda: _board_status(port)["streams"] == silent, timeout=30, what="every page served")
            time.sleep(1.0)  # each sent what its connection takes
            held_kb = (_proc_status(board.pid, "VmRSS") - before) / silent
            started = time.monotonic()
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: _board_status(port)["streams"] == 0, timeout=timeout_s + 30, what="dropped")
            took = time.monotonic() - started
            left = _board_status(port)["streams"]
        finally:
            for sock in socks:
                sock.close()
        alive = board.poll() is None
        tracebacks = _stderr_of(board).count("Traceback")
    failed = None
    if held_kb > BOARD_HELD_PER_PAGE_KB:
        failed = f"{held_kb:.0f} KB held per silent page"
    elif left:
        failed = f"{left} silent pages still served {took:.0f} s later"
    elif tracebacks:
        failed = f"{tracebacks} tracebacks on stderr"
    return Row(
        "board-silent-streams", silent, silent - left if alive else 0,
        measured=f"{agents} agents: {held_kb:.0f} KB held per page that never reads (bound "
        f"{BOARD_HELD_PER_PAGE_KB}); all dropped {took:.1f} s after (write timeout {timeout_s:g} s)",
        failed=failed,
    )  # fmt: skip


@fault("board-stream-cap")
def board_stream_cap(work: Path, scale: Scale) -> Row:
    """Under `ulimit -n 1024`, 1,100 event streams at once: those past the cap are refused (503),
    a new page is still served, and stderr holds no traceback."""
    from scripts.bench_roster import build_catalog

    streams = 1100
    _raise_fd_limit(streams + 300)
    catalog = work / "catalog"
    build_catalog(catalog, 50, int(time.time() * 1000))
    answered = {b"200": 0, b"503": 0}
    with board_serving(catalog, descriptors=1024) as (board, port):
        socks = []
        deadline = time.monotonic() + 90  # a board that locks clients out answers none of them
        try:
            for _ in range(streams):
                if time.monotonic() > deadline:
                    break
                sock = _open_event_stream(port)
                sock.settimeout(5)
                with contextlib.suppress(OSError):
                    code = sock.recv(64).split(b" ", 2)[1:2]
                    if code and code[0] in answered:
                        answered[code[0]] += 1
                socks.append(sock)
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=20) as answer:
                    page = answer.status == 200 and b"agent-00049" in answer.read()
            except OSError:
                page = False
            page_ms = (time.monotonic() - started) * 1000
            served = _board_status(port)["streams"]
        finally:
            for sock in socks:
                sock.close()
        alive = board.poll() is None
        stderr = _stderr_of(board)
    tracebacks = stderr.count("Traceback")
    failed = None
    if not page:
        failed = "a new page was not served"
    elif tracebacks:
        failed = f"{tracebacks} tracebacks on stderr"
    elif not answered[b"503"] or "refused" not in stderr:
        failed = "nothing was refused"
    return Row(
        "board-stream-cap", streams, sum(answered.values()) if alive else 0, lost=streams - sum(answered.values()),
        measured=f"ulimit -n 1024: {answered[b'200']} streams served ({served} open), {answered[b'503']} refused "
        f"with 503; a new page in {page_ms:.0f} ms; stderr {len(stderr.splitlines())} lines, {tracebacks} tracebacks",
        failed=failed,
    )  # fmt: skip


def _read_chars(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _settled_read_chars(pid: int, timeout: float = 30) -> int:
    """The board's read bytes once it stops reading: what its whole read once the file watching arms
    reads (the accounts' history under .st2, issue 39; no record, each written RACY_NS before the
    board started) is not the burst's."""
    before, deadline = _read_chars(pid), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if (now := _read_chars(pid)) == before:
            break
        before = now
    return before


@fault("board-api-agents-burst")
def board_api_agents_burst(work: Path, scale: Scale) -> Row:
    """Concurrent `/api/agents` on a large catalog: served from the board's cache (the exporter's
    CatalogCache), so the burst reads no record again, answers each whole, and stays in memory."""
    from concurrent.futures import ThreadPoolExecutor

    from scripts.bench_roster import build_catalog

    agents, concurrent = pick(scale, ci=2000, full=10000), pick(scale, ci=20, full=50)
    catalog = work / "catalog"
    build_catalog(catalog, agents, int(time.time() * 1000))
    records = list(catalog.glob("agents/*/*/harness-*"))
    record_bytes = sum(path.stat().st_size for path in records)
    # Written well before the board's first read, no record is racily clean (guard.catalog.RACY_NS):
    # the whole read once the file watching arms reads none again, however late it comes.
    past = time.time_ns() - 2 * RACY_NS
    for path in records:
        os.utime(path, ns=(past, past))
    with board_serving(catalog) as (board, port):
        wait_for(lambda: _board_status(port)["agents"] == agents, timeout=120, what="the board's first read")
        read_before = _settled_read_chars(board.pid)

        def fetch(_: int) -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/agents", timeout=300) as answer:
                return len(json.loads(answer.read())) == agents

        started = time.monotonic()
        with ThreadPoolExecutor(concurrent) as pool:
            whole = sum(pool.map(fetch, range(concurrent)))
        took = time.monotonic() - started
        read = _read_chars(board.pid) - read_before
        peak_mb = _proc_status(board.pid, "VmHWM") / 1024
        alive = board.poll() is None
    failed = None
    if read >= record_bytes:
        failed = f"the burst read {read} bytes; the catalog's records are {record_bytes}"
    elif peak_mb > METRICS_RSS_BOUND_MB[scale] * 2:
        failed = f"peak RSS {peak_mb:.0f} MB"
    return Row(
        "board-api-agents-burst", concurrent, whole if alive else 0, lost=concurrent - whole,
        measured=f"{agents} agents, {concurrent} at once: all answered in {took:.1f} s, {read / 1e6:.2f} MB read "
        f"(the records are {record_bytes / 1e6:.1f} MB), peak RSS {peak_mb:.0f} MB",
        failed=failed,
    )  # fmt: skip


# Issue 40: a recording is data. One of each harness's committed recordings, with a `fact` line
# inserted after its header that names a class of the harness's own package pydantic builds no
# schema for (its producer), is replayed by `hctx replay`.
REPLAY_FACT_RECORDINGS = {
    "claude": "claude/session-2.1.332.rec",
    "codex": "codex/codex-0.151.0-stdio-main.rec",
    "opencode": "opencode/v1.18.33/session.rec",
    "pi": "pi/pi-1.6.0-w4k.rec",
}


@fault("replay-fact-no-schema")
def replay_fact_no_schema(work: Path, scale: Scale) -> Row:
    """Issue 40: `hctx replay` of a recording whose `fact` line names a class pydantic cannot build
    a schema for must say so for that line (exit 1) and print the very writes the recording makes
    without it: never a traceback, never a write of its own."""
    from sidecar.registry import spec_for

    tried = survived = fabricated = 0
    said = []
    for harness, name in REPLAY_FACT_RECORDINGS.items():
        source = REPO / "fixtures" / "recordings" / name
        producer = type(spec_for(harness).make_producer())
        fact = {"at_ms": 0, "fact": f"{producer.__module__}:{producer.__qualname__}", "value": {}}
        header, _, rest = source.read_bytes().partition(b"\n")
        hostile = work / f"{harness}.rec"
        hostile.write_bytes(header + b"\n" + json.dumps(fact).encode() + b"\n" + rest)
        clean = subprocess.run(hctx_argv("replay", str(source)), env=child_env(), capture_output=True, timeout=60)
        done = subprocess.run(hctx_argv("replay", str(hostile)), env=child_env(), capture_output=True, timeout=60)
        err = done.stderr.decode(errors="replace")
        tried += 1
        survived += done.returncode == 1 and "Traceback" not in err and "line 2: fact" in err
        fabricated += done.stdout != clean.stdout or not clean.stdout
        said.append(f"{harness}: exit {done.returncode}")
    return Row(
        "replay-fact-no-schema",
        tried,
        survived,
        fabricated=fabricated,
        measured=f"{'; '.join(said)}; {fabricated} replays whose writes differ from the clean recording's",
    )


# --- the table ----------------------------------------------------------------------------------

COLUMNS = ("FAULT", "TRIED", "SURVIVED", "LOST", "TORN", "FABRICATED", "OUTSIDE", "MEASURED")


# --- issue 40: recordings safe to share and to keep; a subagent never the agent; readers' text ----------


def _recording_streams(data: bytes) -> bytes:
    """Every chunk's bytes a recording holds, decoded, one after the other."""
    from sidecar.replay import read_chunks

    return b"".join(chunk.data for chunk in read_chunks(data))


PLANTED = {"email": "alice.planted@example.com", "token": "eyJPLANTEDtoken42", "apiKey": "sk-PLANTED-key",
           "prompt": "PLANTED prompt: my password is hunter2"}  # fmt: skip


@fault("recording-redacted")
def recording_redacted(work: Path, scale: Scale) -> list[Row]:
    """A recording is redacted by default: every capture under fixtures/ redacted replays to the
    very writes (and drops) of the whole; a real `hctx wrap --record` session whose harness sends
    an email, a token, an apiKey and a prompt on its channel records none of them, and replays to
    the writes its sidecar logged."""
    from sidecar.recorder import redact_recording
    from sidecar.registry import spec_for
    from sidecar.replay import header_of, replay_bytes, write_line

    def replayed(data: bytes) -> tuple[list[str], dict[str, int]]:
        writes, summary = replay_bytes(spec_for(header_of(data)["harness"]), data)
        return [write_line(write) for write in writes], dict(summary.drops)

    captures = sorted((REPO / "fixtures").rglob("*.rec"))
    same = sum(1 for path in captures if replayed(redact_recording(path.read_bytes())) == replayed(path.read_bytes()))
    fixtures = Row("recording-redacted-captures", len(captures), same, len(captures) - same,
                   measured=f"{same} of {len(captures)} captures replay to the same writes redacted")  # fmt: skip

    trials = pick(scale, ci=2, full=10)
    survived = leaked = lost = 0
    for trial in range(trials):
        catalog, recording = work / f"redacted-{trial}", work / f"redacted-{trial}.rec"
        secrets = [json.dumps({"type": "message_end", **PLANTED, "nested": {"text": PLANTED["prompt"]}})]
        percents = [float(n) for n in range(1, 11)]
        frames = secrets + [frame(percent).decode() for percent in percents]
        record = AgentDir(catalog, HOST, "a").context_path
        argv = wrap_argv(catalog, "a", sys.executable, "-c", STREAMER, str(record), json.dumps(frames))
        argv[argv.index("--") : argv.index("--")] = ["--record", str(recording)]
        status = subprocess.run(argv, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=90)
        data = recording.read_bytes()
        found = [name for name, secret in PLANTED.items() if secret.encode() in data + _recording_streams(data)]
        leaked += len(found)
        lived = [e["usedPercent"] for e in log_events(catalog, "a") if e.get("event") == "write"]
        writes, _ = replay_bytes(spec_for("pi"), data)
        replay_ok = [w.record.used_percent for w in writes] == lived and lived and lived[-1] == percents[-1]
        survived += int(status.returncode == 0 and not found and bool(replay_ok))
        lost += int(not replay_ok)
    live = Row("recording-redacted-session", trials, survived, lost,
               measured=f"{leaked} of {trials * len(PLANTED)} planted secrets in the recordings",
               failed=f"{leaked} secrets recorded" if leaked else None)  # fmt: skip
    return [fixtures, live]


@fault("recording-swapped-path")
def recording_swapped_path(work: Path, scale: Scale) -> Row:
    """The recording renamed away and a FIFO put at its path, then the sidecar SIGKILLed: the
    replacement never opens the path (it blocked in open() on the FIFO for good): it comes up, the
    newest reading lands, and the rest of the session goes to the file the wrapper created."""
    trials = pick(scale, ci=2, full=10)
    survived = lost = torn = fake = both = 0
    waited: list[int] = []
    for trial in range(trials):
        catalog, recording, moved = work / f"swap-{trial}", work / f"swap-{trial}.rec", work / f"swap-{trial}.moved"
        argv, sent = streamer(catalog, "a", 60)
        argv[argv.index("--") : argv.index("--")] = ["--record", str(recording)]
        wrapper = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            first = wait_for(lambda c=catalog: starts(c, "a"), timeout=30, what="a sidecar")[0]  # type: ignore[misc]
            # The first sidecar logs its start before its recorder's thread writes the header: on a
            # loaded machine a kill right after the start beats that write. Its header in the file
            # first, so the second one counted below is the replacement's, through the held file.
            wait_for(lambda r=recording: b'"format"' in r.read_bytes(), timeout=30, what="the first header")  # type: ignore[misc]
            recording.rename(moved)
            os.mkfifo(recording)
            killed = time.monotonic()
            os.kill(int(first["pid"]), signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda c=catalog: len(starts(c, "a")) == 2, timeout=30, what="the replacement")  # type: ignore[misc]
            waited.append(int((time.monotonic() - killed) * 1000))
            status = wrapper.wait(timeout=120)  # its exit steps are Python processes: slow on a loaded machine
        finally:
            if wrapper.poll() is None:
                wrapper.kill()
                wrapper.wait()
        record, was_torn = read_record(catalog, "a")
        torn += was_torn
        fake += fabricated(record, sent)
        headers = moved.read_bytes().count(b'"format"')
        both += headers == 2
        ok = status == 0 and record is not None and record.used_percent == max(sent)
        if ok and recording.is_fifo() and headers == 2:
            survived += 1
        else:
            lost += 1
    return Row("recording-swapped-path", trials, survived, lost, torn, fake,
               f"replacement up {max(waited, default=0)} ms after the kill at worst; 0 bytes to the path; "
               f"{both} of {trials} files hold both sidecars' headers")  # fmt: skip


@fault("recording-full-disk")
def recording_full_disk(work: Path, scale: Scale) -> Row:
    """The recording on a full disk (/dev/full: every write ENOSPC, the close again): each sidecar,
    the first and its replacement, logs `recording-failed` once and goes on; every reading lands."""
    trials = pick(scale, ci=2, full=10)
    survived = lost = torn = fake = 0
    failures: list[int] = []
    for trial in range(trials):
        catalog = work / f"full-{trial}"
        full = os.open("/dev/full", os.O_WRONLY | os.O_APPEND)
        sidecar = Sidecar(catalog, "a", record_fd=full)
        sent: set[float] = set()
        try:
            for incarnation in range(2):  # the first, then the one the wrapper would start after a crash
                sidecar.start()
                for n in range(1, 6):
                    percent = float(10 * incarnation + n)
                    sent.add(percent)
                    send(sidecar.channel, frame(percent))
                landed = sidecar.wait_percent(max(sent), timeout=15) is not None
                alive = sidecar.alive()
                if incarnation == 0:
                    sidecar.kill()
                else:
                    alive = alive and sidecar.stop() == 0
                survived += int(landed and alive)
                lost += int(not landed)
            record, was_torn = read_record(catalog, "a")
            torn += was_torn
            fake += fabricated(record, sent)
        finally:
            sidecar.close()
            os.close(full)
        failures.append(sum(1 for e in log_events(catalog, "a") if e.get("event") == "recording-failed"))
    said_once = all(count == 2 for count in failures)  # two sidecars a trial
    return Row("recording-full-disk", 2 * trials, survived, lost, torn, fake,
               f"recording-failed logged {failures} times (once per sidecar)",
               failed=None if said_once else "recording-failed not logged once a sidecar")  # fmt: skip


@fault("subagent-is-the-agent")
def subagent_is_the_agent(work: Path, scale: Scale) -> Row:
    """A Codex child spawned as the agent's own thread, an OpenCode child that is its own parent
    (a task part, a session): refused and counted, the agent's reading stays the agent's."""
    from guard.policy import WriteGuard
    from sidecar.harnesses.codex import producer as codex
    from sidecar.harnesses.codex.events import SubagentsSpawned, ThreadOpened, TokenUsage
    from sidecar.harnesses.opencode import producer as opencode
    from sidecar.pipeline import Pipeline

    outcomes: list[bool] = []
    pipeline = Pipeline(codex.CodexProducer(), WriteGuard("a", "i"))
    pipeline.feed(ThreadOpened(thread_id="p"), 1)
    usage = TokenUsage(thread_id="p", tokens_in_window=32_066, session_total_tokens=32_066, context_window=190_000)
    pipeline.feed(SubagentsSpawned(sender_thread_id="p", thread_ids=("p",), model=None), 2)
    pipeline.feed(usage, 3)
    held = pipeline.producer.held.reading  # type: ignore[attr-defined]
    outcomes.append(pipeline.drops["producer"] == 1 and held.used_tokens == 32_066 and held.subagents == ())
    part = {
        "id": "e1",
        "type": "message.part.updated",
        "properties": {
            "part": {
                "type": "tool",
                "tool": "task",
                "sessionID": "p",
                "state": {"status": "running", "metadata": {"sessionId": "p", "parentSessionId": "p"}},
            }
        },
    }
    session = {"id": "e1", "type": "session.updated", "properties": {"info": {"id": "p", "parentID": "p"}}}
    message = {"id": "e2", "type": "message.updated", "properties": {"info": {"id": "m", "role": "assistant",
               "sessionID": "p", "providerID": "fake", "modelID": "small", "tokens": {"total": 30_100}}}}  # fmt: skip
    for hostile in (part, session):
        pipeline = Pipeline(opencode.OpenCodeProducer(), WriteGuard("a", "i"))
        for raw in (hostile, message):
            for event in opencode.parse_event(json.dumps(raw).encode()):
                pipeline.feed(event, 2)
        held = pipeline.producer.held.reading  # type: ignore[attr-defined]
        outcomes.append(pipeline.drops["producer"] == 1 and held is not None and held.used_tokens == 30_100
                        and held.subagents == ())  # fmt: skip
    ok = sum(outcomes)
    return Row("subagent-is-the-agent", len(outcomes), ok, len(outcomes) - ok,
               measured="codex spawn of its own thread; opencode task part and session naming themselves")  # fmt: skip


@fault("subagents-one-millisecond")
def subagents_one_millisecond(work: Path, scale: Scale) -> Row:
    """40 subagents started in one millisecond: the record keeps the newest 16, newest first."""
    from guard.record import MAX_SUBAGENTS
    from sidecar.harnesses.codex import producer as codex
    from sidecar.harnesses.codex.events import SubagentsSpawned, ThreadOpened

    producer = codex.CodexProducer()
    producer.feed(ThreadOpened(thread_id="p"), 0)
    for n in range(40):
        producer.feed(SubagentsSpawned(sender_thread_id="p", thread_ids=(f"c{n}",), model=None), 7)
    held = producer.held.reading
    kept = [] if held is None else [row.id for row in held.subagents]
    ok = kept == [f"c{n}" for n in range(39, 39 - MAX_SUBAGENTS, -1)]
    return Row("subagents-one-millisecond", 1, int(ok), int(not ok), measured=f"kept {kept[:2]}…{kept[-1:]}")


@fault("label-carries-no-email")
def label_carries_no_email(work: Path, scale: Scale) -> Row:
    """A config directory named after its login: the account label never carries the email."""
    from sidecar.harnesses.claude.account import claude_account
    from sidecar.harnesses.codex.account import codex_account

    accounts = REPO / "fixtures" / "accounts"
    claude_json = (accounts / "claude-2.1.332-seat-A.claude.json").read_bytes()
    codex_json = (accounts / "codex-0.171.0-seat-A.auth.json").read_bytes()
    wheres = ["~/.claude-alice@example.com", "/srv/bob.smith@corp.example/.codex", "~/x@y", "~/a b@c d"]
    labels = [account.label for where in wheres
              for account in (claude_account(claude_json, where, "max"), codex_account(codex_json, where))
              if account is not None]  # fmt: skip
    clean = sum(1 for label in labels if label is not None and "@" not in label)
    return Row("label-carries-no-email", 2 * len(wheres), clean, 2 * len(wheres) - clean,
               measured=f"e.g. {labels[0]!r}")  # fmt: skip


@fault("reader-bidi-and-separators")
def reader_bidi_and_separators(work: Path, scale: Scale) -> Row:
    """A bidi override, a line separator and other unprintables in a subagent's model and the
    agent's own: `agents`, `top` and `inspect` print every one escaped."""
    unseen = "\u202e\u2028\u2029\u200e\u200f\u061c\u2066\u200b\ufeff"
    catalog = work / "bidi"
    put_watch_record(catalog, HOST, "evil", 1.0)
    path = catalog / "agents" / HOST / "evil" / "harness-context"
    record = json.loads(path.read_text())
    sub = {"id": "a91242bfc47ae887e", "name": "general-purpose", "model": f"evil{unseen}", "usedTokens": 9_000,
           "windowTokens": 150_000, "usedPercent": 6.0, "windowSource": "model-table", "compactions": 0,
           "state": "running", "observedAtMs": record["observedAtMs"]}  # fmt: skip
    path.write_text(json.dumps(record | {"model": f"m{unseen}", "subagents": [sub]}) + "\n")
    shown = []
    for command in (("agents",), ("top", "--once"), ("inspect", "evil")):
        argv = [sys.executable, "-m", "wrapper.cli", *command, "--catalog", str(catalog), "--host", HOST]
        shown.append(subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=60).stdout)
    raw = [output for output in shown if set(unseen) & set(output)]
    escaped = sum(1 for output in shown if "\\u202e" in output)
    return Row("reader-bidi-and-separators", len(shown), len(shown) - len(raw), len(raw),
               measured=f"{escaped} of 3 readers showed the model (escaped)",
               failed=None if escaped >= 2 else "the hostile model was not shown escaped")  # fmt: skip


def render(rows: list[Row]) -> str:
    width = max(len(COLUMNS[0]), *(len(row.fault) for row in rows))
    lines = [f"{COLUMNS[0]:<{width}} {' '.join(f'{c:>10}' for c in COLUMNS[1:7])}  {COLUMNS[7]}"]
    for row in rows:
        numbers = (row.tried, row.survived, row.lost, row.torn, row.fabricated, row.outside)
        verdict = "" if row.ok else f"  FAILED: {row.failed or 'counts'}"
        lines.append(f"{row.fault:<{width}} {' '.join(f'{n:>10}' for n in numbers)}  {row.measured}{verdict}")
    return "\n".join(lines)


def run(scale: Scale = "ci", only: list[str] | None = None) -> list[Row]:
    rows = []
    for name, function in FAULTS.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"hctx-{name}-") as work:
            try:
                made = function(Path(work), scale)
                rows.extend(made if isinstance(made, list) else [made])
            except Exception as exc:  # a fault that breaks the harness of the suite is a failed row
                rows.append(Row(name, 1, 0, measured=f"{type(exc).__name__}: {exc}"[:200], failed="raised"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=("ci", "full"), default="ci")
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS))
    args = parser.parse_args(argv)
    rows = run(args.scale, args.only)
    print(render(rows))
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
