"""`hctx wrap --record`: the recorder's bounds, the wrapper's refusals, and `hctx replay FILE`
running a recording through the live driver (sidecar.replay.replay_recording)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest
import trio
import trio.lowlevel

import guard
from sidecar import recorder
from sidecar.recorder import FORMAT, Recorder, create_recording
from sidecar.registry import HarnessSpec, spec_for
from sidecar.replay import read_chunks, replay_recording
from tests.conftest import REPO
from tests.wrapping import log_events, run, wrap_argv

DEMO = Path(__file__).resolve().parent.parent / "sidecar" / "assets" / "demo"


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_a_full_queue_drops_chunks_and_one_gap_line_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder, "QUEUE_BYTES", 10)
    path = tmp_path / "r"
    rec = Recorder(create_recording(path), {"format": FORMAT})
    stream = rec.new_stream()
    for index in range(5):  # the writer task is not running: nothing leaves the queue
        rec.chunk(index, "channel", stream, b"abcd")  # 4 bytes: two fit, three are lost
    rec.chunk(9, "channel", stream, b"")  # nothing offered: no line, no loss
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rec.run)
        with trio.fail_after(10):
            while len(path.read_bytes().splitlines()) < 3:  # noqa: ASYNC110 (a file fills: no event to wait on)
                await trio.sleep(0.01)
        rec.chunk(10, "channel", stream, b"late")  # room again: the gap is said before it
        rec.close()
    lines = _lines(path)
    assert lines[0] == {"format": FORMAT}
    assert [base64.b64decode(str(line["b64"])) for line in lines[1:3]] == [b"abcd", b"abcd"]
    assert lines[3] == {"at_ms": 10, "gap": {"chunks": 3, "bytes": 12}}
    assert lines[4] == {"at_ms": 10, "wire": "channel", "stream": stream, "b64": base64.b64encode(b"late").decode()}
    assert len(lines) == 5


async def test_the_byte_cap_ends_the_file_with_one_truncated_line(tmp_path: Path) -> None:
    path = tmp_path / "r"
    rec = Recorder(create_recording(path), {"format": FORMAT}, cap_bytes=300)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rec.run)
        for index in range(100):
            rec.chunk(index, "channel", 1, b"x" * 40)
            await trio.lowlevel.checkpoint()
        rec.close()
    lines = _lines(path)
    assert lines[-1] == {"truncated": {"cap_bytes": 300, "written_bytes": _size_before_last(path)}}
    assert sum(1 for line in lines if "truncated" in line) == 1
    assert 2 <= len(lines) < 10  # the header, a few chunks, the line that says so: nothing past the cap


def _size_before_last(path: Path) -> int:
    data = path.read_bytes()
    return len(data) - len(data.splitlines(keepends=True)[-1])


def test_a_new_recording_is_refused_over_a_file_or_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "exists").write_bytes(b"mine")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    for name in ("exists", "link"):
        with pytest.raises(FileExistsError):
            create_recording(tmp_path / name)
    assert (tmp_path / "exists").read_bytes() == b"mine" and not (tmp_path / "target").exists()
    create_recording(tmp_path / "new").close()
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o600


def test_wrap_refuses_a_record_path_it_cannot_own(tmp_path: Path) -> None:
    (tmp_path / "exists").write_bytes(b"mine")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    cases = {"exists": "exists; hctx records into a new file", "link": "is a symlink",
             "no/such/file": "its directory"}  # fmt: skip
    for name, said in cases.items():
        argv = wrap_argv(tmp_path / "cat", "a", "claude", "true", extra=("--record", str(tmp_path / name)))
        result = run(argv)
        assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert (tmp_path / "exists").read_bytes() == b"mine" and not (tmp_path / "target").exists()


def test_a_wrapped_session_recorded_replays_to_the_writes_its_sidecar_logged(tmp_path: Path) -> None:
    """The demo's stand-in plays a real Claude session (its converted recording) through the real
    tee under `hctx wrap --record`; what the product recorded holds the very channel bytes of the
    converted recording, and `hctx replay FILE` of it prints the writes the sidecar logged."""
    catalog, recording = tmp_path / "cat", tmp_path / "session.rec"
    played = DEMO / "claude-session-2.1.332.rec"
    standin = [sys.executable, "-m", "sidecar.demo_standin", "--harness", "claude", "--duration", "2", played.name]
    result = run(wrap_argv(catalog, "rec", "claude", *standin, extra=("--record", str(recording))), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lived = [event for event in log_events(catalog, "rec") if event.get("event") == "write"]
    replayed = run([sys.executable, "-m", "wrapper.cli", "replay", str(recording)])
    assert replayed.returncode == 0, replayed.stderr
    writes = [json.loads(line) for line in replayed.stdout.splitlines()]
    keys = ("reason", "usedTokens", "windowTokens", "usedPercent", "compactions")
    assert [tuple(w[key] for key in keys) for w in writes] == [tuple(e[key] for key in keys) for e in lived]
    assert any(write["compactions"] == 1 for write in writes) and len(writes) >= 2
    header = _lines(recording)[0]
    assert (header["format"], header["harness"], header["hctx"]) == (FORMAT, "claude", guard.__version__)
    # The tee rebuilt every line the converted recording holds, byte for byte (each its own connection).
    assert sorted(_channel_lines(recording)) == sorted(_channel_lines(played))


def _channel_lines(path: Path) -> list[bytes]:
    data = b"".join(chunk.data for chunk in read_chunks(path.read_bytes()) if chunk.wire == "channel")
    return data.splitlines(keepends=True)


class _Boom:
    """A decoder with a bug: it raises on any bytes."""

    def receive_data(self, data: bytes) -> list[object]:
        raise RuntimeError(f"a decoder bug on {data!r}")

    def end_of_data(self) -> list[object]:
        return []


def _recording(tmp_path: Path, harness: str, *entries: dict[str, object]) -> Path:
    path = tmp_path / "r"
    header = {"format": FORMAT, "harness": harness, "hctx": guard.__version__, "started_ms": 1000}
    path.write_text("".join(json.dumps(entry) + "\n" for entry in (header, *entries)))
    return path


def test_a_decoder_that_raises_is_a_counted_drop_in_replay_as_live(tmp_path: Path) -> None:
    base = spec_for("claude")
    spec = HarnessSpec(name="claude", make_producer=base.make_producer, channel_frames=base.channel_frames,
                       decoders={"boom": _Boom}, verified_versions=(), package=base.package)  # fmt: skip
    data = base64.b64encode(b"boom").decode()
    path = _recording(tmp_path, "claude", {"at_ms": 1001, "wire": "boom", "stream": 1, "b64": data})
    writes, summary = replay_recording(spec, path)
    assert writes == [] and not summary.problems
    assert summary.drops == {"boom": 1}  # the live Stream's catch, counted by the pipeline, not a traceback


CLAUDE_FRAMES = REPO / "fixtures/recordings/claude/statusline-2.1.332.rec"


def _channel_chunk(at_ms: int, data: bytes) -> dict[str, object]:
    return {"at_ms": at_ms, "wire": "channel", "stream": 1, "b64": base64.b64encode(data).decode()}


def _replayed_tokens(tmp_path: Path, *entries: dict[str, object]) -> list[int | None]:
    """What each write a Claude recording of `entries` replays to carries, in order."""
    path = _recording(tmp_path, "claude", *entries)
    try:
        replayed, summary = replay_recording(spec_for("claude"), path)
    finally:
        path.unlink()
    assert not summary.problems
    return [write.record.used_tokens for write in replayed]


def test_a_replay_folds_the_writes_the_live_outbox_found_late_and_no_others(tmp_path: Path) -> None:
    """The replay's outbox is told which write was late (the `late` line the live one recorded),
    never judges it by the recorded times: a write 1 ms in flight that live found late folds, and
    one 500 ms in flight that live did not find late (the machine, not the times) folds nothing."""
    frames = [chunk.data for chunk in read_chunks(CLAUDE_FRAMES.read_bytes())[1:5]]
    # The first lands; the second is in flight while the third and fourth come; then each lands.
    first = (_channel_chunk(1000, frames[0]), {"at_ms": 1000, "write": "landed"},
             _channel_chunk(1001, frames[1]), _channel_chunk(1002, frames[2]))  # fmt: skip
    late = {"at_ms": 1003, "write": "late"}
    rest = [{"at_ms": 1600 + at, "write": "landed"} for at in range(3)]
    folded = _replayed_tokens(tmp_path, *first, _channel_chunk(1003, frames[3]), late, *rest)
    assert folded == [100005, 305000, 0]  # 754995 folded into the newest
    each = [100005, 305000, 754995, 0]
    assert _replayed_tokens(tmp_path, *first, _channel_chunk(1003, frames[3]), *rest) == each
    assert _replayed_tokens(tmp_path, *first, _channel_chunk(1500, frames[3]), *rest) == each  # 0.5 s, on time live


def test_a_replayed_write_is_taken_when_the_live_one_was_so_it_carries_the_same_reading(tmp_path: Path) -> None:
    """A write is refreshed with the newest reading held when the writer takes it. Live, the
    channel may read the next frame before the writer gets to the write (trio's scheduling, a loaded
    machine): the `taken` line says when it did, and the replay takes it there, so the write
    carries that frame's reading (live, 1592 tokens where the replay once wrote 1446)."""
    first = read_chunks(CLAUDE_FRAMES.read_bytes())[1].data
    frame = json.loads(first)
    window = frame["payload"]["context_window"]
    window["total_input_tokens"] += 100  # the same 1%: held, not a write of its own
    window["current_usage"]["input_tokens"] += 100
    newer = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
    sent, landed = (_channel_chunk(1000, first), _channel_chunk(1001, newer)), {"at_ms": 1003, "write": "landed"}
    assert _replayed_tokens(tmp_path, *sent, {"at_ms": 1002, "write": "taken"}, landed) == [100105]
    taken_at_once = (sent[0], {"at_ms": 1000, "write": "taken"}, sent[1])
    assert _replayed_tokens(tmp_path, *taken_at_once, landed) == [100005]


def test_replay_of_a_damaged_recording_says_which_lines_and_exits_1(tmp_path: Path) -> None:
    path = _recording(tmp_path, "pi", {"at_ms": 1001, "wire": "nope", "stream": 1, "b64": "AA=="},
                      {"at_ms": 1002, "wire": "channel", "stream": 1, "b64": "!!"})  # fmt: skip
    with path.open("ab") as file:
        file.write(b'{"torn": ')
    result = run([sys.executable, "-m", "wrapper.cli", "replay", str(path)])
    assert result.returncode == 1 and result.stdout == ""
    assert "line 2: no wire of the pi harness: 'nope'" in result.stderr
    assert "line 3: its b64 is not base64" in result.stderr and "line 4: malformed JSON" in result.stderr
    wrong = run([sys.executable, "-m", "wrapper.cli", "replay", "--harness", "claude", str(path)])
    assert wrong.returncode == 2 and "a recording of 'pi', not of 'claude'" in wrong.stderr


def test_replay_refuses_a_file_that_is_no_recording_and_says_what_it_is(tmp_path: Path) -> None:
    """Only recordings are replayed: a harness's own capture (the lab's shapes the product once
    converted), an empty file, or a JSON line naming another format is refused, exit 2, nothing printed."""
    capture = REPO / "fixtures" / "claude" / "statusline-2.1.332.jsonl"
    (empty := tmp_path / "empty").write_bytes(b"")
    (other := tmp_path / "other").write_text('{"format": "hctx.recording.v0", "harness": "claude"}\n')
    for path, said in ((capture, "its first line names no format"), (empty, "its first line is no JSON object"),
                       (other, "its first line names no format")):  # fmt: skip
        for argv in (["replay", str(path)], ["replay", "--harness", "claude", str(path)]):
            result = run([sys.executable, "-m", "wrapper.cli", *argv])
            assert (result.returncode, result.stdout) == (2, ""), result.stderr
            assert f"hctx replay: {path} is not a recording `hctx wrap --record` made ({said}" in result.stderr
            assert "hctx replays only recordings" in result.stderr and "Traceback" not in result.stderr
    # A recording beside one that is not: the writes of the first, then the refusal.
    good = REPO / "fixtures" / "recordings" / "claude" / "statusline-2.1.332.rec"
    result = run([sys.executable, "-m", "wrapper.cli", "replay", str(good), str(capture)])
    assert result.returncode == 2 and result.stdout.count('"reason": ') >= 2 and str(capture) in result.stderr
