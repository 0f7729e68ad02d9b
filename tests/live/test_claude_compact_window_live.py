"""Live (issue 37): Claude's own compaction point where the user's settings state `autoCompactWindow`.

The rule read from the bundled code of both builds (2.1.250 `JE`/`L$`/`M4`, 2.1.332 `XS`/`gse`/`QG`):
the window is min(the model's window, the configured one); Claude reserves min(the model's maximum
output, 20,000) of it for the summary and compacts 13,000 below that. With `autoCompactWindow`
150,000 on a 200,000 model: 150,000 - 20,000 - 13,000 = 117,000. A session pushed to 116,000 does not
compact at its next turn; pushed to 117,000 it does, on its own (`trigger: auto`), and the record
said 117,000 before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.claude_model import FakeMessages, fake_messages
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_claude_live import (
    MODEL,
    RENDERER,
    WINDOW,
    claude_seat,
    live_env,
    require_tmux,
    tmux_session,
    wait_gone,
    wait_pane,
    wait_record,
)
from tests.live.test_subagents_live import keep_recording
from tests.wrapping import agent_dir, assert_replays_as_logged, wrap_argv

pytestmark = pytest.mark.live

CONFIGURED = 150_000
COMPACT_AT = CONFIGURED - 20_000 - 13_000


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_claude_compacts_where_its_auto_compact_window_says_and_the_record_said_so(
    version: str, tmp_path: Path
) -> None:
    claude = require_harness("claude", version)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    (home / ".claude" / "settings.json").write_text(json.dumps({"autoCompactWindow": CONFIGURED}))
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    agent = "claude-compact-window"
    record_path = agent_dir(catalog, agent) / "harness-context"
    recording = tmp_path / "compact-window.rec"
    server: FakeMessages
    async with fake_messages() as server:
        command = wrap_argv(catalog, agent, "claude", *claude, "--model", MODEL, extra=("--record", str(recording)))
        async with tmux_session(command, work, live_env(home, server, version)) as pane:
            first = await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] is not None)
            await wait_pane(pane, "OPERATOR-LINE used=None")
            # 1,000 under the point: the next turn goes out without a compaction.
            await pane.type("Below usage=1000,15000,100000,100")
            below = await wait_record(record_path, pane, "116,000", lambda r: r["usedTokens"] == 116_000)
            await pane.type("At usage=1000,16000,100000,100")
            at = await wait_record(record_path, pane, "117,000", lambda r: r["usedTokens"] == 117_000)
            assert [s.kind for s in server.requests].count("compaction") == 0
            # The next turn compacts first, on Claude's own account.
            await pane.type("After usage=1000,1000,1000,10")
            compacted = await wait_record(record_path, pane, "the compaction", lambda r: r["compactions"] == 1)
            await pane.type("/exit")
            await wait_gone(work / ".claude", "/exit")
    assert [s.kind for s in server.requests].count("compaction") == 1
    assert compacted["lastCompactionTrigger"] == "auto"
    # The status line states the model's window, not the configured one.
    assert first["windowTokens"] == WINDOW
    for record in (first, below, at):
        assert record["compactAtTokens"] == COMPACT_AT
    keep_recording(recording.read_bytes(), f"claude/compact-window-{version}.rec")  # with $HCTX_DELEGATION_RECORD_DIR
    await assert_replays_as_logged(catalog, agent, recording)
