"""Issue 37: Claude's own compaction point where `autoCompactWindow` is stated
(sidecar.harnesses.claude.compaction quotes the rule from the bundled code of both builds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.harnesses.claude import producer as claude
from sidecar.harnesses.claude.compaction import ClaudeCompaction, compact_at
from sidecar.harnesses.claude.launch import SETTINGS_PATH, compaction_settings, subagent_transport, take_seat
from sidecar.launching import LaunchPlan
from sidecar.replay import replay_recording
from tests.conftest import FIXTURE_ROOT

FIXTURES = FIXTURE_ROOT / "claude"


@pytest.mark.parametrize("version", ["2.1.250", "2.1.332"])
def test_the_live_session_compacted_where_the_record_said_it_would(version: str) -> None:
    """Recorded live (tests/live/test_claude_compact_window_live.py): `autoCompactWindow` 150,000 on
    Claude's 200,000 window; the turn after 116,000 went out uncompacted, the turn after 117,000
    compacted first. Every reading before it said 117,000."""
    writes, summary = replay_recording(claude.SPEC, FIXTURES / f"compact-window-{version}.rec")
    assert not summary.problems
    records = [write.record for write in writes]
    before = [r for r in records if r.compactions == 0 and r.window_tokens is not None]
    assert before and {(r.compact_at_tokens, r.auto_compaction, r.window_tokens) for r in before} == {
        (117_000, True, 200_000)
    }
    assert max(r.used_tokens or 0 for r in before) == 117_000  # reached, and only then compacted
    assert records[-1].compactions == 1 and records[-1].last_compaction_trigger == "auto"


@pytest.mark.parametrize(
    ("settings", "window", "point"),
    [
        (ClaudeCompaction(enabled=True, configured_window=150_000), 200_000, 117_000),
        (ClaudeCompaction(enabled=True, configured_window=500_000), 200_000, 167_000),  # the model's is smaller
        (ClaudeCompaction(enabled=True, configured_window=150_000, pct_override=50), 200_000, 65_000),
        (ClaudeCompaction(enabled=True, configured_window=150_000, pct_override=99), 200_000, 117_000),
        (ClaudeCompaction(enabled=True, configured_window=150_000, max_output_tokens=8_000), 200_000, 129_000),
        (ClaudeCompaction(enabled=True, configured_window=150_000, max_output_tokens=64_000), 200_000, 117_000),
        (ClaudeCompaction(enabled=True, configured_window=150_000), None, None),  # no window stated
        (ClaudeCompaction(enabled=True), 200_000, None),  # Claude picks the window itself
        (ClaudeCompaction(enabled=False), 200_000, None),
        (None, 200_000, None),
    ],
)
def test_claudes_rule(settings: ClaudeCompaction | None, window: int | None, point: int | None) -> None:
    assert compact_at(settings, window) == point


def seat(tmp_path: Path, *, local: object = None, project: object = None, user: object = None) -> LaunchPlan:
    """A seat whose settings files hold these `autoCompactWindow` values (None: no such file)."""
    home, cwd = tmp_path / "home", tmp_path / "work"
    (home / ".claude").mkdir(parents=True)
    (cwd / ".claude").mkdir(parents=True)
    for path, value in ((cwd / SETTINGS_PATH, local), (cwd / ".claude" / "settings.json", project),
                        (home / ".claude" / "settings.json", user)):  # fmt: skip
        if value is not None:
            path.write_text(json.dumps(value))
    return LaunchPlan(harness="claude", argv=("claude",), cwd=cwd, env={"HOME": str(home)})


def read(plan: LaunchPlan) -> ClaudeCompaction | None:
    return compaction_settings(plan, take_seat(plan.cwd, plan.owner_pid))


@pytest.fixture(autouse=True)
def _no_claude_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
                 "DISABLE_COMPACT", "CLAUDE_CONFIG_DIR"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_the_winning_settings_file_states_the_window(tmp_path: Path) -> None:
    plan = seat(tmp_path, local={"autoCompactWindow": 300_000}, project={"autoCompactWindow": 400_000},
                user={"autoCompactWindow": 500_000})  # fmt: skip
    assert read(plan) == ClaudeCompaction(enabled=True, configured_window=300_000)
    # hctx's own rendering of the local file is not the user's: what the seat recorded is read.
    assert read(plan) == ClaudeCompaction(enabled=True, configured_window=300_000)


def test_a_value_claude_drops_falls_through_to_the_next_file(tmp_path: Path) -> None:
    plan = seat(tmp_path, local={"autoCompactWindow": 50_000}, project={"autoCompactWindow": "200k"},
                user={"autoCompactWindow": 250_000})  # fmt: skip
    assert read(plan) == ClaudeCompaction(enabled=True, configured_window=250_000)


def test_the_environment_variable_wins_capped_and_raised_as_claude_does(tmp_path: Path) -> None:
    plan = seat(tmp_path, user={"autoCompactWindow": 250_000})
    for raw, configured in (("160000", 160_000), ("5000000", 1_000_000), ("20", 100_000)):
        env = {**plan.env, "CLAUDE_CODE_AUTO_COMPACT_WINDOW": raw}
        assert compaction_settings(
            LaunchPlan(harness="claude", argv=("claude",), cwd=plan.cwd, env=env), take_seat(plan.cwd, plan.owner_pid)
        ) == ClaudeCompaction(enabled=True, configured_window=configured)


@pytest.mark.parametrize(
    ("env", "user"),
    [
        ({"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "150k"}, {"autoCompactWindow": 250_000}),  # parsed leniently by Claude
        ({"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "50%"}, {"autoCompactWindow": 250_000}),
        ({"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8k"}, {"autoCompactWindow": 250_000}),
        ({}, {"autoCompactWindow": {"default": 250_000, "byModel": {}}}),  # 2.1.332's object form
        ({}, {"model": "x"}),  # unstated: Claude picks it from server data or experiments
    ],
)
def test_what_hctx_cannot_read_as_claude_does_publishes_no_point(
    tmp_path: Path, env: dict[str, str], user: object
) -> None:
    plan = seat(tmp_path, user=user)
    plan = LaunchPlan(harness="claude", argv=("claude",), cwd=plan.cwd, env={**plan.env, **env})
    assert compact_at(compaction_settings(plan, take_seat(plan.cwd, plan.owner_pid)), 200_000) is None


def test_auto_compaction_switched_off_is_stated_false(tmp_path: Path) -> None:
    plan = seat(tmp_path, user={"autoCompactWindow": 250_000, "autoCompactEnabled": False})
    assert read(plan) == ClaudeCompaction(enabled=False)
    plan = seat(tmp_path / "b", user={"autoCompactWindow": 250_000})
    (tmp_path / "b" / "home" / ".claude.json").write_text(json.dumps({"autoCompactEnabled": False}))
    assert read(plan) == ClaudeCompaction(enabled=False)
    plan = LaunchPlan(harness="claude", argv=("claude",), cwd=plan.cwd, env={**plan.env, "DISABLE_COMPACT": "1"})
    assert read(plan) == ClaudeCompaction(enabled=False)
    producer = claude.ClaudeProducer()
    producer.feed(ClaudeCompaction(enabled=False), 1)
    line = FIXTURES.joinpath("statusline-2.1.332.jsonl").read_bytes().splitlines()[1]
    [event] = claude.channel_frames(claude.STATUSLINE_TYPE, {"payload": json.loads(line)})
    [reading] = producer.feed(event, 2)  # type: ignore[arg-type]
    assert (reading.fields.compact_at_tokens, reading.fields.auto_compaction) == (None, False)


def test_the_transport_carries_what_the_launch_read(tmp_path: Path) -> None:
    plan = seat(tmp_path, user={"autoCompactWindow": 250_000})
    transport = subagent_transport(plan, read(plan))
    assert transport.compaction == ClaudeCompaction(enabled=True, configured_window=250_000)
