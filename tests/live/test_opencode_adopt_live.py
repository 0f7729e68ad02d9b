"""`hctx setup opencode`, then the real OpenCode (both pinned builds) started plainly, no hctx in its
command, against the fake provider on 127.0.0.1 (issue 36): the plugin setup placed adopts the
session, and its record is what the wrapped live test asserts for the same session.

The box is tests/live/test_opencode_live.py's (HOME and every XDG dir in tmp_path, the fake the only
provider); the catalog is named by HCTX_CATALOG in the harness's environment, which the adopter
inherits. An adopted agent is named as `hctx wrap` names one (the workspace `ws`) on this machine's
host name.
"""

from __future__ import annotations

import json
import os
import pty
import sys
from pathlib import Path

import httpx
import pytest
import trio

from guard.layout import AgentDir, default_host
from guard.state import read_state
from sidecar.adoption import adoption_dir, process_start_ticks
from sidecar.launching import free_loopback_port
from tests.fakes.opencode_model import OpenCodeFakeModel, opencode_fake_model
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_opencode_live import (
    HOST,
    MAX_OUTPUT,
    STARTUP_S,
    TURN_S,
    WINDOW,
    Box,
    descendants,
    new_session,
    opencode_under_wrap,
    prompt,
    stop,
    the_session,
    wait_for,
    wait_healthy,
)
from tests.test_adoption import ours
from tests.wrapping import pid_gone

pytestmark = pytest.mark.live

AGENT = "ws"  # the workspace's name: the seat `hctx wrap` would give it
STOP_S = 30


@pytest.fixture(params=list(HARNESS_VERSIONS["opencode"]), ids=lambda v: f"opencode-{v}")
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Box:
    command = require_harness("opencode", request.param)
    return Box(tmp_path, request.param, command)


def environment(box: Box, fake: OpenCodeFakeModel) -> dict[str, str]:
    return {**box.env(fake), "HCTX_CATALOG": str(box.catalog)}


async def hctx_setup(env: dict[str, str], *args: str) -> str:
    done = await trio.run_process(
        [sys.executable, "-m", "wrapper.cli", "setup", "opencode", *args],
        env=env,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def plugin_file(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "opencode" / "plugin" / "hctx-adopt.ts"


def agents_on(box: Box) -> dict[str, list[str]]:
    """host -> the agent directories the catalog holds."""
    root = box.catalog / "agents"
    if not root.is_dir():
        return {}
    return {host.name: sorted(agent.name for agent in host.iterdir()) for host in root.iterdir()}


def adoption_of(process: trio.Process) -> Path:
    """The harness's adoption directory (`sidecar.adoption`), named while the harness runs."""
    start = process_start_ticks(process.pid)
    assert start is not None
    return Path(adoption_dir(process.pid, start))


async def assert_stopped_and_gone(box: Box, seat: AgentDir, adoption: Path) -> None:
    """The claim stopped, the resident and the sidecar gone, the adoption directory removed."""
    state = await wait_for(
        "the claim stopped", lambda: (s := read_state(seat)) and s.desired_state == "stopped" and s, STOP_S
    )
    assert state.adopted is True
    await wait_for("no process of hctx left", lambda: pid_gone(state.wrapper_pid) and not ours(box.catalog), STOP_S)
    await wait_for("the adoption directory removed", lambda: not adoption.exists(), STOP_S)


async def test_a_plain_opencode_serve_is_adopted_and_recorded_as_a_wrapped_one(box: Box) -> None:
    host = default_host()
    seat = AgentDir(box.catalog, host, AGENT)
    async with opencode_fake_model() as fake:
        env = environment(box, fake)
        said = await hctx_setup(env)
        assert f"{plugin_file(env)}: written" in said
        port = free_loopback_port()
        argv = [*box.command, "serve", "--port", str(port), "--hostname", "127.0.0.1"]
        assert not any("hctx" in word or "wrapper" in word for word in argv)
        with (box.root / "serve.out").open("wb") as out:
            server = await trio.lowlevel.open_process(argv, env=env, cwd=box.workspace, stdout=out, stderr=out)
        adoption = adoption_of(server)
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=TURN_S
            ) as client:
                await wait_healthy(client)
                # The plugin loads with the first instance (a request naming the directory).
                (await client.get("/session")).raise_for_status()
                await wait_for(
                    "the adopted sidecar's stream", lambda: box.logged(AGENT, "opencode-stream-open", host), STARTUP_S
                )
                state = read_state(seat)
                assert state is not None and state.adopted is True and state.harness == "opencode"
                assert state.desired_state == "running"
                # Two processes, as a wrapped seat: the resident and its sidecar, neither OpenCode's
                # (the plugin's stream runs inside OpenCode).
                assert [pid for pid in descendants(state.wrapper_pid) if not pid_gone(pid)] == ours(box.catalog)
                assert len(ours(box.catalog)) == 1 and state.wrapper_pid not in descendants(server.pid)
                await the_session(box, fake, client, AGENT, host)
            assert agents_on(box) == {host: [AGENT]}  # one agent, once
            listed = await trio.run_process(
                [sys.executable, "-m", "wrapper.cli", "agents", "--json"], env=env, capture_stdout=True
            )
            (row,) = json.loads(listed.stdout)
            assert (row["identity"], row["adopted"]) == (AGENT, True)
        finally:
            await stop(server)
        await assert_stopped_and_gone(box, seat, adoption)


async def test_a_plain_opencode_run_is_adopted(box: Box) -> None:
    """`opencode run` ends right after its one turn, likely before the adopter's sidecar connects:
    the plugin keeps the turn's events and the exit waits (at most 3 s) for them to be taken."""
    host = default_host()
    seat = AgentDir(box.catalog, host, AGENT)
    async with opencode_fake_model() as fake:
        env = environment(box, fake)
        await hctx_setup(env)
        with (box.root / "run.out").open("wb") as out:
            run = await trio.lowlevel.open_process(
                [*box.command, "run", "first turn [[u:20000:100]]"], env=env, cwd=box.workspace, stdout=out, stderr=out
            )
        adoption = adoption_of(run)
        with trio.fail_after(TURN_S):
            assert await run.wait() == 0, (box.root / "run.out").read_text(errors="replace")[-2000:]
        record = await wait_for(
            "the turn", lambda: (r := box.records(AGENT, host)) and r.used_tokens == 20100 and r, TURN_S
        )
        assert record.harness == "opencode" and record.model == "fake/fake-model"
        assert (record.window_tokens, record.used_percent) == (WINDOW, 20100 * 100 / WINDOW)
        assert (record.compact_at_tokens, record.auto_compaction) == (WINDOW - MAX_OUTPUT, True)
        assert agents_on(box) == {host: [AGENT]}
        await assert_stopped_and_gone(box, seat, adoption)


async def test_a_wrapped_seat_with_setup_in_place_appears_once(box: Box) -> None:
    async with opencode_fake_model() as fake:
        env = environment(box, fake)
        await hctx_setup(env)
        assert plugin_file(env).is_file()
        agent = "oc-wrapped"
        async with opencode_under_wrap(box, fake, agent) as client:
            session = await new_session(client, "wrapped")
            await prompt(client, session, "first turn [[u:20000:100]]")
            await wait_for("turn 1", lambda: (r := box.records(agent)) and r.used_tokens == 20100, TURN_S)
            await trio.sleep(2)  # time enough for a wrongly started adopter to claim a seat
            assert agents_on(box) == {HOST: [agent]}
            state = read_state(AgentDir(box.catalog, HOST, agent))
            assert state is not None and state.adopted is False


async def drain_to(terminal: int, screen: Path) -> None:
    """The TUI's output read as it comes, and kept in `screen` for a failure's diagnosis."""
    os.set_blocking(terminal, False)
    with screen.open("wb") as out:
        while True:
            await trio.lowlevel.wait_readable(terminal)
            try:
                data = os.read(terminal, 65536)
            except BlockingIOError:
                continue
            except OSError:  # EIO: the terminal's other side is closed
                return
            if not data:
                return
            out.write(data)
            out.flush()


async def test_a_plain_opencode_tui_is_adopted(box: Box) -> None:
    """The TUI on a pseudo-terminal, no server of its own listening (measured): the prompt is typed
    into it, and the turn reaches the adopted agent's record through the plugin's stream."""
    host = default_host()
    seat = AgentDir(box.catalog, host, AGENT)
    async with opencode_fake_model() as fake:
        env = {**environment(box, fake), "TERM": "xterm-256color"}
        await hctx_setup(env)
        terminal, tty = pty.openpty()
        tui = await trio.lowlevel.open_process(
            box.command, env=env, cwd=box.workspace, stdin=tty, stdout=tty, stderr=tty, start_new_session=True
        )
        os.close(tty)
        adoption = adoption_of(tui)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain_to, terminal, box.root / "screen.out")  # a TUI blocks once unread
                await wait_for(
                    "the adopted sidecar's stream", lambda: box.logged(AGENT, "opencode-stream-open", host), STARTUP_S
                )
                state = read_state(seat)
                assert state is not None and state.adopted is True
                # The prompt box takes keys once the TUI has drawn it (its placeholder on the screen).
                screen = box.root / "screen.out"
                await wait_for("the prompt box", lambda: b"Ask anything" in screen.read_bytes(), STARTUP_S)
                await trio.sleep(0.5)
                for key in "first turn [[u:20000:100]]":
                    os.write(terminal, key.encode())
                    await trio.sleep(0.02)
                os.write(terminal, b"\r")
                record = await wait_for(
                    "the turn", lambda: (r := box.records(AGENT, host)) and r.used_tokens == 20100 and r, TURN_S
                )
                assert (record.window_tokens, record.used_percent, record.model) == (
                    WINDOW,
                    20100 * 100 / WINDOW,
                    "fake/fake-model",
                )
                assert agents_on(box) == {host: [AGENT]}
                await stop(tui)
                nursery.cancel_scope.cancel()
        finally:
            if tui.returncode is None:  # a failure above: stopped here, by the pid this test started
                await stop(tui)
            os.close(terminal)
        await assert_stopped_and_gone(box, seat, adoption)
