"""Issue 37: each Task subagent's window as Claude states it, from the rows it hands its
`subagentStatusLine` (hctx's subagent tee), recorded live on 2.1.250 and 2.1.332
(tests/live/test_subagents_live.py, fixtures/claude/delegation-rows/<version>/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from guard.errors import FrameRejected
from guard.record import Subagent
from sidecar.harnesses.claude import producer as claude
from sidecar.harnesses.claude.frames import SUBAGENT_STATUSLINE_TYPE
from sidecar.harnesses.claude.subagents import ModelWindows
from sidecar.replay import replay_recording
from tests.conftest import FIXTURE_ROOT
from tests.hostile import numbers, numbers_in

VERSIONS = ("2.1.250", "2.1.332")
# The live run's user model table: a window for the subagents' model that Claude does not state.
SUBAGENT_MODEL, TABLE_WINDOW = "claude-subagent-test-1", 150_000


def delegation(version: str) -> Path:
    return FIXTURE_ROOT / "claude" / "delegation-rows" / version


def row_payloads(version: str) -> list[dict[str, Any]]:
    """What Claude handed the user's own `subagentStatusLine`, one payload a line."""
    lines = (delegation(version) / "subagent-statusline.jsonl").read_bytes().splitlines()
    return [json.loads(line) for line in lines]


def own_context(path: Path) -> tuple[int, str]:
    """A subagent transcript's newest usage (input + cache_read + cache_creation) and model."""
    found: tuple[int, str] | None = None
    for line in path.read_bytes().splitlines():
        message = json.loads(line).get("message")
        if isinstance(message, dict) and isinstance(usage := message.get("usage"), dict):
            used = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
            found = (used, message["model"])
    assert found is not None
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_each_subagents_window_is_the_one_claude_states_replayed_as_recorded(version: str) -> None:
    """The sidecar's `--record` of the live run, replayed: every row's window is the
    `contextWindowSize` Claude stated for that very row (`windowSource: "harness"`), not the model
    table the seat also had (150,000 for the subagents' model); its tokens stay its transcript's."""
    writes, summary = replay_recording(claude.SPEC, delegation(version) / "sidecar.rec")
    assert not summary.problems and not summary.lost_chunks
    stated = {t["id"]: t["contextWindowSize"] for p in row_payloads(version) for t in p["tasks"]}
    rows = {row.id: row for row in writes[-1].record.subagents}
    files = sorted((delegation(version) / "subagents").glob("agent-*.jsonl"))
    assert set(rows) == set(stated) == {path.stem.removeprefix("agent-") for path in files} and len(rows) == 3
    for path in files:
        used, model = own_context(path)
        row = rows[path.stem.removeprefix("agent-")]
        assert (row.used_tokens, row.model, row.state) == (used, model, "finished")
        assert (row.window_tokens, row.window_source) == (stated[row.id], "harness")
        assert row.used_percent == used * 100 / stated[row.id]
    # Measured: 2.1.250 states 200,000 for a model id it does not know, 2.1.332 1,000,000.
    assert set(stated.values()) == ({200_000} if version == "2.1.250" else {1_000_000})
    # `tokenCount` (prompt + an output) is never what a row carries.
    counts = {t["tokenCount"] for p in row_payloads(version) for t in p["tasks"]} - {0}
    assert counts and not counts & {row.used_tokens for row in rows.values()}
    # Each window changed once per row; the 5 s ticks that restate it write nothing.
    harness_writes = [w for w in writes if any(r.window_source == "harness" for r in w.record.subagents)]
    changes = {(r.id, r.window_tokens) for w in harness_writes for r in w.record.subagents if r.window_source}
    assert len(changes) == 3


def producer_with(rows: int = 1) -> tuple[claude.ClaudeProducer, list[str]]:
    """A producer whose hooks named `rows` subagents, with a model table for their model."""
    producer = claude.ClaudeProducer()
    producer.feed(ModelWindows({SUBAGENT_MODEL: TABLE_WINDOW}), 1)
    ids = [f"a{n:016x}" for n in range(rows)]
    for agent in ids:
        hook = claude.SubagentHook(claude.SUBAGENT_START, agent, "general-purpose", None)
        producer.feed(hook, 2)
    return producer, ids


def rows_frame(tasks: object) -> list[object]:
    return claude.channel_frames(SUBAGENT_STATUSLINE_TYPE, {"payload": {"session_id": "s", "tasks": tasks}})


def fed(producer: claude.ClaudeProducer, tasks: object, at: int = 10) -> list[Subagent]:
    for event in rows_frame(tasks):
        producer.feed(event, at)  # type: ignore[arg-type]
    return list(producer.held.subagents.rows())


def test_a_row_for_a_subagent_no_hook_named_makes_no_row() -> None:
    """`tasks[]` also lists what no SubagentStart named (teammates, workflows, another session's
    rows in a hostile payload): no row comes of it."""
    producer, ids = producer_with(1)
    rows = fed(producer, [{"id": "a" * 17, "model": SUBAGENT_MODEL, "contextWindowSize": 1_000_000}])
    assert [(row.id, row.window_tokens) for row in rows] == [(ids[0], None)]


def test_where_claude_states_no_window_the_model_table_stays_named_so() -> None:
    producer, [agent] = producer_with(1)
    fed(producer, [{"id": agent, "tokenCount": 5}])  # no model, so Claude states no window
    usage = claude.SubagentUsage(agent, 6_000, SUBAGENT_MODEL, 11)
    producer.feed(usage, 11)
    [row] = producer.held.subagents.rows()
    assert (row.used_tokens, row.window_tokens, row.window_source) == (6_000, TABLE_WINDOW, "model-table")
    fed(producer, [{"id": agent, "model": SUBAGENT_MODEL, "contextWindowSize": 200_000}], at=12)
    [row] = producer.held.subagents.rows()
    assert (row.window_tokens, row.window_source, row.used_percent) == (200_000, "harness", 3.0)
    producer.feed(claude.SubagentUsage(agent, 8_000, SUBAGENT_MODEL, 13), 13)
    [row] = producer.held.subagents.rows()  # a later turn keeps Claude's window, not the table's
    assert (row.used_tokens, row.window_tokens, row.window_source) == (8_000, 200_000, "harness")


@pytest.mark.parametrize(
    "task",
    [
        {"id": "../../etc/passwd", "contextWindowSize": 200_000},
        {"id": "a0000000000000000/x", "contextWindowSize": 200_000},
        {"id": "a000000000000000\x1b[2J", "contextWindowSize": 200_000},
        {"id": 7, "contextWindowSize": 200_000},
        {"contextWindowSize": 200_000},
        "not a row",
    ],
)
def test_a_row_whose_id_could_name_anything_but_an_agent_is_left_out(task: object) -> None:
    producer, _ = producer_with(1)
    assert fed(producer, [task])[0].window_tokens is None
    [event] = rows_frame([task])
    assert event == claude.SubagentRows(())


@settings(max_examples=150, deadline=None)
@given(window=numbers, count=numbers)
def test_hostile_numbers_in_a_known_row_publish_only_a_count_claude_gave(window: object, count: object) -> None:
    producer, [agent] = producer_with(1)
    task = {"id": agent, "model": SUBAGENT_MODEL, "contextWindowSize": window, "tokenCount": count}
    [row] = fed(producer, [task])
    if row.window_tokens is not None:
        assert row.window_tokens in numbers_in(window) and row.window_tokens > 0 and row.window_source == "harness"
    assert row.used_tokens is None  # tokenCount is never a reading


def test_thousands_of_rows_cost_a_bounded_read_and_fabricate_nothing() -> None:
    producer, ids = producer_with(3)
    noise = [{"id": f"b{n:016x}", "model": "m", "contextWindowSize": n + 1} for n in range(5_000)]
    known = [{"id": agent, "model": SUBAGENT_MODEL, "contextWindowSize": 200_000} for agent in ids]
    [event] = rows_frame(noise + known)
    assert isinstance(event, claude.SubagentRows) and len(event.rows) == claude.MAX_TASK_ROWS
    rows = fed(producer, noise + known)  # the known rows are past the bound: read as nothing
    assert sorted(row.id for row in rows) == ids and {row.window_tokens for row in rows} == {None}
    rows = fed(producer, known + noise)
    assert {(row.window_tokens, row.window_source) for row in rows} == {(200_000, "harness")}


@pytest.mark.parametrize("tasks", [None, {"id": "a"}, "rows", 3])
def test_a_payload_without_a_tasks_list_is_refused(tasks: object) -> None:
    with pytest.raises(FrameRejected):
        rows_frame(tasks)
