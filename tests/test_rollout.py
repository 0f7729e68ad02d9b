"""The interactive Codex seat: a rollout followed publishes what the app-server path publishes.

The lab captured the same sessions twice: the app-server's JSON-RPC stream
(fixtures/codex/codex-<V>-<scenario>.jsonl) and the `token_count` / `compacted` lines of the rollout
the same thread wrote (fixtures/transcripts/codex-<V>/rollout-token-events*.jsonl). Both go through
the one Codex producer; their readings and final records must agree.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.policy import Reading, WriteGuard
from guard.record import ContextFields
from sidecar.decoding import Decoder, Dropped
from sidecar.harnesses.codex import rollout
from sidecar.harnesses.codex.events import CompactionItem, HarnessBuild, ThreadOpened, TokenUsage
from sidecar.harnesses.codex.producer import SPEC, CodexProducer, Rollout
from sidecar.harnesses.codex.rollout import RolloutFollower, find_rollout, follow_rollout
from sidecar.pipeline import Pipeline
from sidecar.producer import instant_ms
from sidecar.streams import Streams
from sidecar.transcripts import HEAD_BYTES, MAX_LINE_BYTES
from tests.conformance import chunks_of, recording_of

Frame = Any  # a typed Codex event, as the follower submits it

ROOT = Path(__file__).resolve().parent.parent
CODEX_VERSIONS = ("0.151.0", "0.171.0")
SCENARIOS = {
    "stdio-main": "rollout-token-events.jsonl",
    "ws-main": "rollout-token-events.jsonl",
    "openai-main": "rollout-token-events-openai.jsonl",
}


def app_server_path(version: str, scenario: str) -> Path:
    return ROOT / "fixtures" / "codex" / f"codex-{version}-{scenario}.jsonl"


def app_server_capture(version: str, scenario: str) -> bytes:
    return app_server_path(version, scenario).read_bytes()


def served_events(version: str, scenario: str) -> list[tuple[int | None, object]]:
    """(time, event) of the app-server capture, through the spec's own decoders."""
    decoders: dict[str, Decoder] = {}
    timed: list[tuple[int | None, object]] = []
    for chunk in chunks_of(recording_of(app_server_path(version, scenario))):
        decoder = decoders.setdefault(chunk.wire, SPEC.decoder(chunk.wire))
        timed += [(chunk.at_ms, event) for event in decoder.receive_data(chunk.data) if not isinstance(event, Dropped)]
    return timed


def thread_of(capture: bytes) -> str:
    for line in capture.splitlines():
        message = json.loads(line)
        if message.get("method") == "thread/started":
            thread_id: str = message["params"]["thread"]["id"]
            return thread_id
    raise AssertionError("no thread/started in the capture")


def last_emitted_ms(capture: bytes) -> int:
    return max(json.loads(line).get("emittedAtMs", 0) for line in capture.splitlines())


def rollout_bytes(version: str, scenario: str) -> bytes:
    """The rollout lines of the capture's own thread, up to the capture's end (a later resume run
    appended to the same file), joined as the file had them."""
    capture = app_server_capture(version, scenario)
    thread, until = thread_of(capture), last_emitted_ms(capture)
    path = ROOT / "fixtures" / "transcripts" / f"codex-{version}" / SCENARIOS[scenario]
    kept = []
    for line in path.read_bytes().splitlines():
        entry = json.loads(line)
        stamp = instant_ms(entry["timestamp"])
        if entry["file"].endswith(f"{thread}.jsonl") and stamp is not None and stamp <= until:
            kept.append(line)
    assert kept
    return b"\n".join(kept) + b"\n"


def app_server_readings(version: str, scenario: str) -> tuple[list[Reading], ContextFields | None]:
    producer = CodexProducer()
    readings: list[Reading] = []
    for at_ms, frame in served_events(version, scenario):
        readings.extend(producer.feed(frame, at_ms or 0))
    return readings, producer.held.reading


def rollout_readings(data: bytes, chunk: int | None = None) -> tuple[list[Reading], ContextFields | None]:
    producer = CodexProducer()
    follower = RolloutFollower("thread")
    readings: list[Reading] = []
    step = chunk or len(data)
    for start in range(0, len(data), step):
        for frame in follower.feed(data[start : start + step]):
            readings.extend(producer.feed(frame, start))
    return readings, producer.held.reading


def occupancy(readings: list[Reading]) -> list[tuple[Any, ...]]:
    """Every usage reading's numbers (the count moves at a different line in each path: the
    app-server's item/started opens the compaction turn, the rollout's `compacted` line closes it)."""
    return [
        (r.fields.used_tokens, r.fields.window_tokens, r.fields.used_percent, r.fields.session_total_tokens,
         r.fields.rate_limits)
        for r in readings
        if not r.compaction_edge
    ]  # fmt: skip


def comparable(fields: ContextFields | None) -> dict[str, Any]:
    assert fields is not None
    # harnessVersion: the app-server names its build in `initialize`; these rollout extracts kept the
    # token events only, not the `session_meta` line that names it (tests/test_versions_and_sessions.py).
    # rateLimitsAtMs is a time like observedAtMs: each path's own (the follower here is fed byte offsets).
    return fields.model_dump(exclude={"observed_at_ms", "last_compaction_ms", "harness_version", "rate_limits_at_ms"})


@pytest.mark.parametrize("version", CODEX_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_rollout_publishes_what_the_app_server_publishes(version: str, scenario: str) -> None:
    served, served_last = app_server_readings(version, scenario)
    followed, followed_last = rollout_readings(rollout_bytes(version, scenario))
    assert occupancy(followed) == occupancy(served)
    assert comparable(followed_last) == comparable(served_last)
    assert sum(r.compaction_edge for r in followed) == sum(r.compaction_edge for r in served)
    if scenario == "stdio-main":
        # lab/codex: the baseline sequence of the main scenario, and not the naive last/window.
        assert [r.fields.used_percent for r in followed if not (r.compaction_edge or r.rate_limits_edge)] == [
            10, 44, 44, 45, 0, 5, 92, 92, 93, 0, 4,
        ]  # fmt: skip
        assert followed_last is not None and followed_last.used_percent != round(18250 / 190000 * 100)
        assert followed_last.compactions == 2


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_the_guard_writes_the_same_final_record_on_both_paths(version: str) -> None:
    served = Pipeline(CodexProducer(), WriteGuard("a", "i"))
    for at_ms, frame in served_events(version, "stdio-main"):
        served.feed(frame, at_ms or 0)
    followed = Pipeline(CodexProducer(), WriteGuard("a", "i"))
    follower = RolloutFollower("thread")
    for frame in follower.feed(rollout_bytes(version, "stdio-main")):
        followed.feed(frame, 0)
    assert served.guard.last is not None and followed.guard.last is not None
    keep = {"used_tokens", "window_tokens", "used_percent", "session_total_tokens", "rate_limits", "compactions"}
    assert served.guard.last.model_dump(include=keep) == followed.guard.last.model_dump(include=keep)


def test_byte_by_byte_is_the_same_as_all_at_once() -> None:
    data = rollout_bytes("0.171.0", "stdio-main")
    whole, _ = rollout_readings(data)
    dribbled, _ = rollout_readings(data, chunk=7)
    assert occupancy(whole) == occupancy(dribbled)
    assert [r.compaction_edge for r in whole] == [r.compaction_edge for r in dribbled]


def test_a_partial_line_waits_for_its_newline_and_a_huge_line_is_skipped() -> None:
    line = rollout_bytes("0.151.0", "stdio-main").splitlines()[0]
    follower = RolloutFollower("t")
    assert follower.feed(line[:50]) == []
    assert follower.feed(line[50:]) == []  # complete, but no newline yet: a writer may be mid-line
    # The seat's own thread first (the follower never follows a subagent's), then the line's events.
    assert follower.feed(b"\n")[0] == ThreadOpened(thread_id="t")
    huge = b'{"type":"response_item","payload":{"text":"' + b"x" * (MAX_LINE_BYTES + 1)
    # Skipped, not held: only the head that says what kind of line it was.
    assert follower.feed(huge) == [] and follower.decoder.framer.pending_bytes == 0
    assert follower.decoder.holding == HEAD_BYTES
    assert follower.feed(b'"}}\n' + line + b"\n") != []
    damaged = follower.feed(b"\x00garbage\n{not json}\n" + b"[" * 50_000 + b"\n")
    assert [type(event) for event in damaged] == [Dropped] * 3  # counted (guard.json_rule), never a number


def test_the_compaction_item_id_is_the_line_offset() -> None:
    data = rollout_bytes("0.151.0", "stdio-main")
    first = RolloutFollower("t").feed(data)
    again = RolloutFollower("t").feed(data)
    ids = [f.item_id for f in first if isinstance(f, CompactionItem)]
    assert len(ids) == 2 and len(set(ids)) == 2
    producer = CodexProducer()
    for frame in first + again:  # the same file read twice (a re-follow) counts each compaction once
        producer.feed(frame, 0)
    assert producer.held.compactions.count == 2


# ---------------------------------------------------------------------------------------------
# Finding the rollout of this launch

LAUNCH_MS = 1_795_994_906_000


def session_meta(thread: str, at_ms: int, cwd: str, source: object = "cli") -> bytes:
    stamp = f"{trio_free_iso(at_ms)}"
    payload = {"id": thread, "timestamp": stamp, "cwd": cwd, "cli_version": "0.171.0", "source": source}
    return json.dumps({"timestamp": stamp, "type": "session_meta", "payload": payload}).encode() + b"\n"


def trio_free_iso(at_ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_rollout(home: Path, thread: str, at_ms: int, cwd: str, body: bytes = b"", **meta: Any) -> Path:
    from datetime import UTC, datetime

    day = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    directory = home / "sessions" / f"{day.year:04d}" / f"{day.month:02d}" / f"{day.day:02d}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rollout-{day.strftime('%Y-%m-%dT%H-%M-%S')}-{thread}.jsonl"
    path.write_bytes(session_meta(thread, at_ms, cwd, **meta) + body)
    return path


def config(home: Path, cwd: str | None = "/work/repo") -> Rollout:
    return Rollout.model_validate({"mode": "rollout", "codexHome": str(home), "cwd": cwd, "startedAtMs": LAUNCH_MS})


def test_the_newest_rollout_of_this_launch_and_cwd_is_chosen(tmp_path: Path) -> None:
    write_rollout(tmp_path, "before-launch", LAUNCH_MS - 60_000, "/work/repo")
    write_rollout(tmp_path, "other-cwd", LAUNCH_MS + 3_000, "/elsewhere")
    write_rollout(tmp_path, "subagent", LAUNCH_MS + 4_000, "/work/repo", source={"subagent": "review"})
    ours = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo")
    found = find_rollout(config(tmp_path), LAUNCH_MS + 10_000, set())
    assert found is not None and found.path == ours and found.thread_id == "ours"
    newer = write_rollout(tmp_path, "ours-after-new", LAUNCH_MS + 2_000, "/work/repo")
    found = find_rollout(config(tmp_path), LAUNCH_MS + 10_000, set())
    assert found is not None and found.path == newer
    anywhere = find_rollout(config(tmp_path, cwd=None), LAUNCH_MS + 10_000, set())
    assert anywhere is not None and anywhere.thread_id == "other-cwd"  # a subagent's thread is never the seat


def test_a_half_written_header_is_looked_at_again(tmp_path: Path) -> None:
    path = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo")
    full = path.read_bytes()
    path.write_bytes(full[:40])
    rejected: set[Path] = set()
    assert find_rollout(config(tmp_path), LAUNCH_MS + 10_000, rejected) is None
    assert path not in rejected
    path.write_bytes(full)
    found = find_rollout(config(tmp_path), LAUNCH_MS + 10_000, rejected)
    assert found is not None and found.path == path


@pytest.mark.parametrize(
    "header",
    [b"garbage\n", b"[]\n", b'{"type":"session_meta","payload":{"id":5}}\n', b"\xff" * 100 + b"\n", b"\n"],
)
def test_hostile_headers_are_not_followed(tmp_path: Path, header: bytes) -> None:
    path = write_rollout(tmp_path, "x", LAUNCH_MS + 1_000, "/work/repo")
    path.write_bytes(header)
    assert find_rollout(config(tmp_path), LAUNCH_MS + 10_000, set()) is None


@pytest.mark.parametrize(
    "bad",
    [{}, {"mode": "rollout"}, {"mode": "ws", "codexHome": "/x", "startedAtMs": 1},
     {"mode": "rollout", "codexHome": 5, "startedAtMs": 1}, {"mode": "rollout", "codexHome": "/x", "startedAtMs": "1"}],
)  # fmt: skip
def test_a_bad_config_runs_no_transport_and_says_why(bad: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    from sidecar.app import transport_settings
    from sidecar.harnesses.codex.producer import SPEC

    assert transport_settings(SPEC, json.dumps(bad)) is None
    assert any(getattr(record, "event", None) == "transport-bad-config" for record in caplog.records)


async def until(condition: Callable[[], bool]) -> None:
    # The condition is the transport's output as the file grows; each caller bounds it with fail_after.
    while not condition():  # noqa: ASYNC110
        await trio.sleep(0.1)


async def test_follow_submits_as_the_session_grows_and_backs_off_when_idle(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    lines = rollout_bytes("0.151.0", "stdio-main").splitlines(keepends=True)
    frames: list[Frame] = []
    reads: list[float] = []
    real_read = rollout.read_from

    def counting_read(path: Path, offset: int) -> tuple[bytes, int] | None:
        reads.append(trio.current_time())
        return real_read(path, offset)

    monkeypatch.setattr(rollout, "read_from", counting_read)
    settings = config(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow_rollout, settings, Streams(SPEC, frames.append))
        await trio.sleep(3)  # nothing written yet: it waits, polling
        assert frames == []
        path = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo", b"".join(lines[:2]))
        with trio.fail_after(10):
            await until(lambda: len(frames) >= 4)
        # The seat's own thread, then session_meta as the app-server's thread/started (its
        # cliVersion), then the usage.
        assert [type(f) for f in frames[:3]] == [ThreadOpened, HarnessBuild, TokenUsage]
        assert [getattr(f, "thread_id", None) for f in frames[:3]] == ["ours", None, "ours"]
        with path.open("ab") as handle:
            handle.write(b"".join(lines[2:]))
        with trio.fail_after(10):
            await until(lambda: any(isinstance(f, CompactionItem) for f in frames))
        settled = len(reads)
        await trio.sleep(60)  # idle: back-off to one look every POLL_MAX_S, no busy loop
        assert len(reads) - settled <= 60 / rollout.POLL_MAX_S + 2
        # `/new` in the TUI: a newer rollout of the same launch and cwd takes over.
        write_rollout(tmp_path, "after-new", LAUNCH_MS + 5_000, "/work/repo", lines[0])
        with trio.fail_after(30):
            await until(lambda: any(getattr(f, "thread_id", None) == "after-new" for f in frames))
        nursery.cancel_scope.cancel()
    producer = CodexProducer()
    for frame in frames:
        producer.feed(frame, 0)
    assert producer.held.compactions.count == 2


async def test_the_last_turn_is_read_when_the_session_ends_between_polls(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    lines = rollout_bytes("0.171.0", "stdio-main").splitlines(keepends=True)
    frames: list[Frame] = []
    settings = config(tmp_path)
    path = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo", lines[0])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow_rollout, settings, Streams(SPEC, frames.append))
        await trio.sleep(30)  # idle long enough to back off to the longest poll
        assert len(frames) == 4  # its thread, session_meta's build, then the usage and its rate limits
        with path.open("ab") as handle:
            handle.write(b"".join(lines[1:]))
        nursery.cancel_scope.cancel()  # the seat ended before the next poll
    usages = [f for f in frames if isinstance(f, TokenUsage)]
    assert usages[-1].tokens_in_window == 18250


async def test_a_session_too_short_to_be_found_is_found_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    frames: list[Frame] = []
    settings = config(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow_rollout, settings, Streams(SPEC, frames.append))
        await trio.sleep(1)  # the follower looked, found nothing, and sleeps
        write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo", rollout_bytes("0.151.0", "stdio-main"))
        nursery.cancel_scope.cancel()
    assert sum(isinstance(f, CompactionItem) for f in frames) == 2


def test_a_compaction_line_too_long_to_parse_still_counts() -> None:
    compacted = (
        b'{"timestamp":"2026-11-29T22:31:12.640Z","type":"compacted","payload":{"message":"s","replacement_history":"'
        + b"h" * (MAX_LINE_BYTES + 5)
        + b'"}}\n'
    )
    follower = RolloutFollower("t")
    frames = [
        frame for piece in range(0, len(compacted), 65536) for frame in follower.feed(compacted[piece : piece + 65536])
    ]
    assert [type(f) for f in frames] == [ThreadOpened, CompactionItem]
    assert frames[1].item_id == "rollout-compacted:t:0"
    assert (
        follower.feed(
            b'{"timestamp":"x","type":"response_item","payload":{"t":"' + b"y" * (MAX_LINE_BYTES + 1) + b'"}}\n'
        )
        == []
    )


# ---- the rollout the wrapped Codex holds open (issue 19, point 4) -----------------------------------


def holding(*paths: Path) -> Any:
    """A stand-in for the wrapped Codex: a process that holds `paths` open (as codex holds its rollout)."""
    import subprocess

    handles = [path.open("ab") for path in paths]
    try:
        return subprocess.Popen(["sleep", "60"], pass_fds=[h.fileno() for h in handles])
    finally:
        for handle in handles:
            handle.close()


def pid_config(home: Path, root_pid: int) -> Rollout:
    return config(home).model_copy(update={"root_pid": root_pid})


def threads_of(frames: list[Frame]) -> set[str]:
    return {f.thread_id for f in frames if isinstance(f, TokenUsage)}


async def test_two_seats_in_one_directory_each_follow_the_rollout_their_codex_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both rollouts name the launch's cwd and start after it; the other seat's is the newer one."""
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    body = b"".join(rollout_bytes("0.151.0", "stdio-main").splitlines(keepends=True)[:6])
    ours = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo", body)
    theirs = write_rollout(tmp_path, "theirs", LAUNCH_MS + 2_000, "/work/repo", body)
    seats = {"ours": holding(ours), "theirs": holding(theirs)}
    try:
        for thread, process in seats.items():
            assert threads_of(await followed(pid_config(tmp_path, process.pid))) == {thread}
    finally:
        for process in seats.values():
            process.kill()
            process.wait()


async def followed(settings: Rollout) -> list[Frame]:
    """What the follower submits once it published a reading and looked half a second longer."""
    frames: list[Frame] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow_rollout, settings, Streams(SPEC, frames.append))
        with trio.fail_after(10):
            await until(lambda: bool(threads_of(frames)))
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    return frames


async def test_a_resumed_rollout_is_followed_from_its_latest_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`codex resume` appends to a rollout started long before this launch: its newest reading is
    published (as the app-server replays one on resume), then what the resumed session appends."""
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    lines = rollout_bytes("0.171.0", "stdio-main").splitlines(keepends=True)
    earlier = write_rollout(tmp_path, "resumed", LAUNCH_MS - 3_600_000, "/work/repo", b"".join(lines[:-1]))
    process = holding(earlier)
    frames: list[Frame] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_rollout, pid_config(tmp_path, process.pid), Streams(SPEC, frames.append))
            with trio.fail_after(10):
                await until(lambda: bool(threads_of(frames)))
            with earlier.open("ab") as handle:
                handle.write(lines[-1])
            with trio.fail_after(10):
                await until(lambda: len([f for f in frames if isinstance(f, TokenUsage)]) == 2)
            nursery.cancel_scope.cancel()
    finally:
        process.kill()
        process.wait()
    producer = CodexProducer()
    for frame in frames:
        producer.feed(frame, 0)
    # The resumed thread's history is not replayed as this launch's: no compaction is re-counted.
    assert producer.held.compactions.count == 0
    assert producer.held.reading is not None and producer.held.reading.used_tokens == 18_250


async def test_a_seat_too_short_to_be_seen_holding_its_rollout_never_takes_a_live_seats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `codex exec` over before a look saw its file held: at the end the launch's rule picks among
    the rollouts nobody holds, so the other seat's newer, still running one is not this seat's."""
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    body = b"".join(rollout_bytes("0.151.0", "stdio-main").splitlines(keepends=True)[:6])
    ours = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo", body)
    running = holding(write_rollout(tmp_path, "running", LAUNCH_MS + 2_000, "/work/repo", body))
    gone = 2**22 + 1  # above any pid_max: this seat's codex has exited, its tree is empty
    frames: list[Frame] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_rollout, pid_config(tmp_path, gone), Streams(SPEC, frames.append))
            await trio.sleep(0.5)
            assert frames == []  # nothing of this seat is held: nothing is guessed while it runs
            nursery.cancel_scope.cancel()
    finally:
        running.kill()
        running.wait()
    assert threads_of(frames) == {"ours"} and ours.exists()


def codex_with_a_tool(ours: Path, tool: str) -> Any:
    """A stand-in codex holding `ours` for appending, with a child running the shell line `tool`."""
    import subprocess

    return subprocess.Popen(["sh", "-c", f'exec 4>>{ours}; sh -c "{tool}" & wait'], start_new_session=True)


@pytest.mark.parametrize("tool_opens", ["exec 3<", "exec 3>>"], ids=["read", "append"])
async def test_a_tool_the_harness_runs_opening_another_sessions_rollout_never_moves_the_seat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool_opens: str
) -> None:
    """Issue 26, point 4: the seat's codex holds its rollout for writing; a child of it (a tool) opens
    another session's newer rollout, to read it or even to append. The seat stays on its own file,
    and the reading its codex appends afterwards is the one submitted."""
    monkeypatch.setattr(rollout, "_now_ms", lambda: LAUNCH_MS + 10_000)
    monkeypatch.setattr(rollout, "RESCAN_EVERY_S", 0.1)
    lines = rollout_bytes("0.171.0", "stdio-main").splitlines(keepends=True)
    ours = write_rollout(tmp_path, "ours", LAUNCH_MS + 1_000, "/work/repo", b"".join(lines[:-1]))
    other = write_rollout(tmp_path, "other", LAUNCH_MS + 2_000, "/work/repo", b"".join(lines))
    go = tmp_path / "go"
    tool = f"while [ ! -e {go} ]; do sleep 0.02; done; {tool_opens}{other}; sleep 60"
    codex = codex_with_a_tool(ours, tool)
    frames: list[Frame] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_rollout, pid_config(tmp_path, codex.pid), Streams(SPEC, frames.append))
            with trio.fail_after(10):
                await until(lambda: bool(threads_of(frames)))
            go.touch()
            await trio.sleep(1.0)  # ten rescans with the tool holding the other session's file
            with ours.open("ab") as handle:
                handle.write(lines[-1])
            with trio.fail_after(10):
                await until(lambda: len([f for f in frames if isinstance(f, TokenUsage)]) >= 2)
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    finally:
        os.killpg(codex.pid, signal.SIGKILL)  # the seat's codex and its tool, their own group
        codex.wait()
    assert threads_of(frames) == {"ours"}
    usages = [f for f in frames if isinstance(f, TokenUsage)]
    producer = CodexProducer()
    for frame in frames:
        producer.feed(frame, 0)
    assert producer.held.reading is not None and usages[-1].thread_id == "ours"
