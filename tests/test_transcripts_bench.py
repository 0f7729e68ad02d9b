"""scripts/bench_write_policy.py: the spec's write-policy table on replayable traces."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from guard.policy import WriteGuard

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_write_policy.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_write_policy", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_policy_under_test_is_the_shipped_write_guard(bench: ModuleType) -> None:
    shipped = bench.Shipped()
    assert type(shipped.guard) is WriteGuard
    assert shipped.name == "bucket 1% + 300 s heartbeat"
    names = [make().name for make in bench.POLICIES]
    assert names[:6] == [
        "every distinct reading",
        "turn boundary only",
        "movement guard 5% / 60 s",
        "movement guard 1% / 60 s",
        "bucket 5% + 300 s heartbeat",
        "bucket 1% + 300 s heartbeat",
    ]


def longest_turn_ms(trace: object) -> int:
    """From a turn's first reading to its turn end (idle time between turns is no turn)."""
    longest, start = 0, None
    for event in trace.events:  # type: ignore[attr-defined]
        if event.reading is not None and start is None:
            start = event.at_ms
        if event.turn_end and start is not None:
            longest, start = max(longest, event.at_ms - start), None
    return longest


def test_synthetic_sessions_are_long_chatty_and_compact(bench: ModuleType) -> None:
    windows = bench.shipped_model_table()
    codex = bench.codex_rollout_trace("s", bench.synthetic_codex_rollout(7, 30.0))
    claude = bench.claude_transcript_trace("s", bench.synthetic_claude_transcript(8, 30.0), windows)
    for trace, least_readings in ((codex, 2000), (claude, 500)):
        readings = [event for event in trace.events if event.reading is not None and not event.compaction]
        span_h = (trace.events[-1].at_ms - trace.events[0].at_ms) / 3_600_000
        assert span_h >= 20, span_h
        assert len(readings) >= least_readings
        assert sum(event.compaction for event in trace.events) >= 5
        assert longest_turn_ms(trace) >= 3_600_000  # the wedge: a single turn of an hour or more


def test_the_shipped_policy_misses_no_warning_on_occupancy_and_turn_boundary_does(bench: ModuleType) -> None:
    windows = bench.shipped_model_table()
    traces = {
        "codex": [bench.codex_rollout_trace(str(i), bench.synthetic_codex_rollout(i, 12.0)) for i in range(3)],
        "claude": [
            bench.claude_transcript_trace(str(i), bench.synthetic_claude_transcript(i, 12.0), windows) for i in range(3)
        ],
    }
    occupancy = next(iter(bench.MEASURES))
    for group in traces.values():
        shipped, turn = bench.Score(), bench.Score()
        for trace in group:
            bench.evaluate(trace, bench.Shipped(), shipped)
            bench.evaluate(trace, bench.TurnBoundary(), turn)
        assert sum(shipped.eligible[occupancy].values()) > 0
        assert all(shipped.missed[occupancy][t] == 0 for t in bench.THRESHOLDS)
        assert turn.missed[occupancy][80] / turn.eligible[occupancy][80] > 0.5
        assert shipped.writes < sum(1 for t in group for e in t.events if e.reading is not None)


def test_the_lab_app_server_and_rollout_traces_agree(bench: ModuleType) -> None:
    capture = Path(__file__).resolve().parent.parent / "fixtures" / "codex" / "codex-0.151.0-stdio-main.jsonl"
    served = bench.codex_app_server_trace(capture)
    readings = [e.reading for e in served.events if e.reading and not e.compaction]
    # A rate-limit snapshot re-sends the reading it rides on (same observedAtMs): not a new one.
    taken = [reading.fields.used_percent for reading in readings if not reading.rate_limits_edge]
    assert taken == [10, 44, 44, 45, 0, 5, 92, 92, 93, 0, 4]
    assert len(readings) - len(taken) == 7  # one per snapshot that changed Codex's limits


def test_the_command_prints_both_tables_per_harness(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--synthetic", "1", "--hours", "4", "--no-lab"]) == 0
    out = capsys.readouterr().out
    assert "## codex (synthetic)" in out and "## claude (synthetic)" in out
    assert "writes/h/agent" in out and "error p95" in out
    assert " ".join(f"{t:>5}" for t in range(80, 98)) in out
    assert out.count("bucket 1% + 300 s heartbeat") >= 6
