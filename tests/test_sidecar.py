"""The sidecar process on its own: hostile channel input end to end, stragglers, the lifeline."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from guard.layout import AgentDir
from guard.record import HarnessContext, parse_record
from guard.state import AgentLock, read_state
from sidecar.registry import spec_for
from sidecar.streams import Streams
from tests.conftest import failing_writer, submit_channel_bytes
from tests.wrapping import HOST, agent_dir, context_frame, env, log_events, pid_gone, wait_for
from wrapper.launch.launcher import WrapOptions, claim


@contextmanager
def sidecar(catalog: Path, agent: str, incarnation: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"hctx-t-{os.getpid()}-{incarnation[:8]}"
    directory.mkdir(mode=0o700)
    path = directory / "ch"
    lifeline_read, lifeline_write = os.pipe()
    argv = [
        *(sys.executable, "-m", "sidecar", "--harness", "pi", "--catalog", str(catalog), "--host", HOST),
        *("--agent", agent, "--incarnation", incarnation, "--channel", str(path)),
        *("--lifeline-fd", str(lifeline_read)),
    ]
    process = subprocess.Popen(argv, env=env(), pass_fds=(lifeline_read,))
    os.close(lifeline_read)
    try:
        wait_for(path.exists, what="channel socket")
        yield process, path
    finally:
        os.close(lifeline_write)
        process.wait(timeout=10)
        directory.rmdir()


def send(path: Path, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        client.sendall(data)


def record_of(catalog: Path, agent: str) -> HarnessContext | None:
    path = agent_dir(catalog, agent) / "harness-context"
    return parse_record(path.read_bytes()) if path.exists() else None


def test_hostile_input_leaves_the_sidecar_running_and_the_record_correct(tmp_path: Path) -> None:
    with sidecar(tmp_path, "victim", "inc-1") as (process, path):
        send(path, context_frame(300, 1000, 30.0).encode() + b"\n")
        wait_for(lambda: record_of(tmp_path, "victim"), what="first record")
        send(path, b"\x00garbage\n" + b"z" * (10 * 1024 * 1024) + b"\n" + b'{"type":"context","half')
        send(path, b'{"type":"context","reading":{"tokens":"many","contextWindow":-5}}\n')
        send(path, b'{"type":"nonsense"}\n{"type":"context","reading":[]}\n')
        for _ in range(200):
            send(path, b'{"type":"context"')  # a burst of half frames, each cut by a closed connection
        send(path, context_frame(520, 1000, 52.0).encode() + b"\n")
        record = wait_for(
            lambda: (r := record_of(tmp_path, "victim")) is not None and r.used_tokens == 520 and r,
            what="the good frame after the garbage",
        )
        assert process.poll() is None
    assert record.used_percent == 52.0 and record.window_tokens == 1000
    dropped = [e for e in log_events(tmp_path, "victim") if e["event"] == "frame-dropped"]
    assert dropped  # a flood of drops is logged once per window (sidecar.logs.RateLimit) ...
    exit_line = log_events(tmp_path, "victim")[-1]
    assert exit_line["event"] == "exit" and exit_line["dropped"] >= 205  # ... and every one counted


def test_a_straggler_from_an_old_incarnation_lands_visibly_older_and_is_overwritten(tmp_path: Path) -> None:
    agent = AgentDir(tmp_path, HOST, "relaunched")
    options = WrapOptions(agent=agent, harness="pi", argv=("true",))
    lock = AgentLock(agent)
    old = claim(options, lock)
    with sidecar(tmp_path, "relaunched", old) as (_, old_path):
        new = claim(options, lock, relaunch_of=old)  # the relaunch: new claim, record removed
        assert record_of(tmp_path, "relaunched") is None
        send(old_path, context_frame(900, 1000, 90.0).encode() + b"\n")
        straggler = wait_for(lambda: record_of(tmp_path, "relaunched"), what="straggler write")
    state = read_state(agent)
    assert state is not None and state.incarnation == new
    assert straggler.incarnation == old != state.incarnation
    with sidecar(tmp_path, "relaunched", new) as (_, new_path):
        time.sleep(0.01)
        send(new_path, context_frame(100, 1000, 10.0).encode() + b"\n")
        current = wait_for(
            lambda: (r := record_of(tmp_path, "relaunched")) is not None and r.incarnation == new and r,
            what="the new incarnation's reading",
        )
    assert current.used_tokens == 100
    assert current.observed_at_ms > straggler.observed_at_ms
    assert current.written_at_ms > straggler.written_at_ms


def test_the_sidecar_exits_when_its_lifeline_closes(tmp_path: Path) -> None:
    with sidecar(tmp_path, "mortal", "inc") as (process, _):
        pid = process.pid
    assert process.returncode == 0
    assert pid_gone(pid)


async def test_a_failed_write_is_retried_until_it_lands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trio

    from sidecar import app

    monkeypatch.setattr(app, "WRITE_RETRY_S", 0.05)
    config = app.SidecarConfig(tmp_path, HOST, "flaky", "pi", "inc", tmp_path / "unused")
    # Space returns after the first attempt: the store heals itself, since a test that cleared
    # `broken` on seeing it could wake after a stall in the same batch as the retry timer, too late.
    writer, store = failing_writer(config, OSError(28, "No space left on device"), failures=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        submit_channel_bytes(writer, context_frame(500, 1000, 50.0).encode() + b"\n", "pi")
        with trio.fail_after(30):  # a liveness bound: the retry is due 50 ms after the failure
            while record_of(tmp_path, "flaky") is None:  # noqa: ASYNC110 - a file has no event to await
                await trio.sleep(0.01)
        writer.close()
    assert [attempt.used_tokens for attempt in store.attempts] == [500, 500]  # the same reading, retried
    record = record_of(tmp_path, "flaky")
    assert record is not None and record.used_tokens == 500


async def test_a_failing_transport_costs_its_stream_not_the_sidecar(caplog: pytest.LogCaptureFixture) -> None:
    from sidecar.app import run_transport

    async def broken(config: dict[str, object], streams: object) -> None:
        raise ValueError("bad listen address")

    await run_transport(broken, {}, Streams(spec_for("codex"), lambda event: None))
    assert any("transport failed" in r.getMessage() for r in caplog.records)


def test_what_is_owed_at_exit_is_the_newest_write_with_the_edge_it_stands_for() -> None:
    from guard.policy import Write
    from sidecar.app import Outbox
    from tests.guard_factory import record

    outbox = Outbox()
    outbox.put(Write(record(used_tokens=10, observed_at_ms=1), "bucket"))
    outbox.put(Write(record(used_tokens=20, observed_at_ms=2), "compaction"))
    outbox.put(Write(record(used_tokens=30, observed_at_ms=3), "bucket"))
    assert len(outbox.pending) == 3  # in normal running every decided write waits its turn
    last = outbox.take_all()
    assert last is not None and (last.record.used_tokens, last.reason) == (30, "compaction")
    assert outbox.coalesced == 2  # the exit line counts the two that never landed on their own
    assert outbox.take_all() is None and outbox.coalesced == 2
