"""`hctx top`: the frame (sorted by fill, bar, percent, tokens, window, compactions, age, cost), and
the live view run in tmux: it shows a changed record by its file event, its ages tick, and q / Ctrl-C
restore the terminal."""

from __future__ import annotations

import json
import os
import re
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
from hypothesis import given
from hypothesis import strategies as st
from readers_catalog import HOST, HOUR, NOW, REPO, agent_path, hctx, put_claim, put_record

from guard.record import Subagent
from tests.wrapping import wait_for
from wrapper.readers.roster import collect_roster, now_ms
from wrapper.readers.top import BAR_CELLS, BAR_MIN_CELLS, COLUMNS, View, bar, decode_keys, render_frame

HELP = "q quits · ↑↓ jk PgUp PgDn Home End · s sort: fill · / filter"
FLEET_SUMMARY = "hosts: box 5 · 2 at or above 80% · 1 at or above 95% · 1 stale"


def frame(catalog: Path, *, width: int | None = None, height: int | None = None, colour: bool = False,
          interactive: bool = True, view: View | None = None) -> list[str]:  # fmt: skip
    roster = collect_roster(catalog, NOW, here=HOST, alive=lambda pid: False)
    return render_frame(roster, NOW, catalog=catalog, width=width, height=height, colour=colour,
                        interactive=interactive, view=view)  # fmt: skip


def fleet(catalog: Path) -> None:
    """No rate limits anywhere (so no LIMITS column): `test_the_accounts_figure_*` adds them."""
    put_record(catalog, "low", usedPercent=12.0, usedTokens=24_000, windowTokens=200_000, compactions=0,
               compactAtTokens=180_000, rateLimits=None)  # fmt: skip
    put_record(catalog, "over", harness="pi", usedPercent=585.6, usedTokens=23_424, windowTokens=4_000,
               costUsd=0.0123, compactions=0, rateLimits=None)  # fmt: skip
    put_record(catalog, "mid", usedPercent=85.0, usedTokens=170_000, windowTokens=200_000, compactions=2,
               compactAtTokens=160_000, rateLimits=None)  # fmt: skip
    put_record(catalog, "claude", harness="claude", usedPercent=None, usedTokens=None, windowTokens=None,
               compactions=0, observedAtMs=NOW - 2 * HOUR, costUsd=1.5, rateLimits=None)  # fmt: skip
    agent_path(catalog, "empty")


def test_frame_is_sorted_by_fill_with_every_column(tmp_path: Path) -> None:
    fleet(tmp_path)
    lines = frame(tmp_path)
    assert lines[0].startswith(f"hctx top · 5 agents · {tmp_path} · ")
    assert lines[1] == HELP
    assert lines[2] == FLEET_SUMMARY
    header = lines[4].split()
    assert header == ["AGENT", "HARNESS", "FILL", "PCT", "TOKENS", "WINDOW", "HEADROOM", "⟳", "AGE", "COST"]
    rows = [line.split() for line in lines[5:]]
    assert [row[0] for row in rows] == ["box/over", "box/mid", "box/low", "box/claude", "box/empty"]
    assert rows[0] == ["box/over", "pi", "█" * BAR_CELLS, "586%", "23k", "4k", "-", "0", "4s", "$0.0123"]
    assert rows[1] == ["box/mid", "codex", "█" * 17 + "░" * 3, "85%", "170k", "200k", "→", "-10k", "2", "4s", "-"]
    assert rows[2] == ["box/low", "codex", "█" * 2 + "░" * 18, "12%", "24k", "200k", "→", "156k", "0", "4s", "-"]
    assert rows[3] == ["box/claude", "claude", "?", "?", "?", "-", "0", "2h00m", "stale", "$1.50"]
    assert rows[4] == ["box/empty", "-", "-"]


def test_bar_clamps_for_layout_only_and_is_blank_without_a_percent() -> None:
    def context(percent: float | None) -> Subagent:  # any reading: the bar reads its percent alone
        return Subagent(id="s", state="running", observed_at_ms=0, used_percent=percent)

    assert bar(context(585.6)) == "█" * BAR_CELLS
    assert bar(context(-3.0)) == "░" * BAR_CELLS
    assert bar(context(50.0)) == "█" * 10 + "░" * 10
    assert bar(context(None)) == " " * BAR_CELLS
    assert bar(None) == " " * BAR_CELLS


def test_frame_tints_fill_amber_and_red_only_with_colour(tmp_path: Path) -> None:
    fleet(tmp_path)
    coloured = frame(tmp_path, colour=True)
    assert "\x1b[31m586%\x1b[0m" in coloured[5]
    assert "\x1b[33m85%\x1b[0m" in coloured[6]
    assert "\x1b" not in coloured[7]
    assert not any("\x1b" in line for line in frame(tmp_path, colour=False))


def test_frame_fits_the_terminal(tmp_path: Path) -> None:
    for index in range(30):
        put_record(tmp_path, f"agent{index:02d}", usedPercent=float(index))
    lines = frame(tmp_path, width=40, height=12)
    assert len(lines) == 12
    assert all(len(line) <= 40 for line in lines)
    assert lines[-1] == "rows 1–6 of 30"  # the live view scrolls to the rest
    assert frame(tmp_path, width=40, height=12, interactive=False)[-1] == "… 24 more"
    coloured = frame(tmp_path, width=40, height=12, colour=True)
    assert len(coloured) == 12


def test_only_the_live_view_says_how_to_quit(tmp_path: Path) -> None:
    fleet(tmp_path)
    live, once = frame(tmp_path), frame(tmp_path, interactive=False)
    assert live[1] == HELP and live[2:] == once[1:]
    assert once[1] == FLEET_SUMMARY and not any("q quits" in line for line in once)


def test_a_narrow_terminal_narrows_the_bar_then_hides_columns_and_says_which(tmp_path: Path) -> None:
    fleet(tmp_path)
    full = frame(tmp_path)
    # No agent has an account figure or a prompt cache: no LIMITS or CACHE column, and no note of one.
    shown = [name for name in COLUMNS if name not in ("LIMITS", "CACHE")]
    assert max(map(len, full[4:])) == 98 and full[4].split() == shown
    at_90 = frame(tmp_path, width=90)  # the bar gives up cells; every column stays, COST included
    assert at_90[1] == HELP and at_90[4].split() == shown
    assert at_90[5].split() == ["box/over", "pi", "█" * 12, "586%", "23k", "4k", "-", "0", "4s", "$0.0123"]
    assert all(len(line) <= 90 for line in at_90)
    at_80 = frame(tmp_path, width=80, interactive=False)
    assert at_80[1] == "+1 column hidden, widen the terminal: HARNESS"
    assert at_80[4].split() == [name for name in shown if name != "HARNESS"]
    assert at_80[5].split() == ["box/over", "█" * BAR_MIN_CELLS, "586%", "23k", "4k", "-", "0", "4s", "$0.0123"]
    at_70 = frame(tmp_path, width=70, interactive=False)
    assert at_70[1] == "+2 columns hidden, widen the terminal: HARNESS, WINDOW"
    assert at_70[4].split() == [name for name in shown if name not in ("HARNESS", "WINDOW")]
    at_50 = frame(tmp_path, width=50, interactive=False)
    assert at_50[1] == "+4 columns hidden, widen the terminal: HARNESS, FI"  # cut to the width, never wrapped
    assert at_50[4].split() == ["AGENT", "PCT", "TOKENS", "⟳", "AGE", "COST"]
    assert all(len(line) <= 50 for line in at_50)


def test_the_accounts_figure_is_beside_each_agent_and_hidden_first(tmp_path: Path) -> None:
    fleet(tmp_path)
    key = "0" * 32
    for identity, percent, age in (("one", 81.0, 3 * 60_000), ("two", 96.0, 60_000)):
        put_record(tmp_path, identity, rateLimits={"fiveHour": percent, "sevenDay": 40.0},
                   account={"key": key, "label": "claude · max"}, observedAtMs=NOW - age)  # fmt: skip
    lines = frame(tmp_path)
    assert lines[4].split() == [name for name in COLUMNS if name != "CACHE"]  # no agent states a cache
    by_agent = {line.split()[0]: line for line in lines[5:]}
    assert by_agent["box/one"].endswith("5h 96%* 7d 40%*")  # two's newer snapshot is the account's figure
    assert by_agent["box/two"].endswith("5h 96% 7d 40%")
    assert by_agent["box/low"].endswith("-")
    coloured = frame(tmp_path, colour=True)
    assert "\x1b[31m5h 96%* 7d 40%*\x1b[0m" in "\n".join(coloured)  # red from 95, as the meter
    narrow = frame(tmp_path, width=100, interactive=False)
    assert narrow[1] == "+1 column hidden, widen the terminal: LIMITS"


def test_the_prompt_cache_is_agents_cache_cell_and_only_where_a_harness_states_one(tmp_path: Path) -> None:
    """Issue 37: CACHE says what `agents` says (`wrapper.readers.render.cache_text`), hidden right after
    LIMITS on a narrow terminal, and no column of a fleet where no harness states a cache."""
    fleet(tmp_path)
    assert "CACHE" not in frame(tmp_path)[4]
    put_record(tmp_path, "warm", harness="claude", rateLimits=None,
               promptCache={"warm": True, "ttl": "5m", "expiresAtMs": NOW + 192_000})  # fmt: skip
    put_record(tmp_path, "cold", harness="claude", rateLimits=None,
               promptCache={"warm": False, "expiresAtMs": None, "recacheTokensIfCold": 754_995})  # fmt: skip
    lines = frame(tmp_path)
    assert lines[4].split()[-1] == "CACHE"
    by_agent = {line.split()[0]: line for line in lines[5:]}
    assert by_agent["box/warm"].endswith("warm 3m12s")
    assert by_agent["box/cold"].endswith("cold ↻755k")
    assert by_agent["box/low"].endswith("-")
    narrow = frame(tmp_path, width=88, interactive=False)  # the bar at its narrowest, then CACHE goes
    assert narrow[1] == "+1 column hidden, widen the terminal: CACHE"


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
    # NOW is in the past by the wall clock: every reading is stale here
    assert lines[1] == FLEET_SUMMARY.replace("1 stale", "4 stale") and lines[2] == ""
    assert lines[3].split()[0] == "AGENT"
    assert lines[4].split()[0] == "box/over"
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


# The whole catalog's periodic re-read (REREAD_S), where a test sets it: longer than any wait here,
# so what the view shows then came by a file event or the ages' tick, never by that re-read.
NO_REREAD_S = 3600.0


class Tmux:
    def __init__(self) -> None:
        self.socket = f"hctx-test-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30,
                              check=True)  # fmt: skip
        return done.stdout

    def pane(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        """Until `text` is on the pane: a liveness bound, generous for a loaded machine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.pane():
                return
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


def top_argv(catalog: Path, *, reread_s: float | None = None) -> list[str]:
    """`hctx top` on `catalog`; with `reread_s`, that process sets the view's REREAD_S to it first."""
    cli = ["-m", "wrapper.cli"]
    if reread_s is not None:
        cli = ["-c", f"import sys, wrapper.readers.top as top; top.REREAD_S = {reread_s!r}; "
                     "from wrapper.cli import main; sys.exit(main())"]  # fmt: skip
    return [sys.executable, *cli, "top", "--catalog", str(catalog), "--host", HOST]


def start_top(tmux: Tmux, catalog: Path, *, reread_s: float | None = None) -> None:
    """Run `hctx top` in a shell that reports, after it, its exit status and the terminal modes."""
    top = " ".join(shlex.quote(part) for part in top_argv(catalog, reread_s=reread_s))
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
    top = " ".join(shlex.quote(part) for part in top_argv(tmp_path))
    # The shell ignores the hang-up to report after it; top sets its own handler, so it still gets it.
    script = f"trap '' HUP; {top} 2> {err}; echo $? > {done}"
    tmux("new-session", "-d", "-s", "top", "-x", "132", "-y", "30", "-e", f"PYTHONPATH={REPO}", "sh", "-c", script)
    tmux.wait_for("box/alpha")
    tmux("kill-server")
    wait_for(done.exists, what="top's exit status")
    assert done.read_text().strip() == "0" and err.read_text() == ""


def rewrite_atomically(path: Path, **fields: object) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    staging = path.with_name(".staging")
    staging.write_text(json.dumps(record) + "\n")
    os.replace(staging, path)


def test_live_view_shows_file_events_and_q_restores_the_terminal(tmp_path: Path, tmux: Tmux) -> None:
    now = now_ms()
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now)
    put_record(tmp_path, "bravo", usedPercent=50.0, usedTokens=100_000, windowTokens=200_000, observedAtMs=now)
    put_claim(tmp_path, "alpha")
    start_top(tmux, tmp_path, reread_s=NO_REREAD_S)
    tmux.wait_for("box/alpha")
    pane = tmux.pane().splitlines()
    assert "BEFORE-TOP" not in "\n".join(pane)  # on the alternate screen
    assert [line.split()[0] for line in pane[5:7]] == ["box/bravo", "box/alpha"]

    record = tmp_path / "agents" / HOST / "alpha" / "harness-context"
    # Beside file events, the view reads the whole catalog for its first frame, as its loop starts and
    # once its file watching is armed. Two changes shown one after the other outlast the last two:
    # with the periodic re-read off, what is shown after them came by a file event.
    for percent in (40, 41):
        rewrite_atomically(record, usedPercent=float(percent), observedAtMs=now_ms())
        tmux.wait_for(f" {percent}% ")
    rewrite_atomically(record, usedPercent=97.0, usedTokens=194_000, windowTokens=200_000, observedAtMs=now_ms())
    tmux.wait_for("97%")
    pane = tmux.pane().splitlines()
    assert [line.split()[0] for line in pane[5:7]] == ["box/alpha", "box/bravo"]  # re-sorted by fill

    put_record(tmp_path, "charlie", usedPercent=1.0, observedAtMs=now_ms())
    tmux.wait_for("box/charlie")  # a new agent too

    tmux("send-keys", "-t", "top", "q")
    tmux.wait_for("EXITED 0")
    tmux.wait_for("icanon")
    pane_text = tmux.pane()
    assert "BEFORE-TOP" in pane_text and "box/alpha" not in pane_text  # main screen back
    assert "\necho\n" in f"\n{pane_text}" and "\nicanon\n" in pane_text  # echo and line mode restored


def test_ctrl_c_quits_and_restores_the_terminal(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now_ms())
    start_top(tmux, tmp_path)
    tmux.wait_for("box/alpha")
    tmux("send-keys", "-t", "top", "C-c")
    tmux.wait_for("EXITED 0")
    tmux.wait_for("icanon")
    pane_text = tmux.pane()
    assert "BEFORE-TOP" in pane_text and "box/alpha" not in pane_text
    assert "\nicanon\n" in pane_text and "-echo" not in pane_text


def alpha_age_s(pane: str) -> int:
    """The AGE on box/alpha's row in seconds (`12s`, `1m05s`); 0 while that row is not drawn."""
    for line in pane.splitlines():
        cells = line.split()
        if cells and cells[0] == "box/alpha":
            for cell in cells:
                if age := re.fullmatch(r"(?:(\d+)m)?(\d+)s", cell):
                    return int(age[1] or 0) * 60 + int(age[2])
    return 0


def age_above(tmux: Tmux, seconds: int) -> int:
    """box/alpha's age on the pane, once it is above `seconds`."""
    return int(wait_for(lambda: (age := alpha_age_s(tmux.pane())) > seconds and age, what=f"an age above {seconds}s"))


def test_ages_tick_without_any_change(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, observedAtMs=now_ms() - 10_000)
    start_top(tmux, tmp_path, reread_s=NO_REREAD_S)
    # Nothing is written and the periodic re-read is off: past the whole reads of the start (two after
    # the first frame, see above), only the ages' tick draws a newer age. Seen rising three times in
    # turn, it ticked, however long the start took.
    age = age_above(tmux, 0)
    for _ in range(3):
        age = age_above(tmux, age)
    tmux("send-keys", "-t", "top", "q")
    tmux.wait_for("EXITED 0")


def test_resize_redraws_to_the_new_width(tmp_path: Path, tmux: Tmux) -> None:
    put_record(tmp_path, "alpha", usedPercent=33.0, costUsd=12.5, observedAtMs=now_ms())
    start_top(tmux, tmp_path)
    tmux.wait_for("$12.50")
    tmux("resize-window", "-t", "top", "-x", "50", "-y", "20")
    wait_for(lambda: "$12.50" not in tmux.pane(), what="the frame at the new width")
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
    tmux.wait_for("EXITED 0")
    tmux.wait_for("icanon")
    pane_text = tmux.pane()
    assert "BEFORE-TOP" in pane_text and "box/alpha" not in pane_text and "-echo" not in pane_text


# --- a real fleet: scroll, sort, filter, summary (issue 27) ------------------------------------------

FLEET_HOSTS = (("alpha", 100), ("bravo", 120), ("charlie", 80))
BIG_SUMMARY = "hosts: alpha 100, bravo 120, charlie 80 · 60 at or above 80% · 15 at or above 95% · 6 stale"


def big_fleet(catalog: Path, now: int) -> None:
    """300 agents on three hosts: fill i % 100, harness codex/claude/pi in turn, observed i seconds
    ago (every 50th two hours ago: stale)."""
    index = 0
    for host, count in FLEET_HOSTS:
        for _ in range(count):
            harness = ("codex", "claude", "pi")[index % 3]
            observed = now - (2 * HOUR if index % 50 == 0 else index * 1000)
            put_record(catalog, f"agent-{index:03d}", host=host, harness=harness, usedPercent=float(index % 100),
                       observedAtMs=observed, writtenAtMs=observed, rateLimits=None)  # fmt: skip
            index += 1


def names(lines: list[str]) -> list[str]:
    return [line.split()[0] for line in lines if line.split() and "/agent-" in line.split()[0]]


def test_decode_keys_names_what_terminals_send() -> None:
    assert decode_keys(b"\x1b[A\x1bOB\x1b[5~\x1b[6~") == ["up", "down", "pgup", "pgdn"]
    assert decode_keys(b"\x1b[H\x1b[1~\x1bOH\x1b[7~") == ["home"] * 4
    assert decode_keys(b"\x1b[F\x1b[4~\x1bOF\x1b[8~") == ["end"] * 4
    assert decode_keys(b"jk/pi\r\x7fq") == ["j", "k", "/", "p", "i", "enter", "backspace", "q"]
    assert decode_keys(b"\x1b") == ["esc"]
    assert decode_keys(b"\x1b[1;5Cx") == ["x"]  # Ctrl-Right: not a key here, skipped whole, never typed
    assert decode_keys("/é".encode()) == ["/", "é"]


@given(st.binary(max_size=512))
def test_any_bytes_decode_to_known_keys_or_printable_characters(data: bytes) -> None:
    """A truncated sequence, a paste of binary junk: never an exception, never a control byte typed."""
    named = {"up", "down", "pgup", "pgdn", "home", "end", "enter", "esc", "backspace"}
    view = View()
    for key in decode_keys(data):
        assert key in named or (len(key) == 1 and key.isprintable())
        view.press(key)
    assert view.filter.isprintable()


def test_300_agents_in_100_by_30_scroll_to_every_row(tmp_path: Path) -> None:
    big_fleet(tmp_path, NOW)
    view = View()
    first = frame(tmp_path, width=100, height=30, view=view)
    assert len(first) == 30 and all(len(line) <= 100 for line in first)
    assert first[2] == BIG_SUMMARY
    assert first[-1] == "rows 1–24 of 300" and len(names(first)) == 24
    assert names(first)[:3] == ["alpha/agent-099", "bravo/agent-199", "charlie/agent-299"]  # fullest first
    seen = list(names(first))
    while not frame(tmp_path, width=100, height=30, view=view)[-1].endswith("–300 of 300"):
        view.press("pgdn")
        seen += names(frame(tmp_path, width=100, height=30, view=view))
    assert set(seen) == {f"{host}/agent-{i:03d}" for host, i in _all_names()}  # every agent reached
    view.press("home")
    assert frame(tmp_path, width=100, height=30, view=view)[-1] == "rows 1–24 of 300"
    view.press("end")
    last = frame(tmp_path, width=100, height=30, view=view)
    assert last[-1] == "rows 277–300 of 300" and names(last)[-1] == "bravo/agent-200"  # emptiest last
    view.press("up"), view.press("k")
    assert frame(tmp_path, width=100, height=30, view=view)[-1] == "rows 275–298 of 300"
    view.press("down"), view.press("j"), view.press("j")  # past the end: held at the last page
    assert frame(tmp_path, width=100, height=30, view=view)[-1] == "rows 277–300 of 300"


def _all_names() -> list[tuple[str, int]]:
    out, index = [], 0
    for host, count in FLEET_HOSTS:
        for _ in range(count):
            out.append((host, index))
            index += 1
    return out


def test_sort_keys_and_the_filter_pick_and_order_the_rows(tmp_path: Path) -> None:
    big_fleet(tmp_path, NOW)
    view = View()
    assert view.press("n") is False
    by_name = frame(tmp_path, width=100, height=30, view=view)
    assert "s sort: name" in by_name[1] and names(by_name)[:2] == ["alpha/agent-000", "alpha/agent-001"]
    view.press("a")  # freshest reading first; the stale ones last
    by_age = frame(tmp_path, width=100, height=30, view=view)
    assert "s sort: age" in by_age[1] and names(by_age)[:2] == ["alpha/agent-001", "alpha/agent-002"]
    view.press("end")
    assert names(frame(tmp_path, width=100, height=30, view=view))[-1] == "charlie/agent-250"
    view.press("s")  # cycles: age -> name
    assert view.sort == "name" and view.offset == 0
    view.press("s"), view.press("f")
    assert view.sort == "fill"

    for key in "/CHARLIE":  # case-insensitive, typed live
        view.press(key)
    typing = frame(tmp_path, width=100, height=30, view=view)
    assert typing[1] == "filter: CHARLIE▏ · 80 of 300 · Enter keeps it, Esc clears it"
    assert typing[-1] == "rows 1–24 of 80" and all(name.startswith("charlie/") for name in names(typing))
    assert typing[2] == BIG_SUMMARY  # the summary is the fleet's, whatever the filter shows
    view.press("enter")
    kept = frame(tmp_path, width=100, height=30, view=view)[1]
    assert kept.endswith("· filter 'CHARLIE': 80 of 300 · Esc clears")
    assert view.press("q") is True  # the filter is kept; q is a key again
    view.press("esc")
    assert frame(tmp_path, width=100, height=30, view=view)[-1] == "rows 1–24 of 300"
    for key in ["/", "p", "i", "enter"]:  # a harness
        view.press(key)
    by_harness = frame(tmp_path, width=100, height=30, view=view)
    assert "filter 'pi': 100 of 300" in by_harness[1] and all(" pi " in line for line in by_harness[5:-1])
    for key in ["/", "backspace", "backspace", "-", "0", "4", "2", "enter"]:  # a name substring
        view.press(key)
    assert names(frame(tmp_path, width=100, height=30, view=view)) == ["alpha/agent-042"]
    for key in ["/", "q", "esc"]:  # Esc while typing clears it; the q was text, not a quit
        assert view.press(key) is False
    assert view.filter == "" and not view.editing


def test_live_view_scrolls_sorts_and_filters_from_the_keyboard(tmp_path: Path, tmux: Tmux) -> None:
    """At 300 agents in a 100x30 terminal (issue 27: 25 rows and `… 275 more`, with no way on)."""
    big_fleet(tmp_path, now_ms())
    top = " ".join(shlex.quote(part) for part in top_argv(tmp_path))
    # COLUMNS/LINES from the test's environment would override the pane's real size.
    tmux("new-session", "-d", "-s", "top", "-x", "100", "-y", "30", "-e", f"PYTHONPATH={REPO}", "-e", "NO_COLOR=",
         "env", "-u", "COLUMNS", "-u", "LINES", "sh", "-c", f"{top}; echo EXITED $?; sleep 60")  # fmt: skip
    tmux.wait_for("rows 1–24 of 300")
    assert BIG_SUMMARY in tmux.pane()
    for keys, shown in [("End", "rows 277–300 of 300"), ("Home", "rows 1–24 of 300"), ("NPage", "rows 25–48 of 300"),
                        ("k", "rows 24–47 of 300"), ("Down", "rows 25–48 of 300"), ("j", "rows 26–49 of 300"),
                        ("Up", "rows 25–48 of 300"), ("PPage", "rows 1–24 of 300")]:  # fmt: skip
        tmux("send-keys", "-t", "top", keys)
        tmux.wait_for(shown)
    tmux("send-keys", "-t", "top", "End")
    tmux.wait_for("bravo/agent-200")  # the emptiest, last by fill
    tmux("send-keys", "-t", "top", "n")
    tmux.wait_for("s sort: name")
    assert names(tmux.pane().splitlines())[0] == "alpha/agent-000"
    tmux("send-keys", "-t", "top", "/", "c", "h", "a", "r")
    tmux.wait_for("filter: char▏ · 80 of 300")
    tmux("send-keys", "-t", "top", "Enter")
    tmux.wait_for("filter 'char': 80 of 300 · Esc clears")
    pane = tmux.pane().splitlines()
    assert names(pane)[0] == "charlie/agent-220" and all(name.startswith("charlie/") for name in names(pane))
    tmux("send-keys", "-t", "top", "Escape")
    tmux.wait_for("rows 1–24 of 300")
    tmux("send-keys", "-t", "top", "q")
    tmux.wait_for("EXITED 0")
