"""The conformance suite: every registered harness, every recorded fixture, every path the bytes take.

One property per row, run over the registry instead of by hand per harness:

- fed whole, fed a byte at a time, or cut where hypothesis chooses, a recording makes identical
  writes: where the bytes break never changes what is published;
- any bytes at all on any wire of any harness: only logged drops, never a crash, and never a number
  the input did not contain (digit-free input publishes no number);
- lived through the real sidecar process: the channel recordings sent on the unix socket give the
  writes replay gives (the Codex stdio tap and websocket relay and the OpenCode SSE transport have
  their own live rows beside their transports' tests, on these same helpers).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import guard
from guard.constants import HARNESS_CONTEXT_HEARTBEAT_MS
from sidecar.channel import BUFFER_BUDGET_BYTES
from sidecar.decoding import CHANNEL, MessageDecoder
from sidecar.recorder import Chunk, create_recording, redact_recording
from sidecar.registry import BUILT_IN, HarnessSpec, harness_names, spec_for
from sidecar.replay import read_header, replay_bytes, replay_recording, write_line
from sidecar.spec import RecordingError
from tests.conformance import (
    RECORDINGS,
    assert_lived_as_replayed,
    bytewise,
    chunks_of,
    converted_recordings,
    joined,
    logged,
    outcome,
    replayed,
    split_at,
)
from tests.conformance import lived as lived_write
from tests.conftest import REPO
from tests.wrapping import HOST, env, log_events


def _by_harness() -> dict[str, list[str]]:
    """Every converted fixture (fixtures/recordings/), by the harness its header names."""
    found: dict[str, list[str]] = {harness: [] for harness in BUILT_IN}
    for path in converted_recordings():
        found.setdefault(str(read_header(path)["harness"]), []).append(path.relative_to(RECORDINGS).as_posix())
    return found


# Every fixture, a recording of the harness its header names.
RECORDED: dict[str, list[str]] = _by_harness()
CASES = [pytest.param(harness, name, id=f"{harness}-{name}") for harness, names in RECORDED.items() for name in names]
# The live leg's pace: comfortably more than a write's two fsyncs on a loaded machine.
FRAME_PACE_S = 0.01
# A fixture small enough to be fed one byte at a time in a test's budget.
BYTEWISE_LIMIT = 96 * 1024


def test_every_built_in_harness_has_recordings_and_a_spec_of_its_own() -> None:
    assert set(RECORDED) == set(BUILT_IN) == set(harness_names())
    for harness in BUILT_IN:
        spec = spec_for(harness)
        assert spec.name == harness and RECORDED[harness], harness
        assert spec.wires()[0] == CHANNEL


def splittable(spec: HarnessSpec, chunk: Chunk) -> bool:
    """A message-framed wire (a websocket, an HTTP body) is cut by its transport, never inside."""
    return not isinstance(spec.decoder(chunk.wire), MessageDecoder)


@pytest.mark.parametrize(("harness", "name"), CASES)
def test_a_recording_fed_whole_or_a_byte_at_a_time_writes_the_same(harness: str, name: str) -> None:
    spec = spec_for(harness)
    chunks = chunks_of(name)
    assert chunks, f"{name} holds no bytes at all"
    expected = [outcome(write) for write in replayed(spec, chunks)]
    assert [outcome(write) for write in replayed(spec, joined(chunks))] == expected
    if sum(len(chunk.data) for chunk in chunks) <= BYTEWISE_LIMIT:
        pieces = bytewise(chunks, partial(splittable, spec))
        assert [outcome(write) for write in replayed(spec, pieces)] == expected


def test_every_harness_publishes_from_its_recordings() -> None:
    for harness, names in RECORDED.items():
        spec = spec_for(harness)
        writes = [write for name in names for write in replay_recording(spec, RECORDINGS / name)[0]]
        assert any(write.record.used_tokens or write.record.used_percent for write in writes), harness


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_recording_cut_anywhere_writes_the_same(data: st.DataObject) -> None:
    harness, name = data.draw(st.sampled_from([case.values for case in CASES]))
    spec = spec_for(harness)
    chunks = chunks_of(name)
    total = sum(len(chunk.data) for chunk in chunks)
    cuts = data.draw(st.lists(st.integers(0, total), max_size=64))
    expected = [outcome(write) for write in replayed(spec, chunks)]
    assert [outcome(write) for write in replayed(spec, split_at(chunks, cuts, partial(splittable, spec)))] == expected


def wires() -> list[tuple[str, str]]:
    return [(harness, wire) for harness in harness_names() for wire in spec_for(harness).wires()]


NUMBERS = ("used_tokens", "window_tokens", "used_percent", "cost_usd", "session_total_tokens", "compact_at_tokens")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(wires()), st.lists(st.binary(max_size=2048), max_size=8))
def test_any_bytes_on_any_wire_are_drops_never_a_crash_or_a_number(target: tuple[str, str], data: list[bytes]) -> None:
    harness, wire = target
    spec = spec_for(harness)
    digit_free = [bytes(byte for byte in piece if not 0x30 <= byte <= 0x39) for piece in data]
    writes = replayed(spec, [Chunk(None, wire, piece) for piece in digit_free])
    for write in writes:
        published = {name: getattr(write.record, name) for name in NUMBERS}
        assert set(published.values()) == {None}, f"{harness}/{wire} published {published} from digit-free bytes"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_recording_damaged_anywhere_is_drops_never_a_crash(data: st.DataObject) -> None:
    harness, name = data.draw(st.sampled_from([case.values for case in CASES]))
    spec = spec_for(harness)
    chunks = chunks_of(name)
    index = data.draw(st.integers(0, len(chunks) - 1))
    victim = chunks[index].data
    start = data.draw(st.integers(0, len(victim)))
    end = data.draw(st.integers(start, min(len(victim), start + 512)))
    junk = data.draw(
        st.binary(max_size=64) | st.sampled_from([b"NaN", b"\x00", b"\xff\xfe", b"[" * 2000, b'"\\ud800"'])
    )
    victim_chunk = chunks[index]
    damaged = [*chunks[:index], Chunk(victim_chunk.at_ms, victim_chunk.wire, victim[:start] + junk + victim[end:],
                                      victim_chunk.stream)]  # fmt: skip
    for write in replayed(spec, [*damaged, *chunks[index + 1 :]]):
        assert write.record.harness == harness


# --- lived: the real sidecar process, the recording's bytes on its channel ---------------------------


def _lives_on_the_channel(harness: str, name: str) -> bool:
    """A recording of the channel alone that publishes something (a lone hook capture writes
    nothing, live or replayed: the rows above cover it)."""
    on_the_channel = all(chunk.wire == CHANNEL for chunk in chunks_of(name))
    return on_the_channel and bool(replay_recording(spec_for(harness), RECORDINGS / name)[0])


CHANNEL_CASES = [case for case in CASES if _lives_on_the_channel(*case.values)]  # type: ignore[arg-type]


def lived_on_the_channel(
    harness: str, chunks: list[Chunk], where: Path, *extra: str
) -> tuple[list[tuple[Any, ...]], int, Path]:
    """The writes a real sidecar process (started with `extra` arguments besides) logged for
    `chunks` sent on its channel, whole records, how many it coalesced (a write stalled past
    STALLED_WRITE_S: the machine, not the decoder), and the recording it made of them (`--record`)."""
    catalog, channel, recording = where / "catalog", where / "ch" / "s", where / "session.rec"
    channel.parent.mkdir(mode=0o700, parents=True)
    with create_recording(recording) as made:  # as `hctx wrap --record` does: held open, handed down
        record_fd = os.dup(made.fileno())
    read_end, write_end = os.pipe()
    ready_read, ready_write = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "--catalog", str(catalog), "--host", HOST, "--agent", "conform",
         "--harness", harness, "--incarnation", "inc", "--channel", str(channel),
         "--lifeline-fd", str(read_end), "--ready-fd", str(ready_write), "--record-fd", str(record_fd),
         "--record-raw", *extra],
        pass_fds=(read_end, ready_write, record_fd), env=env(), cwd=REPO, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(read_end)
    os.close(ready_write)
    os.close(record_fd)
    try:
        with os.fdopen(ready_read, "rb") as ready:
            assert ready.readline() == b"ready\n"
        # One connection keeps the recording's order (across connections the channel promises none),
        # a frame at a harness's pace: a burst of hundreds in a millisecond is the outbox's case (a
        # stalled write coalesces; tests/test_sidecar_faults.py), not what a session sends.
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(channel))
            for chunk in chunks:
                for line in chunk.data.splitlines(keepends=True):
                    client.sendall(line)
                    time.sleep(FRAME_PACE_S)
    finally:
        os.close(write_end)  # the wrapper is gone: the sidecar drains its channel and exits
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            raise
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    events = log_events(catalog, "conform")
    lived = [lived_write(event)
             for event in events if event.get("event") == "write" and event.get("reason") != "heartbeat"]  # fmt: skip
    [exit_line] = [event for event in events if event.get("event") == "exit"]
    return lived, exit_line["coalesced"], recording


@pytest.mark.parametrize(("harness", "name"), CHANNEL_CASES)
def test_a_channel_recording_sent_to_the_real_sidecar_writes_what_replay_writes(
    harness: str, name: str, tmp_path: Path
) -> None:
    """The recording the sidecar made (`--record`) holds the very bytes sent, and replays, through
    the live driver, to the writes it logged: a write that landed late live (a loaded machine)
    lands late in the replay too, so the outbox and the refresh decide alike."""
    spec = spec_for(harness)
    chunks = chunks_of(name)
    lived, coalesced, recording = lived_on_the_channel(harness, chunks, tmp_path)
    entries = [json.loads(line) for line in recording.read_bytes().splitlines()]
    header = {"format": "hctx.recording.v1", "harness": harness, "hctx": guard.__version__, "incarnation": "inc",
              "config": {"harness": harness, "host": HOST, "agent": "conform", "incarnation": "inc",
                         "transport": "", "account": "", "channel_budget_bytes": BUFFER_BUDGET_BYTES,
                         "heartbeat_ms": HARNESS_CONTEXT_HEARTBEAT_MS}}  # fmt: skip
    assert entries[0] | {"started_ms": 0} == header | {"started_ms": 0, "redacted": False}  # `--record-raw`
    sent = b"".join(chunk.data for chunk in chunks)
    assert b"".join(base64.b64decode(entry["b64"]) for entry in entries if "b64" in entry) == sent
    writes, summary = replay_recording(spec, recording)
    assert_lived_as_replayed(lived, [logged(write) for write in writes if write.reason != "heartbeat"], coalesced)
    assert lived and summary.sidecars == 1 and not summary.problems
    # Redacted, as `--record` records by default, it replays to the very same writes.
    redacted, _ = replay_bytes(spec, redact_recording(recording.read_bytes()))
    assert [write_line(write) for write in redacted] == [write_line(write) for write in writes]


SEAT_ACCOUNT = {"key": "0123456789abcdef0123456789abcdef", "label": "pi · seat-a"}


def test_a_seat_launched_with_an_account_replays_to_records_that_carry_it(tmp_path: Path) -> None:
    """Issue 34.2: the sidecar of a seat launched with an account (`--account`) writes it into every
    record; the recording's header holds the sidecar's whole configuration, so its replay's writes
    carry the account too, and are the live ones whole (every field but writtenAtMs)."""
    chunks = chunks_of("pi/live/pi-1.6.0.channel.rec")
    account = json.dumps(SEAT_ACCOUNT)
    lived, coalesced, recording = lived_on_the_channel("pi", chunks, tmp_path, "--account", account)
    header = json.loads(recording.read_bytes().split(b"\n", 1)[0])
    assert header["config"]["account"] == account and header["config"]["agent"] == "conform"
    writes, summary = replay_recording(spec_for("pi"), recording)
    carried = [None if write.record.account is None else write.record.account.model_dump() for write in writes]
    assert writes and carried == [SEAT_ACCOUNT] * len(writes), "a replayed write without the seat's account"
    assert_lived_as_replayed(lived, [logged(write) for write in writes if write.reason != "heartbeat"], coalesced)
    assert lived and not summary.problems


def test_a_recording_whose_header_config_is_no_sidecars_is_refused_with_a_message(tmp_path: Path) -> None:
    """A header's `config` is data: one that is no sidecar's configuration is refused, said."""
    data = (RECORDINGS / "pi/live/pi-1.6.0.channel.rec").read_bytes()
    header, _, rest = data.partition(b"\n")
    hostile = json.loads(header) | {"config": {"harness": "pi", "account": 7, "shell": "rm -rf"}}
    with pytest.raises(RecordingError, match="config is no sidecar's"):
        replay_bytes(spec_for("pi"), json.dumps(hostile).encode() + b"\n" + rest)


def test_a_live_run_that_coalesced_is_its_replay_with_writes_folded_away_and_nothing_else() -> None:
    """The check the live-against-replay rows use: exact without coalescing; with it, the live
    writes in order among the replayed ones, the last the same, no more missing than were folded."""
    replayed = [("bucket", n, 100, float(n), 0, None) for n in (1, 2, 3, 4)]
    assert_lived_as_replayed(replayed, replayed, 0)
    folded = [replayed[0], ("compaction", *replayed[3][1:])]  # a folded write may keep a compaction's reason
    assert_lived_as_replayed(folded, replayed, 2)
    assert_lived_as_replayed(replayed, replayed, 3)  # the recorded landings made the replay fold them too
    wrong = [
        (folded, 0),  # nothing coalesced: must be equal
        (folded, 1),  # two missing, one folded
        ([replayed[0], replayed[2]], 2),  # the last is not the replay's last
        ([replayed[2], replayed[1], replayed[3]], 1),  # out of order
        ([replayed[0], ("bucket", 9, 100, 9.0, 0, None), replayed[3]], 1),  # a number replay never wrote
    ]
    for lived, coalesced in wrong:
        with pytest.raises(AssertionError):
            assert_lived_as_replayed(lived, replayed, coalesced)
