"""Issue 15, the sidecar's side: faults and hostile peers that once stalled, ballooned or fooled it.

Each test pins one point of the issue: a full disk (1), memory while a write stalls (2), a sidecar
restarted for the same incarnation (3, the part the sidecar owns), bursts (4), held connections
(5), symlinked log paths (6), numbers out of their domain (10), names (11), a future writtenAtMs
(12), record encodings and huge percents in readers (13).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.constants import HARNESS_CONTEXT_HEARTBEAT_MS
from guard.errors import RecordRefused
from guard.layout import AgentDir, log_path
from guard.policy import Reading, WriteGuard
from guard.record import ContextFields, HarnessContext, parse_record
from guard.store import write_context
from scripts.fault_suite import (
    HOSTILE_FRAME,
    RSS_BOUND_MB,
    Burst,
    Sidecar,
    address_space_limit,
    alternating,
    codex_burst,
    fill,
    frame,
    held_lock,
    log_events,
    peak_rss_mb,
    running,
    send,
    tiny_filesystem,
    waits_for_lock,
)
from sidecar.decoding import Dropped
from sidecar.pipeline import Pipeline
from sidecar.spec import ConfigError
from tests.conftest import Received, failing_writer, raw_channel_decoder, submit_channel_bytes
from tests.guard_factory import record, wire_bytes
from tests.wrapping import HOST, agent_dir, context_frame, env, wait_for

DAY_MS = 24 * 60 * 60 * 1000


def exit_event(catalog: Path, agent: str) -> dict[str, Any]:
    exits = [e for e in log_events(catalog, agent) if e["event"] == "exit"]
    assert exits, "no exit line in the log"
    return exits[-1]


# --- 1. a full disk, stderr a pipe nobody drains ---------------------------------------------------


def test_a_full_disk_never_blocks_the_sidecar_and_the_newest_reading_lands_once_space_returns(
    tmp_path: Path,
) -> None:
    with tiny_filesystem(tmp_path / "disk") as disk:
        if disk is None:
            pytest.skip("needs a tmpfs mount (root)")
        with running(disk, "full", stderr=subprocess.PIPE) as sidecar:
            send(sidecar.channel, frame(5.0))
            assert sidecar.wait_percent(5.0) is not None
            filler = fill(disk)
            for _ in range(30):  # every one of these owes a write that fails, and log lines that fail too
                send(sidecar.channel, alternating(100))
            send(sidecar.channel, frame(42.0))
            time.sleep(0.5)
            filler.unlink()  # space returns: the newest reading is owed, nothing older
            record = sidecar.wait_percent(42.0, timeout=15)
            assert sidecar.process is not None and sidecar.process.stderr is not None
            os.set_blocking(sidecar.process.stderr.fileno(), False)
            assert sidecar.process.stderr.read() in (None, b"")  # not one byte into the harness's terminal
            assert sidecar.stop() == 0
    assert record is not None and record.used_percent == 42.0


def test_a_read_only_catalog_is_retried_on_schedule_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from sidecar import app

    monkeypatch.setattr(app, "WRITE_RETRY_S", 0.3)
    config = app.SidecarConfig(tmp_path, HOST, "ro", "pi", "inc", tmp_path / "unused")
    writer, store = failing_writer(config, OSError(errno.EROFS, "Read-only file system"))

    failing_s = 0.0

    async def scenario() -> None:
        nonlocal failing_s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            started = trio.current_time()
            for i in range(300):
                submit_channel_bytes(writer, frame(10.0 if i % 2 else 60.0), "pi")
                await trio.sleep(0.001)
            submit_channel_bytes(writer, frame(33.0), "pi")
            await trio.sleep(0.1)
            store.broken = False
            failing_s = trio.current_time() - started
            with trio.fail_after(5):
                while (rec := record_at(tmp_path, "ro")) is None or rec.used_percent != 33.0:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            writer.close()

    trio.run(scenario)
    # On the retry schedule, never once per frame: the first try, one per retry while the store
    # failed (the 301 frames take longer on a loaded machine, so more retries fall in), the landing.
    assert len(store.attempts) <= 2 + failing_s / app.WRITE_RETRY_S < 300
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert any(getattr(r, "event", None) == "write-recovered" for r in caplog.records)


def record_at(catalog: Path, agent: str) -> HarnessContext | None:
    path = agent_dir(catalog, agent) / "harness-context"
    return parse_record(path.read_bytes()) if path.exists() else None


def test_repeated_warnings_are_rate_limited_and_say_how_many_were_held_back(tmp_path: Path) -> None:
    code = (
        "import logging, sys; from pathlib import Path; from sidecar import logs;"
        "logs.configure(Path(sys.argv[1]), 'testhost', 'noisy');"
        "[logging.getLogger('sidecar.channel').warning('frame dropped: %s', i, extra={'event': 'frame-dropped'})"
        " for i in range(5000)]"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env(), check=True)
    events = log_events(tmp_path, "noisy", HOST)
    assert 1 <= len(events) <= 3
    assert events[0]["message"] == "frame dropped: 0"


# --- 2. memory is bounded in bytes while a write stalls --------------------------------------------


def test_a_stalled_lock_with_megabyte_frames_keeps_memory_bounded_and_coalesces(tmp_path: Path) -> None:
    with running(tmp_path, "stalled", preexec_fn=address_space_limit) as sidecar:
        send(sidecar.channel, frame(1.0))
        assert sidecar.wait_percent(1.0) is not None
        assert sidecar.process is not None
        with held_lock(tmp_path, "stalled"):
            send(sidecar.channel, frame(2.0))  # this write stalls in the lock
            # Once it waits there it is in flight; 0.3 s on, past STALLED_WRITE_S, only the newest
            # is owed. Slept from the send, a starved sidecar could take up the write with the burst.
            wait_for(lambda: waits_for_lock(tmp_path, "stalled", sidecar.pid), what="the write blocked on the lock")
            time.sleep(0.3)
            # One connection: frames on separate ones have no order, and the newest is the last sent.
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(sidecar.channel))
                client.sendall(b"".join(HOSTILE_FRAME + frame(float(2 + i)) for i in range(60)))
                # Every byte read, so the newest decided (a chunk's frames go through without a
                # checkpoint) before the lock is free: a starved sidecar could queue it behind a write.
                wait_for(lambda: unread(client) == 0, what="the sidecar to read the burst")
            assert sidecar.process.poll() is None
            peak = peak_rss_mb(sidecar.process.pid)
        assert sidecar.wait_percent(61.0) is not None  # the newest reading, once the lock is free
        assert sidecar.stop() == 0
    assert peak < RSS_BOUND_MB, f"peak RSS {peak:.0f} MB"
    writes = [e for e in log_events(tmp_path, "stalled") if e["event"] == "write"]
    assert [w["usedPercent"] for w in writes] == [1.0, 2.0, 61.0]  # the stalled one, then the newest: not sixty


def unread(client: socket.socket) -> int:
    """The bytes sent on unix socket `client` that its peer has not read yet (SIOCOUTQ)."""
    queued: int = struct.unpack("i", fcntl.ioctl(client.fileno(), termios.TIOCOUTQ, bytes(4)))[0]
    return queued


# --- 3. a sidecar restarted for the same incarnation and channel ---------------------------------


def test_a_sidecar_killed_and_started_again_with_the_same_arguments_serves_the_same_channel(tmp_path: Path) -> None:
    sidecar = Sidecar(tmp_path, "phoenix")
    try:
        sidecar.start()
        send(sidecar.channel, frame(20.0))
        assert sidecar.wait_percent(20.0) is not None
        sidecar.kill()  # its socket file is left behind
        assert sidecar.channel.exists()
        sidecar.start()
        send(sidecar.channel, frame(30.0))
        assert sidecar.wait_percent(30.0) is not None
        assert sidecar.stop() == 0
    finally:
        sidecar.close()
    starts = [e for e in log_events(tmp_path, "phoenix") if e["event"] == "start"]
    assert len(starts) == 2


async def test_the_codex_tap_reconnects_to_a_sidecar_started_again_on_the_same_channel(
    channel_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from scripts.fault_suite import tap_stream
    from sidecar import channel

    path = channel_dir / "s"
    received = Received()
    send_out, receive_out = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as first:  # the sidecar that dies
            await first.start(channel.serve, path, raw_channel_decoder, received.submit)
            nursery.start_soon(tap_stream, receive_out, "codex", path)
            await send_out.send_all(b'{"n":1}\n')
            with trio.fail_after(5):
                while not received:  # noqa: ASYNC110 - a list has no event to await
                    await trio.sleep(0.01)
            first.cancel_scope.cancel()
        await trio.sleep(0.1)
        await nursery.start(channel.serve, path, raw_channel_decoder, received.submit)  # the respawned sidecar
        with trio.fail_after(10):
            n = 2
            while not any(f.get("payload") == f'{{"n":{n - 1}}}' for f in received[1:]):
                await send_out.send_all(b'{"n":%d}\n' % n)
                n += 1
                await trio.sleep(0.05)
        await send_out.aclose()
        nursery.cancel_scope.cancel()


# --- 4. bursts: the newest reading lands, every drop is counted where it happens -------------------


def test_twenty_thousand_frames_back_to_back_and_the_newest_reading_lands(tmp_path: Path) -> None:
    with running(tmp_path, "burst") as sidecar:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sidecar.channel))
            client.sendall(alternating(20_000) + frame(77.0))
        record = sidecar.wait_percent(77.0, timeout=20)
        assert sidecar.stop() == 0
    assert record is not None and record.used_percent == 77.0
    events = log_events(tmp_path, "burst")
    dropped = [e for e in events if e["event"] == "frame-dropped"]
    assert exit_event(tmp_path, "burst")["dropped"] == len(dropped) == 0


def test_the_exit_line_counts_the_drops_of_the_channel_too(tmp_path: Path) -> None:
    with running(tmp_path, "counted") as sidecar:
        send(sidecar.channel, b"not json\n" * 3 + b'{"no":"type"}\n' + frame(50.0))
        assert sidecar.wait_percent(50.0) is not None
        assert sidecar.stop() == 0
    assert exit_event(tmp_path, "counted")["dropped"] == 4


async def test_the_codex_stdout_tap_delivers_the_newest_usage_after_a_burst(
    channel_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from scripts.fault_suite import tap_stream
    from sidecar import channel

    path = channel_dir / "s"
    data, usage = codex_burst(4000)
    received = Received()
    async with trio.open_nursery() as nursery:
        await nursery.start(channel.serve, path, raw_channel_decoder, received.submit)
        await tap_stream(Burst(data), "codex", path)
        with trio.fail_after(10):
            while not received or tapped_message(received[-1]) != usage[-1]:  # noqa: ASYNC110
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    payloads = [tapped_message(f) for f in received]
    assert usage[-1] in payloads
    assert capfd.readouterr().out.encode() == data  # the copy is untouched


def tapped_message(frame: dict[str, Any]) -> object:
    """The message a Codex tap frame carries: its payload is the stdout line as a string."""
    payload = frame.get("payload")
    return json.loads(payload) if isinstance(payload, str) else None


# --- 5. held connections never starve the harness's frames -----------------------------------------


async def test_two_thousand_idle_connections_do_not_keep_a_frame_out(
    channel_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar import channel

    # A frame kept out until silent connections are cut would wait a minute: far past the bound
    # below, which allows a loaded machine to accept the 2,000 connections first.
    monkeypatch.setattr(channel, "SILENT_TIMEOUT_S", 60.0)
    path = channel_dir / "s"
    received = Received()
    held: list[socket.socket] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(channel.serve, path, raw_channel_decoder, received.submit)
            for _ in range(2000):
                idle = socket.socket(socket.AF_UNIX)
                idle.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    idle.connect(str(path))
                held.append(idle)
            await trio.sleep(0.2)
            # The frame's connection queues behind the 2,000 in the listen backlog: the bound allows
            # a loaded machine to accept them all (each a logged eviction), and fails a frame kept out.
            with trio.fail_after(30):
                stream = await trio.open_unix_socket(os.fspath(path))
                async with stream:
                    await stream.send_all(frame(12.0))
                while not received:  # noqa: ASYNC110 - a list has no event to await
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        for idle in held:
            idle.close()
    assert received[0]["reading"]["percent"] == 12.0


async def test_a_half_sent_frame_is_cut_after_the_partial_frame_timeout(
    channel_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar import channel

    monkeypatch.setattr(channel, "PARTIAL_FRAME_TIMEOUT_S", 0.3)
    path = channel_dir / "s"
    async with trio.open_nursery() as nursery:
        await nursery.start(channel.serve, path, raw_channel_decoder, lambda event: None)
        stream = await trio.open_unix_socket(os.fspath(path))
        async with stream:
            await stream.send_all(b'{"type":"context","reading":')
            with trio.fail_after(2):
                assert await stream.receive_some() == b""  # the sidecar hung up
        nursery.cancel_scope.cancel()


async def test_two_sidecars_in_one_process_do_not_share_a_channel_budget(tmp_path: Path, channel_dir: Path) -> None:
    """The channel budget is each app's own (its config's): a partial frame held by one sidecar's
    connection leaves the other's budget whole. With one budget per process, the second sidecar's
    partial frame would cut the first's connection (the older partial frame gives way) and its
    record would never be written."""
    from sidecar import app

    limit = 1024 * 1024
    padded = context_frame(700, 1000, 70.0)[:-1] + ',"pad":"' + "y" * (600 * 1024) + '"}\n'
    head, tail = padded[: 600 * 1024].encode(), padded[600 * 1024 :].encode()  # each head > half the budget
    pipes = {agent: os.pipe() for agent in ("a", "b")}
    configs = [
        app.SidecarConfig(tmp_path, HOST, agent, "pi", "inc", channel_dir / agent, lifeline_fd=read_end,
                          channel_budget_bytes=limit)
        for agent, (read_end, _) in pipes.items()
    ]  # fmt: skip
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        async with trio.open_nursery() as nursery:
            for config in configs:
                nursery.start_soon(app.run_sidecar, config)
            with trio.fail_after(10):
                while not all(config.channel.exists() for config in configs):  # noqa: ASYNC110
                    await trio.sleep(0.01)
                streams = []
                for config in configs:  # both partial frames held at once, the first the older
                    stream = await trio.open_unix_socket(os.fspath(config.channel))
                    await stream.send_all(head)
                    streams.append(stream)
                    await trio.sleep(0.2)
                for stream in streams:
                    await stream.send_all(tail)
                    await stream.aclose()
                while any(_record(tmp_path, config.agent) is None for config in configs):  # noqa: ASYNC110
                    await trio.sleep(0.02)
            for _, write_end in pipes.values():
                os.close(write_end)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for read_end, _ in pipes.values():
            os.close(read_end)
    assert [_record(tmp_path, config.agent) for config in configs] == [700, 700]


def _record(catalog: Path, agent: str) -> int | None:
    path = AgentDir(catalog, HOST, agent).context_path
    return parse_record(path.read_bytes()).used_tokens if path.exists() else None


async def test_a_channel_budget_holds_only_its_own_connections() -> None:
    from sidecar import channel

    first, second = channel.ChannelBudget(100), channel.ChannelBudget(100)
    a = channel._Peer(trio.CancelScope(), 0.0, partial_since=1.0)
    b = channel._Peer(trio.CancelScope(), 0.0, partial_since=2.0)
    assert first.hold(a, 80) and second.hold(b, 80)  # 160 bytes in one process, 80 in each budget
    assert (first.total, second.total) == (80, 80) and not a.scope.cancel_called
    assert not second.hold(b, 101)  # over its own limit, and nothing older of its own to cut
    with pytest.raises(ConfigError):
        channel.ChannelBudget(-1)


async def test_half_open_megabyte_frames_cannot_hold_more_than_the_buffer_budget(
    channel_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar import channel

    # A frame kept out until the half-open ones time out would wait a minute: far past the bound below.
    monkeypatch.setattr(channel, "PARTIAL_FRAME_TIMEOUT_S", 60.0)
    monkeypatch.setattr(channel, "SILENT_TIMEOUT_S", 60.0)
    path = channel_dir / "s"
    received = Received()
    streams: list[trio.SocketStream] = []
    budget = channel.ChannelBudget()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(channel.serve, budget=budget), path, raw_channel_decoder, received.submit)
        for _ in range(128):
            stream = await trio.open_unix_socket(os.fspath(path))
            streams.append(stream)
            with contextlib.suppress(trio.BrokenResourceError, OSError):
                await stream.send_all(b'{"type":"context","x":"' + b"y" * (1024 * 1024 - 100))
        await trio.sleep(0.2)
        assert budget.total <= channel.BUFFER_BUDGET_BYTES
        with trio.fail_after(30):  # a liveness bound, under the timeouts above
            stream = await trio.open_unix_socket(os.fspath(path))
            async with stream:
                await stream.send_all(frame(9.0))
            while not received:  # noqa: ASYNC110 - a list has no event to await
                await trio.sleep(0.01)
        for stream in streams:
            await stream.aclose()
        nursery.cancel_scope.cancel()


# --- 6. the log path follows no symlink -----------------------------------------------------------


def _log_once(catalog: Path, agent: str) -> None:
    code = (
        "import logging, sys; from pathlib import Path; from sidecar import logs;"
        "logs.configure(Path(sys.argv[1]), 'testhost', sys.argv[2]);"
        "logging.getLogger('sidecar').warning('hello', extra={'event': 'start'})"
    )
    subprocess.run([sys.executable, "-c", code, str(catalog), agent], env=env(), check=False)


def test_a_symlinked_logs_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    catalog = tmp_path / "catalog"
    (catalog / ".st2").mkdir(parents=True)
    (catalog / ".st2" / "logs").symlink_to(outside)
    _log_once(catalog, "a")
    assert list(outside.iterdir()) == []


def test_a_symlinked_log_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"")
    catalog = tmp_path / "catalog"
    path = log_path(catalog, HOST, "a")
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    _log_once(catalog, "a")
    assert target.read_bytes() == b""


# --- 10. every number in its domain; only the transport supplies what the transport supplies --------


@pytest.mark.parametrize(
    "reading",
    [
        {"tokens": 10, "contextWindow": 100, "percent": -1.0, "model": "m", "costUsd": None},
        {"tokens": 10, "contextWindow": 100, "percent": 1e308, "model": "m", "costUsd": None},
        {"tokens": 10, "contextWindow": 100, "percent": 10.0, "model": "m", "costUsd": -1.0},
        {"tokens": 10, "contextWindow": 100, "percent": 10.0, "model": "m", "costUsd": 1e308},
    ],
)
def test_pi_refuses_numbers_outside_their_domain(reading: dict[str, Any]) -> None:
    from sidecar.harnesses.pi.producer import PI

    line = json.dumps({"type": "context", "reading": reading, "compaction": None}).encode() + b"\n"
    [refused] = PI.decoder("channel").receive_data(line)
    assert isinstance(refused, Dropped) and "reading" in refused.reason


@pytest.mark.parametrize("used", [-50.0, 1e308])
def test_claude_never_publishes_a_rate_limit_outside_its_domain(used: float) -> None:
    from sidecar.harnesses.claude.producer import SPEC, ClaudeProducer

    payload = {
        "context_window": {"total_input_tokens": 10, "context_window_size": 200_000, "current_usage": {},
                           "used_percentage": 0},
        "rate_limits": {"five_hour": {"used_percentage": used}, "seven_day": {"used_percentage": 10.0}},
    }  # fmt: skip
    line = json.dumps({"type": "claude.statusline", "payload": payload}).encode() + b"\n"
    [event] = SPEC.decoder("channel").receive_data(line)
    assert not isinstance(event, Dropped)  # the status line stands; only the bad window is dropped
    [reading] = ClaudeProducer().feed(event, 1000)
    limits = reading.fields.rate_limits
    assert limits is not None and limits.five_hour is None and limits.seven_day == 10.0


@pytest.mark.parametrize("used", [-50.0, 1e308])
def test_codex_refuses_a_rate_limit_outside_its_domain(used: float) -> None:
    from sidecar.harnesses.codex.producer import SPEC, CodexProducer

    message = {"method": "account/rateLimits/updated",
               "params": {"rateLimits": {"primary": {"usedPercent": used, "windowDurationMins": 300}}}}  # fmt: skip
    producer = CodexProducer()
    events = SPEC.decoder("stdout").receive_data(json.dumps(message).encode() + b"\n")
    assert all(isinstance(event, Dropped) for event in events)  # only a logged drop
    for event in events:
        if not isinstance(event, Dropped):
            producer.feed(event, 1000)
    assert producer.held_limits == (None, None)


def test_a_percent_computed_past_its_domain_is_refused_not_published() -> None:
    from sidecar.harnesses.opencode.producer import SPEC, sse_event

    pipeline = Pipeline(SPEC.make_producer(), WriteGuard("a", "i"))
    answer = {"providers": [{"id": "p", "models": {"m": {"limit": {"context": 1}}}}]}
    for event in SPEC.decoder("providers").receive_data(json.dumps(answer).encode()):
        assert pipeline.feed(event, 1000) == []
    message = {"type": "message.updated", "properties": {"info": {
        "id": "a", "role": "assistant", "sessionID": "s", "providerID": "p", "modelID": "m",
        "tokens": {"total": 2**52}}}}  # fmt: skip
    (event,) = SPEC.decoder("sse").receive_data(sse_event(json.dumps(message).encode()))
    assert pipeline.feed(event, 2000) == []
    assert pipeline.dropped == 1


def test_the_channel_refuses_a_frame_only_a_transport_may_supply() -> None:

    line = json.dumps({"type": "hctx.providers", "payload": {"providers": []}}).encode() + b"\n"
    [refused] = raw_channel_decoder().receive_data(line)
    assert isinstance(refused, Dropped) and "sidecar's own" in refused.reason


# --- 11. names: bounded and injective log names ------------------------------------------------


def test_log_names_are_bounded_and_never_shared() -> None:
    catalog = Path("/c")
    assert log_path(catalog, "a.b", "c") != log_path(catalog, "a", "b.c")
    longest = log_path(catalog, "h" * 128, "a" * 128)
    assert len(os.fsencode(longest.name + ".3")) <= 255
    assert log_path(catalog, "h" * 128, "a" * 128) != log_path(catalog, "h" * 128, "a" * 127 + "b")


def test_a_sidecar_with_the_longest_host_and_agent_names_starts_and_logs(tmp_path: Path) -> None:
    host, agent = "h" * 128, "a" * 128
    with running(tmp_path, agent, host=host) as sidecar:
        send(sidecar.channel, frame(3.0))
        assert sidecar.wait_percent(3.0) is not None
        assert sidecar.stop() == 0
    assert log_path(tmp_path, host, agent).exists()


# --- 12. a future writtenAtMs on disk -----------------------------------------------------------


def test_a_future_writtenatms_on_disk_is_not_carried_into_later_writes(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    agent = AgentDir(tmp_path, HOST, "future")
    write_context(agent, record(agent="future", written_at_ms=now + 10 * DAY_MS, observed_at_ms=now - 5))
    landed = write_context(agent, record(agent="future", written_at_ms=now, observed_at_ms=now))
    assert landed.written_at_ms == now


def test_a_future_last_write_neither_stamps_the_next_nor_switches_the_heartbeat_off() -> None:
    now = 1_000 * DAY_MS
    last = record(written_at_ms=now + 10 * DAY_MS, observed_at_ms=now - 10)
    guard = WriteGuard("a", "i", last=last)
    same_bucket = ContextFields(**{name: getattr(last, name) for name in ContextFields.model_fields})
    assert guard.offer(Reading(same_bucket.model_copy(update={"observed_at_ms": now + 1})), now + 1) is None
    due = guard.heartbeat_due_ms()
    assert due is not None and due <= now + HARNESS_CONTEXT_HEARTBEAT_MS + 1
    write = guard.tick(now + HARNESS_CONTEXT_HEARTBEAT_MS + 1)
    assert write is not None and write.record.written_at_ms == now + HARNESS_CONTEXT_HEARTBEAT_MS + 1


# --- 13. record encodings; huge percents in readers ------------------------------------------------


@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_a_record_not_in_plain_utf8_is_refused(codec: str) -> None:
    text = wire_bytes().decode()
    data = text.encode(codec)
    with pytest.raises(RecordRefused, match="UTF-8"):
        parse_record(data)


def test_a_bom_prefixed_record_is_refused_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from guard.projection import load_record

    path = tmp_path / "harness-context"
    path.write_bytes(codecs.BOM_UTF8 + wire_bytes())
    assert load_record(path) is None
    assert any("UTF-8" in r.getMessage() for r in caplog.records)


def test_a_huge_percent_prints_short() -> None:
    from wrapper.readers.render import percent_text

    assert len(percent_text(1e308)) <= 8
    assert percent_text(585.6) == "586%"


def test_a_full_tap_queue_gives_way_oldest_first_and_reports_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.launch import tap

    monkeypatch.setattr(tap, "TAP_QUEUE_BYTES", 1000)
    queue = tap.TapQueue("codex stdout tap")
    lines = [b'{"n":%d}\n' % n for n in range(500)]
    for line in lines:
        queue.put(line)
    batch, count = queue.take()
    report, *kept = batch.splitlines(keepends=True)
    assert kept == lines[-len(kept) :] and len(b"".join(kept)) <= 1000  # the newest, in order
    assert json.loads(report) == {"type": "hctx.dropped", "where": "codex stdout tap", "count": 500 - len(kept)}
    assert count == 500


async def test_a_drop_report_is_counted_where_it_happened_and_never_reaches_a_producer(channel_dir: Path) -> None:
    from sidecar import channel

    path = channel_dir / "s"
    received = Received()
    async with trio.open_nursery() as nursery:
        await nursery.start(channel.serve, path, raw_channel_decoder, received.submit)
        stream = await trio.open_unix_socket(os.fspath(path))
        async with stream:
            await stream.send_all(b'{"type":"hctx.dropped","where":"codex stdout tap","count":7}\n' + frame(5.0))
        with trio.fail_after(5):
            while not received:  # noqa: ASYNC110 - a list has no event to await
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert [f["type"] for f in received] == ["context"]
    [report] = received.dropped
    assert (report.where, report.count) == ("codex stdout tap", 7)
    pipeline = Pipeline(_NoFrameExpected(), WriteGuard("a", "i"))  # the sidecar's own path for it
    assert pipeline.feed(report, 1000) == []
    assert pipeline.drops == {"codex stdout tap": 7} and pipeline.dropped == 1
    assert Pipeline(_NoFrameExpected(), WriteGuard("a", "i")).drops == {}  # each pipeline its own count


class _NoFrameExpected:
    harness = "codex"

    def feed(self, event: object, now_ms: int) -> list[Reading]:
        raise AssertionError(f"a drop report reached the producer: {event!r}")


def test_a_write_that_waited_lands_as_the_newest_reading_of_its_bucket() -> None:
    """Point 1's catch-up: a write that failed (or sat behind a stalled lock) carries, when it is
    tried again, the newest reading held back since; never the older one it was decided on."""
    guard = WriteGuard("a", "i")
    window = 100_000
    first = guard.offer(Reading(ContextFields(harness="pi", used_tokens=60_000, window_tokens=window,
                                              used_percent=60.0, observed_at_ms=1)), 1)  # fmt: skip
    assert first is not None
    guard.committed(first)
    later = ContextFields(harness="pi", used_tokens=60_400, window_tokens=window, used_percent=60.4, observed_at_ms=2)
    assert guard.offer(Reading(later), 2) is None  # same bucket: held back
    retried = guard.refresh(first, 3)
    assert (retried.record.used_percent, retried.reason) == (60.4, "bucket")
    assert guard.refresh(retried, 4) is retried  # nothing newer held


async def test_a_connection_that_never_speaks_is_closed(channel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar import channel

    monkeypatch.setattr(channel, "SILENT_TIMEOUT_S", 0.3)
    path = channel_dir / "s"
    async with trio.open_nursery() as nursery:
        await nursery.start(channel.serve, path, raw_channel_decoder, lambda event: None)
        stream = await trio.open_unix_socket(os.fspath(path))
        async with stream:
            with trio.fail_after(2):
                assert await stream.receive_some() == b""  # the sidecar hung up
        nursery.cancel_scope.cancel()


def test_a_burst_while_writes_land_normally_keeps_every_write_the_guard_decided(tmp_path: Path) -> None:
    """Live writes are replay's writes: readings that arrive while a write lands wait their turn."""
    with running(tmp_path, "burst") as sidecar:
        send(sidecar.channel, b"".join(frame(float(percent)) for percent in range(1, 31)))  # one burst
        assert sidecar.wait_percent(30.0) is not None
        assert sidecar.stop() == 0
    writes = [e for e in log_events(tmp_path, "burst") if e["event"] == "write"]
    assert [w["usedPercent"] for w in writes] == [float(p) for p in range(1, 31)]
