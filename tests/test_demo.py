"""`hctx demo`: the whole product on recorded real sessions, through the real wrapper and sidecar."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.record import parse_record
from tests.wrapping import env, pid_gone, run, wait_for
from wrapper.demo import DEMO_HOST, FLEET


def _sidecar_pids(catalog: Path) -> list[int]:
    pids = []
    for log in (catalog / ".st2" / "logs").glob("*.jsonl"):
        pids += [json.loads(line)["pid"] for line in log.read_text().splitlines() if '"event": "start"' in line]
    return pids


def _writes(catalog: Path, identity: str) -> list[dict[str, object]]:
    log = catalog / ".st2" / "logs" / f"{DEMO_HOST}.{identity}.jsonl"
    return [e for line in log.read_text().splitlines() if (e := json.loads(line))["event"] == "write"]


def test_the_demo_plays_every_session_to_its_end_within_30_seconds(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    started = time.monotonic()
    result = run([sys.executable, "-m", "wrapper.cli", "demo", "--catalog", str(catalog), "--no-top"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    assert f"hctx agents --catalog {catalog}" in result.stdout
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


@pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"), reason="tmux is not installed")
def test_the_live_demo_shows_top_and_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    catalog, done = tmp_path / "catalog", tmp_path / "done"
    session = f"hctx-demo-{os.getpid()}"
    repo = Path(__file__).resolve().parent.parent
    # COLUMNS/LINES from the test's environment would override the pane's real size.
    demo = f"{sys.executable} -m wrapper.cli demo --catalog {catalog} --duration 5"
    command = f"cd {repo} && env -u COLUMNS -u LINES {demo}; echo $? > {done}"
    # A private tmux server: one already running would impose its own default size.
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "140", "-y", "20", command], check=True)

    def pane() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    try:
        screen = wait_for(lambda: (text := pane()).count(DEMO_HOST) >= len(FLEET) and text, timeout=30, what="top")
        for agent in FLEET:
            assert agent.identity in screen
        screen = wait_for(lambda: _past_80(pane()), timeout=30, what="an agent past 80% on screen")
        _check_readme_screenshot(screen)
        subprocess.run([*tmux, "send-keys", "-t", session, "C-c"], check=True)
        wait_for(done.exists, timeout=30, what="demo exit")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    pids = _sidecar_pids(catalog)
    assert len(pids) == len(FLEET)
    wait_for(lambda: all(pid_gone(pid) for pid in pids), timeout=5, what="sidecars gone")
    leftovers = subprocess.run(["pgrep", "-f", f"--catalog {catalog}"], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""
    assert _processes_working_in(catalog) == []  # the stand-in harnesses run inside the catalog


def _past_80(screen: str) -> str | None:
    rows = [line for line in screen.splitlines() if line.startswith(f"{DEMO_HOST}/")]
    fills = [int(match) for row in rows for match in re.findall(r" (\d+)% ", row)]
    return screen if any(fill >= 80 for fill in fills) else None


def _check_readme_screenshot(screen: str) -> None:
    """The README's `hctx top` screenshot is this view: the same column header, the same fleet.

    HCTX_SCREENSHOT_OUT=FILE saves the capture, to refresh the README from a test run.
    """
    if target := os.environ.get("HCTX_SCREENSHOT_OUT"):
        Path(target).write_text(screen)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    shot = readme.split("```\n", 2)[1]
    header = next(line for line in screen.splitlines() if line.startswith("AGENT"))
    assert header.split() == next(line for line in shot.splitlines() if line.startswith("AGENT")).split()
    for agent in FLEET:
        assert f"{DEMO_HOST}/{agent.identity}" in shot


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
