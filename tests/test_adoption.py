"""Adoption (issue 36): `sidecar.adoption`'s paths, `hctx adopt`'s refusals, the resident's adopt mode
watching a process it did not start, and Claude's tee adopting the Claude that ran it.

The adopted process here is a plain long-running Python process (the live Claude tests adopt the
real CLI): what is under test is the adoption, not the harness."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.layout import default_host
from guard.procs import proc_stat
from sidecar.adoption import (
    LOCK_NAME,
    REFUSED_NAME,
    adoption_channel,
    adoption_dir,
    process_start_ticks,
    process_stat,
    wrapped_environ,
)
from sidecar.harnesses.claude.launch import tee_command
from tests.conftest import REPO
from tests.wrapping import pid_gone, wait_for

HOST = default_host()  # the adopter names no host: this machine's, as `hctx wrap` without --host
ADOPT_CODE = f"import sys;sys.path.insert(0,{str(REPO)!r});from wrapper.launch.adopt import main;sys.exit(main())"
ADOPT = [sys.executable, "-I", "-c", ADOPT_CODE]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
PAYLOAD = (REPO / "fixtures" / "claude" / "statusline-2.1.250.jsonl").read_bytes().splitlines()[1]


class Seat:
    """An isolated HOME, catalog and runtime dir (short: the adoption channel is a unix socket path)."""

    def __init__(self, tmp_path: Path, runtime: Path) -> None:
        self.home, self.catalog, self.runtime = tmp_path / "home", tmp_path / "catalog", runtime
        self.work = tmp_path / "proj"
        for path in (self.home, self.work):
            path.mkdir()
        self.env = {key: value for key, value in os.environ.items() if not key.startswith(("HCTX_", "ST_CLAUDE"))}
        self.env |= {"HOME": str(self.home), "HCTX_CATALOG": str(self.catalog), "XDG_RUNTIME_DIR": str(runtime),
                     "PYTHONPATH": str(REPO)}  # fmt: skip
        self.started: list[subprocess.Popen[bytes]] = []

    def environ(self) -> dict[bytes, bytes]:
        return {b"XDG_RUNTIME_DIR": os.fsencode(self.runtime)}

    def harness(self, *, cwd: Path | None = None, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(SLEEPER, cwd=cwd or self.work, env=self.env | (extra or {}))
        self.started.append(process)
        return process

    def adopt(self, pid: int, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ADOPT, "--harness", "claude", "--pid", str(pid), *args], env=self.env,
                              input=stdin.decode(), capture_output=True, text=True, timeout=60)  # fmt: skip

    def claim_path(self, agent: str) -> Path:
        return self.catalog / "agents" / HOST / agent / "harness-state"

    def claim(self, agent: str) -> dict[str, object] | None:
        try:
            value = json.loads(self.claim_path(agent).read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def adopt_log(self) -> str:
        path = self.catalog / ".st2" / "logs" / "adopt.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def seat(tmp_path: Path) -> Iterator[Seat]:
    runtime = Path(tempfile.mkdtemp(prefix="ha", dir="/tmp"))
    made = Seat(tmp_path, runtime)
    try:
        yield made
    finally:
        for process in made.started:
            if process.poll() is None:
                process.kill()
            process.wait()
        shutil.rmtree(runtime, ignore_errors=True)


def ours(catalog: Path) -> list[int]:
    """Every live process whose command line names `catalog` (a sidecar does), by a scan of /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and not pid_gone(int(entry)):
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if os.fsencode(catalog) in command:
                found.append(int(entry))
    return found


def children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        stat = proc_stat(int(entry)) if entry.isdigit() else None
        if stat is not None and stat.parent == pid and stat.state not in ("Z", "X"):
            kids.append(int(entry))
    return kids


# --- sidecar.adoption ------------------------------------------------------------------------------


def test_the_channel_is_a_function_of_the_pid_its_start_time_and_the_runtime_dir(tmp_path: Path) -> None:
    uid = os.getuid()
    runtime = {b"XDG_RUNTIME_DIR": os.fsencode(tmp_path)}
    assert adoption_dir(123, 456, runtime) == f"{tmp_path}/hctx-{uid}/adopt-123-456"
    assert adoption_channel(123, 456, runtime) == f"{tmp_path}/hctx-{uid}/adopt-123-456/channel"
    # No runtime dir, a relative one, or one that does not exist: /tmp, never the working directory.
    for environ in ({}, {b"XDG_RUNTIME_DIR": b"run"}, {b"XDG_RUNTIME_DIR": os.fsencode(tmp_path / "gone")}):
        assert adoption_channel(7, 8, environ) == f"/tmp/hctx-{uid}/adopt-7-8/channel"


def test_a_start_time_names_one_live_process() -> None:
    mine = proc_stat(os.getpid())
    assert mine is not None and process_start_ticks(os.getpid()) == mine.started
    stat = process_stat(os.getpid())
    assert stat is not None and stat[1] == os.getppid()
    child = subprocess.Popen(["sleep", "30"])
    assert process_stat(child.pid) is not None and process_stat(child.pid)[0] == "sleep"  # type: ignore[index]
    child.kill()
    wait_for(lambda: proc_stat(child.pid) is not None and proc_stat(child.pid).state == "Z", what="a zombie")  # type: ignore[union-attr]
    assert process_start_ticks(child.pid) is None  # exited: only its status is left
    child.wait()
    assert process_start_ticks(child.pid) is None and process_start_ticks(0) is None and process_start_ticks(-1) is None


def test_the_wrapped_seats_environment_is_never_adopted() -> None:
    assert wrapped_environ({b"HCTX_CHANNEL": b"/run/x/channel"})
    assert wrapped_environ({b"HCTX_NO_ADOPT": b"1"})
    assert not wrapped_environ({b"HCTX_CHANNEL": b"", b"HOME": b"/home/u"})


def test_the_module_loads_under_python_I_S_with_nothing_but_itself() -> None:
    probe = (f"import sys; sys.path.append({str(REPO)!r}); before = set(sys.modules); import sidecar.adoption; "
             "print(' '.join(sorted(set(sys.modules) - before)))")  # fmt: skip
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["sidecar", "sidecar.adoption"]


# --- the adopter's refusals ---------------------------------------------------------------------------


def test_a_dead_pid_is_refused(seat: Seat) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = seat.adopt(gone.pid, "--no-detach")
    assert (done.returncode, done.stdout) == (1, "")
    assert f"pid {gone.pid} is not running" in done.stderr and "Traceback" not in done.stderr
    assert not (seat.catalog / "agents").exists()


def test_another_users_process_is_refused(seat: Seat) -> None:
    if os.getuid() == 0:
        foreign = subprocess.Popen(["sleep", "30"], user=65534, group=65534)
        seat.started.append(foreign)  # type: ignore[arg-type]
        wait_for(lambda: os.stat(f"/proc/{foreign.pid}").st_uid == 65534, what="the switch to nobody")
        pid = foreign.pid
    else:
        pid = 1
    done = seat.adopt(pid, "--no-detach")
    assert done.returncode == 1 and "not to this user" in done.stderr, done.stderr
    assert not (seat.catalog / "agents").exists() and not (seat.runtime / f"hctx-{os.getuid()}").exists()


def test_a_process_started_by_hctx_wrap_stands_the_adopter_down(seat: Seat) -> None:
    wrapped = seat.harness(extra={"HCTX_CHANNEL": "/run/user/1/hctx-x/channel"})
    done = seat.adopt(wrapped.pid, "--no-detach")
    assert done.returncode == 0  # nothing wrong: the wrapped seat wins
    assert not (seat.catalog / "agents").exists() and not (seat.runtime / f"hctx-{os.getuid()}").exists()


def test_a_second_adopter_stands_down_and_claims_nothing(seat: Seat) -> None:
    plain = seat.harness()
    start = process_start_ticks(plain.pid)
    assert start is not None
    directory = Path(adoption_dir(plain.pid, start, seat.environ()))
    for made in (directory.parent, directory):
        made.mkdir()
        made.chmod(0o700)
    with open(directory / LOCK_NAME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first adopter, holding it
        started = time.monotonic()
        done = seat.adopt(plain.pid, "--no-detach")
    assert done.returncode == 0 and time.monotonic() - started < 10
    assert not (seat.catalog / "agents").exists()


def test_a_runtime_dir_planted_as_a_symlink_is_refused(seat: Seat, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (seat.runtime / f"hctx-{os.getuid()}").symlink_to(elsewhere)
    plain = seat.harness()
    done = seat.adopt(plain.pid, "--no-detach")
    assert done.returncode == 1 and "is not a directory (a symlink or a file is there)" in done.stderr
    assert list(elsewhere.iterdir()) == [] and not (seat.catalog / "agents").exists()


def test_an_unknown_harness_is_refused_and_the_refusal_is_left_for_the_trigger(seat: Seat) -> None:
    plain = seat.harness()
    done = subprocess.run([*ADOPT, "--harness", "nosuch", "--pid", str(plain.pid), "--no-detach"], env=seat.env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "no harness 'nosuch'" in done.stderr
    start = process_start_ticks(plain.pid)
    assert start is not None
    refused = Path(adoption_dir(plain.pid, start, seat.environ())) / REFUSED_NAME
    assert "no harness 'nosuch'" in refused.read_text()  # Claude's tee starts no other adopter for it


def test_a_refusal_is_removed_by_the_next_adoption_once_its_process_has_ended(seat: Seat) -> None:
    """A refusal stays while its process runs (the trigger must not start another adopter for it) and
    no longer: the next adoption sweeps the refusals of ended processes out of the runtime directory."""

    def refuse(process: subprocess.Popen[bytes]) -> Path:
        done = subprocess.run([*ADOPT, "--harness", "nosuch", "--pid", str(process.pid), "--no-detach"],
                              env=seat.env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 1, done.stderr
        start = process_start_ticks(process.pid)
        assert start is not None
        directory = Path(adoption_dir(process.pid, start, seat.environ()))
        assert [path.name for path in directory.iterdir()] == [REFUSED_NAME]
        return directory

    ended, running = seat.harness(), seat.harness()
    ended_dir, running_dir = refuse(ended), refuse(running)
    stray = ended_dir.with_name("adopt-notapid-1")  # not an adoption directory's name: never touched
    stray.mkdir()
    ended.kill()
    ended.wait()
    assert ended_dir.exists()  # nothing sweeps until the next adoption
    refuse(seat.harness())
    assert not ended_dir.exists()
    assert running_dir.exists() and (running_dir / REFUSED_NAME).exists() and stray.exists()


def test_a_harness_whose_launch_plan_defines_no_adoption_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar import registry

    monkeypatch.setattr(registry, "launch_plan", lambda name: types.SimpleNamespace(prepare=lambda plan: plan))
    with pytest.raises(registry.NotAdoptable, match="the claude harness cannot be adopted"):
        registry.adopted_plan("claude", os.getpid(), Path.cwd(), {})


def test_a_bad_hint_or_pid_is_a_usage_error_in_the_foreground() -> None:
    for args in (["--pid", "0"], ["--pid", "1", "--hint", "novalue"]):
        done = subprocess.run([*ADOPT, "--harness", "claude", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.startswith("hctx adopt: ")


# --- adopted: the claim, the sidecar, the end ----------------------------------------------------


def adopted(seat: Seat, pid: int, agent: str) -> dict[str, object]:
    done = seat.adopt(pid)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")  # detached: nothing on the harness's screen
    return wait_for(lambda: (c := seat.claim(agent)) is not None and c["desiredState"] == "running" and c,
                    what=f"{agent}'s claim; log: {seat.adopt_log()}")  # fmt: skip


def test_an_adopted_process_gets_a_claim_and_its_sidecar_until_it_exits(seat: Seat) -> None:
    plain = seat.harness()
    started = time.monotonic()
    done = seat.adopt(plain.pid)
    returned_s = time.monotonic() - started
    # ~0.05 s idle (the harness waits on its hooks); bounded only by the detached child's whole work
    assert done.returncode == 0 and returned_s < 30, returned_s
    claim = wait_for(lambda: seat.claim("proj"), what=f"the claim; log: {seat.adopt_log()}")
    assert claim["adopted"] is True and claim["harness"] == "claude" and claim["desiredState"] == "running"
    resident = claim["wrapperPid"]
    assert isinstance(resident, int)
    start = process_start_ticks(plain.pid)
    assert start is not None
    channel = Path(adoption_channel(plain.pid, start, seat.environ()))
    wait_for(channel.is_socket, what="the sidecar's channel")
    sidecar = wait_for(lambda: children(resident), what="the sidecar")
    assert len(sidecar) == 1 and ours(seat.catalog) == sidecar  # two processes: the resident and its sidecar
    assert proc_stat(plain.pid).parent == os.getpid()  # type: ignore[union-attr]  # never the resident's child

    listed = subprocess.run([sys.executable, "-m", "wrapper.cli", "agents", "--json", "--catalog", str(seat.catalog)],
                            env=seat.env, capture_output=True, text=True, timeout=60)  # fmt: skip
    (row,) = json.loads(listed.stdout)
    assert (row["identity"], row["desiredState"], row["adopted"]) == ("proj", "running", True)

    plain.terminate()
    plain.wait()
    wait_for(lambda: seat.claim("proj")["desiredState"] == "stopped", what="the claim stopped")  # type: ignore[index]
    wait_for(lambda: pid_gone(resident) and not ours(seat.catalog), what="no process left")
    wait_for(lambda: not channel.parent.exists(), what="the adoption dir removed")
    assert seat.claim("proj")["incarnation"] == claim["incarnation"]  # type: ignore[index]


def test_a_resident_told_to_stop_never_signals_the_adopted_process(seat: Seat) -> None:
    plain = seat.harness()
    claim = adopted(seat, plain.pid, "proj")
    resident = claim["wrapperPid"]
    assert isinstance(resident, int)
    wait_for(lambda: children(resident), what="the sidecar")
    os.kill(resident, signal.SIGTERM)
    wait_for(lambda: pid_gone(resident) and not ours(seat.catalog), what="the resident and sidecar gone")
    assert seat.claim("proj")["desiredState"] == "stopped"  # type: ignore[index]
    time.sleep(0.5)
    assert plain.poll() is None  # the user's process runs on, unsignalled


def test_a_process_already_adopted_is_not_adopted_again(seat: Seat) -> None:
    plain = seat.harness()
    claim = adopted(seat, plain.pid, "proj")
    wait_for(lambda: children(claim["wrapperPid"]), what="the sidecar")  # type: ignore[arg-type]  # exec'd, lock held
    again = seat.adopt(plain.pid, "--no-detach")
    assert again.returncode == 0  # the first adopter's resident holds the flock: it stands down
    assert seat.claim("proj-2") is None and seat.claim("proj")["incarnation"] == claim["incarnation"]  # type: ignore[index]


def test_two_plain_sessions_in_one_directory_are_two_agents(seat: Seat) -> None:
    first, second = seat.harness(), seat.harness()
    one = adopted(seat, first.pid, "proj")
    two = adopted(seat, second.pid, "proj-2")
    assert one["adopted"] is True and two["adopted"] is True and one["wrapperPid"] != two["wrapperPid"]


def test_a_session_started_again_while_its_adoption_ends_is_the_same_agent(seat: Seat) -> None:
    """A session ended and started again at once (`omp --continue`): the first's resident holds the
    seat while its sidecar drains. The new session's adopter waits for it to be over and takes the
    same seat, as a wrapped seat's relaunch does (the shell waits for `hctx wrap`); never NAME-2."""
    first = seat.harness()
    claim = adopted(seat, first.pid, "proj")
    resident = claim["wrapperPid"]
    assert isinstance(resident, int)
    wait_for(lambda: children(resident), what="the sidecar")
    os.kill(resident, signal.SIGSTOP)  # held in its ending for as long as this test needs
    try:
        first.kill()
        first.wait()
        second = seat.harness()
        assert seat.adopt(second.pid).returncode == 0
        wait_for(lambda: "waiting for the adoptions of 1 ended process(es)" in seat.adopt_log(), what="the wait")
        assert seat.claim("proj-2") is None
    finally:
        os.kill(resident, signal.SIGCONT)

    def claimed_again() -> dict[str, object] | None:
        again = seat.claim("proj")
        fresh = again is not None and again["incarnation"] != claim["incarnation"]
        return again if fresh and again["desiredState"] == "running" else None

    try:
        again = wait_for(claimed_again, what="proj claimed by the new session")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; proj-2: {seat.claim('proj-2')}; log: {seat.adopt_log()}") from None
    assert again["adopted"] is True and seat.claim("proj-2") is None, seat.adopt_log()
    assert pid_gone(resident)


def test_inspect_and_the_table_mark_an_adopted_agent(seat: Seat) -> None:
    plain = seat.harness()
    adopted(seat, plain.pid, "proj")
    cli = [sys.executable, "-m", "wrapper.cli"]
    shown = subprocess.run([*cli, "inspect", f"{HOST}/proj", "--catalog", str(seat.catalog)], env=seat.env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "adopted       yes: started without `hctx wrap`" in shown.stdout, shown.stdout + shown.stderr
    table = subprocess.run([*cli, "agents", "--catalog", str(seat.catalog)], env=seat.env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert "running (adopted)" in table.stdout


# --- Claude's tee adopts the Claude that ran it ----------------------------------------------------------

# A stand-in Claude: runs the tee exactly as Claude does (through `/bin/sh -c`, the payload on its
# stdin), prints what it drew, then lives on as a session does.
FAKE_CLAUDE = r"""
import subprocess, sys, time
drawn = subprocess.run(["/bin/sh", "-c", sys.argv[1]], input=sys.stdin.buffer.read(), capture_output=True)
print(repr(drawn.stdout), flush=True)
time.sleep(600)
"""


def test_the_tee_adopts_the_claude_that_ran_it_and_hands_over_its_first_frame(seat: Seat) -> None:
    env = seat.env | {"ST_CLAUDE_STATUSLINE_RENDERER": "printf drawn"}
    claude = subprocess.Popen([sys.executable, "-c", FAKE_CLAUDE, tee_command("statusline")], cwd=seat.work,
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    seat.started.append(claude)
    assert claude.stdin is not None and claude.stdout is not None
    claude.stdin.write(PAYLOAD)
    claude.stdin.close()
    assert claude.stdout.readline() == b"b'drawn'\n"  # the user's renderer drew, as without hctx
    claim = wait_for(lambda: seat.claim("proj"), what=f"the claim; log: {seat.adopt_log()}")
    assert claim["adopted"] is True
    record = seat.claim_path("proj").with_name("harness-context")
    version = json.loads(PAYLOAD)["version"]
    reading = wait_for(lambda: record.exists() and json.loads(record.read_text()), what="the first frame's record")
    # The frame that started the adoption, handed over, not lost: the payload's own numbers.
    assert (reading["harnessVersion"], reading["usedTokens"], reading["windowTokens"]) == (version, 100005, 1000000)
    claude.kill()
    claude.wait()
    wait_for(lambda: seat.claim("proj")["desiredState"] == "stopped", what="the claim stopped")  # type: ignore[index]
    wait_for(lambda: not ours(seat.catalog), what="no process left")


# A session over within a second (a short `codex exec`): it exits once its adopter holds the lock,
# before the resident that adopter becomes has looked at it.
BRIEF_CLAUDE = r"""
import os, subprocess, sys, time
from sidecar.adoption import LOCK_NAME, adoption_dir, process_start_ticks
subprocess.run(["/bin/sh", "-c", sys.argv[1]], input=sys.stdin.buffer.read(), capture_output=True)
lock = os.path.join(adoption_dir(os.getpid(), process_start_ticks(os.getpid())), LOCK_NAME)
deadline = time.monotonic() + 60
while not os.path.exists(lock) and time.monotonic() < deadline:
    time.sleep(0.001)
"""


def test_a_session_over_before_its_resident_looked_still_gets_its_record(seat: Seat) -> None:
    env = seat.env | {"ST_CLAUDE_STATUSLINE_RENDERER": "printf drawn"}
    claude = subprocess.Popen([sys.executable, "-c", BRIEF_CLAUDE, tee_command("statusline")], cwd=seat.work,
                              env=env, stdin=subprocess.PIPE)  # fmt: skip
    seat.started.append(claude)
    claude.communicate(PAYLOAD, timeout=60)
    record = seat.claim_path("proj").with_name("harness-context")
    reading = wait_for(lambda: record.exists() and json.loads(record.read_text()),
                       what=f"the record of a session already over; log: {seat.adopt_log()}")  # fmt: skip
    assert (reading["usedTokens"], reading["windowTokens"]) == (100005, 1000000)  # the handed-over frame's
    wait_for(lambda: seat.claim("proj")["desiredState"] == "stopped", what="the claim stopped")  # type: ignore[index]
    wait_for(lambda: not ours(seat.catalog), what="no process left")


# --- the mark, in every reader ------------------------------------------------------------------


def test_every_reader_marks_an_adopted_agent_and_leaves_a_wrapped_one_as_it_was(tmp_path: Path) -> None:
    from wrapper.readers.render import render_agents, render_agents_json
    from wrapper.readers.roster import AgentRow, Roster
    from wrapper.readers.top import render_frame
    from wrapper.readers.web.board import row_view

    now = 1_796_000_000_000
    wrapped = AgentRow(host="h", identity="wrapped", harness="claude", desired_state="running", context=None)
    plain = AgentRow(host="h", identity="plain", harness="claude", desired_state="running", context=None, adopted=True)
    listed = {row["identity"]: row for row in json.loads(render_agents_json([wrapped, plain], now=now))}
    assert listed["plain"]["adopted"] is True and "adopted" not in listed["wrapped"]
    assert list(listed["wrapped"]) == ["host", "identity", "harness", "desiredState", "context", "accountRateLimits"]
    table = render_agents([wrapped, plain], colour=False, now=now).splitlines()
    assert "running (adopted)" in next(line for line in table if " plain " in line)
    assert "adopted" not in next(line for line in table if " wrapped " in line)
    frame = render_frame(Roster([wrapped, plain]), now, catalog=tmp_path, width=200, height=None, colour=False)
    assert any("h/plain (adopted)" in line for line in frame) and not any("wrapped (adopted)" in line for line in frame)
    assert (
        row_view(plain, now, now)["state"] == "running (adopted)" and row_view(wrapped, now, now)["state"] == "running"
    )


def test_the_adoption_log_starts_afresh_past_its_bound_for_the_adopter_and_codexs_hook_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One opener for both writers of adopt.log (they each had their own, the hook's unbounded): past
    ADOPT_LOG_BYTES the log is kept as adopt.log.1 and a new one begun."""
    from sidecar.adoption import ADOPT_LOG, ADOPT_LOG_BYTES
    from sidecar.harnesses.codex import setup as codex_setup

    catalog = tmp_path / "catalog"
    monkeypatch.setenv("HCTX_CATALOG", str(catalog))
    logs = catalog / ".st2" / "logs"
    logs.mkdir(parents=True)
    (logs / ADOPT_LOG).write_bytes(b"x" * (ADOPT_LOG_BYTES + 1))
    codex_setup.note("a refusal")
    assert (logs / f"{ADOPT_LOG}.1").stat().st_size == ADOPT_LOG_BYTES + 1
    assert (logs / ADOPT_LOG).read_text().endswith("hctx adopt: codex hook: a refusal\n")
    assert (logs / ADOPT_LOG).stat().st_size < 200
