"""Malformed, truncated, hostile and huge OpenCode input: FrameRejected or no reading, never another
exception, never a number the input did not carry."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.policy import Reading
from sidecar.producers.base import FrameRejected
from sidecar.producers.opencode import (
    MAX_EVENT_CHARS,
    WINDOWS_REMEMBERED,
    OpenCodeProducer,
    decode_recording,
    model_named_by,
    providers_frame,
    sse_payloads,
    windows_from_providers,
)
from tests.hostile import json_values, numbers, numbers_in

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "opencode" / "v1.18.25"
TYPES = ["message.updated", "session.updated", "session.compacted", "hctx.providers", "server.heartbeat"]


def feed(producer: OpenCodeProducer, frame: Any) -> list[Reading]:
    try:
        return producer.feed(frame, 1_000)
    except FrameRejected:
        return []


CAPTURED = [frame for _, frame in decode_recording((FIXTURES / "events.jsonl").read_bytes())]
PROVIDERS = json.loads((FIXTURES / "config_providers.json").read_bytes())


def completion() -> dict[str, Any]:
    return copy.deepcopy(
        next(
            f
            for f in CAPTURED
            if f["type"] == "message.updated" and "total" in f["properties"]["info"].get("tokens", {})
        )
    )


def primed() -> OpenCodeProducer:
    producer = OpenCodeProducer()
    producer.feed(providers_frame(PROVIDERS), 0)
    return producer


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(frame=json_values)
def test_any_json_value_is_refused_or_ignored(frame: Any) -> None:
    assert feed(primed(), frame) == []


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(TYPES), properties=json_values, payload=json_values)
def test_any_properties_under_a_known_type_never_raise_anything_else(kind: str, properties: Any, payload: Any) -> None:
    producer = primed()
    for reading in feed(producer, {"type": kind, "id": "evt_1", "properties": properties, "payload": payload}):
        # Only a compaction edge may come out of garbage, and it carries no number.
        assert reading.compaction_edge and reading.fields.used_tokens is None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(total=numbers, provider=json_values, model=json_values, summary=json_values, role=json_values)
def test_a_hostile_completion_publishes_only_a_number_it_carried(
    total: Any, provider: Any, model: Any, summary: Any, role: Any
) -> None:
    frame = completion()
    info = frame["properties"]["info"]
    info["tokens"]["total"] = total
    info.update(providerID=provider, modelID=model, summary=summary, role=role)
    for reading in feed(primed(), frame):
        fields = reading.fields
        assert fields.used_tokens == total and type(total) is int and total > 0
        assert role == "assistant" and summary is not True
        assert fields.window_tokens in (None, 128_000)
        if fields.window_tokens is not None:
            assert fields.used_percent == total * 100 / 128_000


@pytest.mark.parametrize("total", ["11390", 11390.0, True, -1, 2**64, None, float("nan"), [11390], {"n": 11390}])
def test_a_total_of_the_wrong_kind_is_never_a_reading(total: Any) -> None:
    frame = completion()
    frame["properties"]["info"]["tokens"]["total"] = total
    assert feed(primed(), frame) == []


def test_a_missing_total_is_never_zero_and_a_zero_total_is_no_reading() -> None:
    frame = completion()
    del frame["properties"]["info"]["tokens"]["total"]
    assert feed(primed(), frame) == []
    frame["properties"]["info"]["tokens"]["total"] = 0
    assert feed(primed(), frame) == []
    del frame["properties"]["info"]["tokens"]
    assert feed(primed(), frame) == []


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(cost=numbers | st.just(2**53 + 1), input_tokens=numbers, cache_read=numbers)
def test_hostile_session_facts_are_refused_or_carried_verbatim(cost: Any, input_tokens: Any, cache_read: Any) -> None:
    producer = primed()
    session = {
        "type": "session.updated",
        "properties": {
            "sessionID": "ses_x",
            "info": {
                "id": "ses_x",
                "cost": cost,
                "tokens": {"input": input_tokens, "output": 5, "cache": {"read": cache_read}},
            },
        },
    }
    assert feed(producer, session) == []
    frame = completion()
    frame["properties"]["info"]["sessionID"] = "ses_x"
    (reading,) = feed(producer, frame)
    fields = reading.fields
    if fields.cost_usd is not None:
        assert fields.cost_usd == cost and cost >= 0
    if fields.session_total_tokens is not None:
        assert fields.session_total_tokens == input_tokens + 5 + cache_read


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(payload=json_values, context=numbers)
def test_a_hostile_providers_answer_yields_only_windows_it_carried(payload: Any, context: Any) -> None:
    producer = OpenCodeProducer()
    answers = [
        payload,
        {"providers": [{"id": "fake", "models": {"fake-model": {"limit": {"context": context}}}}]},
    ]
    for answer in answers:
        try:
            windows = windows_from_providers(answer)
        except FrameRejected:
            continue
        assert set(windows.values()) <= numbers_in(answer)
        assert all(type(w) is int and w > 0 for w in windows.values())
    assert feed(producer, providers_frame(payload)) == []


def test_a_huge_providers_answer_is_bounded() -> None:
    models = {f"m{i}": {"limit": {"context": 1000 + i}} for i in range(WINDOWS_REMEMBERED + 500)}
    windows = windows_from_providers({"providers": [{"id": "p", "models": models}, "junk", {"id": 3}]})
    assert len(windows) == WINDOWS_REMEMBERED


def test_truncated_capture_lines_never_raise_anything_else() -> None:
    lines = (FIXTURES / "events.jsonl").read_bytes().splitlines()[:400]
    producer = primed()
    for line in lines:
        for cut in (1, len(line) // 3, len(line) // 2, len(line) - 2):
            for _, frame in decode_recording(line[:cut]):
                feed(producer, frame)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_decode_recording_never_raises_on_any_bytes(data: bytes) -> None:
    for at, frame in decode_recording(data):
        assert at is None or at >= 0
        assert isinstance(frame, dict)
        feed(primed(), frame)


def test_a_non_object_line_is_handed_on_to_be_refused() -> None:
    ((_, frame),) = list(decode_recording(b"[1, 2, 3]\n"))
    with pytest.raises(FrameRejected):
        OpenCodeProducer().feed(frame, 0)


def test_huge_and_deep_input_is_refused_not_crashed() -> None:
    producer = primed()
    huge_id = completion()
    huge_id["properties"]["info"]["id"] = "x" * 1_000_000
    assert feed(producer, huge_id) == []
    deep: Any = {}
    for _ in range(100_000):
        deep = {"a": deep}
    assert feed(producer, {"type": "message.updated", "properties": deep}) == []
    wide = completion()
    wide["properties"]["junk"] = list(range(200_000))
    assert len(feed(producer, wide)) == 1
    assert model_named_by({"type": "message.updated", "properties": deep}) is None


def test_an_oversized_sse_event_is_dropped_whole() -> None:
    lines = [
        "data: " + "x" * (MAX_EVENT_CHARS // 2),
        "data: " + "y" * (MAX_EVENT_CHARS // 2 + 10),
        "",
        "data: {}",
        "",
    ]
    assert list(sse_payloads(lines)) == ["{}"]


def test_many_sessions_and_messages_stay_bounded() -> None:
    producer = primed()
    frame = completion()
    for i in range(5000):
        frame["properties"]["info"].update(id=f"msg_{i}", sessionID=f"ses_{i}")
        frame["properties"]["info"]["tokens"]["total"] = 1000 + i
        feed(producer, frame)
        feed(producer, {"type": "session.updated", "properties": {"info": {"id": f"ses_{i}", "cost": 1.0}}})
        feed(producer, {"type": "session.compacted", "id": f"evt_{i}", "properties": {"sessionID": f"ses_{i}"}})
    assert producer.compactions == 5000
    assert len(producer._sessions) <= 1024 and len(producer._landed) <= 4096
