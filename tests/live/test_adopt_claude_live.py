"""A plain Claude session, adopted (issue 36): the real CLI started with no hctx in its command and no
HCTX_* in its environment, after `hctx setup claude`, in an isolated HOME against the fake Messages API.

The session is the wrapped live test's (tests/live/test_claude_live.py): two turns, `/compact`, one
more turn, each reply's usage dictated by the prompt, and its record must say what the wrapped
record says at each step (fill, window, percent, compactions, the compaction's trigger), be marked
adopted, name the account the HOME's config states, and end `stopped` with no process of hctx left
and the adoption directory gone once Claude exits. A wrapped seat started in the same HOME meanwhile
is one agent, not adopted a second time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.layout import default_host
from guard.procs import proc_stat
from sidecar.adoption import LOCK_NAME, adoption_dir
from tests.fakes.claude_model import FakeMessages, fake_messages
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_claude_live import (
    MODEL,
    RENDERER,
    STEP_TIMEOUT_S,
    WINDOW,
    claude_seat,
    live_env,
    read_record,
    require_tmux,
    tmux_session,
    wait_pane,
    wait_record,
)
from tests.live.test_opencode_live import wait_for as wait_within
from tests.live.test_subagents_live import CHILD_HOLD_S, CLAUDE_ONCE, SUBAGENT_MODEL, SUBAGENT_WINDOW
from tests.test_adoption import ours
from tests.wrapping import REPO, pid_gone

pytestmark = pytest.mark.live

HOST = default_host()  # an adopted agent's host: this machine's, as `hctx wrap` names it without --host
ACCOUNT = {
    "accountUuid": "4a1c7a57-0000-4000-8000-00000000a001",
    "organizationUuid": "0f9a3e11-0000-4000-8000-0000000000b2",
    "emailAddress": "adopted@example.com",
}


def hctx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wrapper.cli", *args], env=env | {"PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def json_of(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


wait_for = partial(wait_within, seconds=STEP_TIMEOUT_S)


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_a_plain_claude_session_is_adopted_with_the_wrapped_sessions_numbers(
    version: str, tmp_path: Path
) -> None:
    claude = require_harness("claude", version)
    require_tmux()
    home, work, _ = claude_seat(tmp_path)
    wrapped_work = tmp_path / "wrapped"  # a wrapped seat's, started in the same HOME mid-session
    wrapped_work.mkdir()
    state = json.loads((home / ".claude.json").read_text())
    state["projects"][str(wrapped_work)] = state["projects"][str(work)]  # trusted as the lab's folder is
    (home / ".claude.json").write_text(json.dumps(state | {"oauthAccount": ACCOUNT}))
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    catalog = home / ".local" / "state" / "hctx"  # the default catalog: nothing of hctx is named anywhere
    agent = catalog / "agents" / HOST / work.name
    server: FakeMessages
    async with fake_messages() as server:
        env = live_env(home, server, version)
        assert not any(key.startswith("HCTX_") for key in env)
        setup = hctx(env, "setup", "claude")
        assert setup.returncode == 0, setup.stderr
        record_path = agent / "harness-context"
        async with tmux_session([*claude, "--model", MODEL], work, env) as pane:
            first = await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == WINDOW)
            assert first["usedTokens"] is None and first["usedPercent"] is None
            assert first["harness"] == "claude" and first["model"] == MODEL
            claim = json_of(agent / "harness-state")
            assert claim is not None and claim["adopted"] is True and claim["desiredState"] == "running"
            assert claim["account"] is not None
            await wait_pane(pane, "OPERATOR-LINE used=None")  # the user's line still draws

            await pane.type("Live turn one usage=2001,8000,10000,111")
            one = await wait_record(record_path, pane, "turn one", lambda r: r["usedTokens"] == 20001)
            assert (one["windowTokens"], one["usedPercent"], one["compactions"]) == (WINDOW, 10, 0)
            assert one["costUsd"] > 0 and one["sessionTotalTokens"] is None and one["rateLimits"] is None
            assert one["account"] == claim["account"]

            await pane.type("Live turn two usage=1000,9000,51000,222")
            two = await wait_record(record_path, pane, "turn two", lambda r: r["usedTokens"] == 61000)
            assert two["usedPercent"] == 31

            # A wrapped seat in the same HOME meanwhile: one agent, its own; the wrapped seat wins.
            wrap = ["wrap", "--agent", "wrapped-seat", "--harness", "claude", "--", *claude, "--model", MODEL]
            wrapped_argv = [sys.executable, "-m", "wrapper.cli", *wrap]
            async with tmux_session(wrapped_argv, wrapped_work, env) as wrapped_pane:
                wrapped_record = catalog / "agents" / HOST / "wrapped-seat" / "harness-context"
                seen = await wait_record(wrapped_record, wrapped_pane, "the wrapped seat's window",
                                         lambda r: r["windowTokens"] == WINDOW)  # fmt: skip
                assert seen["account"] == claim["account"]  # the same HOME: the account a wrapped launch names
                listed = hctx(env, "agents", "--json")
                rows = {row["identity"]: row for row in json.loads(listed.stdout)}
                assert set(rows) == {"wrapped-seat", work.name}, rows
                assert rows[work.name]["adopted"] is True and "adopted" not in rows["wrapped-seat"]
                await wrapped_pane.type("/exit")
                await wait_for("the wrapped seat stopped", lambda: (json_of(wrapped_record.with_name("harness-state"))
                                                                   or {}).get("desiredState") == "stopped")  # fmt: skip

            await pane.type("/compact")
            compacted = await wait_record(
                record_path, pane, "the compaction", lambda r: r["compactions"] >= 1 and r["usedTokens"] == 0
            )
            assert compacted["lastCompactionTrigger"] == "manual"
            assert compacted["lastCompactionMs"] >= two["observedAtMs"]
            assert compacted["usedPercent"] == 0

            await pane.type("Live turn three usage=1500,2000,1500,99")
            three = await wait_record(record_path, pane, "turn three", lambda r: r["usedTokens"] == 5000)
            assert (three["usedPercent"], three["compactions"]) == (3, 1)
            assert three["incarnation"] == first["incarnation"] == claim["incarnation"]
            resident = claim["wrapperPid"]
            directory = Path(adoption_dir(*_claude_of(resident)))
            assert directory.is_dir()

            await pane.type("/exit")
            stopped = await wait_for("the adopted claim stopped", lambda: (json_of(agent / "harness-state") or {})
                                     .get("desiredState") == "stopped")  # fmt: skip
            assert stopped
        await wait_for("no process of hctx left", lambda: pid_gone(resident) and not ours(catalog))
        await wait_for("the adoption directory removed", lambda: not directory.exists())
    assert read_record(record_path)["usedTokens"] == 5000  # type: ignore[index]
    assert [served.usage for served in server.turns()][-1] == (1500, 2000, 1500, 99)
    undone = hctx(env, "setup", "--undo", "claude")
    assert undone.returncode == 0, undone.stderr


def _claude_of(resident: object) -> tuple[int, int]:
    """The (pid, start ticks) the adopted resident watches: its adoption's directory names them."""
    assert isinstance(resident, int)
    for fd in Path(f"/proc/{resident}/fd").iterdir():
        target = str(fd.readlink()) if fd.is_symlink() else ""
        if target.endswith(f"/{LOCK_NAME}"):  # <runtime>/hctx-<uid>/adopt-<pid>-<start>/adopter.lock
            pid, start = Path(target).parent.name.removeprefix("adopt-").split("-")
            return int(pid), int(start)
    raise AssertionError(f"resident {resident} holds no adoption directory open")


@pytest.mark.parametrize("version", HARNESS_VERSIONS["claude"])
async def test_an_adopted_claude_session_has_its_subagents_rows(version: str, tmp_path: Path) -> None:
    """tests/live/test_subagents_live.py's single delegation, in a session started plainly: the
    adopted transport (projects dir, model table) gives the subagent its own transcript's numbers."""
    claude = require_harness("claude", version)
    require_tmux()
    home, work, _ = claude_seat(tmp_path)
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": RENDERER}))
    table = home / ".config" / "hctx" / "models.json"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(json.dumps({"schema": "hctx.model-windows.v1", "windows": {SUBAGENT_MODEL: SUBAGENT_WINDOW}}))
    record_path = home / ".local" / "state" / "hctx" / "agents" / HOST / work.name / "harness-context"
    server: FakeMessages
    async with fake_messages() as server:
        server.child_hold_s = CHILD_HOLD_S
        env = live_env(home, server, version) | {"CLAUDE_CODE_SUBAGENT_MODEL": SUBAGENT_MODEL}
        assert hctx(env, "setup", "claude").returncode == 0
        async with tmux_session([*claude, "--model", MODEL], work, env) as pane:
            await wait_record(record_path, pane, "the pre-turn window", lambda r: r["windowTokens"] == WINDOW)
            await wait_pane(pane, "OPERATOR-LINE used=None")
            await pane.type(CLAUDE_ONCE)
            done = await wait_record(
                record_path,
                pane,
                "the subagent's own numbers, finished, and the parent's last reply",
                lambda r: (
                    r["usedTokens"] == 23_000
                    and [(s["usedTokens"], s["state"]) for s in r.get("subagents", [])] == [(9_000, "finished")]
                ),
            )
            (row,) = done["subagents"]
            # The window Claude states for the row (hctx's subagentStatusLine, set up in the user's
            # settings) wins over the table's, as in the wrapped session; the model is the `haiku` the
            # call asked for or CLAUDE_CODE_SUBAGENT_MODEL, as the build resolves it.
            assert row["windowSource"] == "harness" and row["windowTokens"] > 0 and row["model"]
            await pane.type("/exit")


async def test_a_claude_background_session_is_adopted(tmp_path: Path) -> None:
    """2.1.332's `claude --bg PROMPT` (its Agent View): the session runs under Claude's own daemon, in
    a pty the daemon hosts, and still runs the user's status line and hooks (measured 2026-12-05:
    python <- sh <- claude.exe --session-id ... <- claude bg-pty-host <- claude daemon), so the tee
    adopts it as any plain session. The session outlives a stopped daemon (its pty host is no child
    the daemon ends), so the test ends the daemon's whole tree itself, and the adoption with it."""
    version = "2.1.332"  # 2.1.250 has no background sessions
    claude = require_harness("claude", version)
    home, work, _ = claude_seat(tmp_path)
    catalog = home / ".local" / "state" / "hctx"
    record_path = catalog / "agents" / HOST / work.name / "harness-context"
    claim_path = record_path.with_name("harness-state")
    prompt = "Background turn usage=2001,8000,10000,111"
    server: FakeMessages
    async with fake_messages() as server:
        env = live_env(home, server, version)
        assert hctx(env, "setup", "claude").returncode == 0
        await trio.run_process([*claude, "--model", MODEL, "--bg", prompt], cwd=work, env=env, capture_stdout=True,
                               capture_stderr=True, check=False)  # fmt: skip
        daemon = await wait_for("Claude's daemon", lambda: (json_of(home / ".claude" / "daemon.status.json") or {})
                                .get("supervisorPid"))  # fmt: skip
        try:
            turn = lambda: (r := read_record(record_path)) and r["usedTokens"] == 20001 and r  # noqa: E731
            reading = await wait_for("the background session's record", turn)
            assert (reading["windowTokens"], reading["usedPercent"]) == (WINDOW, 10)
            claim = json_of(claim_path)
            assert claim is not None and claim["adopted"] is True
        finally:
            await _end_tree(daemon)
        await wait_for("the adopted claim stopped with the session",
                       lambda: (json_of(claim_path) or {}).get("desiredState") == "stopped")  # fmt: skip
        await wait_for("no process of hctx left", lambda: not ours(catalog))


def _descendants(root: int) -> list[int]:
    """`root` and every process below it, parents first (a /proc scan)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            parents[int(entry)] = stat.parent
    tree = [root]
    for pid in tree:
        tree += [child for child, parent in parents.items() if parent == pid]
    return tree


async def _end_tree(root: object) -> None:
    """Claude's daemon this test started, and everything it started: SIGTERM, then SIGKILL."""
    assert isinstance(root, int)
    tree = _descendants(root)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in reversed(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        for _ in range(50):  # 5 s
            if all(pid_gone(pid) for pid in tree):
                break
            await trio.sleep(0.1)
