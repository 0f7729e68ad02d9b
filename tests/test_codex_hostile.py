"""Malformed, truncated, hostile and huge input: FrameRejected or no reading, never another exception,
never a number the input did not carry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.policy import Reading
from guard.record import MAX_COUNT
from sidecar.producers.base import FrameRejected
from sidecar.producers.codex import CodexProducer, decode_recording
from tests.hostile import json_values, numbers, numbers_in

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "codex"
METHODS = [
    "thread/tokenUsage/updated",
    "account/rateLimits/updated",
    "item/started",
    "item/completed",
    "thread/compacted",
]


def feed(producer: CodexProducer, frame: Any) -> list[Reading]:
    try:
        return producer.feed(frame, 1_000)
    except FrameRejected:
        return []


def assert_nothing_fabricated(reading: Reading, message: Any) -> None:
    carried = numbers_in(message)
    fields = reading.fields
    for value in (fields.used_tokens, fields.window_tokens, fields.session_total_tokens):
        assert value is None or value in carried


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(frame=json_values)
def test_any_json_as_a_frame(frame: Any) -> None:
    feed(CodexProducer(), frame)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(payload=json_values | st.text(max_size=200))
def test_any_payload(payload: Any) -> None:
    producer = CodexProducer()
    for reading in feed(producer, {"type": "codex.rpc", "payload": payload}):
        assert_nothing_fabricated(reading, payload)


@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(METHODS), params=json_values, as_text=st.booleans())
def test_any_params_for_the_methods_that_matter(method: str, params: Any, as_text: bool) -> None:
    message = {"method": method, "params": params}
    payload: Any = json.dumps(message) if as_text else message
    for reading in feed(CodexProducer(), {"type": "codex.rpc", "payload": payload}):
        assert_nothing_fabricated(reading, message)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(last=numbers, total=numbers, window=numbers, used=numbers, minutes=numbers)
def test_hostile_numbers_in_well_formed_messages(last: Any, total: Any, window: Any, used: Any, minutes: Any) -> None:
    producer = CodexProducer()
    feed(producer, frame_of({"method": "account/rateLimits/updated", "params": {"rateLimits": {
        "primary": {"usedPercent": used, "windowDurationMins": minutes}}}}))  # fmt: skip
    message = {
        "method": "thread/tokenUsage/updated",
        "params": {"threadId": "t", "turnId": "u", "tokenUsage": {
            "last": {"totalTokens": last}, "total": {"totalTokens": total}, "modelContextWindow": window}},
    }  # fmt: skip
    readings = feed(producer, frame_of(message))
    if not (valid_int(last) and valid_int(total) and (window is None or valid_int(window))):
        assert readings == []
        return
    [reading] = readings
    assert (reading.fields.used_tokens, reading.fields.session_total_tokens) == (last, total)
    percent = reading.fields.used_percent
    assert percent is None or 0 <= percent <= 100
    limits = reading.fields.rate_limits
    if limits is not None:
        assert limits.five_hour in (used, None) and limits.seven_day in (used, None)
        assert minutes in (300, 10_080)


@pytest.mark.parametrize("name", ["codex-0.151.0-stdio-main.jsonl", "codex-0.171.0-stdio-main.jsonl"])
def test_every_truncation_of_every_captured_line_is_refused(name: str) -> None:
    lines = (FIXTURES / name).read_text().splitlines()
    token_lines = [line for line in lines if "tokenUsage" in line or "contextCompaction" in line]
    for line in token_lines[:6]:
        for cut in range(len(line)):
            producer = CodexProducer()
            with pytest.raises(FrameRejected):
                producer.feed(frame_of(line[:cut]), 1)
            assert producer.compactions == 0 and producer.last_reading is None


@pytest.mark.parametrize(
    "payload",
    [
        "[" * 200_000,  # deep nesting
        '{"method": "thread/tokenUsage/updated", "params": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "9" * 100_000,  # an integer beyond Python's digit limit
        '{"method": "thread/tokenUsage/updated", "params": NaN}',
        "\udcff",
        "",
        "null",
        "[]",
    ],
)
def test_hostile_payload_text_is_refused(payload: str) -> None:
    with pytest.raises(FrameRejected):
        CodexProducer().feed(frame_of(payload), 1)


def test_a_huge_frame_is_refused_or_read_without_fabrication() -> None:
    noise = "x" * (8 * 1024 * 1024)
    message = {"method": "warning", "params": {"message": noise}}
    assert CodexProducer().feed(frame_of(json.dumps(message)), 1) == []
    bloated = {
        "method": "thread/tokenUsage/updated",
        "params": {"threadId": "t" * 1_000_000, "turnId": "u", "junk": list(range(50_000)), "tokenUsage": {
            "last": {"totalTokens": 5}, "total": {"totalTokens": 6}, "modelContextWindow": None}},
    }  # fmt: skip
    [reading] = CodexProducer().feed(frame_of(json.dumps(bloated)), 1)
    assert (reading.fields.used_tokens, reading.fields.used_percent) == (5, None)


@pytest.mark.parametrize(
    "bad",
    [
        {"totalTokens": "90800"},
        {"totalTokens": 90800.0},
        {"totalTokens": True},
        {"totalTokens": -1},
        {"totalTokens": 2**63},
        {},
        None,
    ],
)
def test_a_mistyped_numerator_is_refused_not_coerced(bad: Any) -> None:
    message = {
        "method": "thread/tokenUsage/updated",
        "params": {"threadId": "t", "tokenUsage": {
            "last": bad, "total": {"totalTokens": 1}, "modelContextWindow": 190_000}},
    }  # fmt: skip
    with pytest.raises(FrameRejected):
        CodexProducer().feed(frame_of(message), 1)


def test_compaction_item_without_id_is_refused() -> None:
    message = {"method": "item/started", "params": {"item": {"type": "contextCompaction"}, "turnId": "t"}}
    with pytest.raises(FrameRejected):
        CodexProducer().feed(frame_of(message), 1)


def test_a_hostile_flood_of_item_ids_is_bounded_and_still_counts_each_once() -> None:
    producer = CodexProducer()
    for n in range(5_000):
        producer.feed(
            frame_of({"method": "item/started", "params": {"item": {"type": "contextCompaction", "id": str(n)}}}),
            n,
        )
    assert producer.compactions == 5_000
    assert len(producer._counted_items) <= 1024


@settings(max_examples=300)
@given(data=st.binary(max_size=2000))
def test_any_bytes_as_a_recording(data: bytes) -> None:
    producer = CodexProducer()
    for at_ms, frame in decode_recording(data):
        assert frame["type"] == "codex.rpc"
        assert at_ms is None or at_ms >= 0
        feed(producer, frame)


def valid_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def frame_of(payload: Any) -> dict[str, Any]:
    return {"type": "codex.rpc", "payload": payload}
