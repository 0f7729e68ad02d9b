"""sidecar.transcripts on the lab's verbatim transcripts and rollouts, and on hostile bytes.

Lab captures (fixtures/transcripts/, copied unchanged from ../shared/lab/claude/captures and
../shared/lab/codex/captures/codex-<V>/): Claude Code 2.1.250 and 2.1.332 sessions, and the
`token_count` / `compacted` lines of codex-cli 0.151.0 and 0.171.0 rollouts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.harnesses.claude.transcript import claude_usage, read_claude_tail
from sidecar.harnesses.codex.events import RateLimitsUpdated, TokenUsage
from sidecar.harnesses.codex.producer import CodexProducer
from sidecar.harnesses.codex.transcript import read_codex_tail, rollout_event, tail_events
from sidecar.transcripts import MAX_LINE_BYTES, TAIL_BUDGET_BYTES, BackwardLines, forward_lines
from tests.conftest import FIXTURE_ROOT

FIXTURES = FIXTURE_ROOT / "transcripts"
CLAUDE_VERSIONS = ("2.1.250", "2.1.332")
CODEX_VERSIONS = ("0.151.0", "0.171.0")


def lines_of(data: bytes, **kwargs: int) -> BackwardLines:
    return BackwardLines(lambda offset, size: data[offset : offset + size], len(data), **kwargs)


def claude_fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# ---------------------------------------------------------------------------------------------
# Claude: the latest main-chain assistant usage, compact_boundary lines


@pytest.mark.parametrize("version", CLAUDE_VERSIONS)
def test_claude_200k_session_reads_the_last_reply_prompt_side(version: str) -> None:
    data = claude_fixture(f"transcript-{version}-sonnet45.jsonl")
    assert f'"version":"{version}"'.encode() in data
    tail = read_claude_tail(lines_of(data))
    assert tail.usage is not None
    # t7 of the lab script: usage=2500,0,0,20 -> input + cache_read + cache_creation.
    assert tail.usage.used_tokens == 2500
    assert tail.usage.used_tokens != 2520  # output tokens are the reply, not the prompt
    assert tail.usage.model == "claude-sonnet-4-5"
    # One /compact (manual) and one reactive auto-compaction, as the hooks of the same run said.
    assert tail.compactions == 2
    assert tail.latest_compaction is not None
    assert tail.latest_compaction.trigger == "auto"
    assert tail.latest_compaction.pre_tokens == 3042
    assert tail.latest_compaction.offset < tail.usage.offset  # the reading is after it, not stale


def test_claude_1m_sessions_name_the_model_the_transcript_carries() -> None:
    tail_250 = read_claude_tail(lines_of(claude_fixture("transcript-2.1.250.jsonl")))
    tail_332 = read_claude_tail(lines_of(claude_fixture("transcript-2.1.332.jsonl")))
    assert tail_250.usage is not None and tail_332.usage is not None
    assert tail_250.usage.used_tokens == 12500 == tail_332.usage.used_tokens  # SCALE=5: 2500 x 5
    # 2.1.250 wrote the API model id without its [1m] tier: the window is not in the transcript.
    assert tail_250.usage.model == "claude-opus-5"
    # 2.1.332 writes `requestedModel`, the id the session asked for.
    assert tail_332.usage.model == "claude-opus-5-5"
    assert tail_332.compactions == 3
    assert tail_250.compactions == 2


def _assistant(
    tokens: int, *, sidechain: bool = False, stamp: str = "2026-11-29T22:00:00.000Z", **extra: object
) -> str:
    line = {
        "type": "assistant",
        "isSidechain": sidechain,
        "timestamp": stamp,
        "message": {"model": "claude-sonnet-4-5", "usage": {"input_tokens": tokens, "output_tokens": 9}},
        **extra,
    }
    return json.dumps(line)


def _boundary(trigger: str = "manual") -> str:
    return json.dumps({
        "type": "system",
        "subtype": "compact_boundary",
        "timestamp": "2026-11-29T22:01:00.000Z",
        "compactMetadata": {"trigger": trigger, "preTokens": 150000, "postTokens": 900},
    })  # fmt: skip


def test_a_sidechain_or_api_error_message_is_not_the_main_window() -> None:
    data = "\n".join([
        _assistant(1000),
        _assistant(90000, sidechain=True),
        _assistant(0, isApiErrorMessage=True),
        _assistant(0, message={"model": "<synthetic>", "usage": {"input_tokens": 0}}),
    ]).encode()  # fmt: skip
    tail = read_claude_tail(lines_of(data))
    assert tail.usage is not None and tail.usage.used_tokens == 1000


def test_compact_leaves_the_previous_reading_until_the_next_reply() -> None:
    data = "\n".join([_assistant(150000), _boundary("manual")]).encode()
    tail = read_claude_tail(lines_of(data))
    assert tail.usage is not None and tail.usage.used_tokens == 150000  # stale, as the decision record accepts
    assert tail.latest_compaction is not None and tail.latest_compaction.offset > tail.usage.offset
    assert tail.latest_compaction.trigger == "manual" and tail.latest_compaction.post_tokens == 900
    unknown = read_claude_tail(lines_of(_boundary("sideways").encode()))
    assert unknown.latest_compaction is not None and unknown.latest_compaction.trigger == "unknown"


def test_a_session_without_a_reply_has_no_reading() -> None:
    tail = read_claude_tail(lines_of(b'{"type":"user","message":{"content":"hi"}}\n'))
    assert tail.usage is None and tail.compactions == 0


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": "12"},
        {"input_tokens": True},
        {"input_tokens": -1},
        {"input_tokens": 1.5},
        {"input_tokens": 2**70},
        {"input_tokens": None},
        {"input_tokens": 1, "cache_read_input_tokens": "x"},
        [],
        "usage",
    ],
)
def test_wrong_types_yield_no_reading(usage: object) -> None:
    line = {"type": "assistant", "timestamp": "2026-11-29T22:00:00Z", "message": {"usage": usage}}
    assert claude_usage(json.dumps(line).encode()) is None


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"assistant","message":{"usage":{"input_tokens":5',  # truncated mid-write
        b'{"type":"assistant","timestamp":"2026-11-29T22:00:00","message":{"usage":{"input_tokens":5}}}',  # no zone
        b'{"type":"assistant","timestamp":"yesterday","message":{"usage":{"input_tokens":5}}}',
        b'{"type":"assistant","message":{"usage":{"input_tokens":NaN}}}',
        b"[" * 100_000 + b'"assistant" "usage"',
        b'\xff\xfe garbage "assistant" "usage"',
        b'"assistant" "usage"',
    ],
)
def test_hostile_lines_yield_no_reading(line: bytes) -> None:
    assert claude_usage(line) is None
    assert read_claude_tail(lines_of(line + b"\n" + line)).usage is None


def test_a_huge_line_is_skipped_and_the_reading_behind_it_found() -> None:
    huge = b'{"type":"user","content":"' + b"x" * (MAX_LINE_BYTES + 10) + b'"}'
    data = (_assistant(4242) + "\n").encode() + huge + b"\n"
    tail = read_claude_tail(lines_of(data))
    assert tail.usage is not None and tail.usage.used_tokens == 4242


# ---------------------------------------------------------------------------------------------
# Reading from the end


@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=40),
    st.integers(1, 64),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_backward_lines_are_the_forward_lines_reversed(pieces: list[bytes], block: int, final_newline: bool) -> None:
    data = b"\n".join(pieces) + (b"\n" if final_newline else b"")
    backward = list(lines_of(data, block=block, max_line=30))
    assert backward == list(reversed(list(forward_lines(data, max_line=30))))


def test_the_budget_bounds_the_bytes_read_and_makes_a_count_unknown() -> None:
    line = (_boundary() + "\n").encode()
    data = line * 10_000
    reads: list[int] = []

    def read_at(offset: int, size: int) -> bytes:
        reads.append(size)
        return data[offset : offset + size]

    lines = BackwardLines(read_at, len(data), budget=64 * 1024)
    tail = read_claude_tail(lines)
    assert sum(reads) <= 64 * 1024
    assert tail.compactions is None  # the start was never reached: no count, rather than a low one
    assert tail.latest_compaction is not None
    assert read_claude_tail(lines_of(data)).compactions == 10_000


def _virtual_file(tail: bytes, size: int) -> tuple[BackwardLines, list[int]]:
    """A `size`-byte transcript of repeated assistant lines ending in `tail`, never materialised."""
    filler = (_assistant(777) + "\n").encode()
    body = size - len(tail)
    reads: list[int] = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append(length)
        out = bytearray()
        position = offset
        while len(out) < length:
            if position >= body:
                out += tail[position - body : position - body + length - len(out)]
                break
            start = position % len(filler)
            piece = filler[start : start + min(length - len(out), body - position)]
            out += piece
            position += len(piece)
        return bytes(out)

    return BackwardLines(read_at, size), reads


@pytest.mark.parametrize("size", [1 << 30, 1 << 40])
def test_a_1gb_or_1tb_transcript_costs_what_its_tail_costs(size: int) -> None:
    lines, reads = _virtual_file(("\n" + _assistant(123456) + "\n").encode(), size)
    tail = read_claude_tail(lines)
    assert tail.usage is not None and tail.usage.used_tokens == 123456
    assert sum(reads) <= TAIL_BUDGET_BYTES  # what its tail costs, whatever the size (in milliseconds)
    assert tail.compactions is None


def test_a_real_1gb_sparse_file_is_read_only_at_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("wb") as handle:
        handle.truncate(1 << 30)  # a 1 GB hole: no newline in it, so one oversized "line"
        handle.seek(1 << 30)
        handle.write(b"\n" + claude_fixture("transcript-2.1.332-sonnet45.jsonl"))
    fd = os.open(path, os.O_RDONLY)
    try:
        lines = BackwardLines(lambda offset, size: os.pread(fd, size, offset), os.fstat(fd).st_size)
        tail = read_claude_tail(lines)
    finally:
        os.close(fd)
    assert os.path.getsize(path) > 1 << 30
    assert tail.usage is not None and tail.usage.used_tokens == 2500
    assert lines.bytes_read <= TAIL_BUDGET_BYTES


# ---------------------------------------------------------------------------------------------
# Codex rollouts


def rollout_lines(version: str, name: str = "rollout-token-events.jsonl") -> list[bytes]:
    return (FIXTURES / f"codex-{version}" / name).read_bytes().splitlines()


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_token_count_becomes_the_app_server_pair(version: str) -> None:
    first = rollout_event(rollout_lines(version)[1], 0, "thread")  # turn 2: 90,800 of 190,000
    assert first is not None and first.kind == "token_count"
    usage, limits = first.events  # the app-server's two notifications' events, in its order
    assert isinstance(usage, TokenUsage) and usage.thread_id == "thread"
    assert (usage.tokens_in_window, usage.session_total_tokens, usage.context_window) == (90800, 121300, 190000)
    assert isinstance(limits, RateLimitsUpdated) and limits.primary is not None
    # The rollout keeps Codex's float 17.5; the v2 notification carries round() as i32 = 18.
    assert limits.primary.used_percent == 18


def test_token_count_without_info_carries_no_usage() -> None:
    line = json.dumps({
        "timestamp": "2026-11-29T22:31:11.297Z",
        "type": "event_msg",
        "payload": {"type": "token_count", "info": None, "rate_limits": {"primary": {"used_percent": 3.0}}},
    }).encode()  # fmt: skip
    event = rollout_event(line, 0, "t")
    assert event is not None
    assert [type(item) for item in event.events] == [RateLimitsUpdated]


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "token_count", "info": {"last_token_usage": {"total_tokens": "5"}}},
        {"type": "token_count", "info": {"total_token_usage": {"total_tokens": -5}, "last_token_usage": {}}},
        {"type": "token_count", "info": "none"},
        {"type": "token_count", "rate_limits": {"primary": {"used_percent": "NaN"}}},
        {"type": "token_count", "info": None, "rate_limits": {"primary": {"used_percent": 1e400}}},
    ],
)
def test_hostile_token_counts_are_dropped(payload: dict[str, object]) -> None:
    line = json.dumps({"timestamp": "2026-11-29T22:31:11Z", "type": "event_msg", "payload": payload}).encode()
    event = rollout_event(line, 0, "t")
    assert event is None or event.events == ()


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    read_claude_tail(lines_of(data))
    read_codex_tail(lines_of(data), "t")
    for offset, line in forward_lines(data):
        rollout_event(line, offset, "t")
        rollout_event(b'"token_count"' + line, offset, "t")


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_codex_tail_through_the_producer(version: str) -> None:
    lines = [
        line
        for line in rollout_lines(version)
        if json.loads(line)["file"].endswith("01a2296f-0383-7d63-ae7b-88a8d43eee9a.jsonl") or version != "0.151.0"
    ]
    data = b"\n".join(lines) + b"\n"
    tail = read_codex_tail(lines_of(data), "thread")
    producer = CodexProducer()
    for at_ms, frame in tail_events(tail):
        producer.feed(frame, at_ms or 0)
    reading = producer.held.reading
    assert reading is not None
    assert reading.window_tokens == 190000
    assert tail.compactions is not None and tail.compactions >= 2
    if version == "0.151.0":
        # The resumed turn: 0.151.0 restarts the cumulative total (lab/codex §5).
        assert (reading.used_tokens, reading.session_total_tokens, reading.used_percent) == (22300, 22300, 6)
        assert reading.used_percent != round(22300 / 190000 * 100)  # the naive ratio, 12
    else:
        assert reading.used_tokens in {18250, 22300}


def test_a_broken_rate_limit_block_does_not_cost_the_usage() -> None:
    info = {
        "total_token_usage": {"total_tokens": 9},
        "last_token_usage": {"total_tokens": 7},
        "model_context_window": 9,
    }
    payload = {"type": "token_count", "info": info, "rate_limits": {"primary": {"used_percent": "10"}}}
    line = json.dumps({"timestamp": "2026-11-29T22:31:11Z", "type": "event_msg", "payload": payload}).encode()
    event = rollout_event(line, 0, "t")
    assert event is not None
    assert [type(item) for item in event.events] == [TokenUsage]


def test_compactions_too_long_to_parse_are_still_counted() -> None:
    filler = b"z" * (MAX_LINE_BYTES + 3)
    compact = json.dumps(json.loads(_boundary()), separators=(",", ":")).encode()  # as Claude Code writes JSON
    claude = compact[:-1] + b',"pad":"' + filler + b'"}\n' + (_assistant(5) + "\n").encode()
    tail = read_claude_tail(lines_of(claude))
    assert tail.compactions == 1 and tail.usage is not None and tail.usage.used_tokens == 5
    codex = (
        b'{"timestamp":"2026-11-29T22:31:12.640Z","type":"compacted","payload":{"h":"'
        + filler
        + b'"}}\n'
        + rollout_lines("0.151.0")[0]
        + b"\n"
    )
    codex_tail = read_codex_tail(lines_of(codex), "t")
    assert codex_tail.compactions == 1 and codex_tail.latest_compaction_ms == 1795991472640
    # A message body that merely quotes the words is not a compaction: its quotes are escaped.
    quoted = json.dumps(
        {"type": "user", "text": '"subtype":"compact_boundary" "type":"compacted"' + "q" * MAX_LINE_BYTES}
    )
    assert read_claude_tail(lines_of(quoted.encode() + b"\n")).compactions == 0
    assert read_codex_tail(lines_of(quoted.encode() + b"\n"), "t").compactions == 0


@given(
    st.lists(st.integers(0, 90).map(lambda n: b"k" * n), max_size=30),
    st.integers(1, 64),
)
@settings(max_examples=200, deadline=None)
def test_skipped_heads_start_where_the_long_lines_start(lengths: list[bytes], block: int) -> None:
    data = b"\n".join(lengths) + b"\n"
    lines = lines_of(data, block=block, max_line=40)
    kept = list(lines)
    expected_skipped = [(o, line[:1024]) for o, line in forward_lines(data, max_line=10**9) if len(line) > 40]
    assert sorted(lines.skipped_heads) == expected_skipped
    assert sorted(kept) == [(o, line) for o, line in forward_lines(data, max_line=40)]


@given(
    st.lists(st.text(alphabet="aM", max_size=30).map(str.encode), max_size=60),
    st.integers(1, 40),
)
@settings(max_examples=300, deadline=None)
def test_passing_over_blocks_without_a_marker_loses_no_line_that_has_one(pieces: list[bytes], block: int) -> None:
    data = b"\n".join(pieces) + b"\n"
    lines = lines_of(data, block=block, max_line=1000)
    lines.only_containing = (b"MM",)
    found = [(offset, line) for offset, line in lines if b"MM" in line]
    expected = [(offset, line) for offset, line in forward_lines(data) if b"MM" in line]
    assert found == list(reversed(expected))


@given(
    st.lists(st.text(alphabet="aMk", max_size=50).map(str.encode), max_size=60),
    st.integers(1, 70),
)
@settings(max_examples=300, deadline=None)
def test_marker_mode_keeps_the_long_line_rule(pieces: list[bytes], block: int) -> None:
    data = b"\n".join(pieces) + b"\n"
    lines = lines_of(data, block=block, max_line=20)
    lines.only_containing = (b"MM",)
    found = [(offset, line) for offset, line in lines if b"MM" in line]
    assert found == list(reversed([(o, line) for o, line in forward_lines(data, max_line=20) if b"MM" in line]))
    long_with_marker = {o for o, line in forward_lines(data, max_line=10**9) if len(line) > 20 and b"MM" in line}
    assert long_with_marker <= {offset for offset, _ in lines.skipped_heads}
