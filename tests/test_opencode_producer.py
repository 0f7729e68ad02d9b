"""The OpenCode producer over the lab's verbatim captures of opencode-ai 1.18.25 and 1.18.33.

Session labels (A: three turns, a manual summarize, a fourth; B/C: prompted at once; D: auto
compaction; G: how tokens are computed) come from the capture's own `steps.jsonl`.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guard.policy import Reading, Write, WriteGuard
from guard.record import ContextFields
from sidecar.decoding import Dropped
from sidecar.harnesses.opencode.producer import (
    OPENCODE_CONTEXT_VERIFIED_VERSIONS,
    SPEC,
    OpenCodeProducer,
    sse_event,
)
from sidecar.pipeline import Pipeline
from sidecar.registry import spec_for
from tests.conformance import chunks_of, fixture_writes, recording_path, replayed
from tests.conftest import FIXTURE_ROOT
from wrapper import cli

Frame = dict[str, Any]  # an `/event` object as the test reads it; the producer sees only events

FIXTURES = FIXTURE_ROOT / "opencode"
VERSIONS = ("1.18.25", "1.18.33")
WINDOW = 128_000


@dataclass
class Capture:
    version: str
    root: Path
    providers: bytes
    events: bytes
    frames: list[tuple[int | None, Frame]]
    sessions: dict[str, str]  # label -> sessionID

    def times_of(self, predicate: Any) -> list[int]:
        return [at for at, frame in self.frames if at is not None and predicate(frame)]


def load(version: str) -> Capture:
    root = FIXTURES / f"v{version}"
    events = (root / "events.jsonl").read_bytes()
    sessions = {}
    for line in (root / "steps.jsonl").read_text().splitlines():
        step = json.loads(line)
        if step["step"] == "session-create":
            sessions[step["label"]] = step["id"]
    lab = [json.loads(line) for line in events.splitlines()]
    frames = [(round(line["t"] * 1000), json.loads(line["raw"])) for line in lab if line["stream"] == "event"]
    return Capture(version, root, (root / "config_providers.json").read_bytes(), events, frames, sessions)


def events_of(data: bytes, wire: str = "sse") -> list[object]:
    """What the spec's decoder for `wire` makes of `data` (one event's or one answer's bytes)."""
    decoder = SPEC.decoder(wire)
    events = decoder.receive_data(data) + decoder.end_of_data()
    assert not any(isinstance(event, Dropped) for event in events), events
    return events


def feed_frame(producer: OpenCodeProducer, frame: Frame, now_ms: int) -> list[Reading]:
    """One `/event` object, as the server sends it, through the decoder into the producer."""
    return [r for event in events_of(sse_event(json.dumps(frame).encode())) for r in producer.feed(event, now_ms)]


def feed_providers(producer: OpenCodeProducer, answer: bytes | Frame, now_ms: int) -> list[Reading]:
    body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    return [r for event in events_of(body, "providers") for r in producer.feed(event, now_ms)]


@pytest.fixture(params=VERSIONS, ids=lambda v: f"v{v}")
def capture(request: pytest.FixtureRequest) -> Capture:
    return load(request.param)


def info(frame: Frame) -> dict[str, Any]:
    result: dict[str, Any] = frame["properties"]["info"]
    return result


def is_message(frame: Frame) -> bool:
    return frame.get("type") == "message.updated"


def is_completion(frame: Frame) -> bool:
    return (
        frame.get("type") == "message.updated"
        and info(frame).get("role") == "assistant"
        and "total" in info(frame).get("tokens", {})
    )


def is_summary_completion(frame: Frame) -> bool:
    return is_completion(frame) and info(frame).get("summary") is True


def feed_all(capture: Capture, *, providers: bool = True) -> tuple[OpenCodeProducer, list[tuple[Frame, list[Any]]]]:
    producer = OpenCodeProducer()
    fed_frames: list[tuple[Frame, list[Any]]] = []
    if providers:
        feed_providers(producer, capture.providers, 0)
    for at, frame in capture.frames:
        assert at is not None
        fed_frames.append((frame, feed_frame(producer, frame, at)))
    return producer, fed_frames


def recording(capture: Capture, name: str = "providers+events") -> Path:
    """The capture's recording: `events` (the stream alone), `providers+events` (the providers
    answer first) or `session` (the config answer, the providers answer, the stream)."""
    return recording_path(f"opencode/v{capture.version}/{name}.rec")


def writes(capture: Capture) -> list[Write]:
    return fixture_writes("opencode", f"opencode/v{capture.version}/providers+events.rec")


def test_the_captures_are_of_the_versions_they_claim(capture: Capture) -> None:
    versions = {
        info(frame)["version"]
        for _, frame in capture.frames
        if frame.get("type") in {"session.created", "session.updated"} and "version" in info(frame)
    }
    assert versions == {capture.version}
    assert capture.version in OPENCODE_CONTEXT_VERIFIED_VERSIONS
    assert (FIXTURES / f"v{capture.version}" / "run-info.txt").read_text().startswith(f"version={capture.version}")


def test_registry_selects_this_producer_and_decoder() -> None:
    assert spec_for("opencode") is SPEC
    assert isinstance(SPEC.make_producer(), OpenCodeProducer)
    assert SPEC.wires() == ("channel", "sse", "providers", "config")
    assert SPEC.module(SPEC.transport).__name__ == "sidecar.harnesses.opencode.transport"


def test_the_turns_publish_the_assistant_total_over_the_providers_window(capture: Capture) -> None:
    """Session A, turn by turn (lab worked example): the join and the unrounded, unclamped percent."""
    session_a = capture.sessions["A"]
    published = [
        w.record
        for w in writes(capture)
        if w.reason == "bucket"
        and w.record.observed_at_ms
        in capture.times_of(lambda f: is_completion(f) and info(f)["sessionID"] == session_a)
    ]
    assert [r.used_tokens for r in published] == [11390, 21490, 31590, 21490]
    for record in published:
        assert record.used_tokens is not None
        assert record.window_tokens == WINDOW
        assert record.model == "fake/fake-model"
        assert record.used_percent == record.used_tokens * 100 / WINDOW  # not rounded to 24.68 or 25
    assert published[2].used_percent == pytest.approx(24.6796875, abs=1e-12)


def test_neither_summary_is_ever_the_reading(capture: Capture) -> None:
    """After each compaction the newest assistant message is the summarizer's: 14,543 tokens, 11.4%.

    The reading stays the last real turn's: 24.68% (A, 31,590) and 98.05% (D, 125,500).
    """
    _, fed = feed_all(capture)
    summary_totals = [info(f)["tokens"]["total"] for f, _ in fed if is_summary_completion(f)]
    assert summary_totals == [14543, 14543, 14543, 14543]  # A and D, each completion frame twice
    readings = [r for _, rs in fed for r in rs]
    assert 14543 not in {r.fields.used_tokens for r in readings}
    held_after_summary = []
    for frame, produced in fed:
        if is_summary_completion(frame):
            assert produced == []
        if frame.get("type") == "session.compacted":
            (edge,) = produced
            held_after_summary.append((edge.fields.used_tokens, edge.fields.used_percent))
    assert held_after_summary == [(31590, 31590 * 100 / WINDOW), (125500, 125500 * 100 / WINDOW)]
    assert held_after_summary[0][1] == pytest.approx(24.68, abs=0.005)
    taking_the_summary = 14543 * 100 / WINDOW
    assert taking_the_summary == pytest.approx(11.36, abs=0.005)


def test_a_user_message_summary_object_is_not_a_compaction_summary(capture: Capture) -> None:
    user_with_diffs = [
        f for _, f in capture.frames
        if is_message(f) and info(f)["role"] == "user" and isinstance(info(f).get("summary"), dict)
    ]  # fmt: skip
    assert user_with_diffs
    producer = OpenCodeProducer()
    assert all(feed_frame(producer, frame, 1) == [] for frame in user_with_diffs)


def test_cumulative_session_tokens_are_the_session_total_and_never_the_occupancy(capture: Capture) -> None:
    _, fed = feed_all(capture)
    assert all(rs == [] for f, rs in fed if f.get("type") == "session.updated")
    session_a = capture.sessions["A"]
    turn_four = [
        r.fields for f, rs in fed for r in rs
        if is_completion(f) and info(f)["sessionID"] == session_a and not r.compaction_edge
    ][-1]  # fmt: skip
    # The cumulative tokens folded in before turn 4 landed: turns 1–3 plus the summary call.
    assert turn_four.used_tokens == 21490
    assert turn_four.session_total_tokens == 79013
    assert turn_four.cost_usd == pytest.approx(0.072503)
    # Every published numerator is a message's own total, never a session sum.
    totals = {info(f)["tokens"]["total"] for f, _ in fed if is_completion(f)}
    assert {r.fields.used_tokens for _, rs in fed for r in rs} <= totals


def test_duplicated_completion_frames_land_one_write(capture: Capture) -> None:
    producer, fed = feed_all(capture)
    completions = [f for f, _ in fed if is_completion(f) and not is_summary_completion(f)]
    landed = [f for f, rs in fed if is_completion(f) and rs]
    message_ids = [info(f)["id"] for f in completions]
    assert len(completions) == 2 * len(set(message_ids))  # every completion frame comes twice
    assert len(landed) == len(set(message_ids))
    frame = completions[0]
    assert feed_frame(producer, copy.deepcopy(frame), 10**13) == []
    # Through the guard: one write per message and none for its duplicate.
    all_writes = writes(capture)
    assert len([w for w in all_writes if w.reason == "bucket"]) == len(set(message_ids))


def test_a_captured_compaction_counts_once_with_an_unknown_trigger_and_no_restamp(capture: Capture) -> None:
    all_writes = writes(capture)
    edges = [w for w in all_writes if w.reason == "compaction"]
    compacted_at = capture.times_of(lambda f: f.get("type") == "session.compacted")
    assert len(compacted_at) == 2 and len(edges) == 2
    for edge, at, count in zip(edges, compacted_at, (1, 2), strict=True):
        previous = all_writes[all_writes.index(edge) - 1].record
        assert edge.record.compactions == count
        assert edge.record.last_compaction_trigger == "unknown"
        assert edge.record.last_compaction_ms == at
        assert edge.record.observed_at_ms == previous.observed_at_ms < at  # the held reading's own time
    assert all_writes[-1].record.compactions == 2
    producer, fed = feed_all(capture)
    compacted = next(f for f, _ in fed if f.get("type") == "session.compacted")
    assert feed_frame(producer, compacted, 10**13) == []  # the same event again is not a third compaction
    assert producer.held.compactions.count == 2


def test_an_unjoined_model_withholds_the_window_and_the_percent_until_the_pull_lands(
    capture: Capture,
) -> None:
    producer, fed = feed_all(capture, providers=False)
    first = next(r.fields for _, rs in fed for r in rs)
    assert (first.used_tokens, first.window_tokens, first.used_percent) == (11390, None, None)
    assert producer.missing_windows == {("fake", "fake-model")}
    last = producer.held.reading
    assert last is not None
    (joined,) = feed_providers(producer, capture.providers, 10**13)
    assert joined.fields.window_tokens == WINDOW
    assert joined.fields.used_percent == last.used_tokens * 100 / WINDOW  # type: ignore[operator]
    assert joined.fields.observed_at_ms == last.observed_at_ms  # joined, not re-taken
    assert joined.fields.compactions == 2
    assert producer.missing_windows == frozenset()
    assert feed_providers(producer, capture.providers, 10**13 + 1) == []


def test_a_model_change_makes_the_window_pull_due_without_retagging_the_reading(capture: Capture) -> None:
    producer, fed = feed_all(capture)
    held = producer.held.reading
    assert held is not None and held.model == "fake/fake-model"
    assert producer.missing_windows == frozenset()
    creation, completion = _creation_and_completion(fed)
    for frame in (creation, completion):
        info(frame).update(providerID="fake", modelID="fake-model-xl", id="msg_other")
    assert feed_frame(producer, creation, 10**13) == []
    assert producer.missing_windows == producer.wants() == {("fake", "fake-model-xl")}
    assert producer.held.reading == held  # the held reading keeps its own model and window
    (other,) = feed_frame(producer, completion, 10**13 + 1)
    assert other.fields.model == "fake/fake-model-xl"
    assert (other.fields.window_tokens, other.fields.used_percent) == (None, None)
    providers = json.loads(capture.providers)
    fake = next(p for p in providers["providers"] if p["id"] == "fake")
    fake["models"]["fake-model-xl"] = {"limit": {"context": 200_000, "output": 32_000}}
    (joined,) = feed_providers(producer, providers, 10**13 + 2)
    assert joined.fields.window_tokens == 200_000
    assert joined.fields.observed_at_ms == 10**13 + 1


def _creation_and_completion(fed: list[tuple[Frame, list[Any]]]) -> tuple[Frame, Frame]:
    creation = next(
        f for f, _ in fed
        if is_message(f) and info(f)["role"] == "assistant" and "total" not in info(f)["tokens"]
    )  # fmt: skip
    message_id = info(creation)["id"]
    completion = next(f for f, _ in fed if is_completion(f) and info(f)["id"] == message_id)
    return copy.deepcopy(creation), copy.deepcopy(completion)


def test_two_interleaved_sessions_last_writer_wins(capture: Capture) -> None:
    """B and C were prompted at once. One record for the server: the newest landed reading wins,
    carrying its own session's facts (the spec's v1 rule, DQ-C10)."""
    _, fed = feed_all(capture)
    b, c = capture.sessions["B"], capture.sessions["C"]
    landed: list[tuple[str, ContextFields]] = [
        (info(f)["sessionID"], rs[0].fields)
        for f, rs in fed
        if is_completion(f) and rs and info(f)["sessionID"] in (b, c)
    ]  # fmt: skip
    assert {session: fields.used_tokens for session, fields in landed} == {b: 31222, c: 61333}
    # Their frames really interleave on the stream.
    order = [
        info(f)["sessionID"] for f, _ in fed if f.get("type") == "message.updated" and info(f)["sessionID"] in (b, c)
    ]
    switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
    assert switches >= 3
    after_both = [w.record for w in writes(capture) if w.record.used_tokens in (31222, 61333)]
    assert [r.used_tokens for r in after_both] == [fields.used_tokens for _, fields in landed]
    assert after_both[-1].used_tokens == landed[-1][1].used_tokens


def test_how_opencode_counts_tokens(capture: Capture) -> None:
    """G: a lying total_tokens (99,999) is not what OpenCode stores; no usage is no reading;
    a tool-call turn is two messages and the last step is the context."""
    _, fed = feed_all(capture)
    g = capture.sessions["G"]
    landed = [rs[0].fields.used_tokens for f, rs in fed if is_completion(f) and rs and info(f)["sessionID"] == g]
    assert landed == [10100, 20300, 30100, 50100, 55150]
    assert 99999 not in landed
    no_usage = [
        f for f, _ in fed
        if is_message(f) and info(f)["sessionID"] == g and info(f).get("finish") == "stop"
        and "total" not in info(f)["tokens"]
    ]  # fmt: skip
    assert no_usage and all(rs == [] for f, rs in fed if f in no_usage)


def test_hctx_replay_prints_every_write_with_its_reason(
    capture: Capture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["replay", "--harness", "opencode", str(recording(capture))]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["reason"] for line in lines].count("compaction") == 2
    assert all(line["harness"] == "opencode" and line["windowTokens"] == WINDOW for line in lines)
    assert [line["usedTokens"] for line in lines][:5] == [11390, 21490, 31590, 31590, 21490]
    assert lines[3]["usedPercent"] == 24.6796875 and lines[3]["compactions"] == 1
    assert len(lines) == len(writes(capture))


def test_other_recording_shapes_decode_to_the_same_frames(capture: Capture, tmp_path: Path) -> None:
    """scripts/convert_fixtures.py's reader: SSE text (what `/event` sends) and plain JSONL of events
    convert like the lab's capture."""
    from scripts.capture_readers.opencode import read_recording

    events = [f for _, f in capture.frames]
    (sse := tmp_path / "events.sse").write_text("".join(f"data: {json.dumps(f)}\n\n" for f in events))
    (jsonl := tmp_path / "events.plain.jsonl").write_text("".join(json.dumps(f) + "\n" for f in events))
    lab = events_of(b"".join(chunk.data for chunk in chunks_of(recording(capture, "events"))))
    for path in (sse, jsonl):
        chunks = list(read_recording([path]))
        assert {chunk.wire for chunk in chunks} == {"sse"}
        assert all(chunk.at_ms is None for chunk in chunks)
        assert events_of(b"".join(chunk.data for chunk in chunks)) == lab
    expected = [(w.reason, w.record.used_tokens) for w in writes(capture)]
    providers = capture.root / "config_providers.json"
    assert [(w.reason, w.record.used_tokens) for w in replayed(SPEC, read_recording([providers, sse]))] == expected


def test_each_recording_file_goes_on_the_wire_it_was(capture: Capture) -> None:
    """An answer file is that answer's body, byte for byte; a lab line's `raw` is the SSE event (the
    session's recording, as scripts/convert_fixtures.py made it)."""
    config, providers, *events = chunks_of(recording(capture, "session"))
    assert (config.wire, config.data) == ("config", (capture.root / "config.json").read_bytes())
    assert (providers.wire, providers.data) == ("providers", capture.providers)
    lab = [json.loads(line) for line in capture.events.splitlines()]
    expected = [
        (round(line["t"] * 1000), "sse", b"data: " + line["raw"].encode() + b"\n\n")
        for line in lab
        if line["stream"] == "event"
    ]
    assert [(event.at_ms, event.wire, event.data) for event in events] == expected


def test_only_the_instance_stream_is_replayed(capture: Capture) -> None:
    streams = {json.loads(line)["stream"] for line in capture.events.splitlines()}
    assert {"event", "global"} <= streams
    assert len(capture.frames) == sum(
        1 for line in capture.events.splitlines() if json.loads(line)["stream"] == "event"
    )


def test_a_quiet_stream_writes_nothing_however_long(capture: Capture) -> None:
    """No heartbeat for this harness: server.heartbeat frames for an hour re-stamp nothing."""
    pipeline = Pipeline(OpenCodeProducer(), WriteGuard("a", "i"))
    (answer,) = events_of(capture.providers, "providers")
    pipeline.feed(answer, 0)
    completion = next(f for _, f in capture.frames if is_completion(f))
    (event,) = events_of(sse_event(json.dumps(completion).encode()))
    assert len(pipeline.feed(event, 1_000)) == 1
    heartbeat = next(f for _, f in capture.frames if f.get("type") == "server.heartbeat")
    (beat,) = events_of(sse_event(json.dumps(heartbeat).encode()))
    for second in range(10, 3600, 10):
        assert pipeline.feed(beat, second * 1000) == []
    assert pipeline.dropped == 0


# --- compactAtTokens (issue 18) --------------------------------------------------------------------


def test_the_published_point_is_context_minus_output_where_the_lab_run_compacted(
    capture: Capture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lab's config (no `compaction` block) and providers (128,000 / 8,192, no `limit.input`):
    119,808 on every write; run D's 125,500-token turn (>= 119,808) is followed by its compaction.
    Never the bare window (128,000) nor a 20,000 reserve (108,000)."""
    assert cli.main(["replay", "--harness", "opencode", str(recording(capture, "session"))]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["compactAtTokens"] for line in lines} == {119_808}
    assert {line["autoCompaction"] for line in lines} == {True}
    over = next(i for i, line in enumerate(lines) if line["usedTokens"] == 125_500)
    assert lines[over + 1]["reason"] == "compaction"
    assert all(line["usedTokens"] < 119_808 for line in lines[:over])  # nothing under it compacted on its own
    without_config = [json.loads(line) for line in _replay([recording(capture)], capsys)]
    assert {line["compactAtTokens"] for line in without_config} == {None}  # not read, not guessed


def _replay(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert cli.main(["replay", "--harness", "opencode", *map(str, paths)]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("limit", "compaction", "output_max", "published"),
    [
        ({"context": 128_000, "output": 8192}, {}, 32_000, (119_808, True)),
        ({"context": 128_000, "output": 8192}, {"reserved": 30_000}, 32_000, (119_808, True)),  # no input: ignored
        ({"context": 400_000, "input": 272_000, "output": 128_000}, {}, 32_000, (252_000, True)),  # min(20k, 32k)
        ({"context": 400_000, "input": 272_000, "output": 128_000}, {"reserved": 50_000}, 32_000, (222_000, True)),
        ({"context": 200_000, "output": 0}, {}, 32_000, (168_000, True)),  # output 0: the 32,000 cap
        ({"context": 200_000, "output": 64_000}, {}, 16_000, (184_000, True)),  # the environment's cap
        ({"context": 128_000, "output": 8192}, {"auto": False}, 32_000, (None, False)),  # switched off
        ({"context": 0, "output": 8192}, {}, 32_000, (None, True)),  # unknown window: no auto-compaction
        ({"context": 128_000, "output": 8192}, None, 32_000, (None, None)),  # config unreadable
        ({"context": 128_000, "output": 8192}, {}, None, (None, True)),  # an output cap it cannot read
    ],
)
def test_opencode_compact_at_follows_its_own_overflow_rule(
    limit: dict[str, int], compaction: dict[str, Any] | None, output_max: int | None,
    published: tuple[int | None, bool | None],
) -> None:  # fmt: skip
    from sidecar.harnesses.opencode.producer import CompactionSettings, ModelLimits, opencode_compact_at

    rule = None if compaction is None else CompactionSettings.model_validate(compaction)
    assert opencode_compact_at(ModelLimits.model_validate(limit), rule, output_max) == published
