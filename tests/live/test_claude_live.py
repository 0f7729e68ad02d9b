"""The real Claude Code CLI, interactive in tmux under `hctx wrap --harness claude`, offline.

The status line renders only in the TUI (the lab: `claude -p` never runs it), so the CLI runs in a
private tmux server against the fake Messages API on 127.0.0.1, with HOME isolated, the first-run
state the lab found sufficient and every outbound switch off. The session is two turns, `/compact`
and one more turn, each reply's usage dictated by the prompt; the assertions are on the record the
sidecar wrote — Claude's own numbers from real payloads through the rendered settings, the tee and
the hooks — and on the pane, where the operator's renderer line must still be drawn.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.claude_model import FakeMessages, claude_env, claude_home, fake_messages
from tests.harnesses import HARNESS_VERSIONS, harness_env, require_harness
from tests.wrapping import REPO, agent_dir, assert_replays_as_logged, log_events, wrap_argv

pytestmark = pytest.mark.live

MODEL = "claude-sonnet-4-5"  # the 200k window, so the lab's usage markers give its percentages
WINDOW = 200_000
STEP_TIMEOUT_S = 30
# The operator's own renderer: it reads the payload Claude gave the tee and draws Claude's percent.
RENDERER = f"{shlex.quote(sys.executable)} -S -c " + shlex.quote(
    "import json,sys; d=json.load(sys.stdin)['context_window']; print('OPERATOR-LINE used=%s' % d['used_percentage'])"
)


class Pane:
    """One tmux server of our own (its own socket), so nothing else is touched or killed."""

    def __init__(self, socket_name: str, env: dict[str, str]) -> None:
        self.socket_name = socket_name
        self.env = env

    async def tmux(self, *args: str) -> str:
        done = await trio.run_process(
            ["tmux", "-L", self.socket_name, *args], env=self.env, capture_stdout=True, capture_stderr=True
        )
        return str(done.stdout.decode(errors="replace"))

    async def text(self) -> str:
        return await self.tmux("capture-pane", "-p", "-t", "live")

    async def type(self, line: str) -> None:
        await self.tmux("send-keys", "-t", "live", "-l", line)
        await trio.sleep(0.3)  # the TUI takes a burst of keys as a paste; Enter must come on its own
        await self.tmux("send-keys", "-t", "live", "Enter")


@asynccontextmanager
async def tmux_session(command: list[str], cwd: Path, env: dict[str, str]) -> AsyncIterator[Pane]:
    pane = Pane(f"hctx-claude-live-{uuid.uuid4().hex[:10]}", env)
    await pane.tmux("new-session", "-d", "-s", "live", "-x", "200", "-y", "50", "-c", str(cwd), shlex.join(command))
    try:
        yield pane
    finally:
        with trio.CancelScope(shield=True):
            await trio.run_process(
                ["tmux", "-L", pane.socket_name, "kill-server"], env=env, check=False, stderr=subprocess.DEVNULL
            )


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


async def wait_record(path: Path, pane: Pane, what: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    with trio.move_on_after(STEP_TIMEOUT_S):
        while True:
            record = read_record(path)
            if record is not None and check(record):
                return record
            await trio.sleep(0.1)
    raise AssertionError(f"no record with {what} after {STEP_TIMEOUT_S}s: {read_record(path)}\n{await pane.text()}")


async def wait_pane(pane: Pane, text: str) -> str:
    with trio.move_on_after(STEP_TIMEOUT_S):
        while True:
            screen = await pane.text()
            if text in screen:
                return screen
            await trio.sleep(0.1)
    raise AssertionError(f"{text!r} never drawn:\n{await pane.text()}")


def require_tmux() -> None:
    if shutil.which("tmux") is None:  # the status line renders only in the TUI, so a terminal is needed
        message = "tmux is not installed (apt-get install -y tmux)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def live_env(home: Path, server: FakeMessages, version: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TMUX", "HCTX_", "ST_CLAUDE"))}
    return env | claude_env(home, server.base_url) | harness_env("claude", version) | {"PYTHONPATH": str(REPO)}


async def wait_gone(path: Path, what: str) -> None:
    """The wrapper has ended and put the working directory back: `path` is no more."""
    with trio.move_on_after(STEP_TIMEOUT_S):
        while True:
            if not path.exists():
                return
            await trio.sleep(0.1)
    raise AssertionError(f"{path} still there {STEP_TIMEOUT_S}s after {what}: {sorted(path.rglob('*'))}")


def claude_seat(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(HOME, working directory, catalog) of a throwaway Claude seat the lab's way (`claude_home`)."""
    home, work, catalog = tmp_path / "home", tmp_path / "work", tmp_path / "catalog"
    work.mkdir()
    claude_home(home, work)
    return home, work, catalog


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_claude_session_publishes_its_own_numbers_and_counts_the_compaction(version: str, tmp_path: Path) -> None:
    claude = require_harness("claude", version)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    server: FakeMessages
    async with fake_messages() as server:
        env = live_env(home, server, version)
        recording = tmp_path / "claude-live.rec"
        command = wrap_argv(catalog, "claude-live", "claude", *claude, "--model", MODEL,
                            extra=("--record", str(recording)))  # fmt: skip
        record_path = agent_dir(catalog, "claude-live") / "harness-context"
        async with tmux_session(command, work, env) as pane:
            # Before any reply: the window is known, the fill withheld (null, not 0).
            first = await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == WINDOW)
            assert first["usedTokens"] is None and first["usedPercent"] is None
            assert first["harness"] == "claude" and first["model"] == MODEL
            await wait_pane(pane, "OPERATOR-LINE used=None")

            await pane.type("Live turn one usage=2001,8000,10000,111")
            one = await wait_record(record_path, pane, "turn one", lambda r: r["usedTokens"] == 20001)
            assert (one["windowTokens"], one["usedPercent"], one["compactions"]) == (WINDOW, 10, 0)
            assert one["costUsd"] > 0 and one["sessionTotalTokens"] is None and one["rateLimits"] is None

            await pane.type("Live turn two usage=1000,9000,51000,222")
            two = await wait_record(record_path, pane, "turn two", lambda r: r["usedTokens"] == 61000)
            assert two["usedPercent"] == 31  # Claude's Math.round of 30.5, published as given

            await pane.type("/compact")
            compacted = await wait_record(
                record_path, pane, "the compaction", lambda r: r["compactions"] >= 1 and r["usedTokens"] == 0
            )
            assert compacted["lastCompactionTrigger"] == "manual"
            assert compacted["lastCompactionMs"] >= two["observedAtMs"]
            assert compacted["usedPercent"] == 0  # the emptied window is a measurement, not a withholding

            await pane.type("Live turn three usage=1500,2000,1500,99")
            three = await wait_record(record_path, pane, "turn three", lambda r: r["usedTokens"] == 5000)
            assert (three["usedPercent"], three["compactions"]) == (3, 1)  # one compaction, three hook edges
            assert three["costUsd"] > two["costUsd"]
            assert three["incarnation"] == first["incarnation"]
            screen = await wait_pane(pane, "OPERATOR-LINE used=3")
            assert '"session_id"' not in screen  # the slot draws the renderer, never the raw payload
            settings = json.loads((work / ".claude" / "settings.local.json").read_text())
            assert settings["statusLine"]["refreshInterval"] == 5 and settings["statusLine"]["padding"] == 0
        # The tmux server is gone: the hang-up reached the wrapper, which put the directory back.
        await wait_gone(work / ".claude", "the session's hang-up")

    reasons = [event.get("reason") for event in log_events(catalog, "claude-live") if event.get("event") == "write"]
    assert reasons.count("compaction") == 1  # PreCompact, SessionStart(compact), PostCompact: one write
    kinds = [served.kind for served in server.requests]
    assert kinds.count("compaction") == 1
    assert [served.usage for served in server.turns()][-1] == (1500, 2000, 1500, 99)
    await assert_replays_as_logged(catalog, "claude-live", recording)


# The status line most users have: ccstatusline, claude-hud and the like install it here.
USER_RENDERER = RENDERER.replace("OPERATOR-LINE", "USER-SETTINGS-LINE")


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_a_status_line_in_the_users_settings_keeps_drawing_and_the_directory_is_put_back(
    version: str, tmp_path: Path
) -> None:
    """No hctx renderer configured: the tee chains what Claude would have drawn without hctx."""
    claude = require_harness("claude", version)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    user_settings = {"statusLine": {"type": "command", "command": USER_RENDERER, "padding": 0}}
    (home / ".claude" / "settings.json").write_text(json.dumps(user_settings))
    server: FakeMessages
    async with fake_messages() as server:
        command = wrap_argv(catalog, "claude-user-line", "claude", *claude, "--model", MODEL)
        record_path = agent_dir(catalog, "claude-user-line") / "harness-context"
        async with tmux_session(command, work, live_env(home, server, version)) as pane:
            await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == WINDOW)
            await wait_pane(pane, "USER-SETTINGS-LINE used=None")
            settings = json.loads((work / ".claude" / "settings.local.json").read_text())
            assert "sidecar.harnesses.claude.tee" in settings["statusLine"]["command"]  # hctx's tee holds the slot

            await pane.type("Live turn one usage=2001,8000,10000,111")
            one = await wait_record(record_path, pane, "turn one", lambda r: r["usedTokens"] == 20001)
            assert (one["usedPercent"], one["harness"]) == (10, "claude")
            await wait_pane(pane, "USER-SETTINGS-LINE used=10")

            await pane.type("/exit")
            await wait_gone(work / ".claude", "/exit")  # hctx created it all, so all of it is gone
    assert list(work.iterdir()) == []
    assert json.loads((home / ".claude" / "settings.json").read_text()) == user_settings  # never touched
