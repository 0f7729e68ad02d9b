"""Live measurement (issue 37, points 4 and 5), 2.1.332: what `PreModelSwitch` / `PostModelSwitch`
and a resumed session's `SessionStart` state, beside the status line, against the fake Messages API.

Measured, not built: both hooks' `context_tokens` (and the resume's) is the last reply's prompt plus
its output (the bundled schema says so, and the payloads here show it: 20,001 + 111), not the
prompt the record counts as occupancy; neither model-switch hook names the new model's window. The
status line itself restates the new model and its window right after the switch (0.75 s after the
reading before it here, not at the next 5 s refresh), and a resumed session's status line states
its occupancy (20,001) before the first turn. So hctx reads neither hook: the status line already
says what they would, and says the window they do not. What they carry is kept
(`HCTX_DELEGATION_RECORD_DIR`) as `claude/switch-resume-2.1.332/`.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.claude_model import FakeMessages, fake_messages
from tests.harnesses import require_harness
from tests.live.test_claude_live import (
    MODEL,
    RENDERER,
    claude_seat,
    live_env,
    require_tmux,
    tmux_session,
    wait_gone,
    wait_pane,
    wait_record,
)
from tests.live.test_subagents_live import keep_recording
from tests.wrapping import agent_dir, wrap_argv

pytestmark = pytest.mark.live

VERSION = "2.1.332"
RECORDER = f"{sys.executable} -S -c " + shlex.quote(
    "import sys; open(sys.argv[1], 'ab').write(sys.stdin.buffer.read().strip() + b'\\n')"
)
EVENTS = ("PreModelSwitch", "PostModelSwitch", "SessionStart")
OTHER_MODEL = "claude-opus-5-5"  # the shipped model table's 1,000,000-token model


def hooks(log: Path) -> dict[str, Any]:
    command = f"{RECORDER} {shlex.quote(str(log))}"
    return {event: [{"hooks": [{"type": "command", "command": command}]}] for event in EVENTS}


def payloads(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_bytes().splitlines() if line.strip()] if log.exists() else []


async def wait_hook(log: Path, event: str, pane: Any, source: str | None = None) -> dict[str, Any]:
    with trio.move_on_after(30):
        while True:
            for payload in payloads(log):
                if payload["hook_event_name"] == event and source in (None, payload.get("source")):
                    return payload
            await trio.sleep(0.2)
    raise AssertionError(f"no {event} ({source}): {payloads(log)}\n{await pane.text()}")


async def test_claude_model_switch_and_resume_hooks_state_prompt_plus_output(tmp_path: Path) -> None:
    claude = require_harness("claude", VERSION)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    log = tmp_path / "hooks.jsonl"
    (home / ".claude" / "settings.json").write_text(json.dumps({"hooks": hooks(log)}))
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    agent = "claude-switch"
    record_path = agent_dir(catalog, agent) / "harness-context"
    server: FakeMessages
    async with fake_messages() as server:
        env = live_env(home, server, VERSION)
        recording = tmp_path / "switch.rec"
        command = wrap_argv(catalog, agent, "claude", *claude, "--model", MODEL, extra=("--record", str(recording)))
        async with tmux_session(command, work, env) as pane:
            await wait_pane(pane, "OPERATOR-LINE used=None")
            await pane.type("Turn usage=2001,8000,10000,111")
            before = await wait_record(record_path, pane, "the turn", lambda r: r["usedTokens"] == 20_001)
            await pane.type(f"/model {OTHER_MODEL}")
            pre = await wait_hook(log, "PreModelSwitch", pane)
            await wait_pane(pane, "Switch model?")  # 2.1.332 asks before it forfeits a warm cache
            switched_ms = time.time() * 1000
            await pane.tmux("send-keys", "-t", "live", "Enter")
            post = await wait_hook(log, "PostModelSwitch", pane)
            after = await wait_record(record_path, pane, "the switch", lambda r: r["model"] == OTHER_MODEL)
            await pane.type("/exit")
            await wait_gone(work / ".claude", "/exit")
        resumed_rec = tmp_path / "resume.rec"
        command = wrap_argv(catalog, agent, "claude", *claude, "--continue", extra=("--record", str(resumed_rec)))
        async with tmux_session(command, work, env) as pane:
            resume = await wait_hook(log, "SessionStart", pane, "resume")
            resumed = await wait_record(record_path, pane, "the resumed occupancy", lambda r: r["usedTokens"] == 20_001)
            await pane.type("/exit")
            await wait_gone(work / ".claude", "/exit")
    keep_recording(log.read_bytes(), f"claude/switch-resume-{VERSION}/hooks.jsonl")
    keep_recording(recording.read_bytes(), f"claude/switch-resume-{VERSION}/switch.rec")
    keep_recording(resumed_rec.read_bytes(), f"claude/switch-resume-{VERSION}/resume.rec")
    prompt_plus_output = 20_001 + 111
    assert (pre["from_model"], pre["to_model"]) == (MODEL, OTHER_MODEL)
    assert pre["context_tokens"] == post["context_tokens"] == prompt_plus_output != before["usedTokens"]
    assert not {"window", "context_window_size", "context_window"} & set(post)  # no window stated
    assert resume["context_tokens"] == prompt_plus_output
    # The status line: the new model's window at the switch, the occupancy before a resumed turn.
    assert (after["windowTokens"], after["usedTokens"]) == (1_000_000, 20_001)
    assert after["observedAtMs"] - switched_ms < 5_000  # from the confirming key: sooner than the 5 s refresh
    assert (resumed["usedTokens"], resumed["model"]) == (20_001, OTHER_MODEL)
