"""Live: `hctx setup codex`, then the real codex CLI (0.151.0, 0.171.0) started plainly is adopted.

In an isolated HOME and CODEX_HOME (the fake Responses provider on 127.0.0.1, a ChatGPT auth.json for
the account), `hctx setup codex` writes the SessionStart hook and its trust; `codex exec` then runs
with no hctx in its command line. Its hook adopts the session: the default catalog
(`$XDG_STATE_HOME/hctx`) gets an agent named after the working directory, marked adopted, whose
record is what the wrapped Codex live test asserts for the same turn (90,800 of 190,000: 44 %, no
compaction) and whose account is the wrapped seat's. The session's exit marks it stopped and leaves
no process of it. A wrapped seat in the same HOME runs the same hook and appears once (under its own
name, no adopted twin). `hctx setup codex --undo` leaves config.toml byte-equal and hooks.json gone.

The turn takes 3 s, a person's pace: the adopter starts while Codex is in its turn. (A session over
before its adopted sidecar starts, a `codex exec` of a second, is marked stopped with no record:
the resident's adopt mode starts no sidecar for a process already gone.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from guard.record import HarnessContext, parse_record
from guard.state import parse_state
from tests.fakes.chatgpt_backend import seat_auth_json
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_claude_live import Pane
from tests.live.test_rollout_live import LIMIT_S, codex_seat
from tests.wrapping import agent_dir, hctx, wrap_argv

pytestmark = pytest.mark.live

TURN = "adopted turn [[u:90000:800:29000]] [[sleep:3]]"
STOP_TIMEOUT_S = 20.0


def _exec(codex: list[str], *words: str) -> list[str]:
    return [*codex, "exec", "--skip-git-repo-check", "-s", "read-only", *words]


async def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = await trio.run_process(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_stdout=True,
                                  capture_stderr=True, check=False)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr).decode(errors="replace")[-3000:]
    return done.stdout.decode()


def _ours(codex_home: Path) -> list[int]:
    """Every live process whose environment names this test's CODEX_HOME: codex, the hook, the adopter,
    its resident and sidecar all inherit it."""
    mark = f"CODEX_HOME={codex_home}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as file:
                if mark in file.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


async def _stopped(agent: Path, codex_home: Path) -> None:
    with trio.fail_after(STOP_TIMEOUT_S):
        while True:
            state = parse_state((agent / "harness-state").read_bytes()) if (agent / "harness-state").exists() else None
            if state is not None and state.desired_state == "stopped" and not _ours(codex_home):
                return
            await trio.sleep(0.2)


def _numbers(record: HarnessContext) -> tuple[object, ...]:
    return record.used_tokens, record.window_tokens, record.used_percent, record.compactions, record.account


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_a_plain_codex_exec_is_adopted_as_a_wrapped_one_is_recorded(version: str, tmp_path: Path) -> None:
    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        home, codex_home, work, env = seat.home, seat.codex_home, seat.work, seat.env
        (codex_home / "auth.json").write_text(seat_auth_json("acct-adopt", "user-adopt", "adopt@example.com"))
        config_before = (codex_home / "config.toml").read_bytes()
        catalog = home / ".local" / "state" / "hctx"  # the default catalog of this HOME
        with trio.fail_after(LIMIT_S):
            said = await _run(hctx("setup", "codex"), work, env)
        assert "hooks.json: written" in said and "config.toml: written" in said
        with trio.fail_after(LIMIT_S):
            await _run(_exec(codex, TURN), work, env)  # no hctx anywhere in its command line
        hosts = list((catalog / "agents").iterdir())
        assert len(hosts) == 1
        adopted = hosts[0] / "work"  # named as `hctx wrap` names one: its working directory
        await _stopped(adopted, codex_home)
        state = parse_state((adopted / "harness-state").read_bytes())
        assert state.adopted is True and state.harness == "codex"
        record = parse_record((adopted / "harness-context").read_bytes())

        # A wrapped seat in the same HOME: its codex runs the same hook, which stands down.
        with trio.fail_after(LIMIT_S):
            await _run(wrap_argv(catalog, "seat", "codex", *_exec(codex, TURN)), work, env)
        wrapped = agent_dir(catalog, "seat")
        await _stopped(wrapped, codex_home)
        assert sorted(path.name for path in (catalog / "agents").rglob("harness-state")) == ["harness-state"] * 2
        assert {path.parent.name for path in (catalog / "agents").rglob("harness-state")} == {"work", "seat"}
        assert parse_state((wrapped / "harness-state").read_bytes()).adopted is False
        wrapped_record = parse_record((wrapped / "harness-context").read_bytes())

        # What the wrapped Codex live test asserts for this turn, and the wrapped seat's own account.
        assert _numbers(record)[:4] == (90_800, 190_000, 44, 0)
        assert record.account is not None
        assert _numbers(record) == _numbers(wrapped_record)

        with trio.fail_after(LIMIT_S):
            await _run(hctx("setup", "codex", "--undo"), work, env)
        assert (codex_home / "config.toml").read_bytes() == config_before
        assert not (codex_home / "hooks.json").exists()
        assert _ours(codex_home) == []


# The TUI each build runs a session in itself: 0.171.0's default TUI hands it to a shared background
# app-server daemon instead (see sidecar.harnesses.codex.setup), `--no-daemon` keeps it in the TUI.
TUI_FLAGS = {"0.151.0": (), "0.171.0": ("--no-daemon",)}


async def _submit(pane: Pane, line: str, answer: str) -> None:
    """Type `line` and Enter; Enter again while the TUI, still starting, left it in its composer."""
    from tests.live.test_claude_live import STEP_TIMEOUT_S

    await trio.sleep(1)
    await pane.type(line)
    with trio.fail_after(STEP_TIMEOUT_S):
        while answer not in await pane.text():
            await trio.sleep(2)
            if answer not in await pane.text():
                await pane.tmux("send-keys", "-t", "live", "Enter")


async def _record_reads(path: Path, used: int) -> HarnessContext:
    with trio.fail_after(LIMIT_S):
        while True:
            if path.exists():
                record = parse_record(path.read_bytes())
                if record.used_tokens == used:
                    return record
            await trio.sleep(0.2)


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_a_plain_codex_tui_is_adopted_for_its_lifetime(version: str, tmp_path: Path) -> None:
    from tests.live.test_claude_live import require_tmux, tmux_session, wait_pane

    require_tmux()
    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        home, codex_home, work = seat.home, seat.codex_home, seat.work
        env = {**seat.env, "TERM": "xterm-256color"}
        with (codex_home / "config.toml").open("a") as config:  # the user trusts this project already
            config.write(f'\n[projects."{work}"]\ntrust_level = "trusted"\n')
        catalog = home / ".local" / "state" / "hctx"
        with trio.fail_after(LIMIT_S):
            await _run(hctx("setup", "codex"), work, env)
        async with tmux_session([*codex, *TUI_FLAGS[version], "-s", "read-only"], work, env) as pane:
            await wait_pane(pane, "OpenAI Codex")
            # Measured: the TUI starts its session (its rollout, its SessionStart hook) with the first turn.
            await _submit(pane, "tui turn [[u:90000:800:29000]]", "fake reply")
            with trio.move_on_after(LIMIT_S):
                while True:
                    if list(catalog.glob("agents/*/work/harness-state")):
                        break
                    await trio.sleep(0.2)
            adoptions = [path.parent for path in catalog.glob("agents/*/work/harness-state")]
            assert len(adoptions) == 1, await pane.text()
            [adopted] = adoptions
            record = await _record_reads(adopted / "harness-context", 90_800)
            assert (record.used_tokens, record.window_tokens, record.used_percent, record.compactions) == (
                90_800, 190_000, 44, 0)  # fmt: skip
            state = parse_state((adopted / "harness-state").read_bytes())
            assert (state.adopted, state.desired_state) == (True, "running")  # for as long as the TUI runs
            await pane.tmux("send-keys", "-t", "live", "Escape")  # a rate-limit notice the fake's headers raise
            await trio.sleep(0.5)
            await pane.type("/quit")
            await _stopped(adopted, codex_home)


def _daemon_pids(codex_home: Path) -> list[int]:
    """The background app-server daemon (and its updater) 0.171.0's TUI started for this CODEX_HOME:
    they outlive the TUI, so the test that started them ends them, by the pids they recorded."""
    pids = []
    for name in ("daemon.pid", "daemon-updater.pid"):
        path = codex_home / "app-server-daemon" / name
        if path.exists():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                pids.append(int(json.loads(path.read_text())["pid"]))
    return pids


async def test_a_session_in_the_0_171_0_tuis_background_daemon_is_not_adopted(tmp_path: Path) -> None:
    """0.171.0's default TUI runs its session in a shared background app-server, the hook's parent,
    which outlives the session: adopting it would leave an agent running after the TUI quit, so the
    hook adopts nothing (BuildPoint 0.171.0 says so). The turn still runs: the hook never blocks it."""
    from tests.live.test_claude_live import require_tmux, tmux_session, wait_pane

    require_tmux()
    version = "0.171.0"
    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        home, codex_home, work = seat.home, seat.codex_home, seat.work
        env = {**seat.env, "TERM": "xterm-256color"}
        with (codex_home / "config.toml").open("a") as config:
            config.write(f'\n[projects."{work}"]\ntrust_level = "trusted"\n')
        with trio.fail_after(LIMIT_S):
            await _run(hctx("setup", "codex"), work, env)
        try:
            async with tmux_session([*codex, "-s", "read-only"], work, env) as pane:
                await wait_pane(pane, "OpenAI Codex")
                await _submit(pane, "daemon turn [[u:90000:800:29000]]", "fake reply")
                assert list((codex_home / "sessions").rglob("rollout-*.jsonl"))  # the session ran, its hook too
                await trio.sleep(3)  # time for an adopter, had the hook started one
                assert _daemon_pids(codex_home)  # the session ran in the daemon
        finally:
            for pid in _daemon_pids(codex_home):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
    assert not (home / ".local" / "state" / "hctx" / "agents").exists()


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_a_plain_exec_resume_is_adopted_and_followed_from_where_it_resumes(version: str, tmp_path: Path) -> None:
    """`codex exec resume <id>` appends to the earlier rollout (its SessionStart says `resume`): the
    adopted seat publishes the resumed turn only, as the wrapped resume test asserts (50,500: 22 %)."""
    from sidecar.harnesses.codex.rollout import LAUNCH_SLACK_MS, read_session_meta

    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        home, codex_home, work, env = seat.home, seat.codex_home, seat.work, seat.env
        catalog = home / ".local" / "state" / "hctx"
        with trio.fail_after(LIMIT_S):
            await _run(hctx("setup", "codex"), work, env)
            await _run(_exec(codex, TURN), work, env)
        [agent] = list(catalog.glob("agents/*/work"))
        await _stopped(agent, codex_home)
        [rollout] = list((codex_home / "sessions").rglob("rollout-*.jsonl"))
        meta = read_session_meta(rollout)
        assert meta is not None
        await trio.sleep(LAUNCH_SLACK_MS / 1000 + 1)
        with trio.fail_after(LIMIT_S):
            await _run(_exec(codex, "resume", str(meta["id"]), "resumed turn [[u:50000:500]] [[sleep:6]]"), work, env)
        await _stopped(agent, codex_home)  # the same seat, free again, took the resumed session
        assert list((codex_home / "sessions").rglob("rollout-*.jsonl")) == [rollout]
        record = parse_record((agent / "harness-context").read_bytes())
        assert (record.used_tokens, record.window_tokens, record.used_percent, record.compactions) == (
            50_500, 190_000, 22, 0)  # fmt: skip
        assert parse_state((agent / "harness-state").read_bytes()).adopted is True
