"""`hctx wrap` under faults (issue 15, the wrapper's side): a dead sidecar, a second wrapper, a full
disk, a killed wrapper. Real processes throughout; see tests/wrapping.py for the helpers."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.record import parse_record
from scripts.bench_footprint import command
from scripts.fault_suite import FILL_THE_DISK
from tests.wrapping import (
    agent_dir,
    children,
    context_frame,
    env,
    hctx,
    log_events,
    pid_gone,
    read_json,
    run,
    wait_for,
    wrap_argv,
)
from wrapper.launch.launcher import HARNESS_KILL_DEADLINE_S
from wrapper.launch.sidecars import sidecar_restart_delay

# ---------------------------------------------------------------------------------------------
# 3. A dead sidecar is noticed, logged, replaced for the same incarnation, and the gap recorded

# Waits for the test's go, then sends its frame until a sidecar takes it, then waits for the record.
AFTER_THE_KILL = r"""
import os, socket, sys, time
go, frame = sys.argv[1], sys.argv[2].encode() + b"\n"
open(go + ".harness", "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
record = os.path.join(os.environ["HCTX_CATALOG"], "agents", "testhost", os.environ["HCTX_AGENT"], "harness-context")
deadline = time.monotonic() + 20
while not os.path.exists(record) and time.monotonic() < deadline:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.environ["HCTX_CHANNEL"])
        s.sendall(frame)
        s.close()
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(0 if os.path.exists(record) else 9)
"""


def _starts(catalog: Path, agent: str) -> list[dict[str, object]]:
    return [e for e in log_events(catalog, agent) if e["event"] == "start"]


def test_a_killed_sidecar_is_replaced_for_the_same_incarnation_and_the_gap_is_on_record(tmp_path: Path) -> None:
    catalog, go = tmp_path / "c", tmp_path / "go"
    argv = wrap_argv(catalog, "a", "pi", sys.executable, "-c", AFTER_THE_KILL, str(go), context_frame(10, 100, 10.0))
    wrapper = subprocess.Popen(argv, env=env(), stderr=subprocess.PIPE, text=True)
    wait_for(Path(f"{go}.harness").exists, what="the harness")  # so the first sidecar was ready
    first = _starts(catalog, "a")[0]
    os.kill(int(first["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    go.touch()
    _, err = wrapper.communicate(timeout=60)

    assert wrapper.returncode == 0, err  # the harness's frame landed through the replacement
    starts = _starts(catalog, "a")
    assert len(starts) == 2 and starts[0]["incarnation"] == starts[1]["incarnation"]
    assert starts[0]["channel"] == starts[1]["channel"] and starts[0]["pid"] != starts[1]["pid"]
    state = read_json(agent_dir(catalog, "a") / "harness-state")
    record = parse_record((agent_dir(catalog, "a") / "harness-context").read_bytes())
    assert record.incarnation == state["incarnation"] == starts[0]["incarnation"]
    [gap] = state["unobserved"]
    assert gap["sidecarPid"] == first["pid"] and gap["sidecarExit"] == -signal.SIGKILL
    assert gap["sinceMs"] <= gap["untilMs"]
    died = [e for e in log_events(catalog, "a") if e["event"] == "sidecar-died"]
    assert len(died) == 1 and died[0]["pid"] == first["pid"] and died[0]["incarnation"] == state["incarnation"]
    notes = [line for line in err.splitlines() if "sidecar" in line]
    assert len(notes) == 1 and "replacing it" in notes[0], err  # one line on the terminal, no more
    assert "Traceback" not in err

    shown = run(hctx("inspect", "--catalog", str(catalog), "--host", "testhost", "a")).stdout
    assert "unobserved" in shown and f"sidecar pid {first['pid']}" in shown


def test_a_crash_looping_sidecar_is_retried_with_a_growing_back_off_and_then_left() -> None:
    delays = [sidecar_restart_delay(n) for n in range(10)]
    assert delays[0] is not None and delays[0] > 0
    given = [d for d in delays if d is not None]
    assert given == sorted(given) and given[-1] > given[0]  # backs off
    assert delays[-1] is None and len(given) <= 6  # and stops trying


# ---------------------------------------------------------------------------------------------
# 7. Two wrappers for one agent

SLEEPER = "import time; time.sleep(60)"


def _live_wrapper(catalog: Path, agent: str) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    wrapper = subprocess.Popen(wrap_argv(catalog, agent, "pi", sys.executable, "-c", SLEEPER), env=env(),
                               stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    wait_for(lambda: _starts(catalog, agent), what="the first wrapper's sidecar")
    return wrapper, read_json(agent_dir(catalog, agent) / "harness-state")


def test_a_second_wrapper_for_a_live_claim_is_refused_and_takeover_stops_the_first(tmp_path: Path) -> None:
    catalog = tmp_path / "c"
    first, claim = _live_wrapper(catalog, "a")
    try:
        second = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')"))
        assert second.returncode != 0 and "RAN" not in second.stdout
        assert f"already wrapped by pid {first.pid}" in second.stderr and "--takeover" in second.stderr
        assert "Traceback" not in second.stderr
        assert read_json(agent_dir(catalog, "a") / "harness-state") == claim  # untouched

        taken = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')", extra=("--takeover",)))
        assert taken.returncode == 0 and "RAN" in taken.stdout, taken.stderr
        assert first.wait(timeout=15) == 128 + signal.SIGTERM  # the first wrapper was stopped, not left writing
        state = read_json(agent_dir(catalog, "a") / "harness-state")
        assert state["incarnation"] != claim["incarnation"]
        assert state["history"][0]["incarnation"] == claim["incarnation"]
    finally:
        first.kill()
        first.wait()


def test_a_claim_whose_wrapper_is_dead_is_taken_over_without_asking(tmp_path: Path) -> None:
    catalog = tmp_path / "c"
    first, claim = _live_wrapper(catalog, "a")
    first.kill()
    first.wait()
    second = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')"))
    assert second.returncode == 0 and "RAN" in second.stdout, second.stderr
    assert read_json(agent_dir(catalog, "a") / "harness-state")["history"][0]["incarnation"] == claim["incarnation"]


def test_a_claim_whose_pid_now_belongs_to_another_process_is_not_held(tmp_path: Path) -> None:
    """After a reboot or a pid wrap-around the claim's pid may be alive but not a wrapper."""
    catalog = tmp_path / "c"
    first, _ = _live_wrapper(catalog, "a")
    first.kill()
    first.wait()
    state = read_json(agent_dir(catalog, "a") / "harness-state")
    bystander = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        state["wrapperPid"] = bystander.pid  # a live process of ours, started after the claim
        (agent_dir(catalog, "a") / "harness-state").write_text(json.dumps(state))
        second = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')"))
        assert second.returncode == 0 and "RAN" in second.stdout, second.stderr
        assert bystander.poll() is None  # and nobody signalled it
    finally:
        bystander.kill()
        bystander.wait()


def test_two_wrappers_started_at_once_for_one_agent_one_runs(tmp_path: Path) -> None:
    catalog = tmp_path / "c"
    argv = wrap_argv(catalog, "a", "pi", sys.executable, "-c", "import time; time.sleep(3)")
    wrappers = [subprocess.Popen(argv, env=env(), stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(w.wait(timeout=60), w.stderr.read() if w.stderr else "") for w in wrappers]
    assert sorted(code for code, _ in results) == [0, 2, 2, 2], results
    assert len(_starts(catalog, "a")) == 1


# ---------------------------------------------------------------------------------------------
# 8. A full disk never masks the harness's exit status

SABOTAGE = r"""
import os, shutil, sys
staging = os.path.join(os.environ["HCTX_CATALOG"], ".st2", "harness-context-staging")
shutil.rmtree(staging)
open(staging, "w").close()  # every later staged write fails, as on a full disk
sys.exit(3)
"""


@pytest.mark.parametrize("restart", [(), ("--restart", "always", "--restart-delay", "0")])
def test_a_failed_final_state_write_keeps_the_harness_exit_status(tmp_path: Path, restart: tuple[str, ...]) -> None:
    catalog = tmp_path / "c"
    result = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", SABOTAGE, extra=restart))
    assert result.returncode == 3, result.stderr
    assert "harness-state" in result.stderr and "Traceback" not in result.stderr
    state = read_json(agent_dir(catalog, "a") / "harness-state")
    assert state["desiredState"] == "running" and state["history"] == []  # the old claim, whole


def _unshare_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)  # fmt: skip
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_tmpfs(), reason="needs unshare -rm and a tmpfs mount")
def test_a_really_full_disk_keeps_the_harness_exit_status(tmp_path: Path) -> None:
    catalog, harness = tmp_path / "c", tmp_path / "fill.py"
    catalog.mkdir()
    harness.write_text(FILL_THE_DISK)
    wrap = " ".join(wrap_argv(catalog, "a", "pi", sys.executable, str(harness)))
    script = f"mount -t tmpfs -o size=2m tmpfs {catalog} && exec {wrap}"
    result = run(["unshare", "-rm", "sh", "-c", script], timeout=60)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "No space left on device" in result.stderr


# ---------------------------------------------------------------------------------------------
# 9. Killing the wrapper leaves no harness process behind

# The harness behind `sh` (which forks, since a command follows), ignoring SIGTERM and SIGHUP; both
# record their pids. Without a controlling terminal (a new session) the harness gets a group of its own.
STUBBORN = "import os, signal, sys, time; [signal.signal(s, signal.SIG_IGN) for s in (1, 15)]; " \
    "open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(120)"  # fmt: skip


def _stubborn_behind_sh(pids: Path) -> list[str]:
    inner = f'{sys.executable} -c "{STUBBORN}" {pids}'
    return ["sh", "-c", f"echo $$ >> {pids}; {inner}; echo after"]


def _pids(path: Path, count: int) -> list[int]:
    lines = wait_for(lambda: path.exists() and len(path.read_text().split()) >= count and path.read_text().split(),
                     what=f"{count} harness pids")  # fmt: skip
    return [int(pid) for pid in lines]


# Past the keeper's SIGKILL at HARNESS_KILL_DEADLINE_S, what a loaded machine may add before the
# harness is seen gone: these tests catch a harness never ended, or ended only by something else.
SLACK_S = 10


def _no_orphans(pids: list[int], started: float) -> float:
    wait_for(lambda: all(pid_gone(pid) for pid in pids), timeout=HARNESS_KILL_DEADLINE_S + 30, what="no orphans")
    return time.monotonic() - started


@pytest.mark.parametrize("behind_sh", [True, False])
def test_a_sigkilled_wrapper_takes_a_stubborn_harness_and_its_children_along(tmp_path: Path, behind_sh: bool) -> None:
    pids = tmp_path / "pids"
    command = _stubborn_behind_sh(pids) if behind_sh else [sys.executable, "-c", STUBBORN, str(pids)]
    wrapper = subprocess.Popen(wrap_argv(tmp_path / "c", "a", "pi", *command), env=env(), stdin=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    harness = _pids(pids, 2 if behind_sh else 1)
    wrapper.kill()
    wrapper.wait()
    took = _no_orphans(harness, time.monotonic())
    assert took < HARNESS_KILL_DEADLINE_S + SLACK_S


@pytest.mark.parametrize("behind_sh", [True, False])
def test_a_wrapper_killed_inside_its_sidecars_back_off_takes_the_harness_along(tmp_path: Path, behind_sh: bool) -> None:
    """The sidecar SIGKILLed, then the wrapper before its replacement starts: no sidecar holds the
    lifeline then, and the harness ignores the death signal's SIGTERM; the keeper ends the group."""
    pids = tmp_path / "pids"
    command = _stubborn_behind_sh(pids) if behind_sh else [sys.executable, "-c", STUBBORN, str(pids)]
    wrapper = subprocess.Popen(wrap_argv(tmp_path / "c", "a", "pi", *command), env=env(), stdin=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    harness = _pids(pids, 2 if behind_sh else 1)
    first = wait_for(lambda: _starts(tmp_path / "c", "a"), what="the sidecar")[0]
    os.kill(int(first["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    time.sleep(0.1)  # the first replacement waits 0.25 s
    wrapper.kill()
    wrapper.wait()
    assert _no_orphans(harness, time.monotonic()) < HARNESS_KILL_DEADLINE_S + SLACK_S


def _keeper(wrapper: int) -> int | None:
    """The wrapper's keeper, once it has exactly one."""
    keepers = [pid for pid in children(wrapper) if command(pid).startswith("/bin/sh -c while IFS= read")]
    return keepers[0] if len(keepers) == 1 else None


def test_a_keeper_waits_beside_the_harness_for_its_whole_run_and_goes_with_the_wrapper(tmp_path: Path) -> None:
    """Three processes besides the harness: the wrapper, its sidecar and a keeper, a shell in a group
    of its own (not the terminal's job), the same one across a sidecar's replacement; one killed by
    someone else is replaced; none is left once the wrapper is done."""
    pids = tmp_path / "pids"
    wrapper = subprocess.Popen(wrap_argv(tmp_path / "c", "a", "pi", sys.executable, "-c", STUBBORN, str(pids)),
                               env=env(), stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        [harness] = _pids(pids, 1)
        first = int(wait_for(lambda: _starts(tmp_path / "c", "a"), what="the sidecar")[0]["pid"])  # type: ignore[call-overload]
        keeper = wait_for(lambda: _keeper(wrapper.pid), what="the keeper")
        assert children(wrapper.pid) == {harness, first, keeper}
        assert os.getpgid(keeper) == keeper != os.getpgid(harness)
        os.kill(first, signal.SIGKILL)
        second = int(wait_for(lambda: _starts(tmp_path / "c", "a")[1:], what="a replacement")[0]["pid"])  # type: ignore[call-overload]
        wait_for(lambda: children(wrapper.pid) == {harness, second, keeper}, what="the same keeper beside it")
        os.kill(keeper, signal.SIGKILL)
        other = wait_for(lambda: _keeper(wrapper.pid) if pid_gone(keeper) else None, what="another keeper")
        assert other != keeper and children(wrapper.pid) == {harness, second, other}
    finally:
        wrapper.send_signal(signal.SIGTERM)
        wrapper.wait(timeout=HARNESS_KILL_DEADLINE_S + 10)
    wait_for(lambda: pid_gone(other), what="the keeper gone with its wrapper")


@pytest.mark.parametrize("behind_sh", [True, False])
def test_a_wrapper_and_its_sidecar_killed_together_take_the_harness_along(tmp_path: Path, behind_sh: bool) -> None:
    """Both of hctx's working processes SIGKILLed at once (an OOM kill of both, a `kill -9` of
    each): neither can act, the harness ignores its death signal's SIGTERM, and its child is told
    nothing by the kernel; the keeper ends the group."""
    pids = tmp_path / "pids"
    command = _stubborn_behind_sh(pids) if behind_sh else [sys.executable, "-c", STUBBORN, str(pids)]
    wrapper = subprocess.Popen(wrap_argv(tmp_path / "c", "a", "pi", *command), env=env(), stdin=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    harness = _pids(pids, 2 if behind_sh else 1)
    sidecar = int(wait_for(lambda: _starts(tmp_path / "c", "a"), what="the sidecar")[0]["pid"])  # type: ignore[call-overload]
    wait_for(lambda: _keeper(wrapper.pid), what="the keeper")
    wrapper.kill()
    os.kill(sidecar, signal.SIGKILL)
    wrapper.wait()
    assert _no_orphans(harness, time.monotonic()) < HARNESS_KILL_DEADLINE_S + SLACK_S


def test_a_sigtermed_wrapper_stops_a_stubborn_harness_behind_sh_after_the_deadline(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    wrapper = subprocess.Popen(wrap_argv(tmp_path / "c", "a", "pi", *_stubborn_behind_sh(pids)), env=env(),
                               stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    harness = _pids(pids, 2)
    started = time.monotonic()
    wrapper.send_signal(signal.SIGTERM)
    status = wrapper.wait(timeout=HARNESS_KILL_DEADLINE_S + 30)
    assert status in {128 + signal.SIGTERM, 128 + signal.SIGKILL}
    assert all(pid_gone(pid) for pid in harness)
    assert time.monotonic() - started < HARNESS_KILL_DEADLINE_S + SLACK_S


def test_a_harness_that_exits_leaves_no_background_child_behind(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    command = ["sh", "-c", f'{sys.executable} -c "{STUBBORN}" {pids} & exit 4']
    result = run(wrap_argv(tmp_path / "c", "a", "pi", *command), stdin=subprocess.DEVNULL, start_new_session=True)
    assert result.returncode == 4
    _no_orphans(_pids(pids, 1), time.monotonic())


@pytest.mark.parametrize("with_sidecar", [False, True])
def test_a_sigkilled_wrapper_in_a_terminal_takes_its_harness_group_along(tmp_path: Path, with_sidecar: bool) -> None:
    """In the terminal's foreground the harness shares the wrapper's group, the shell's job (Ctrl-C
    stays the terminal's); that group still goes when the wrapper is SIGKILLed, its sidecar with it
    or not."""
    pids, wrapper_pid = tmp_path / "pids", tmp_path / "wrapper.pid"
    pid, terminal = pty.fork()
    if pid == 0:  # a job-control shell on the pty: the wrapper a job in the foreground
        job = os.fork()
        if job == 0:
            os.setpgid(0, 0)
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            os.tcsetpgrp(0, os.getpgrp())
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)
            Path(wrapper_pid).write_text(str(os.getpid()))
            argv = wrap_argv(tmp_path / "c", "tty", "pi", *_stubborn_behind_sh(pids))
            os.execve(argv[0], argv, env())
        os.waitpid(job, 0)
        time.sleep(30)  # the shell outlives its job, as a shell does
        os._exit(0)
    try:
        harness = _pids(pids, 2)
        sidecar = int(wait_for(lambda: _starts(tmp_path / "c", "tty"), what="the sidecar")[0]["pid"])  # type: ignore[call-overload]
        wait_for(lambda: _keeper(int(wrapper_pid.read_text())), what="the keeper")
        os.kill(int(wrapper_pid.read_text()), signal.SIGKILL)
        if with_sidecar:
            os.kill(sidecar, signal.SIGKILL)
        _no_orphans(harness, time.monotonic())
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(terminal)


# ---------------------------------------------------------------------------------------------
# Issue 26, point 3: --takeover signals only a process proven to be the agent's wrapper


@pytest.mark.parametrize("identity", ["none", "computed"])
def test_takeover_never_signals_a_process_a_planted_claim_names(tmp_path: Path, identity: str) -> None:
    """A planted harness-state whose wrapperPid is an unrelated `sleep` (with no wrapperIdentity, or
    with the one anyone can compute from /proc): it is not signalled, and the agent is taken."""
    from guard.state import process_identity

    catalog = tmp_path / "c"
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        first, _ = _live_wrapper(catalog, "a")
        first.kill()
        first.wait()
        state = read_json(agent_dir(catalog, "a") / "harness-state")
        state |= {"wrapperPid": bystander.pid, "desiredState": "running",
                  "wrapperIdentity": process_identity(bystander.pid) if identity == "computed" else None}  # fmt: skip
        (agent_dir(catalog, "a") / "harness-state").write_text(json.dumps(state))
        taken = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')", extra=("--takeover",)))
        assert taken.returncode == 0 and "RAN" in taken.stdout, taken.stderr
        time.sleep(0.2)
        assert bystander.poll() is None  # never signalled
        assert "stopping it" not in taken.stderr
    finally:
        bystander.kill()
        bystander.wait()


def test_takeover_refuses_when_the_lock_holder_is_not_the_claims_pid(tmp_path: Path) -> None:
    """A live wrapper holds the agent, but the claim on disk was rewritten to name a `sleep`: the
    sleep is not signalled, the takeover is refused with the evidence, the wrapper runs on."""
    catalog = tmp_path / "c"
    first, _ = _live_wrapper(catalog, "a")
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        path = agent_dir(catalog, "a") / "harness-state"
        path.write_text(json.dumps(read_json(path) | {"wrapperPid": bystander.pid}))
        taken = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')", extra=("--takeover",)))
        assert taken.returncode == 2 and "RAN" not in taken.stdout
        assert f"pid {bystander.pid} (sleep) does not hold" in taken.stderr
        assert f"held by pid {first.pid}" in taken.stderr and "nothing was signalled" in taken.stderr
        assert bystander.poll() is None and first.poll() is None
    finally:
        for process in (bystander, first):
            process.kill()
            process.wait()


# Exits at once the first time (its marker absent), sleeps the second: one relaunch to look at.
ONCE_THEN_SLEEP = "import os, sys, time\nif os.path.exists(sys.argv[1]): time.sleep(60)\nopen(sys.argv[1], 'w').close()"


def test_the_resident_holds_the_wrapper_lock_across_its_exec_and_a_relaunch(tmp_path: Path) -> None:
    """Issue 24 beside 26.3: the wrapper lock taken before the first claim is the resident's after
    the exec (the same pid), still its own after a relaunch's claim (which a step makes under it,
    taking no lock of its own), held by none of its children; --takeover proves it and stops it."""
    from guard.layout import AgentDir
    from guard.state import wrapper_lock_evidence
    from tests.wrapping import HOST

    catalog, marker = tmp_path / "c", tmp_path / "ran-once"
    agent = AgentDir(catalog, HOST, "a")
    first = subprocess.Popen(wrap_argv(catalog, "a", "pi", sys.executable, "-c", ONCE_THEN_SLEEP, str(marker),
                                       extra=("--restart", "always", "--restart-delay", "0")),
                             env=env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(lambda: len(_starts(catalog, "a")) >= 2 and len(children(first.pid)) >= 2, timeout=30,
                 what="the relaunched incarnation's sidecar")  # fmt: skip
        state = read_json(agent_dir(catalog, "a") / "harness-state")
        assert state["wrapperPid"] == first.pid and len(state["history"]) == 1  # relaunched under the same pid
        assert "wrapper.launch.resident" in Path(f"/proc/{first.pid}/cmdline").read_text()  # past its exec
        assert wrapper_lock_evidence(agent, first.pid) is None
        for child in children(first.pid):  # the harness and the sidecar
            evidence = wrapper_lock_evidence(agent, child)
            assert evidence is not None and f"held by pid {first.pid} (" in evidence  # the real holder, named

        refused = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')"))
        assert refused.returncode == 2 and f"already wrapped by pid {first.pid}" in refused.stderr
        taken = run(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "print('RAN')", extra=("--takeover",)))
        assert taken.returncode == 0 and "RAN" in taken.stdout, taken.stderr
        assert f"taking {HOST}/a over from wrapper pid {first.pid}: stopping it" in taken.stderr
        assert first.wait(timeout=15) == 128 + signal.SIGTERM
    finally:
        first.kill()
        first.wait()


def test_a_relaunch_whose_claim_another_took_is_not_made(tmp_path: Path) -> None:
    """A relaunch claims only while the claim still names the incarnation that ran (the begin step's
    `relaunch_of`): one rewritten meanwhile to another wrapper's is left to it, lock or no lock."""
    catalog = tmp_path / "c"
    first = subprocess.Popen(wrap_argv(catalog, "a", "pi", sys.executable, "-c", "pass",
                                       extra=("--restart", "always", "--restart-delay", "5")),
                             env=env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        wait_for(lambda: [e for e in log_events(catalog, "a") if e["event"] == "exit"], timeout=30,
                 what="the first incarnation's sidecar to exit")  # fmt: skip
        path = agent_dir(catalog, "a") / "harness-state"
        state = read_json(path)
        path.write_text(json.dumps(state | {"incarnation": "f" * 32, "wrapperPid": bystander.pid}))
        _, err = first.communicate(timeout=30)
        assert first.returncode == 0, err
        assert f"was taken over by wrapper pid {bystander.pid}; not relaunching" in err.decode()
        assert len(_starts(catalog, "a")) == 1 and bystander.poll() is None
        assert read_json(path)["incarnation"] == "f" * 32  # left as it was
    finally:
        for process in (bystander, first):
            process.kill()
            process.wait()
