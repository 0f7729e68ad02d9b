"""Malformed, truncated, hostile and huge OpenCode input: a logged drop or no reading, never another
exception, never a number the input did not carry. Everything enters as the bytes of its wire,
through the spec's decoders, as it does live and in `hctx replay`."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import FrameRejected
from guard.policy import Reading, WriteGuard
from sidecar.decoding import Dropped
from sidecar.harnesses.opencode.producer import (
    MAX_EVENT_BYTES,
    SPEC,
    WINDOWS_REMEMBERED,
    OpenCodeProducer,
    OtherEvent,
    sse_event,
    windows_from_providers,
)
from sidecar.pipeline import Pipeline
from sidecar.recorder import Chunk
from tests import conformance
from tests.conftest import FIXTURE_ROOT
from tests.hostile import json_values, numbers, numbers_in

FIXTURES = FIXTURE_ROOT / "opencode" / "v1.18.25"
TYPES = ["message.updated", "session.updated", "session.compacted", "tui.session.select", "server.heartbeat"]


def feed_bytes(producer: OpenCodeProducer, data: bytes, wire: str = "sse") -> list[Reading]:
    """`data` through a fresh decoder of `wire` into the producer, as the pipeline would: a drop
    (the decoder's Dropped, the producer's FrameRejected) is no reading."""
    decoder = SPEC.decoder(wire)
    readings: list[Reading] = []
    for event in decoder.receive_data(data) + decoder.end_of_data():
        if isinstance(event, Dropped):
            continue
        try:
            readings += producer.feed(event, 1_000)
        except FrameRejected:
            continue
    return readings


def feed(producer: OpenCodeProducer, frame: Any) -> list[Reading]:
    """One JSON value as the data of one `/event` SSE event."""
    return feed_bytes(producer, sse_event(json.dumps(frame).encode()))


def feed_providers(producer: OpenCodeProducer, answer: Any) -> list[Reading]:
    return feed_bytes(producer, json.dumps(answer).encode(), "providers")


CAPTURED = [
    json.loads(json.loads(line)["raw"])
    for line in (FIXTURES / "events.jsonl").read_bytes().splitlines()
    if json.loads(line)["stream"] == "event"
]
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
    feed_providers(producer, PROVIDERS)
    assert producer.catalog.windows
    return producer


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(frame=json_values)
def test_any_json_value_is_refused_or_ignored(frame: Any) -> None:
    assert feed(primed(), frame) == []


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(TYPES), properties=json_values, payload=json_values)
def test_any_properties_under_a_known_type_never_raise_anything_else(kind: str, properties: Any, payload: Any) -> None:
    producer = primed()
    for reading in [
        *feed(producer, {"type": kind, "id": "evt_1", "properties": properties, "payload": payload}),
        *feed_providers(producer, payload),
        *feed_bytes(producer, json.dumps(payload).encode(), "config"),
    ]:
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
    assert feed_providers(producer, payload) == []


def test_a_huge_providers_answer_is_bounded() -> None:
    models = {f"m{i}": {"limit": {"context": 1000 + i}} for i in range(WINDOWS_REMEMBERED + 500)}
    windows = windows_from_providers({"providers": [{"id": "p", "models": models}, "junk", {"id": 3}]})
    assert len(windows) == WINDOWS_REMEMBERED


def test_truncated_capture_lines_never_raise_anything_else() -> None:
    events = [chunk.data for chunk in conformance.chunks_of("opencode/v1.18.25/events.rec")][:400]
    producer = primed()
    for event in events:
        for cut in (1, len(event) // 3, len(event) // 2, len(event) - 2):
            feed_bytes(producer, event[:cut])
    # Cut anywhere in the SSE bytes themselves: the whole events before the cut decode, the cut one drops.
    sse = b"".join(sse_event(json.dumps(frame).encode()) for frame in CAPTURED[:50])
    for cut in range(0, len(sse), 997):
        decoder = SPEC.decoder("sse")
        events = decoder.receive_data(sse[:cut]) + decoder.end_of_data()
        assert all(
            isinstance(event, Dropped) or type(event).__module__ == OpenCodeProducer.__module__ for event in events
        )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_a_recording_of_any_bytes_on_any_wire_never_raises(data: bytes) -> None:
    for wire in SPEC.wires():
        for write in conformance.replayed(SPEC, [Chunk(None, wire, data)]):
            assert write.record.used_tokens is None or write.record.used_tokens in numbers_in(_json_numbers(data))


def _json_numbers(data: bytes) -> list[Any]:
    """Every JSON value a line of `data` holds (a JSON string's own text too, as a lab `raw` is)."""
    values: list[Any] = []
    for line in data.splitlines():
        for text in (line, line.removeprefix(b"data:")):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                continue
            values.append(value)
            if isinstance(value, dict) and isinstance(value.get("raw"), str):
                values.append(_json_numbers(value["raw"].encode("utf-8", "surrogatepass")))
    return values


def test_a_non_object_event_is_refused() -> None:
    chunk = Chunk(None, "sse", b"data: [1, 2, 3]\n\n")
    assert conformance.replayed(SPEC, [chunk]) == []
    pipeline = Pipeline(OpenCodeProducer(), WriteGuard("a", "i"))
    (dropped,) = SPEC.decoder("sse").receive_data(chunk.data)
    assert isinstance(dropped, Dropped) and "not a JSON object" in dropped.reason
    assert pipeline.feed(dropped, 0) == [] and pipeline.dropped == 1


def test_a_nan_anywhere_drops_the_whole_event() -> None:
    """NaN is not JSON: an event carrying one, even in a field never read, is malformed as a whole."""
    frame = completion()
    frame["properties"]["info"]["tokens"]["total"] = 77_777
    data = json.dumps(frame).encode()
    assert feed_bytes(primed(), sse_event(data))  # the event without it is a reading
    for junk in (b"NaN", b"Infinity", b"-Infinity"):
        tainted = data[:-1] + b', "junk": ' + junk + b"}"
        (dropped,) = SPEC.decoder("sse").receive_data(sse_event(tainted))
        assert isinstance(dropped, Dropped) and "not a JSON number" in dropped.reason
        assert feed_bytes(primed(), sse_event(tainted)) == []


def test_huge_and_deep_input_is_refused_not_crashed() -> None:
    producer = primed()
    huge_id = completion()
    huge_id["properties"]["info"]["id"] = "x" * 1_000_000
    assert feed(producer, huge_id) == []
    deep = b'{"type": "message.updated", "properties": ' + b'{"a": ' * 100_000 + b"{}" + b"}" * 100_001
    (dropped,) = SPEC.decoder("sse").receive_data(sse_event(deep))
    assert isinstance(dropped, Dropped) and "nested too deep" in dropped.reason
    assert feed_bytes(producer, sse_event(deep)) == []
    wide = completion()
    wide["properties"]["junk"] = list(range(200_000))
    assert len(feed(producer, wide)) == 1


def test_an_oversized_sse_event_is_dropped_whole() -> None:
    lines = [
        b"data: " + b"x" * (MAX_EVENT_BYTES // 2),
        b"data: " + b"y" * (MAX_EVENT_BYTES // 2 + 10),
        b"",
        b'data: {"type": "server.heartbeat", "properties": {}}',
        b"",
        b"",
    ]
    decoder = SPEC.decoder("sse")
    events = [event for line in lines for event in decoder.receive_data(line + b"\n")]
    assert events == [Dropped(f"event over {MAX_EVENT_BYTES} bytes", "sse"), OtherEvent("server.heartbeat")]
    assert decoder.framer.pending_bytes == 0  # type: ignore[attr-defined]


def test_many_sessions_and_messages_stay_bounded() -> None:
    producer = primed()
    frame = completion()
    for i in range(5000):
        frame["properties"]["info"].update(id=f"msg_{i}", sessionID=f"ses_{i}")
        frame["properties"]["info"]["tokens"]["total"] = 1000 + i
        feed(producer, frame)
        feed(producer, {"type": "session.updated", "properties": {"info": {"id": f"ses_{i}", "cost": 1.0}}})
        feed(producer, {"type": "session.compacted", "id": f"evt_{i}", "properties": {"sessionID": f"ses_{i}"}})
    assert producer.held.compactions.count == 5000
    assert len(producer._sessions) <= 1024 and len(producer._landed) <= 4096
