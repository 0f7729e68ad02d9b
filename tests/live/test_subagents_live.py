"""Live (issue 28): a real harness that delegates, under `hctx wrap`: the parent's record never
carries a subagent's numbers.

The fake model servers make the real binaries delegate as a real model would: Codex's model calls
`spawn_agent` (`multi_agent_v1`, on by default in 0.151.0 and 0.171.0) twice in parallel, then
`wait_agent`, and in a later turn once (tests/fakes/codex_model.py); OpenCode's calls its `task`
tool (tests/fakes/opencode_model.py). Every child's numbers are the markers its own task text
carries, different from every number the parent's requests report, so a child's reading in the
parent's record is a number the parent never had.

With `$HCTX_DELEGATION_RECORD_DIR` set (to `fixtures`), each run's wire bytes are kept as the
fixtures the producer tests replay: `codex/codex-<v>-delegation.jsonl` (the app-server's stdout,
verbatim), `opencode/delegation-<v>.events.sse` (the `/event` stream, verbatim).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from guard.record import HarnessContext
from tests.fakes.claude_model import FakeMessages, fake_messages
from tests.fakes.codex_client import CodexClient, stdio_client
from tests.fakes.opencode_model import TASK_AGENT, OpenCodeFakeModel, opencode_fake_model
from tests.fakes.pi_model import DEFAULT_USAGE, SUMMARY_USAGE
from tests.fakes.pi_model import fake_model as pi_fake_model
from tests.harnesses import HARNESS_VERSIONS, harness_command, require_harness
from tests.live.test_claude_live import MODEL as CLAUDE_MODEL
from tests.live.test_claude_live import (
    RENDERER,
    claude_seat,
    live_env,
    require_tmux,
    tmux_session,
    wait_gone,
    wait_pane,
    wait_record,
)
from tests.live.test_claude_live import (
    WINDOW as CLAUDE_WINDOW,
)
from tests.live.test_codex_live import AGENT, Lab, lab
from tests.live.test_opencode_live import TURN_S, WINDOW, Box, new_session, opencode_under_wrap, prompt, wait_for
from tests.live.test_pi_live import AGENT as PI_AGENT
from tests.live.test_pi_live import WINDOW as PI_WINDOW
from tests.live.test_pi_live import Catalog, Rpc, Run, write_config
from tests.live.test_pi_live import _isolated_env as pi_isolated_env
from tests.live.test_pi_live import wrapped as pi_wrapped
from tests.wrapping import agent_dir, assert_replays_as_logged, log_events, wrap_argv

pytestmark = pytest.mark.live

RECORD_ENV = "HCTX_DELEGATION_RECORD_DIR"

# Codex: the parent's usage per request, and each child's, as `last.totalTokens`.
CODEX_PARENT_TURN = "turn 1: hello [[u:30000:500]]"
# Two children in parallel: 17,000/472 and 22,000/78 (the 17,472 and 22,078).
CODEX_PARALLEL = (
    "turn 2: split it [[u:32000:66]] [[spawn:17000:472]] [[spawn:22000:78]] [[w:32500:100]] [[a:33000:662]]"
)
# One child: 26,000/370.
CODEX_ONCE = "turn 3: one more [[u:34000:100]] [[spawn:26000:370]] [[w:34200:100]] [[a:35000:500]]"
CODEX_PARENT_TOKENS = {30_500, 32_066, 32_600, 33_662, 34_100, 34_300, 35_500}
CODEX_CHILD_TOKENS = {17_472, 22_078, 26_370}


def keep_recording(data: bytes, relative: str) -> None:
    destination = os.environ.get(RECORD_ENV)
    if destination:
        path = Path(destination) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def usage_by_thread(client: CodexClient) -> dict[str, list[int]]:
    """`last.totalTokens` of every `thread/tokenUsage/updated` the app-server sent, by thread."""
    found: dict[str, list[int]] = {}
    for message in client.messages:
        if message.get("method") == "thread/tokenUsage/updated":
            params = message["params"]
            found.setdefault(params["threadId"], []).append(params["tokenUsage"]["last"]["totalTokens"])
    return found


def children_of(client: CodexClient) -> set[str]:
    """The threads the parent's `collabAgentToolCall` spawn items name as receivers."""
    children: set[str] = set()
    for message in client.messages:
        item: dict[str, Any] = (message.get("params") or {}).get("item") or {}
        spawned = item.get("type") == "collabAgentToolCall" and item.get("tool") == "spawnAgent"
        if message.get("method") == "item/completed" and spawned:
            children.update(item.get("receiverThreadIds") or [])
    return children


def children_done(client: CodexClient, expected: int, _: object) -> bool:
    children = children_of(client)
    finished = sum(1 for m in client.messages if m.get("method") == "turn/completed")
    return len(children) == expected and all(usage_by_thread(client).get(c) for c in children) and finished > expected


async def codex_delegation(client: CodexClient, run: Lab) -> str:
    await client.initialize()
    thread = await client.start_thread(run.work)
    await client.turn(thread, CODEX_PARENT_TURN)
    await run.record_when(lambda r: r.used_tokens == 30_500, "turn 1")
    for text, children in ((CODEX_PARALLEL, 2), (CODEX_ONCE, 3)):
        await client.turn(thread, text, limit_s=90)
        # Every child has reported and finished (they run in the background of the parent's turn).
        await client.wait_for(partial(children_done, client, children), 90)
    return thread


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_codex_parent_record_never_carries_a_spawned_agents_numbers(version: str, tmp_path: Path) -> None:
    async with lab(version, tmp_path) as run:
        with trio.fail_after(240):
            async with stdio_client(run.wrapped(), env=run.env, cwd=run.work, stderr=tmp_path / "wrap.stderr") as (
                client,
                _process,
                stdout,
            ):
                thread = await codex_delegation(client, run)
                final = await run.record_when(lambda r: r.used_tokens == 35_500, "the parent's last turn")
        keep_recording(bytes(stdout), f"codex/codex-{version}-delegation.jsonl")
    usage = usage_by_thread(client)
    children = children_of(client)
    # What the real binary did: three children, no thread/started for any, their usage on this
    # connection under their own ids, their numbers the fake gave them.
    assert len(children) == 3 and thread not in children
    assert {m["params"]["thread"]["id"] for m in client.messages if m.get("method") == "thread/started"} == {thread}
    assert {tokens for child in children for tokens in usage[child]} == CODEX_CHILD_TOKENS
    assert set(usage[thread]) <= CODEX_PARENT_TOKENS
    # The parent's record: only ever the parent's numbers, in every write the sidecar made.
    writes = [e for e in log_events(run.catalog, AGENT) if e["event"] == "write"]
    assert writes and all(w["usedTokens"] in CODEX_PARENT_TOKENS for w in writes), writes
    assert not {w["usedTokens"] for w in writes} & CODEX_CHILD_TOKENS
    # Its session total is the parent thread's own `total.totalTokens`, never a child's.
    parent_totals = [
        m["params"]["tokenUsage"]["total"]["totalTokens"]
        for m in client.messages
        if m.get("method") == "thread/tokenUsage/updated" and m["params"]["threadId"] == thread
    ]
    assert final.session_total_tokens == parent_totals[-1]
    record = json.loads(run.record_path.read_bytes())
    assert record["usedTokens"] == 35_500
    # Each child its own row: its thread, its own last reading and window, finished.
    rows = {row["id"]: row for row in record["subagents"]}
    assert set(rows) == children
    for child in children:
        assert (rows[child]["usedTokens"], rows[child]["state"]) == (usage[child][-1], "finished")
        assert rows[child]["windowTokens"] == 190_000


# ---- OpenCode: the `task` tool's child sessions --------------------------------------------------

# The child sessions run on another model with its own window, as the did.
CHILD_MODEL, CHILD_WINDOW = "fake-small", 64_000
OPENCODE_PARALLEL = "split it [[u:30000:100]] [[task:12000:345]] [[task:15000:678]] [[a:31000:200]]"
OPENCODE_ONCE = "one more [[u:32000:100]] [[task:18000:900]] [[a:33000:300]]"
OPENCODE_PARENT_TOKENS = {30_100, 31_200, 32_100, 33_300}
OPENCODE_CHILD_TOKENS = {12_345, 15_678, 18_900}


class DelegatingBox(Box):
    """The live OpenCode box with a second model the `general` agent (the `task` tool's) runs on."""

    def env(self, fake: OpenCodeFakeModel) -> dict[str, str]:
        env = super().env(fake)
        path = self.root / "opencode.json"
        config = json.loads(path.read_text())
        config["provider"]["fake"]["models"][CHILD_MODEL] = {
            "name": "Fake Small Model",
            "limit": {"context": CHILD_WINDOW, "output": 4_096},
            "cost": {"input": 1, "output": 2},
        }
        config["agent"] = {TASK_AGENT: {"model": f"fake/{CHILD_MODEL}"}}
        path.write_text(json.dumps(config))
        return env


@pytest.fixture(params=list(HARNESS_VERSIONS["opencode"]), ids=lambda v: f"opencode-{v}")
def delegating_box(request: pytest.FixtureRequest, tmp_path: Path) -> DelegatingBox:
    return DelegatingBox(tmp_path, request.param, require_harness("opencode", request.param))


async def record_events(client: httpx.AsyncClient, into: bytearray, *, task_status: Any) -> None:
    """The `/event` stream's bytes, verbatim, as a client of the server receives them."""
    async with client.stream("GET", "/event", timeout=None) as response:
        task_status.started()
        async for chunk in response.aiter_raw():
            into.extend(chunk)


def sse_objects(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in data.split(b"\n") if line.startswith(b"data:")]


async def test_opencode_parent_record_never_carries_a_task_sessions_numbers(delegating_box: DelegatingBox) -> None:
    box, agent = delegating_box, "oc-delegates"
    events = bytearray()
    recording = box.root / "delegation.rec"
    async with opencode_fake_model() as fake, opencode_under_wrap(box, fake, agent, record=recording) as client:
        providers = (await client.get("/config/providers")).content
        async with trio.open_nursery() as nursery:
            await nursery.start(record_events, client, events)
            session = await new_session(client, "hctx delegation")
            await prompt(client, session, OPENCODE_PARALLEL)
            await wait_for("the parallel turn", lambda: (r := box.records(agent)) and r.used_tokens == 31_200, TURN_S)
            await prompt(client, session, OPENCODE_ONCE)
            final = await wait_for("the last turn", lambda: (r := box.records(agent)) and r.used_tokens == 33_300 and r,
                                   TURN_S)  # fmt: skip
            await trio.sleep(1.0)  # the stream's last frames
            nursery.cancel_scope.cancel()
    keep_recording(bytes(events), f"opencode/delegation-{box.version}.events.sse")
    keep_recording(providers, f"opencode/delegation-{box.version}.providers.json")
    # The sidecar's own `--record`, timed as the bytes arrived: what bench_write_policy.py replays.
    keep_recording(recording.read_bytes(), f"opencode/delegation-{box.version}.rec")
    frames = sse_objects(bytes(events))
    children = {
        f["properties"]["info"]["id"]
        for f in frames
        if f.get("type") in ("session.created", "session.updated") and f["properties"]["info"].get("parentID")
    }
    totals: dict[str, set[int]] = {}
    for f in frames:
        info = f.get("properties", {}).get("info", {})
        if (
            f.get("type") == "message.updated"
            and info.get("role") == "assistant"
            and info.get("tokens", {}).get("total")
        ):
            totals.setdefault(info["sessionID"], set()).add(info["tokens"]["total"])
    # What the real binary did: three child sessions naming the parent, on the other model.
    assert len(children) == 3 and session not in children
    assert {t for child in children for t in totals.get(child, set())} == OPENCODE_CHILD_TOKENS
    assert totals[session] <= OPENCODE_PARENT_TOKENS
    # Every write: the parent's numbers, or (before its first turn completed, its children's rows
    # already landing) none at all; never a child's tokens or its model's 64,000-token window.
    writes = box.writes(agent)
    assert writes and {w["usedTokens"] for w in writes} <= OPENCODE_PARENT_TOKENS | {None}, writes
    assert {w["windowTokens"] for w in writes} <= {WINDOW, None}
    assert (final.model, final.window_tokens, final.session_id) == ("fake/fake-model", WINDOW, session)
    # Each child its own row, on its own model and window, finished.
    rows = {row.id: row for row in final.subagents}
    assert set(rows) == children
    assert {row.used_tokens for row in rows.values()} == OPENCODE_CHILD_TOKENS
    assert {(row.model, row.window_tokens, row.state) for row in rows.values()} == {
        (f"fake/{CHILD_MODEL}", CHILD_WINDOW, "finished")
    }


# ---- Claude: the `Agent` tool's background subagents ---------------------------------------------

# Main agent: 2,001 + 8,000 + 10,000 = 20,001 in its window, then 21,100 and 23,000 after the
# subagents report. Subagents: 1,000 + 2,000 + 3,000 = 6,000; 7,500; 9,000 (input + cache
# creation + cache read, as for the main agent). The first two run on CLAUDE_CODE_SUBAGENT_MODEL,
# a model the user's model table gives a 150,000-token window (not the parent's 200,000); the
# third asks the Agent tool for `haiku`, a model id no table lists: its window stays null.
CLAUDE_PARALLEL = (
    "Delegate twice usage=2001,8000,10000,111 agent=1000,2000,3000,40 agent=1500,2500,3500,50 after=2100,8000,11000,120"
)
CLAUDE_ONCE = "Delegate once usage=2200,9000,11000,130 agent@haiku=2000,3000,4000,60 after=2000,9000,12000,140"
CLAUDE_PARENT_TOKENS = {20_001, 21_100, 22_200, 23_000}
CLAUDE_CHILD_TOKENS = {6_000, 7_500, 9_000}
SUBAGENT_MODEL, SUBAGENT_WINDOW = "claude-subagent-test-1", 150_000
HOOK_RECORDER = f"{sys.executable} -S -c " + shlex.quote(
    "import sys; open(sys.argv[1], 'ab').write(sys.stdin.buffer.read().strip() + b'\\n')"
)


# The user's own `subagentStatusLine` (issue 37): keeps every payload Claude hands it, one a line, and
# answers Claude's row protocol, a `{"id", "content"}` line a row, so its rows draw under hctx.
ROW_RECORDER = f"{sys.executable} -S -c " + shlex.quote(
    "import json,sys; d=sys.stdin.buffer.read(); open(sys.argv[1], 'ab').write(d.strip() + b'\\n'); "
    "[print(json.dumps({'id': t['id'], 'content': 'USER-ROW ' + t['id']})) for t in json.loads(d)['tasks']]"
)
# A subagent's request is held this long: it runs across a tick of Claude's 5 s row refresh.
CHILD_HOLD_S = 6.0


def subagent_hooks(log: Path) -> dict[str, Any]:
    """User-level hooks that keep every SubagentStart/SubagentStop payload verbatim, one a line."""
    command = f"{HOOK_RECORDER} {shlex.quote(str(log))}"
    return {
        event: [{"hooks": [{"type": "command", "command": command}]}] for event in ("SubagentStart", "SubagentStop")
    }


def stated_windows(log: Path) -> dict[str, int]:
    """The `contextWindowSize` Claude last stated for each `tasks[]` row id in the user's row log."""
    if not log.exists():
        return {}
    lines = [json.loads(line) for line in log.read_bytes().splitlines() if line.strip()]
    return {t["id"]: t["contextWindowSize"] for p in lines for t in p["tasks"] if t.get("contextWindowSize")}


def hook_payloads(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_bytes().splitlines() if line.strip()]


QUIET_S = 3.0


async def wait_stops(log: Path, count: int, pane: Any, server: FakeMessages) -> None:
    """Until `count` SubagentStop payloads landed; else fail with the screen and the requests."""
    with trio.move_on_after(90):
        # Every subagent stopped, then no request for QUIET_S: the main agent has answered the tool
        # result and every notification (2.1.250 may take two in one request) and is at its prompt.
        while sum(p["hook_event_name"] == "SubagentStop" for p in hook_payloads(log)) < count:  # noqa: ASYNC110
            await trio.sleep(0.2)  # another process writes the file
        seen = -1
        while seen != len(server.requests):
            seen = len(server.requests)
            await trio.sleep(QUIET_S)
        return
    served = [(s.kind, s.usage, len(s.calls)) for s in server.requests]
    raise AssertionError(f"{count} subagents never stopped: {hook_payloads(log)}\n{served}\n{await pane.text()}")


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_claude_subagents_rows_are_their_own_transcripts_numbers(version: str, tmp_path: Path) -> None:
    claude = require_harness("claude", version)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    hooks_log = tmp_path / "subagent-hooks.jsonl"
    rows_log = tmp_path / "subagent-statusline.jsonl"
    rows_command = {"type": "command", "command": f"{ROW_RECORDER} {shlex.quote(str(rows_log))}"}
    settings = {"hooks": subagent_hooks(hooks_log), "subagentStatusLine": rows_command}
    (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    table = home / ".config" / "hctx" / "models.json"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(json.dumps({"schema": "hctx.model-windows.v1", "windows": {SUBAGENT_MODEL: SUBAGENT_WINDOW}}))
    agent = "claude-delegates"
    record_path = agent_dir(catalog, agent) / "harness-context"
    recording = tmp_path / "delegation.rec"
    server: FakeMessages
    async with fake_messages() as server:
        server.child_hold_s = CHILD_HOLD_S
        command = wrap_argv(catalog, agent, "claude", *claude, "--model", CLAUDE_MODEL,
                            extra=("--record", str(recording)))  # fmt: skip
        env = live_env(home, server, version) | {"CLAUDE_CODE_SUBAGENT_MODEL": SUBAGENT_MODEL}
        async with tmux_session(command, work, env) as pane:
            await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == CLAUDE_WINDOW)
            await wait_pane(pane, "OPERATOR-LINE used=None")  # the TUI is up and takes input
            for text, stops in ((CLAUDE_PARALLEL, 2), (CLAUDE_ONCE, 3)):
                await pane.type(text)
                await wait_stops(hooks_log, stops, pane, server)
            final = await wait_record(record_path, pane, "the last reply", lambda r: r["usedTokens"] == 23_000)
            done = await wait_record(
                record_path,
                pane,
                "every subagent's own numbers, and the window Claude states for each",
                lambda r: (
                    len([s for s in r.get("subagents", []) if s["usedTokens"] is not None and s["state"] == "finished"])
                    == 3
                    and all(
                        s["windowTokens"] == stated_windows(rows_log).get(s["id"], s["windowTokens"])
                        for s in r["subagents"]
                    )
                ),
            )
            await pane.type("/exit")
            await wait_gone(work / ".claude", "/exit")
    payloads = hook_payloads(hooks_log)
    projects = home / ".claude" / "projects"
    [transcript] = [path for path in projects.rglob("*.jsonl") if "subagents" not in path.parts]
    subagent_files = sorted((transcript.parent / transcript.stem / "subagents").iterdir())
    # Recorded with hctx's `subagentStatusLine` (issue 37); claude/delegation/ holds the recordings
    # from before it, in which Claude states no subagent's window.
    destination = f"claude/delegation-rows/{version}"
    keep_recording(hooks_log.read_bytes(), f"{destination}/subagent-hooks.jsonl")
    keep_recording(transcript.read_bytes(), f"{destination}/session.jsonl")
    keep_recording(recording.read_bytes(), f"{destination}/sidecar.rec")
    keep_recording(rows_log.read_bytes() if rows_log.exists() else b"", f"{destination}/subagent-statusline.jsonl")
    for path in subagent_files:
        keep_recording(path.read_bytes(), f"{destination}/subagents/{path.name}")
    # What the real binary did: three subagents, started and stopped, each with its own transcript.
    starts = [p for p in payloads if p["hook_event_name"] == "SubagentStart"]
    stops = [p for p in payloads if p["hook_event_name"] == "SubagentStop"]
    assert len(starts) == len(stops) == 3 and {p["agent_id"] for p in starts} == {p["agent_id"] for p in stops}
    own: dict[str, tuple[int, str]] = {}  # agent id -> (its newest context, its model), read here
    outputs: dict[str, int] = {}  # agent id -> its newest reply's output tokens
    for stop in stops:
        path = Path(stop["agent_transcript_path"])
        assert path.is_relative_to(projects) and path.name == f"agent-{stop['agent_id']}.jsonl"
        for line in path.read_bytes().splitlines():
            message = json.loads(line).get("message") or {}
            if isinstance(message, dict) and isinstance(usage := message.get("usage"), dict):
                used = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
                own[stop["agent_id"]] = (used, message["model"])
                outputs[stop["agent_id"]] = usage["output_tokens"]
    assert {used for used, _ in own.values()} == CLAUDE_CHILD_TOKENS
    # Issue 37, measured: Claude handed its `subagentStatusLine` (the user's, chained by hctx's tee)
    # a row per Task subagent, its `id` the hooks' `agent_id`, its `contextWindowSize` stated for the
    # row's model; its `tokenCount` 0 until the subagent's first reply, then that reply's prompt plus
    # an output: on 2.1.332 the reply's (40), on 2.1.250 the 1 its stream opened with (`message_start`),
    # summed over replies (the bundled code). Never the prompt the record counts as occupancy.
    rows_payloads = [json.loads(line) for line in rows_log.read_bytes().splitlines()]
    tasks = [task for payload in rows_payloads for task in payload["tasks"]]
    assert tasks and {task["id"] for task in tasks} == set(own)
    stated = stated_windows(rows_log)
    assert set(stated) == set(own) and all(window > 0 for window in stated.values())
    for task in tasks:
        used, _ = own[task["id"]]
        output = outputs[task["id"]] if version == "2.1.332" else 1
        assert task["tokenCount"] in (0, used + output) and task["tokenCount"] != used
    # The parent's record: the main agent's numbers only (the status line never names a subagent).
    writes = [e for e in log_events(catalog, agent) if e["event"] == "write" and e["usedTokens"] is not None]
    assert writes and {w["usedTokens"] for w in writes} <= CLAUDE_PARENT_TOKENS, writes
    assert final["windowTokens"] == CLAUDE_WINDOW and final["model"] == CLAUDE_MODEL
    # Each subagent's row: its own transcript's numbers, finished; its window the one Claude stated
    # for it (issue 37: `windowSource: "harness"`), where Claude stated one; else the model table's
    # for its own model, named so, or null; never the parent's.
    rows = {row["id"]: row for row in done["subagents"]}
    assert set(rows) == set(own)
    for agent_id, (used, model) in own.items():
        row = rows[agent_id]
        assert (row["usedTokens"], row["model"], row["state"]) == (used, model, "finished")
        assert row["name"] == "general-purpose"
        if agent_id in stated:
            assert (row["windowTokens"], row["windowSource"]) == (stated[agent_id], "harness")
            assert row["usedPercent"] == used * 100 / stated[agent_id]
        elif model == SUBAGENT_MODEL:
            assert (row["windowTokens"], row["windowSource"]) == (SUBAGENT_WINDOW, "model-table")
            assert row["usedPercent"] == used * 100 / SUBAGENT_WINDOW
        else:  # `haiku`, which no table lists
            assert (row["windowTokens"], row["windowSource"], row["usedPercent"]) == (None, None, None)
    # The parallel two ran on CLAUDE_CODE_SUBAGENT_MODEL; the third's `model: haiku` wins over it
    # on 2.1.332 and not on 2.1.250 (measured): on either, each row is its own model's.
    on_table = sorted(model == SUBAGENT_MODEL for _, model in own.values())
    assert on_table == ([True, True, True] if version == "2.1.250" else [False, True, True])
    await assert_replays_as_logged(catalog, agent, recording)


# ---- omp: the `task` tool's subagents, the extension rebound to each child's own session ----------

# The parent's every request is served 1,300/20 (or 700/120) (its record: omp's prompt-only 1,300, or omp's own
# estimate before its first reply); child K of the parallel turn is served 5,000+K/40, the single
# turn's child 7,000/40, each named for its number (tests/fakes/pi_model.py): numbers the parent
# never had.
OMP_PARALLEL = "split it [[task:2:5000:40]]"
OMP_ONCE = "once more [[task:1:7000:40]]"
OMP_CHILDREN = {"Child5000": 5_000, "Child5001": 5_001, "Child7000": 7_000}
OMP_CHILD_TOKENS = set(OMP_CHILDREN.values())
OMP_PARENT = {DEFAULT_USAGE, SUMMARY_USAGE}


def omp_finished(want: int) -> Callable[[HarnessContext], bool]:
    return lambda record: len(record.subagents) == want and all(row.state == "finished" for row in record.subagents)


async def omp_delegation(rpc: Rpc, catalog: Catalog) -> HarnessContext:
    """The two delegating turns (two parallel children, then one), each settled: the record after,
    for a wrapped seat and an adopted one alike."""
    await rpc.turn(OMP_PARALLEL)
    await catalog.settles(omp_finished(2), "both parallel children finished")
    await rpc.idle()
    await rpc.turn(OMP_ONCE)
    final = await catalog.settles(omp_finished(3), "the single child finished too")
    await rpc.idle()
    return final


@pytest.mark.parametrize("version", HARNESS_VERSIONS["omp"])
async def test_omp_subagent_rows_are_each_childs_own_reading(version: str) -> None:
    require_harness("omp", version)
    home = Path(tempfile.mkdtemp(prefix="hctx-ompsub-", dir="/tmp"))  # the channel socket's path stays short
    try:
        recording = home / "omp.rec"
        async with pi_fake_model() as model:
            write_config(home / "agent", model)
            env = pi_isolated_env("omp", version, home)
            run = Run("omp", harness_command("omp", version), env, home, Catalog(home / "catalog"))
            async with pi_wrapped(run, "omp", record=recording) as rpc:
                final = await omp_delegation(rpc, run.catalog)
        keep_recording(recording.read_bytes(), f"pi/delegation/omp-{version}.rec")
        # What the real binary did: three children on the fake, each served its own marker.
        # (omp 18.2.3's parent may also send a request the fake takes for a summary, served 700/120.)
        assert {served.usage for served in model.requests if served.kind != "child"} <= OMP_PARENT
        assert {served.usage[0] for served in model.requests if served.kind == "child" and served.usage} == (
            OMP_CHILD_TOKENS
        )
        # Each row: that child's own reading (omp's getContextUsage() in the child's session, its
        # served prompt), its model's window, the spec's fill, finished; never the parent's 1,300.
        rows = {row.id: row for row in final.subagents}
        assert {row_id: row.used_tokens for row_id, row in rows.items()} == OMP_CHILDREN
        for row in rows.values():
            assert (row.window_tokens, row.window_source, row.model) == (PI_WINDOW, "harness", "fake-32k")
            assert row.used_percent == row.used_tokens * 100 / PI_WINDOW
            assert (row.state, row.compactions) == ("finished", 0)
        # The parent's row: its own numbers, in every write the sidecar made; never a child's.
        writes = run.catalog.writes()
        assert writes and not {write["usedTokens"] for write in writes} & OMP_CHILD_TOKENS, writes
        assert final.used_tokens in {usage[0] for usage in OMP_PARENT}
        assert (final.window_tokens, final.compactions) == (PI_WINDOW, 0)
        await assert_replays_as_logged(run.catalog.root, PI_AGENT, recording)
    finally:
        shutil.rmtree(home, ignore_errors=True)
