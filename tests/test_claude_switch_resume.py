"""Issue 37, points 4 and 5, measured on 2.1.332 (tests/live/test_claude_switch_resume_live.py,
fixtures/claude/switch-resume-2.1.332/): what hctx already publishes at a model switch and on a
resume, from the status line alone, and why the hooks' `context_tokens` is not read."""

from __future__ import annotations

import json

from sidecar.harnesses.claude import producer as claude
from sidecar.replay import replay_recording
from tests.conftest import FIXTURE_ROOT

MEASURED = FIXTURE_ROOT / "claude" / "switch-resume-2.1.332"


def hooks() -> dict[str, dict[str, object]]:
    lines = (MEASURED / "hooks.jsonl").read_bytes().splitlines()
    return {f"{p['hook_event_name']}:{p.get('source')}": p for p in map(json.loads, lines)}


def test_at_a_model_switch_the_status_line_states_the_new_window_once() -> None:
    writes, summary = replay_recording(claude.SPEC, MEASURED / "switch.rec")
    assert not summary.problems
    windows = [(w.record.model, w.record.window_tokens) for w in writes if w.record.used_tokens is not None]
    assert windows == [("claude-sonnet-4-5", 200_000), ("claude-opus-5-5", 1_000_000)]
    switch = hooks()["PostModelSwitch:command"]
    assert (switch["from_model"], switch["to_model"]) == ("claude-sonnet-4-5", "claude-opus-5-5")
    # The hook states no window, and its context_tokens is prompt + output, not the record's prompt.
    assert not any("window" in key for key in switch)
    assert switch["context_tokens"] == 20_112 != writes[-1].record.used_tokens == 20_001


def test_a_resumed_session_states_its_occupancy_before_its_first_turn() -> None:
    writes, _ = replay_recording(claude.SPEC, MEASURED / "resume.rec")
    assert writes[-1].record.used_tokens == 20_001 and writes[-1].record.window_tokens == 1_000_000
    assert hooks()["SessionStart:resume"]["context_tokens"] == 20_112  # prompt + output: not read
