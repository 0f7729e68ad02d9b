"""The real `opencode serve` (both pinned versions) under `hctx wrap`, against the fake provider on
127.0.0.1, driven over OpenCode's own HTTP API; the records the sidecar writes are asserted.

Offline as the lab ran it (../shared/lab/opencode/README.md): OPENCODE_DISABLE_MODELS_FETCH=1, HOME and
every XDG dir in tmp_path, an opencode.json whose only provider is the fake. The fake never answers
with a tool call, so OpenCode never tries to download ripgrep. Every OpenCode start installs its plugin
SDK into its config dir from the npm registry unless it is there already (measured, see
`provision_plugin_sdk`): the box puts it there, and points the registry at the fake, which records.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from guard.errors import RecordRefused
from guard.layout import log_path
from guard.record import HarnessContext, parse_record
from sidecar.harnesses.opencode.producer import OpenCodeTransport
from sidecar.launching import LaunchPlan, transport_json
from sidecar.registry import prepare
from tests.conformance import assert_lived_as_replayed
from tests.conftest import REPO
from tests.fakes.opencode_model import SUMMARY_USAGE, OpenCodeFakeModel, opencode_fake_model
from tests.harnesses import HARNESS_VERSIONS, harness_env, require_harness, require_opencode_plugin_sdk
from tests.wrapping import assert_replays_as_logged

pytestmark = pytest.mark.live

HOST = "testhost"
WINDOW, MAX_OUTPUT = 128_000, 8_192
MODEL = {"providerID": "fake", "modelID": "fake-model"}
SUMMARY_TOTAL = sum(SUMMARY_USAGE[:2])  # 14,543: what the summarizer's own message carries
DEFAULT_TOTAL = 1300 + 20  # the fake's usage for a prompt without a marker (the auto continuation)
STARTUP_S = 60
TURN_S = 60


@dataclass
class Box:
    """One isolated OpenCode installation: HOME, XDG dirs, config, workspace, catalog."""

    root: Path
    version: str
    command: list[str]
    plugin_sdk: bool = True  # the config dir holds what OpenCode installs there at start

    @property
    def workspace(self) -> Path:
        return self.root / "ws"

    @property
    def catalog(self) -> Path:
        return self.root / "catalog"

    def record_path(self, agent: str, host: str = HOST) -> Path:
        return self.catalog / "agents" / host / agent / "harness-context"

    def log_path(self, agent: str, host: str = HOST) -> Path:
        return log_path(self.catalog, host, agent)

    def env(self, fake: OpenCodeFakeModel) -> dict[str, str]:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "autoupdate": False,
            "share": "disabled",
            "provider": {
                "fake": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake (hctx live test)",
                    "options": {"baseURL": fake.base_url, "apiKey": "sk-fake-hctx", "includeUsage": True},
                    "models": {
                        "fake-model": {
                            "name": "Fake Model",
                            "limit": {"context": WINDOW, "output": MAX_OUTPUT},
                            "cost": {"input": 1, "output": 2, "cache_read": 0.5, "cache_write": 1.25},
                        }
                    },
                }
            },
        }
        (self.root / "opencode.json").write_text(json.dumps(config))
        dirs = {name: self.root / name for name in ("home", "config", "data", "state", "cache")}
        for path in (*dirs.values(), self.workspace):
            path.mkdir(parents=True, exist_ok=True)
        if self.plugin_sdk:
            provision_plugin_sdk(require_opencode_plugin_sdk(self.version), dirs["config"] / "opencode")
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(dirs["home"]),
            "XDG_CONFIG_HOME": str(dirs["config"]),
            "XDG_DATA_HOME": str(dirs["data"]),
            "XDG_STATE_HOME": str(dirs["state"]),
            "XDG_CACHE_HOME": str(dirs["cache"]),
            "OPENCODE_CONFIG": str(self.root / "opencode.json"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "npm_config_registry": fake.registry_url,  # never the real one, even with the SDK gone
            "PYTHONPATH": str(REPO),
            **harness_env("opencode", self.version),
        }

    def records(self, agent: str, host: str = HOST) -> HarnessContext | None:
        try:
            return parse_record(self.record_path(agent, host).read_bytes())
        except (FileNotFoundError, RecordRefused):
            return None

    def writes(self, agent: str, host: str = HOST) -> list[dict[str, Any]]:
        """The sidecar's own log of every record it wrote, oldest first."""
        path = self.log_path(agent, host)
        if not path.exists():
            return []
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [event for event in events if event.get("event") == "write"]

    def logged(self, agent: str, event: str, host: str = HOST) -> list[dict[str, Any]]:
        path = self.log_path(agent, host)
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [line for line in lines if line.get("event") == event]


def provision_plugin_sdk(sdk: Path, config_dir: Path) -> None:
    """Put into OpenCode's config dir what OpenCode itself would install there from the npm registry.

    Measured on 1.18.25 and 1.18.33 (2026-12-05; the registry pointed at a 127.0.0.1 recorder, and with
    no network at all): at every start, plugin file or not, OpenCode's Config forks its Npm.install of
    `@opencode-ai/plugin@<its version>` (npm's Arborist, inside the binary, reading npm's own config:
    `npm_config_*`, `.npmrc`) for each config dir; with a plugin file there it waits for it before
    loading plugins (74 s a start when the registry is unreachable). The install is skipped when the dir
    has a `node_modules/` and a `package-lock.json` whose root lists each dependency of `package.json`
    and that package (by name). The files come from the install script's `plugin-sdk/`, the same npm
    install of the same spec, hard-linked (a copy across file systems): nobody writes them.
    """
    config_dir.mkdir(parents=True, exist_ok=True)
    if (config_dir / "package-lock.json").exists():  # env() again in the same box
        return
    shutil.copytree(sdk / "node_modules", config_dir / "node_modules", symlinks=True, copy_function=link_or_copy)
    for name in ("package.json", "package-lock.json"):
        link_or_copy(str(sdk / name), str(config_dir / name))


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


@pytest.fixture(params=[v for v in HARNESS_VERSIONS["opencode"]], ids=lambda v: f"opencode-{v}")
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Box:
    command = require_harness("opencode", request.param)
    return Box(tmp_path, request.param, command)


async def wait_for(what: str, predicate: Callable[[], Any], seconds: float) -> Any:
    """`predicate()`'s first truthy value, looked at every 50 ms (another process holds the state);
    past `seconds`, the test fails naming `what`. The live tests' one poll."""
    with trio.move_on_after(seconds):
        while not (value := predicate()):  # noqa: ASYNC110 - another process holds the state
            await trio.sleep(0.05)
        return value
    raise AssertionError(f"{what}: not within {seconds:g}s")


async def wait_healthy(client: httpx.AsyncClient) -> None:
    # The first request a just-started server accepts is never answered (measured): short tries.
    with trio.fail_after(STARTUP_S):
        while True:
            try:
                response = await client.get("/global/health", timeout=1.0)
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await trio.sleep(0.2)


async def prompt(client: httpx.AsyncClient, session: str, text: str) -> dict[str, Any]:
    body = {"model": MODEL, "parts": [{"type": "text", "text": text}]}
    response = await client.post(f"/session/{session}/message", json=body, timeout=TURN_S)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


async def new_session(client: httpx.AsyncClient, title: str) -> str:
    # A titled session: OpenCode then makes no title request of its own.
    response = await client.post("/session", json={"title": title}, timeout=TURN_S)
    response.raise_for_status()
    session: str = response.json()["id"]
    return session


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


async def stop(process: trio.Process, seconds: float = 12.0) -> None:
    """TERM, then KILL what is left, always by the pids this test started (OpenCode sometimes
    ignores TERM for longer than 10 s, per the lab)."""
    family = descendants(process.pid)
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(seconds):
        await process.wait()
    for pid in [process.pid, *family]:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    await process.wait()


@asynccontextmanager
async def opencode_under_wrap(
    box: Box, fake: OpenCodeFakeModel, agent: str, *, tui: bool = False, record: Path | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """`hctx wrap --harness opencode -- opencode serve` (or the TUI, on a pseudo-terminal): the wrapper
    injects the port; the test learns it where the sidecar's transport logged the URL it follows."""
    argv = [
        *(sys.executable, "-m", "wrapper.cli", "wrap", "--agent", agent, "--harness", "opencode"),
        *("--catalog", str(box.catalog), "--host", HOST),
        *(() if record is None else ("--record", str(record))),
        *("--", *box.command, *([] if tui else ["serve"])),
    ]
    env = box.env(fake)
    async with trio.open_nursery() as nursery:
        terminal: int | None = None
        if tui:
            terminal, tty = pty.openpty()
            env["TERM"] = "xterm-256color"
            process = await trio.lowlevel.open_process(
                argv, env=env, cwd=box.workspace, stdin=tty, stdout=tty, stderr=tty, start_new_session=True
            )
            os.close(tty)
            nursery.start_soon(drain, terminal)  # a TUI blocks once nobody reads its screen
        else:
            with (box.root / f"{agent}.out").open("wb") as out:
                process = await trio.lowlevel.open_process(
                    argv, env=env, cwd=box.workspace, stdout=out, stderr=subprocess.STDOUT
                )
        try:
            (follow,) = await wait_for("the transport", lambda: box.logged(agent, "opencode-follow"), STARTUP_S)
            async with httpx.AsyncClient(base_url=follow["url"], trust_env=False, timeout=TURN_S) as client:
                await wait_healthy(client)
                # SSE has no replay: a turn taken before the sidecar's stream opened would be lost.
                await wait_for("the event stream", lambda: box.logged(agent, "opencode-stream-open"), STARTUP_S)
                yield client
        finally:
            await stop(process)
            nursery.cancel_scope.cancel()
            if terminal is not None:
                os.close(terminal)


async def drain(terminal: int) -> None:
    os.set_blocking(terminal, False)
    while True:
        await trio.lowlevel.wait_readable(terminal)
        try:
            if not os.read(terminal, 65536):
                return
        except BlockingIOError:
            continue
        except OSError:  # EIO: the terminal's other side is closed
            return


async def the_session(
    box: Box, fake: OpenCodeFakeModel, client: httpx.AsyncClient, agent: str, host: str = HOST
) -> None:
    """Two turns, a manual and an auto compaction, over the server's API; each record asserted (the
    wrapped server's here, an adopted plain one's in test_opencode_adopt_live.py)."""
    session = await new_session(client, "hctx live")

    answer = await prompt(client, session, "first turn [[u:20000:100]]")
    assert answer["info"]["tokens"]["total"] == 20100
    record = await wait_for("turn 1", lambda: (r := box.records(agent, host)) and r.used_tokens == 20100 and r, TURN_S)
    assert record.harness == "opencode" and record.model == "fake/fake-model"
    assert (record.window_tokens, record.used_percent) == (WINDOW, 20100 * 100 / WINDOW)  # 15.703125
    assert record.compactions == 0 and record.last_compaction_trigger is None
    # Issue 18: OpenCode's own point, limit.context - limit.output (no limit.input): where the
    # 125,500-token turn below then compacts; never the bare window.
    assert (record.compact_at_tokens, record.auto_compaction) == (WINDOW - MAX_OUTPUT, True) == (119_808, True)

    await prompt(client, session, "second turn [[u:30000:200:10000]]")
    record = await wait_for("turn 2", lambda: (r := box.records(agent, host)) and r.used_tokens == 30200 and r, TURN_S)
    assert record.used_percent == 30200 * 100 / WINDOW == 23.59375  # unrounded
    assert record.session_total_tokens is not None and record.session_total_tokens >= 20100  # spend, lagging
    assert record.cost_usd is not None

    # Manual compaction: the summarizer's own message (14,543 tokens) is never the reading.
    response = await client.post(f"/session/{session}/summarize", json=MODEL)
    assert response.status_code == 200 and response.json() is True
    record = await wait_for("summarize", lambda: (r := box.records(agent, host)) and r.compactions == 1 and r, TURN_S)
    assert record.used_tokens == 30200 and record.used_tokens != SUMMARY_TOTAL
    assert record.last_compaction_trigger == "unknown" and record.last_compaction_ms is not None
    assert record.observed_at_ms < record.last_compaction_ms  # the held reading, not re-stamped

    # Auto compaction: 125,500 ≥ 128,000 − 8,192; OpenCode summarizes, then continues on its own.
    await prompt(client, session, "big turn [[u:125000:500]]")
    record = await wait_for(
        "auto compaction",
        lambda: (r := box.records(agent, host)) and r.compactions == 2 and r.used_tokens == DEFAULT_TOTAL and r,
        TURN_S,
    )
    assert record.used_percent == DEFAULT_TOTAL * 100 / WINDOW
    # Cumulative spend (it lags a turn: it rides the numerator that lands), never the occupancy.
    assert record.session_total_tokens is not None
    assert record.session_total_tokens >= 20100 + 30200 + SUMMARY_TOTAL > record.used_tokens

    # The sidecar logs each write just after the record lands. On a loaded machine a write that
    # stalled folds the next into the one waiting (tests.conformance.assert_lived_as_replayed):
    # then fewer are logged, in the same order, the last the same.
    written = await wait_for(
        "the write log", lambda: (w := box.writes(agent, host)) and w[-1]["usedTokens"] == DEFAULT_TOTAL and w, 10
    )
    expected = [("bucket", 20100), ("bucket", 30200), ("compaction", 30200), ("bucket", 125500),
                ("compaction", 125500), ("bucket", DEFAULT_TOTAL)]  # fmt: skip
    lived = [(w["reason"], w["usedTokens"]) for w in written]
    assert_lived_as_replayed(lived, expected, len(expected) - len(lived))
    assert [w["usedPercent"] for w in written if w["usedTokens"] == 125500][:1] == [98.046875]
    assert SUMMARY_TOTAL not in {w["usedTokens"] for w in written}
    assert [served.kind for served in fake.requests].count("summary") == 2
    assert all(served.kind != "title" for served in fake.requests)
    assert fake.registry_requests == []  # OpenCode found its plugin SDK in place


async def test_records_from_a_live_opencode_server_under_hctx_wrap(box: Box) -> None:
    agent = "oc-live"
    recording = box.root / "oc-live.rec"
    async with opencode_fake_model() as fake, opencode_under_wrap(box, fake, agent, record=recording) as client:
        await the_session(box, fake, client, agent)
    await assert_replays_as_logged(box.catalog, agent, recording)  # the SSE and the answers, as recorded


async def test_the_sidecar_follows_the_server_across_a_restart(box: Box, tmp_path: Path) -> None:
    """The real sidecar process, with the transport config `prepare` makes; the server is killed and
    started again on the same port, and the stream (and the records) resume."""
    agent = "oc-restart"
    async with opencode_fake_model() as fake:
        env = box.env(fake)
        plan = prepare(LaunchPlan("opencode", (*box.command, "serve"), box.workspace))
        sidecar_argv = [
            *(sys.executable, "-m", "sidecar", "--harness", "opencode", "--catalog", str(box.catalog)),
            *("--host", HOST, "--agent", agent, "--incarnation", "inc-live"),
            *("--channel", str(tmp_path / "channel.sock"), "--transport", transport_json(plan) or ""),
        ]
        sidecar = await trio.lowlevel.open_process(sidecar_argv, env=env, stdin=subprocess.DEVNULL)

        async def serve() -> trio.Process:
            with (box.root / "serve.out").open("ab") as out:
                return await trio.lowlevel.open_process(
                    list(plan.argv), env=env, cwd=box.workspace, stdout=out, stderr=subprocess.STDOUT
                )

        server = await serve()
        try:
            assert isinstance(plan.transport, OpenCodeTransport)
            async with httpx.AsyncClient(base_url=plan.transport.base_url, trust_env=False) as client:
                await wait_healthy(client)
                await wait_for("the event stream", lambda: box.logged(agent, "opencode-stream-open"), STARTUP_S)
                session = await new_session(client, "before restart")
                await prompt(client, session, "before [[u:40000:100]]")
                await wait_for("first reading", lambda: (r := box.records(agent)) and r.used_tokens == 40100, TURN_S)
                opened = len(box.logged(agent, "opencode-stream-open"))

                server.kill()  # a crash, not a goodbye
                await server.wait()
                server = await serve()
                await wait_healthy(client)
                await wait_for(
                    "the stream to reopen", lambda: len(box.logged(agent, "opencode-stream-open")) > opened, STARTUP_S
                )
                await prompt(client, session, "after [[u:60000:200]]")
                record = await wait_for(
                    "the reading after the restart",
                    lambda: (r := box.records(agent)) and r.used_tokens == 60200 and r,
                    TURN_S,
                )
                assert record.window_tokens == WINDOW and record.used_percent == 60200 * 100 / WINDOW
                assert record.incarnation == "inc-live"
                assert box.logged(agent, "opencode-stream-lost")
        finally:
            await stop(server)
            await stop(sidecar, seconds=5)


async def test_the_tui_under_hctx_wrap_listens_where_the_sidecar_follows(box: Box) -> None:
    """The TUI form: `hctx wrap -- opencode` on a terminal; the injected port is its server's."""
    agent = "oc-tui"
    async with opencode_fake_model() as fake, opencode_under_wrap(box, fake, agent, tui=True) as client:
        session = await new_session(client, "hctx tui")
        await prompt(client, session, "from the side [[u:50000:100]]")
        record = await wait_for("the turn", lambda: (r := box.records(agent)) and r.used_tokens == 50100 and r, TURN_S)
        assert (record.window_tokens, record.used_percent, record.model) == (
            WINDOW,
            50100 * 100 / WINDOW,
            "fake/fake-model",
        )
