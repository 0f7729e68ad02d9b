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
from hypothesis import given, settings
from hypothesis import strategies as st

import guard
from sidecar import recorder
from sidecar.decoding import MessageDecoder
from sidecar.recorder import FORMAT, Recorder, create_recording
from sidecar.redaction import Redactor
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


@pytest.mark.parametrize("raw", [True, False], ids=["record-raw", "redacted"])
def test_a_wrapped_session_recorded_replays_to_the_writes_its_sidecar_logged(tmp_path: Path, raw: bool) -> None:
    """The demo's stand-in plays a real Claude session (its converted recording) through the real
    tee under `hctx wrap --record`; what the product recorded holds the very channel bytes of the
    converted recording (`--record-raw`; redacted by default: the same bytes with every string no
    decoder reads replaced), and `hctx replay FILE` of it prints the writes the sidecar logged."""
    catalog, recording = tmp_path / "cat", tmp_path / "session.rec"
    played = DEMO / "claude-session-2.1.332.rec"
    standin = [sys.executable, "-m", "sidecar.demo_standin", "--harness", "claude", "--duration", "2", played.name]
    extra = ("--record", str(recording), *(("--record-raw",) if raw else ()))
    result = run(wrap_argv(catalog, "rec", "claude", *standin, extra=extra), cwd=tmp_path)
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
    expected = _channel_lines(played)
    if not raw:
        expected = [Redactor(spec_for("claude").recorded_strings, "lines").redact(line) for line in expected]
        assert any(b"/home/" in line for line in _channel_lines(played))  # the session's paths: not recorded
        assert not any(b"/home/" in line for line in _channel_lines(recording))
    assert header["redacted"] is not raw
    assert sorted(_channel_lines(recording)) == sorted(expected)


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


# ---- issue 40: a recording is redacted by default; a full disk ends the recording, never the sidecar ----

ALL_RECORDINGS = sorted((REPO / "fixtures").rglob("*.rec"))


def _replayed(data: bytes) -> tuple[list[str], dict[str, int]]:
    from sidecar.replay import header_of, replay_bytes, write_line

    writes, summary = replay_bytes(spec_for(header_of(data)["harness"]), data)
    return [write_line(write) for write in writes], dict(summary.drops)


def _streams(data: bytes) -> dict[tuple[int, int], tuple[str, str, bytes]]:
    """Each stream's bytes, keyed by (sidecar, stream), with its harness and wire (a wire of whole
    messages, one a chunk: each on a line of its own)."""
    streams: dict[tuple[int, int], tuple[str, str, bytes]] = {}
    sidecar, harness = 0, ""
    for line in data.splitlines():
        entry = json.loads(line)
        if "format" in entry:
            sidecar, harness = sidecar + 1, entry["harness"]
        elif "b64" in entry:
            _, wire, held = streams.get((sidecar, entry["stream"]), (harness, entry["wire"], b""))
            chunk = base64.b64decode(entry["b64"])
            if isinstance(spec_for(harness).decoder(wire), MessageDecoder):
                chunk = json.dumps(json.loads(chunk)).encode() + b"\n" if chunk.strip() else b""
            streams[sidecar, entry["stream"]] = (harness, wire, held + chunk)
    return streams


def _strings(value: object, key: str | None = None) -> list[tuple[str | None, str]]:
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _strings(v, k)]
    if isinstance(value, list):
        return [found for v in value for found in _strings(v, key)]
    return [(key, value)] if isinstance(value, str) else []


def _frames(wire_bytes: bytes) -> list[object]:
    """The JSON a stream's bytes hold, line by line (an SSE `data:` line's too, a tap's line too)."""
    frames: list[object] = []
    for line in wire_bytes.splitlines():
        try:
            frame = json.loads(line.strip().removeprefix(b"data:"))
        except ValueError:
            continue
        frames.append(frame)
        if isinstance(frame, dict) and isinstance(frame.get("payload"), str):
            frames.append(json.loads(frame["payload"]))
    return frames


@pytest.mark.parametrize("path", ALL_RECORDINGS, ids=lambda path: str(path.relative_to(REPO / "fixtures")))
def test_every_capture_redacted_replays_to_the_same_records_and_keeps_no_other_string(path: Path) -> None:
    """Each real capture under fixtures/, redacted as `hctx wrap --record` records by default:
    the same writes and drops as the whole session, and no string but those its decoders read."""
    from sidecar.recorder import redact_recording

    data = path.read_bytes()
    redacted = redact_recording(data)
    assert _replayed(redacted) == _replayed(data)
    for harness, wire, held in _streams(redacted).values():
        kept, embedded = spec_for(harness).recorded_strings, spec_for(harness).recorded_json_strings
        for frame in _frames(held):  # a string of JSON text is read as its own frame (_frames)
            strings = _strings(frame)
            leaked = [(key, text) for key, text in strings if key not in kept | embedded and text.strip("x ")]
            assert not leaked, (wire, leaked[:3])
    assert b"/home/" not in b"".join(held for _, _, held in _streams(redacted).values())


def test_the_projects_own_delegation_recordings_are_redacted() -> None:
    """fixtures/claude/delegation/*/sidecar.rec held the children's prompts and replies (issue 40):
    now their redacted form, which replays to the same records (the test above)."""
    from sidecar.recorder import redact_recording

    for path in sorted((REPO / "fixtures" / "claude" / "delegation").glob("*/sidecar.rec")):
        data = path.read_bytes()
        assert redact_recording(data) == data  # redacting it again changes nothing: it is redacted
        assert b"Fake reply to" not in b"".join(held for _, _, held in _streams(data).values())


EMAIL, TOKEN, API_KEY, PROMPT = "alice.planted@example.com", "eyJPLANTEDtoken42", "sk-PLANTED-key", "PLANTED prompt"
SECRETS = (EMAIL, TOKEN, API_KEY, PROMPT, "PLANTED output", "PLANTED instructions", "PLANTED file")


def _planted() -> dict[str, list[tuple[str, bytes]]]:
    """Real-shaped frames of each harness's wires carrying a secret where the issue found one."""
    from sidecar.harnesses.codex.producer import tap_frame

    def line(value: object) -> bytes:
        return json.dumps(value).encode() + b"\n"

    account = {"id": 3, "result": {"account": {"type": "chatgpt", "email": EMAIL, "planType": "plus"}}}
    auth = {"id": 4, "result": {"authMethod": "chatgpt", "authToken": TOKEN, "requiresOpenaiAuth": True}}
    turn = {"method": "turn/start", "id": 5, "params": {"threadId": "t", "input": [{"type": "text", "text": PROMPT}]}}
    item = {"type": "commandExecution", "id": "i", "command": "cat .env", "aggregatedOutput": "PLANTED output"}
    output = {"method": "item/completed", "params": {"threadId": "t", "item": item}}
    said = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "PLANTED instructions"}]}
    rollout = {"timestamp": "2026-12-01T22:00:00.000Z", "type": "response_item", "payload": said}
    codex = [line(account), line(auth), line(turn), line(output)]
    mcp = {"type": "remote", "url": "https://x", "headers": {"Authorization": f"Bearer {TOKEN}"}}
    config = {"provider": {"anthropic": {"options": {"apiKey": API_KEY}}}, "mcp": {"search": mcp}}
    part = {"type": "message.part.updated", "properties": {"part": {"type": "text", "sessionID": "s", "text": PROMPT}}}
    hook = {"type": "claude.hook", "payload": {"session_id": "s", "hook_event_name": "UserPromptSubmit",
            "prompt": PROMPT, "cwd": "/home/alice", "transcript_path": f"/home/{EMAIL}/t.jsonl"}}  # fmt: skip
    result = {"role": "user", "content": [{"type": "tool_result", "content": "PLANTED file"}]}
    transcript = {"type": "user", "isSidechain": True, "agentId": "a1", "timestamp": "2026-12-01T22:00:00.000Z",
                  "message": result}  # fmt: skip
    return {
        "codex": [*(("stdout", frame) for frame in codex), *(("websocket", frame.strip()) for frame in codex),
                  ("channel", tap_frame(line(account).strip()) + b"\n"), ("rollout", line(rollout))],
        "opencode": [("config", json.dumps(config).encode()), ("sse", b"data: " + json.dumps(part).encode() + b"\n\n")],
        "claude": [("channel", line(hook)), ("subagent", line(transcript))],
        "pi": [("channel", line({"type": "pi.event", "event": "message_end", "text": PROMPT, "email": EMAIL}))],
    }  # fmt: skip


@pytest.mark.parametrize("harness", ["codex", "opencode", "claude", "pi"])
async def test_planted_secrets_never_reach_a_recording(tmp_path: Path, harness: str) -> None:
    """An email (Codex's `account/read`), a token (`getAuthStatus`, an MCP server's header), an
    apiKey (OpenCode's `/config`), a prompt, a command's output, instructions and a file's content,
    each cut across chunks as a socket would: none reaches the file, in any encoding; --record-raw's
    recording holds them all."""
    from sidecar.redaction import redactors

    spec = spec_for(harness)
    for raw in (False, True):
        path = tmp_path / f"{harness}-{raw}.rec"
        rec = Recorder(create_recording(path), {"format": FORMAT, "harness": harness},
                       redactor=None if raw else redactors(spec))  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rec.run)
            for wire, frame in _planted()[harness]:
                stream = rec.new_stream()
                cuts = [frame] if wire in ("websocket", "config") else _cuts(frame, 7)
                for at, cut in enumerate(cuts):
                    rec.chunk(at, wire, stream, cut)
            rec.close()
        recorded = b"".join(held for _, _, held in _streams(path.read_bytes()).values()) + path.read_bytes()
        planted = {secret for secret in SECRETS if secret.encode() in b"".join(f for _, f in _planted()[harness])}
        found = {secret for secret in planted if secret.encode() in recorded or secret.encode() in recorded.lower()}
        assert found == (planted if raw else set()), (raw, found)
        assert b"@example.com" not in recorded or raw


def test_a_stream_redacted_in_any_cuts_is_the_stream_redacted_whole() -> None:
    """A string, an escape, a number, a literal or an SSE field name cut by a chunk's end is
    redacted as it is whole (a tap's line of JSON text is held until it ends: the same bytes)."""
    from sidecar.redaction import redactors

    for harness, frames in _planted().items():
        make = redactors(spec_for(harness))
        for wire, frame in frames:
            if wire in ("websocket", "config"):
                continue
            whole = make(wire).redact(frame * 3)
            assert len(whole) == len(frame * 3)
            for size in (1, 2, 3, 5, 11):
                redactor = make(wire)
                assert b"".join(redactor.redact(cut) for cut in _cuts(frame * 3, size)) == whole, (wire, size)


def _cuts(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


class _Failing:
    """A file on a disk that fails: every write and every close raise (a close flushes again)."""

    def __init__(self, error: int) -> None:
        self.error = error
        self.closed = 0

    def write(self, data: bytes) -> int:
        raise OSError(self.error, "planted")

    def flush(self) -> None:
        raise OSError(self.error, "planted")

    def close(self) -> None:
        self.closed += 1
        raise OSError(self.error, "planted")


@pytest.mark.parametrize("error", [28, 5], ids=["ENOSPC", "EIO"])
async def test_a_file_that_cannot_be_written_ends_the_recording_never_the_sidecar(
    error: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk (or an I/O error) raised again by the close: the sidecar crashed on it, and so did
    each replacement (issue 40). Now the recording stops, said once, and `run` returns."""
    file = _Failing(error)
    rec = Recorder(file, {"format": FORMAT})  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rec.run)
        rec.chunk(1, "channel", rec.new_stream(), b"{}\n")
        await trio.sleep(0.05)
        rec.chunk(2, "channel", 1, b"{}\n")  # after the failure: nothing queued, nothing raised
        rec.close()
    assert rec.truncated and file.closed == 1
    failed = [record for record in caplog.records if getattr(record, "event", None) == "recording-failed"]
    assert len(failed) == 1 and "planted" in failed[0].getMessage()


async def test_dev_full_as_the_recording_stops_it_and_the_recorder_returns(caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(open("/dev/full", "ab"), {"format": FORMAT})  # noqa: SIM115 (the recorder closes it)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rec.run)
        rec.chunk(1, "channel", rec.new_stream(), b"x" * 100_000)
        rec.close()
    assert rec.truncated
    assert any(getattr(record, "event", None) == "recording-failed" for record in caplog.records)


def test_the_recording_is_held_open_across_a_sidecar_replacement_never_reopened_by_name(tmp_path: Path) -> None:
    """Issue 40: each sidecar re-opened the recording by its name, so whoever may rename in its
    directory swapped the file between two sidecars and received the rest of the session; a FIFO
    put there blocked the replacement in open() for good. Now the resident holds the file and hands
    it down: the replacement comes up at once, and the rest of the session goes to the same file."""
    import os
    import signal
    import subprocess

    from tests.test_wrap_faults import AFTER_THE_KILL
    from tests.wrapping import context_frame, env, log_events, wait_for

    catalog, go, recording, moved = tmp_path / "c", tmp_path / "go", tmp_path / "session.rec", tmp_path / "moved.rec"
    harness = (sys.executable, "-c", AFTER_THE_KILL, str(go), context_frame(10, 100, 10.0))
    argv = wrap_argv(catalog, "a", "pi", *harness, extra=("--record", str(recording)))
    wrapper = subprocess.Popen(argv, env=env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_for(Path(f"{go}.harness").exists, what="the harness")  # so the first sidecar was ready
        recording.rename(moved)
        os.mkfifo(recording)  # what a reader of the rest of the session would put there
        first = next(e for e in log_events(catalog, "a") if e["event"] == "start")
        os.kill(int(first["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        go.touch()
        _, err = wrapper.communicate(timeout=60)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
    assert wrapper.returncode == 0, err  # the frame landed through the replacement
    assert recording.is_fifo()
    lines = _lines(moved)
    assert sum(1 for line in lines if "format" in line) == 2  # both sidecars wrote to the one file
    assert any(b'"contextWindow"' in chunk.data for chunk in read_chunks(moved.read_bytes()))  # the frame


def test_every_incarnation_of_a_restarted_session_records_into_the_one_file(tmp_path: Path) -> None:
    """`--restart`: a relaunch's sidecar gets the same open file as the first (the resident holds it),
    each starting with its own header."""
    catalog, recording = tmp_path / "cat", tmp_path / "session.rec"
    extra = ("--record", str(recording), "--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "0")
    result = run(wrap_argv(catalog, "rec", "pi", "false", extra=extra))
    assert result.returncode == 1, result.stderr
    headers = [line for line in _lines(recording) if "format" in line]
    assert len(headers) == 2 and headers[0]["incarnation"] != headers[1]["incarnation"]
    assert all(header["redacted"] is True for header in headers)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["type", "text", "id", "k"]), inner,
                                                                max_size=4),
    max_leaves=20,
)  # fmt: skip


def _expected(value: object, key: str | None, kept: frozenset[str]) -> object:
    """`value` as its redaction reads back: each string not under a kept key, as many `x` as bytes."""
    if isinstance(value, dict):
        return {k: _expected(v, k, kept) for k, v in value.items()}
    if isinstance(value, list):
        return [_expected(v, key, kept) for v in value]
    if isinstance(value, str) and key not in kept:
        return "x" * len(json.dumps(value, ensure_ascii=False).encode()[1:-1])
    return value


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(_JSON, min_size=1, max_size=4), cut=st.integers(1, 64), data=st.binary(max_size=200))
def test_any_json_lines_cut_anywhere_are_redacted_string_by_string(frames: list[object], cut: int, data: bytes) -> None:
    """Any JSON, cut at any size: each string under a key not kept reads back as that many `x`, every
    other value as it was, every line as long; and any bytes at all never raise nor change length."""
    from sidecar.redaction import Redactor

    kept = frozenset({"type", "id"})
    lines = b"".join(json.dumps(frame, ensure_ascii=False).encode() + b"\n" for frame in frames)
    redactor = Redactor(kept, "lines")
    redacted = b"".join(redactor.redact(part) for part in _cuts(lines, cut))
    assert [len(line) for line in redacted.split(b"\n")] == [len(line) for line in lines.split(b"\n")]
    assert [json.loads(line) for line in redacted.splitlines()] == [_expected(frame, None, kept) for frame in frames]
    for framing in ("lines", "messages", "sse"):
        assert len(Redactor(kept, framing).redact(data)) == len(data)  # type: ignore[arg-type]
