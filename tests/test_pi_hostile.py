"""Malformed, truncated, hostile and huge input to the pi/omp decoder, producer and recordings.

Every frame goes in as the channel carries it (bytes), through the spec's channel decoder. The only
acceptable answers are a drop (FrameRejected here) or readings carrying exactly what the frame said;
never another exception, never a number the frame did not carry.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import FrameRejected
from scripts.capture_readers.pi import recorded_chunks as probe_chunks
from sidecar.harnesses.pi.producer import MAX_MODEL_ID_CHARS, PiProducer
from tests.fakes.pi_channel import channel_lines, fed, feed, frames_of, recorded_frames

GOOD_READING = {"tokens": 10, "contextWindow": 100, "percent": 10.0, "model": "m", "costUsd": 0.1}

json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_value = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
field_value = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10), st.lists(st.integers(), max_size=2),
    st.just({}),
)  # fmt: skip
reading_strategy = (
    st.none()
    | json_value
    | st.fixed_dictionaries({key: field_value for key in GOOD_READING}, optional={"extra": json_value})
)
compaction_strategy = st.none() | json_value | st.fixed_dictionaries({"reason": field_value, "count": field_value})
frame_strategy = st.one_of(
    json_value,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["context", "Context", "", "status"]) | field_value,
         "reading": reading_strategy, "compaction": compaction_strategy},
        optional={"compactions": field_value, "event": json_value},
    ),
)  # fmt: skip


def _feed(producer: PiProducer, frame: Any, now_ms: int = 1_000) -> list[Any] | None:
    try:
        return feed(producer, frame, now_ms)
    except FrameRejected:
        return None


@given(thing=json_value)
def test_the_producer_refuses_what_is_not_its_event(thing: Any) -> None:
    with pytest.raises(FrameRejected):
        PiProducer("pi").feed(thing, 1_000)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(frame=frame_strategy, harness=st.sampled_from(["pi", "omp"]))
def test_any_frame_is_rejected_or_published_as_given(frame: Any, harness: Any) -> None:
    out = _feed(PiProducer(harness), frame)
    if out is None:
        return
    assert isinstance(frame, dict) and frame.get("type") == "context"
    for reading in out:
        fields = reading.fields
        given_reading = frame.get("reading")
        if isinstance(given_reading, dict):
            assert fields.used_tokens == given_reading["tokens"]
            assert fields.window_tokens == given_reading["contextWindow"]
            assert fields.used_percent == given_reading["percent"]
            assert fields.cost_usd == given_reading["costUsd"]
            assert fields.model == given_reading["model"]
        else:  # an edge with nothing held: no number at all
            assert (fields.used_tokens, fields.window_tokens, fields.used_percent) == (None, None, None)
        for number in (fields.used_percent, fields.cost_usd):
            assert number is None or math.isfinite(number)


@settings(max_examples=300)
@given(
    data=st.binary(max_size=2000)
    | st.lists(st.text(max_size=200), max_size=10).map(lambda lines: "\n".join(lines).encode())
)
def test_any_recording_decodes_to_drops_or_frames(data: bytes) -> None:
    producer = PiProducer("pi")
    for chunk in channel_lines(data):
        assert chunk.at_ms is None or (isinstance(chunk.at_ms, int) and chunk.at_ms >= 0)
        try:  # noqa: SIM105 - the point is that nothing but a drop comes of it
            fed(producer, chunk.data)
        except FrameRejected:
            pass


@settings(max_examples=200)
@given(line=st.dictionaries(st.sampled_from(["event", "t", "payload", "contextUsage", "model", "entries"]), json_value))
def test_any_probe_line_translates_without_raising(line: dict[str, Any]) -> None:
    """scripts/convert_fixtures.py's translation of the lab's probe lines, then the producer."""
    line.setdefault("event", "session_compact")
    producer = PiProducer("omp")
    for _, frame in frames_of(list(probe_chunks(json.dumps(line).encode()))):
        _feed(producer, frame)


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens": True},
        {"tokens": -1},
        {"tokens": 1.5},
        {"tokens": "100"},
        {"contextWindow": [4000]},
        {"percent": "50"},
        {"percent": 10**400},
        {"costUsd": False},
        {"model": 7},
        {"model": "x" * (MAX_MODEL_ID_CHARS + 1)},
    ],
)
def test_mistyped_reading_fields_reject_the_frame(bad: dict[str, Any]) -> None:
    with pytest.raises(FrameRejected):
        feed(PiProducer("pi"), {"type": "context", "reading": {**GOOD_READING, **bad}, "compaction": None}, 1)


@pytest.mark.parametrize(
    "frame",
    [
        [],
        "context",
        None,
        {},
        {"type": "status", "reading": GOOD_READING, "compaction": None},
        {"type": "context"},
        {"type": "context", "compaction": None},  # reading key missing: a flattened envelope
        {"type": "context", **GOOD_READING, "compaction": None},
        {"type": "context", "reading": {k: v for k, v in GOOD_READING.items() if k != "costUsd"}, "compaction": None},
        {"type": "context", "reading": GOOD_READING, "compaction": {"reason": "manual"}},
        {"type": "context", "reading": GOOD_READING, "compaction": {"reason": 3, "count": 1}},
        {"type": "context", "reading": GOOD_READING, "compaction": {"reason": None, "count": -2}},
        {"type": "context", "reading": GOOD_READING, "compaction": None, "compactions": "5"},
        {"type": "context", "reading": GOOD_READING, "compaction": "manual"},
    ],
)
def test_malformed_envelopes_are_rejected(frame: Any) -> None:
    with pytest.raises(FrameRejected):
        feed(PiProducer("omp"), frame, 1)


def test_huge_and_deep_input_is_rejected_not_raised() -> None:
    deep: Any = GOOD_READING
    for _ in range(400):
        deep = {"reading": deep}
    with pytest.raises(FrameRejected, match="malformed context frame"):
        feed(PiProducer("pi"), {"type": "context", "reading": deep, "compaction": None}, 1)
    deeper = b'{"type":"context","compaction":null,"reading":' + b'{"reading":' * 5000 + b"{}" + b"}" * 5001 + b"\n"
    with pytest.raises(FrameRejected, match="nested too deep"):
        fed(PiProducer("pi"), deeper, 1)
    huge = {"type": "context", "reading": {**GOOD_READING, "model": "m" * 10_000_000}, "compaction": None}
    with pytest.raises(FrameRejected, match="over"):
        feed(PiProducer("pi"), huge, 1)
    # a long recording of junk costs nothing but time, and a drop per line
    junk = b"\x00{[" * 100_000 + b"\n" + b"[" * 100_000
    assert recorded_frames(junk) == []
    drops = []
    for chunk in channel_lines(junk):
        with pytest.raises(FrameRejected):
            fed(PiProducer("pi"), chunk.data)
        drops.append(chunk)
    assert len(drops) == 2


@pytest.mark.parametrize("reading", [GOOD_READING, None])
def test_a_negative_clock_is_refused_before_any_state_changes(reading: dict[str, Any] | None) -> None:
    producer = PiProducer("pi")
    with pytest.raises(FrameRejected):
        feed(producer, {"type": "context", "reading": reading, "compaction": {"reason": "manual", "count": None}}, -5)
    ledger = producer.held.compactions
    assert (ledger.count, ledger.last_ms, producer.held.reading) == (0, None, None)
