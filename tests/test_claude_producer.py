"""The Claude producer on the lab's verbatim captures (fixtures/claude/, 2.1.250 and 2.1.332).

Each fixture test asserts the number that must be published and the number a plausible wrong
producer would publish instead (spec "Per-harness fixture tests"), so moving the numerator's terms,
the percent rule, the withholding or the compaction dedupe fails here.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from guard.errors import FrameRejected
from guard.policy import Reading, Write, WriteGuard
from sidecar.decoding import CHANNEL, Dropped
from sidecar.harnesses.claude.frames import HOOK_FRAME as HOOK_LINE
from sidecar.harnesses.claude.frames import channel_line
from sidecar.harnesses.claude.producer import (
    HOOK_TYPE,
    SPEC,
    STATUSLINE_TYPE,
    VERIFIED_VERSIONS,
    ClaudeProducer,
    Hook,
    StatusLine,
)
from sidecar.pipeline import Pipeline
from sidecar.registry import spec_for
from tests.conformance import bytewise, chunks_of, fixture_writes, outcome, recording_path, replayed, split_at
from tests.conftest import FIXTURE_ROOT, REPO

FIXTURES = FIXTURE_ROOT / "claude"
VERSIONS = ("2.1.250", "2.1.332")
T0 = 1_795_990_000_000  # an epoch-ms clock in the lab's day, before every captured resets_at


def payloads(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_bytes().splitlines() if line.strip()]


def decoded(kind: str, payload: dict[str, Any]) -> object:
    """The payload's frame as the channel carries it, through the spec's channel decoder: its event."""
    (event,) = SPEC.decoder(CHANNEL).receive_data(json.dumps({"type": kind, "payload": payload}).encode() + b"\n")
    if isinstance(event, Dropped):
        raise FrameRejected(event.reason)
    return event


def statusline(payload: dict[str, Any]) -> object:
    return decoded(STATUSLINE_TYPE, payload)


def hook(payload: dict[str, Any]) -> object:
    return decoded(HOOK_TYPE, payload)


def read(producer: ClaudeProducer, payload: dict[str, Any], now_ms: int = T0) -> Reading:
    (reading,) = producer.feed(statusline(payload), now_ms)
    return reading


def session(version: str, tag: str = "") -> str:
    """The lab's session (its status-line, PreCompact, PostCompact and SessionStart captures) as one
    recording (scripts/convert_fixtures.py)."""
    return f"claude/session-{version}{tag}.rec"


def writes(version: str, tag: str = "") -> list[Write]:
    return fixture_writes("claude", session(version, tag))


def recorded_frames(name: str) -> list[tuple[int | None, dict[str, Any]]]:
    """(time, the frame the channel carried) of every chunk of a recording."""
    return [(chunk.at_ms, json.loads(chunk.data)) for chunk in chunks_of(name)]


# --- the captured version, literally ---------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_the_fixtures_are_the_verified_versions(version: str) -> None:
    assert version in VERIFIED_VERSIONS
    for tag in ("", "-sonnet45", "-sonnet45-oauth"):
        assert {p["version"] for p in payloads(f"statusline-{version}{tag}.jsonl")} == {version}
    assert VERIFIED_VERSIONS == ("2.1.250", "2.1.332")


def test_registry_selects_this_producer() -> None:
    assert spec_for("claude") is SPEC
    assert isinstance(SPEC.make_producer(), ClaudeProducer)
    # The tee and the hook forwarder write to the channel; the transport reads each subagent's own
    # transcript into the `subagent` wire (issue 28).
    assert SPEC.wires() == (CHANNEL, "subagent")
    assert isinstance(statusline(payloads("statusline-2.1.332.jsonl")[0]), StatusLine)
    assert isinstance(hook(payloads("precompact-2.1.332.jsonl")[0]), Hook)


# --- the triple -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("tag", ["", "-sonnet45"])
def test_the_pre_turn_payload_withholds_rather_than_reporting_zero(version: str, tag: str) -> None:
    pre_turn = payloads(f"statusline-{version}{tag}.jsonl")[0]
    assert pre_turn["context_window"]["current_usage"] is None
    assert pre_turn["context_window"]["total_input_tokens"] == 0  # the wrong number sitting beside it
    fields = read(ClaudeProducer(), pre_turn).fields
    assert fields.used_tokens is None and fields.used_tokens != 0
    assert fields.used_percent is None
    assert fields.window_tokens == (200_000 if tag else 1_000_000)  # the window is known from the start
    assert fields.model == pre_turn["model"]["id"]
    assert fields.cost_usd == 0  # nothing spent yet is a real zero
    assert fields.session_total_tokens is None and fields.rate_limits is None


@pytest.mark.parametrize("version", VERSIONS)
def test_a_mid_session_payload_yields_claudes_own_triple(version: str) -> None:
    t2 = payloads(f"statusline-{version}-sonnet45.jsonl")[-7]
    usage = t2["context_window"]["current_usage"]
    assert usage == {
        "input_tokens": 1000,
        "output_tokens": 222,
        "cache_creation_input_tokens": 9000,
        "cache_read_input_tokens": 51000,
    }
    fields = read(ClaudeProducer(), t2).fields
    assert fields.used_tokens == 61000  # input + cache_creation + cache_read of the last reply
    assert fields.used_tokens not in (1000, 1000 + 51000, 61000 + 222)  # input only, no creation, with output
    assert fields.window_tokens == 200_000
    assert fields.used_percent == 31  # Claude's Math.round(30.5), as Claude gave it
    assert fields.used_percent != 61000 * 100 / 200_000  # 30.5: st2 never recomputes Claude's percent
    assert fields.model == "claude-sonnet-4-5"
    assert fields.cost_usd == t2["cost"]["total_cost_usd"]
    assert fields.session_total_tokens is None  # total_* describe the last reply, not the session


@pytest.mark.parametrize("version", VERSIONS)
def test_an_overrun_is_published_as_claudes_clamped_percent(version: str) -> None:
    t5 = payloads(f"statusline-{version}-sonnet45.jsonl")[-3]
    fields = read(ClaudeProducer(), t5).fields
    assert fields.used_tokens == 230_000 and fields.window_tokens == 200_000
    assert fields.used_percent == 100  # Claude clamps; 115 is what a recomputing producer would say
    assert fields.used_percent != 115


@pytest.mark.parametrize("version", VERSIONS)
def test_the_payload_after_compact_publishes_the_emptied_window(version: str) -> None:
    after = payloads(f"statusline-{version}.jsonl")[4]
    assert after["context_window"]["current_usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    fields = read(ClaudeProducer(), after).fields
    assert (fields.used_tokens, fields.used_percent) == (0, 0)  # measured zeros, unlike the pre-turn nulls


@pytest.mark.parametrize("version", VERSIONS)
def test_every_captured_payload_is_published_as_given(version: str) -> None:
    producer = ClaudeProducer()
    for name in (
        f"statusline-{version}.jsonl",
        f"statusline-{version}-sonnet45.jsonl",
        f"refresh2s-statusline-{version}.jsonl",
    ):
        for payload in payloads(name):
            window = payload["context_window"]
            fields = read(producer, payload).fields
            measured = window["current_usage"] is not None
            assert fields.used_tokens == (window["total_input_tokens"] if measured else None)
            assert fields.used_percent == window["used_percentage"]
            assert fields.window_tokens == window["context_window_size"]


# --- rate limits and the exhaustion edge -------------------------------------------------------------


def test_rate_limits_in_both_versions_forms() -> None:
    old = read(ClaudeProducer(), payloads("statusline-2.1.250-sonnet45-oauth.jsonl")[1]).fields.rate_limits
    new = read(ClaudeProducer(), payloads("statusline-2.1.332-sonnet45-oauth.jsonl")[2]).fields.rate_limits
    assert old is not None and new is not None
    assert (old.five_hour, old.seven_day) == (42.370000000000005, 17)  # raw u*100, float noise kept
    assert (new.five_hour, new.seven_day) == (42.4, 17)  # rounded to one decimal
    for name in ("statusline-2.1.250-sonnet45-oauth.jsonl", "statusline-2.1.332-sonnet45-oauth.jsonl"):
        assert read(ClaudeProducer(), payloads(name)[0]).fields.rate_limits is None  # absent before a reply


def test_rate_limit_edges_unclamped_in_2_1_250_and_clamped_in_2_1_332() -> None:
    old = read(ClaudeProducer(), payloads("extra-rl-edge-statusline-2.1.250.jsonl")[1]).fields.rate_limits
    new = read(ClaudeProducer(), payloads("extra-rl-edge-statusline-2.1.332.jsonl")[2]).fields.rate_limits
    assert old is not None and new is not None
    assert (old.five_hour, old.seven_day) == (0.049, 120)
    assert (new.five_hour, new.seven_day) == (0, 100)


def test_api_key_sessions_publish_no_rate_limits() -> None:
    for version in VERSIONS:
        for payload in payloads(f"statusline-{version}.jsonl"):
            assert read(ClaudeProducer(), payload).fields.rate_limits is None


def _exhaustion_writes(frames: list[tuple[dict[str, Any], int]]) -> list[Write]:
    pipeline = Pipeline(ClaudeProducer(), WriteGuard("a", "i"))
    return [write for payload, now in frames for write in pipeline.feed(statusline(payload), now)]


def test_an_exhausted_account_window_writes_when_it_starts_and_when_it_resets() -> None:
    # One bucket throughout (the 2.1.332 t1 payload), only the seven-day window moving.
    base = payloads("statusline-2.1.332-sonnet45-oauth.jsonl")[2]
    exhausted = copy.deepcopy(base)
    exhausted["rate_limits"]["seven_day"] = {"used_percentage": 100, "resets_at": T0 // 1000 + 60}
    reset_at_ms = T0 + 60_000
    result = _exhaustion_writes(
        [(base, T0), (exhausted, T0 + 5000), (exhausted, T0 + 10_000), (exhausted, reset_at_ms)]
    )
    assert [write.reason for write in result] == ["bucket", "exhaustion", "exhaustion"]
    assert result[1].record.rate_limits is not None and result[1].record.rate_limits.seven_day == 100
    # Once its resets_at has passed, the 100 no longer describes the account: withheld, not held up.
    assert result[2].record.rate_limits is not None and result[2].record.rate_limits.seven_day is None
    assert result[2].record.rate_limits.five_hour == 42.4


def test_a_captured_120_percent_window_is_an_exhaustion() -> None:
    edge = payloads("extra-rl-edge-statusline-2.1.250.jsonl")
    result = _exhaustion_writes([(edge[0], T0), (edge[1], T0 + 1000)])
    assert result[-1].record.rate_limits is not None and result[-1].record.rate_limits.seven_day == 120


# --- the snapshot's own time and the rate-limit edge (issue 35) ------------------------------------


def _limits_at(reading: Reading) -> tuple[int | None, int | None]:
    times = reading.fields.rate_limits_at_ms
    assert times is not None
    return times.five_hour, times.seven_day


@pytest.mark.parametrize("version", VERSIONS)
def test_an_idle_redraw_keeps_the_time_its_limits_arrived(version: str) -> None:
    """hctx renders the status line every 5 s: an idle seat redraws the very payload of its last
    turn (the refresh capture: cost and usage unchanged between redraws). Its limits are as old as
    that turn, however fresh the reading holding them."""
    turn = next(p for p in payloads(f"statusline-{version}-sonnet45-oauth.jsonl") if "rate_limits" in p)
    producer = ClaudeProducer()
    first = read(producer, turn, T0)
    redrawn = read(producer, copy.deepcopy(turn), T0 + 300_000)
    assert _limits_at(first) == (T0, T0)
    assert redrawn.fields.observed_at_ms == T0 + 300_000  # a fresh reading (the heartbeat's to write)
    assert _limits_at(redrawn) == (T0, T0)  # not its observedAtMs: the figures are five minutes old


@pytest.mark.parametrize("version", VERSIONS)
def test_each_turn_dates_its_limits_anew(version: str) -> None:
    """Every captured turn after the first: a new response (`total_api_duration_ms` grew), so the
    limits arrived again, dated by the status line that shows them; and a response restating the
    very figures (the duration alone grew) dates them anew too."""
    limited = [p for p in payloads(f"statusline-{version}-sonnet45-oauth.jsonl") if "rate_limits" in p]
    producer = ClaudeProducer()
    for index, payload in enumerate(limited):
        assert _limits_at(read(producer, payload, T0 + index * 1000)) == (T0 + index * 1000,) * 2
    again = copy.deepcopy(limited[-1])
    again["cost"]["total_api_duration_ms"] += 50  # one more request, the same headers
    later = T0 + len(limited) * 1000
    assert _limits_at(read(producer, again, later)) == (later, later)
    assert _limits_at(read(producer, copy.deepcopy(again), later + 5000)) == (later, later)  # a redraw


def test_a_changed_limit_alone_dates_its_window_and_leaves_the_other() -> None:
    """Claude states no time for its limits (2.1.250, 2.1.332): a window whose percent moved is dated
    by the status line that shows it; the window that did not keeps its own time."""
    base = payloads("statusline-2.1.332-sonnet45-oauth.jsonl")[2]
    producer = ClaudeProducer()
    read(producer, base, T0)
    moved = copy.deepcopy(base)
    moved["rate_limits"]["five_hour"]["used_percentage"] = 96
    assert _limits_at(read(producer, moved, T0 + 7000)) == (T0 + 7000, T0)


def test_a_rate_limit_move_alone_is_written_bounded_by_its_bucket() -> None:
    """A turn that moves the account's five-hour window past 95% while the context stays in its
    bucket is written at once (issue 35); a move inside the same 1% is not (bounded as the context
    bucket is), nor is a redraw; a new reset is."""
    base = payloads("statusline-2.1.332-sonnet45-oauth.jsonl")[2]

    def limited(five_hour: float, resets_at: int | None = None) -> dict[str, Any]:
        payload = copy.deepcopy(base)
        payload["rate_limits"]["five_hour"]["used_percentage"] = five_hour
        if resets_at is not None:
            payload["rate_limits"]["five_hour"]["resets_at"] = resets_at
        return payload

    reset = base["rate_limits"]["five_hour"]["resets_at"]
    stream = [(base, T0), (limited(95.2), T0 + 5000), (limited(95.9), T0 + 10_000), (limited(95.9), T0 + 15_000),
              (limited(95.9, reset + 18_000), T0 + 20_000)]  # fmt: skip
    result = _exhaustion_writes(stream)
    assert [(w.reason, w.record.rate_limits.five_hour if w.record.rate_limits else None) for w in result] == [
        ("bucket", 42.4), ("rate-limits", 95.2), ("rate-limits", 95.9),
    ]  # fmt: skip
    assert result[1].record.used_tokens == result[0].record.used_tokens  # the context did not move
    assert result[2].record.rate_limit_resets_at_ms is not None
    assert result[2].record.rate_limit_resets_at_ms.five_hour == (reset + 18_000) * 1000


def test_a_redrawing_idle_seat_writes_nothing_before_the_heartbeat() -> None:
    """The refresh cadence's redraws carry the same limits: no rate-limit edge, the heartbeat only,
    and the heartbeat's record keeps the limits' own time."""
    from guard.constants import HARNESS_CONTEXT_HEARTBEAT_MS

    turn = payloads("statusline-2.1.250-sonnet45-oauth.jsonl")[1]
    frames = [(copy.deepcopy(turn), T0 + i * 5000) for i in range(HARNESS_CONTEXT_HEARTBEAT_MS // 5000 + 1)]
    result = _exhaustion_writes(frames)
    assert [w.reason for w in result] == ["bucket", "heartbeat"]
    beat = result[1].record
    assert beat.written_at_ms == T0 + HARNESS_CONTEXT_HEARTBEAT_MS and beat.observed_at_ms > T0  # a redraw
    assert beat.rate_limits_at_ms is not None and beat.rate_limits_at_ms.five_hour == T0


# --- compaction accounting ---------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "tag", "triggers"), [
    ("2.1.250", "", ["manual", "auto"]),
    ("2.1.332", "", ["manual", "auto", "auto"]),
    ("2.1.250", "-sonnet45", ["manual", "auto"]),
    ("2.1.332", "-sonnet45", ["manual", "auto"]),
    ("2.1.250", "-sonnet45-oauth", ["manual", "auto"]),
    ("2.1.332", "-sonnet45-oauth", ["manual", "auto"]),
])  # fmt: skip
def test_each_compaction_counts_once_across_its_three_hook_edges(version: str, tag: str, triggers: list[str]) -> None:
    hooks = [
        p for kind in ("precompact", "sessionstart", "postcompact") for p in payloads(f"{kind}-{version}{tag}.jsonl")
    ]
    edges = [p for p in hooks if p["hook_event_name"] != "SessionStart" or p["source"] == "compact"]
    assert len(edges) == 3 * len(triggers)  # what a counter of every edge would publish
    result = writes(version, tag)
    compactions = [write for write in result if write.reason == "compaction"]
    assert [write.record.compactions for write in compactions] == list(range(1, len(triggers) + 1))
    assert [write.record.last_compaction_trigger for write in compactions] == triggers
    assert result[-1].record.compactions == len(triggers)


@pytest.mark.parametrize("version", VERSIONS)
def test_replay_of_the_lab_session_through_its_times(version: str) -> None:
    result = writes(version)
    times = [line for line in (FIXTURES / f"statusline-{version}.times").read_text().splitlines() if line]
    assert len(result) >= len(times)
    first, last = result[0].record, result[-1].record
    assert first.used_tokens is None and first.window_tokens == 1_000_000
    assert first.observed_at_ms == 1_795_991_988_215 if version == "2.1.250" else first.observed_at_ms > 0
    # The manual compaction is written with the held t3 reading, never re-stamped...
    manual = next(write for write in result if write.reason == "compaction")
    assert manual.record.used_tokens == 754_995 and manual.record.observed_at_ms < manual.record.last_compaction_ms  # type: ignore[operator]
    # ...then the emptied window follows as its own reading.
    after = result[result.index(manual) + 1].record
    assert (after.used_tokens, after.used_percent, after.compactions) == (0, 0, 1)
    # t7 compacts first: its edge carries the held t6 reading (15000, 2%). t7's own 12500 lands in the
    # same 1% tokens bucket, but Claude displays it as 1% (Math.round of 1.25), so it is written too.
    edge = result[-2].record
    assert (result[-2].reason, edge.used_tokens, edge.used_percent) == ("compaction", 15_000, 2)
    assert (result[-1].reason, last.used_tokens, last.used_percent) == ("bucket", 12_500, 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_two_second_refresh_cadence_costs_no_writes_of_its_own(version: str) -> None:
    name = f"refresh2s-statusline-{version}.jsonl"
    assert len(payloads(name)) == 13  # a payload every 2 s whether or not anything happened
    result = fixture_writes("claude", f"claude/{name.removesuffix('.jsonl')}.rec")
    assert [(w.reason, w.record.used_tokens) for w in result] == [("bucket", None), ("bucket", 20001)]


def test_postcompact_alone_counts_once_and_its_siblings_then_do_not() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("statusline-2.1.250.jsonl")[3])
    post, start = payloads("postcompact-2.1.250.jsonl")[0], payloads("sessionstart-2.1.250.jsonl")[1]
    (reading,) = producer.feed(hook(post), T0 + 1)
    assert reading.compaction_edge and reading.fields.compactions == 1
    assert reading.fields.last_compaction_trigger == "manual"
    assert producer.feed(hook(start), T0 + 2) == []
    assert producer.feed(hook(payloads("precompact-2.1.250.jsonl")[0]), T0 + 3) == []  # same prompt_id


def test_sessionstart_compact_alone_counts_once_with_an_unknown_trigger() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("statusline-2.1.332.jsonl")[3])
    (reading,) = producer.feed(hook(payloads("sessionstart-2.1.332.jsonl")[1]), T0 + 1)
    assert reading.fields.compactions == 1 and reading.fields.last_compaction_trigger == "unknown"
    assert producer.feed(hook(payloads("postcompact-2.1.332.jsonl")[0]), T0 + 2) == []


def test_postcompact_moves_last_compaction_ms_to_when_the_window_emptied() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("statusline-2.1.250.jsonl")[3], T0)
    producer.feed(hook(payloads("precompact-2.1.250.jsonl")[0]), T0 + 100)
    assert producer.feed(hook(payloads("postcompact-2.1.250.jsonl")[0]), T0 + 900) == []
    after = read(producer, payloads("statusline-2.1.250.jsonl")[4], T0 + 1000).fields
    assert (after.compactions, after.last_compaction_ms, after.last_compaction_trigger) == (1, T0 + 900, "manual")


def test_edges_without_a_prompt_id_still_count_once_per_compaction() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("statusline-2.1.250.jsonl")[3])
    strip = [{k: v for k, v in p.items() if k != "prompt_id"} for p in (
        payloads("precompact-2.1.250.jsonl")[0], payloads("sessionstart-2.1.250.jsonl")[1],
        payloads("postcompact-2.1.250.jsonl")[0], payloads("precompact-2.1.250.jsonl")[1],
    )]  # fmt: skip
    counts = [[r.fields.compactions for r in producer.feed(hook(p), T0 + i)] for i, p in enumerate(strip)]
    assert counts == [[1], [], [], [2]]


def test_a_compaction_edge_keeps_the_held_readings_time() -> None:
    producer = ClaudeProducer()
    held = read(producer, payloads("statusline-2.1.250.jsonl")[3], T0).fields
    (edge,) = producer.feed(hook(payloads("precompact-2.1.250.jsonl")[0]), T0 + 5000)
    assert edge.compaction_edge
    assert edge.fields.observed_at_ms == T0 and edge.fields.last_compaction_ms == T0 + 5000
    assert edge.fields.used_tokens == held.used_tokens


def test_a_compaction_before_any_reading_rides_the_first_reading() -> None:
    producer = ClaudeProducer()
    assert producer.feed(hook(payloads("precompact-2.1.250.jsonl")[0]), T0) == []
    first = read(producer, payloads("statusline-2.1.250.jsonl")[4], T0 + 10)
    assert first.compaction_edge and first.fields.compactions == 1
    assert not read(producer, payloads("statusline-2.1.250.jsonl")[5], T0 + 20).compaction_edge


def test_subagent_hooks_never_touch_the_record() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("statusline-2.1.250.jsonl")[3])
    for name in ("precompact", "postcompact"):
        subagent = {**payloads(f"{name}-2.1.250.jsonl")[0], "agent_id": "a-123", "agent_type": "general-purpose"}
        assert producer.feed(hook(subagent), T0 + 1) == []
    later = read(producer, payloads("statusline-2.1.250.jsonl")[5]).fields
    assert later.compactions == 0 and later.last_compaction_ms is None


def test_other_hooks_are_inert() -> None:
    producer = ClaudeProducer()
    for payload in payloads("headless-sessionstart-2.1.250.jsonl") + payloads("sessionstart-2.1.250.jsonl")[:1]:
        assert producer.feed(hook(payload), T0) == []
    assert producer.feed(hook({"hook_event_name": "Stop", "session_id": "x"}), T0) == []


def test_custom_instructions_compaction_counts_once() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("extra-rl-edge-statusline-2.1.250.jsonl")[2])
    pre = payloads("extra-custom-instructions-precompact-2.1.250.jsonl")[0]
    post = payloads("extra-custom-instructions-postcompact-2.1.250.jsonl")[0]
    assert pre["custom_instructions"] == "focus on the lab numbers"
    counted = producer.feed(hook(pre), T0 + 1) + producer.feed(hook(post), T0 + 2)
    assert [r.fields.compactions for r in counted] == [1]


# --- recordings and the CLI ---------------------------------------------------------------------------


def test_a_session_recording_places_each_hook_before_the_payload_of_its_prompt() -> None:
    frames = recorded_frames(session("2.1.250"))
    events = [f["payload"].get("hook_event_name", "status") for _, f in frames]
    assert events[:2] == ["SessionStart", "status"]
    compact_at = events.index("PreCompact")
    assert events[compact_at : compact_at + 4] == ["PreCompact", "SessionStart", "PostCompact", "status"]
    stamps = [at for at, _ in frames]
    assert all(isinstance(at, int) for at in stamps)
    assert stamps == sorted(at for at in stamps if at is not None)


def test_a_capture_reads_as_the_very_lines_the_tee_sends() -> None:
    capture = FIXTURES / "precompact-2.1.332.jsonl"
    chunks = chunks_of("claude/precompact-2.1.332.rec")
    assert [chunk.wire for chunk in chunks] == [CHANNEL] * 3
    # Byte for byte what `hctx-hook` sends for each stdin payload: built by the tee's own function.
    assert [chunk.data for chunk in chunks] == [
        channel_line(HOOK_LINE, line) for line in capture.read_bytes().splitlines()
    ]
    assert all(chunk.data.startswith(b'{"type":"claude.hook","payload":{') for chunk in chunks)


def test_the_converter_reads_channel_frames_and_raw_payloads(tmp_path: Path) -> None:
    """scripts/convert_fixtures.py's reader of Claude's captures (the product reads recordings only)."""
    from scripts.capture_readers.claude import read_recording

    channel = tmp_path / "channel.jsonl"
    channel.write_bytes(b'{"type":"claude.statusline","payload":{},"atMs":42}\n{"type":"x","atMs":true}\n')
    assert [(chunk.at_ms, chunk.data) for chunk in read_recording([channel])] == [
        (42, b'{"type":"claude.statusline","payload":{},"atMs":42}\n'),
        (None, b'{"type":"x","atMs":true}\n'),
    ]  # already the channel's bytes: as they are
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b'\n[1]\n{"trunc')
    assert list(read_recording([junk])) == []  # nothing the tee would send


def test_a_recording_split_anywhere_writes_the_same() -> None:
    chunks = chunks_of(session("2.1.332"))
    whole = [outcome(write) for write in replayed(SPEC, chunks)]
    assert whole == [outcome(write) for write in writes("2.1.332")]
    assert [outcome(write) for write in replayed(SPEC, split_at(chunks, range(7, 60_000, 997)))] == whole
    head = chunks[:12]  # every byte its own chunk: a frame split at every boundary at once
    assert [outcome(write) for write in replayed(SPEC, bytewise(head))] == [
        outcome(write) for write in replayed(SPEC, head)
    ]


def test_hctx_replay_on_the_lab_captures() -> None:
    recording = str(recording_path(session("2.1.332")))
    argv = [sys.executable, "-m", "wrapper.cli", "replay", "--harness", "claude", recording]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO, timeout=60)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(line["harness"] == "claude" and "reason" in line for line in lines)
    assert [line["usedTokens"] for line in lines[:4]] == [None, 100005, 305000, 754995]
    # The hooks sit in the session's timeline (the statusline .times), not after it.
    manual = lines[4]
    assert (manual["reason"], manual["compactions"], manual["lastCompactionTrigger"]) == ("compaction", 1, "manual")
    assert manual["observedAtMs"] == 1_795_992_103_930  # t3's payload, 2026-11-29T22:41:43.930Z
    assert manual["lastCompactionMs"] == 1_795_992_108_620  # the post-compaction payload's time
    assert (lines[5]["usedTokens"], lines[5]["compactions"]) == (0, 1)
    assert lines[-1]["compactions"] == 3


def test_a_turn_that_compacts_twice_counts_two_in_any_edge_order() -> None:
    producer = ClaudeProducer()
    read(producer, payloads("statusline-2.1.250.jsonl")[3])
    pre, post = payloads("precompact-2.1.250.jsonl")[0], payloads("postcompact-2.1.250.jsonl")[0]
    start = payloads("sessionstart-2.1.250.jsonl")[1]
    assert pre["prompt_id"] == post["prompt_id"] == start["prompt_id"]
    counts = []
    # The first compaction's edges arrive reordered, the second's in the measured order.
    for at, payload in enumerate([post, pre, start, pre, start, post], start=1):
        counts += [r.fields.compactions for r in producer.feed(hook(payload), T0 + at)]
    assert counts == [1, 2]  # one write per compaction, not per edge and not per prompt


def test_claude_states_no_compaction_point_so_none_is_published() -> None:
    """Issue 18: no Claude channel states its auto-compact point; every captured reading carries null."""
    producer = SPEC.make_producer()
    decoder = SPEC.decoder(CHANNEL)
    readings = [
        reading
        for name in ("claude/statusline-2.1.332.rec", "claude/precompact-2.1.332.rec")
        for chunk in chunks_of(name)
        for event in decoder.receive_data(chunk.data)
        for reading in producer.feed(event, chunk.at_ms or 0)
    ]
    assert readings and {(r.fields.compact_at_tokens, r.fields.auto_compaction) for r in readings} == {(None, None)}
