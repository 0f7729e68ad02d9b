"""Malformed, truncated, hostile and huge input, as bytes on Codex's wires (the app-server's stdout,
a relayed websocket message, the stdout tap's frame on the channel, a recording): only a logged drop
or no reading, never an exception, never a number the input did not carry."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.errors import FrameRejected
from guard.policy import Reading
from guard.record import MAX_COUNT
from sidecar.decoding import Dropped
from sidecar.harnesses.codex.producer import SPEC, CodexProducer, parse_message, tap_frame, tapped_line
from sidecar.recorder import Chunk
from tests.codex_threads import own_producer
from tests.conformance import replayed
from tests.conftest import FIXTURE_ROOT
from tests.hostile import json_values, numbers, numbers_in

FIXTURES = FIXTURE_ROOT / "codex"
METHODS = [
    "thread/tokenUsage/updated",
    "account/rateLimits/updated",
    "item/started",
    "item/completed",
    "thread/compacted",
]


def decoded(data: bytes, wire: str = "stdout") -> list[object]:
    decoder = SPEC.decoder(wire)
    return decoder.receive_data(data) + decoder.end_of_data()


def stdout_line(message: Any) -> bytes:
    return (message if isinstance(message, str) else json.dumps(message)).encode("utf-8", "surrogatepass") + b"\n"


def channel_line(payload: Any) -> bytes:
    return json.dumps({"type": "codex.rpc", "payload": payload}).encode() + b"\n"


def feed(producer: CodexProducer, data: bytes, wire: str = "stdout") -> list[Reading]:
    """What the bytes make of a producer: a drop is only a drop (the producer never sees it)."""
    readings: list[Reading] = []
    for event in decoded(data, wire):
        if not isinstance(event, Dropped):
            readings += producer.feed(event, 1_000)
    return readings


def refused(data: bytes, wire: str = "stdout") -> bool:
    """Only a drop: no event reaches the producer."""
    events = decoded(data, wire)
    return bool(events) and all(isinstance(event, Dropped) for event in events)


def assert_nothing_fabricated(reading: Reading, message: Any) -> None:
    carried = numbers_in(message)
    fields = reading.fields
    for value in (fields.used_tokens, fields.window_tokens, fields.session_total_tokens):
        assert value is None or value in carried


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(frame=json_values)
def test_any_json_as_a_frame(frame: Any) -> None:
    for wire in ("stdout", "websocket", "channel"):
        for reading in feed(own_producer(), stdout_line(frame), wire):
            assert_nothing_fabricated(reading, frame)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(payload=json_values | st.text(max_size=200))
def test_any_payload(payload: Any) -> None:
    producer = own_producer()
    for reading in feed(producer, channel_line(payload), "channel"):
        assert_nothing_fabricated(reading, payload)
    if not isinstance(payload, str):  # the tap sends the line as a string, never a parsed object
        assert refused(channel_line(payload), "channel")


@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(METHODS), params=json_values, as_text=st.booleans())
def test_any_params_for_the_methods_that_matter(method: str, params: Any, as_text: bool) -> None:
    message = {"method": method, "params": params}
    data = channel_line(json.dumps(message)) if as_text else stdout_line(message)
    for reading in feed(own_producer(), data, "channel" if as_text else "stdout"):
        assert_nothing_fabricated(reading, message)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(line=st.binary(max_size=300).map(lambda data: data.replace(b"\n", b"")))
def test_the_tap_frame_carries_a_lines_very_bytes(line: bytes) -> None:
    """Whatever stdout carried, UTF-8 or not: the channel decodes the bytes a replay decodes."""
    frame = tap_frame(line)
    assert b"\n" not in frame and json.loads(frame)["type"] == "codex.rpc"
    assert tapped_line(json.loads(frame)) == line
    assert same(decoded(frame + b"\n", "channel")) == same(decoded(line + b"\n", "stdout"))


def same(events: list[object]) -> list[object]:
    """Events as every wire must agree on them: a drop by its reason, not by where it was logged."""
    return [event.reason if isinstance(event, Dropped) else event for event in events]


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(last=numbers, total=numbers, window=numbers, used=numbers, minutes=numbers)
def test_hostile_numbers_in_well_formed_messages(last: Any, total: Any, window: Any, used: Any, minutes: Any) -> None:
    producer = own_producer()
    feed(producer, stdout_line({"method": "account/rateLimits/updated", "params": {"rateLimits": {
        "primary": {"usedPercent": used, "windowDurationMins": minutes}}}}))  # fmt: skip
    message = {
        "method": "thread/tokenUsage/updated",
        "params": {"threadId": "t", "turnId": "u", "tokenUsage": {
            "last": {"totalTokens": last}, "total": {"totalTokens": total}, "modelContextWindow": window}},
    }  # fmt: skip
    readings = feed(producer, stdout_line(message))
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
        for cut in range(1, len(line)):
            producer = own_producer()
            for data, wire in ((line[:cut].encode(), "websocket"), (channel_line(line[:cut]), "channel")):
                assert refused(data, wire)
                feed(producer, data, wire)
            # On stdout a cut line is a line without its newline: dropped as truncated at the end.
            assert refused(line[:cut].encode(), "stdout")
            assert producer.held.compactions.count == 0 and producer.held.reading is None


@pytest.mark.parametrize(
    "payload",
    [
        "[" * 200_000,  # deep nesting
        '{"method": "thread/tokenUsage/updated", "params": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "9" * 100_000,  # an integer beyond Python's digit limit
        '{"method": "thread/tokenUsage/updated", "params": NaN}',
        "\udcff",  # a stray byte 0xff on stdout: not UTF-8
        "\ud800",  # a lone surrogate no line's bytes can be
        "{",
        "null",
        "[]",
    ],
)
def test_hostile_payload_text_is_refused(payload: str) -> None:
    assert refused(channel_line(payload), "channel")
    if payload != "\ud800":
        assert refused(payload.encode("utf-8", "surrogateescape") + b"\n", "stdout")


def test_a_blank_line_is_nothing_on_every_wire() -> None:
    assert decoded(channel_line(""), "channel") == decoded(channel_line(" \r"), "channel") == []
    assert decoded(b" \r\n", "stdout") == decoded(b"\n", "stdout") == []


def test_a_huge_frame_is_refused_or_read_without_fabrication() -> None:
    noise = "x" * (8 * 1024 * 1024)
    message = {"method": "warning", "params": {"message": noise}}
    for wire in ("stdout", "websocket"):
        assert refused(stdout_line(message), wire)  # over the channel's limit on every wire alike
    bloated = {
        "method": "thread/tokenUsage/updated",
        "params": {"threadId": "t" * 600_000, "turnId": "u", "junk": list(range(50_000)), "tokenUsage": {
            "last": {"totalTokens": 5}, "total": {"totalTokens": 6}, "modelContextWindow": None}},
    }  # fmt: skip
    huge_thread = own_producer("t" * 600_000)
    for wire in ("stdout", "websocket"):
        [reading] = feed(huge_thread, stdout_line(bloated), wire)
        assert (reading.fields.used_tokens, reading.fields.used_percent) == (5, None)
    line = stdout_line(bloated)[:-1]
    [reading] = feed(own_producer("t" * 600_000), tap_frame(line) + b"\n", "channel")
    assert reading.fields.used_tokens == 5


def test_a_message_the_tap_could_not_carry_is_refused_on_every_wire() -> None:
    """Quotes double inside the tap's string: a line under the limit whose frame is over it is
    dropped by the channel, so the websocket and a replay refuse it too."""
    message = json.dumps({"method": "warning", "params": {"q": '"' * 300_000}}).encode()
    assert len(message) <= 1024 * 1024 < len(tap_frame(message))
    for wire in ("stdout", "websocket"):
        assert refused(message + b"\n", wire)
    assert refused(tap_frame(message) + b"\n", "channel")


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
    assert refused(stdout_line(message))


def test_compaction_item_without_id_is_refused() -> None:
    message = {"method": "item/started", "params": {"item": {"type": "contextCompaction"}, "turnId": "t"}}
    assert refused(stdout_line(message))


def test_a_hostile_flood_of_item_ids_is_bounded_and_still_counts_each_once() -> None:
    producer = own_producer()
    for n in range(5_000):
        message = {"method": "item/started", "params": {"item": {"type": "contextCompaction", "id": str(n)}}}
        for event in parse_message(json.dumps(message).encode()):
            producer.feed(event, n)
    assert producer.held.compactions.count == 5_000
    assert len(producer._counted_items) <= 1024


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000))
def test_any_bytes_as_a_recording(data: bytes) -> None:
    for wire in ("stdout", "websocket", "rollout", "channel"):
        for write in replayed(SPEC, [Chunk(None, wire, data)]):
            assert_nothing_fabricated_in_record(write.record.used_tokens, data)
    replayed(SPEC, [Chunk(None, wire, data) for wire in ("stdout", "websocket", "rollout", "channel")])


def valid_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def assert_nothing_fabricated_in_record(used: int | None, data: bytes) -> None:
    assert used is None or str(used).encode() in data


@pytest.mark.parametrize("line", [b'{"a": 1}', b'{"type": "context", "reading": null}', b'{"id": 7}', b'{}',
                                  b'{"method": 5, "params": {}}', b'{"result": {}}'])  # fmt: skip
def test_a_json_object_that_is_no_app_server_message_is_refused_on_every_wire(line: bytes) -> None:
    """Not a request, a notification nor a response (a pi frame given as Codex, a config file): a
    drop with its reason, on the live wires and in `hctx replay --harness codex` alike."""
    with pytest.raises(FrameRejected, match="not an app-server message"):
        parse_message(line)
    for wire in ("stdout", "websocket"):
        [event] = SPEC.decoder(wire).receive_data(line + b"\n")
        assert isinstance(event, Dropped) and "not an app-server message" in event.reason
    assert replayed(SPEC, [Chunk(None, "stdout", line + b"\n")]) == []
    for message in (b'{"id": 1, "result": {}}', b'{"id": 2, "error": {"code": -1}}', b'{"method": "x/y"}'):
        assert parse_message(message) == []  # the app-server's own shapes pass, and carry nothing here
