"""Malformed, truncated, hostile and huge input to the Claude decoder, producer and recordings.

Every frame goes in as the channel carries it (bytes), through the spec's channel decoder. The
answer is a logged drop or no reading, never another exception, and never a number the payload did
not carry.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.constants import CHANNEL_MAX_FRAME_BYTES
from guard.errors import FrameRejected
from guard.policy import Reading
from sidecar.decoding import CHANNEL, Dropped
from sidecar.harnesses.claude.producer import SPEC, ClaudeProducer
from sidecar.recorder import Chunk
from tests.conformance import chunks_of
from tests.conftest import FIXTURE_ROOT, channel_readings
from tests.hostile import json_values, numbers_in

FIXTURES = FIXTURE_ROOT / "claude"
CAPTURED = [
    json.loads(line)
    for name in ("statusline-2.1.250-sonnet45-oauth.jsonl", "statusline-2.1.332.jsonl")
    for line in (FIXTURES / name).read_bytes().splitlines()
]
HOOKS = [
    json.loads(line)
    for name in ("precompact-2.1.250.jsonl", "postcompact-2.1.332.jsonl", "sessionstart-2.1.250.jsonl")
    for line in (FIXTURES / name).read_bytes().splitlines()
]
NOW = 1_795_990_000_000


def fed(producer: ClaudeProducer, data: bytes, now: int = NOW) -> list[Reading]:
    return channel_readings(SPEC, producer, data, now)


def feed(producer: ClaudeProducer, frame: Any, now: int = NOW) -> list[Reading]:
    """`frame` as the channel carries it: one JSON line (NaN and Infinity written as Python does)."""
    return fed(producer, json.dumps(frame).encode() + b"\n", now)


def assert_only_carried_numbers(producer: ClaudeProducer, frame: dict[str, Any], *earlier: Any) -> None:
    """Every number a reading holds came from this frame, or from an earlier one a compaction edge holds."""
    try:
        readings = feed(producer, frame)
    except FrameRejected:
        return
    assert_carried(readings, numbers_in(frame) | numbers_in(list(earlier)))


def assert_carried(readings: list[Reading], carried: set[float]) -> None:
    for reading in readings:
        fields = reading.fields
        for value in (fields.used_tokens, fields.window_tokens, fields.used_percent, fields.cost_usd):
            assert value is None or value in carried
            assert value is None or math.isfinite(value)
        if fields.rate_limits is not None:
            for value in (fields.rate_limits.five_hour, fields.rate_limits.seven_day):
                assert value is None or (value in carried and math.isfinite(value))
        assert fields.session_total_tokens is None


@given(frame=json_values)
def test_arbitrary_frames(frame: Any) -> None:
    producer = ClaudeProducer()
    try:  # noqa: SIM105 - the point is that nothing but FrameRejected escapes
        feed(producer, frame)
    except FrameRejected:
        pass


@given(data=st.binary(max_size=400))
def test_arbitrary_channel_bytes(data: bytes) -> None:
    producer = ClaudeProducer()
    try:  # noqa: SIM105 - the point is that nothing but a drop comes of it
        fed(producer, data)
    except FrameRejected:
        pass


@given(thing=json_values)
def test_the_producer_refuses_what_is_not_its_event(thing: Any) -> None:
    with pytest.raises(FrameRejected):
        ClaudeProducer().feed(thing, NOW)


@given(payload=json_values, kind=st.sampled_from(["claude.statusline", "claude.subagentstatusline", "claude.hook"]))
def test_arbitrary_payloads(payload: Any, kind: str) -> None:
    assert_only_carried_numbers(ClaudeProducer(), {"type": kind, "payload": payload})


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    return found


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(data=st.data())
def test_captured_payloads_with_one_field_replaced(data: st.DataObject) -> None:
    captured = data.draw(st.sampled_from(CAPTURED + HOOKS))
    payload = copy.deepcopy(captured)
    path = data.draw(st.sampled_from(_paths(payload)))
    target = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(json_values)
    kind = "claude.hook" if "hook_event_name" in captured else "claude.statusline"
    producer = ClaudeProducer()
    feed(producer, {"type": "claude.statusline", "payload": CAPTURED[3]}, NOW - 1)
    assert_only_carried_numbers(producer, {"type": kind, "payload": payload}, CAPTURED[3])


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("context_window", "total_input_tokens"), True),
        (("context_window", "total_input_tokens"), -5),
        (("context_window", "total_input_tokens"), "61000"),
        (("context_window", "total_input_tokens"), 61000.5),
        (("context_window", "used_percentage"), float("nan")),
        (("context_window", "used_percentage"), float("inf")),
        (("context_window", "used_percentage"), -1),
        (("context_window", "used_percentage"), "31"),
        (("context_window", "current_usage"), "not an object"),
        (("context_window",), None),
        (("context_window",), []),
    ],
)
def test_a_malformed_core_field_rejects_the_frame(path: tuple[str, ...], value: Any) -> None:
    payload = copy.deepcopy(CAPTURED[3])
    target = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(FrameRejected):
        feed(ClaudeProducer(), {"type": "claude.statusline", "payload": payload})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model", {"id": "x" * 100_000}),
        ("model", {"id": 7}),
        ("cost", {"total_cost_usd": "0.1"}),
        ("cost", {"total_cost_usd": -1}),
        ("rate_limits", {"five_hour": {"used_percentage": 1e300}, "seven_day": "x"}),
        ("rate_limits", {"five_hour": {"used_percentage": True}}),
        ("rate_limits", [1, 2]),
    ],
)
def test_a_malformed_adjacent_fact_is_withheld_not_guessed(key: str, value: Any) -> None:
    payload = {**copy.deepcopy(CAPTURED[3]), key: value}
    (reading,) = feed(ClaudeProducer(), {"type": "claude.statusline", "payload": payload})
    fields = reading.fields
    assert getattr(fields, {"model": "model", "cost": "cost_usd", "rate_limits": "rate_limits"}[key]) is None
    assert fields.used_tokens == CAPTURED[3]["context_window"]["total_input_tokens"]  # the rest still reads


@pytest.mark.parametrize(
    ("key", "value"),
    [("cost", {"total_cost_usd": float("nan")}), ("rate_limits", {"five_hour": {"used_percentage": float("inf")}})],
)
def test_nan_or_infinity_anywhere_drops_the_whole_frame(key: str, value: Any) -> None:
    """Not JSON numbers (guard.json_rule): the tee never sends them, and a frame carrying one is no frame."""
    with pytest.raises(FrameRejected, match="not a JSON number"):
        feed(ClaudeProducer(), {"type": "claude.statusline", "payload": {**CAPTURED[3], key: value}})


def test_huge_and_deep_payloads() -> None:
    producer = ClaudeProducer()
    deep: Any = {}
    for _ in range(400):
        deep = {"x": deep}
    huge = {**CAPTURED[3], "padding": "p" * (CHANNEL_MAX_FRAME_BYTES - 50_000), "deep": deep}
    huge["context_window"] = {**huge["context_window"], "current_usage": {"nested": deep}}
    (reading,) = feed(producer, {"type": "claude.statusline", "payload": huge})
    assert reading.fields.used_tokens == CAPTURED[3]["context_window"]["total_input_tokens"]
    # Over the channel's frame limit, or nested past what JSON is parsed to: a drop, never a crash.
    with pytest.raises(FrameRejected, match="over"):
        feed(producer, {"type": "claude.statusline", "payload": {**huge, "padding": "p" * 5_000_000}})
    deeper = b'{"type":"claude.statusline","payload":' + b'{"x":' * 5000 + b"{}" + b"}" * 5001 + b"\n"
    with pytest.raises(FrameRejected, match="nested too deep"):
        fed(producer, deeper)
    big = copy.deepcopy(CAPTURED[3])
    big["context_window"]["total_input_tokens"] = 10**40
    with pytest.raises(FrameRejected, match="less than or equal to"):  # no JSON reader keeps it exact
        feed(producer, {"type": "claude.statusline", "payload": big})
    with pytest.raises(FrameRejected):
        feed(producer, {"type": "claude.hook", "payload": {"hook_event_name": ["PreCompact"]}})


def test_hostile_hook_fields() -> None:
    producer = ClaudeProducer()
    feed(producer, {"type": "claude.statusline", "payload": CAPTURED[3]})
    for payload in (
        {"hook_event_name": "PreCompact", "prompt_id": {"a": 1}},
        {"hook_event_name": "PreCompact", "trigger": 5},
        {"hook_event_name": 3},
        {"prompt_id": "x"},
    ):
        with pytest.raises(FrameRejected):
            feed(producer, {"type": "claude.hook", "payload": payload})
    (reading,) = feed(producer, {"type": "claude.hook", "payload": {"hook_event_name": "PreCompact", "trigger": "x"}})
    assert reading.fields.last_compaction_trigger == "unknown"  # a word Claude might add later


def test_many_compactions_stay_bounded() -> None:
    producer = ClaudeProducer()
    feed(producer, {"type": "claude.statusline", "payload": CAPTURED[3]})
    for index in range(1000):
        feed(producer, {"type": "claude.hook", "payload": {"hook_event_name": "PreCompact", "prompt_id": str(index)}})
    (reading,) = feed(producer, {"type": "claude.statusline", "payload": CAPTURED[3]}, NOW + 1)
    assert reading.fields.compactions == 1000


def replayed_readings(chunks: list[Chunk]) -> tuple[list[Reading], list[Dropped]]:
    """A recording's chunks through one channel decoder, as its stream in `hctx replay`."""
    producer, decoder = ClaudeProducer(), SPEC.decoder(CHANNEL)
    readings: list[Reading] = []
    drops: list[Dropped] = []
    for chunk in chunks:
        assert chunk.at_ms is None or chunk.at_ms >= 0
        for event in decoder.receive_data(chunk.data):
            if isinstance(event, Dropped):
                drops.append(event)
                continue
            with contextlib.suppress(FrameRejected):
                readings += producer.feed(event, NOW)
    drops += [event for event in decoder.end_of_data() if isinstance(event, Dropped)]
    return readings, drops


RECORDED = b"".join(chunk.data for chunk in chunks_of("claude/statusline-2.1.332-sonnet45-oauth.rec"))


@given(cut=st.integers(min_value=0, max_value=len(RECORDED)), noise=st.binary(max_size=200))
def test_truncated_and_corrupted_recordings(cut: int, noise: bytes) -> None:
    data = RECORDED[:cut] + noise
    carried: set[float] = set()
    for line in data.splitlines():
        try:
            carried |= numbers_in(json.loads(line))
        except ValueError:
            continue
    readings, _ = replayed_readings([Chunk(None, CHANNEL, data)])
    assert_carried(readings, carried)


def test_the_converter_of_captures_with_hostile_files(tmp_path: Path) -> None:
    """scripts/convert_fixtures.py's reader of Claude's captures, on a damaged capture and `.times`."""
    from scripts.capture_readers.claude import read_recording

    capture = tmp_path / "statusline-x.jsonl"
    capture.write_bytes((FIXTURES / "statusline-2.1.250.jsonl").read_bytes() + b'{"trunc\n[1]\n\xff\n')
    (tmp_path / "statusline-x.times").write_text("garbage\n2026-11-29T22:39:54.699Z\n")
    hooks = tmp_path / "hooks.jsonl"
    hooks.write_bytes(
        b'{"hook_event_name":"PreCompact","prompt_id":[1]}\n{"hook_event_name":"PostCompact","prompt_id":"zz"}\n'
    )
    chunks = list(read_recording([capture, hooks]))
    assert len(chunks) == 11  # the tee sends neither the cut line, nor the array, nor the bad bytes
    assert json.loads(chunks[-1].data)["payload"]["prompt_id"] == "zz"  # never anchored: it goes last
    readings, drops = replayed_readings(chunks)
    assert readings and [drop.reason[:21] for drop in drops] == ["unreadable hook paylo"]  # prompt_id [1]
