"""`hctx setup claude` against the real Claude Code CLI (issue 36): the settings Claude reads.

In an isolated HOME whose user settings hold the user's own status line and a SessionStart hook,
`hctx setup claude` runs, then Claude is started plainly (no hctx in its command line) in a private
tmux server against the fake Messages API. Its environment carries `HCTX_CHANNEL`, naming a socket
this test listens on, so the tee forwards what it is handed instead of adopting the session (the
adoption itself is the adoption tests'): the frames prove Claude ran hctx's status line and its
SessionStart hook from the user-level file; the pane proves the user's own line still draws (the tee
found it where setup kept it, hctx-renderers.json); the user's hook still runs. A second session in
a project holding the `.claude/settings.local.json` a wrapped seat renders shows Claude running
each identical hook command once (the wrapped seat's hooks are not doubled by setup's). `--undo`
then leaves the user's settings byte-equal to before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.harnesses.claude.launch import write_settings
from tests.fakes.claude_model import FakeMessages, fake_messages
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_claude_live import (
    MODEL,
    STEP_TIMEOUT_S,
    USER_RENDERER,
    WINDOW,
    Pane,
    claude_seat,
    live_env,
    require_tmux,
    tmux_session,
    wait_pane,
    wait_record,
)
from tests.wrapping import REPO, agent_dir, wrap_argv

pytestmark = pytest.mark.live


class Channel:
    """A unix socket standing in for a sidecar's channel: every frame the tee sends, parsed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.frames: list[dict[str, Any]] = []

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await listener.bind(str(self.path))
        listener.listen()
        task_status.started()
        async with trio.open_nursery() as nursery:
            while True:
                sock, _ = await listener.accept()
                nursery.start_soon(self._read, trio.SocketStream(sock))

    async def _read(self, stream: trio.SocketStream) -> None:
        data = b""
        async with stream:
            async for chunk in stream:
                data += chunk
        self.frames += [json.loads(line) for line in data.splitlines() if line.strip()]

    def hooks(self, event: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == "claude.hook" and f["payload"].get("hook_event_name") == event]

    def status_lines(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == "claude.statusline"]

    async def wait(self, what: str, pane: Pane, ready: Any) -> None:
        with trio.move_on_after(STEP_TIMEOUT_S):
            while True:
                if ready():
                    return
                await trio.sleep(0.1)
        raise AssertionError(f"no {what} after {STEP_TIMEOUT_S}s: {self.frames}\n{await pane.text()}")


def hctx_setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wrapper.cli", "setup", *args], env=env, capture_output=True, text=True, timeout=60,
        cwd=REPO, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_a_plain_claude_runs_what_setup_put_in_the_user_settings(version: str, tmp_path: Path) -> None:
    claude = require_harness("claude", version)
    require_tmux()
    home, work, _ = claude_seat(tmp_path)
    marker = tmp_path / "user-hook-ran"
    user_settings = {
        "statusLine": {"type": "command", "command": USER_RENDERER, "padding": 0},
        "hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": f"echo ran >> {marker}"}]}]},
        "aLaterBuildsKey": {"kept": True},
    }
    settings_path = home / ".claude" / "settings.json"
    settings_path.write_text(json.dumps(user_settings, indent=4) + "\n")
    before = settings_path.read_bytes()
    server: FakeMessages
    async with fake_messages() as server, trio.open_nursery() as nursery:
        env = live_env(home, server, version)
        done = hctx_setup(env, "claude")
        assert done.returncode == 0, done.stderr
        assert "sidecar.harnesses.claude.tee" in json.loads(settings_path.read_text())["statusLine"]["command"]

        channel = Channel(tmp_path / "channel.sock")
        await nursery.start(channel.serve)
        seat_env = env | {"HCTX_CHANNEL": str(channel.path)}
        async with tmux_session([*claude, "--model", MODEL], work, seat_env) as pane:
            await wait_pane(pane, "USER-SETTINGS-LINE used=None")  # the user's line, through hctx's tee
            await channel.wait("SessionStart hook frame", pane, lambda: channel.hooks("SessionStart"))
            await channel.wait("status line frame", pane, channel.status_lines)
            assert channel.status_lines()[0]["payload"]["model"]["id"] == MODEL
            await pane.type("Live turn one usage=2001,8000,10000,111")
            await wait_pane(pane, "USER-SETTINGS-LINE used=10")
        assert marker.read_text() == "ran\n"  # the user's own hook kept, and run once
        assert len(channel.hooks("SessionStart")) == 1

        # A wrapped seat in the same HOME: its project file holds the same commands. Claude merges the
        # hooks of both files and runs an identical command once.
        write_settings(work)
        channel.frames.clear()
        marker.unlink()
        async with tmux_session([*claude, "--model", MODEL], work, seat_env) as pane:
            await wait_pane(pane, "USER-SETTINGS-LINE used=None")
            await channel.wait("SessionStart hook frame", pane, lambda: channel.hooks("SessionStart"))
            await trio.sleep(2)  # a doubled hook would have landed by now
            assert len(channel.hooks("SessionStart")) == 1
        nursery.cancel_scope.cancel()

    done = hctx_setup(env, "--undo", "claude")
    assert done.returncode == 0, done.stderr
    assert settings_path.read_bytes() == before
    assert not (home / ".claude" / "hctx-renderers.json").exists()
    journal = json.loads((home / ".local" / "state" / "hctx" / "setup" / "journal.json").read_text())
    assert journal["files"] == {}  # nothing of claude's left to undo


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_a_wrapped_seat_under_setup_is_one_agent_with_its_record(version: str, tmp_path: Path) -> None:
    """`hctx wrap` in a HOME where setup is in place: the wrapped seat's own settings win, its tee
    records to its sidecar, the user's line still draws, and no second (adopted) agent appears in
    the default catalog: the tee adopts only without `HCTX_CHANNEL`."""
    claude = require_harness("claude", version)
    require_tmux()
    home, work, catalog = claude_seat(tmp_path)
    (home / ".claude" / "settings.json").write_text(
        json.dumps({"statusLine": {"type": "command", "command": USER_RENDERER}})
    )
    server: FakeMessages
    async with fake_messages() as server:
        env = live_env(home, server, version)
        assert hctx_setup(env, "claude").returncode == 0
        command = wrap_argv(catalog, "wrapped-under-setup", "claude", *claude, "--model", MODEL)
        record_path = agent_dir(catalog, "wrapped-under-setup") / "harness-context"
        async with tmux_session(command, work, env) as pane:
            await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == WINDOW)
            await wait_pane(pane, "USER-SETTINGS-LINE used=None")
            await pane.type("Live turn one usage=2001,8000,10000,111")
            one = await wait_record(record_path, pane, "turn one", lambda r: r["usedTokens"] == 20001)
            assert one["usedPercent"] == 10
            await wait_pane(pane, "USER-SETTINGS-LINE used=10")
            await trio.sleep(2)  # an adopter started by any tee would have claimed by now
            default_agents = home / ".local" / "state" / "hctx" / "agents"
            assert not default_agents.exists() or not any(default_agents.rglob("harness-state"))
            assert [path.name for path in (catalog / "agents").glob("*/*")] == ["wrapped-under-setup"]
            await pane.type("/exit")
