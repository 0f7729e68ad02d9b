"""Live: the real `codex app-server` (0.151.0 and 0.171.0) under `hctx wrap`, over stdio and websocket.

Each run isolates HOME and CODEX_HOME in tmp_path, with the lab's config.toml pointing the custom
provider at the project's fake Responses API on 127.0.0.1 (tests/fakes/codex_model.py), and drives
the lab's main scenario through a small JSON-RPC client (tests/fakes/codex_client.py):

  turn 1 (30,000 in / 500 out), turn 2 (90,000 / 800, 29,000 cached), `thread/compact/start`
  (summarised at 91,000 / 1,500), turn 3 (20,000 / 300), turn 4 (175,000 / 900: over the
  160,000 auto-compact limit), turn 5 (auto-compacts first at 176,000 / 1,200, then 18,000 / 250);

then a resume in a fresh app-server process under a fresh `hctx wrap` (a new incarnation), and
turn 6 (22,000 / 300). Asserted on the record the sidecar writes and on its write log: Codex's own
percent mirrored (12,000 baseline), `sessionTotalTokens`, the rate limits equal to the newest
snapshot Codex sent (published on the reading they follow, its `observedAtMs` kept), each
compaction counted once; and on the frames: what the client receives is what the
app-server sent.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from guard.record import HarnessContext, parse_record
from sidecar.harnesses.codex.producer import SPEC
from sidecar.harnesses.codex.relay import Address, serve_relay
from sidecar.recorder import Chunk
from sidecar.streams import Stream, Streams
from tests.conformance import assert_lived_as_replayed, replayed_in_a_thread
from tests.fakes.codex_client import CodexClient, stdio_client, ws_client
from tests.fakes.codex_model import FakeResponses, codex_config, codex_env, fake_responses
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.wrapping import (
    agent_dir,
    assert_replays_as_logged,
    coalesced_once_exited,
    log_events,
    wrap_argv,
    writes_once_logged,
)

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

    def wrapped(self, *args: str, record: Path | None = None) -> list[str]:
        recording = () if record is None else ("--record", str(record))
        return wrap_argv(self.catalog, AGENT, "codex", *self.codex, "app-server", *args, extra=recording)


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
    first = await expect("turn 1 with its rate limits", lambda r: r.used_tokens == 30_500 and r.rate_limits is not None)
    if first is not None:
        assert (first.used_percent, first.window_tokens) == (10, 190_000)
        # Turn 1's own snapshot (primary 10% over 300 min, secondary 40% over 10,080), on turn 1's
        # reading with the time that reading was taken: the bucket write's observedAtMs.
        assert limits(first) == latest_snapshot(client) == (10, 40)
        landed_first = first.written_at_ms
        writes = await writes_once_logged(lab.catalog, AGENT, lambda w: w["writtenAtMs"] == landed_first, "of turn 1")
        assert first.observed_at_ms == writes[0]["observedAtMs"]
        if len(writes) > 1:  # landed as two writes (else coalesced into one): the second re-stamps nothing
            assert writes[1]["reason"] == "rate-limits" and writes[1]["writtenAtMs"] > writes[0]["writtenAtMs"]
    await client.turn(thread, TURN_2)
    second = await expect("turn 2", lambda r: r.used_tokens == 90_800 and limits(r) == (18, 41))
    if second is not None:
        # Codex's 44 ("56% context left"), not 90,800 / 190,000 = 47.8 nor 121,300 / 190,000 = 63.8.
        assert (second.used_percent, second.session_total_tokens) == (44, 121_300)
        assert limits(second) == latest_snapshot(client)
    await client.compact(thread)
    compacted = await expect("the manual compaction", lambda r: r.compactions == 1 and r.used_percent == 0)
    if compacted is not None:
        assert compacted.last_compaction_trigger == "unknown"
        assert compacted.session_total_tokens == 213_800  # the summarisation request is spend too
    await client.turn(thread, TURN_3)
    await client.turn(thread, TURN_4)
    await expect("turn 4", lambda r: r.used_percent == 92 and r.compactions == 1)
    await client.turn(thread, TURN_5)
    last = await expect("turn 5", lambda r: r.session_total_tokens == 605_450 and limits(r) == (55, 46))
    if last is not None:
        assert (last.used_tokens, last.used_percent, last.compactions) == (18_250, 4, 2)
        # The session's last snapshot (request 7: primary 55%, secondary 46%) is published, where
        # riding the next reading it never was: there is no next reading.
        assert limits(last) == latest_snapshot(client)
        assert (last.model, last.cost_usd) == (None, None)
    assert [r.kind for r in lab.fake.requests[-7:]] == [
        "turn", "turn", "compaction", "turn", "turn", "compaction", "turn"
    ]  # fmt: skip
    return thread


def limits(record: HarnessContext) -> tuple[float | None, float | None] | None:
    return None if record.rate_limits is None else (record.rate_limits.five_hour, record.rate_limits.seven_day)


def latest_snapshot(client: CodexClient) -> tuple[float | None, float | None]:
    """(primary, secondary) usedPercent of the newest `account/rateLimits/updated` the client got."""
    [*_, newest] = [m for m in client.messages if m.get("method") == "account/rateLimits/updated"]
    windows = newest["params"]["rateLimits"]
    return windows["primary"]["usedPercent"], windows["secondary"]["usedPercent"]


def without_rate_limits(writes: list[tuple[str, float | None]]) -> list[tuple[str, float | None]]:
    """The occupancy writes: a rate-limits write is the reading before it restated (or, coalesced
    with it, carried by it), so this is the sequence however the writes landed."""
    return [write for write in writes if write[0] != "rate-limits"]


async def assert_lived(lab: Lab, expected: list[tuple[str, float | None]]) -> None:
    """The occupancy writes the sidecar logged are `expected`: exactly, or, where a write stalled on
    this loaded machine made the sidecar fold newer ones into the one waiting (its exit line counts
    them, `coalesced`), those with at most that many folded away (`assert_lived_as_replayed`)."""
    coalesced = await coalesced_once_exited(lab.catalog, AGENT)
    assert_lived_as_replayed(without_rate_limits(lab.writes()), expected, coalesced)


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


async def replayed_writes(raw: list[str]) -> list[tuple[str, float | None]]:
    """`hctx replay` of the messages as a recording of the stdout lines they are, each at Codex's own
    clock (`emittedAtMs`; a response, which carries none, at the line's before it)."""
    chunks, clock = [], None
    for line in raw:
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and isinstance(emitted := message.get("emittedAtMs"), int):
                clock = emitted
        chunks.append(Chunk(clock, "stdout", f"{line}\n".encode()))
    return [(w.reason, w.record.used_percent) for w in await replayed_in_a_thread(SPEC, chunks)]


class TappedStreams(Streams):
    """The sidecar's streams, keeping the bytes the relay hands each (and decoding them as usual)."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.tapped: list[tuple[str, bytes]] = []
        super().__init__(SPEC, self.events.append)

    def open(self, wire: str) -> Stream:
        stream = super().open(wire)
        receive = stream.receive_data

        def tapped(data: bytes) -> None:
            self.tapped.append((wire, data))
            receive(data)

        stream.receive_data = tapped  # type: ignore[method-assign]
        return stream


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def wrapped_ws(lab: Lab, listen: str, record: Path | None = None) -> AsyncIterator[trio.Process]:
    """`hctx wrap -- codex app-server --listen ws://…` as a background process, stopped by its PID."""
    async with trio.open_nursery() as nursery:
        start = partial(
            trio.run_process,
            lab.wrapped("--listen", listen, record=record),
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
        recording = tmp_path / "wrap-1.rec"
        with trio.fail_after(120):
            async with stdio_client(
                run.wrapped(record=recording), env=run.env, cwd=run.work, stderr=tmp_path / "wrap-1.stderr"
            ) as (
                client,
                process,
                stdout,
            ):
                thread = await main_scenario(client, run, check_records=True)
            assert process.returncode == 0, (tmp_path / "wrap-1.stderr").read_text()[-2000:]
            # Every byte the client read parsed as the app-server's own newline-delimited JSON-RPC.
            assert bytes(stdout) == "".join(line + "\n" for line in client.raw).encode()
            await assert_lived(run, MAIN_WRITES)
            replayed = await replayed_writes(client.raw)
            assert without_rate_limits(replayed) == MAIN_WRITES  # the sidecar saw what the client saw
            assert [w for w in replayed if w[0] == "rate-limits"] == [
                ("rate-limits", 10), ("rate-limits", 44), ("rate-limits", 44), ("rate-limits", 5),
                ("rate-limits", 92), ("rate-limits", 92), ("rate-limits", 4),
            ]  # fmt: skip
            assert compaction_items(client) == 4 and client.count("thread/compacted") == 0
            await assert_replays_as_logged(run.catalog, AGENT, recording)  # the session `--record` made
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
                resumed = await run.record_when(
                    lambda r: r.used_tokens == 22_300 and r.rate_limits is not None, "turn 6"
                )
                assert (resumed.used_percent, resumed.session_total_tokens, resumed.compactions) == (6, total, 0)
                # Turn 6's own snapshot arrives after its reading, and is published on it.
                assert limits(resumed) == latest_snapshot(client)


@pytest.mark.parametrize("version", VERSIONS)
async def test_websocket_under_wrap(version: str, tmp_path: Path) -> None:
    async with lab(version, tmp_path) as run:
        listen = f"ws://127.0.0.1:{free_port()}"
        recording = tmp_path / "wrap-ws.rec"
        with trio.fail_after(120):
            async with wrapped_ws(run, listen, recording) as process, ws_client(listen) as client:
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
        await assert_lived(run, [*MAIN_WRITES, ("bucket", 16), ("bucket", 22)])
        await assert_replays_as_logged(run.catalog, AGENT, recording)  # the relay's websocket bytes, recorded
        assert without_rate_limits(await replayed_writes(client.raw)) == [*MAIN_WRITES, ("bucket", 22)]
        final = run.record()
        assert final is not None and limits(final) == latest_snapshot(client)
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
            submitted = TappedStreams()
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
                listeners = await nursery.start(serve_relay, Address("127.0.0.1", 0), upstream, submitted)
                port = listeners[0].socket.getsockname()[1]
                async with ws_client(f"ws://127.0.0.1:{port}") as relayed:
                    await main_scenario(relayed, run, check_records=False)
                readyz = await _http_get("127.0.0.1", port, "/readyz")
                app_server.terminate()
                nursery.cancel_scope.cancel()

    # Byte-identical: the client received exactly the messages the app-server sent, in order.
    assert {wire for wire, _ in submitted.tapped} == {"websocket"}
    assert [text.encode() for text in relayed.raw] == [data for _, data in submitted.tapped]
    # The same frames as without any relay: the same readings, compactions and methods.
    assert token_usage(relayed) == token_usage(bare)
    assert compaction_items(relayed) == compaction_items(bare) == 4
    assert sorted(_kinds(relayed)) == sorted(_kinds(bare))
    assert await replayed_writes(relayed.raw) == await replayed_writes(bare.raw)
    assert without_rate_limits(await replayed_writes(bare.raw)) == MAIN_WRITES
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


# ---- compactAtTokens (issue 18): the published point is where Codex then compacts ----------------

COMPACT_AT = 100_000  # set with `-c`, over the config.toml's 160,000; under the 9/10 cap (180,000)
UNDER = "under the limit [[u:98500:500]]"  # last.totalTokens 99,000 < 100,000
REACHES = "reaches the limit [[u:100500:500]] [[c:60000:1000]]"  # 101,000 >= 100,000
AFTER = "after [[u:10000:100]]"


@pytest.mark.parametrize("version", VERSIONS)
async def test_codex_publishes_the_compact_at_it_then_compacts_at(version: str, tmp_path: Path) -> None:
    """`-c model_auto_compact_token_limit=100000` under `hctx wrap`: the record carries 100,000 (not
    the file's 160,000, nor the 9/10 cap, nor the window); a turn starting at 99,000 does not compact,
    the one starting after 101,000 does, before it samples."""
    async with lab(version, tmp_path) as run:
        argv = run.wrapped("-c", f"model_auto_compact_token_limit={COMPACT_AT}")
        with trio.fail_after(120):
            async with stdio_client(argv, env=run.env, cwd=run.work, stderr=tmp_path / "wrap.stderr") as (
                client,
                _process,
                _stdout,
            ):
                await client.initialize()
                thread = await client.start_thread(run.work)
                await client.turn(thread, UNDER)
                under = await run.record_when(lambda r: r.used_tokens == 99_000, "the turn under the limit")
                assert (under.compact_at_tokens, under.auto_compaction) == (COMPACT_AT, True)
                assert under.compact_at_tokens not in (160_000, 180_000, under.window_tokens)
                await client.turn(thread, REACHES)
                reached = await run.record_when(lambda r: r.used_tokens == 101_000, "the turn reaching the limit")
                assert reached.compactions == 0  # the turn that started at 99,000 did not compact
                await client.turn(thread, AFTER)
                after = await run.record_when(lambda r: r.used_tokens == 10_100, "the turn after")
                assert after.compactions == 1 and after.compact_at_tokens == COMPACT_AT
        kinds = [r.kind for r in run.fake.requests]
        assert kinds[-4:] == ["turn", "turn", "compaction", "turn"]  # compacted before the third turn sampled
        assert kinds.count("compaction") == 1
