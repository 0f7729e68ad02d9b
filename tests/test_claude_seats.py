"""`hctx wrap --harness claude` leaves the working directory as it found it, across real wrappers:
two seats in one directory, a second launch while one runs, and a SIGKILLed wrapper repaired by
the next launch or by the next session's end. The harness is a stand-in; the settings are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from sidecar.harnesses.claude.launch import RENDERER_ENV, SEATS_PATH, SETTINGS_PATH, tee_command
from tests.wrapping import env, pid_gone, wait_for, wrap_argv

# Says it runs (with the renderer hctx chained for it), then waits for its stop file.
STANDIN = r"""
import os, pathlib, sys, time
name = pathlib.Path(sys.argv[1])
name.with_suffix(".renderer").write_text(os.environ.get("ST_CLAUDE_STATUSLINE_RENDERER", ""))
name.with_suffix(".running").touch()
while not name.with_suffix(".stop").exists():
    time.sleep(0.02)
"""

USER_BYTES = b'{"statusLine": {"type": "command", "command": "my-line.sh"},\n  "model":   "claude-opus-5"}'


class Seat:
    """One `hctx wrap` in `work`, as its own agent."""

    started: ClassVar[list[Seat]] = []  # ended by `no_seat_outlives_its_test`, whatever the test did

    def __init__(self, tmp_path: Path, work: Path, name: str, wait: bool = True) -> None:
        self.marker = tmp_path / name
        argv = wrap_argv(tmp_path / "catalog", name, "claude", sys.executable, "-c", STANDIN, str(self.marker))
        environ = {key: value for key, value in env().items() if key != RENDERER_ENV}
        self.process = subprocess.Popen(argv, cwd=work, env=environ, stderr=subprocess.PIPE, text=True)
        Seat.started.append(self)
        if wait:
            self.wait_running()

    def wait_running(self) -> None:
        wait_for(self.marker.with_suffix(".running").exists, timeout=30, what=f"{self.marker.name} running")

    @property
    def renderer(self) -> str:
        return self.marker.with_suffix(".renderer").read_text()

    def end(self) -> None:
        self.marker.with_suffix(".stop").touch()
        _, err = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, err

    def kill(self) -> None:
        """SIGKILL the wrapper: no teardown runs; the stand-in goes with it (its death signal)."""
        self.process.kill()
        self.process.communicate(timeout=30)
        assert self.process.returncode == -signal.SIGKILL


@pytest.fixture(autouse=True)
def no_seat_outlives_its_test() -> Iterator[None]:
    """A failed assertion leaves no wrapper behind: each seat still running is told to stop, then killed."""
    yield
    while Seat.started:
        process = (seat := Seat.started.pop()).process
        if process.poll() is None:
            seat.marker.with_suffix(".stop").touch()
            try:
                process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate(timeout=10)


def seat_pids(work: Path) -> list[int]:
    return [seat["pid"] for seat in json.loads((work / SEATS_PATH).read_text())["seats"]]


def rendered(work: Path) -> bool:
    command: str = json.loads((work / SETTINGS_PATH).read_text())["statusLine"]["command"]
    return command == tee_command("statusline")


def user_dir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / ".claude").mkdir(parents=True)
    (work / SETTINGS_PATH).write_bytes(USER_BYTES)
    return work


def test_two_seats_keep_the_file_while_either_runs_and_the_last_puts_it_back(tmp_path: Path) -> None:
    work = user_dir(tmp_path)
    first = Seat(tmp_path, work, "first")
    second = Seat(tmp_path, work, "second")  # a second launch while one runs
    assert rendered(work) and seat_pids(work) == [first.process.pid, second.process.pid]
    # The second launch did not take the first one's rendering for the user's file:
    assert first.renderer == second.renderer == "my-line.sh"
    first.end()
    assert rendered(work) and seat_pids(work) == [second.process.pid]
    second.end()
    assert (work / SETTINGS_PATH).read_bytes() == USER_BYTES
    assert sorted(p.name for p in (work / ".claude").iterdir()) == ["settings.local.json"]


def test_the_last_seat_to_end_need_not_be_the_first_and_a_created_file_goes(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first = Seat(tmp_path, work, "first")
    second = Seat(tmp_path, work, "second")
    second.end()
    assert rendered(work)
    first.end()
    assert list(work.iterdir()) == []


def test_seats_taken_and_left_all_at_once_are_all_counted(tmp_path: Path) -> None:
    """The flock on the directory: no launch or end overwrites another's change to the record."""
    work = user_dir(tmp_path)
    seats = [Seat(tmp_path, work, f"s{n}", wait=False) for n in range(4)]
    for seat in seats:
        seat.wait_running()
    assert sorted(seat_pids(work)) == sorted(seat.process.pid for seat in seats)
    assert {seat.renderer for seat in seats} == {"my-line.sh"}
    for seat in seats:
        seat.marker.with_suffix(".stop").touch()
    for seat in seats:
        seat.end()
    assert (work / SETTINGS_PATH).read_bytes() == USER_BYTES
    assert sorted(p.name for p in (work / ".claude").iterdir()) == ["settings.local.json"]


def test_a_sigkilled_wrapper_is_repaired_by_the_next_launch(tmp_path: Path) -> None:
    work = user_dir(tmp_path)
    killed = Seat(tmp_path, work, "killed")
    killed.kill()
    assert rendered(work)  # nothing ran to put it back; the seat record says who held it
    wait_for(lambda: pid_gone(killed.process.pid), what="the killed wrapper gone")
    after = Seat(tmp_path, work, "after")
    assert seat_pids(work) == [after.process.pid]  # the dead seat dropped
    assert after.renderer == "my-line.sh"  # the user's status line, not hctx's tee, is what was found
    after.end()
    assert (work / SETTINGS_PATH).read_bytes() == USER_BYTES
    assert not (work / SEATS_PATH).exists()


def test_a_sigkilled_wrapper_is_repaired_by_the_next_session_end(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    survivor = Seat(tmp_path, work, "survivor")
    killed = Seat(tmp_path, work, "killed")
    killed.kill()
    survivor.end()  # the last live seat: the dead one does not hold the file
    assert list(work.iterdir()) == []


def test_a_seat_whose_pid_was_reused_counts_as_dead(tmp_path: Path) -> None:
    """A pid alone is not a process: the start time recorded with it must match too."""
    work = user_dir(tmp_path)
    first = Seat(tmp_path, work, "first")
    record = json.loads((work / SEATS_PATH).read_text())
    record["seats"] = [{"pid": os.getpid(), "startTime": 1}]  # a live pid, but not the process that sat
    (work / SEATS_PATH).write_text(json.dumps(record))
    first.end()  # it no longer holds a seat of its own; the only one recorded is dead: put back
    assert (work / SETTINGS_PATH).read_bytes() == USER_BYTES
