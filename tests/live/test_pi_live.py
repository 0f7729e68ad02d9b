"""Live: real pi and omp under `hctx wrap`, against the fake model on 127.0.0.1, records asserted.

Each build runs the lab's scenario at window 32000 (served usage ×8, `reserveTokens` 8000,
`keepRecentTokens` 100, prompts padded so compaction has something to cut) in `--mode rpc`:

  p1: turn1, turn2 (a quarter of the prompt cached), a manual compact, a turn over
      `window − reserve` (threshold compaction), a turn whose prompt exceeds the window (> 100 %);
  p2: `--continue` in a new wrap (a new incarnation, a new sidecar): session start, one turn.

Asserted on what the sidecar wrote (the record file at each sync point, and every write through the
sidecar's own write log): pi publishes its totalTokens numerator and omp its prompt-only one for the
same served turn; pi's reading is withheld (null) from its compaction until the next turn_end, across
the restart too, while omp's never is; compactions are counted with pi's reason and omp's start-event
reason; the harness-durable count survives the restart; percent above 100 is published unclamped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.projection import headroom_tokens
from guard.record import HarnessContext, parse_record
from sidecar.harnesses.pi.launch import channel_extension, prepare
from sidecar.launching import LaunchPlan
from tests.conformance import assert_lived_as_replayed
from tests.fakes.pi_channel import ChannelRecording, recording_channel
from tests.fakes.pi_model import FakeModel, fake_model
from tests.harnesses import HARNESS_VERSIONS, harness_env, require_harness
from tests.wrapping import (
    HOST,
    assert_replays_as_logged,
    coalesced_once_exited,
    hctx,
    wrap_argv,
    write_lines,
    writes_once_logged,
)
from tests.wrapping import env as wrapping_env

pytestmark = pytest.mark.live

BUILDS = [(harness, version) for harness in ("pi", "omp") for version in HARNESS_VERSIONS[harness]]
WINDOW = 32000
READING_KEYS = {"tokens", "contextWindow", "percent", "model", "costUsd"}
STEP_TIMEOUT_S = 30
PROMPT_ATTEMPTS = 5
START_TIMEOUT_S = 60
FILLER = "filler text to give the context estimator real characters. " * 20
AGENT = "pi-live"
# Set to a directory (fixtures/pi/live) to keep each direct run's channel frames there, replayable.
RECORD_ENV = "HCTX_PI_LIVE_RECORD_DIR"


def prompt(marker: str) -> str:
    return f"{marker}\n{FILLER}"


def write_config(agent_home: Path, model: FakeModel) -> None:
    """pi reads models.json/settings.json, omp models.yml/config.yml (JSON is YAML), both in the agent dir."""
    models = {
        "providers": {
            "fake": {
                "baseUrl": model.base_url,
                "api": "openai-completions",
                "apiKey": "fake-key",
                "compat": {
                    "supportsDeveloperRole": False,
                    "supportsReasoningEffort": False,
                    "supportsUsageInStreaming": True,
                },
                "models": [
                    {
                        "id": "fake-32k", "name": "Fake", "reasoning": False, "input": ["text"],
                        "contextWindow": WINDOW, "maxTokens": 512,
                        "cost": {"input": 1000, "output": 2000, "cacheRead": 100, "cacheWrite": 0},
                    }
                ],
            }
        }
    }  # fmt: skip
    settings = {"compaction": {"enabled": True, "reserveTokens": 8000, "keepRecentTokens": 100}}
    agent_home.mkdir(parents=True, exist_ok=True)
    for name, content in (
        ("models.json", models), ("models.yml", models), ("settings.json", settings), ("config.yml", settings),
    ):  # fmt: skip
        (agent_home / name).write_text(json.dumps(content))


@dataclass
class Rpc:
    """pi's RPC over the wrapper's stdin/stdout: LF-framed JSON, one object a line."""

    process: trio.Process
    # pi announces the end of a run's tail (retries, compaction) with agent_settled; omp has no such
    # event, but its rpc agent_end already follows its auto-compaction.
    settle_event: str = "agent_end"
    lines: list[dict[str, Any]] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)
    next_id: int = 0

    async def pump(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                try:
                    message = json.loads(line.rstrip(b"\r"))
                except ValueError:
                    continue
                if isinstance(message, dict):
                    self.lines.append(message)
            self.changed.set()
            self.changed = trio.Event()

    async def send(self, command: dict[str, Any]) -> str:
        assert self.process.stdin is not None
        self.next_id += 1
        ident = f"t-{self.next_id}"
        await self.process.stdin.send_all(json.dumps({**command, "id": ident}).encode() + b"\n")
        return ident

    async def wait_for(self, match: Callable[[dict[str, Any]], bool], what: str, start: int = 0) -> dict[str, Any]:
        with trio.fail_after(STEP_TIMEOUT_S):
            while True:
                for message in self.lines[start:]:
                    if match(message):
                        return message
                await self.changed.wait()
        raise AssertionError(what)  # pragma: no cover - fail_after raises first

    async def response(self, ident: str) -> dict[str, Any]:
        return await self.wait_for(lambda m: m.get("id") == ident, f"response {ident}")

    async def request(self, command: dict[str, Any]) -> dict[str, Any]:
        response = await self.response(await self.send(command))
        assert response.get("success") is True, response
        return response

    async def idle(self) -> None:
        with trio.fail_after(STEP_TIMEOUT_S):
            while True:
                state = (await self.request({"type": "get_state"})).get("data") or {}
                if not state.get("isStreaming") and not state.get("isCompacting"):
                    return
                await trio.sleep(0.1)

    async def turn(self, text: str) -> None:
        """One prompt, until the harness has settled it (compaction and retries included)."""
        start = len(self.lines)
        for _ in range(PROMPT_ATTEMPTS):
            response = await self.response(await self.send({"type": "prompt", "message": text}))
            if response.get("success") is True:
                break
            # still busy with the previous run's tail (a compaction after agent_end): wait it out
            await trio.sleep(0.2)
            await self.idle()
        else:
            raise AssertionError(f"prompt refused {PROMPT_ATTEMPTS} times: {response}")
        await self.wait_for(lambda m: m.get("type") == self.settle_event, self.settle_event, start)
        await self.idle()


class Catalog:
    """One agent's record and write log in a catalog: the wrapped seat's by default; an adopted one is
    named as `hctx wrap` names one (its working directory) on this machine's host name."""

    def __init__(self, root: Path, agent: str = AGENT, host: str = HOST) -> None:
        self.root = root
        self.agent = agent
        self.host = host

    def record(self) -> HarnessContext | None:
        path = self.root / "agents" / self.host / self.agent / "harness-context"
        try:
            return parse_record(path.read_bytes())
        except FileNotFoundError:
            return None

    def writes(self) -> list[dict[str, Any]]:
        return write_lines(self.root, self.agent, self.host)

    async def logged(self, predicate: Callable[[dict[str, Any]], bool], what: str) -> list[dict[str, Any]]:
        """The write log once a write satisfying `predicate` is in it: the line follows the record."""
        return await writes_once_logged(self.root, self.agent, predicate, what, self.host)

    async def settles(self, predicate: Callable[[HarnessContext], bool], what: str) -> HarnessContext:
        """The record once it satisfies `predicate` (the sidecar writes asynchronously to the harness)."""
        last: HarnessContext | None = None
        with trio.move_on_after(STEP_TIMEOUT_S):
            while True:
                last = self.record()
                if last is not None and predicate(last):
                    return last
                await trio.sleep(0.05)
        raise AssertionError(f"record never showed {what}; last: {last}")


@dataclass
class Run:
    harness: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    catalog: Catalog
    # Started plainly (no hctx in its command), adopted through `hctx setup`'s extension (issue 36).
    adopted: bool = False


HARNESS_ARGS = ("--mode", "rpc", "--model", "fake/fake-32k")


@asynccontextmanager
async def rpc_session(argv: list[str], run: Run) -> AsyncIterator[Rpc]:
    """The process in rpc mode, idle and ready; its input closed (which ends rpc mode) on the way out."""
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=run.env, cwd=run.cwd
    )
    rpc = Rpc(process, settle_event="agent_settled" if run.harness == "pi" else "agent_end")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rpc.pump)
        try:
            with trio.fail_after(START_TIMEOUT_S):
                await rpc.idle()
            yield rpc
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.move_on_after(15) as waited:
                await process.wait()
            if waited.cancelled_caught:
                process.terminate()
                await process.wait()
            nursery.cancel_scope.cancel()


def wrapped(run: Run, harness: str, *extra: str, record: Path | None = None) -> AbstractAsyncContextManager[Rpc]:
    """The session under `hctx wrap`, or, for an adopted run, the harness alone (no recording: that
    is the wrapper's)."""
    if run.adopted:
        return rpc_session([*run.command, *HARNESS_ARGS, *extra], run)
    recording = () if record is None else ("--record", str(record))
    argv = wrap_argv(run.catalog.root, AGENT, harness, *run.command, *HARNESS_ARGS, *extra, extra=recording)
    return rpc_session(argv, run)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hctx-pilive-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _isolated_env(harness: str, version: str, home: Path) -> dict[str, str]:
    base = {
        key: value
        for key, value in wrapping_env().items()
        if not key.endswith("_API_KEY") and not key.startswith(("PI_", "OMP_", "XDG_", "HCTX_"))
    }
    return (
        base
        | harness_env(harness, version)
        | {
            "HOME": str(home),
            "PI_CODING_AGENT_DIR": str(home / "agent"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
            "NO_COLOR": "1",
        }
    )


@pytest.mark.parametrize(("harness", "version"), BUILDS, ids=[f"{h}-{v}" for h, v in BUILDS])
async def test_the_wrapped_harness_publishes_its_own_numbers(harness: str, version: str, short_tmp: Path) -> None:
    command = require_harness(harness, version)
    home = short_tmp / "home"
    work = short_tmp / "work"
    work.mkdir(parents=True)
    catalog = Catalog(short_tmp / "catalog")
    started = time.monotonic()
    async with fake_model() as model:
        write_config(home / "agent", model)
        user_config = _install_user_extension(home)
        run = Run(harness, command, _isolated_env(harness, version, home), work, catalog)
        if harness == "pi":
            await _pi_scenario(run, model)
        else:
            await _omp_scenario(run, model, version)
    assert time.monotonic() - started < 120
    # The injection touched none of the user's own: their extension still loaded in both processes,
    # their extension directory and settings are as they left them.
    assert (home / "user-extension-loaded").read_text().count("session_start") == 2
    assert _snapshot(home / "agent") == user_config


USER_EXTENSION = """
import { appendFileSync } from "node:fs";
export default function (pi: any) {
	pi.on("session_start", () => appendFileSync(`${process.env.HOME}/user-extension-loaded`, "session_start\\n"));
}
"""


def _install_user_extension(home: Path) -> dict[str, bytes]:
    extensions = home / "agent" / "extensions"
    extensions.mkdir(parents=True, exist_ok=True)
    (extensions / "user-probe.ts").write_text(USER_EXTENSION)
    return _snapshot(home / "agent")


def _snapshot(agent_home: Path) -> dict[str, bytes]:
    """The user's configuration files and extensions (sessions are the harness's to grow)."""
    names = ["models.json", "models.yml", "settings.json", "config.yml"]
    files = {name: (agent_home / name).read_bytes() for name in names}
    files |= {f"extensions/{p.name}": p.read_bytes() for p in sorted((agent_home / "extensions").iterdir())}
    return files


def _numbers(writes: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(write["usedTokens"], write["usedPercent"]) for write in writes]


async def _pi_scenario(run: Run, model: FakeModel) -> None:
    catalog = run.catalog
    recording = run.catalog.root.with_name("pi-p1.rec")
    async with wrapped(run, "pi", record=recording) as rpc:
        await rpc.turn(prompt("turn1 [[u:9600:320]]"))
        record = await catalog.settles(lambda r: r.used_tokens == 9920, "turn1's totalTokens")
        assert (record.harness, record.window_tokens, record.used_percent) == ("pi", WINDOW, 31)
        assert (record.model, record.cost_usd, record.compactions) == ("fake-32k", 10.24, 0)

        await rpc.turn(prompt("turn2 [[u:16000:480:4000]]"))
        # pi's numerator: input 12000 + cacheRead 4000 + output 480 — not the prompt's 16000.
        record = await catalog.settles(lambda r: r.used_tokens in (16480, 16000), "turn2")
        assert (record.used_tokens, record.used_percent) == (16480, 51.5)
        assert record.cost_usd == pytest.approx(13.36)

        await rpc.request({"type": "compact"})
        record = await catalog.settles(lambda r: r.compactions == 1, "the manual compaction")
        # One write carries the edge and pi's withheld reading together.
        assert (record.used_tokens, record.used_percent, record.window_tokens) == (None, None, WINDOW)
        assert record.last_compaction_trigger == "manual" and record.last_compaction_ms is not None
        manual_at = record.last_compaction_ms

        await rpc.turn(prompt("turn3 [[u:25600:800]] (over the reserve threshold)"))
        record = await catalog.settles(lambda r: r.compactions == 2, "the threshold compaction")
        assert (record.used_tokens, record.last_compaction_trigger) == (None, "threshold")
        assert record.last_compaction_ms is not None and record.last_compaction_ms > manual_at

        await rpc.turn(prompt("turn4 [[u:36000:400]] (prompt above the window)"))
        record = await catalog.settles(lambda r: r.compactions == 3, "the overflow compaction")
        assert (record.used_tokens, record.last_compaction_trigger) == (None, "overflow")
        p1_writes = await catalog.logged(lambda write: write["compactions"] == 3, "the overflow's log line")

    # the null from the compaction until turn_end: 26400 (turn3) and 36400 (turn4) each published,
    # each followed by a compaction write that withholds it; 36400 is 113.75 %, unclamped.
    numbers = _numbers(p1_writes)
    assert (16000, 50.0) not in numbers and (36000, 112.5) not in numbers
    # from the first compaction on, every number published is a turn_end's and each is withheld again
    # by the next compaction: no message_end estimate leaks a number while pi says it does not know.
    # Where a write stalled on this loaded machine, the sidecar folded newer ones into the one waiting
    # (a compaction's keeps its reason): then these with at most that many folded away.
    coalesced = await coalesced_once_exited(catalog.root, catalog.agent, catalog.host)
    first_edge = next(i for i, w in enumerate(p1_writes) if w["reason"] == "compaction")
    published = [(None, None), (26400, 82.5), (None, None), (36400, 113.75), (None, None)]
    assert_lived_as_replayed([("", *n) for n in numbers[first_edge:]], [("", *n) for n in published], coalesced)
    compaction_writes = [("", w["usedTokens"], w["compactions"]) for w in p1_writes if w["reason"] == "compaction"]
    assert_lived_as_replayed(compaction_writes, [("", None, 1), ("", None, 2), ("", None, 3)], coalesced)
    if not run.adopted:
        await assert_replays_as_logged(run.catalog.root, AGENT, recording)  # the session `--record` made

    async with wrapped(run, "pi", "--continue") as rpc:
        # a new incarnation: the record was removed at the claim; pi still withholds after its last
        # compaction, and the count is the session store's, durable across the restart.
        record = await catalog.settles(lambda r: r.compactions == 3, "the durable count after restart")
        assert (record.used_tokens, record.used_percent, record.window_tokens) == (None, None, WINDOW)
        # the resumed session restates its own last assistant cost from the store (turn4's 36 + 0.8)
        assert record.cost_usd == pytest.approx(36.8)
        await rpc.turn(prompt("turn5 after restart [[u:12000:240]]"))
        record = await catalog.settles(lambda r: r.used_tokens is not None, "the first reading after restart")
        assert (record.used_tokens, record.used_percent, record.compactions) == (12240, 38.25, 3)
        assert record.cost_usd == pytest.approx(12.48)
    assert sum(1 for served in model.requests if served.kind == "summary") >= 3


async def _omp_scenario(run: Run, model: FakeModel, version: str) -> None:
    catalog = run.catalog
    recording = run.catalog.root.with_name("omp-p1.rec")
    async with wrapped(run, "omp", record=recording) as rpc:
        await rpc.turn(prompt("turn1 [[u:9600:320]]"))
        record = await catalog.settles(lambda r: r.used_tokens == 9600, "turn1's prompt tokens")
        assert (record.harness, record.window_tokens, record.used_percent) == ("omp", WINDOW, 30)
        assert (record.model, record.cost_usd) == ("fake-32k", 10.24)

        await rpc.turn(prompt("turn2 [[u:16000:480:4000]]"))
        # omp's numerator: the prompt (input 12000 + cacheRead 4000), output excluded — not 16480.
        record = await catalog.settles(lambda r: r.used_tokens in (16000, 16480), "turn2")
        assert (record.used_tokens, record.used_percent) == (16000, 50)

        await rpc.request({"type": "compact"})
        record = await catalog.settles(lambda r: r.compactions == 1, "the manual compaction")
        # omp never withholds: the post-compaction estimate rides the edge. A manual compact fires no
        # auto_compaction_start, so there is no reason to carry.
        assert record.used_tokens is not None and record.used_tokens < 16000
        assert record.last_compaction_trigger == "unknown"

        await rpc.turn(prompt("turn3 [[u:25600:800]] (over the reserve threshold)"))
        record = await catalog.settles(lambda r: r.compactions == 2, "the threshold compaction")
        assert record.last_compaction_trigger == "threshold" and record.used_tokens is not None

        await rpc.turn(prompt("turn4 [[u:36000:400]] (prompt above the window)"))
        record = await catalog.settles(lambda r: r.used_tokens == 36000, "the overrun")
        assert record.used_percent == 112.5  # unclamped
        p1_count = record.compactions
        p1_writes = await catalog.logged(lambda write: write["usedTokens"] == 36000, "the overrun's log line")

    numbers = _numbers(p1_writes)
    # Whether turn3's 25600 lands before omp's threshold compaction replaces it is omp's timing; the
    # numerator's meaning is pinned by 16000 above and by 36000 here, never pi's 16480 or 36400.
    assert (36000, 112.5) in numbers
    assert (16480, 51.5) not in numbers and (36400, 113.75) not in numbers
    assert all(write["usedTokens"] is not None for write in p1_writes)
    assert p1_count >= 2

    if not run.adopted:
        await assert_replays_as_logged(run.catalog.root, AGENT, recording)  # the session `--record` made
    async with wrapped(run, "omp", "--continue") as rpc:
        record = await catalog.settles(lambda r: r.compactions >= p1_count, "the durable count after restart")
        await rpc.turn(prompt("turn5 after restart [[u:12000:240]]"))
        record = await catalog.settles(lambda r: r.used_tokens == 12000, "the first turn after restart")
        assert record.used_percent == 37.5 and record.compactions >= p1_count
    assert all(write["usedTokens"] is not None for write in catalog.writes())


@asynccontextmanager
async def asset_session(
    harness: str, version: str, short_tmp: Path, configure: Callable[[Path], None] | None = None
) -> AsyncIterator[tuple[LaunchPlan, ChannelRecording, Any]]:
    """The launch `prepare` builds, run without the sidecar in an isolated home, over RPC: what the
    real harness's asset sends lands in a recording channel. `configure` edits the agent dir."""
    command = require_harness(harness, version)
    home = short_tmp / "home"
    work = short_tmp / "work"
    work.mkdir(parents=True)
    plan = prepare(LaunchPlan(harness=harness, argv=(*command, *HARNESS_ARGS), cwd=work))
    async with fake_model() as model, recording_channel(short_tmp / "channel") as channel:
        write_config(home / "agent", model)
        if configure is not None:
            configure(home / "agent")
        env = _isolated_env(harness, version, home) | {"HCTX_CHANNEL": str(channel.path)}
        run = Run(harness, list(plan.argv), env, work, Catalog(short_tmp / "unused"))
        async with rpc_session(list(plan.argv), run) as rpc:
            yield plan, channel, rpc


def keep_recording(data: bytes, folder: str, harness: str, version: str) -> None:
    """With $HCTX_PI_LIVE_RECORD_DIR set, the channel's bytes become a fixture (fixtures/pi/live/)."""
    destination = os.environ.get(RECORD_ENV)
    if destination:
        (Path(destination) / folder).mkdir(exist_ok=True)
        (Path(destination) / folder / f"{harness}-{version}.channel.jsonl").write_bytes(data)


@pytest.mark.parametrize(("harness", "version"), BUILDS, ids=[f"{h}-{v}" for h, v in BUILDS])
async def test_the_injected_asset_sends_the_wire_from_the_real_harness(
    harness: str, version: str, short_tmp: Path
) -> None:
    """The launch `prepare` builds, run without the sidecar: the frames the real harness's asset sends."""
    # pi: 36000 + 400 totalTokens; omp: the 36000 prompt — both over the 32000 window, unclamped
    overrun_percent = 113.75 if harness == "pi" else 112.5
    async with asset_session(harness, version, short_tmp) as (plan, channel, rpc):
        assert plan.argv[-2:] == ("--extension", str(channel_extension()))
        await rpc.turn(prompt("turn1 [[u:9600:320]]"))
        await rpc.turn(prompt("turn2 [[u:16000:480:4000]]"))
        await rpc.request({"type": "compact"})
        await channel.wait_for(lambda f: f["event"] == "session_compact", STEP_TIMEOUT_S)
        await rpc.turn(prompt("turn3 [[u:25600:800]] (over the reserve threshold)"))
        await channel.wait_for(lambda f: (f["compaction"] or {}).get("count") == 2, STEP_TIMEOUT_S)
        await rpc.turn(prompt("turn4 [[u:36000:400]] (prompt above the window)"))
        await channel.wait_for(lambda f: f["reading"]["percent"] == overrun_percent, STEP_TIMEOUT_S)
        await rpc.idle()
    frames = [frame for _, frame in channel.frames]
    for frame in frames:
        assert frame["type"] == "context" and set(frame["reading"]) == READING_KEYS
    events = {frame["event"] for frame in frames}
    assert {"session_start", "message_end", "turn_end", "agent_end"} <= events
    edge, threshold, *_ = [frame for frame in frames if frame["event"] == "session_compact"]
    if harness == "pi":
        assert "agent_settled" in events and "session_stop" not in events
        settled = [f["reading"] for f in frames if f["event"] == "agent_settled"][1]  # turn2's
        assert (settled["tokens"], settled["percent"], settled["costUsd"]) == (16480, 51.5, pytest.approx(13.36))
        assert edge["reading"]["tokens"] is None and edge["reading"]["contextWindow"] == WINDOW
        assert edge["compaction"] == {"reason": "manual", "count": 1}
        assert threshold["compaction"] == {"reason": "threshold", "count": 2}
    else:
        assert "session_stop" in events and "agent_settled" not in events
        settled = [f["reading"] for f in frames if f["event"] == "session_stop"][1]  # turn2's
        assert (settled["tokens"], settled["percent"], settled["costUsd"]) == (16000, 50, pytest.approx(13.36))
        assert edge["reading"]["tokens"] is not None
        assert edge["compaction"] == {"reason": None, "count": 1}
        assert threshold["compaction"] == {"reason": "threshold", "count": 2}
        assert all(frame["reading"]["tokens"] is not None for frame in frames)
    assert edge["compactions"] == 1
    keep_recording(channel.jsonl(), "", harness, version)


@pytest.mark.parametrize(("harness", "version"), BUILDS, ids=[f"{h}-{v}" for h, v in BUILDS])
async def test_print_mode_publishes_the_settled_turn_before_the_harness_exits(
    harness: str, version: str, short_tmp: Path
) -> None:
    """`-p` exits right after its turn: the asset's socket never holds pi/omp open, yet the frame lands."""
    command = require_harness(harness, version)
    home = short_tmp / "home"
    work = short_tmp / "work"
    work.mkdir(parents=True)
    catalog = Catalog(short_tmp / "catalog")
    async with fake_model() as model:
        write_config(home / "agent", model)
        argv = wrap_argv(
            catalog.root, AGENT, harness, *command, "-p", "--model", "fake/fake-32k", prompt("one [[u:9600:320]]")
        )
        with trio.fail_after(START_TIMEOUT_S):
            result = await trio.run_process(
                argv, env=_isolated_env(harness, version, home), cwd=work, capture_stdout=True, capture_stderr=True
            )
    assert result.stdout.decode().strip() == "ok (fake reply for marker [[u:9600:320]])"
    record = catalog.record()
    assert record is not None and record.harness == harness
    expected = (9920, 31.0) if harness == "pi" else (9600, 30.0)
    assert (record.used_tokens, record.used_percent, record.cost_usd) == (*expected, 10.24)


PI_BUILDS = [build for build in BUILDS if build[0] == "pi"]
# Where the session-switch recordings are committed (fixtures/pi/live/session-switch/pi-<v>.channel.jsonl).
SWITCH_RECORDINGS = "session-switch"


@pytest.mark.parametrize(("harness", "version"), PI_BUILDS, ids=[f"{h}-{v}" for h, v in PI_BUILDS])
async def test_a_session_switch_publishes_the_new_sessions_compaction_facts(
    harness: str, version: str, short_tmp: Path
) -> None:
    """Session A compacts by hand; a new session B compacts on the threshold; switching back to A
    (pi's `/resume`) must not publish B's compaction time and trigger beside A's reading and count,
    but A's own compaction time, as A's session store holds it (issue 24)."""
    from sidecar.harnesses.pi.producer import PiProducer
    from sidecar.producer import instant_ms
    from tests.fakes.pi_channel import replayed_readings

    async with asset_session(harness, version, short_tmp) as (_, channel, rpc):
        await rpc.turn(prompt("session A [[u:9600:320]]"))
        await rpc.turn(prompt("session A again [[u:16000:480:4000]]"))  # something to compact
        await rpc.request({"type": "compact"})
        await channel.wait_for(lambda f: f["event"] == "session_compact", STEP_TIMEOUT_S)
        session_a = (await rpc.request({"type": "get_state"}))["data"]["sessionFile"]
        await rpc.request({"type": "new_session"})
        await rpc.turn(prompt("session B [[u:9600:320]]"))
        await rpc.turn(prompt("session B over the reserve threshold [[u:25600:800]]"))
        await channel.wait_for(lambda f: (f["compaction"] or {}).get("reason") == "threshold", STEP_TIMEOUT_S)
        await rpc.idle()
        switched = len(channel.frames)
        await rpc.request({"type": "switch_session", "sessionPath": session_a})
        await rpc.turn(prompt("session A resumed [[u:12000:240]]"))
        await channel.wait_for(lambda f: (f["reading"] or {}).get("tokens") == 12240, STEP_TIMEOUT_S)
        await rpc.idle()
    data = channel.jsonl()
    keep_recording(data, SWITCH_RECORDINGS, harness, version)
    edges = [frame for _, frame in channel.frames if frame["compaction"] is not None]
    assert [edge["compaction"] for edge in edges] == [
        {"reason": "manual", "count": 1}, {"reason": "threshold", "count": 1},
    ]  # fmt: skip
    assert channel.frames[switched][1]["event"] == "session_start"
    assert channel.frames[switched][1]["compactions"] == 1  # A's own store: its one manual compaction
    producer = PiProducer(harness)  # type: ignore[arg-type]
    readings = replayed_readings(producer, data)
    threshold_edge = next(r.fields for r in readings if r.fields.last_compaction_trigger == "threshold")
    after = producer.held.reading
    assert after is not None and (after.used_tokens, after.compactions) == (12240, 1)
    # A's compaction at the time A's store holds for it (before B's), never B's; the store names no reason.
    stored = channel.frames[switched][1]["lastCompactionAt"]
    assert stored is not None and after.last_compaction_ms == instant_ms(stored)
    b_compacted_at = threshold_edge.last_compaction_ms
    assert b_compacted_at is not None and after.last_compaction_ms < b_compacted_at
    assert after.last_compaction_trigger is None


# --- compactAtTokens (issue 18): the published point is where pi then compacts ------------------

COMPACT_RESERVE = 6000  # configured: compactAt = 32000 - 6000 = 26000 (pi's default would be 15616)
COMPACT_AT = WINDOW - COMPACT_RESERVE
# Where the compactAt recordings are committed (fixtures/pi/live/compact-at/pi-<v>.channel.jsonl).
COMPACT_AT_RECORDINGS = "compact-at"


def _compaction_settings(agent_home: Path, **compaction: object) -> None:
    (agent_home / "settings.json").write_text(json.dumps({"compaction": {"keepRecentTokens": 100, **compaction}}))


@pytest.mark.parametrize(("harness", "version"), PI_BUILDS, ids=[f"{h}-{v}" for h, v in PI_BUILDS])
async def test_pi_publishes_the_compact_at_it_then_compacts_at(harness: str, version: str, short_tmp: Path) -> None:
    """pi 1.6.0 states its settings through `pi.getSettings()`: the record carries window - reserveTokens,
    a turn at or under it does not compact and the next one over it does. pi 0.84.2 has no getSettings:
    null, though the same settings compact it at the same point. Switched off: null and autoCompaction
    false, and a turn over the point does not compact."""
    command = require_harness(harness, version)
    home = short_tmp / "home"
    work = short_tmp / "work"
    work.mkdir(parents=True)
    catalog = Catalog(short_tmp / "catalog")
    stated = version != "0.84.2"
    async with fake_model() as model:
        write_config(home / "agent", model)
        _compaction_settings(home / "agent", enabled=True, reserveTokens=COMPACT_RESERVE)
        run = Run(harness, command, _isolated_env(harness, version, home), work, catalog)
        async with wrapped(run, "pi") as rpc:
            await rpc.turn(prompt("under [[u:24000:960]]"))  # totalTokens 24960 <= 26000
            record = await catalog.settles(lambda r: r.used_tokens == 24960, "the turn under the point")
            assert record.compactions == 0
            if stated:
                assert (record.compact_at_tokens, record.auto_compaction) == (COMPACT_AT, True)
                assert record.compact_at_tokens != WINDOW - 16_384  # pi's default, not the configured one
                headroom = await _roster_headroom(catalog)
                assert headroom == COMPACT_AT - 24960
            else:
                assert (record.compact_at_tokens, record.auto_compaction) == (None, None)
            await rpc.turn(prompt("over [[u:25600:800]]"))  # totalTokens 26400 > 26000
            record = await catalog.settles(lambda r: r.compactions == 1, "the threshold compaction over the point")
            assert record.last_compaction_trigger == "threshold"
            assert record.compact_at_tokens == (COMPACT_AT if stated else None)
        writes = catalog.writes()
        assert [w["usedTokens"] for w in writes if w["reason"] != "compaction"][-1] == 26400

        _compaction_settings(home / "agent", enabled=False, reserveTokens=COMPACT_RESERVE)
        async with wrapped(run, "pi", "--no-session") as rpc:
            await rpc.turn(prompt("off, under [[u:9600:320]]"))
            await rpc.turn(prompt("off, over [[u:25600:800]]"))
            record = await catalog.settles(lambda r: r.used_tokens == 26400, "the turn over the point, switched off")
            await rpc.idle()
        record = catalog.record()
        assert record is not None and record.compactions == 0  # switched off: no compaction at 26400
        assert record.compact_at_tokens is None
        assert record.auto_compaction is (False if stated else None)
    summaries = [served for served in model.requests if served.kind == "summary"]
    assert len(summaries) == 1  # the one threshold compaction, none while switched off


async def _roster_headroom(catalog: Catalog) -> int | None:
    """What `hctx agents --json` carries for the agent: the reader's own headroom."""
    result = await trio.run_process(
        hctx("agents", AGENT, "--json", "--catalog", str(catalog.root), "--host", HOST),
        capture_stdout=True, env=wrapping_env(),
    )  # fmt: skip
    context = json.loads(result.stdout)["context"]
    assert headroom_tokens(context["compactAtTokens"], context["usedTokens"]) == context["headroomTokens"]
    value: int | None = context["headroomTokens"]
    return value


@pytest.mark.parametrize(("harness", "version"), PI_BUILDS, ids=[f"{h}-{v}" for h, v in PI_BUILDS])
async def test_the_asset_sends_pis_compaction_settings(harness: str, version: str, short_tmp: Path) -> None:
    """The frames the asset sends in real pi with configured compaction settings: the fixture the
    producer's compactAt tests replay (fixtures/pi/live/compact-at/)."""
    configure = partial(_compaction_settings, enabled=True, reserveTokens=COMPACT_RESERVE)
    async with asset_session(harness, version, short_tmp, configure) as (_, channel, rpc):
        await rpc.turn(prompt("under [[u:24000:960]]"))
        await rpc.turn(prompt("over [[u:25600:800]]"))
        await channel.wait_for(lambda f: f["compaction"] is not None, STEP_TIMEOUT_S)
        await rpc.idle()
    data = channel.jsonl()
    keep_recording(data, COMPACT_AT_RECORDINGS, harness, version)
    expected = {"enabled": True, "reserveTokens": COMPACT_RESERVE} if version != "0.84.2" else None
    assert {json.dumps(frame["compactionSettings"]) for _, frame in channel.frames} == {json.dumps(expected)}
