"""Live: the real codex CLI (0.151.0 and 0.171.0), not the app-server, followed through its rollout.

`codex exec` writes the same rollout the interactive TUI writes. HOME and CODEX_HOME are isolated in
tmp_path, the custom provider points at the project's fake Responses API on 127.0.0.1, and
`follow_rollout` runs beside the CLI exactly as the sidecar would run it for a TUI seat: it must find
the rollout the CLI holds open (this process is its parent, the wrapper's place) and publish Codex's
own numbers. Under `hctx wrap`, two seats in one directory each publish their own rollout, and a
`codex exec resume` of an earlier session is followed in the file it appends to.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from guard.policy import Reading
from sidecar.decoding import Dropped
from sidecar.harnesses.codex.producer import SPEC, CodexProducer, CodexTransport, Rollout
from sidecar.harnesses.codex.rollout import follow_rollout
from sidecar.harnesses.codex.transcript import read_codex_tail, tail_events
from sidecar.streams import Streams
from sidecar.transcripts import BackwardLines
from tests.fakes.codex_model import codex_config, codex_env, fake_responses
from tests.harnesses import HARNESS_VERSIONS, require_harness

pytestmark = pytest.mark.live

LIMIT_S = 60.0


@dataclass(frozen=True)
class Seat:
    home: Path
    codex_home: Path
    work: Path
    catalog: Path
    env: dict[str, str]


@asynccontextmanager
async def codex_seat(tmp_path: Path, version: str) -> AsyncIterator[Seat]:
    """A Codex home configured for the fake Responses server on loopback, and the server."""
    home, codex_home, work = tmp_path / "home", tmp_path / "codexhome", tmp_path / "work"
    for directory in (home, codex_home, work):
        directory.mkdir()
    async with fake_responses() as fake:
        (codex_home / "config.toml").write_text(codex_config(fake.base_url))
        yield Seat(home, codex_home, work, tmp_path / "cat", codex_env(home, codex_home, version))


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_a_cli_session_is_followed_through_its_rollout(version: str, tmp_path: Path) -> None:
    codex = require_harness("codex", version)
    frames: list[object] = []  # the typed events the follower submits
    async with codex_seat(tmp_path, version) as seat:
        codex_home, work, env = seat.codex_home, seat.work, seat.env
        config = Rollout(
            codex_home=str(codex_home),
            cwd=str(work),
            started_at_ms=time.time_ns() // 10**6,
            root_pid=os.getpid(),  # codex is this process's child, as it is the wrapper's
        )
        prompt = "live rollout turn [[u:90000:800:29000]]"
        argv = [*codex, "exec", "--skip-git-repo-check", "-s", "read-only", prompt]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_rollout, config, Streams(SPEC, frames.append))
            with trio.fail_after(LIMIT_S):
                done = await trio.run_process(
                    argv,
                    cwd=work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
            nursery.cancel_scope.cancel()  # the session is over: the follower reads what is left
    producer = CodexProducer()
    readings: list[Reading] = []
    for frame in frames:
        if not isinstance(frame, Dropped):
            readings.extend(producer.feed(frame, 1))
    last = producer.held.reading
    assert last is not None
    # 90,800 of Codex's effective 190,000 window: Codex's "56% context left", so 44 and not 47.8.
    assert (last.used_tokens, last.window_tokens, last.used_percent) == (90_800, 190_000, 44)
    assert last.session_total_tokens == 90_800
    rollouts = list((codex_home / "sessions").rglob("rollout-*.jsonl"))
    assert len(rollouts) == 1
    data = rollouts[0].read_bytes()
    assert f'"cli_version":"{version}"'.encode() in data
    # The same file read from its end (hctx scan's path) gives the same reading.
    tail = read_codex_tail(BackwardLines(lambda offset, size: data[offset : offset + size], len(data)), "t")
    assert tail.session is not None and tail.session.cwd == str(work)
    scanned = CodexProducer()
    for at_ms, frame in tail_events(tail):
        scanned.feed(frame, at_ms or 0)
    assert scanned.held.reading is not None
    ignored = {"observed_at_ms", "rate_limits", "rate_limits_at_ms"}  # the limits and when they arrived
    assert scanned.held.reading.model_dump(exclude=ignored) == last.model_dump(exclude=ignored)
    # Following, the turn's snapshot comes after its reading (as the app-server orders it) and is
    # published on it; scanning, the latest snapshot rides the one reading there is.
    assert last.rate_limits is not None and (last.rate_limits.five_hour, last.rate_limits.seven_day) == (10, 40)
    assert scanned.held.reading.rate_limits is not None
    assert (scanned.held.reading.rate_limits.five_hour, scanned.held.reading.rate_limits.seven_day) == (10, 40)


def _tui_plan_follows_rollouts() -> bool:
    from sidecar.launching import LaunchPlan
    from sidecar.registry import prepare

    plan = prepare(LaunchPlan(harness="codex", argv=("codex", "exec", "hi"), cwd=Path.cwd()))
    return isinstance(plan.transport, CodexTransport) and isinstance(plan.transport.root, Rollout)


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_a_wrapped_cli_seat_publishes_the_record(version: str, tmp_path: Path) -> None:
    """End to end once the Codex launch plan hands non-app-server launches to `follow_rollout`."""
    assert _tui_plan_follows_rollouts()
    from guard.record import parse_record
    from tests.wrapping import agent_dir, wrap_argv

    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        work, catalog, env = seat.work, seat.catalog, seat.env
        argv = wrap_argv(catalog, "seat", "codex", *codex, "exec", "--skip-git-repo-check", "-s", "read-only",
                         "wrapped turn [[u:90000:800:29000]]")  # fmt: skip
        with trio.fail_after(LIMIT_S):
            done = await trio.run_process(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_stdout=True,
                                          capture_stderr=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    record = parse_record((agent_dir(catalog, "seat") / "harness-context").read_bytes())
    assert (record.used_tokens, record.window_tokens, record.used_percent) == (90_800, 190_000, 44)


def _exec(*args: str) -> tuple[str, ...]:
    return ("exec", "--skip-git-repo-check", "-s", "read-only", *args)


async def _wrapped_seat(codex: list[str], catalog: Path, agent: str, work: Path, env: dict[str, str],
                        *args: str) -> None:  # fmt: skip
    from tests.wrapping import wrap_argv

    argv = wrap_argv(catalog, agent, "codex", *codex, *args)
    done = await trio.run_process(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_stdout=True,
                                  capture_stderr=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]


def _record(catalog: Path, agent: str) -> tuple[int | None, int | None, float | None, int]:
    from guard.record import parse_record
    from tests.wrapping import agent_dir

    record = parse_record((agent_dir(catalog, agent) / "harness-context").read_bytes())
    return record.used_tokens, record.window_tokens, record.used_percent, record.compactions


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_two_wrapped_seats_in_one_directory_each_publish_their_own_rollout(version: str, tmp_path: Path) -> None:
    """Seat A's turn runs for 8 s; seat B starts 2 s later in the same directory and ends first, so B's
    rollout is the newest there while A still runs (the cwd-and-time rule followed it from A)."""
    assert _tui_plan_follows_rollouts()
    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        codex_home, work, catalog, env = seat.codex_home, seat.work, seat.catalog, seat.env
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_wrapped_seat, codex, catalog, "seat-a", work, env,
                                   *_exec("seat A [[u:90000:800:29000]] [[sleep:8]]"))  # fmt: skip
                await trio.sleep(2)
                nursery.start_soon(_wrapped_seat, codex, catalog, "seat-b", work, env, *_exec("seat B [[u:30000:500]]"))
    rollouts = list((codex_home / "sessions").rglob("rollout-*.jsonl"))
    assert len(rollouts) == 2  # two sessions, one directory
    # Codex's 44 for A's 90,800 and 10 for B's 30,500, each under its own seat.
    assert _record(catalog, "seat-a") == (90_800, 190_000, 44, 0)
    assert _record(catalog, "seat-b") == (30_500, 190_000, 10, 0)


@pytest.mark.parametrize("version", HARNESS_VERSIONS["codex"])
async def test_a_wrapped_exec_resume_is_followed_in_the_rollout_it_appends_to(version: str, tmp_path: Path) -> None:
    """`codex exec resume <id>` appends to the earlier session's rollout, whose session_meta predates the
    launch by more than the launch slack: the seat publishes the resumed turn, counting no old edge.
    The turn takes 6 s, as a resumed session at a person's pace does (a sidecar on a loaded machine
    may take seconds to start): a resume over within one poll is never seen holding its file, and
    the end-of-session fallback only knows new rollouts."""
    assert _tui_plan_follows_rollouts()
    from sidecar.harnesses.codex.rollout import LAUNCH_SLACK_MS, read_session_meta

    codex = require_harness("codex", version)
    async with codex_seat(tmp_path, version) as seat:
        codex_home, work, catalog, env = seat.codex_home, seat.work, seat.catalog, seat.env
        with trio.fail_after(LIMIT_S):
            await _wrapped_seat(codex, catalog, "first", work, env, *_exec("first [[u:90000:800:29000]]"))
            [rollout] = list((codex_home / "sessions").rglob("rollout-*.jsonl"))
            meta = read_session_meta(rollout)
            assert meta is not None
            before = rollout.stat().st_size
            await trio.sleep(LAUNCH_SLACK_MS / 1000 + 1)
            resume = _exec("resume", str(meta["id"]), "resumed turn [[u:50000:500]] [[sleep:6]]")
            await _wrapped_seat(codex, catalog, "resumed", work, env, *resume)
    assert list((codex_home / "sessions").rglob("rollout-*.jsonl")) == [rollout]  # appended, no new file
    assert rollout.stat().st_size > before
    # 50,500 of 190,000: Codex's "78% context left", so 22.
    assert _record(catalog, "resumed") == (50_500, 190_000, 22, 0)
