"""A fork server for the crash-safety tests: one Python process with guard imported, forking writers.

Starting a fresh interpreter per kill costs ~0.25 s, which would put 200 kills past a minute; a
fork of this already-initialized process starts writing within a millisecond. Each forked writer
loops `write_context` until SIGKILLed, announcing every write through a shared 16-byte progress
file: the counter it is about to write, then the counter it has written. The test reads that file
only after the writer is dead, so it knows exactly which records could be on disk.

Protocol on stdin/stdout, one line each way:
  spawn CATALOG HOST IDENTITY WORKER PROGRESS_FILE  ->  PID
  reap PID                                          ->  WAIT_STATUS
EOF on stdin kills whatever writer is still running and exits.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from guard.layout import AgentDir
from guard.record import COMPACTION_TRIGGERS, HarnessContext, RateLimits
from guard.store import write_context
from sidecar.registry import BUILT_IN

PROGRESS = struct.Struct("<qq")  # (attempted, completed); -1 before the first
COUNTER_STRIDE = 10_000_000  # worker k writes counters k * STRIDE + 0, 1, 2, ...
BASE_MS = 1_788_000_000_000
WRITER_LIFETIME_S = 30.0  # a writer orphaned by a crashed test stops on its own
PADDING = "x" * 3000  # a record of a few KiB: a torn write would have room to show


def expected_record(identity: str, worker: int, counter: int) -> HarnessContext:
    """The one record writer `worker` writes for `counter`: every field derived from the counter."""
    n = worker * COUNTER_STRIDE + counter
    return HarnessContext(
        agent=identity,
        harness=tuple(BUILT_IN)[n % len(BUILT_IN)],
        used_tokens=n,
        window_tokens=10**12,
        used_percent=n / 8,
        model=f"model-{n}-{PADDING}",
        cost_usd=n / 100,
        session_total_tokens=3 * n,
        rate_limits=RateLimits(five_hour=float(n % 101), seven_day=None),
        compactions=n % 13,
        last_compaction_ms=BASE_MS + n // 2,
        last_compaction_trigger=COMPACTION_TRIGGERS[n % len(COMPACTION_TRIGGERS)],
        incarnation=f"worker-{worker}",
        observed_at_ms=BASE_MS + n,
        written_at_ms=BASE_MS + n,
    )


def counter_of(record: HarnessContext) -> tuple[int, int]:
    """(worker, counter) a record claims to come from; the caller checks it against expected_record."""
    worker = int(record.incarnation.removeprefix("worker-"))
    return worker, (record.used_tokens or 0) - worker * COUNTER_STRIDE


def _write_forever(agent: AgentDir, worker: int, progress_path: str) -> None:
    fd = os.open(progress_path, os.O_RDWR)
    progress = mmap.mmap(fd, PROGRESS.size)
    os.close(fd)
    deadline = time.monotonic() + WRITER_LIFETIME_S
    counter = 0
    while time.monotonic() < deadline:
        record = expected_record(agent.identity, worker, counter)
        progress[0:8] = struct.pack("<q", counter)
        write_context(agent, record)
        progress[8:16] = struct.pack("<q", counter)
        counter += 1


def _spawn(catalog: str, host: str, identity: str, worker: str, progress: str) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _write_forever(AgentDir(Path(catalog), host, identity), int(worker), progress)
    except BaseException:
        traceback.print_exc()
        code = 3
    finally:
        os._exit(code)


def main() -> None:
    children: set[int] = set()
    try:
        for line in sys.stdin:
            command, *args = line.split()
            if command == "spawn":
                pid = _spawn(*args)
                children.add(pid)
                reply = str(pid)
            elif command == "reap":
                pid = int(args[0])
                _, status = os.waitpid(pid, 0)
                children.discard(pid)
                reply = str(status)
            else:
                reply = f"error unknown command {command!r}"
            print(reply, flush=True)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main()
