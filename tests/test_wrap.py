"""`hctx wrap` and the sidecar as real processes: claim, record, relaunch, death, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.layout import log_path
from guard.record import parse_record
from tests.wrapping import (
    HOST,
    STANDIN,
    agent_dir,
    children,
    context_frame,
    env,
    log_events,
    pid_gone,
    read_json,
    run,
    wait_for,
    wrap_argv,
)


def test_a_frame_from_the_harness_becomes_the_record_of_its_incarnation(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    result = run(wrap_argv(catalog, "agent-1", "pi", sys.executable, "-c", STANDIN, context_frame(2500, 10000, 25.0)))
    assert result.returncode == 0, result.stderr
    record = parse_record((agent_dir(catalog, "agent-1") / "harness-context").read_bytes())
    state = read_json(agent_dir(catalog, "agent-1") / "harness-state")
    assert (record.used_tokens, record.window_tokens, record.used_percent) == (2500, 10000, 25.0)
    assert record.incarnation == state["incarnation"]
    assert state["schema"] == "st2.harness-state.v1"
    assert state["desiredState"] == "stopped"  # the wrapper exited normally
    events = [event["event"] for event in log_events(catalog, "agent-1")]
    assert events[0] == "start" and "write" in events and events[-1] == "exit"
    write = next(e for e in log_events(catalog, "agent-1") if e["event"] == "write")
    assert write["reason"] == "bucket"


def test_the_harness_sees_its_channel_and_identity_and_the_exit_status_is_its_own(tmp_path: Path) -> None:
    script = (
        "import os, sys; print(os.environ['HCTX_AGENT'], os.environ['HCTX_INCARNATION'], "
        "os.environ['HCTX_CATALOG'], os.path.exists(os.environ['HCTX_CHANNEL'])); sys.exit(7)"
    )
    result = run(wrap_argv(tmp_path / "c", "agent-2", "pi", sys.executable, "-c", script))
    agent, incarnation, catalog, listening = result.stdout.split()
    assert result.returncode == 7
    assert (agent, catalog, listening) == ("agent-2", str(tmp_path / "c"), "True")
    assert read_json(agent_dir(tmp_path / "c", "agent-2") / "harness-state")["incarnation"] == incarnation


def test_a_harness_killed_by_a_signal_exits_the_wrapper_with_128_plus_the_signal(tmp_path: Path) -> None:
    result = run(wrap_argv(tmp_path, "a", "pi", sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"))
    assert result.returncode == 128 + signal.SIGTERM


def _left_behind(catalog: Path) -> list[Path]:
    """What a launch left in its catalog: agent directories, sidecar logs."""
    return sorted([*catalog.glob("agents/*/*"), *catalog.glob(".st2/logs/*")])


def test_a_missing_command_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    result = run(wrap_argv(tmp_path, "a", "pi", "/nonexistent/harness"))
    assert result.returncode == 127
    assert "hctx wrap: cannot start '/nonexistent/harness': No such file or directory" in result.stderr
    assert "nothing claimed, no sidecar started" in result.stderr
    assert "Traceback" not in result.stderr
    assert _left_behind(tmp_path) == []  # no ghost agent, no sidecar (issue 27)


@pytest.mark.parametrize(
    ("program", "status", "why"),
    [
        ("no-such-harness-anywhere", 127, "no 'no-such-harness-anywhere' on PATH"),
        ("script-env", 127, "its interpreter 'no-such-node' (#!/usr/bin/env no-such-node) is not on PATH"),
        ("script-abs", 127, "its interpreter /nonexistent/node (#!/nonexistent/node) is not there"),
        ("not-executable", 126, "Permission denied"),
        ("a-directory", 126, "it is not a file"),
    ],
)
def test_a_program_that_cannot_start_is_refused_before_the_claim(
    tmp_path: Path, program: str, status: int, why: str
) -> None:
    """An npm-installed harness is a `#!/usr/bin/env node` script: without node on PATH it would
    exec, fail, and leave a claimed agent that never ran. Nothing is claimed for any of these."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text, mode in [("script-env", "#!/usr/bin/env no-such-node\n", 0o755),
                             ("script-abs", "#!/nonexistent/node\n", 0o755),
                             ("not-executable", "#!/bin/sh\n", 0o644)]:  # fmt: skip
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(mode)
    (bin_dir / "a-directory").mkdir()
    command = program if program.startswith("no-such") else str(bin_dir / program)
    catalog = tmp_path / "catalog"
    result = run(wrap_argv(catalog, "a", "pi", command))
    assert result.returncode == status, result.stderr
    assert f"hctx wrap: cannot start {command!r}: {why}; nothing claimed" in result.stderr
    assert _left_behind(catalog) == []


def test_a_script_whose_interpreter_is_on_path_runs(tmp_path: Path) -> None:
    script = tmp_path / "harness"
    script.write_text(f"#!/usr/bin/env {Path(sys.executable).name}\nimport sys; sys.exit(5)\n")
    script.chmod(0o755)
    result = run(wrap_argv(tmp_path / "catalog", "a", "pi", str(script)))
    assert result.returncode == 5, result.stderr  # ran: the harness's own status
    assert (agent_dir(tmp_path / "catalog", "a") / "harness-state").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "../evil", "--harness", "pi", "--", "true"], "identity '../evil' is not a valid name"),
        (["--agent", "a", "--harness", "pi"], "no harness command given"),
        (["--agent", "a", "--harness", "pi", "--host", "a/b", "--", "true"], "host 'a/b' is not a valid"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(tmp_path: Path, args: list[str], message: str) -> None:
    result = run([sys.executable, "-m", "wrapper.cli", "wrap", "--catalog", str(tmp_path), *args])
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "agents").exists()


@pytest.mark.parametrize("value", ["0", "301", "-1", "2.5", "20s", "soon"])
def test_a_bad_hctx_heartbeat_s_is_refused_before_the_claim(tmp_path: Path, value: str) -> None:
    argv = wrap_argv(tmp_path, "a", "pi", sys.executable, "-c", STANDIN)
    result = subprocess.run(argv, env=env() | {"HCTX_HEARTBEAT_S": value}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "hctx wrap: HCTX_HEARTBEAT_S: the heartbeat " in result.stderr, result.stderr
    assert "whole seconds from 1 to 300" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "agents").exists()  # nothing claimed, no sidecar started


# A stand-in idle harness: the same pi reading (argv[1]) redrawn every 0.4 s, as an idle seat's
# status line is redrawn, each a fresh reading in the same bucket, which only the heartbeat writes;
# until the sidecar's log (argv[2]) holds two heartbeat writes, 30 s at most (a liveness bound: a
# fixed count of redraws would leave a sidecar slow to start on a loaded machine no time to beat).
REDRAWS = r"""
import json, os, socket, sys, time

def heartbeats():
    count = 0
    try:
        with open(sys.argv[2]) as log:
            for line in log:
                try:
                    event = json.loads(line)
                except ValueError:  # a line still being written
                    continue
                count += event.get("event") == "write" and event.get("reason") == "heartbeat"
    except FileNotFoundError:
        pass
    return count

deadline = time.monotonic() + 30
while heartbeats() < 2 and time.monotonic() < deadline:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["HCTX_CHANNEL"])
    s.sendall(sys.argv[1].encode() + b"\n")
    s.close()
    time.sleep(0.4)
"""


async def test_hctx_heartbeat_s_sets_the_sidecar_s_heartbeat_and_its_recording_replays_it(tmp_path: Path) -> None:
    """HCTX_HEARTBEAT_S=1 reaches the sidecar (the wrapper's launch -> its `--heartbeat-s`): an idle
    harness redrawing one reading is written each second, not each 5 minutes; the recording's
    header holds it, and `hctx replay` of the recording makes the very writes the sidecar logged."""
    import trio

    from tests.wrapping import assert_replays_as_logged

    catalog, recording = tmp_path / "catalog", tmp_path / "idle.rec"
    argv = wrap_argv(catalog, "idle", "pi", sys.executable, "-c", REDRAWS, context_frame(2500, 10000, 25.0),
                     str(log_path(catalog, HOST, "idle")), extra=("--record", str(recording)))  # fmt: skip
    result = await trio.run_process(argv, env=env() | {"HCTX_HEARTBEAT_S": "1"}, capture_stderr=True, check=False)
    assert result.returncode == 0, result.stderr
    reasons = [event["reason"] for event in log_events(catalog, "idle") if event.get("event") == "write"]
    assert reasons[0] == "bucket" and reasons.count("heartbeat") >= 2, reasons
    header = json.loads(recording.read_text().splitlines()[0])
    assert header["config"]["heartbeat_ms"] == 1000
    await assert_replays_as_logged(catalog, "idle", recording)


CRASHER = r"""
import json, os, socket, sys, time
catalog, agent = os.environ["HCTX_CATALOG"], os.environ["HCTX_AGENT"]
record = os.path.join(catalog, "agents", "testhost", agent, "harness-context")
seen = {"incarnation": os.environ["HCTX_INCARNATION"], "record": os.path.exists(record)}
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(seen) + "\n")
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["HCTX_CHANNEL"])
s.sendall(sys.argv[2].encode() + b"\n")
s.close()
deadline = time.monotonic() + 5
while not os.path.exists(record) and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(1)
"""


def test_a_crash_loop_is_21_incarnations_each_starting_with_no_record_and_leaves_no_sidecar(
    tmp_path: Path,
) -> None:
    catalog, seen = tmp_path / "catalog", tmp_path / "seen.jsonl"
    argv = wrap_argv(
        catalog, "looper", "pi", sys.executable, "-c", CRASHER, str(seen), context_frame(10, 100, 10.0),
        extra=("--restart", "on-failure", "--max-restarts", "20", "--restart-delay", "0.01",
               "--restart-delay-max", "0.05"),
    )  # fmt: skip
    result = run(argv, timeout=120)
    assert result.returncode == 1
    runs = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(runs) == 21
    assert not any(r["record"] for r in runs), "a claim left the previous incarnation's record in place"
    state = read_json(agent_dir(catalog, "looper") / "harness-state")
    claimed = [state["incarnation"]] + [past["incarnation"] for past in state["history"]]
    assert len(set(claimed)) == 21
    assert claimed == [r["incarnation"] for r in reversed(runs)]
    starts = [e for e in log_events(catalog, "looper") if e["event"] == "start"]
    assert len(starts) == 21
    assert all(pid_gone(e["pid"]) for e in starts)
    record = parse_record((agent_dir(catalog, "looper") / "harness-context").read_bytes())
    assert record.incarnation == state["incarnation"]


def _start_wrapped_sleeper(tmp_path: Path, **popen: object) -> tuple[subprocess.Popen[bytes], int, int]:
    pidfile = tmp_path / "harness.pid"
    script = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    wrapper = subprocess.Popen(wrap_argv(tmp_path / "c", "sleeper", "pi", sys.executable, "-c", script),
                               env=env(), **popen)  # type: ignore[call-overload]  # fmt: skip
    # Generous: on a loaded machine a wrapper and its sidecar may take many seconds to start.
    harness_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=60, what="harness start"))
    start = wait_for(lambda: [e for e in log_events(tmp_path / "c", "sleeper") if e["event"] == "start"], timeout=60)
    return wrapper, harness_pid, int(start[0]["pid"])


def test_a_sigkilled_wrapper_takes_its_sidecar_and_leaves_no_orphan(tmp_path: Path) -> None:
    """The sidecar sees its lifeline close and exits; the keeper ends the harness's group (how soon
    the harness goes: `scripts/fault_suite.py`'s sigkill-wrapper-no-orphans row; here liveness bounds)."""
    wrapper, harness_pid, sidecar_pid = _start_wrapped_sleeper(tmp_path)
    wrapper.kill()
    wrapper.wait()
    wait_for(lambda: pid_gone(sidecar_pid), what="sidecar exit")
    wait_for(lambda: pid_gone(harness_pid), what="harness exit")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_to_the_wrapper_reach_the_harness_and_stop_relaunching(tmp_path: Path, signum: int) -> None:
    wrapper, harness_pid, sidecar_pid = _start_wrapped_sleeper(tmp_path, stdin=subprocess.DEVNULL)
    wrapper.send_signal(signum)
    assert wrapper.wait(timeout=60) == 128 + signum
    assert pid_gone(harness_pid) and pid_gone(sidecar_pid)


# A stand-in harness for Ctrl-C: each SIGINT is a line of the file argv[1]; once its handler is set
# it says READY (on stdout, and by creating the file argv[2]), waits for the first SIGINT (30 s at
# most: a liveness bound, so a Ctrl-C sent late on a loaded machine still finds it running), then
# 1 s more, in which a duplicate (the wrapper forwarding the terminal's) would be counted, and exits 3.
CTRL_C_HARNESS = r"""
import signal, sys, time
counter, ready = sys.argv[1:3]
interrupted = False
def on_int(*_):
    global interrupted
    interrupted = True
    with open(counter, "a") as out:
        out.write("INT\n")
signal.signal(signal.SIGINT, on_int)
open(ready, "w").close()
print("READY", flush=True)
deadline = time.monotonic() + 30
while not interrupted and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1)
sys.exit(3)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_ctrl_c_in_a_terminal_reaches_the_harness_exactly_once(tmp_path: Path) -> None:
    counter = tmp_path / "sigints"
    (tmp_path / "harness.py").write_text(CTRL_C_HARNESS)
    harness = (sys.executable, str(tmp_path / "harness.py"), str(counter), str(tmp_path / "ready"))
    command = " ".join(wrap_argv(tmp_path / "c", "tty", "pi", *harness))
    session = f"hctx-test-{os.getpid()}"
    done = tmp_path / "done"
    shell = f"PYTHONPATH={os.fspath(Path(__file__).parent.parent)} {command}; echo $? > {done}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "20", shell], check=True)
    try:
        wait_for(
            lambda: "READY" in subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                              capture_output=True, text=True).stdout,
            what="harness ready in tmux",
        )  # fmt: skip
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        wait_for(done.exists, what="wrapper exit")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert counter.read_text() == "INT\n"  # delivered by the terminal, not doubled by the wrapper
    assert done.read_text().strip() == "3"


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(shutil.which("tmux") is None or shutil.which("bash") is None, reason="tmux or bash missing")
def test_ctrl_z_in_a_terminal_stops_the_job_and_fg_resumes_it(tmp_path: Path) -> None:
    """In an interactive shell's job the harness shares the wrapper's group: Ctrl-Z stops both (the
    shell reports the job stopped), the sidecar in its own group runs on, `fg` resumes the harness
    where it was, and the exit status is still the harness's."""
    go, pid_file = tmp_path / "go", tmp_path / "harness-pid"
    script = (
        "import os, sys, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\nprint('READY', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nsys.exit(3)\n"
    )
    (tmp_path / "harness.py").write_text(script)
    command = " ".join(wrap_argv(tmp_path / "c", "tty", "pi", sys.executable, str(tmp_path / "harness.py")))
    session, done = f"hctx-test-z-{os.getpid()}", tmp_path / "done"

    def keys(*typed: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", session, *typed], check=True)

    def pane() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "20", "bash --norc --noprofile -i"],
                   check=True, env=env() | {"PS1": "$ "})  # fmt: skip
    try:
        keys(f"PYTHONPATH={os.fspath(Path(__file__).parent.parent)} {command}", "Enter")
        wait_for(lambda: "READY" in pane(), timeout=30, what="harness ready in tmux")
        harness = int(pid_file.read_text())
        wrapper = read_json(agent_dir(tmp_path / "c", "tty") / "harness-state")["wrapperPid"]
        sidecar = wait_for(lambda: [e["pid"] for e in log_events(tmp_path / "c", "tty") if e["event"] == "start"])[0]
        keys("C-z")
        wait_for(lambda: _process_state(harness) == "T" and _process_state(wrapper) == "T", what="the job stopped")
        wait_for(lambda: "Stopped" in pane(), what="the shell saying so")
        go.touch()
        time.sleep(0.5)
        assert _process_state(harness) == "T"  # stopped for real: it did not see `go`
        assert _process_state(sidecar) != "T"  # its own group: not the terminal's job
        keys("fg", "Enter")
        wait_for(lambda: pid_gone(harness) and pid_gone(wrapper), timeout=20, what="the resumed job to end")
        keys(f"echo $? > {done}", "Enter")
        wait_for(done.exists, what="the exit status")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert done.read_text().strip() == "3"


def test_a_signal_during_the_relaunch_back_off_stops_the_loop_at_once(tmp_path: Path) -> None:
    seen = tmp_path / "runs"
    script = f"import sys; open({str(seen)!r}, 'a').write('run\\n'); sys.exit(1)"
    argv = wrap_argv(tmp_path / "c", "looper", "pi", sys.executable, "-c", script,
                     extra=("--restart", "always", "--restart-delay", "30"))  # fmt: skip
    wrapper = subprocess.Popen(argv, env=env(), stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wait_for(lambda: seen.exists(), what="the first run")
    time.sleep(0.5)  # now inside the 30 s back-off
    wrapper.send_signal(signal.SIGTERM)
    started = time.monotonic()
    wrapper.wait(timeout=60)
    assert time.monotonic() - started < 25  # not the rest of the 30 s back-off (~1 s idle)
    assert seen.read_text() == "run\n"  # not relaunched


def test_ctrl_c_reaches_the_harness_once_even_when_stdin_is_not_the_terminal(tmp_path: Path) -> None:
    """A client piping into a wrapped app-server: the terminal still owns Ctrl-C."""
    import pty

    counter = tmp_path / "sigints"
    harness = tmp_path / "harness.py"
    harness.write_text(CTRL_C_HARNESS)
    argv = wrap_argv(tmp_path / "c", "tty2", "pi", sys.executable, str(harness), str(counter), str(tmp_path / "ready"))
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty, stdin from /dev/null
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.execve(argv[0], argv, env())
    try:
        wait_for((tmp_path / "ready").exists, what="harness ready")
        os.write(terminal, b"\x03")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(terminal)
    assert counter.read_text() == "INT\n"
    assert os.waitstatus_to_exitcode(status) == 3


TAPPED_APP_SERVER = r"""
import json, sys, time
for n in range(40):
    print(json.dumps({"jsonrpc": "2.0", "method": "thread/started", "params": {"n": n}}), flush=True)
    time.sleep(0.05)
"""


def test_a_dead_sidecar_never_stops_the_tapped_output(tmp_path: Path) -> None:
    codex = tmp_path / "codex"  # a stand-in app-server: the codex launch plan taps its stdout
    codex.write_text(f"#!{sys.executable}\n{TAPPED_APP_SERVER}")
    codex.chmod(0o755)
    argv = wrap_argv(tmp_path / "c", "tapped", "codex", str(codex), "app-server")
    wrapper = subprocess.Popen(argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    start = wait_for(lambda: [e for e in log_events(tmp_path / "c", "tapped") if e["event"] == "start"])
    time.sleep(0.3)
    os.kill(start[0]["pid"], signal.SIGKILL)
    out, err = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 0, err
    assert [json.loads(line)["params"]["n"] for line in out.splitlines()] == list(range(40))
    assert b"Traceback" not in err


def test_an_agent_costs_the_wrapper_its_sidecar_and_a_shell_and_the_resident_loads_neither_trio_nor_pydantic(
    tmp_path: Path,
) -> None:
    """Issue 24: the wrapper (the claim's pid, after its exec) and its sidecar; issue 40: beside them
    only the keeper, a `/bin/sh` (no Python until the wrapper is gone). The wrapper's resident part
    maps no pydantic-core and no ssl (which trio loads)."""
    wrapper, harness_pid, sidecar_pid = _start_wrapped_sleeper(tmp_path, stdin=subprocess.DEVNULL)
    try:
        state = read_json(agent_dir(tmp_path / "c", "sleeper") / "harness-state")
        assert state["wrapperPid"] == wrapper.pid
        wait_for(lambda: len(children(wrapper.pid)) == 3, what="the keeper")
        [keeper] = children(wrapper.pid) - {harness_pid, sidecar_pid}
        assert Path(f"/proc/{keeper}/exe").resolve() == Path("/bin/sh").resolve()
        maps = Path(f"/proc/{wrapper.pid}/maps").read_text()
        assert "_pydantic_core" not in maps and "_ssl" not in maps
        assert "_pydantic_core" in Path(f"/proc/{sidecar_pid}/maps").read_text()  # the check can see it
    finally:
        wrapper.send_signal(signal.SIGTERM)
        wrapper.wait(timeout=30)


def test_the_wrappers_children_import_hctx_from_where_the_wrapper_itself_was_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sidecars' and the keeper's interpreters are given the folder `wrapper`, `sidecar` and
    `guard` are in (it named `wrapper/` itself once: a checkout that is not installed could not
    have started a sidecar, and a keeper under `python -I -S` never finds `guard`)."""
    import wrapper
    from wrapper.launch.loop import checkout_env

    monkeypatch.delenv("PYTHONPATH", raising=False)
    root = Path(checkout_env()["PYTHONPATH"])
    assert root == Path(wrapper.__file__).parent.parent
    assert all((root / package / "__init__.py").is_file() for package in ("wrapper", "sidecar", "guard"))
