"""The pi/omp producer over the lab's verbatim captures of the real builds, and through `hctx replay`.

fixtures/pi/<run>/capture.jsonl are the lab's probe captures, copied unchanged (pi 0.84.2 and 1.6.0,
omp 18.1.16 and 18.2.3, windows 32000 and 4000); scripts/convert_fixtures.py turned each probe line
into the channel line the shipped asset sends for the same event and ctx, in the recording
fixtures/recordings/pi/<run>.rec, which the tests replay. Every fixture test asserts the number that
must be published and the wrong number that must not, for the same served turn.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from guard.policy import Write
from sidecar.decoding import CHANNEL
from sidecar.harnesses.pi.producer import OMP, PI, ContextFrame, PiProducer, trigger_of
from sidecar.producer import instant_ms
from sidecar.recorder import Chunk
from sidecar.registry import spec_for
from sidecar.spec import UnknownHarness
from tests.conformance import (
    RECORDINGS,
    bytewise,
    chunks_of,
    fixture_writes,
    outcome,
    recorded,
    recording_path,
    replayed,
)
from tests.conftest import FIXTURE_ROOT
from tests.fakes.pi_channel import feed, frames_of
from wrapper.cli import main as hctx

FIXTURES = FIXTURE_ROOT / "pi"


def capture(run: str) -> Path:
    return FIXTURES / run / "capture.jsonl"


def recording(run: str) -> str:
    """The probe capture of `run` as the recording the extension's frames make."""
    return f"pi/{run}.rec"


def live(name: str) -> str:
    """A channel recording of the live runs (fixtures/pi/live/), converted."""
    return f"pi/live/{name}.channel.rec"


def writes_of(harness: str, run: str) -> list[Write]:
    return fixture_writes(harness, recording(run))


def numbers(writes: list[Write]) -> list[tuple[int | None, float | None]]:
    return [(w.record.used_tokens, w.record.used_percent) for w in writes]


def captured_version(run: str) -> str:
    """The build a capture was taken from, as the capture itself spells it."""
    lines = [json.loads(line) for line in capture(run).read_text().splitlines()]
    session_files = {line["entries"]["sessionFile"] for line in lines if isinstance(line.get("entries"), dict)}
    (session_file,) = {path.split("/run/")[1].split("/")[0] for path in session_files}
    return session_file


def user_agent(run: str) -> str:
    first = json.loads((FIXTURES / run / "fake_requests.sample.jsonl").read_text().splitlines()[0])
    agent: str = first["headers"]["User-Agent"]
    return agent


def frame(
    reading: dict[str, Any] | None = None, compaction: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {"type": "context", "reading": reading, "compaction": compaction, **extra}


def reading(
    tokens: int | None = 100, window: int | None = 1000, percent: float | None = 10.0, **extra: Any
) -> dict[str, Any]:
    return {"tokens": tokens, "contextWindow": window, "percent": percent, "model": "m", "costUsd": 0.5, **extra}


# --- the numerator each build means ---------------------------------------------------------------


@pytest.mark.parametrize(("run", "version"), [("pi-0.84.2-w32k", "0.84.2"), ("pi-1.6.0-w32k", "1.6.0")])
def test_the_pi_captures_pin_total_tokens_as_the_numerator(run: str, version: str) -> None:
    assert captured_version(run) == f"pi-{version}-w32k"
    writes = writes_of("pi", run)
    published = numbers(writes)
    # turn2 served prompt 16000 (4000 of it cached) + completion 480: pi's figure is the total.
    assert (16480, 51.5) in published
    assert (16000, 50.0) not in published
    # turn7 served 36000 + 400 against a 32000 window: 113.75 %, unclamped.
    assert (36400, 113.75) in published
    assert (36000, 112.5) not in published
    assert all(w.record.harness == "pi" for w in writes)
    assert {w.record.model for w in writes} == {"fake-32k"}
    turn2 = next(w.record for w in writes if w.record.used_tokens == 16480)
    assert (turn2.window_tokens, turn2.cost_usd) == (32000, pytest.approx(13.36))


@pytest.mark.parametrize(("run", "version"), [("omp-18.1.16-w32k", "18.1.16"), ("omp-18.2.3-w32k", "18.2.3")])
def test_the_omp_captures_pin_prompt_input_as_the_numerator(run: str, version: str) -> None:
    assert captured_version(run) == f"omp-{version}-w32k"
    assert user_agent(run) == f"omp/{version}"
    writes = writes_of("omp", run)
    published = numbers(writes)
    # The same served turn2: omp counts input 12000 + cacheRead 4000 and leaves the output out.
    assert (16000, 50.0) in published
    assert (16480, 51.5) not in published
    assert (36000, 112.5) in published
    assert (36400, 113.75) not in published
    assert all(w.record.harness == "omp" for w in writes)


def test_the_pi_4k_capture_publishes_the_overrun_as_measured() -> None:
    published = numbers(writes_of("pi", "pi-0.84.2-w4k"))
    assert (4200, 105.0) in published and (4550, 113.75) in published
    assert (3900, 97.5) not in published


# --- compaction -----------------------------------------------------------------------------------


@pytest.mark.parametrize("run", ["pi-0.84.2-w32k", "pi-1.6.0-w32k", "pi-0.84.2-w4k", "pi-1.6.0-w4k"])
def test_a_pi_compaction_withholds_the_reading_it_emptied_in_the_same_write(run: str) -> None:
    writes = writes_of("pi", run)
    edges = [w for w in writes if w.reason == "compaction"]
    triggers = [w.record.last_compaction_trigger for w in edges]
    assert triggers == ["manual", "threshold", "overflow", "threshold", "overflow"]
    assert [w.record.compactions for w in edges] == [1, 2, 3, 4, 5]
    for edge in edges:
        record = edge.record
        assert (record.used_tokens, record.used_percent) == (None, None)
        assert record.window_tokens in (4000, 32000)
        assert record.last_compaction_ms == record.observed_at_ms
    # One write per compaction: the edge and its withheld reading are never split into two.
    assert len(edges) == 5
    # The null holds until the next turn_end: no number is published between an edge and it.
    after_manual = writes[writes.index(edges[0]) + 1].record
    assert after_manual.used_tokens in (26400, 3300)


@pytest.mark.parametrize(
    ("run", "triggers"),
    [
        ("omp-18.1.16-w32k", ["unknown", "threshold", "threshold", "threshold"]),
        ("omp-18.2.3-w32k", ["unknown", "threshold", "overflow", "threshold", "overflow", "threshold"]),
    ],
)
def test_an_omp_compaction_takes_its_reason_from_auto_compaction_start(run: str, triggers: list[str]) -> None:
    writes = writes_of("omp", run)
    edges = [w for w in writes if w.reason == "compaction"]
    # The manual compact fires no auto_compaction_start: nothing names a reason, so unknown.
    assert [w.record.last_compaction_trigger for w in edges] == triggers
    assert [w.record.compactions for w in edges] == list(range(1, len(triggers) + 1))
    # omp never withholds: every write, edges included, carries its own number.
    assert all(w.record.used_tokens is not None for w in writes)
    assert edges[0].record.used_tokens in (15013, 15183)


@pytest.mark.parametrize(("harness", "run"), [("pi", "pi-0.84.2-w32k"), ("omp", "omp-18.1.16-w32k")])
def test_the_durable_count_rides_the_restarted_sessions_first_frame(harness: str, run: str) -> None:
    """p2 is a new process on the same session: its session_start already carries the store's count."""
    frames = [f for _, f in frames_of(chunks_of(recording(run)))]
    starts = [f for f in frames if f["event"] == "session_start"]
    assert len(starts) == 3
    producer = spec_for(harness).make_producer()
    assert isinstance(producer, PiProducer)
    (restart,) = feed(producer, starts[1], now_ms=1)
    assert restart.fields.compactions == (5 if harness == "pi" else 3)
    assert not restart.compaction_edge
    if harness == "pi":  # still null across the restart: no assistant usage since the last compaction
        assert (restart.fields.used_tokens, restart.fields.window_tokens) == (None, 32000)


def test_an_unreadable_durable_count_degrades_to_counting_edges_not_to_losing_them() -> None:
    producer = PiProducer("pi")
    feed(producer, frame(reading(), compactions=4), now_ms=1_000)
    (first,) = feed(producer, frame(reading(None, 1000, None), {"reason": "threshold", "count": None}), now_ms=2_000)
    assert first.compaction_edge and first.fields.compactions == 5
    (second,) = feed(producer, frame(None, {"reason": "manual", "count": None}), now_ms=3_000)
    assert second.fields.compactions == 6
    # once the store answers again, its durable count wins over our own
    (third,) = feed(producer, frame(reading(), {"reason": "overflow", "count": 9}), now_ms=4_000)
    assert third.fields.compactions == 9


def test_an_edge_without_a_reading_keeps_the_held_reading_and_its_time() -> None:
    producer = PiProducer("omp")
    feed(producer, frame(reading(500, 1000, 50.0)), now_ms=1_000)
    (edge,) = feed(producer, frame(None, {"reason": None, "count": 1}), now_ms=7_000)
    assert edge.compaction_edge
    assert (edge.fields.used_tokens, edge.fields.observed_at_ms) == (500, 1_000)
    assert (edge.fields.last_compaction_ms, edge.fields.last_compaction_trigger) == (7_000, "unknown")
    # and with nothing held at all, the edge still lands, publishing no number
    (bare,) = feed(PiProducer("pi"), frame(None, {"reason": "manual", "count": None}), now_ms=9_000)
    assert (bare.fields.used_tokens, bare.fields.window_tokens, bare.fields.compactions) == (None, None, 1)


def test_a_replaced_session_with_no_compaction_drops_the_old_sessions_edge() -> None:
    producer = PiProducer("pi")
    feed(producer, frame(reading(), {"reason": "manual", "count": 2}), now_ms=1_000)
    (same,) = feed(producer, frame(reading(), compactions=2), now_ms=2_000)
    assert (same.fields.compactions, same.fields.last_compaction_trigger) == (2, "manual")
    (fresh,) = feed(producer, frame(reading(0, 1000, 0.0), compactions=0), now_ms=3_000)
    assert (fresh.fields.compactions, fresh.fields.last_compaction_ms, fresh.fields.last_compaction_trigger) == (
        0, None, None,
    )  # fmt: skip


def test_frames_without_a_reading_or_an_edge_publish_nothing() -> None:
    producer = PiProducer("pi")
    assert feed(producer, frame(None, None, compactions=2), now_ms=1) == []
    (later,) = feed(producer, frame(reading()), now_ms=2)
    assert later.fields.compactions == 2


@pytest.mark.parametrize(
    ("reason", "trigger"),
    [("manual", "manual"), ("threshold", "threshold"), ("overflow", "overflow"), ("idle", "idle"),
     (None, "unknown"), ("context-full", "unknown"), ("MANUAL", "unknown"), ("", "unknown")],
)  # fmt: skip
def test_trigger_words_outside_the_closed_set_decode_as_unknown(reason: str | None, trigger: str) -> None:
    assert trigger_of(reason) == trigger
    (edge,) = feed(PiProducer("pi"), frame(reading(), {"reason": reason, "count": 1}), now_ms=5)
    assert edge.fields.last_compaction_trigger == trigger


# --- the numbers pass through untouched ------------------------------------------------------------


def test_the_reading_becomes_the_record_triple_as_given() -> None:
    (out,) = feed(PiProducer("pi"), frame(reading(4550, 4000, 113.75)), now_ms=42)
    fields = out.fields
    assert (fields.used_tokens, fields.window_tokens, fields.used_percent) == (4550, 4000, 113.75)
    assert (fields.model, fields.cost_usd, fields.observed_at_ms) == ("m", 0.5, 42)
    assert (fields.session_total_tokens, fields.rate_limits) == (None, None)


def test_the_registry_selects_this_producer_for_both_harnesses() -> None:
    assert (spec_for("pi"), spec_for("omp")) == (PI, OMP)
    assert isinstance(PI.make_producer(), PiProducer) and OMP.make_producer().harness == "omp"
    assert PI.wires() == OMP.wires() == (CHANNEL,)  # the extension writes to the channel only
    (event,) = PI.decoder(CHANNEL).receive_data(json.dumps(frame(reading())).encode() + b"\n")
    assert isinstance(event, ContextFrame)
    with pytest.raises(UnknownHarness, match="serves pi and omp"):
        PiProducer("codex")


def test_a_probe_capture_reads_as_the_lines_the_extension_sends() -> None:
    """The probe's lines became compact JSON lines, one `context` frame each, as JSON.stringify writes."""
    chunks = chunks_of(recording("pi-1.6.0-w32k"))
    assert chunks and {chunk.wire for chunk in chunks} == {CHANNEL}
    assert all(
        chunk.data.startswith(b'{"type":"context","event":"') and chunk.data.endswith(b"}\n") for chunk in chunks
    )
    assert all(b'": ' not in chunk.data.split(b'"reading":')[0] for chunk in chunks)
    assert all(isinstance(chunk.at_ms, int) for chunk in chunks)


def test_a_channel_recording_reads_as_its_own_bytes_and_splits_anywhere() -> None:
    path = FIXTURES / "live" / "pi-1.6.0.channel.jsonl"
    chunks = chunks_of(live("pi-1.6.0"))
    assert b"".join(chunk.data for chunk in chunks) == path.read_bytes()
    whole = [outcome(write) for write in replayed(PI, chunks)]
    assert whole and [outcome(write) for write in replayed(PI, bytewise(chunks))] == whole


# --- recordings and `hctx replay` -----------------------------------------------------------------


def _hctx_replay(harness: str, *names: str | Path) -> list[dict[str, Any]]:
    """`hctx replay --harness HARNESS` of recordings (a name under fixtures/recordings/, or a path)."""
    paths = [name if isinstance(name, Path) else recording_path(name) for name in names]
    out = io.StringIO()
    with redirect_stdout(out):
        assert hctx(["replay", "--harness", harness, *map(str, paths)]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("harness", "run", "published", "refused"),
    [("pi", "pi-0.84.2-w32k", 16480, 16000), ("omp", "omp-18.2.3-w32k", 16000, 16480)],
)
def test_hctx_replay_prints_every_write_with_its_reason(harness: str, run: str, published: int, refused: int) -> None:
    lines = _hctx_replay(harness, recording(run))
    assert lines and all(line["reason"] in {"bucket", "compaction", "heartbeat"} for line in lines)
    assert all(line["schema"] == "st2.harness-context.v1" and line["harness"] == harness for line in lines)
    used = [line["usedTokens"] for line in lines]
    assert published in used and refused not in used
    assert sum(line["reason"] == "compaction" for line in lines) >= 4


def test_channel_frame_recordings_replay_with_their_own_times(tmp_path: Path) -> None:
    timed = [
        (5_000, frame(reading(100, 1000, 10.0))),
        (6_000, frame(reading(None, 1000, None), {"reason": "manual", "count": 1})),
        (9_000, frame(reading(300, 1000, 30.0))),
    ]
    chunks = [Chunk(at_ms, CHANNEL, json.dumps(sent).encode() + b"\n") for at_ms, sent in timed]
    chunks.append(Chunk(9_500, CHANNEL, b'{"type": "context", "reading": {"tok'))  # a recording cut mid-write
    (path := tmp_path / "channel.rec").write_bytes(recorded("pi", chunks))
    lines = _hctx_replay("pi", path)
    assert [(line["reason"], line["usedTokens"], line["observedAtMs"]) for line in lines] == [
        ("bucket", 100, 5_000), ("compaction", None, 6_000), ("bucket", 300, 9_000),
    ]  # fmt: skip


def test_live_channel_recordings_replay(tmp_path: Path) -> None:
    """Frames recorded off the socket in the live runs (fixtures/pi/live) replay to the same numbers."""
    recordings = sorted((RECORDINGS / "pi" / "live").glob("*.channel.rec"))
    assert len(recordings) == 4  # pi 0.84.2 and 1.6.0, omp 18.1.16 and 18.2.3
    for path in recordings:
        harness = path.name.split("-")[0]
        lines = _hctx_replay(harness, path)
        used = [line["usedTokens"] for line in lines]
        percents = [line["usedPercent"] for line in lines]
        triggers = [line["lastCompactionTrigger"] for line in lines if line["reason"] == "compaction"]
        if harness == "pi":
            assert 16480 in used and 16000 not in used
            assert 113.75 in percents and 112.5 not in percents
            assert all(line["usedTokens"] is None for line in lines if line["reason"] == "compaction")
            assert triggers[:3] == ["manual", "threshold", "overflow"]
        else:
            assert 16000 in used and 16480 not in used
            assert 112.5 in percents and 113.75 not in percents
            assert None not in used
            assert triggers[:2] == ["unknown", "threshold"]


# ---- a session switch (issue 19, point 6) ------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.84.2", "1.6.0"])
def test_after_a_session_switch_the_compaction_facts_are_the_new_sessions(version: str) -> None:
    """Recorded off the shipped asset in real pi (tests/live/test_pi_live.py, session switch): session A
    compacts by hand, a new session B on the threshold, then `switch_session` back to A. From A's
    session_start on, the record must not carry B's compaction time and trigger beside A's count, but
    A's own compaction time as A's store holds it (issue 24; the store names no trigger)."""
    name = f"pi/live/session-switch/pi-{version}.channel.rec"
    frames = [item for _, item in frames_of(chunks_of(name))]
    edges = [(f["compaction"]["reason"], f["compaction"]["count"]) for f in frames if f["compaction"] is not None]
    assert edges == [("manual", 1), ("threshold", 1)]  # the capture is what the docstring says
    switch = max(i for i, f in enumerate(frames) if f["event"] == "session_start")
    assert frames[switch]["compactions"] == 1  # A's own store, read back on the switch
    lines = _hctx_replay("pi", name)
    threshold = next(line for line in lines if line["lastCompactionTrigger"] == "threshold")
    after = [line for line in lines if line["observedAtMs"] >= frames[switch]["atMs"]]
    assert after, "the switch back to A writes"
    stored = instant_ms(frames[switch]["lastCompactionAt"])
    assert stored is not None and stored < threshold["lastCompactionMs"]  # A compacted before B
    for line in after:
        assert line["compactions"] == 1
        # A's compaction is A's: at the time A's store holds, B's time and trigger gone.
        assert (line["lastCompactionMs"], line["lastCompactionTrigger"]) == (stored, None)
    assert (after[-1]["usedTokens"], after[-1]["usedPercent"]) == (12240, 38.25)


def test_a_resumed_session_restates_its_stored_compaction_time_and_a_bad_one_is_unknown() -> None:
    producer = PiProducer("pi")
    feed(producer, frame(reading(), {"reason": "threshold", "count": 1}), now_ms=9_000_000)
    started = {"type": "context", "event": "session_start", "reading": None, "compaction": None, "compactions": 2,
               "lastCompactionAt": "1970-01-01T00:00:05.250Z"}  # fmt: skip
    assert feed(producer, started, now_ms=9_500_000) == []
    (resumed,) = feed(producer, frame(reading()) | {"compactions": 2}, now_ms=9_600_000)
    assert (resumed.fields.compactions, resumed.fields.last_compaction_ms) == (2, 5_250)
    assert resumed.fields.last_compaction_trigger is None  # the store names no reason
    other = PiProducer("pi")
    for stamp in ("yesterday", "2026-11-29T22:39:12", 12, None):  # unreadable or no zone: unknown, no drop
        feed(other, started | {"lastCompactionAt": stamp, "event": "session_start"}, now_ms=1_000)
        (line,) = feed(other, frame(reading()) | {"compactions": 2}, now_ms=2_000)
        assert line.fields.last_compaction_ms is None


def test_a_session_start_drops_the_previous_sessions_reading_and_edge() -> None:
    producer = PiProducer("pi")
    feed(producer, frame(reading(), {"reason": "threshold", "count": 1}), now_ms=1_000)
    started = {"type": "context", "event": "session_start", "reading": None, "compaction": None, "compactions": 1}
    assert feed(producer, started, now_ms=2_000) == []
    # An edge with no reading in the new session holds none of the old session's numbers.
    (edge,) = feed(producer, frame(None, {"reason": "manual", "count": 2}), now_ms=3_000)
    assert (edge.fields.used_tokens, edge.fields.compactions, edge.fields.observed_at_ms) == (None, 2, 3_000)


# ---- compactAtTokens (issue 18) --------------------------------------------------------------------


def test_pi_1_6_publishes_window_minus_its_configured_reserve_from_the_real_asset() -> None:
    """Recorded off the shipped asset in real pi 1.6.0 (tests/live/test_pi_live.py, compact-at):
    compaction enabled, reserveTokens 6000, window 32000; a 24,960-token turn, then a 26,400-token
    one that pi compacted on. Published: 26,000; never pi's default (32,000 - 16,384 = 15,616), never
    the window."""
    lines = _hctx_replay("pi", "pi/live/compact-at/pi-1.6.0.channel.rec")
    assert {line["compactAtTokens"] for line in lines} == {26_000}
    assert {line["autoCompaction"] for line in lines} == {True}
    before = [line for line in lines if line["compactions"] == 0]
    assert max(line["usedTokens"] or 0 for line in before) == 26_400  # the turn over 26,000 ...
    assert [line["lastCompactionTrigger"] for line in lines if line["reason"] == "compaction"] == ["threshold"]


def test_pi_0_84_states_no_settings_so_nothing_is_published() -> None:
    """pi 0.84.2 has no `pi.getSettings()`: the same configured settings (it compacted at the same
    turn) reach no frame, and the record carries null — not the 26,000 it compacted over, nor a
    default-derived 15,616."""
    lines = _hctx_replay("pi", "pi/live/compact-at/pi-0.84.2.channel.rec")
    assert lines and {(line["compactAtTokens"], line["autoCompaction"]) for line in lines} == {(None, None)}
    assert [line["lastCompactionTrigger"] for line in lines if line["reason"] == "compaction"] == ["threshold"]


@pytest.mark.parametrize(
    ("settings", "window", "published"),
    [
        ({"enabled": True, "reserveTokens": 6000}, 32000, (26000, True)),
        ({"enabled": None, "reserveTokens": None}, 200_000, (200_000 - 16_384, True)),  # pi's defaults
        ({"enabled": False, "reserveTokens": 6000}, 32000, (None, False)),  # switched off: null, and said so
        ({"enabled": True, "reserveTokens": 40000}, 32000, (None, True)),  # no point inside the window
        ({"enabled": True, "reserveTokens": 6000}, None, (None, True)),  # no window yet
        (None, 32000, (None, None)),  # the host states no settings
        ({"enabled": "yes", "reserveTokens": 6000}, 32000, (None, None)),  # malformed: unreadable, not a guess
    ],
)
def test_compact_at_is_window_minus_reserve_when_enabled(
    settings: dict[str, Any] | None, window: int | None, published: tuple[int | None, bool | None]
) -> None:
    producer = PiProducer("pi")
    (out,) = feed(producer, frame(reading(tokens=100, window=window), compactionSettings=settings), now_ms=1_000)
    assert (out.fields.compact_at_tokens, out.fields.auto_compaction) == published


def test_omp_never_publishes_a_compact_at_even_with_settings_in_the_frame() -> None:
    (out,) = feed(
        PiProducer("omp"),
        frame(reading(window=32000), compactionSettings={"enabled": True, "reserveTokens": 6000}),
        now_ms=1_000,
    )
    assert (out.fields.compact_at_tokens, out.fields.auto_compaction) == (None, None)
