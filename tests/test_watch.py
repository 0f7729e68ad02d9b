"""`hctx watch`: the pure state machine against a reference model, its state file, and `--exec`."""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from readers_catalog import HOST, put_claim, put_record
from wrapping import pid_gone

from guard.constants import HARNESS_CONTEXT_STALE_MS
from guard.projection import Context, headroom_tokens
from tests.conftest import REPO
from wrapper.readers.roster import AgentRow
from wrapper.readers.watch import (
    Event,
    Observation,
    Seen,
    Settings,
    StateFile,
    dump_state,
    exec_command,
    load_state,
    observe,
    step,
)

NOW = 1_788_000_000_000


def context(
    percent: float | None = 50.0,
    *,
    stale: bool = False,
    compactions: int = 0,
    used: int | None = 1000,
    compact_at: int | None = None,
) -> Context:
    return Context.model_validate({
        "harness": "pi", "usedTokens": used, "windowTokens": 200_000, "usedPercent": percent,
        "compactions": compactions, "compactAtTokens": compact_at, "observedAtMs": NOW - 1000,
        "ageMs": HARNESS_CONTEXT_STALE_MS + 1 if stale else 1000, "stale": stale,
        "headroomTokens": headroom_tokens(compact_at, used),
    })  # fmt: skip


def seen_row(identity: str, incarnation: str | None, ctx: Context | None, *, running: bool = True) -> Observation:
    row = AgentRow(HOST, identity, "pi", "running" if running else "stopped", ctx)
    return Observation(row, incarnation if ctx is not None else None)


def kinds(events: list[Event]) -> list[tuple[str, str, float | None]]:
    return [(event.row.identity, event.kind, event.threshold) for event in events]


Told = list[tuple[str, str, float | None]]


def run_stream(snapshots: list[list[Observation]], config: Settings | None = None) -> Told:
    state: dict[str, Seen] = {}
    told = []
    for snapshot in snapshots:
        events, state = step(state, snapshot, NOW, config or Settings())
        told.extend(kinds(events))
    return told


# --- the documented examples ------------------------------------------------------------------------


def test_a_session_crossing_80_and_95_compacting_and_dropping_back() -> None:
    readings = [
        context(50), context(82), context(90), context(96), context(97),
        context(None, compactions=1), context(30, compactions=1), context(85, compactions=1),
    ]  # fmt: skip
    told = run_stream([[seen_row("a", "i1", ctx)] for ctx in readings])
    assert told == [("a", "fill", 80.0), ("a", "fill", 95.0), ("a", "compaction", None), ("a", "fill", 80.0)]


def test_one_reading_past_both_thresholds_tells_both_in_order() -> None:
    assert run_stream([[seen_row("a", "i1", context(99))]]) == [("a", "fill", 80.0), ("a", "fill", 95.0)]


def test_withheld_and_stale_readings_fire_nothing_and_rearm_nothing() -> None:
    readings = [context(85), context(None), context(10, stale=True, compactions=4), context(86, compactions=4)]
    # The stale one is beside a running agent: that alone is news, and fresh again after it.
    assert run_stream([[seen_row("a", "i1", ctx)] for ctx in readings]) == [
        ("a", "fill", 80.0), ("a", "stale", None), ("a", "fresh", None), ("a", "compaction", None),
    ]  # fmt: skip


def test_stale_beside_a_stopped_agent_is_not_news() -> None:
    snapshots = [[seen_row("a", "i1", context(10, stale=True), running=False)], [seen_row("a", "i1", context(10))]]
    assert run_stream(snapshots) == []


def test_a_new_incarnation_starts_armed_and_owes_fresh_after_stale() -> None:
    snapshots = [
        [seen_row("a", "i1", context(90, compactions=2))],
        [seen_row("a", "i1", context(90, stale=True, compactions=2))],
        [seen_row("a", None, None)],  # the relaunch claim removed the record
        [seen_row("a", "i2", context(88))],
    ]
    assert run_stream(snapshots) == [  # the 2 compactions it had when first seen are not news
        ("a", "fill", 80.0), ("a", "stale", None), ("a", "fresh", None), ("a", "fill", 80.0),
    ]  # fmt: skip


def test_a_first_sight_arms_and_never_replays_history() -> None:
    """A new watch over an existing catalog: the compactions already counted, and what stopped
    agents last said, are history; what it sees happen next is told."""
    first = [
        seen_row("stopped", "i1", context(96, compactions=3), running=False),
        seen_row("compacted", "i1", context(40, compactions=5)),
        seen_row("quiet", "i1", context(10, compactions=1)),
    ]
    later = [
        seen_row("stopped", "i1", context(96, compactions=3), running=False),
        seen_row("compacted", "i1", context(40, compactions=6)),  # one while watched
        seen_row("quiet", "i1", context(10, compactions=1)),
    ]
    assert run_stream([first, later]) == [("compacted", "compaction", None)]
    # The stopped agent is armed at 96: it is told again only after dropping below and rising.
    again = [seen_row("stopped", "i1", context(50), running=False), seen_row("stopped", "i1", context(81))]
    assert run_stream([first, [again[0]], [again[1]]]) == [("stopped", "fill", 80.0)]


def test_a_first_sight_of_a_running_agent_tells_its_present_fill_but_not_its_past() -> None:
    snapshot = [seen_row("hot", "i1", context(96, compactions=4)), seen_row("idle", "i1", context(10, stale=True))]
    assert run_stream([snapshot]) == [("hot", "fill", 80.0), ("hot", "fill", 95.0), ("idle", "stale", None)]


def test_a_straggler_from_an_older_incarnation_repeats_nothing() -> None:
    """The relaunched agent's readings are told; a late record of the old incarnation (observed
    before them) changes nothing, and the new one's next reading is not told again either."""
    old, new = context(90, compactions=1), context(90)
    old, new = (
        old.model_copy(update={"observed_at_ms": NOW - 60_000}),
        new.model_copy(update={"observed_at_ms": NOW - 1000}),
    )
    snapshots = [
        [seen_row("a", "i1", old)],
        [seen_row("a", "i2", new)],
        [seen_row("a", "i1", old)],  # the straggler
        [seen_row("a", "i2", new)],
    ]
    assert run_stream(snapshots) == [("a", "fill", 80.0), ("a", "fill", 80.0)]


def test_observe_reads_a_record_of_a_past_incarnation_as_no_reading(tmp_path: Path) -> None:
    put_record(tmp_path, "a", incarnation="old", observedAtMs=NOW - 1000, writtenAtMs=NOW - 1000)
    put_claim(tmp_path, "a", incarnation="new", history=[
        {"incarnation": "old", "claimedAtMs": NOW - 60_000, "wrapperPid": 999_999_998}])  # fmt: skip
    (observation,), _ = observe(tmp_path, NOW, here=HOST)
    assert observation.incarnation is None
    put_record(tmp_path, "a", incarnation="new", observedAtMs=NOW - 500, writtenAtMs=NOW - 500)
    (observation,), _ = observe(tmp_path, NOW, here=HOST)
    assert observation.incarnation == "new"


def test_observe_through_a_cache_reads_only_the_records_that_changed(tmp_path: Path) -> None:
    from guard.catalog import RACY_NS
    from wrapper.readers.roster import RosterCache

    old = NOW - 1000
    for agent in ("a", "b", "c"):
        put_record(tmp_path, agent, observedAtMs=old, writtenAtMs=old)
        put_claim(tmp_path, agent, desiredState="running")
        for name in ("harness-context", "harness-state"):  # older than the racy window
            os.utime(tmp_path / "agents" / HOST / agent / name, ns=(time.time_ns() - 2 * RACY_NS,) * 2)
    cache = RosterCache(tmp_path)
    observe(tmp_path, NOW, here=HOST, cache=cache)
    assert cache.cache.reads == 3
    again, _ = observe(tmp_path, NOW + 5, here=HOST, cache=cache)
    assert cache.cache.reads == 3 and [o.row.context.age_ms for o in again if o.row.context] == [1005] * 3
    put_record(tmp_path, "b", usedPercent=77.0, observedAtMs=old + 1, writtenAtMs=old + 1)
    changed, _ = observe(tmp_path, NOW + 10, here=HOST, cache=cache)
    assert cache.cache.reads == 4
    assert [o.row.context.used_percent for o in changed if o.row.context] == [33, 77.0, 33]


def test_headroom_fires_below_the_margin_once_and_rearms_at_or_above_it() -> None:
    config = Settings(thresholds=(), headroom=20_000)
    readings = [
        context(10, used=100_000, compact_at=130_000),
        context(10, used=115_000, compact_at=130_000),  # 15k left
        context(10, used=120_000, compact_at=130_000),
        context(10, used=None, compact_at=130_000),  # unknown: nothing
        context(10, used=110_000, compact_at=130_000),  # 20k: re-armed
        context(10, used=125_000, compact_at=None),  # the harness no longer states it
        context(10, used=111_000, compact_at=130_000),
        context(10, used=129_500, compact_at=130_000),
    ]
    told = run_stream([[seen_row("a", "i1", ctx)] for ctx in readings], config)
    assert told == [("a", "headroom", 20_000.0), ("a", "headroom", 20_000.0)]


def test_event_wire_env_and_message() -> None:
    row = AgentRow(HOST, "builder", "pi", "running", context(96.5, used=193_000, compact_at=195_000))
    event = Event("fill", row, "inc-1", 95.0, NOW)
    wire = event.wire()
    assert wire["event"] == "fill" and wire["agent"] == "builder" and wire["host"] == HOST
    assert wire["threshold"] == 95.0 and wire["usedPercent"] == 96.5 and wire["headroomTokens"] == 2000
    assert wire["message"] == "box/builder: context 97% full (193k/200k), at or above 95%"
    env = event.env()
    assert env["HCTX_EVENT"] == "fill" and env["HCTX_USED_PERCENT"] == "96.5"
    assert env["HCTX_HEADROOM_TOKENS"] == "2000" and env["HCTX_AT_MS"] == str(NOW)
    assert env["HCTX_MESSAGE"] == wire["message"]
    assert set(env) == {"HCTX_" + "".join("_" + c if c.isupper() else c.upper() for c in key) for key in wire}
    row = AgentRow(HOST, "b", "pi", None, context(None, used=None, compactions=2))
    withheld = Event("compaction", row, "i", None, 0)
    assert withheld.env()["HCTX_USED_PERCENT"] == "" and "compacted (2 this session)" in withheld.message()


# --- Hypothesis: over random streams, exactly one event per crossing -----------------------------

AGENTS = ("a", "b")
THRESHOLDS = (80.0, 95.0)
MARGIN = 20_000
CONFIG = Settings(THRESHOLDS, MARGIN)

percents = st.one_of(st.none(), st.sampled_from([0.0, 50.0, 79.9, 80.0, 81.0, 94.9, 95.0, 99.0, 113.75]))
readings = st.fixed_dictionaries({
    "incarnation": st.sampled_from(["i1", "i2"]),
    "percent": percents,
    "stale": st.booleans(),
    "running": st.booleans(),
    "compactions": st.integers(0, 3),
    "used": st.one_of(st.none(), st.sampled_from([90_000, 110_000, 115_000, 129_000, 140_000])),
})  # fmt: skip
# Per agent per step: its directory gone, present with no record, or a reading.
slots = st.one_of(st.just("gone"), st.just("none"), readings)
steps = st.one_of(st.just("restart"), st.fixed_dictionaries({agent: slots for agent in AGENTS}))


def _observations(snapshot: dict[str, Any]) -> list[Observation]:
    observations = []
    for agent in AGENTS:
        slot = snapshot[agent]
        if slot == "gone":
            continue
        if slot == "none":
            observations.append(seen_row(agent, None, None))
            continue
        ctx = context(slot["percent"], stale=slot["stale"], compactions=slot["compactions"], used=slot["used"],
                      compact_at=130_000)  # fmt: skip
        observations.append(seen_row(agent, slot["incarnation"], ctx, running=slot["running"]))
    return observations


def reference(stream: list[Any]) -> list[tuple[str, str, float | None]]:
    """The rules read off the history, not off a state: for each reading, look back at the
    earlier readings of the same incarnation since the agent last appeared."""
    told: list[tuple[str, str, float | None]] = []
    history: dict[str, list[dict[str, Any]]] = {agent: [] for agent in AGENTS}  # readings since it appeared
    for snapshot in stream:
        if snapshot == "restart":
            continue
        for agent in AGENTS:
            slot = snapshot[agent]
            if slot == "gone":
                history[agent] = []
                continue
            if slot == "none":
                continue
            past = history[agent]
            owed_fresh = False  # told stale since the agent appeared, and not yet fresh
            for earlier in past:
                if earlier["stale"] and earlier["running"] and not owed_fresh:
                    owed_fresh = True
                elif not earlier["stale"]:
                    owed_fresh = False
            segment: list[dict[str, Any]] = []  # the same incarnation's earlier readings, back to a switch
            for earlier in reversed(past):
                if earlier["incarnation"] != slot["incarnation"]:
                    break
                segment.insert(0, earlier)
            fresh_before = [earlier for earlier in segment if not earlier["stale"]]
            # The first reading since the agent appeared arms it: its compaction count is not news,
            # nor is anything a stopped agent's fresh first reading says.
            first_sight = not past
            baseline = past[0]["compactions"] if past and len(segment) == len(past) else 0
            past.append(slot)
            if first_sight:
                baseline = slot["compactions"]
                if not slot["stale"] and not slot["running"]:
                    continue
            if slot["stale"]:
                if slot["running"] and not owed_fresh:
                    told.append((agent, "stale", None))
                continue
            if owed_fresh:
                told.append((agent, "fresh", None))
            last_count = fresh_before[-1]["compactions"] if fresh_before else baseline
            if slot["compactions"] > last_count:
                told.append((agent, "compaction", None))
            if slot["percent"] is not None:
                known = [earlier["percent"] for earlier in fresh_before if earlier["percent"] is not None]
                for threshold in THRESHOLDS:
                    if slot["percent"] >= threshold and (not known or known[-1] < threshold):
                        told.append((agent, "fill", threshold))
            if slot["used"] is not None:
                margins = [130_000 - earlier["used"] for earlier in fresh_before if earlier["used"] is not None]
                if 130_000 - slot["used"] < MARGIN and (not margins or margins[-1] >= MARGIN):
                    told.append((agent, "headroom", float(MARGIN)))
    return told


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, max_size=30))
def test_watch_fires_exactly_once_per_crossing_across_restarts(stream: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state_file = StateFile(Path(tmp), "prop")
        told: list[tuple[str, str, float | None]] = []
        with state_file.held() as dir_fd:
            state = state_file.load(dir_fd)
            for snapshot in stream:
                if snapshot == "restart":  # what a new process starts from: the file, nothing else
                    state = state_file.load(dir_fd)
                    continue
                events, after = step(state, _observations(snapshot), NOW, CONFIG)
                if after != state:
                    state_file.save(dir_fd, after)
                state = after
                told.extend(kinds(events))
    assert told == reference(stream)


# --- the state file ----------------------------------------------------------------------------------


def test_state_round_trips_and_lives_under_the_host_local_control_dir(tmp_path: Path) -> None:
    state = {"box/a": Seen("inc-1", frozenset({80.0}), True, 2, stale=True, observed_ms=NOW), "box/b": Seen("inc-2")}
    assert load_state(dump_state(state)) == state
    state_file = StateFile(tmp_path, "default")
    with state_file.held() as dir_fd:
        state_file.save(dir_fd, state)
        assert state_file.load(dir_fd) == state
    assert state_file.path == tmp_path / ".st2" / "watch" / "default.json"
    assert json.loads(state_file.path.read_text())["agents"]["box/a"] == {
        "incarnation": "inc-1", "fired": [80.0], "headroomFired": True, "compactions": 2, "stale": True,
        "observedMs": NOW,
    }  # fmt: skip
    # A state file from before `observedMs` still loads.
    assert load_state(b'{"schema": "hctx.watch-state.v1", "agents": {"box/b": {"incarnation": "inc-2"}}}') == {
        "box/b": Seen("inc-2")
    }
    assert not (tmp_path / "agents").exists()
    assert sorted(os.listdir(tmp_path / ".st2" / "watch")) == ["default.json", "default.lock"]  # no temp left


def test_a_damaged_state_file_starts_from_nothing_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state_file = StateFile(tmp_path, "default")
    state_file.path.parent.mkdir(parents=True)
    state_file.path.write_text("{not json")
    with state_file.held() as dir_fd:
        assert state_file.load(dir_fd) == {}
    assert "unreadable" in capsys.readouterr().err


def test_a_second_watch_with_the_same_name_is_refused(tmp_path: Path) -> None:
    from guard.errors import CatalogError

    with StateFile(tmp_path, "default").held():
        with pytest.raises(CatalogError, match="another hctx watch"), StateFile(tmp_path, "default").held():
            pass
        with StateFile(tmp_path, "pager").held():
            pass


def test_observe_carries_the_records_incarnation_and_every_hosts_rows(tmp_path: Path) -> None:
    put_record(tmp_path, "a", incarnation="inc-a", observedAtMs=NOW - 1000, writtenAtMs=NOW - 1000)
    put_record(tmp_path, "b", host="other", incarnation="inc-b", observedAtMs=NOW - 1000, writtenAtMs=NOW - 1000)
    put_claim(tmp_path, "b", host="other", wrapperPid=os.getpid(), desiredState="stopped")
    (tmp_path / "agents" / HOST / "empty").mkdir()
    observations, warnings = observe(tmp_path, NOW, here=HOST)
    assert [(o.row.name, o.incarnation) for o in observations] == [
        ("box/a", "inc-a"), ("box/empty", None), ("other/b", "inc-b"),
    ]  # fmt: skip
    # The other host's wrapper pid means nothing here: its claim says stopped, so it is not running.
    assert observations[2].row.desired_state == "stopped"
    assert warnings == []


# --- --exec ------------------------------------------------------------------------------------------


def _event(kind: str = "fill", identity: str = "builder") -> Event:
    row = AgentRow(HOST, identity, "pi", "running", context(96.5, used=193_000))
    return Event(kind, row, "inc-1", 95, NOW)  # type: ignore[arg-type]


async def test_exec_gets_the_event_on_stdin_and_as_hctx_variables(tmp_path: Path) -> None:
    out, env = tmp_path / "stdin.json", tmp_path / "env.txt"
    deliver = exec_command(f"cat > {out}; env | grep '^HCTX_' | sort > {env}", 10)
    event = _event()
    await deliver(event)
    assert out.read_text() == json.dumps(event.wire(), ensure_ascii=False) + "\n"
    lines = env.read_text().splitlines()
    assert "HCTX_EVENT=fill" in lines and "HCTX_AGENT=builder" in lines and "HCTX_THRESHOLD=95" in lines
    assert f"HCTX_MESSAGE={event.message()}" in lines and "HCTX_HEADROOM_TOKENS=" in lines


async def test_a_failing_command_is_logged(capsys: pytest.CaptureFixture[str]) -> None:
    await exec_command("exit 3", 10)(_event())
    assert "--exec for fill of box/builder exited with status 3" in capsys.readouterr().err


async def test_a_hung_command_and_its_children_are_killed_at_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_file = tmp_path / "pid"
    started = trio.current_time()
    await exec_command(f"sleep 60 & echo $! > {pid_file}; wait", 0.5)(_event())
    assert trio.current_time() - started < 5
    assert "--exec for fill of box/builder timed out after 0.5 s; killed" in capsys.readouterr().err
    child = int(pid_file.read_text())
    for _ in range(250):  # the grandchild went with the process group
        if pid_gone(child):
            break
        await trio.sleep(0.02)
    assert pid_gone(child)


# --- the whole command, on a hand-written catalog -------------------------------------------------


def _watch(catalog: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "wrapper.cli", "watch", "--catalog", str(catalog), "--host", HOST, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
    )  # fmt: skip


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait(predicate: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def _stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    return out, err


def _now() -> int:
    return time.time_ns() // 1_000_000


def _put(catalog: Path, agent: str, percent: float, observed: int | None = None) -> None:
    stamp = _now() if observed is None else observed
    fields = {"usedPercent": percent, "compactions": 0, "observedAtMs": stamp, "writtenAtMs": stamp}
    put_record(catalog, agent, incarnation="i", **fields)


def _readline(process: subprocess.Popen[str], timeout: float = 20.0) -> str:
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
    return lines.get(timeout=timeout)


def test_a_hung_and_a_failing_command_never_stop_the_watch(tmp_path: Path) -> None:
    """The command hangs on the first event of `slow`, fails on `bad`'s; both logged, and both agents'
    later events still come, in order; `bad`'s are not held up behind `slow`'s hung command."""
    catalog, got = tmp_path / "catalog", tmp_path / "got.jsonl"
    for agent in ("slow", "bad"):
        _put(catalog, agent, 85.0)
    script = (
        f'line=$(cat); printf "%s\\n" "$line" >> {got}; '
        f'[ "$HCTX_AGENT/$HCTX_THRESHOLD" = slow/80 ] && exec sleep 60; [ "$HCTX_AGENT" = bad ] && exit 1; true'
    )
    watch = _watch(catalog, "--exec", script, "--exec-timeout", "4", "--reread", "600")
    try:
        _wait(lambda: len(_lines(got)) == 2)
        for agent in ("slow", "bad"):
            _put(catalog, agent, 96.0)
        _wait(lambda: len(_lines(got)) == 4)
    finally:
        _, err = _stop(watch)
    events = [(event["agent"], event["threshold"]) for event in _lines(got)]
    assert [e for e in events if e[0] == "slow"] == [("slow", 80), ("slow", 95)]
    assert [e for e in events if e[0] == "bad"] == [("bad", 80), ("bad", 95)]
    assert events[-1] == ("slow", 95)  # only once its hung 80 was killed, after `bad`'s 95
    assert "--exec for fill of box/slow timed out after 4 s; killed" in err
    assert err.count("--exec for fill of box/bad exited with status 1") == 2


def test_staleness_is_found_by_the_periodic_reread_without_a_file_event(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    almost = _now() - HARNESS_CONTEXT_STALE_MS + 1500  # stale 1.5 s from now; nothing will touch the file
    _put(catalog, "a", 10.0, almost)
    put_claim(catalog, "a", wrapperPid=os.getpid(), host=HOST, desiredState="running")
    watch = _watch(catalog, "--reread", "0.3")
    try:
        stale = json.loads(_readline(watch))
        _put(catalog, "a", 12.0)
        fresh = json.loads(_readline(watch))
    finally:
        _stop(watch)
    assert stale["event"] == "stale" and stale["ageMs"] >= HARNESS_CONTEXT_STALE_MS
    assert "old while the agent runs" in stale["message"]
    assert fresh["event"] == "fresh" and fresh["usedPercent"] == 12.0


def test_a_missing_catalog_is_an_error_naming_it(tmp_path: Path) -> None:
    watch = _watch(tmp_path / "nowhere")
    out, err = watch.communicate(timeout=20)
    assert watch.returncode == 2 and "nowhere does not exist (from --catalog)" in err and out == ""


# --- the README's lines ----------------------------------------------------------------------------


def _readme_watch_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Being told before a window fills", 1)[1].split("\n## ", 1)[0]
    # the --exec block (the section's first, issue 38's, is --notify's: tests/test_notify.py)
    blocks = [block.split("```", 1)[0] for block in section.split("```sh\n")[1:]]
    block = next(block for block in blocks if "--exec" in block)
    return [line for line in block.splitlines() if line.startswith("hctx watch")]


def test_the_readme_watch_lines_parse() -> None:
    from wrapper.cli import build_parser

    lines = _readme_watch_lines()
    assert len(lines) == 3
    for line in lines:
        words = shlex.split(line)
        command = words[: words.index("|")] if "|" in words else words  # a pipe outside the quotes
        assert build_parser().parse_args(command[1:]).command == "watch"


async def test_the_readme_notify_send_commands_show_the_message(tmp_path: Path) -> None:
    shown = tmp_path / "shown"
    fake = tmp_path / "bin" / "notify-send"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nprintf "%s|%s\\n" "$1" "$2" >> {shown}\n')
    fake.chmod(0o755)
    event = _event()
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{fake.parent}:{old_path}"
    try:
        for line in _readme_watch_lines()[:2]:
            await exec_command(shlex.split(line)[3], 10)(event)
    finally:
        os.environ["PATH"] = old_path
    assert shown.read_text().splitlines() == [f"hctx|{event.message()}"] * 2


def test_a_new_watch_over_an_existing_catalog_tells_only_what_happens_while_it_watches(tmp_path: Path) -> None:
    """Issue 25/27: stopped agents with old fills and compactions, running ones with compactions:
    a first start tells none of it; the first line out is the one reading that crossed 80 after."""
    catalog = tmp_path / "catalog"
    stamp = _now()
    for index in range(20):
        put_record(catalog, f"old-{index}", usedPercent=96.0, compactions=3, observedAtMs=stamp, writtenAtMs=stamp)
        put_claim(catalog, f"old-{index}", desiredState="stopped")
    for index in range(5):
        put_record(catalog, f"live-{index}", usedPercent=50.0, compactions=2, observedAtMs=stamp, writtenAtMs=stamp)
        put_claim(catalog, f"live-{index}", wrapperPid=os.getpid(), host=HOST, desiredState="running")
    watch = _watch(catalog, "--reread", "0.3")
    try:
        assert process_logged(watch, "following")
        time.sleep(1.0)  # several re-reads of the whole catalog
        later = _now()
        put_record(catalog, "live-3", usedPercent=85.0, compactions=2, observedAtMs=later, writtenAtMs=later)
        first = json.loads(_readline(watch))
    finally:
        out, _ = _stop(watch)
    assert (first["agent"], first["event"], first["threshold"]) == ("live-3", "fill", 80)
    assert out == ""  # nothing after it either


def process_logged(process: subprocess.Popen[str], text: str, timeout: float = 20.0) -> bool:
    assert process.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stderr.readline()), daemon=True).start()  # type: ignore[union-attr]
    return text in lines.get(timeout=timeout)


def test_a_partial_step_keeps_the_agents_it_did_not_see() -> None:
    """A file event steps only the agents whose files changed; the others keep what was told."""
    both = [seen_row("a", "i1", context(85)), seen_row("b", "i1", context(90))]
    events, state = step({}, both, NOW, Settings())
    assert len(events) == 2  # fill 80 for each
    events, after = step(state, [seen_row("a", "i1", context(10))], NOW, Settings(), partial=True)
    assert events == [] and after["box/b"] == state["box/b"] and after["box/a"].fired == frozenset()
    assert "box/b" not in step(state, [seen_row("a", "i1", context(10))], NOW, Settings())[1]


def test_a_file_event_reads_only_the_agents_it_names(tmp_path: Path) -> None:
    from wrapper.readers.notice import agent_of
    from wrapper.readers.roster import RosterCache

    for agent in ("a", "b"):
        put_record(tmp_path, agent, observedAtMs=NOW - 1000, writtenAtMs=NOW - 1000)
    cache = RosterCache(tmp_path)
    observe(tmp_path, NOW, here=HOST, cache=cache)
    reads = cache.cache.reads
    put_record(tmp_path, "b", usedPercent=90.0, observedAtMs=NOW - 500, writtenAtMs=NOW - 500)
    named = agent_of(tmp_path, str(tmp_path / "agents" / HOST / "b" / "harness-context"))
    assert named == (HOST, "b")
    seen, _ = observe(tmp_path, NOW, here=HOST, cache=cache, only={named})
    assert [(o.row.identity, o.row.context and o.row.context.used_percent) for o in seen] == [("b", 90.0)]
    assert cache.cache.reads == reads + 1  # `a` was not looked at


# --- saving what was told: once per step, and before each attempt ---------------------------------


async def test_a_step_with_events_saves_once_per_attempt_and_the_save_holds_the_attempt() -> None:
    """1,000 agents re-armed (a state change, no event) and one crossing 80 and 95: each attempt
    finds on disk what it tells and every other agent's latest state, in one save per attempt (a
    save for the step itself, then one per attempt, was a cost that grew with the fleet: issue 25)."""
    from wrapper.readers.watch import Outbox

    _, state = step({}, [seen_row(f"q{n:04d}", "i", context(85)) for n in range(1000)], NOW, Settings())
    quiet = [seen_row(f"q{n:04d}", "i", context(10)) for n in range(1000)]
    events, after = step(state, [*quiet, seen_row("a", "i", context(96))], NOW, Settings())
    assert kinds(events) == [("a", "fill", 80), ("a", "fill", 95)]
    saves: list[dict[str, Seen]] = []
    attempts: list[tuple[float | None, dict[str, Seen]]] = []

    async def deliver(event: Event) -> None:
        attempts.append((event.threshold, saves[-1]))

    async with trio.open_nursery() as nursery:
        outbox = Outbox(nursery, deliver, lambda told: saves.append(dict(told)), state)
        outbox.settle(after, events)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert len(saves) == 2
    (first, on_disk), (second, then) = attempts
    assert (first, on_disk["box/a"].fired, len(on_disk)) == (80, frozenset({80}), 1001)
    assert on_disk["box/q0999"].fired == frozenset()  # re-armed, in the same save
    assert (second, then["box/a"].fired) == (95, frozenset({80, 95}))
    assert then == after


def test_the_state_file_encodes_only_what_changed_and_writes_the_same_bytes() -> None:
    cached: dict[str, tuple[Seen, str]] = {}
    state = {f"box/a{n}": Seen(f"i{n}", frozenset({80.0}), n % 2 == 0, n, False, NOW + n) for n in range(50)}
    assert dump_state(state, cached) == dump_state(state)
    state["box/a7"] = Seen("i7b", frozenset(), True, 0, True, NOW)
    del state["box/a3"]
    assert dump_state(state, cached) == dump_state(state) and "box/a3" not in cached
    assert load_state(dump_state(state, cached)) == state
