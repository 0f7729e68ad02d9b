"""`hctx demo`: the whole product on recorded real sessions, through the real wrapper and sidecar."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from guard.errors import FrameRejected
from guard.layout import log_path
from guard.record import parse_record
from sidecar.decoding import Dropped
from sidecar.demo_standin import DEMO_RECORDINGS, paced
from sidecar.registry import spec_for
from tests.wrapping import env, pid_gone, run, wait_for
from wrapper.demo import DEMO_HOST, DEMO_NO_TOP_S, DEMO_TOP_S, FLEET

HELP = "q quits · ↑↓ jk PgUp PgDn Home End · s sort: fill · / filter"

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _sidecar_pids(catalog: Path) -> list[int]:
    pids = []
    for log in (catalog / ".st2" / "logs").glob("*.jsonl"):
        pids += [json.loads(line)["pid"] for line in log.read_text().splitlines() if '"event": "start"' in line]
    return pids


def _writes(catalog: Path, identity: str) -> list[dict[str, object]]:
    log = log_path(catalog, DEMO_HOST, identity)
    return [e for line in log.read_text().splitlines() if (e := json.loads(line))["event"] == "write"]


# A progress line: the demo's clock, the agent, its harness, then what landed.
_PROGRESS = re.compile(r"^ *\d+\.\ds  demo/(?P<agent>\S+) +(?P<harness>\S+) +(?P<what>.*)$")


def _progress(stdout: str) -> list[tuple[str, str]]:
    return [(match["agent"], match["what"]) for line in stdout.splitlines() if (match := _PROGRESS.match(line))]


def test_the_demo_plays_every_session_to_its_end_telling_each_record_as_it_lands(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    result = run([sys.executable, "-m", "wrapper.cli", "demo", "--catalog", str(catalog), "--no-top"], timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # At once: what plays and for how long; then a line per agent launched and per record landed
    # (never silent for the whole play, issue 27); then the roster; then the hints.
    assert lines[0].startswith(f"hctx demo: {len(FLEET)} recorded sessions (")
    assert f"{DEMO_NO_TOP_S:g} s each" in lines[0]
    progress = _progress(result.stdout)
    assert {agent for agent, what in progress if what == "launched"} == {a.identity for a in FLEET}
    for agent in FLEET:
        fills = [what for name, what in progress if name == agent.identity and what != "launched"]
        assert len(fills) >= 3, (agent.identity, fills)  # several readings each, as they landed
    assert any(re.match(r"\d+%  \S+/\S+ +⟳1  compacted$", what) for _, what in progress)
    assert any(re.match(r"(8\d|9\d|1\d\d)% ", what) for _, what in progress)  # past 80% on the way
    roster = lines.index(next(line for line in lines if line.startswith("HOST  AGENT")))
    assert roster > max(lines.index(line) for line in lines if _PROGRESS.match(line))
    listed = [line.split()[1] for line in lines[roster + 1 : roster + 1 + len(FLEET)]]
    assert listed == sorted(a.identity for a in FLEET)
    hints = [f"catalog: {catalog}", f"  hctx agents --catalog {catalog}", f"  hctx doctor --catalog {catalog}"]
    assert lines[-3:] == hints
    assert len(FLEET) >= 3 and len({agent.harness for agent in FLEET}) >= 2
    for agent in FLEET:
        record = parse_record((catalog / "agents" / DEMO_HOST / agent.identity / "harness-context").read_bytes())
        assert record.harness == agent.harness
        assert record.compactions >= 1, agent.identity  # every session compacts at least once
    peaks = {agent.identity: max((w["usedPercent"] or 0) for w in _writes(catalog, agent.identity)) for agent in FLEET}
    assert max(peaks.values()) >= 80  # one agent climbs past the advisory threshold
    assert all(pid_gone(pid) for pid in _sidecar_pids(catalog))
    agents = run([sys.executable, "-m", "wrapper.cli", "agents", "--catalog", str(catalog), "--json"])
    assert [row["identity"] for row in json.loads(agents.stdout)] == sorted(a.identity for a in FLEET)
    doctor = run([sys.executable, "-m", "wrapper.cli", "doctor", "--catalog", str(catalog)])
    assert doctor.returncode == 0 and "at or above 80%" in doctor.stdout


def test_without_a_terminal_the_demo_plays_as_no_top_and_says_so(tmp_path: Path) -> None:
    """`hctx demo < /dev/null | cat`: no terminal for top, so it plays the way --no-top does (not
    an exit 2 pointing at a flag the demo does not have, leaving an empty catalog behind)."""
    home = tmp_path / "home"
    home.mkdir()
    argv = [sys.executable, "-m", "wrapper.cli", "demo", "--duration", "2"]
    result = subprocess.run(argv, env=env() | {"TMPDIR": str(home)}, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == "hctx demo: no terminal on stdin and stdout for `hctx top`; playing as --no-top\n"
    assert "--once" not in result.stderr
    (catalog,) = home.iterdir()  # its own temporary catalog, named at the end, holding the records
    assert result.stdout.splitlines()[-3] == f"catalog: {catalog}"
    assert {a for a, what in _progress(result.stdout) if what == "launched"} == {a.identity for a in FLEET}
    assert all((catalog / "agents" / DEMO_HOST / a.identity / "harness-context").is_file() for a in FLEET)


@pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"), reason="tmux is not installed")
def test_the_live_demo_shows_top_and_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    done = tmp_path / "done"
    session = f"hctx-demo-{os.getpid()}"
    repo = Path(__file__).resolve().parent.parent
    # As a user runs it: no --catalog, so top's header shows the demo's own temporary catalog.
    # COLUMNS/LINES from the test's environment would override the pane's real size.
    demo = f"{sys.executable} -m wrapper.cli demo --duration 15"  # the README picture, at a quarter of the pace
    command = f"cd {repo} && env -u COLUMNS -u LINES {demo}; echo $? > {done}"
    catalog: Path | None = None
    # A private tmux server: one already running would impose its own default size.
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "140", "-y", "20", command], check=True)

    def pane() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    try:
        screen = wait_for(lambda: len(_rows(text := pane())) >= len(FLEET) and text, timeout=30, what="top")
        for agent in FLEET:
            assert agent.identity in screen
        title = re.match(_DEMO_TITLE.format(tmp=re.escape(tempfile.gettempdir())), screen)
        assert title is not None, screen.splitlines()[0]
        catalog = Path(title["catalog"])
        screen = wait_for(lambda: _past_80(pane()), timeout=30, what="an agent past 80% on screen")
        _check_readme_screenshot(screen)
        subprocess.run([*tmux, "send-keys", "-t", session, "C-c"], check=True)
        wait_for(done.exists, timeout=30, what="demo exit")
        pids = _sidecar_pids(catalog)
        assert len(pids) == len(FLEET)
        wait_for(lambda: all(pid_gone(pid) for pid in pids), timeout=5, what="sidecars gone")
        assert _started_with(catalog) == []
        assert _processes_working_in(catalog) == []  # the stand-in harnesses run inside the catalog
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if (made := catalog) is not None:  # the demo leaves its catalog for the user; a test removes it
            with contextlib.suppress(AssertionError):  # a failed run: its processes first, or they recreate it
                wait_for(lambda: not _started_with(made), timeout=20, what="the demo's processes gone")
            shutil.rmtree(made, ignore_errors=True)


def _started_with(catalog: Path) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"--catalog {catalog}"], capture_output=True, text=True).stdout.split()


def _rows(screen: str) -> list[str]:
    return [line for line in screen.splitlines() if line.startswith(f"{DEMO_HOST}/")]


def _past_80(screen: str) -> str | None:
    fills = [int(match) for row in _rows(screen) for match in re.findall(r" (\d+)% ", row)]
    return screen if any(fill >= 80 for fill in fills) else None


# The header `hctx demo` shows: its own temporary catalog, never a path only a test run has.
_DEMO_TITLE = r"hctx top · 4 agents · (?P<catalog>{tmp}/hctx-demo-[A-Za-z0-9_]{{8}}) · \d\d:\d\d:\d\d\n"


def _check_readme_screenshot(screen: str) -> None:
    """The README's `hctx top` screenshot is this view: the same header line, column header and fleet.

    HCTX_SCREENSHOT_OUT=FILE saves the capture, to refresh the README from a test run.
    """
    if target := os.environ.get("HCTX_SCREENSHOT_OUT"):
        Path(target).write_text(screen)
    shot = README.split("```\n", 2)[1]
    assert re.match(_DEMO_TITLE.format(tmp="/tmp"), shot), shot.splitlines()[0]
    assert shot.splitlines()[1] == screen.splitlines()[1] == HELP  # the keys
    assert shot.splitlines()[2].startswith("hosts: demo 4 · ") and screen.splitlines()[2].startswith("hosts: demo 4 · ")
    header = next(line for line in screen.splitlines() if line.startswith("AGENT"))
    assert header.split() == next(line for line in shot.splitlines() if line.startswith("AGENT")).split()
    for agent in FLEET:
        assert f"{DEMO_HOST}/{agent.identity}" in shot


def _first_past_80_s(duration_s: float) -> float:
    """Seconds into a demo of `duration_s` until the first agent's fill reaches 80%: the moment the
    README's picture shows (the test captures it at the same point of a shorter run)."""
    moments = []
    for agent in FLEET:
        spec = spec_for(agent.harness)
        producer = spec.make_producer()
        decoders = {wire: spec.decoder(wire) for wire in spec.wires()}
        for offset, chunk in paced(agent.harness, DEMO_RECORDINGS / agent.recording, duration_s):
            readings = []
            for event in decoders[chunk.wire].receive_data(chunk.data):
                if isinstance(event, Dropped):
                    continue
                try:
                    readings += producer.feed(event, 0)
                except FrameRejected:
                    continue
            if any((reading.fields.used_percent or 0) >= 80 for reading in readings):
                moments.append(offset)
                break
    return min(moments)


def test_the_readme_says_when_its_picture_is_taken_and_how_long_the_demo_plays() -> None:
    moment = round(_first_past_80_s(DEMO_TOP_S))
    assert 0 < moment < DEMO_TOP_S
    text = " ".join(README.split())
    assert f"about {moment} s into `hctx demo`" in text
    assert f"each session plays for {DEMO_TOP_S:g} s" in text
    assert f"`--no-top` plays them in {DEMO_NO_TOP_S:g} s" in text


def _processes_working_in(directory: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(directory):
                found.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in found if not pid_gone(pid)]


def test_a_killed_demo_stops_every_process_it_started_at_once(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    argv = [sys.executable, "-m", "wrapper.cli", "demo", "--catalog", str(catalog), "--no-top", "--duration", "30"]
    demo = subprocess.Popen(argv, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: len(_sidecar_pids(catalog)) == len(FLEET), timeout=30, what="the fleet")
    demo.send_signal(signal.SIGTERM)  # mid-session: the stand-ins are still playing
    started = time.monotonic()
    demo.wait(timeout=20)
    assert time.monotonic() - started < 5  # not the 10 s kill deadline: everything stopped when asked
    wait_for(lambda: all(pid_gone(pid) for pid in _sidecar_pids(catalog)), timeout=5, what="sidecars gone")
    assert _processes_working_in(catalog) == []


def _break_one_agent(catalog: Path) -> str:
    """A file where pi-worker's agent directory belongs: that one wrapper is refused at its start."""
    (catalog / "agents" / DEMO_HOST).mkdir(parents=True)
    (catalog / "agents" / DEMO_HOST / "pi-worker").write_text("in the way\n")
    return f"{DEMO_HOST}/pi-worker"


def test_a_demo_whose_agent_fails_to_start_says_which_and_why_and_exits_non_zero(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    broken = _break_one_agent(catalog)
    argv = [sys.executable, "-m", "wrapper.cli", "demo", "--catalog", str(catalog), "--no-top", "--duration", "2"]
    result = run(argv, timeout=60)
    assert result.returncode == 1
    assert "1 of 4 agents failed" in result.stderr
    assert f"{broken}: its wrapper exited with 2" in result.stderr
    assert "is not a real directory" in result.stderr  # the wrapper's own reason, not a bare status
    assert "Traceback" not in result.stderr
    others = [a.identity for a in FLEET if f"{DEMO_HOST}/{a.identity}" != broken]
    assert all((catalog / "agents" / DEMO_HOST / name / "harness-context").is_file() for name in others)


@pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"), reason="tmux is not installed")
def test_a_demo_in_top_whose_agent_dies_closes_top_and_says_why(tmp_path: Path) -> None:
    catalog, done, err = tmp_path / "catalog", tmp_path / "done", tmp_path / "stderr"
    _break_one_agent(catalog)
    session = f"hctx-demo-fail-{os.getpid()}"
    repo = Path(__file__).resolve().parent.parent
    demo = f"{sys.executable} -m wrapper.cli demo --catalog {catalog} --duration 30"
    command = f"cd {repo} && {demo} 2> {err}; echo $? > {done}"
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "140", "-y", "20", command], check=True)
    try:
        wait_for(done.exists, timeout=30, what="the demo to end on its own")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert done.read_text().strip() == "1"
    assert "demo/pi-worker: its wrapper exited with 2" in err.read_text()
    wait_for(lambda: all(pid_gone(pid) for pid in _sidecar_pids(catalog)), timeout=10, what="sidecars gone")
    assert _processes_working_in(catalog) == []


def test_a_second_signal_while_the_demo_stops_does_not_cut_the_stop_short(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    argv = [sys.executable, "-m", "wrapper.cli", "demo", "--catalog", str(catalog), "--no-top", "--duration", "30"]
    demo = subprocess.Popen(argv, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(_sidecar_pids(catalog)) == len(FLEET), timeout=30, what="the fleet")
    demo.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    demo.send_signal(signal.SIGHUP)  # a closing terminal right after a kill
    _, stderr = demo.communicate(timeout=20)
    assert demo.returncode == 130
    assert "Traceback" not in stderr
    wait_for(lambda: all(pid_gone(pid) for pid in _sidecar_pids(catalog)), timeout=5, what="sidecars gone")
    assert _processes_working_in(catalog) == []
