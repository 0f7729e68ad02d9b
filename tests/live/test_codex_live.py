"""Live: the real `codex app-server` (0.151.0 and 0.171.0) under `hctx wrap`, over stdio and websocket.

Each run isolates HOME and CODEX_HOME in tmp_path, with the lab's config.toml pointing the custom
provider at the project's fake Responses API on 127.0.0.1 (tests/fakes/codex_model.py), and drives
the lab's main scenario through a small JSON-RPC client (tests/fakes/codex_client.py):

  turn 1 (30,000 in / 500 out), turn 2 (90,000 / 800, 29,000 cached), `thread/compact/start`
  (summarised at 91,000 / 1,500), turn 3 (20,000 / 300), turn 4 (175,000 / 900: over the
  160,000 auto-compact limit), turn 5 (auto-compacts first at 176,000 / 1,200, then 18,000 / 250);

then a resume in a fresh app-server process under a fresh `hctx wrap` (a new incarnation), and
turn 6 (22,000 / 300). Asserted on the record the sidecar writes and on its write log: Codex's own
percent mirrored (12,000 baseline), `sessionTotalTokens`, the rate-limit windows riding the next
reading, each compaction counted once; and on the frames: what the client receives is what the
app-server sent.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.record import HarnessContext, parse_record
from sidecar.producers.codex import FRAME_TYPE
from sidecar.replay import replay
from sidecar.transports.codex import Address, serve_relay
from tests.fakes.codex_client import CodexClient, stdio_client, ws_client
from tests.fakes.codex_model import FakeResponses, codex_config, codex_env, fake_responses
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.wrapping import agent_dir, log_events, wrap_argv

pytestmark = pytest.mark.live

VERSIONS = HARNESS_VERSIONS["codex"]
AGENT = "codex-live"
RECORD_LIMIT_S = 15.0
# The write sequence the guard produces for the main scenario: (reason, usedPercent).
MAIN_WRITES = [
    ("bucket", 10), ("bucket", 44), ("compaction", 44), ("bucket", 45), ("bucket", 0), ("bucket", 5),
    ("bucket", 92), ("compaction", 92), ("bucket", 93), ("bucket", 0), ("bucket", 4),
]  # fmt: skip
TURN_1 = "turn 1: hello [[u:30000:500]]"
TURN_2 = "turn 2: tell me more [[u:90000:800:29000]] [[c:91000:1500]]"
TURN_3 = "turn 3: after manual compaction [[u:20000:300]]"
TURN_4 = "turn 4: huge context [[u:175000:900:19000]] [[c:176000:1200]]"
TURN_5 = "turn 5: after auto compaction [[u:18000:250]]"
TURN_6 = "turn 6: after resume [[u:22000:300:18000]]"


@dataclass
class Lab:
    version: str
    codex: list[str]
    fake: FakeResponses
    env: dict[str, str]
    work: Path
    catalog: Path
    logs: Path

    @property
    def record_path(self) -> Path:
        return agent_dir(self.catalog, AGENT) / "harness-context"

    def record(self) -> HarnessContext | None:
        try:
            return parse_record(self.record_path.read_bytes())
        except FileNotFoundError:
            return None

    async def record_when(self, predicate: Callable[[HarnessContext], bool], what: str) -> HarnessContext:
        with trio.move_on_after(RECORD_LIMIT_S):
            while True:
                record = self.record()
                if record is not None and predicate(record):
                    return record
                await trio.sleep(0.02)
        raise AssertionError(f"no record with {what} within {RECORD_LIMIT_S}s; last: {self.record()}")

    def writes(self) -> list[tuple[str, float | None]]:
        return [(e["reason"], e["usedPercent"]) for e in log_events(self.catalog, AGENT) if e["event"] == "write"]

    def wrapped(self, *args: str) -> list[str]:
        return wrap_argv(self.catalog, AGENT, "codex", *self.codex, "app-server", *args)


@asynccontextmanager
async def lab(version: str, tmp_path: Path) -> AsyncIterator[Lab]:
    codex = require_harness("codex", version)
    home, codex_home, work = tmp_path / "home", tmp_path / "codexhome", tmp_path / "work"
    for directory in (home, codex_home, work):
        directory.mkdir()
    async with fake_responses() as fake:
        (codex_home / "config.toml").write_text(codex_config(fake.base_url))
        env = codex_env(home, codex_home, version)
        yield Lab(version, codex, fake, env, work, tmp_path / "catalog", tmp_path)


async def main_scenario(client: CodexClient, lab: Lab, *, check_records: bool) -> str:
    """The lab's `main`; with `check_records`, the record is asserted at every step."""
    result = await client.initialize()
    assert f"/{lab.version} " in result["userAgent"]
    thread = await client.start_thread(lab.work)

    async def expect(what: str, predicate: Callable[[HarnessContext], bool]) -> HarnessContext | None:
        return await lab.record_when(predicate, what) if check_records else None

    await client.turn(thread, TURN_1)
    first = await expect("turn 1", lambda r: r.used_tokens == 30_500)
    if first is not None:
        assert (first.used_percent, first.window_tokens, first.rate_limits) == (10, 190_000, None)
    await client.turn(thread, TURN_2)
    second = await expect("turn 2", lambda r: r.used_tokens == 90_800)
    if second is not None:
        # Codex's 44 ("56% context left"), not 90,800 / 190,000 = 47.8 nor 121,300 / 190,000 = 63.8.
        assert (second.used_percent, second.session_total_tokens) == (44, 121_300)
        # Turn 1's snapshot (primary 10% over 300 min, secondary 40% over 10,080) rides this reading.
        assert second.rate_limits is not None
        assert (second.rate_limits.five_hour, second.rate_limits.seven_day) == (10, 40)
    await client.compact(thread)
    compacted = await expect("the manual compaction", lambda r: r.compactions == 1 and r.used_percent == 0)
    if compacted is not None:
        assert compacted.last_compaction_trigger == "unknown"
        assert compacted.session_total_tokens == 213_800  # the summarisation request is spend too
    await client.turn(thread, TURN_3)
    await client.turn(thread, TURN_4)
    await expect("turn 4", lambda r: r.used_percent == 92 and r.compactions == 1)
    await client.turn(thread, TURN_5)
    last = await expect("turn 5", lambda r: r.session_total_tokens == 605_450)
    if last is not None:
        assert (last.used_tokens, last.used_percent, last.compactions) == (18_250, 4, 2)
        assert last.rate_limits is not None
        # Primary 47.5% (request 5) is rounded by Codex to 48; secondary 45% over 10,080 minutes.
        assert (last.rate_limits.five_hour, last.rate_limits.seven_day) == (48, 45)
        assert (last.model, last.cost_usd) == (None, None)
    assert [r.kind for r in lab.fake.requests[-7:]] == [
        "turn", "turn", "compaction", "turn", "turn", "compaction", "turn"
    ]  # fmt: skip
    return thread


def token_usage(client: CodexClient) -> list[tuple[int | str, int, int | None]]:
    """(last, total, window) of every reading; Codex's local post-compaction estimate varies by a few
    tokens between runs (the lab saw 5,553 / 5,710 / 6,088 ...), so it is compared as such."""
    usage = [m["params"]["tokenUsage"] for m in client.messages if m.get("method") == "thread/tokenUsage/updated"]
    return [
        (u["last"]["totalTokens"] if u["last"]["inputTokens"] else "estimate", u["total"]["totalTokens"],
         u["modelContextWindow"])
        for u in usage
    ]  # fmt: skip


def compaction_items(client: CodexClient) -> int:
    return sum(
        1
        for m in client.messages
        if m.get("method") in ("item/started", "item/completed")
        and m["params"].get("item", {}).get("type") == "contextCompaction"
    )


def replayed_writes(raw: list[str]) -> list[tuple[str, float | None]]:
    recording = "\n".join(raw).encode()
    return [(w.reason, w.record.used_percent) for w in replay("codex", [recording])]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def wrapped_ws(lab: Lab, listen: str) -> AsyncIterator[trio.Process]:
    """`hctx wrap -- codex app-server --listen ws://…` as a background process, stopped by its PID."""
    async with trio.open_nursery() as nursery:
        start = partial(
            trio.run_process,
            lab.wrapped("--listen", listen),
            env=lab.env,
            cwd=lab.work,
            stdin=subprocess.DEVNULL,
            stderr=(lab.logs / "wrap-ws.stderr").open("wb"),
            check=False,
        )
        process: trio.Process = await nursery.start(start)
        try:
            yield process
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(15):
                await process.wait()
            if process.returncode is None:
                process.kill()


# ---- tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_stdio_under_wrap_main_then_resume_in_a_fresh_process(version: str, tmp_path: Path) -> None:
    async with lab(version, tmp_path) as run:
        with trio.fail_after(120):
            async with stdio_client(run.wrapped(), env=run.env, cwd=run.work, stderr=tmp_path / "wrap-1.stderr") as (
                client,
                process,
                stdout,
            ):
                thread = await main_scenario(client, run, check_records=True)
            assert process.returncode == 0, (tmp_path / "wrap-1.stderr").read_text()[-2000:]
            # Every byte the client read parsed as the app-server's own newline-delimited JSON-RPC.
            assert bytes(stdout) == "".join(line + "\n" for line in client.raw).encode()
            assert run.writes() == MAIN_WRITES
            assert replayed_writes(client.raw) == MAIN_WRITES  # the sidecar saw what the client saw
            assert compaction_items(client) == 4 and client.count("thread/compacted") == 0
            first_incarnation = run.record()
            assert first_incarnation is not None

            # A fresh process, a fresh incarnation: the claim removes the record, the count restarts.
            async with stdio_client(run.wrapped(), env=run.env, cwd=run.work, stderr=tmp_path / "wrap-2.stderr") as (
                client,
                process,
                _,
            ):
                await client.initialize()
                await client.resume(thread)
                if version == "0.151.0":
                    await trio.sleep(1.0)
                    assert run.record() is None  # no replay before 0.154.0: blind until the next turn
                else:
                    replayed = await run.record_when(lambda r: r.session_total_tokens == 605_450, "the replay")
                    assert (replayed.used_tokens, replayed.used_percent, replayed.compactions) == (18_250, 4, 0)
                    assert replayed.incarnation != first_incarnation.incarnation
                    assert replayed.rate_limits is None  # rate limits are not replayed on resume
                await client.turn(thread, TURN_6)
                total = 22_300 if version == "0.151.0" else 627_750
                resumed = await run.record_when(lambda r: r.used_tokens == 22_300, "turn 6")
                assert (resumed.used_percent, resumed.session_total_tokens, resumed.compactions) == (6, total, 0)
                assert resumed.rate_limits is None  # turn 6's own snapshot arrives after its reading


@pytest.mark.parametrize("version", VERSIONS)
async def test_websocket_under_wrap(version: str, tmp_path: Path) -> None:
    async with lab(version, tmp_path) as run:
        listen = f"ws://127.0.0.1:{free_port()}"
        with trio.fail_after(120):
            async with wrapped_ws(run, listen) as process, ws_client(listen) as client:
                thread = await main_scenario(client, run, check_records=True)
                # A second connection, a second thread, on the same app-server: its reading is
                # the newest, so it is the one published (last writer wins); the compaction count
                # belongs to the incarnation and stays.
                async with ws_client(listen) as other:
                    assert f"/{version} " in (await other.initialize())["userAgent"]
                    await other.turn(await other.start_thread(run.work), "other thread [[u:40000:400]]")
                    theirs = await run.record_when(lambda r: r.used_tokens == 40_400, "the other thread")
                    assert (theirs.used_percent, theirs.session_total_tokens, theirs.compactions) == (16, 40_400, 2)
                # That connection is gone; this one carries on, and its thread writes again.
                await client.turn(thread, "turn 6: still here [[u:50000:500]]")
                ours = await run.record_when(lambda r: r.used_tokens == 50_500, "the first thread again")
                assert (ours.used_percent, ours.session_total_tokens) == (22, 655_950)
            assert process.returncode is not None
        assert run.writes() == [*MAIN_WRITES, ("bucket", 16), ("bucket", 22)]
        assert replayed_writes(client.raw) == [*MAIN_WRITES, ("bucket", 22)]
        assert compaction_items(client) == 4


@pytest.mark.parametrize("version", VERSIONS)
async def test_the_relay_is_transparent_and_a_client_sees_what_a_bare_app_server_sends(
    version: str, tmp_path: Path
) -> None:
    """Bare stdio vs the relay in front of a bare `--listen ws://` app-server, in one run."""
    async with lab(version, tmp_path) as run:
        with trio.fail_after(120):
            async with stdio_client(
                [*run.codex, "app-server"], env=run.env, cwd=run.work, stderr=tmp_path / "bare.stderr"
            ) as (bare, _, _):
                await main_scenario(bare, run, check_records=False)

            upstream = Address("127.0.0.1", free_port())
            submitted: list[dict[str, Any]] = []
            async with trio.open_nursery() as nursery:
                app_server = await nursery.start(
                    partial(
                        trio.run_process,
                        [*run.codex, "app-server", "--listen", f"ws://{upstream.host}:{upstream.port}"],
                        env=run.env,
                        cwd=run.work,
                        stdin=subprocess.DEVNULL,
                        stderr=(tmp_path / "ws.stderr").open("wb"),
                        check=False,
                    )
                )
                listeners = await nursery.start(serve_relay, Address("127.0.0.1", 0), upstream, submitted.append)
                port = listeners[0].socket.getsockname()[1]
                async with ws_client(f"ws://127.0.0.1:{port}") as relayed:
                    await main_scenario(relayed, run, check_records=False)
                readyz = await _http_get("127.0.0.1", port, "/readyz")
                app_server.terminate()
                nursery.cancel_scope.cancel()

    # Byte-identical: the client received exactly the messages the app-server sent, in order.
    assert [f["type"] for f in submitted] == [FRAME_TYPE] * len(submitted)
    assert relayed.raw == [f["payload"] for f in submitted]
    # The same frames as without any relay: the same readings, compactions and methods.
    assert token_usage(relayed) == token_usage(bare)
    assert compaction_items(relayed) == compaction_items(bare) == 4
    assert sorted(_kinds(relayed)) == sorted(_kinds(bare))
    assert replayed_writes(relayed.raw) == replayed_writes(bare.raw) == MAIN_WRITES
    assert readyz.startswith(b"HTTP/1.1 200")  # plain HTTP reaches the app-server through the relay


def _kinds(client: CodexClient) -> list[str]:
    return [m.get("method") or f"response:{m.get('id')}" for m in client.messages]


async def _http_get(host: str, port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: {host}:{port}\r\nconnection: close\r\n\r\n".encode())
        answer = b""
        with trio.move_on_after(10):
            while chunk := await stream.receive_some(4096):
                answer += chunk
        return answer
