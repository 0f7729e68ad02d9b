"""`hctx top`: the frame (sorted by fill, bar, percent, tokens, window, compactions, age, cost), and
the live view run in tmux: it shows a changed record within a second and q / Ctrl-C restore the
terminal."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from readers_catalog import HOST, HOUR, NOW, REPO, agent_path, hctx, put_claim, put_record

from wrapper.roster import collect_roster, now_ms
from wrapper.top import BAR_CELLS, BAR_MIN_CELLS, COLUMNS, bar, render_frame


def frame(catalog: Path, *, width: int | None = None, height: int | None = None, colour: bool = False,
          interactive: bool = True) -> list[str]:  # fmt: skip
    roster = collect_roster(catalog, NOW, here=HOST, alive=lambda pid: False)
    return render_frame(roster, NOW, catalog=catalog, width=width, height=height, colour=colour,
                        interactive=interactive)  # fmt: skip


def fleet(catalog: Path) -> None:
    put_record(catalog, "low", usedPercent=12.0, usedTokens=24_000, windowTokens=200_000, compactions=0,
               compactAtTokens=180_000)  # fmt: skip
    put_record(catalog, "over", harness="pi", usedPercent=585.6, usedTokens=23_424, windowTokens=4_000,
               costUsd=0.0123, compactions=0)  # fmt: skip
    put_record(catalog, "mid", usedPercent=85.0, usedTokens=170_000, windowTokens=200_000, compactions=2,
               compactAtTokens=160_000)  # fmt: skip
    put_record(catalog, "claude", harness="claude", usedPercent=None, usedTokens=None, windowTokens=None,
               compactions=0, observedAtMs=NOW - 2 * HOUR, costUsd=1.5)  # fmt: skip
    agent_path(catalog, "empty")


def test_frame_is_sorted_by_fill_with_every_column(tmp_path: Path) -> None:
    fleet(tmp_path)
    lines = frame(tmp_path)
    assert lines[0].startswith(f"hctx top · 5 agents · {tmp_path} · ")
    assert lines[1] == "q quits"
    header = lines[3].split()
    assert header == ["AGENT", "HARNESS", "FILL", "PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳", "AGE", "COST"]
    rows = [line.split() for line in lines[4:]]
    assert [row[0] for row in rows] == ["box/over", "box/mid", "box/low", "box/claude", "box/empty"]
    assert rows[0] == ["box/over", "pi", "█" * BAR_CELLS, "586%", "23k", "4k", "-", "0", "4s", "$0.0123"]
    assert rows[1] == ["box/mid", "codex", "█" * 17 + "░" * 3, "85%", "170k", "200k", "→", "-10k", "2", "4s", "-"]
    assert rows[2] == ["box/low", "codex", "█" * 2 + "░" * 18, "12%", "24k", "200k", "→", "156k", "0", "4s", "-"]
    assert rows[3] == ["box/claude", "claude", "?", "?", "?", "-", "0", "2h00m", "stale", "$1.50"]
    assert rows[4] == ["box/empty", "-", "-"]


def test_bar_clamps_for_layout_only_and_is_blank_without_a_percent() -> None:
    def context(percent: float | None) -> dict[str, object]:
        return {"usedPercent": percent}

    assert bar(context(585.6)) == "█" * BAR_CELLS
    assert bar(context(-3.0)) == "░" * BAR_CELLS
    assert bar(context(50.0)) == "█" * 10 + "░" * 10
    assert bar(context(None)) == " " * BAR_CELLS
    assert bar(None) == " " * BAR_CELLS


def test_frame_tints_fill_amber_and_red_only_with_colour(tmp_path: Path) -> None:
    fleet(tmp_path)
    coloured = frame(tmp_path, colour=True)
    assert "\x1b[31m586%\x1b[0m" in coloured[4]
    assert "\x1b[33m85%\x1b[0m" in coloured[5]
    assert "\x1b" not in coloured[6]
    assert not any("\x1b" in line for line in frame(tmp_path, colour=False))


def test_frame_fits_the_terminal(tmp_path: Path) -> None:
    for index in range(30):
        put_record(tmp_path, f"agent{index:02d}", usedPercent=float(index))
    lines = frame(tmp_path, width=40, height=12)
    assert len(lines) == 12
    assert all(len(line) <= 40 for line in lines)
    assert lines[-1] == "… 23 more"
    coloured = frame(tmp_path, width=40, height=12, colour=True)
    assert len(coloured) == 12


def test_only_the_live_view_says_how_to_quit(tmp_path: Path) -> None:
    fleet(tmp_path)
    live, once = frame(tmp_path), frame(tmp_path, interactive=False)
    assert live[1:3] == ["q quits", ""] and live[3:] == once[2:]
    assert once[1] == "" and not any("q quits" in line for line in once)


def test_a_narrow_terminal_narrows_the_bar_then_hides_columns_and_says_which(tmp_path: Path) -> None:
    fleet(tmp_path)
    full = frame(tmp_path)
    assert max(map(len, full[3:])) == 98 and full[3].split() == list(COLUMNS)
    at_90 = frame(tmp_path, width=90)  # the bar gives up cells; every column stays, COST included
    assert at_90[1] == "q quits" and at_90[3].split() == list(COLUMNS)
    assert at_90[4].split() == ["box/over", "pi", "█" * 12, "586%", "23k", "4k", "-", "0", "4s", "$0.0123"]
    assert all(len(line) <= 90 for line in at_90)
    at_80 = frame(tmp_path, width=80, interactive=False)
    assert at_80[1] == "+1 column hidden, widen the terminal: HARNESS"
    assert at_80[3].split() == [name for name in COLUMNS if name != "HARNESS"]
    assert at_80[4].split() == ["box/over", "█" * BAR_MIN_CELLS, "586%", "23k", "4k", "-", "0", "4s", "$0.0123"]
    at_70 = frame(tmp_path, width=70, interactive=False)
    assert at_70[1] == "+2 columns hidden, widen the terminal: HARNESS, WINDOW"
    assert at_70[3].split() == [name for name in COLUMNS if name not in ("HARNESS", "WINDOW")]
    at_50 = frame(tmp_path, width=50, interactive=False)
    assert at_50[1] == "+4 columns hidden, widen the terminal: HARNESS, FI"  # cut to the width, never wrapped
    assert at_50[3].split() == ["AGENT", "PCT", "TOKENS", "⟳", "AGE", "COST"]
    assert all(len(line) <= 50 for line in at_50)


def test_frame_counts_warnings_and_shows_an_unreadable_catalog(tmp_path: Path) -> None:
    put_record(tmp_path, "junk", raw=b"{")
    assert frame(tmp_path)[-1] == "1 warning: `hctx agents` names them"
    lines = render_frame(None, NOW, catalog=tmp_path, width=None, height=None, colour=False, problem="boom")
    assert lines[-1] == "cannot read the catalog: boom"


def test_once_prints_one_frame(tmp_path: Path) -> None:
    fleet(tmp_path)
    done = hctx("top", "--once", "--catalog", str(tmp_path), env={"COLUMNS": ""})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "" and lines[2].split()[0] == "AGENT" and lines[3].split()[0] == "box/over"
    assert "q quits" not in done.stdout  # only the live view can be quit
    assert "\x1b" not in done.stdout  # not a terminal


def test_once_honours_columns_when_piped(tmp_path: Path) -> None:
    fleet(tmp_path)
    done = hctx("top", "--once", "--catalog", str(tmp_path), env={"COLUMNS": "30"})
    assert all(len(line) <= 30 for line in done.stdout.splitlines())
    assert done.stdout.splitlines()[1] == "+7 columns hidden, widen the t"


def test_live_view_needs_a_terminal(tmp_path: Path) -> None:
    done = hctx("top", "--catalog", str(tmp_path))
    assert done.returncode == 2 and "--once" in done.stderr


def test_once_on_an_unreadable_catalog(tmp_path: Path) -> None:
    (tmp_path / "agents").write_text("")
    done = hctx("top", "--once", "--catalog", str(tmp_path))
    assert done.returncode == 2 and "is not a real directory" in done.stderr  # as `hctx agents`


# --- live, in tmux ---------------------------------------------------------------------------------


class Tmux:
    def __init__(self) -> None:
        self.socket = f"hctx-test-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10,
                              check=True)  # fmt: skip
        return done.stdout

    def pane(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait_for(self, text: str, timeout: float = 10.0) -> float:
        """Seconds until `text` is on the pane."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if text in self.pane():
                return time.monotonic() - started
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not on the pane after {timeout}s:\n{self.pane()}")


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):  # like a missing harness: CI must not pass by skipping the live view
            pytest.fail("tmux is not installed; the live view is tested in it")
        pytest.skip("tmux is not installed")
    session = Tmux()
    yield session
    subprocess.run(["tmux", "-L", session.socket, "kill-server"], capture_output=True, timeout=10, check=False)


def start_top(tmux: Tmux, catalog: Path) -> None:
    """Run `hctx top` in a shell that reports, after it, its exit status and the terminal modes."""
    top = " ".join(shlex.quote(part) for part in
                   [sys.executable, "-m", "wrapper.cli", "top", "--catalog", str(catalog), "--host", HOST])  # fmt: skip
    # `trap : INT`, not `trap '' INT`: the shell survives Ctrl-C while the child still gets SIGINT.
    modes = "stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?\\(echo\\|icanon\\)'"
    script = f"trap : INT; echo BEFORE-TOP; {top}; echo EXITED $?; {modes}; sleep 60"
    tmux("new-session", "-d", "-s", "top", "-x", "132", "-y", "30", "-e", f"PYTHONPATH={REPO}",
         "-e", "NO_COLOR=", "sh", "-c", script)  # fmt: skip
    assert tmux("display", "-p", "-t", "top", "#{pane_width}x#{pane_height}").strip() == "132x30"


def test_a_terminal_that_hangs_up_ends_the_view_quietly(tmp_path: Path, tmux: Tmux) -> None:
    """Closing the terminal (here: its tmux server) is a quit like any other: exit 0, no traceback,
    the signal handlers given back (a wrapping `hctx demo` still has its fleet to stop)."""
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now_ms())
    err, done = tmp_path / "stderr", tmp_path / "done"
    argv = [sys.executable, "-m", "wrapper.cli", "top", "--catalog", str(tmp_path), "--host", HOST]
    top = " ".join(shlex.quote(part) for part in argv)
    # The shell ignores the hang-up to report after it; top sets its own handler, so it still gets it.
    script = f"trap '' HUP; {top} 2> {err}; echo $? > {done}"
    tmux("new-session", "-d", "-s", "top", "-x", "132", "-y", "30", "-e", f"PYTHONPATH={REPO}", "sh", "-c", script)
    tmux.wait_for("box/alpha")
    tmux("kill-server")
    deadline = time.monotonic() + 10
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.read_text().strip() == "0" and err.read_text() == ""


def rewrite_atomically(path: Path, **fields: object) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    staging = path.with_name(".staging")
    staging.write_text(json.dumps(record) + "\n")
    os.replace(staging, path)


def test_live_view_updates_within_a_second_and_q_restores_the_terminal(tmp_path: Path, tmux: Tmux) -> None:
    now = now_ms()
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now)
    put_record(tmp_path, "bravo", usedPercent=50.0, usedTokens=100_000, windowTokens=200_000, observedAtMs=now)
    put_claim(tmp_path, "alpha")
    start_top(tmux, tmp_path)
    tmux.wait_for("box/alpha")
    pane = tmux.pane().splitlines()
    assert "BEFORE-TOP" not in "\n".join(pane)  # on the alternate screen
    assert [line.split()[0] for line in pane[4:6]] == ["box/bravo", "box/alpha"]
    time.sleep(1.2)  # let it settle into its steady cadence before timing it

    rewrite_atomically(tmp_path / "agents" / HOST / "alpha" / "harness-context", usedPercent=97.0,
                       usedTokens=194_000, windowTokens=200_000, observedAtMs=now_ms())  # fmt: skip
    assert tmux.wait_for("97%") < 1.0
    pane = tmux.pane().splitlines()
    assert [line.split()[0] for line in pane[4:6]] == ["box/alpha", "box/bravo"]  # re-sorted by fill

    put_record(tmp_path, "charlie", usedPercent=1.0, observedAtMs=now_ms())
    assert tmux.wait_for("box/charlie") < 1.0  # a new agent too

    tmux("send-keys", "-t", "top", "q")
    tmux.wait_for("EXITED 0", timeout=5)
    tmux.wait_for("icanon", timeout=5)
    pane_text = tmux.pane()
    assert "BEFORE-TOP" in pane_text and "box/alpha" not in pane_text  # main screen back
    assert "\necho\n" in f"\n{pane_text}" and "\nicanon\n" in pane_text  # echo and line mode restored


def test_ctrl_c_quits_and_restores_the_terminal(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now_ms())
    start_top(tmux, tmp_path)
    tmux.wait_for("box/alpha")
    tmux("send-keys", "-t", "top", "C-c")
    tmux.wait_for("EXITED 0", timeout=5)
    tmux.wait_for("icanon", timeout=5)
    pane_text = tmux.pane()
    assert "BEFORE-TOP" in pane_text and "box/alpha" not in pane_text
    assert "\nicanon\n" in pane_text and "-echo" not in pane_text


def test_ages_tick_without_any_change(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now_ms() - 10_000)
    start_top(tmux, tmp_path)
    tmux.wait_for("box/alpha")
    tmux.wait_for(" 12s ", timeout=3)
    tmux.wait_for(" 13s ", timeout=2)
    tmux("send-keys", "-t", "top", "q")
    tmux.wait_for("EXITED 0", timeout=5)


def test_resize_redraws_to_the_new_width(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, costUsd=12.5, observedAtMs=now_ms())
    start_top(tmux, tmp_path)
    tmux.wait_for("$12.50")
    tmux("resize-window", "-t", "top", "-x", "50", "-y", "20")
    started = time.monotonic()
    while "$12.50" in tmux.pane() and time.monotonic() - started < 3:
        time.sleep(0.05)
    pane = tmux.pane().splitlines()
    assert "$12.50" not in "\n".join(pane) and "box/alpha" in "\n".join(pane)
    assert all(len(line) <= 50 for line in pane)


def test_sigterm_quits_and_restores_the_terminal(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now_ms())
    start_top(tmux, tmp_path)
    tmux.wait_for("box/alpha")
    shell_pid = int(tmux("display", "-p", "-t", "top", "#{pane_pid}"))
    children = subprocess.run(["pgrep", "-P", str(shell_pid)], capture_output=True, text=True, timeout=10,
                              check=True).stdout.split()  # fmt: skip
    (top_pid,) = [int(pid) for pid in children]
    os.kill(top_pid, signal.SIGTERM)
    tmux.wait_for("EXITED 0", timeout=5)
    tmux.wait_for("icanon", timeout=5)
    pane_text = tmux.pane()
    assert "BEFORE-TOP" in pane_text and "box/alpha" not in pane_text and "-echo" not in pane_text
