"""Issue 28: the parent's record never carries a subagent's numbers, on recordings of real delegations.

The recordings are the real binaries' wire bytes, verbatim, from tests/live/test_subagents_live.py
(`HCTX_DELEGATION_RECORD_DIR=fixtures`): Codex 0.151.0 and 0.171.0 spawning two children in
parallel and then one (`spawn_agent`, `wait_agent`), the app-server's stdout; OpenCode 1.18.25 and
1.18.33 running the `task` tool twice in parallel and then once, its children on another model
(`fake-small`, a 64,000-token window), the `/event` stream and the `GET /config/providers` answer.
Each test states the parent's number that must be published and the child's that must not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from guard_factory import SPEC_KEY_ORDER
from pydantic import ValidationError

from guard.policy import Write
from guard.projection import MAX_RECORD_BYTES
from guard.record import MAX_SUBAGENTS, HarnessContext, Subagent, parse_record
from sidecar.harnesses.codex import producer as codex
from sidecar.harnesses.codex.events import ThreadOpened, TokenUsage
from sidecar.harnesses.codex.transcript import RolloutDecoder
from sidecar.harnesses.opencode import producer as opencode
from sidecar.registry import spec_for
from sidecar.replay import replay_recording
from tests.conformance import fixture_writes, recording_path
from tests.conftest import FIXTURE_ROOT

CODEX_VERSIONS = ("0.151.0", "0.171.0")
OPENCODE_VERSIONS = ("1.18.25", "1.18.33")
# What the fakes told each side it spent (tests/live/test_subagents_live.py).
CODEX_PARENT = {30_500, 32_066, 32_600, 33_662, 34_100, 34_300, 35_500}
CODEX_CHILDREN = {17_472, 22_078, 26_370}
OPENCODE_PARENT = {30_100, 31_200, 32_100, 33_300}
OPENCODE_CHILDREN = {12_345, 15_678, 18_900}


def codex_recording(version: str) -> Path:
    return FIXTURE_ROOT / "codex" / f"codex-{version}-delegation.jsonl"


def codex_usage(version: str) -> list[dict[str, Any]]:
    return [
        message["params"]
        for line in codex_recording(version).read_bytes().splitlines()
        if (message := json.loads(line)).get("method") == "thread/tokenUsage/updated"
    ]


def codex_writes(version: str) -> list[Write]:
    return fixture_writes("codex", f"codex/codex-{version}-delegation.rec")


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_the_codex_recording_is_a_real_delegation(version: str) -> None:
    """The premise: three children's readings on the parent's connection, under their own ids, and
    no `thread/started` for any of them."""
    usage = codex_usage(version)
    started = [
        json.loads(line)["params"]["thread"]["id"]
        for line in codex_recording(version).read_bytes().splitlines()
        if b'"method":"thread/started"' in line
    ]
    assert len(started) == 1
    by_thread: dict[str, set[int]] = {}
    for params in usage:
        by_thread.setdefault(params["threadId"], set()).add(params["tokenUsage"]["last"]["totalTokens"])
    assert by_thread.pop(started[0]) == CODEX_PARENT
    assert len(by_thread) == 3 and set().union(*by_thread.values()) == CODEX_CHILDREN


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_codex_publishes_the_parents_numbers_and_never_a_childs(version: str) -> None:
    writes = codex_writes(version)
    written = [write.record.used_tokens for write in writes]
    assert set(written) <= CODEX_PARENT
    assert not set(written) & CODEX_CHILDREN  # 17,472, 22,078 and 26,370 never the agent's
    final = writes[-1].record
    # The parent's last reading, with the parent thread's own total (never a child's 26,370).
    assert (final.used_tokens, final.session_total_tokens, final.used_percent) == (35_500, 232_728, 13)


def test_a_codex_thread_never_opened_as_the_agents_is_no_reading() -> None:
    producer = codex.CodexProducer()
    usage = TokenUsage(thread_id="child", tokens_in_window=17_472, session_total_tokens=17_472, context_window=190_000)
    assert producer.feed(usage, 1) == []
    producer.feed(ThreadOpened(thread_id="parent"), 2)
    assert producer.feed(usage, 3) == []
    [reading] = producer.feed(usage.model_copy(update={"thread_id": "parent", "tokens_in_window": 32_066}), 4)
    assert reading.fields.used_tokens == 32_066


def test_a_thread_naming_a_parent_is_not_opened_as_the_agents() -> None:
    child = {"method": "thread/started", "params": {"thread": {"id": "c", "parentThreadId": "p"}}}
    parent = {"method": "thread/started", "params": {"thread": {"id": "p", "parentThreadId": None}}}
    resumed = {"id": 4, "result": {"thread": {"id": "r"}}}
    assert [e for e in codex.parse_message(json.dumps(child).encode()) if isinstance(e, ThreadOpened)] == []
    assert ThreadOpened(thread_id="p") in codex.parse_message(json.dumps(parent).encode())
    assert ThreadOpened(thread_id="r") in codex.parse_message(json.dumps(resumed).encode())


def rollout(source: object) -> bytes:
    meta = {
        "timestamp": "2026-12-01T22:00:00.000Z",
        "type": "session_meta",
        "payload": {"id": "t1", "timestamp": "2026-12-01T22:00:00.000Z", "cwd": "/w", "source": source},
    }
    usage = {"timestamp": "2026-12-01T22:00:03.000Z", "type": "event_msg", "payload": {"type": "token_count",
             "info": {"total_token_usage": {"total_tokens": 17472}, "last_token_usage": {"total_tokens": 17472},
                      "model_context_window": 190000}, "rate_limits": None}}  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in (meta, usage))


@pytest.mark.parametrize(
    ("source", "published"),
    [("cli", [17_472]), ({"subagent": {"thread_spawn": {"parent_thread_id": "p", "depth": 1}}}, [])],
)
def test_a_replayed_subagent_rollout_is_never_an_agents_reading(source: object, published: list[int]) -> None:
    producer = codex.CodexProducer()
    events = RolloutDecoder().receive_data(rollout(source))
    assert [r.fields.used_tokens for e in events for r in producer.feed(e, 1)] == published


def opencode_writes(version: str) -> list[Write]:
    return fixture_writes("opencode", opencode_recording(version))


def opencode_recording(version: str) -> str:
    """The lab's providers answer and the delegation's event stream, as one recording."""
    return f"opencode/delegation/delegation-{version}.rec"


def opencode_frames(version: str) -> list[dict[str, Any]]:
    data = (FIXTURE_ROOT / "opencode" / "delegation" / f"delegation-{version}.events.sse").read_bytes()
    return [json.loads(line[5:]) for line in data.split(b"\n") if line.startswith(b"data:")]


@pytest.mark.parametrize("version", OPENCODE_VERSIONS)
def test_the_opencode_recording_is_a_real_delegation(version: str) -> None:
    frames = opencode_frames(version)
    children = {
        f["properties"]["info"]["id"]
        for f in frames
        if f["type"] == "session.created" and f["properties"]["info"].get("parentID")
    }
    child_totals = {
        f["properties"]["info"]["tokens"]["total"]
        for f in frames
        if f["type"] == "message.updated"
        and f["properties"]["info"]["sessionID"] in children
        and "total" in f["properties"]["info"].get("tokens", {})
    }
    assert len(children) == 3 and child_totals == OPENCODE_CHILDREN


@pytest.mark.parametrize("version", OPENCODE_VERSIONS)
def test_opencode_publishes_the_parents_numbers_and_never_a_task_sessions(version: str) -> None:
    writes = opencode_writes(version)
    # Before the parent's first turn completes its children's rows are written beside a parent
    # reading that is all null (none was taken), never one of theirs.
    early = [w.record for w in writes if w.record.used_tokens is None]
    assert all((r.window_tokens, r.model, r.used_percent) == (None, None, None) and r.subagents for r in early)
    records = [write.record for write in writes if write.record.used_tokens is not None]
    assert {r.used_tokens for r in records} <= OPENCODE_PARENT
    assert not {r.used_tokens for r in records} & OPENCODE_CHILDREN
    # Never the child's model or its 64,000-token window.
    assert {(r.model, r.window_tokens) for r in records} == {("fake/fake-model", 128_000)}
    assert len({r.session_id for r in records}) == 1
    assert records[-1].used_tokens == 33_300


def test_an_opencode_child_named_only_by_the_task_part_is_not_the_parent() -> None:
    """A stream joined after the child's `session.created`: the parent's `task` part names it."""
    producer = opencode.OpenCodeProducer()
    part = {"id": "e1", "type": "message.part.updated", "properties": {"part": {
        "type": "tool", "tool": "task", "sessionID": "p",
        "state": {"status": "running", "metadata": {"sessionId": "c", "parentSessionId": "p"}}}}}  # fmt: skip
    for event in opencode.parse_event(json.dumps(part).encode()):
        producer.feed(event, 1)  # type: ignore[arg-type]
    message = {"id": "e2", "type": "message.updated", "properties": {"info": {
        "id": "m", "role": "assistant", "sessionID": "c", "providerID": "fake", "modelID": "small",
        "tokens": {"total": 12_345}}}}  # fmt: skip
    compacted = {"id": "e3", "type": "session.compacted", "properties": {"sessionID": "c"}}
    for frame in (message, compacted):
        for event in opencode.parse_event(json.dumps(frame).encode()):
            for reading in producer.feed(event, 2):  # type: ignore[arg-type]
                assert (reading.fields.used_tokens, reading.fields.compactions) == (None, 0)  # the parent's
    assert producer.held.compactions.count == 0 and producer.held.reading is not None
    [row] = producer.held.reading.subagents  # the child's own: its turn and its compaction
    assert (row.id, row.used_tokens, row.compactions, row.state) == ("c", 12_345, 1, "running")


def test_an_opencode_childs_compaction_before_its_first_turn_is_its_rows_first() -> None:
    """A child known only from its `session.updated` (its `parentID`), whose first word is a
    compaction: a row of its own with that one compaction (it cost a producer error and the row before
    the shared kernel: the new row's 0 and the compaction's 1 were passed twice)."""
    producer = opencode.OpenCodeProducer()
    updated = {"id": "e1", "type": "session.updated", "properties": {"info": {"id": "c", "parentID": "p"}}}
    compacted = {"id": "e2", "type": "session.compacted", "properties": {"sessionID": "c"}}
    readings = [reading for frame in (updated, compacted) for event in opencode.parse_event(json.dumps(frame).encode())
                for reading in producer.feed(event, 5)]  # type: ignore[arg-type]  # fmt: skip
    [reading] = readings
    [row] = reading.fields.subagents
    assert (row.id, row.compactions, row.state) == ("c", 1, "running")
    assert reading.fields.compactions == 0 and not reading.compaction_edge  # never the agent's own


# ---- the record's additive `subagents` -------------------------------------------------------------


def subagent_row(number: int, **fields: Any) -> Subagent:
    values: dict[str, Any] = {"id": f"child-{number}", "used_tokens": 17_472, "window_tokens": 190_000,
                              "used_percent": 4.0, "window_source": "harness", "state": "running",
                              "observed_at_ms": 1_000 + number} | fields  # fmt: skip
    return Subagent(**values)


def parent_record(*rows: Subagent) -> HarnessContext:
    return HarnessContext(harness="codex", agent="a", incarnation="i", used_tokens=32_066, window_tokens=190_000,
                          used_percent=12.0, subagents=rows, observed_at_ms=900, written_at_ms=950)  # fmt: skip


def test_a_record_without_subagents_writes_the_bytes_it_wrote_before() -> None:
    data = parent_record().to_json()
    assert "subagents" not in json.loads(data)
    assert list(json.loads(data)) == list(SPEC_KEY_ORDER)


def test_a_v1_reader_reads_a_record_with_subagents_exactly_as_before() -> None:
    with_rows = parent_record(subagent_row(1), subagent_row(2, state="finished"))
    data = json.loads(with_rows.to_json())
    assert [row["id"] for row in data["subagents"]] == ["child-1", "child-2"]
    # A reader that knows nothing of the key ignores it (the record's models ignore unknown keys,
    # as v1's did): the parent's fields read the same with or without it.
    assert HarnessContext.model_config["extra"] == "ignore"
    without = {key: value for key, value in data.items() if key != "subagents"}
    assert parse_record(json.dumps(without)) == with_rows.model_copy(update={"subagents": ()})
    assert parse_record(with_rows.to_json()) == with_rows


def test_the_newest_sixteen_stay_under_the_record_limit() -> None:
    longest = "x" * 128
    rows = [subagent_row(n, id=f"{n:03d}{longest}"[:128], name=longest, model=longest) for n in range(MAX_SUBAGENTS)]
    assert len(parent_record(*rows).to_json().encode()) < MAX_RECORD_BYTES // 4
    with pytest.raises(ValidationError):
        parent_record(*rows, subagent_row(99))


@pytest.mark.parametrize("hostile", ["child\x1b[2J", "a\nb", "\x00", "x\x7f", "\x9b31m", ""])
def test_a_subagent_id_or_type_with_control_characters_is_refused(hostile: str) -> None:
    with pytest.raises(ValidationError):
        subagent_row(1, id=hostile)
    with pytest.raises(ValidationError):
        subagent_row(1, name=hostile)


# ---- each subagent's own row, from its own channel --------------------------------------------------


def writes_without_rows(harness: str, version: str) -> int:
    """The same recording's writes with no subagent row ever published (the producer's readings
    stripped of them): what the session wrote before issue 28's rows."""
    import dataclasses

    from sidecar.registry import spec_for

    spec = spec_for(harness)

    class WithoutRows:
        def __init__(self) -> None:
            self.inner = spec.make_producer()
            self.harness = self.inner.harness

        def feed(self, event: Any, now_ms: int) -> list[Any]:
            return [dataclasses.replace(r, fields=r.fields.model_copy(update={"subagents": ()}))
                    for r in self.inner.feed(event, now_ms)]  # fmt: skip

    plain = dataclasses.replace(spec, make_producer=WithoutRows)
    name = f"codex/codex-{version}-delegation.rec" if harness == "codex" else opencode_recording(version)
    return len(replay_recording(plain, recording_path(name))[0])


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_codex_rows_are_each_childs_own_numbers_and_finish(version: str) -> None:
    usage = codex_usage(version)
    started = {p["threadId"] for p in usage} - {
        t for t in {p["threadId"] for p in usage} if {17_472, 22_078, 26_370} & {
            q["tokenUsage"]["last"]["totalTokens"] for q in usage if q["threadId"] == t}
    }  # fmt: skip
    writes = codex_writes(version)
    final = writes[-1].record
    rows = {row.id: row for row in final.subagents}
    own = {p["threadId"]: p["tokenUsage"] for p in usage if p["threadId"] not in started}
    assert set(rows) == set(own)  # the three spawned threads, each by its thread id
    for thread, tokens in own.items():
        row = rows[thread]
        assert (row.used_tokens, row.window_tokens) == (tokens["last"]["totalTokens"], tokens["modelContextWindow"])
        assert row.used_tokens is not None
        assert row.used_percent == codex.used_percent(row.used_tokens, row.window_tokens)  # Codex's own rule
        assert (row.state, row.model, row.window_source, row.compactions) == ("finished", "lab-model", "harness", 0)
        assert row.used_tokens != final.used_tokens
    # The parent's row is unchanged by them: its numbers and its time are its own reading's.
    assert (final.used_tokens, final.window_tokens, final.session_total_tokens) == (35_500, 190_000, 232_728)
    assert final.observed_at_ms not in {row.observed_at_ms for row in final.subagents}


@pytest.mark.parametrize("version", OPENCODE_VERSIONS)
def test_opencode_rows_are_each_task_sessions_own_numbers_on_its_own_model(version: str) -> None:
    writes = opencode_writes(version)
    final = writes[-1].record
    assert {row.used_tokens for row in final.subagents} == OPENCODE_CHILDREN
    for row in final.subagents:
        assert (row.model, row.window_tokens, row.name, row.state) == ("fake/fake-small", 64_000, "general", "finished")
        assert row.used_tokens is not None and row.used_percent == row.used_tokens * 100 / 64_000
    assert (final.used_tokens, final.window_tokens, final.model) == (33_300, 128_000, "fake/fake-model")


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_codex_rows_cost_at_most_half_again_the_writes(version: str) -> None:
    """scripts/bench_write_policy.py's figure: 14 writes with the rows, 14 without (1.00x; 20 before
    the policy's quantum)."""
    assert len(codex_writes(version)) <= 1.5 * writes_without_rows("codex", version)


@pytest.mark.parametrize("version", OPENCODE_VERSIONS)
def test_opencode_rows_cost_each_task_at_most_its_turn_and_its_finish(version: str) -> None:
    """The untimed capture, replayed one second per event: each child's reading and its finish are
    seconds apart there, past the quantum, so each child still writes twice (11 against 5, 2.2x);
    on the sidecar's own timed recording of the same run they fold (see below)."""
    assert len(opencode_writes(version)) <= writes_without_rows("opencode", version) + 2 * 3


def test_thousands_of_subagents_stay_bounded_and_the_newest_are_kept() -> None:
    producer = codex.CodexProducer()
    producer.feed(ThreadOpened(thread_id="p"), 0)
    from sidecar.harnesses.codex.events import SubagentsSpawned

    for n in range(5_000):
        producer.feed(SubagentsSpawned(sender_thread_id="p", thread_ids=(f"c{n}",), model=None), n)
    reading = producer.held.reading
    assert reading is not None and len(reading.subagents) == MAX_SUBAGENTS
    assert [row.id for row in reading.subagents] == [f"c{n}" for n in range(4_999, 4_999 - MAX_SUBAGENTS, -1)]
    assert len(producer.held.subagents._rows) <= 256
    # A hostile id is refused whole: no row, no cleaned-up name.
    assert producer.feed(SubagentsSpawned(sender_thread_id="p", thread_ids=("x\x1b[2J",), model=None), 9_999) == []


# ---- readers -------------------------------------------------------------------------------------


def test_hctx_agents_shows_each_subagent_indented_under_its_agent_and_in_json(tmp_path: Path) -> None:
    from readers_catalog import hctx, put_record

    rows = [
        {"id": "ses_child_one", "name": "general", "model": "fake/fake-small", "usedTokens": 18_900,
         "windowTokens": 64_000, "usedPercent": 29.53125, "windowSource": "harness", "compactions": 0,
         "state": "running", "observedAtMs": 1_795_000_000_000},
        {"id": "ses_child_two", "name": None, "model": None, "usedTokens": None, "windowTokens": None,
         "usedPercent": None, "windowSource": None, "compactions": None, "state": "finished",
         "observedAtMs": 1_795_000_000_000},
    ]  # fmt: skip
    put_record(tmp_path, "parent", usedTokens=33_300, windowTokens=128_000, usedPercent=26.0, subagents=rows)
    put_record(tmp_path, "plain")
    listed = hctx("agents", "--catalog", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    parent = next(i for i, line in enumerate(lines) if " parent " in line)
    assert "└ general ses_child_one" in lines[parent + 1] and "19k/64k" in lines[parent + 1]
    assert "ctx:30%" in lines[parent + 1] and "running" in lines[parent + 1]
    assert "└ subagent ses_child_two" in lines[parent + 2] and "finished" in lines[parent + 2]
    assert "33k/128k" in lines[parent]  # the agent's own row keeps the agent's own numbers
    as_json = json.loads(hctx("agents", "--json", "--catalog", str(tmp_path)).stdout)
    by_name = {row["identity"]: row for row in as_json}
    assert [row["usedTokens"] for row in by_name["parent"]["context"]["subagents"]] == [18_900, None]
    assert "subagents" not in by_name["plain"]["context"]  # no delegation: the object it was before


def test_metrics_count_running_subagents_and_the_highest_fill_without_a_per_subagent_label(tmp_path: Path) -> None:
    from readers_catalog import hctx, put_record

    rows = [
        {"id": f"c{n}", "usedTokens": 1000 * n, "windowTokens": 100_000, "usedPercent": float(n),
         "state": "running" if n % 2 else "finished", "observedAtMs": 1_795_000_000_000}
        for n in range(1, 6)
    ]  # fmt: skip
    put_record(tmp_path, "parent", subagents=rows)
    put_record(tmp_path, "plain")
    exposition = hctx("metrics", "--textfile", str(tmp_path / "out.prom"), "--catalog", str(tmp_path))
    assert exposition.returncode == 0, exposition.stderr
    text = (tmp_path / "out.prom").read_text()
    lines = [line for line in text.splitlines() if line.startswith("hctx_subagent")]
    assert any(line.startswith("hctx_subagents_running{") and 'agent="parent"' in line and line.endswith(" 3.0")
               for line in lines)  # fmt: skip
    assert any('agent="parent"' in line and line.endswith(" 5.0") for line in lines if "max_used_percent" in line)
    assert not any('agent="plain"' in line for line in lines)  # no subagents: no sample, never a 0
    assert not any('"c1"' in line or "c1" in line.split("{", 1)[-1] for line in lines)  # no subagent label


# ---- Claude: SubagentStart / SubagentStop, recorded live -----------------------------------------

CLAUDE_VERSIONS = ("2.1.250", "2.1.332")


@pytest.mark.parametrize("version", CLAUDE_VERSIONS)
def test_claude_subagent_hooks_make_rows_without_numbers_the_hooks_do_not_carry(version: str) -> None:
    from sidecar.harnesses.claude import producer as claude

    payloads = [
        json.loads(line)
        for line in (FIXTURE_ROOT / "claude" / "delegation" / version / "subagent-hooks.jsonl")
        .read_bytes()
        .splitlines()
    ]
    producer = claude.ClaudeProducer()
    readings = []
    for at, payload in enumerate(payloads, 1):
        for event in claude.channel_frames(claude.HOOK_TYPE, {"payload": payload}):
            readings += producer.feed(event, at * 1000)  # type: ignore[arg-type]
    final = readings[-1].fields
    assert {row.id for row in final.subagents} == {p["agent_id"] for p in payloads}
    assert {(row.name, row.state) for row in final.subagents} == {("general-purpose", "finished")}
    # Neither hook states usage or a window: null, never the parent's, never a guess.
    assert {(row.used_tokens, row.window_tokens, row.used_percent) for row in final.subagents} == {(None, None, None)}
    assert (final.used_tokens, final.window_tokens) == (None, None)  # no status line fed: the parent's unknown
    assert all(reading.compaction_edge is False for reading in readings)


# ---- Claude: each subagent's own transcript, recorded live ------------------------------------------

SUBAGENT_MODEL, SUBAGENT_WINDOW = "claude-subagent-test-1", 150_000  # the live test's user model table
CLAUDE_WINDOW = 200_000  # the parent's, from its status line


def claude_delegation(version: str) -> Path:
    return FIXTURE_ROOT / "claude" / "delegation" / version


def own_context(path: Path) -> tuple[int, str]:
    """A subagent transcript's newest assistant usage, input + cache_read + cache_creation, and its
    model: read here independently of the producer."""
    found: tuple[int, str] | None = None
    for line in path.read_bytes().splitlines():
        message = json.loads(line).get("message")
        if isinstance(message, dict) and isinstance(usage := message.get("usage"), dict):
            used = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
            found = (used, message["model"])
    assert found is not None
    return found


def subagent_tokens_figures(version: str) -> set[int]:
    """The `<subagent_tokens>` figures Claude's task notifications carry: never a context."""
    import re

    session = (claude_delegation(version) / "session.jsonl").read_bytes()
    return {int(n) for n in re.findall(rb"subagent_tokens>(\d+)<", session)}


@pytest.mark.parametrize("version", CLAUDE_VERSIONS)
def test_claude_subagent_rows_are_each_transcripts_own_numbers_replayed_as_recorded(version: str) -> None:
    """The sidecar's `--record` of the live delegation replayed through the live Writer: each row
    is its own transcript's newest usage on its own model, the window the model table's (named so)
    or null, never the parent's window and never the notification's `<subagent_tokens>`."""
    from sidecar.harnesses.claude import producer as claude
    from sidecar.replay import replay_recording

    writes, summary = replay_recording(claude.SPEC, claude_delegation(version) / "sidecar.rec")
    assert not summary.problems and not summary.lost_chunks
    final = writes[-1].record
    assert (final.used_tokens, final.window_tokens) == (23_000, CLAUDE_WINDOW)  # the parent's, unchanged
    rows = {row.id: row for row in final.subagents}
    files = sorted((claude_delegation(version) / "subagents").glob("agent-*.jsonl"))
    assert set(rows) == {path.stem.removeprefix("agent-") for path in files} and len(rows) == 3
    wrong = subagent_tokens_figures(version)
    assert len(wrong) == 3 and not wrong & CLAUDE_CHILDREN  # 6001/6040, ...: context + turns or output
    for path in files:
        used, model = own_context(path)
        row = rows[path.stem.removeprefix("agent-")]
        assert (row.used_tokens, row.model, row.state, row.name) == (used, model, "finished", "general-purpose")
        assert row.used_tokens not in wrong and row.window_tokens != CLAUDE_WINDOW
        if model == SUBAGENT_MODEL:
            assert (row.window_tokens, row.window_source, row.used_percent) == (
                SUBAGENT_WINDOW, "model-table", used * 100 / SUBAGENT_WINDOW)  # fmt: skip
        else:
            assert (row.window_tokens, row.window_source, row.used_percent) == (None, None, None)
        assert row.compactions == 0
    assert {row.used_tokens for row in rows.values()} == CLAUDE_CHILDREN
    # No write ever carried a subagent's number as the parent's.
    assert not {write.record.used_tokens for write in writes} & CLAUDE_CHILDREN


CLAUDE_CHILDREN = {6_000, 7_500, 9_000}


def placed_delegation(version: str, root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The live run's transcripts where Claude wrote them, under a projects directory of `root`,
    and its hook payloads naming them there."""
    hooks = (claude_delegation(version) / "subagent-hooks.jsonl").read_bytes()
    payloads = [json.loads(line) for line in hooks.splitlines()]
    session = payloads[0]["session_id"]
    projects = root / ".claude" / "projects"
    project = projects / "-work"
    (project / session / "subagents").mkdir(parents=True)
    (project / f"{session}.jsonl").write_bytes((claude_delegation(version) / "session.jsonl").read_bytes())
    for path in (claude_delegation(version) / "subagents").iterdir():
        (project / session / "subagents" / path.name).write_bytes(path.read_bytes())
    for payload in payloads:
        payload["transcript_path"] = str(project / f"{session}.jsonl")
        if "agent_transcript_path" in payload:
            name = f"agent-{payload['agent_id']}.jsonl"
            payload["agent_transcript_path"] = str(project / session / "subagents" / name)
    return projects, payloads


async def through_the_transport(
    payloads: list[dict[str, Any]], projects: Path, late: Any = None, late_s: float = 0.0
) -> HarnessContext:
    """The hook payloads as the channel carries them, into the live Writer, with the Claude
    transport reading the transcripts they name: the sidecar's path, on disk, without the socket."""
    import trio

    from guard.policy import SUBAGENT_QUANTUM_MS, WriteGuard
    from sidecar.app import Writer, transport_streams
    from sidecar.decoding import CHANNEL
    from sidecar.harnesses.claude import follow
    from sidecar.harnesses.claude import producer as claude
    from sidecar.harnesses.claude.frames import HOOK_FRAME, channel_line
    from sidecar.harnesses.claude.subagents import ClaudeTransport
    from sidecar.pipeline import Pipeline
    from sidecar.replay import MemoryStore

    store = MemoryStore()
    store.release_all()
    writer = Writer(Pipeline(claude.SPEC.make_producer(), WriteGuard("a", "i")), store)
    streams = transport_streams(claude.SPEC, writer)
    config = ClaudeTransport(projects_dir=str(projects), windows={SUBAGENT_MODEL: SUBAGENT_WINDOW}, poll_seconds=0.01)
    decoder = claude.SPEC.decoder(CHANNEL)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            nursery.start_soon(follow.run, config, streams)
            for payload in payloads:
                for event in decoder.receive_data(channel_line(HOOK_FRAME, json.dumps(payload).encode())):
                    writer.submit(event)
                await trio.sleep(0.05)
            # Past SubagentStop the transport reads on (`late` lands meanwhile), and a change of the
            # rows alone lands when its quantum ends.
            if late is not None:
                await trio.sleep(late_s)
                late()
            await trio.sleep(3 + SUBAGENT_QUANTUM_MS / 1000)
            while writer.outbox.pending:  # noqa: ASYNC110 - the writer's own task drains it
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert store.last is not None
    return store.last


@pytest.mark.parametrize("version", CLAUDE_VERSIONS)
async def test_claude_transport_reads_each_subagents_transcript_where_claude_wrote_it(
    version: str, tmp_path: Path
) -> None:
    projects, payloads = placed_delegation(version, tmp_path)
    record = await through_the_transport(payloads, projects)
    rows = {row.id: row for row in record.subagents}
    for path in (claude_delegation(version) / "subagents").glob("agent-*.jsonl"):
        used, model = own_context(path)
        row = rows[path.stem.removeprefix("agent-")]
        assert (row.used_tokens, row.model, row.state) == (used, model, "finished")
        assert row.window_tokens == (SUBAGENT_WINDOW if model == SUBAGENT_MODEL else None)
    assert {row.used_tokens for row in rows.values()} == CLAUDE_CHILDREN


async def test_a_subagents_last_lines_written_seconds_after_its_stop_are_still_read(tmp_path: Path) -> None:
    """Measured on a loaded 2.1.250: a subagent's last lines can land after its SubagentStop. The
    transport reads a finished subagent's file until it has been quiet FINISHED_QUIET_S."""
    projects, payloads = placed_delegation("2.1.250", tmp_path)
    stop = next(p for p in payloads if p["hook_event_name"] == "SubagentStop")
    path = Path(stop["agent_transcript_path"])
    whole = path.read_bytes()
    cut = whole.rindex(b"\n", 0, whole.index(b'"type":"assistant"')) + 1
    path.write_bytes(whole[:cut])  # everything before its assistant message
    record = await through_the_transport(payloads, projects, lambda: path.write_bytes(whole), late_s=2.0)
    used, _ = own_context(path)
    assert {row.id: row.used_tokens for row in record.subagents}[stop["agent_id"]] == used


def _planted(kind: str, projects: Path, real: Path, tmp_path: Path) -> None:
    """Turn the subagent transcript at `real` into something the sidecar must not read."""
    import os

    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(real.read_bytes())
    real.unlink()
    if kind == "symlink":
        real.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(real)
    elif kind == "huge":
        with real.open("wb") as file:  # sparse: 300 MiB of nothing but a size
            file.truncate(300 * 1024 * 1024)
    elif kind == "symlinked-dir":
        subagents = real.parent
        moved = tmp_path / "moved-subagents"
        subagents.rename(moved)
        (moved / real.name).write_bytes(outside.read_bytes())
        subagents.symlink_to(moved)


@pytest.mark.parametrize("kind", ["outside", "traversal", "symlink", "fifo", "huge", "symlinked-dir"])
async def test_a_subagent_transcript_not_where_claude_writes_is_refused(kind: str, tmp_path: Path) -> None:
    """A path outside the projects directory, one walking out of it, a symlink (the file or a
    directory on the way), a FIFO, a huge file: not read; the row keeps null numbers, the sidecar
    keeps serving, and the other subagents' numbers are read as ever."""
    projects, payloads = placed_delegation("2.1.332", tmp_path / "seat")
    victim = next(p for p in payloads if p["hook_event_name"] == "SubagentStop")
    real = Path(victim["agent_transcript_path"])
    if kind == "outside":
        elsewhere = tmp_path / "elsewhere" / real.parent.parent.name / "subagents"
        elsewhere.mkdir(parents=True)
        (elsewhere / real.name).write_bytes(real.read_bytes())
        named = str(elsewhere / real.name)
    elif kind == "traversal":
        named = str(projects / ".." / ".." / "outside" / "x" / "subagents" / real.name)
        Path(named).parent.mkdir(parents=True)
        Path(named).write_bytes(real.read_bytes())  # there to be read, were the path followed
    else:
        _planted(kind, projects, real, tmp_path)
        named = str(real)
    for payload in payloads:
        if payload.get("agent_id") == victim["agent_id"]:
            payload["agent_transcript_path"] = named
            # its SubagentStart names the session; the derived path must be refused the same way
            payload["transcript_path"] = str(Path(named).parent.parent.parent / "s.jsonl") if kind in (
                "outside", "traversal") else payload["transcript_path"]  # fmt: skip
    record = await through_the_transport(payloads, projects)
    rows = {row.id: row for row in record.subagents}
    refused = rows[victim["agent_id"]]
    assert (refused.used_tokens, refused.window_tokens, refused.used_percent) == (None, None, None)
    assert refused.state == "finished"
    others = [row for row in rows.values() if row.id != victim["agent_id"]]
    assert len(others) == 2
    if kind == "symlinked-dir":  # the subagents directory they share is the link: none is read
        assert all(row.used_tokens is None for row in others)
    else:
        assert all(row.used_tokens in CLAUDE_CHILDREN for row in others)


# ---- the write policy: a subagent's changes of one quantum are one write ---------------------------


def parent_reading(*rows: Subagent, used: int = 32_066, at: int = 900) -> Any:
    from guard.policy import Reading
    from guard.record import ContextFields

    return Reading(ContextFields(harness="codex", used_tokens=used, window_tokens=190_000,
                                 used_percent=used * 100 / 190_000, subagents=rows, observed_at_ms=at))  # fmt: skip


def test_a_childs_last_reading_and_its_finish_in_one_quantum_are_one_write() -> None:
    from guard.policy import SUBAGENT_QUANTUM_MS, WriteGuard
    from sidecar.pipeline import Pipeline

    class Offered:
        harness = "codex"

        def feed(self, event: Any, now_ms: int) -> list[Any]:
            return [event]

    pipeline = Pipeline(Offered(), WriteGuard("a", "i"))  # type: ignore[arg-type]
    assert len(pipeline.feed(parent_reading(), 1_000)) == 1
    reading = subagent_row(1, used_tokens=17_472, observed_at_ms=1_100)
    assert pipeline.feed(parent_reading(reading), 1_100) == []  # held: its quantum has begun
    finished = reading.model_copy(update={"state": "finished", "observed_at_ms": 1_400})
    assert pipeline.feed(parent_reading(finished), 1_400) == []  # the finish joins it
    other = subagent_row(2, used_tokens=22_078, observed_at_ms=1_500)  # a parallel child, same quantum
    assert pipeline.feed(parent_reading(finished, other), 1_500) == []
    assert pipeline.tick(1_100 + SUBAGENT_QUANTUM_MS - 1) == []
    [write] = pipeline.tick(1_100 + SUBAGENT_QUANTUM_MS)  # never hidden: written when the quantum ends
    assert write.reason == "bucket"
    assert {(r.id, r.state, r.used_tokens) for r in write.record.subagents} == {
        ("child-1", "finished", 17_472), ("child-2", "running", 22_078)}  # fmt: skip
    assert write.record.observed_at_ms == 900  # the parent's reading, never re-stamped
    assert pipeline.tick(1_100 + 3 * SUBAGENT_QUANTUM_MS) == []  # nothing more is owed


def test_the_parents_own_write_carries_the_held_rows_and_ends_their_quantum() -> None:
    from guard.policy import SUBAGENT_QUANTUM_MS, WriteGuard

    guard = WriteGuard("a", "i")
    first = guard.offer(parent_reading(), 1_000)
    assert first is not None
    guard.committed(first)
    row = subagent_row(1, used_tokens=17_472)
    assert guard.offer(parent_reading(row), 1_100) is None
    parents = guard.offer(parent_reading(row, used=40_000, at=1_200), 1_200)  # its own bucket: at once
    assert parents is not None and parents.record.subagents == (row,)
    guard.committed(parents)
    assert guard.heartbeat_due_ms() is None and guard.tick(1_100 + SUBAGENT_QUANTUM_MS) is None
    # A later crossing of the child's own bucket is a change again.
    crossed = row.model_copy(update={"used_tokens": 40_000, "used_percent": 40_000 * 100 / 190_000})
    assert guard.offer(parent_reading(crossed, used=40_000, at=1_200), 5_000) is None
    assert guard.heartbeat_due_ms() == 5_000 + SUBAGENT_QUANTUM_MS


TIMED_DELEGATIONS = [
    *(("opencode", FIXTURE_ROOT / "opencode" / "delegation" / f"delegation-{v}.rec") for v in OPENCODE_VERSIONS),
    *(("claude", FIXTURE_ROOT / "claude" / "delegation" / v / "sidecar.rec") for v in CLAUDE_VERSIONS),
]


@pytest.mark.parametrize(("harness", "path"), TIMED_DELEGATIONS)
def test_subagent_rows_cost_at_most_half_again_the_writes_on_the_sidecars_own_recordings(
    harness: str, path: Path
) -> None:
    """scripts/bench_write_policy.py's timed rows: each live delegation's `--record`, replayed
    through the live Writer with the rows and without (1.00x to 1.20x measured)."""
    import sys

    from sidecar.registry import spec_for
    from sidecar.replay import replay_recording

    sys.path.insert(0, str(FIXTURE_ROOT.parent / "scripts"))
    from bench_write_policy import without_rows

    spec = spec_for(harness)
    with_rows, _ = replay_recording(spec, path)
    without, _ = replay_recording(without_rows(spec), path)
    assert len(with_rows) <= 1.5 * len(without)
    final = with_rows[-1].record
    assert final.subagents and all(row.state == "finished" and row.used_tokens is not None for row in final.subagents)


# ---- every reader shows them ---------------------------------------------------------------------

READER_ROWS = [
    {"id": "a91242bfc47ae887e", "name": "general-purpose", "model": "claude-subagent-test-1", "usedTokens": 141_000,
     "windowTokens": 150_000, "usedPercent": 94.0, "windowSource": "model-table", "compactions": 0,
     "state": "running", "observedAtMs": 1_795_000_000_000},
    {"id": "aeedf6646904a0072", "name": "general-purpose", "model": "claude-haiku-5-5", "usedTokens": 9_000,
     "windowTokens": None, "usedPercent": None, "windowSource": None, "compactions": None, "state": "finished",
     "observedAtMs": 1_795_000_000_000},
]  # fmt: skip


def test_hctx_top_indents_each_subagent_under_its_agent_with_its_own_fill(tmp_path: Path) -> None:
    from readers_catalog import HOST, NOW, put_record

    from wrapper.readers.roster import collect_roster
    from wrapper.readers.top import render_frame

    put_record(tmp_path, "parent", harness="claude", usedTokens=23_000, windowTokens=200_000, usedPercent=12.0,
               subagents=READER_ROWS)  # fmt: skip
    put_record(tmp_path, "plain", usedPercent=50.0)
    roster = collect_roster(tmp_path, NOW, here=HOST, alive=lambda pid: False)
    lines = render_frame(roster, NOW, catalog=tmp_path, width=200, height=None, colour=False)
    parent = next(i for i, line in enumerate(lines) if "/parent " in line)
    running, finished = lines[parent + 1], lines[parent + 2]
    assert running.startswith("  └ general-purpose a91242bfc47ae887") and "running" in running
    assert "94%" in running and "141k" in running and "150k" in running
    assert finished.startswith("  └ general-purpose aeedf6646904a007") and "finished" in finished
    assert "?" in finished.split("finished", 1)[1] and "9k" in finished  # no window: no percent
    assert "12%" in lines[parent] and "94%" not in lines[parent]  # the agent's own row keeps its own
    plain = next(i for i, line in enumerate(lines) if "/plain " in line)
    assert sum(line.startswith("  └") for line in lines) == 2 and not lines[plain + 1].startswith("  └")


def test_hctx_inspect_lists_each_subagents_own_numbers_and_where_its_window_came_from(tmp_path: Path) -> None:
    from readers_catalog import hctx, put_record

    put_record(tmp_path, "parent", harness="claude", usedTokens=23_000, windowTokens=200_000, usedPercent=12.0,
               subagents=READER_ROWS)  # fmt: skip
    shown = hctx("inspect", "parent", "--catalog", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.startswith("  subagent ")]
    assert len(lines) == 2
    assert "└ general-purpose a91242bfc47ae887" in lines[0] and "running" in lines[0] and "ctx:94%" in lines[0]
    assert "141k/150k" in lines[0] and "window from the model table" in lines[0] and "compactions 0" in lines[0]
    assert "finished" in lines[1] and "ctx:?" in lines[1] and "9k/?" in lines[1]
    assert "window not stated" in lines[1] and "compactions not stated" in lines[1]


def test_a_hostile_subagent_row_never_reaches_a_terminal(tmp_path: Path) -> None:
    """A record whose subagent id or type carries a terminal escape is refused at the record's
    edge: no reader prints it, the agent shows as refused, and the others read as ever."""
    from readers_catalog import hctx, put_record

    hostile = [READER_ROWS[0] | {"id": "x\x1b]0;pwned\x07"}]
    put_record(tmp_path, "hostile", subagents=hostile)
    put_record(tmp_path, "plain", usedPercent=50.0)
    for command in (("agents",), ("inspect", "hostile"), ("top", "--once")):
        shown = hctx(*command, "--catalog", str(tmp_path))
        assert "\x1b]0;" not in shown.stdout and "\x07" not in shown.stdout, command
    listed = hctx("agents", "--catalog", str(tmp_path))
    assert " plain " in listed.stdout and "50%" in listed.stdout


# ---- hctx watch: a subagent crossing a threshold is an event naming parent and subagent ----------


def watched(sub_percent: float | None, *, state: str = "running", parent: float = 12.0) -> Any:
    from readers_catalog import HOST

    from guard.projection import Context
    from wrapper.readers.roster import AgentRow
    from wrapper.readers.watch import Observation

    sub = {"id": "a91242bfc47ae887e", "name": "general-purpose", "model": "claude-subagent-test-1",
           "usedTokens": None if sub_percent is None else int(sub_percent * 1500), "windowTokens": 150_000,
           "usedPercent": sub_percent, "windowSource": "model-table", "compactions": 0, "state": state,
           "observedAtMs": 1_795_000_000_000, "ageMs": 1000}  # fmt: skip
    context = {"harness": "claude", "usedTokens": 24_000, "windowTokens": 200_000, "usedPercent": parent,
               "compactions": 0, "compactAtTokens": None, "observedAtMs": 1_795_000_000_000, "ageMs": 1000,
               "stale": False, "headroomTokens": None, "subagents": [sub]}  # fmt: skip
    return Observation(AgentRow(HOST, "parent", "claude", "running", Context.model_validate(context)), "inc-1")


def test_a_subagent_crossing_a_threshold_is_an_event_naming_parent_and_subagent_once() -> None:
    from wrapper.readers.watch import Settings, dump_state, load_state, step

    state: Any = {}
    told: list[Any] = []
    for percent in (50.0, 82.0, 90.0, 96.0, None, 97.0, 40.0, 81.0):
        events, state = step(state, [watched(percent)], 1_795_000_001_000, Settings())
        told += events
        state = load_state(dump_state(state))  # every step through the saved state: a restart repeats nothing
    assert [(e.kind, e.threshold) for e in told] == [
        ("subagent-fill", 80.0), ("subagent-fill", 95.0), ("subagent-fill", 80.0)]  # fmt: skip
    first = told[0].wire()
    assert (first["agent"], first["subagentId"], first["subagentName"]) == (
        "parent", "a91242bfc47ae887e", "general-purpose")  # fmt: skip
    assert (first["subagentUsedPercent"], first["usedPercent"]) == (82.0, 12.0)  # its own, beside the parent's
    assert "parent" in told[0].message() and "general-purpose a91242bfc47ae887" in told[0].message()
    assert "82%" in told[0].message() and "at or above 80%" in told[0].message()
    assert told[0].env()["HCTX_SUBAGENT_ID"] == "a91242bfc47ae887e"
    # A plain fill event's wire is what it was: no subagent keys.
    parent_events, _ = step({}, [watched(10.0, parent=85.0)], 1_795_000_001_000, Settings())
    assert [e.kind for e in parent_events] == ["fill"] and "subagentId" not in parent_events[0].wire()


def test_a_restarted_watch_tells_a_subagent_crossing_it_already_told_never_again() -> None:
    from wrapper.readers.watch import Settings, dump_state, load_state, step

    events, state = step({}, [watched(85.0)], 1_795_000_001_000, Settings())
    assert [e.kind for e in events] == ["subagent-fill"]
    saved = dump_state(state)
    assert b"subagentsFired" in saved
    again, _ = step(load_state(saved), [watched(86.0)], 1_795_000_002_000, Settings())
    assert again == []


# ---- hostile hooks ---------------------------------------------------------------------------------


def claude_hook(producer: Any, at: int, **payload: Any) -> list[Any]:
    from sidecar.harnesses.claude import producer as claude

    readings = []
    for event in claude.channel_frames(claude.HOOK_TYPE, {"payload": payload}):
        readings += producer.feed(event, at)
    return readings


@pytest.mark.parametrize("hostile", ["a\x1b[2Jb", "a\nb", "a\x00", "x" * 200, "../../etc", "a/b", ".."])
def test_a_hostile_claude_subagent_id_or_type_makes_no_row_and_no_read(hostile: str) -> None:
    """An id or type with a control character (or past 128 characters) makes no row; an id that is
    printable but could name another file (`../../etc`, `a/b`) gets its row, and no path is built
    from it: nothing is read for it."""
    from sidecar.harnesses.claude import producer as claude

    producer = claude.ClaudeProducer()
    session = {"session_id": "s1", "transcript_path": "/home/u/.claude/projects/-w/s1.jsonl"}
    readings = claude_hook(producer, 1, hook_event_name="SubagentStart", agent_id=hostile,
                           agent_type="general-purpose", **session)  # fmt: skip
    printable = hostile.isprintable() and len(hostile) <= 128
    assert (producer.held.subagents.get(hostile) is not None) == printable and len(readings) == int(printable)
    assert producer.wants() == frozenset()  # no path is built from it, none is read
    readings = claude_hook(producer, 2, hook_event_name="SubagentStart", agent_id="aok", agent_type=hostile, **session)
    assert (producer.held.subagents.get("aok") is not None) == printable


def test_thousands_of_claude_subagents_stay_bounded_and_under_the_record_limit() -> None:
    from sidecar.harnesses.claude import producer as claude
    from sidecar.harnesses.claude.subagents import ModelWindows, SubagentUsage

    producer = claude.ClaudeProducer()
    producer.feed(ModelWindows({"claude-subagent-test-1": 150_000}), 0)
    session = {"session_id": "s1", "transcript_path": "/home/u/.claude/projects/-w/s1.jsonl"}
    for n in range(5_000):
        ident = f"a{n:016x}"
        claude_hook(producer, n, hook_event_name="SubagentStart", agent_id=ident, agent_type="x" * 128, **session)
        producer.feed(SubagentUsage(ident, 149_999, "claude-subagent-test-1", n), n)
    reading = producer.held.subagents.onto(None, "claude", 5_000)
    assert len(reading.subagents) == MAX_SUBAGENTS
    assert len(producer.held.subagents._rows) <= 256 and len(producer._transcripts) <= 256
    assert len(producer.wants()) == MAX_SUBAGENTS  # only the record's newest are followed
    record = HarnessContext(**dict(reading), agent="a", incarnation="i", written_at_ms=5_000)
    assert len(record.to_json().encode()) < MAX_RECORD_BYTES
    # A usage for a subagent no hook started (a planted transcript) makes no row.
    assert producer.feed(SubagentUsage("a-never-started", 1, None, 9_000), 9_000) == []


# ---- omp: the extension's `subagent` frames, one per task child's own session ----------------------

OMP_VERSIONS = ("18.1.16", "18.2.3")
OMP_CHILDREN = {"Child5000": 5_000, "Child5001": 5_001, "Child7000": 7_000}
OMP_PARENT_TOKENS, OMP_WINDOW = 1_300, 32_000


def omp_writes(version: str) -> list[Write]:
    """The sidecar's own `--record` of the live delegation, replayed through the live driver."""
    writes, summary = replay_recording(spec_for("omp"), FIXTURE_ROOT / "pi" / "delegation" / f"omp-{version}.rec")
    assert not summary.problems and not summary.lost_chunks and not summary.truncated
    return writes


def omp_frames(version: str) -> list[dict[str, Any]]:
    """The extension's channel frames in the recording (its chunks: each connection's bytes, base64)."""
    import base64

    streams: dict[object, bytes] = {}
    for line in (FIXTURE_ROOT / "pi" / "delegation" / f"omp-{version}.rec").read_bytes().splitlines()[1:]:
        chunk = json.loads(line)
        if chunk.get("wire") == "channel" and isinstance(chunk.get("b64"), str):
            streams[chunk["stream"]] = streams.get(chunk["stream"], b"") + base64.b64decode(chunk["b64"])
    return [json.loads(text) for data in streams.values() for text in data.splitlines() if text.strip()]


@pytest.mark.parametrize("version", OMP_VERSIONS)
def test_the_omp_recording_is_a_real_delegation(version: str) -> None:
    frames = omp_frames(version)
    children = {frame["id"] for frame in frames if frame["type"] == "subagent"}
    assert children == set(OMP_CHILDREN)
    # Each child's own session stated its served prompt; the parent's frames never did.
    stated = {(f["id"], f["reading"]["tokens"]) for f in frames if f["type"] == "subagent" and f["reading"]}
    assert {(child, tokens) for child, tokens in OMP_CHILDREN.items()} <= stated
    parent = {f["reading"]["tokens"] for f in frames if f["type"] == "context" and f["reading"]}
    assert OMP_PARENT_TOKENS in parent and not parent & set(OMP_CHILDREN.values())


@pytest.mark.parametrize("version", OMP_VERSIONS)
def test_omp_rows_are_each_childs_own_reading_and_finish(version: str) -> None:
    writes = omp_writes(version)
    final = writes[-1].record
    rows = {row.id: row for row in final.subagents}
    assert {row_id: row.used_tokens for row_id, row in rows.items()} == OMP_CHILDREN
    for row in rows.values():
        assert row.used_tokens != OMP_PARENT_TOKENS  # never the parent's number
        assert (row.window_tokens, row.window_source, row.model, row.state) == (
            OMP_WINDOW, "harness", "fake-32k", "finished")  # fmt: skip
        assert row.used_percent == row.used_tokens * 100 / OMP_WINDOW
    # The parent's row: its own reading in every write, never a child's.
    assert final.used_tokens == OMP_PARENT_TOKENS
    assert not {write.record.used_tokens for write in writes} & set(OMP_CHILDREN.values())


def omp_subagent(producer: Any, now_ms: int, **frame: Any) -> list[Any]:
    from sidecar.harnesses.pi import producer as pi

    base = {
        "type": "subagent",
        "event": "agent_end",
        "id": "Child1",
        "state": "running",
        "compactions": 0,
        "reading": {"tokens": 5_000, "contextWindow": 32_000, "percent": 15.625, "model": "m", "costUsd": None},
    }
    readings: list[Any] = []
    for decoded in pi.channel_frames("subagent", base | frame):
        readings += producer.feed(decoded, now_ms)
    return readings


def test_an_omp_subagent_frame_never_touches_the_parents_numbers() -> None:
    from sidecar.harnesses.pi import producer as pi

    producer = pi.PiProducer("omp")
    parent = {
        "type": "context",
        "event": "turn_end",
        "compaction": None,
        "compactions": 0,
        "reading": {"tokens": 1_300, "contextWindow": 200_000, "percent": 0.65, "model": "p", "costUsd": 1.0},
    }
    (decoded,) = pi.channel_frames("context", parent)
    producer.feed(decoded, 1)
    (reading,) = omp_subagent(producer, 2)
    fields = reading.fields
    assert (fields.used_tokens, fields.window_tokens, fields.observed_at_ms) == (1_300, 200_000, 1)
    (row,) = reading.fields.subagents
    assert (row.used_tokens, row.window_tokens, row.used_percent, row.state) == (5_000, 32_000, 15.625, "running")
    assert row.window_tokens != 200_000  # never the parent's window
    # omp's async-result names the job done, with no reading: the row keeps its own numbers, finished.
    (reading,) = omp_subagent(producer, 3, event="async-result", state="finished", reading=None, compactions=None)
    (row,) = reading.fields.subagents
    assert (row.used_tokens, row.state, row.compactions) == (5_000, "finished", 0)


@pytest.mark.parametrize("hostile", ["a\x1b[2Jb", "a\nb", "a\x00", "x" * 200])
def test_a_hostile_omp_subagent_id_makes_no_row(hostile: str) -> None:
    from sidecar.harnesses.pi import producer as pi

    producer = pi.PiProducer("omp")
    assert omp_subagent(producer, 1, id=hostile) == []
    assert producer.held.subagents.get(hostile) is None


@pytest.mark.parametrize("tokens", [-1, 10**30, 1.5, "5000", True])
def test_a_huge_or_negative_omp_subagent_number_is_refused(tokens: object) -> None:
    from guard.errors import FrameRejected
    from sidecar.harnesses.pi import producer as pi

    producer = pi.PiProducer("omp")
    reading = {"tokens": tokens, "contextWindow": 32_000, "percent": 1.0, "model": "m", "costUsd": None}
    with pytest.raises(FrameRejected):
        omp_subagent(producer, 1, reading=reading)
    assert producer.held.subagents.get("Child1") is None


def test_thousands_of_omp_subagents_stay_bounded_and_under_the_record_limit() -> None:
    from sidecar.harnesses.pi import producer as pi

    producer = pi.PiProducer("omp")
    for n in range(3_000):
        omp_subagent(producer, n, id=f"Child{n:0120d}")
    reading = producer.held.subagents.onto(None, "omp", 3_000)
    assert len(reading.subagents) == MAX_SUBAGENTS
    record = HarnessContext(**dict(reading), agent="a", incarnation="i", written_at_ms=3_000)
    assert len(record.to_json().encode()) < MAX_RECORD_BYTES


# ---- issue 40: a subagent is never the agent; the newest of one millisecond are kept -------------


def test_a_codex_child_whose_id_is_the_parents_own_is_refused_and_counted() -> None:
    """A hostile stream spawning the agent's own thread as its child: the agent's readings stay the
    agent's (without the refusal, the parent's next reading became a subagent row) and the frame is
    a counted drop."""
    from guard.policy import WriteGuard
    from sidecar.harnesses.codex.events import SubagentsSpawned
    from sidecar.pipeline import Pipeline

    pipeline = Pipeline(codex.CodexProducer(), WriteGuard("a", "i"))
    pipeline.feed(ThreadOpened(thread_id="p"), 1)
    usage = TokenUsage(thread_id="p", tokens_in_window=32_066, session_total_tokens=32_066, context_window=190_000)
    pipeline.feed(usage, 2)
    assert pipeline.feed(SubagentsSpawned(sender_thread_id="p", thread_ids=("c", "p"), model=None), 3) == []
    assert pipeline.drops["producer"] == 1
    pipeline.feed(usage.model_copy(update={"tokens_in_window": 34_100}), 4)
    held = pipeline.producer.held.reading  # type: ignore[attr-defined]
    assert held.used_tokens == 34_100 and held.subagents == ()


@pytest.mark.parametrize("frame", ["part", "session"])
def test_an_opencode_child_whose_id_is_its_parents_own_is_refused_and_counted(frame: str) -> None:
    from guard.policy import WriteGuard
    from sidecar.pipeline import Pipeline

    pipeline = Pipeline(opencode.OpenCodeProducer(), WriteGuard("a", "i"))
    part = {"id": "e1", "type": "message.part.updated", "properties": {"part": {
        "type": "tool", "tool": "task", "sessionID": "p",
        "state": {"status": "running", "metadata": {"sessionId": "p", "parentSessionId": "p"}}}}}  # fmt: skip
    session = {"id": "e1", "type": "session.updated", "properties": {"info": {"id": "p", "parentID": "p"}}}
    message = {"id": "e2", "type": "message.updated", "properties": {"info": {
        "id": "m", "role": "assistant", "sessionID": "p", "providerID": "fake", "modelID": "small",
        "tokens": {"total": 30_100}}}}  # fmt: skip
    for raw in (part if frame == "part" else session, message):
        for event in opencode.parse_event(json.dumps(raw).encode()):
            pipeline.feed(event, 2)
    assert pipeline.drops["producer"] == 1
    held = pipeline.producer.held.reading  # type: ignore[attr-defined]
    assert held is not None and held.used_tokens == 30_100 and held.subagents == ()


def test_of_subagents_started_in_one_millisecond_the_newest_sixteen_are_kept() -> None:
    producer = codex.CodexProducer()
    producer.feed(ThreadOpened(thread_id="p"), 0)
    from sidecar.harnesses.codex.events import SubagentsSpawned

    for n in range(40):
        producer.feed(SubagentsSpawned(sender_thread_id="p", thread_ids=(f"c{n}",), model=None), 7)
    reading = producer.held.reading
    assert reading is not None
    assert [row.id for row in reading.subagents] == [f"c{n}" for n in range(39, 39 - MAX_SUBAGENTS, -1)]
