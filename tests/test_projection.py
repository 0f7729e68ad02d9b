"""The reading projection (HC-R06, HC-R07): the spec's evaluation-order table, row by row."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from guard_factory import wire_bytes

from guard.constants import HARNESS_CONTEXT_FUTURE_SKEW_MS, HARNESS_CONTEXT_STALE_MS
from guard.projection import CONTEXT_KEYS, MAX_RECORD_BYTES, headroom_tokens, read_context
from sidecar.registry import BUILT_IN

NOW = 1_788_000_100_000
LOGGER = "guard.projection"

# The roster's `context` keys as the spec's Exposure section orders them.
EXPOSED_KEYS = (
    "harness", "usedTokens", "windowTokens", "usedPercent", "model", "costUsd",
    "sessionTotalTokens", "rateLimits", "compactions", "lastCompactionMs",
    "lastCompactionTrigger", "compactAtTokens", "autoCompaction", "harnessVersion", "sessionId",
    "account", "rateLimitResetsAtMs", "observedAtMs", "ageMs", "stale", "headroomTokens",
)  # fmt: skip


def _place(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "harness-context"
    path.write_bytes(data)
    return str(path)


def read_wire(path: str, now: int, **options: Any) -> dict[str, Any] | None:
    """The projection as a roster consumer reads it: the typed `Context`'s wire object."""
    context = read_context(path, now, **options)
    return None if context is None else context.wire()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.fixture(autouse=True)
def _capture_warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)


# --- row 1: no record file -> null, never observed -------------------------------------------


def test_no_file_reads_null_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert read_context(str(tmp_path / "harness-context"), NOW) is None
    assert _warnings(caplog) == []


def test_no_agent_directory_reads_null(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert read_context(str(tmp_path / "gone" / "harness-context"), NOW) is None
    assert _warnings(caplog) == []


# --- row 2: unreadable, unparseable, foreign schema -> null, warning logged ------------------


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # must not hang the reader


def _symlink(path: Path) -> None:
    path.with_name("elsewhere").write_bytes(wire_bytes(observedAtMs=NOW))
    path.symlink_to("elsewhere")  # a record is never read through a symlink


@pytest.mark.parametrize("make", [_directory, _fifo, _symlink], ids=["directory", "fifo", "symlink"])
def test_unreadable_record_reads_null_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Callable[[Path], None]
) -> None:
    path = tmp_path / "record-dir" / "harness-context"
    path.parent.mkdir()
    make(path)
    assert read_context(str(path), NOW) is None
    assert any(str(path) in message for message in _warnings(caplog))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file anyway")
def test_permission_denied_reads_null_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _place(tmp_path, wire_bytes(observedAtMs=NOW))
    os.chmod(path, 0)
    assert read_context(path, NOW) is None
    assert any(path in message for message in _warnings(caplog))


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"not json\n", b"\xff\xfe\x00", b"[1, 2]\n", wire_bytes(observedAtMs=NOW)[:-20]],
    ids=["empty", "brace", "text", "binary", "array", "truncated"],
)
def test_unparseable_record_reads_null_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    assert read_context(_place(tmp_path, data), NOW) is None
    assert _warnings(caplog)


def test_oversized_file_reads_null_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = wire_bytes(observedAtMs=NOW, model="m" * (MAX_RECORD_BYTES + 1))
    assert read_context(_place(tmp_path, data), NOW) is None
    assert _warnings(caplog)


@pytest.mark.parametrize(
    "schema", ["com.example.harness-context.v1", "st2.harness-context", "st2.harness-context.v3", None, []]
)
def test_foreign_schema_reads_null_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, schema: Any
) -> None:
    assert read_context(_place(tmp_path, wire_bytes(schema=schema, observedAtMs=NOW)), NOW) is None
    assert any("schema" in message for message in _warnings(caplog))


def test_v2_schema_reads_as_a_reading(tmp_path: Path) -> None:
    data = wire_bytes(schema="st2.harness-context.v2", observedAtMs=NOW - 5)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None and context["ageMs"] == 5


# --- row 3: unrecognized harness -> null, warning logged -------------------------------------


@pytest.mark.parametrize("harness", ["aider", "CLAUDE", None])
def test_unknown_harness_reads_null_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, harness: Any
) -> None:
    path = _place(tmp_path, wire_bytes(harness=harness, observedAtMs=NOW))
    assert read_context(path, NOW, harnesses=BUILT_IN) is None
    assert any("harness" in message for message in _warnings(caplog))


def test_unknown_harness_wins_over_a_stale_reading(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Evaluation order: the harness row comes before the staleness row.
    data = wire_bytes(harness="aider", observedAtMs=NOW - 2 * HARNESS_CONTEXT_STALE_MS)
    assert read_context(_place(tmp_path, data), NOW, harnesses=BUILT_IN) is None
    assert _warnings(caplog)


# --- row 4: future skew -> null --------------------------------------------------------------


def test_reading_past_the_future_skew_reads_null(tmp_path: Path) -> None:
    data = wire_bytes(observedAtMs=NOW + HARNESS_CONTEXT_FUTURE_SKEW_MS + 1)
    assert read_context(_place(tmp_path, data), NOW) is None


def test_reading_far_in_the_future_reads_null(tmp_path: Path) -> None:
    assert read_context(_place(tmp_path, wire_bytes(observedAtMs=NOW * 2)), NOW) is None


def test_reading_exactly_at_the_skew_bound_is_a_reading_aged_zero(tmp_path: Path) -> None:
    data = wire_bytes(observedAtMs=NOW + HARNESS_CONTEXT_FUTURE_SKEW_MS)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None
    assert context["ageMs"] == 0
    assert context["stale"] is False


def test_foreign_schema_wins_over_future_skew(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = wire_bytes(schema="com.example.harness-context.v1", observedAtMs=NOW * 2)
    assert read_context(_place(tmp_path, data), NOW) is None
    assert any("schema" in message for message in _warnings(caplog))


# --- row 5: stale -> the reading, stale: true, with ageMs ------------------------------------


def test_reading_at_the_stale_horizon_is_returned_stale_with_its_age(tmp_path: Path) -> None:
    data = wire_bytes(observedAtMs=NOW - HARNESS_CONTEXT_STALE_MS)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None
    assert context["stale"] is True
    assert context["ageMs"] == HARNESS_CONTEXT_STALE_MS
    assert context["usedTokens"] == 92283  # never derived away


def test_very_old_reading_is_still_returned(tmp_path: Path) -> None:
    age = 30 * 24 * HARNESS_CONTEXT_STALE_MS
    context = read_wire(_place(tmp_path, wire_bytes(observedAtMs=NOW - age)), NOW)
    assert context is not None
    assert (context["stale"], context["ageMs"], context["usedPercent"]) == (True, age, 33)


# --- row 6: otherwise the reading, stale: false, with ageMs ----------------------------------


def test_reading_just_inside_the_horizon_is_fresh(tmp_path: Path) -> None:
    data = wire_bytes(observedAtMs=NOW - HARNESS_CONTEXT_STALE_MS + 1)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None
    assert context["stale"] is False
    assert context["ageMs"] == HARNESS_CONTEXT_STALE_MS - 1


def test_fresh_reading_projects_every_exposed_key_unaltered(tmp_path: Path) -> None:
    data = wire_bytes(harness="pi", usedPercent=585.6, observedAtMs=NOW - 1234, writtenAtMs=NOW - 10)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None
    assert tuple(context) == EXPOSED_KEYS == CONTEXT_KEYS
    source = json.loads(data)
    for key in EXPOSED_KEYS[:-3]:
        assert context[key] == source[key], key
    assert context["usedPercent"] == 585.6  # never clamped
    assert context["ageMs"] == 1234
    assert context["stale"] is False
    assert "incarnation" not in context and "writtenAtMs" not in context


# --- ageMs comes from observedAtMs, never from file mtime ------------------------------------


@pytest.mark.parametrize("mtime_s", [1.0, 999_999_999.5, NOW / 1000 + 86_400 * 365, NOW / 1000 - 7.25])
def test_age_comes_from_observed_at_never_from_mtime(tmp_path: Path, mtime_s: float) -> None:
    path = _place(tmp_path, wire_bytes(observedAtMs=NOW - 42_000))
    os.utime(path, (mtime_s, mtime_s))
    context = read_wire(path, NOW)
    assert context is not None
    assert context["ageMs"] == 42_000
    assert context["stale"] is False


def test_fresh_mtime_does_not_freshen_a_stale_reading(tmp_path: Path) -> None:
    path = _place(tmp_path, wire_bytes(observedAtMs=NOW - 2 * HARNESS_CONTEXT_STALE_MS, writtenAtMs=NOW))
    os.utime(path, (NOW / 1000, NOW / 1000))
    context = read_wire(path, NOW)
    assert context is not None
    assert context["stale"] is True
    assert context["ageMs"] == 2 * HARNESS_CONTEXT_STALE_MS


def test_age_ignores_written_at(tmp_path: Path) -> None:
    # A reading taken 4 minutes before it was written is 4 minutes old, not 0.
    data = wire_bytes(observedAtMs=NOW - 240_000, writtenAtMs=NOW)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None and context["ageMs"] == 240_000


def test_projection_ignores_the_state_record_beside_it(tmp_path: Path) -> None:
    (tmp_path / "harness-state").write_bytes(b"garbage that a state reader would refuse")
    context = read_wire(_place(tmp_path, wire_bytes(observedAtMs=NOW - 1)), NOW)
    assert context is not None and context["ageMs"] == 1


# --- headroom: the harness's own compaction point minus the reading (issue 18) ----------------


def test_headroom_is_compact_at_minus_used_and_null_when_either_is_null(tmp_path: Path) -> None:
    data = wire_bytes(usedTokens=150_000, compactAtTokens=160_000, observedAtMs=NOW)
    context = read_wire(_place(tmp_path, data), NOW)
    assert context is not None and context["compactAtTokens"] == 160_000
    assert context["headroomTokens"] == headroom_tokens(context["compactAtTokens"], context["usedTokens"]) == 10_000
    assert headroom_tokens(160_000, 175_900) == -15_900  # past it: not clamped
    assert headroom_tokens(None, 1) is None
    assert headroom_tokens(160_000, None) is None
    assert headroom_tokens(True, 0) is None  # a JSON true is no count
    assert headroom_tokens(None, None) is None


def test_a_record_from_before_compact_at_reads_as_not_stated(tmp_path: Path) -> None:
    source = json.loads(wire_bytes(observedAtMs=NOW))
    del source["compactAtTokens"], source["autoCompaction"]
    context = read_wire(_place(tmp_path, json.dumps(source).encode()), NOW)
    assert context is not None
    assert (context["compactAtTokens"], context["autoCompaction"], context["headroomTokens"]) == (None, None, None)
