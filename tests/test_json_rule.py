"""The one JSON rule (guard.json_rule): what it refuses, that every reader applies it, that the
tee's stdlib copy agrees with it, and that every decoder of every harness counts a damaged frame."""

from __future__ import annotations

import json
from typing import Any

import pytest
from guard_factory import wire_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import JsonRefused, MalformedFrame, RecordRefused
from guard.json_rule import loads, loads_object
from guard.record import parse_record
from guard.state import parse_state
from sidecar import registry
from sidecar.decoding import Dropped, SseDecoder
from sidecar.harnesses.claude.frames import load_json
from sidecar.harnesses.codex.transcript import RolloutDecoder
from sidecar.transcripts import json_object

VALID_STATE = json.dumps({
    "schema": "st2.harness-state.v1", "host": "h", "agent": "a", "harness": "pi", "incarnation": "i",
    "desiredState": "running", "claimedAtMs": 1, "wrapperPid": 1,
}).encode()  # fmt: skip

REFUSED = {
    "utf-16": '{"a": 1}'.encode("utf-16"),
    "utf-16 without a BOM": '{"a": 1}'.encode("utf-16-le"),
    "utf-32": '{"a": 1}'.encode("utf-32"),
    "a BOM": b"\xef\xbb\xbf" + b'{"a": 1}',
    "NaN": b'{"a": NaN}',
    "-Infinity deep": b'{"a": [{"b": -Infinity}]}',
    "a lone surrogate": b'{"a": "\\ud800"}',
    "a lone surrogate in a key": b'{"\\udfff": 1}',
    "a stray byte": b'{"a": "\xff"}',
    "nested too deep": b"[" * 200_000 + b"]" * 200_000,
    "trailing data": b'{"a": 1} {}',
    "empty": b"",
}


@pytest.mark.parametrize("data", REFUSED.values(), ids=REFUSED.keys())
def test_the_rule_refuses_what_rfc_8259_in_utf_8_does_not_hold(data: bytes) -> None:
    with pytest.raises(JsonRefused):
        loads(data)
    with pytest.raises(MalformedFrame):
        loads(data, error=MalformedFrame)  # the caller's class, the rule's reason


def test_the_rule_keeps_what_it_must() -> None:
    assert loads(b' {"a": "\\ud83d\\ude00", "\\u0000": [1.5, -0.0, 1e400]} \n') == {
        "a": "\U0001f600", "\x00": [1.5, -0.0, float("inf")],
    }  # fmt: skip  # a surrogate pair is one character; an escaped NUL is text; 1e400 is JSON
    assert loads_object('{"a": 1}') == {"a": 1}
    with pytest.raises(JsonRefused, match="not a JSON object but list"):
        loads_object(b"[1]")
    with pytest.raises(JsonRefused, match="lone surrogate"):
        loads('"\udc80"')  # a str holding one raw, as surrogateescape makes them


@pytest.mark.parametrize("data", REFUSED.values(), ids=REFUSED.keys())
def test_every_reader_refuses_the_same(data: bytes) -> None:
    """Records, claims and transcript lines: one rule. The claim took a BOM and the transcripts
    UTF-16 before it (plain `json.loads` on bytes)."""
    assert json_object(data) is None
    with pytest.raises(RecordRefused):
        parse_state(data)
    with pytest.raises(RecordRefused):
        parse_record(data)


def test_the_claim_and_the_transcripts_refuse_a_bom_and_utf_16_they_used_to_take() -> None:
    parse_state(VALID_STATE)
    assert json_object(VALID_STATE) is not None
    with pytest.raises(RecordRefused, match="byte-order mark"):
        parse_state(b"\xef\xbb\xbf" + VALID_STATE)
    assert json_object(VALID_STATE.decode().encode("utf-16")) is None
    with pytest.raises(RecordRefused, match="byte-order mark"):
        parse_record(b"\xef\xbb\xbf" + wire_bytes())


# --- the tee's stdlib copy -------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
_values = st.recursive(_scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30)


def _spellings(value: Any) -> st.SearchStrategy[bytes]:
    text = st.sampled_from([
        json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value, indent=1),
    ])  # fmt: skip
    return text.map(lambda t: t.encode("utf-8", "surrogatepass"))


def _damaged(data: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(data),
        st.integers(0, len(data)).map(lambda cut: data[:cut]),
        st.tuples(st.integers(0, len(data)), st.binary(max_size=3)).map(lambda c: data[: c[0]] + c[1] + data[c[0] :]),
        st.sampled_from([b"\xef\xbb\xbf" + data, b" " + data + b"\r\n", data + b"x", b"[" + data]),
    )


_corpus = st.one_of(
    _values.flatmap(_spellings).flatmap(_damaged),
    st.binary(max_size=40),
    st.sampled_from(list(REFUSED.values())),
)


def _rule(data: bytes) -> tuple[bool, object]:
    try:
        return True, loads(data)
    except JsonRefused:
        return False, None


def _tee(data: bytes) -> tuple[bool, object]:
    try:
        return True, load_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False, None


@settings(max_examples=600, deadline=None)
@given(_corpus)
def test_the_tee_reads_json_exactly_as_the_rule_does(data: bytes) -> None:
    """Accept and refuse agree, and what both accept is the same value (NaN never is)."""
    rule, tee = _rule(data), _tee(data)
    assert rule[0] == tee[0], (data[:200], rule, tee)
    assert json.dumps(rule[1], sort_keys=True) == json.dumps(tee[1], sort_keys=True)


# --- every decoder counts a damaged frame ------------------------------------------------------


def _wires() -> list[tuple[str, str]]:
    return [(name, wire) for name in registry.harness_names() for wire in registry.spec_for(name).wires()]


def _framed(decoder: object, damaged: bytes) -> bytes:
    return b"data: " + damaged + b"\n\n" if isinstance(decoder, SseDecoder) else damaged + b"\n"


def test_the_registry_has_every_kind_of_wire() -> None:
    """The two tests below cover real decoders of every framing, not an empty list."""
    wires = _wires()
    assert {("claude", "channel"), ("codex", "rollout"), ("codex", "websocket"), ("opencode", "sse")} <= set(wires)


@pytest.mark.parametrize(("name", "wire"), _wires())
def test_the_rollout_and_every_other_wire_count_a_damaged_frame(name: str, wire: str) -> None:
    """`{bad json compacted` gave [] on Codex's rollout wire, where every other decoder dropped it."""
    decoder = registry.spec_for(name).decoder(wire)
    events = decoder.receive_data(_framed(decoder, b"{bad json compacted")) + decoder.end_of_data()
    assert events and all(isinstance(event, Dropped) for event in events), events


_damaged_frame = st.binary(min_size=1, max_size=200).filter(
    lambda data: b"\n" not in data and b"\r" not in data and data.strip() != b"" and not _rule(data)[0]
)


@settings(max_examples=60, deadline=None)
@given(_damaged_frame)
@pytest.mark.parametrize(("name", "wire"), _wires())
def test_every_decoder_turns_any_damaged_frame_into_a_drop(name: str, wire: str, damaged: bytes) -> None:
    decoder = registry.spec_for(name).decoder(wire)
    events = decoder.receive_data(_framed(decoder, damaged)) + decoder.end_of_data()
    assert events and all(isinstance(event, Dropped) for event in events), (damaged, events)


def test_a_rollout_line_that_names_no_kind_is_still_counted_when_damaged() -> None:
    cut = b'{"timestamp":"2026-01-01T00:00:00Z","type":"response_item",'
    [dropped] = RolloutDecoder().receive_data(cut + b"\n")
    assert isinstance(dropped, Dropped) and dropped.where == "rollout" and "malformed JSON" in dropped.reason
    assert RolloutDecoder().receive_data(cut + b'"payload":{}}\n') == []  # whole, it says nothing of context
