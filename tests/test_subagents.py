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

from guard.policy import Write
from sidecar.harnesses.codex import producer as codex
from sidecar.harnesses.codex.events import ThreadOpened, TokenUsage
from sidecar.harnesses.codex.transcript import RolloutDecoder
from sidecar.harnesses.opencode import producer as opencode
from sidecar.replay import replay
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
    return list(replay(codex.SPEC, codex.SPEC.read_recording([codex_recording(version)])))


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
    folder = FIXTURE_ROOT / "opencode" / "delegation"
    paths = [folder / f"delegation-{version}.providers.json", folder / f"delegation-{version}.events.sse"]
    return list(replay(opencode.SPEC, opencode.SPEC.read_recording(paths)))


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
    records = [write.record for write in writes]
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
            assert producer.feed(event, 2) == []  # type: ignore[arg-type]
    assert producer.last_reading is None and producer.compactions == 0
