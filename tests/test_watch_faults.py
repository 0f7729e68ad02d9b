"""Issue 26, points 2, 6 and 7: `hctx watch` under hostile records, hostile state files and commands
that leave children behind. Real `hctx watch` processes on hand-written catalogs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from readers_catalog import HOST, put_record
from wrapping import pid_gone, wait_for

from guard.projection import Context
from tests.conftest import REPO
from wrapper.readers.roster import AgentRow
from wrapper.readers.watch import Event, exec_command


def watch(catalog: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "wrapper.cli", "watch", "--catalog", str(catalog), "--host", HOST, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
    )  # fmt: skip


def stop(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


def wait(predicate: Any, timeout: float = 30.0) -> Any:
    return wait_for(predicate, timeout)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def put(catalog: Path, agent: str, percent: float, *, host: str = HOST, incarnation: str = "i") -> None:
    stamp = time.time_ns() // 1_000_000
    put_record(catalog, agent, host=host, incarnation=incarnation, usedPercent=percent, compactions=0,
               observedAtMs=stamp, writtenAtMs=stamp)  # fmt: skip


def told(catalog: Path, name: str = "default") -> dict[str, Any]:
    agents: dict[str, Any] = json.loads((catalog / ".st2" / "watch" / f"{name}.json").read_text())["agents"]
    return agents


# --- 2. one hostile record costs only its own events ----------------------------------------------


def test_a_nul_in_one_records_incarnation_costs_no_other_agent_an_event(tmp_path: Path) -> None:
    """Five agents at 96% and a peer host's agent whose incarnation is "x\\u0000y": all ten events
    of the five are delivered, the hostile record is refused with a warning, the state holds what
    was told and nothing else, and the watch outlives its periodic re-reads."""
    catalog, got = tmp_path / "catalog", tmp_path / "got.jsonl"
    for n in range(5):
        put(catalog, f"a{n}", 96.0)
    put(catalog, "hostile", 96.0, host="peer", incarnation="x\u0000y")
    process = watch(catalog, "--exec", f'cat >> {got}; echo "$HCTX_INCARNATION" > /dev/null', "--reread", "0.5")
    try:
        wait(lambda: len(lines(got)) == 10)
        time.sleep(2.0)  # four re-reads of the hostile record
        assert process.poll() is None
    finally:
        status, _, err = stop(process)
    assert status == 0 and "Traceback" not in err and "ValueError" not in err
    assert sorted((e["agent"], e["threshold"]) for e in lines(got)) == sorted(
        (f"a{n}", t) for n in range(5) for t in (80, 95)
    )
    assert "NUL" in err and "peer/hostile" in err
    state = told(catalog)
    assert sorted(state) == [f"{HOST}/a{n}" for n in range(5)]
    assert all(seen["fired"] == [80, 95] for seen in state.values())


def _event(incarnation: str, model: str = "m") -> Event:
    context = {"harness": "pi", "usedTokens": 1, "windowTokens": 100, "usedPercent": 96.0, "compactions": 0,
               "compactAtTokens": None, "observedAtMs": 1, "ageMs": 1, "stale": False, "model": model,
               "headroomTokens": None}  # fmt: skip
    return Event(
        "fill", AgentRow(HOST, "builder", "pi", "running", Context.model_validate(context)), incarnation, 95, 1
    )


async def test_a_value_no_environment_carries_is_delivered_escaped(tmp_path: Path) -> None:
    """Past the record's edge (a producer's own value, say): NUL and a lone surrogate go escaped."""
    out, env = tmp_path / "stdin.json", tmp_path / "env.txt"
    await exec_command(f'cat > {out}; printf %s "$HCTX_INCARNATION" > {env}', 10)(_event("x\x00y\ud800"))
    assert env.read_text() == "x\\u0000y\\ud800"
    assert json.loads(out.read_text())["incarnation"] == "x\x00y\ud800"  # the JSON spells both exactly


def test_an_event_still_queued_when_the_watch_stops_is_told_by_the_next(tmp_path: Path) -> None:
    """a's 80 is running (its command hangs) and a's 95 waits behind it when the watch stops: the
    80 is not told again (its delivery was attempted), the 95 is (it never was)."""
    catalog, got, hung = tmp_path / "catalog", tmp_path / "got.jsonl", tmp_path / "hung"
    put(catalog, "a", 96.0)
    script = (
        f'line=$(cat); printf "%s\\n" "$line" >> {got}; [ "$HCTX_THRESHOLD" = 80 ] && touch {hung} && sleep 60; true'
    )
    first = watch(catalog, "--exec", script, "--exec-timeout", "60", "--reread", "600")
    try:
        wait(hung.exists)
        assert told(catalog)[f"{HOST}/a"]["fired"] == [80]  # recorded as the attempt started, 95 not yet
    finally:
        stop(first)
    second = watch(catalog, "--exec", f"cat >> {got}", "--reread", "600")
    try:
        wait(lambda: len(lines(got)) == 2)
        time.sleep(1.0)
    finally:
        stop(second)
    assert [e["threshold"] for e in lines(got)] == [80, 95]
    assert told(catalog)[f"{HOST}/a"]["fired"] == [80, 95]


# --- 6. hostile state and lock files ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["state-symlink", "state-fifo", "lock-symlink", "lock-fifo"])
def test_a_hostile_state_or_lock_file_is_set_aside_and_the_watch_goes_on(tmp_path: Path, kind: str) -> None:
    catalog, outside = tmp_path / "catalog", tmp_path / "outside"
    outside.write_text("not hctx's\n")
    put(catalog, "a", 85.0)
    directory = catalog / ".st2" / "watch"
    directory.mkdir(parents=True)
    place = directory / ("default.json" if kind.startswith("state") else "default.lock")
    if kind.endswith("symlink"):
        place.symlink_to(outside)
    else:
        os.mkfifo(place)
    process = watch(catalog, "--reread", "600")
    try:
        assert process.stdout is not None
        assert json.loads(process.stdout.readline())["threshold"] == 80
    finally:
        status, _, err = stop(process)
    assert status == 0 and "Traceback" not in err, err
    assert "set aside" in err
    assert outside.read_text() == "not hctx's\n"
    assert told(catalog)[f"{HOST}/a"]["fired"] == [80]


# --- 7. what a command leaves behind goes with it ----------------------------------------------------

# The command returns once all three children wrote their pids: the double-forked one writes
# its own, and one not written by the return would be ended before it could.
LEAVER = (
    "sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; "
    "(setsid sh -c 'sleep 300 & echo $! >> {pids}; wait' &); "
    "while [ $(wc -l < {pids}) -lt 3 ]; do sleep 0.05; done; exit 0"
)


async def test_children_a_command_leaves_behind_are_ended_when_it_returns(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    await exec_command(LEAVER.format(pids=pids), 30)(_event("i"))  # 30 s: a liveness bound on the third pid
    left = [int(pid) for pid in pids.read_text().split()]
    assert len(left) == 3
    with trio.move_on_after(30):
        while not all(pid_gone(pid) for pid in left):  # noqa: ASYNC110 (other processes: nothing to wait on in trio)
            await trio.sleep(0.02)
    assert [pid for pid in left if not pid_gone(pid)] == []


def test_a_stopped_watch_ends_a_running_commands_children_and_its_pipe_reaches_eof(tmp_path: Path) -> None:
    catalog, pids = tmp_path / "catalog", tmp_path / "pids"
    put(catalog, "a", 85.0)
    script = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; exec sleep 300"
    process = watch(catalog, "--exec", script, "--reread", "600")
    wait(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    left = [int(pid) for pid in pids.read_text().split()]
    started = time.monotonic()
    status, _, err = stop(process)  # communicate() returns only once every holder of stdout is gone
    assert status == 0 and time.monotonic() - started < 15, err
    wait(lambda: all(pid_gone(pid) for pid in left), timeout=10)
