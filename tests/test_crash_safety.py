"""Crash safety of the store: SIGKILLed writers and concurrent writers never leave a torn record.

Writers are forks of tests/crash_writer.py (a Python process with the repository on sys.path and
guard imported once), so a few hundred kills at random moments fit in seconds.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_writer import PROGRESS, counter_of, expected_record

from guard.errors import RecordRefused
from guard.layout import AgentDir, staging_dir
from guard.record import HarnessContext, parse_record

TESTS = Path(__file__).resolve().parent
KILLS = 400
# Kills go on past KILLS until this many landed inside a write (on a loaded machine a child is often
# killed before it starts writing), at most MAX_KILLS.
MID_WRITE_KILLS = 100
MAX_KILLS = 4000
REPLY_TIMEOUT_S = 20.0
AGENT_FILES = {"harness-context", ".harness-context.lock"}


class ForkServer:
    def __init__(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS.parent), os.environ.get("PYTHONPATH")])),
        }
        self.process = subprocess.Popen(
            [sys.executable, str(TESTS / "crash_writer.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env,
        )  # fmt: skip

    def call(self, line: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], REPLY_TIMEOUT_S)
        assert ready, f"fork server did not answer {line!r}"
        reply = self.process.stdout.readline().strip()
        assert reply and not reply.startswith("error"), f"fork server answered {reply!r} to {line!r}"
        return reply

    def spawn(self, agent: AgentDir, worker: int, progress: Path) -> int:
        progress.write_bytes(PROGRESS.pack(-1, -1))
        return int(self.call(f"spawn {agent.catalog} {agent.host} {agent.identity} {worker} {progress}"))

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        status = int(self.call(f"reap {pid}"))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"writer {pid} ended on its own (wait status {status}); see its traceback above"
        )

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()


def _stray_entries(catalog: Path) -> set[str]:
    """Anything under agents/ but the record and its lock: a staging file would show here."""
    allowed = {"h1", "h1/crash", *(f"h1/crash/{name}" for name in AGENT_FILES)}
    return {str(p.relative_to(catalog / "agents")) for p in (catalog / "agents").rglob("*")} - allowed


def test_sigkilled_writer_never_leaves_a_torn_record(fork_server: ForkServer, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    agent = AgentDir(catalog, "h1", "crash")
    progress = tmp_path / "progress"
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    on_disk: HarnessContext | None = None
    survived = torn = wrong = mid_write = before_first_write = 0
    problems: list[str] = []
    started = time.monotonic()
    kills = 0
    while kills < KILLS or (mid_write < MID_WRITE_KILLS and kills < MAX_KILLS):
        worker, kills = kills, kills + 1
        pid = fork_server.spawn(agent, worker, progress)
        time.sleep(rng.choice([rng.uniform(0, 0.003), rng.uniform(0.002, 0.012)]))
        fork_server.kill(pid)

        attempted, completed = PROGRESS.unpack(progress.read_bytes())
        mid_write += attempted != completed
        before_first_write += attempted < 0
        # Exactly these can be on disk: the write in flight, else the last completed one, else
        # (nothing completed in this round) whatever the previous round left.
        candidates = [expected_record(agent.identity, worker, n) for n in {attempted, completed} if n >= 0]
        if completed < 0 and on_disk is not None:
            candidates.append(on_disk)
        try:
            data = agent.context_path.read_bytes()
        except FileNotFoundError:
            data = None
        current: HarnessContext | None = None
        if data is not None:
            try:
                current = parse_record(data)
            except RecordRefused as exc:
                torn += 1
                problems.append(f"kill {worker}: torn record ({exc}): {data[:80]!r}...")
        if current is None and (data is not None or on_disk is not None or completed >= 0):
            problems.append(f"kill {worker}: record missing or unreadable")
        elif current is not None and current not in candidates:
            wrong += 1
            problems.append(f"kill {worker}: record {counter_of(current)} is none of {attempted=} {completed=}")
        else:
            survived += 1
        if current is not None and on_disk is not None and current != on_disk:
            assert current.written_at_ms > on_disk.written_at_ms
        if stray := _stray_entries(catalog):
            problems.append(f"kill {worker}: staging debris under agents/: {sorted(stray)}")
        on_disk = current
    elapsed = time.monotonic() - started
    leftovers = len(os.listdir(staging_dir(catalog)))
    print(
        f"\ncrash loop (seed {seed}): {kills} SIGKILLs in {elapsed:.1f} s, {survived} survived, "
        f"{torn} torn, {wrong} wrong record, {mid_write} inside a write, "
        f"{before_first_write} before the first write, {leftovers} staging files left in .st2"
    )
    assert problems == []
    assert (torn, wrong) == (0, 0)
    assert survived == kills >= KILLS
    assert mid_write >= MID_WRITE_KILLS, "the kills did not land inside writes often enough to prove anything"
    assert leftovers <= mid_write  # debris only ever from a kill inside a write, and only in .st2


def test_two_concurrent_writers_never_tear_the_record(fork_server: ForkServer, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    agent = AgentDir(catalog, "h1", "crash")
    pids = [fork_server.spawn(agent, worker, tmp_path / f"progress-{worker}") for worker in (1, 2)]
    reads = torn = changes = 0
    seen: set[int] = set()
    problems: list[str] = []
    previous: HarnessContext | None = None
    try:
        # Two seconds of reads, and on until both writers were seen and the record changed often
        # enough to prove anything (30 s, a liveness bound: on a loaded machine, with two fsyncs a
        # write, changes are few a second).
        started = time.monotonic()
        while (spent := time.monotonic() - started) < 2.0 or (
            spent < 30.0 and not (seen == {1, 2} and reads > 100 and changes > 10)
        ):
            try:
                data = agent.context_path.read_bytes()
            except FileNotFoundError:
                continue  # only before the first write lands
            reads += 1
            try:
                current = parse_record(data)
            except RecordRefused as exc:
                torn += 1
                problems.append(f"torn read {reads}: {exc}")
                continue
            worker, counter = counter_of(current)
            expected = expected_record(agent.identity, worker, counter)
            # writtenAtMs is the one field the store may raise (above the other writer's record)
            if current.model_copy(update={"written_at_ms": expected.written_at_ms}) != expected:
                problems.append(f"read {reads}: a record neither writer wrote: {(worker, counter)}")
            if previous is not None and current != previous:
                changes += 1
                if current.written_at_ms <= previous.written_at_ms:
                    problems.append(
                        f"read {reads}: writtenAtMs went {previous.written_at_ms} -> {current.written_at_ms}"
                    )
            seen.add(worker)
            previous = current
            if stray := _stray_entries(catalog):
                problems.append(f"read {reads}: staging debris under agents/: {sorted(stray)}")
    finally:
        for pid in pids:
            fork_server.kill(pid)
    print(
        f"\nconcurrent writers: {reads} reads, {changes} record changes seen, {torn} torn, writers seen {sorted(seen)}"
    )
    assert problems == []
    assert torn == 0
    assert seen == {1, 2}, "the two writers never interleaved"
    assert reads > 100 and changes > 10
    assert parse_record(agent.context_path.read_bytes()).incarnation in {"worker-1", "worker-2"}
