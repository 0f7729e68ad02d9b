"""Hostile transcripts through `hctx scan`'s readers: a row for every file, never a traceback.

Whatever a Claude session file or a Codex rollout holds — huge, negative, non-finite or mistyped
numbers, wrong shapes, counts past 2**53 — the session reads as a row whose numbers are the file's
own and within the record's range (JSON readers keep 2**53 exact), or null with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.record import MAX_COUNT
from sidecar.harnesses.claude.windows import shipped_model_table
from tests.hostile import json_values, numbers
from wrapper.readers.scan import SessionFile, read_session

NOW = 1_795_992_227_928
TABLE = shipped_model_table()
COUNT_KEYS = ("usedTokens", "windowTokens", "sessionTotalTokens", "compactions",
              "lastCompactionPreTokens", "lastCompactionPostTokens")  # fmt: skip
# Around the edge of the range, besides everything `numbers` holds.
counts = st.integers(min_value=MAX_COUNT - 2, max_value=MAX_COUNT + 2) | numbers
stamps = st.sampled_from(["2026-11-29T22:00:00Z", "9999-12-31T23:59:59+00:00", "1970-01-01T00:00:00+14:00", "x"])
anything = json_values | counts

claude_lines = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["assistant", "system"]) | anything,
        "timestamp": stamps | anything,
        "message": st.fixed_dictionaries(
            {
                "model": st.sampled_from(["claude-sonnet-4-5", "<synthetic>", "m" * 300]) | anything,
                "usage": st.fixed_dictionaries(
                    {"input_tokens": counts, "cache_read_input_tokens": counts, "cache_creation_input_tokens": counts}
                )
                | anything,
            }
        )
        | anything,
    },
    optional={
        "subtype": st.just("compact_boundary") | anything,
        "compactMetadata": st.fixed_dictionaries(
            {"trigger": st.sampled_from(["auto", "manual", "x"]) | anything, "preTokens": counts, "postTokens": counts}
        )
        | anything,
        "isSidechain": st.booleans() | anything,
        "isApiErrorMessage": st.booleans() | anything,
        "requestedModel": anything,
    },
)

_USAGE_KEYS = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens",
               "reasoning_output_tokens", "total_tokens")  # fmt: skip
_usage = st.fixed_dictionaries(dict.fromkeys(_USAGE_KEYS, counts))
_window = st.fixed_dictionaries(
    {"used_percent": counts, "window_minutes": st.sampled_from([300, 10080]) | counts, "resets_at": counts}
)
codex_lines = st.one_of(
    st.fixed_dictionaries(
        {
            "timestamp": stamps,
            "type": st.just("event_msg"),
            "payload": st.fixed_dictionaries(
                {
                    "type": st.just("token_count"),
                    "info": st.fixed_dictionaries(
                        {"total_token_usage": _usage, "last_token_usage": _usage, "model_context_window": counts}
                    )
                    | anything,
                    "rate_limits": st.fixed_dictionaries({"primary": _window, "secondary": _window}) | anything,
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "timestamp": stamps | anything,
            "type": st.sampled_from(["compacted", "turn_context", "session_meta", "event_msg"]),
            "payload": st.fixed_dictionaries({"model": anything, "id": anything, "type": anything}),
        }
    ),
)


def _row(path: Path, harness: str, lines: list[Any], modified_ms: int) -> dict[str, Any]:
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    row = read_session(SessionFile(harness, path, modified_ms), TABLE)  # type: ignore[arg-type]
    wire = row.wire(NOW)
    json.dumps(wire, allow_nan=False)  # what `--json` prints: finite, serialisable
    for key in COUNT_KEYS:
        assert wire.get(key) is None or 0 <= wire[key] <= MAX_COUNT, (key, wire[key])
    percent = wire["usedPercent"]
    assert percent is None or percent >= 0
    assert row.problem is None or isinstance(row.problem, str)
    return wire


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])  # fmt: skip
@given(lines=st.lists(claude_lines, min_size=1, max_size=5), modified_ms=st.integers(0, 2**45))
def test_hostile_claude_sessions_read_as_a_row(tmp_path: Path, lines: list[Any], modified_ms: int) -> None:
    _row(tmp_path / "11111111-1111-1111-1111-111111111111.jsonl", "claude", lines, modified_ms)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])  # fmt: skip
@given(lines=st.lists(codex_lines, min_size=1, max_size=5), modified_ms=st.integers(0, 2**45))
def test_hostile_codex_rollouts_read_as_a_row(tmp_path: Path, lines: list[Any], modified_ms: int) -> None:
    _row(tmp_path / "rollout-2026-11-29T22-31-10-x.jsonl", "codex", lines, modified_ms)


@given(count=st.integers(min_value=MAX_COUNT + 1, max_value=2**63 - 1))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_reply_past_2_53_is_null_and_says_why(tmp_path: Path, count: int) -> None:
    reply = {"type": "assistant", "timestamp": "2026-11-29T22:00:00Z",
             "message": {"model": "claude-sonnet-4-5", "usage": {"input_tokens": count}}}  # fmt: skip
    wire = _row(tmp_path / "s.jsonl", "claude", [reply], NOW)
    assert wire["usedTokens"] is None and wire["usedPercent"] is None
    assert wire["problem"] == f"usedTokens {count} is out of range (above 2**53); shown as null"
