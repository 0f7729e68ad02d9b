"""Live, issue 19 point 1: the real Claude Code TUI and the real `codex app-server` under `hctx wrap`,
each driven to a step where the harness's displayed percent moves inside one 1% tokens bucket.

Claude displays `Math.round(used / window * 100)`: 16,800 then 17,010 of 200k is 8 then 9 %, both in
tokens bucket 8 (the step measured live in issue 19). Codex displays `100 - "% context left"` with its
12,000-token baseline: 39,000 then 39,800 of 190k is 15 then 16 %, both in tokens bucket 20. The
record must follow each within seconds, not at the 300 s heartbeat, and carry the build's version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.fakes.claude_model import fake_messages
from tests.fakes.codex_client import stdio_client
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_claude_live import (
    MODEL,
    RENDERER,
    WINDOW,
    claude_seat,
    live_env,
    require_tmux,
    tmux_session,
    wait_record,
)
from tests.live.test_codex_live import AGENT, lab
from tests.wrapping import agent_dir, log_events, wrap_argv, writes_once_logged

pytestmark = pytest.mark.live


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_claude_8_to_9_percent_inside_one_bucket_is_published_at_once(version: str, tmp_path: Path) -> None:
    claude = require_harness("claude", version)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    async with fake_messages() as server:
        env = live_env(home, server, version)
        command = wrap_argv(catalog, "claude-shown", "claude", *claude, "--model", MODEL)
        record_path = agent_dir(catalog, "claude-shown") / "harness-context"
        async with tmux_session(command, work, env) as pane:
            await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == WINDOW)
            await pane.type("Displayed eight usage=800,6000,10000,50")
            eight = await wait_record(record_path, pane, "16,800 tokens", lambda r: r["usedTokens"] == 16_800)
            assert eight["usedPercent"] == 8
            await pane.type("Displayed nine usage=1010,6000,10000,50")
            nine = await wait_record(record_path, pane, "17,010 tokens", lambda r: r["usedTokens"] == 17_010)
            assert nine["usedPercent"] == 9  # Claude's Math.round of 8.505, in the same tokens bucket 8
            assert nine["harnessVersion"] == version  # the status line's own `version`
    assert [16_800 * 100 // WINDOW, 17_010 * 100 // WINDOW] == [8, 8]
    # The record showed 9 at once (above); its write line is logged after the record is replaced, so
    # it is waited for (a liveness bound). On a loaded machine the 8% write may still be in flight
    # when 9 is read, and lands refreshed with it (the outbox's fold, docs/recording.md): then one
    # bucket write carries 9. Either way every write of 8 or 9 is a bucket write, and 9 is one of them.
    writes = await writes_once_logged(catalog, "claude-shown", lambda w: w.get("usedPercent") == 9, "at 9%")
    shown = [(w["reason"], w["usedPercent"]) for w in writes if w.get("usedPercent") in (8, 9)]
    assert ("bucket", 9) in shown and {reason for reason, _ in shown} == {"bucket"}, shown


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_codex_15_to_16_percent_inside_one_bucket_is_published_at_once(version: str, tmp_path: Path) -> None:
    async with lab(version, tmp_path) as run:
        with trio.fail_after(90):
            async with stdio_client(run.wrapped(), env=run.env, cwd=run.work, stderr=tmp_path / "wrap.stderr") as (
                client,
                _,
                _,
            ):
                await client.initialize()
                thread = await client.start_thread(run.work)
                await client.turn(thread, "fifteen [[u:38500:500]]")
                fifteen = await run.record_when(lambda r: r.used_tokens == 39_000, "39,000 tokens")
                assert (fifteen.used_percent, fifteen.window_tokens) == (15, 190_000)
                await client.turn(thread, "sixteen [[u:39300:500]]")
                sixteen = await run.record_when(lambda r: r.used_tokens == 39_800, "39,800 tokens")
                assert sixteen.used_percent == 16  # Codex's "84% context left", same tokens bucket 20
                assert sixteen.harness_version == version  # the initialize response's userAgent
    assert [39_000 * 100 // 190_000, 39_800 * 100 // 190_000] == [20, 20]
    reasons = [(e["reason"], e["usedPercent"]) for e in log_events(run.catalog, AGENT) if e["event"] == "write"]
    assert ("bucket", 16) in reasons
