"""Issue 19 point 1: the record never shows another integer than the harness displays.

The bucket is `floor(used / 1% of window)`, but Claude displays `Math.round` of its own arithmetic
and Codex subtracts a 12,000-token baseline, so the displayed integer moves inside one tokens bucket.
The guard keys a second bucket on the displayed percent (the record's usedPercent, the harness's own
figure, HC-R02), so every status line whose displayed integer differs from the record's is written.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from guard.policy import WriteGuard
from guard.record import HarnessContext
from sidecar.decoding import CHANNEL
from sidecar.harnesses.claude.producer import SPEC, STATUSLINE_TYPE, ClaudeProducer
from sidecar.harnesses.codex.events import STDOUT
from sidecar.harnesses.codex.producer import SPEC as CODEX
from tests.codex_threads import own_producer
from tests.conftest import FIXTURE_ROOT

FIXTURES = FIXTURE_ROOT

T0 = 1_795_990_000_000
# Every verbatim Claude status-line capture: each holds one step where the displayed percent moves
# (2 -> 1) inside one tokens bucket (15000 -> 12500 of 1M; 3000 -> 2500 of 200k).
CLAUDE_CAPTURES = sorted(path.name for path in (FIXTURES / "claude").glob("statusline-*.jsonl"))


def payloads(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / "claude" / name).read_bytes().splitlines() if line.strip()]


def published_after_each(payload_list: list[dict[str, Any]]) -> list[tuple[HarnessContext | None, Any]]:
    """(the record after each status line, the percent Claude displayed in it), one second apart."""
    producer, guard = ClaudeProducer(), WriteGuard("alice", "inc")
    decoder = SPEC.decoder(CHANNEL)
    seen: list[tuple[HarnessContext | None, Any]] = []
    for index, payload in enumerate(payload_list):
        now = T0 + index * 1000
        line = json.dumps({"type": STATUSLINE_TYPE, "payload": payload}).encode() + b"\n"
        (event,) = decoder.receive_data(line)
        for reading in producer.feed(event, now):
            write = guard.offer(reading, now)
            if write is not None:
                guard.committed(write)
        seen.append((guard.last, payload["context_window"]["used_percentage"]))
    return seen


@pytest.mark.parametrize("name", CLAUDE_CAPTURES)
def test_a_claude_capture_never_leaves_the_record_on_another_integer(name: str) -> None:
    seen = published_after_each(payloads(name))
    assert any(displayed is not None for _, displayed in seen)
    for record, displayed in seen:
        assert record is not None
        assert record.used_percent == displayed


def test_claude_moving_from_8_to_9_percent_inside_one_tokens_bucket_is_written() -> None:
    """Composed, stated: the envelope is the verbatim 2.1.332 sonnet-4.5 status line (200k window);
    the usage is the live-measured step of issue 19 (16,800 -> 17,010 tokens, Claude's own
    Math.round: 8 -> 9%), tokens bucket 8 both times."""
    base = next(p for p in payloads("statusline-2.1.332-sonnet45.jsonl") if p["context_window"]["current_usage"])
    assert base["context_window"]["context_window_size"] == 200_000

    def at(total: int, displayed: int) -> dict[str, Any]:
        payload = copy.deepcopy(base)
        window = payload["context_window"]
        window["current_usage"] = {"input_tokens": 3, "output_tokens": 100, "cache_creation_input_tokens": 0,
                                   "cache_read_input_tokens": total - 3}  # fmt: skip
        window["total_input_tokens"] = total
        window["used_percentage"] = displayed
        window["remaining_percentage"] = 100 - displayed
        return payload

    assert [16_800 * 100 // 200_000, 17_010 * 100 // 200_000] == [8, 8]
    (_, _), (record, displayed) = published_after_each([at(16_800, 8), at(17_010, 9)])
    assert record is not None and (record.used_tokens, record.used_percent, displayed) == (17_010, 9, 9)


def test_codex_moving_from_34_to_35_percent_inside_one_tokens_bucket_is_written() -> None:
    """Composed, stated: the verbatim 0.171.0 `thread/tokenUsage/updated` frame with its window set to
    258,400 and `last.totalTokens` to 96,900 then 97,100: tokens bucket 37 both times, Codex's own
    displayed "% context left" 66 then 65 (its 12,000-token baseline), so used 34 then 35."""
    line = next(
        line
        for line in (FIXTURES / "codex" / "codex-0.171.0-stdio-main.jsonl").read_text().splitlines()
        if '"thread/tokenUsage/updated"' in line
    )
    producer, guard = own_producer(json.loads(line)["params"]["threadId"]), WriteGuard("alice", "inc")
    decoder = CODEX.decoder(STDOUT)  # the app-server's stdout, as the tap reads it
    written: list[tuple[int | None, float | None]] = []
    for index, tokens in enumerate((96_900, 97_100)):
        message = json.loads(line)
        usage = message["params"]["tokenUsage"]
        usage["modelContextWindow"] = 258_400
        usage["last"]["totalTokens"] = tokens
        assert tokens * 100 // 258_400 == 37
        (event,) = decoder.receive_data(json.dumps(message).encode() + b"\n")
        (reading,) = producer.feed(event, T0 + index * 1000)
        write = guard.offer(reading, T0 + index * 1000)
        if write is not None:
            guard.committed(write)
            written.append((write.record.used_tokens, write.record.used_percent))
    assert written == [(96_900, 34), (97_100, 35)]
