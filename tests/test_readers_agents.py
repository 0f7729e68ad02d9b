"""`hctx agents`: the roster's wire shape, its sort, the compact human column and the meter (HC-R14)."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from readers_catalog import HOST, HOUR, NOW, REPO, claim, hctx, put_claim, put_record

from guard.layout import default_host
from guard.procs import pid_alive
from guard.projection import CONTEXT_KEYS, Context
from wrapper.cli import main
from wrapper.readers import roster as roster_module
from wrapper.readers.render import (
    colour_enabled,
    ctx_text,
    fill_tint,
    meter_text,
    render_agent_json,
    render_agents,
    render_agents_json,
    tokens_text,
)
from wrapper.readers.roster import AgentNotFound, collect_roster, resolve_agent


def dead(pid: int) -> bool:
    return False


def alive(pid: int) -> bool:
    return True


def roster(catalog: Path, now: int = NOW, *, here: str = HOST, probe: Any = dead) -> roster_module.Roster:
    return collect_roster(catalog, now, here=here, alive=probe)


def context(**fields: Any) -> Context:
    base: dict[str, Any] = dict.fromkeys(CONTEXT_KEYS)
    base.update({"harness": "codex", "compactions": 0, "observedAtMs": NOW, "ageMs": 0, "stale": False})
    base.update(fields)
    return Context.model_validate(base)


# --- the wire --------------------------------------------------------------------------------------

# One agent per line (greppable; json's C encoder), the spec's key order inside `context`.
PINNED_ROSTER = (
    "[\n"
    '{"host": "box", "identity": "alpha", "harness": "codex", "desiredState": "stopped", "context": '
    '{"harness": "codex", "usedTokens": 92283, "windowTokens": 258400, "usedPercent": 33.0, "model": null, '
    '"costUsd": null, "sessionTotalTokens": 2235329, "rateLimits": {"fiveHour": 31.0, "sevenDay": 55.0}, '
    '"compactions": 3, "lastCompactionMs": 1788000097290, "lastCompactionTrigger": "unknown", '
    '"compactAtTokens": null, "autoCompaction": null, "harnessVersion": null, "sessionId": null, '
    '"account": null, "rateLimitResetsAtMs": null, '
    '"observedAtMs": 1788000100000, "ageMs": 4210, "stale": false, "headroomTokens": null}, '
    '"accountRateLimits": {"account": null, "agentCount": 1, "fiveHour": {"usedPercent": 31.0, '
    '"resetsAtMs": null, "resetPassed": false, "observedAtMs": 1788000100000, "ageMs": 4210, "stale": false, '
    '"agent": "box/alpha", "fromAnotherAgent": false}, "sevenDay": {"usedPercent": 55.0, "resetsAtMs": null, '
    '"resetPassed": false, "observedAtMs": 1788000100000, "ageMs": 4210, "stale": false, "agent": "box/alpha", '
    '"fromAnotherAgent": false}}},\n'
    '{"host": "box", "identity": "bravo", "harness": null, "desiredState": null, "context": null, '
    '"accountRateLimits": null}\n'
    "]\n"
)


def test_roster_wire_shape_is_pinned_on_the_whole_string(tmp_path: Path) -> None:
    """The spec's Exposure example, read 4210 ms after its observation; a bare agent dir is all-null."""
    put_record(tmp_path, "alpha", lastCompactionTrigger="unknown")
    put_claim(tmp_path, "alpha")
    (tmp_path / "agents" / HOST / "bravo").mkdir()
    assert render_agents_json(roster(tmp_path).rows) == PINNED_ROSTER


def test_context_keys_are_exactly_the_spec_exposure_keys_in_order(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    (row,) = roster(tmp_path).rows
    assert row.context is not None
    assert list(row.context.wire()) == [
        "harness", "usedTokens", "windowTokens", "usedPercent", "model", "costUsd",
        "sessionTotalTokens", "rateLimits", "compactions", "lastCompactionMs",
        "lastCompactionTrigger", "compactAtTokens", "autoCompaction", "harnessVersion", "sessionId",
        "account", "rateLimitResetsAtMs", "observedAtMs", "ageMs", "stale", "headroomTokens",
    ]  # fmt: skip
    assert "incarnation" not in row.context.wire() and "writtenAtMs" not in row.context.wire()
    assert list(row.wire()) == ["host", "identity", "harness", "desiredState", "context"]


def test_one_agent_gives_the_one_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(roster_module, "now_ms", lambda: NOW)
    put_record(tmp_path, "alpha", lastCompactionTrigger="unknown")
    put_claim(tmp_path, "alpha")
    put_record(tmp_path, "bravo")
    assert main(["agents", "alpha", "--json", "--catalog", str(tmp_path), "--host", HOST]) == 0
    pinned_object = PINNED_ROSTER.splitlines()[1].removesuffix(",") + "\n"
    assert capsys.readouterr().out == pinned_object
    assert main(["agents", "--json", "--catalog", str(tmp_path), "--host", HOST]) == 0
    assert json.loads(capsys.readouterr().out)[0] == json.loads(pinned_object)


def test_one_agent_object_renders_like_its_roster_entry(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    (row,) = roster(tmp_path).rows
    assert json.loads(render_agent_json(row)) == json.loads(render_agents_json([row]))[0]


def test_rows_sorted_by_host_then_identity_across_hosts(tmp_path: Path) -> None:
    for host, identity in [("zulu", "a"), ("box", "charlie"), ("box", "Alpha"), ("alpha", "zed"), ("box", "bravo")]:
        put_record(tmp_path, identity, host=host)
    names = [(row.host, row.identity) for row in roster(tmp_path).rows]
    assert names == [("alpha", "zed"), ("box", "Alpha"), ("box", "bravo"), ("box", "charlie"), ("zulu", "a")]


def test_agent_dir_without_record_is_context_null_and_with_claim_keeps_harness(tmp_path: Path) -> None:
    put_claim(tmp_path, "fresh", harness="pi", desiredState="running")
    (row,) = roster(tmp_path).rows
    assert row.wire() == {
        "host": HOST, "identity": "fresh", "harness": "pi", "desiredState": "running", "context": None,
    }  # fmt: skip
    assert row.problem is None  # absence is not a warning


def test_stale_reading_keeps_its_numbers_and_age(tmp_path: Path) -> None:
    put_record(tmp_path, "old", observedAtMs=NOW - HOUR)
    (row,) = roster(tmp_path).rows
    assert row.context is not None
    assert row.context.stale is True and row.context.age_ms == HOUR
    assert row.context.used_tokens == 92283


def test_empty_catalog_is_an_empty_roster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agents", "--json", "--catalog", str(tmp_path)]) == 0  # no agents/ yet
    assert capsys.readouterr().out == "[]\n"
    (tmp_path / "agents").mkdir()
    assert main(["agents", "--json", "--catalog", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "[]\n"
    assert main(["agents", "--catalog", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "no agents\n"


# --- desiredState ----------------------------------------------------------------------------------


def test_desired_state_running_while_the_wrapper_lives_on_this_host(tmp_path: Path) -> None:
    put_claim(tmp_path, "alpha", desiredState="stopped", wrapperPid=4242)
    probed: list[int] = []

    def probe(pid: int) -> bool:
        probed.append(pid)
        return True

    (row,) = roster(tmp_path, probe=probe).rows
    assert row.desired_state == "running" and probed == [4242]


def test_desired_state_is_not_running_when_the_pid_is_another_process_now(tmp_path: Path) -> None:
    """A pid alive but reused since the claim (another start time): not the wrapper, as for the claim."""
    from guard.state import process_identity

    me = os.getpid()
    put_claim(tmp_path, "reused", desiredState="stopped", wrapperPid=me, wrapperIdentity="another-boot/1")
    put_claim(tmp_path, "mine", desiredState="stopped", wrapperPid=me, wrapperIdentity=process_identity(me))
    rows = collect_roster(tmp_path, NOW, here=HOST).rows  # the real probe: this process is alive
    assert [(row.identity, row.desired_state) for row in rows] == [("mine", "running"), ("reused", "stopped")]


def test_desired_state_is_the_claims_when_the_wrapper_is_gone(tmp_path: Path) -> None:
    put_claim(tmp_path, "a", desiredState="stopped")
    put_claim(tmp_path, "b", desiredState="running")
    assert [row.desired_state for row in roster(tmp_path, probe=dead).rows] == ["stopped", "running"]


def test_a_live_pid_on_another_host_says_nothing_about_this_host(tmp_path: Path) -> None:
    foreign_claim = claim("a", host="elsewhere", desiredState="stopped")
    put_claim(tmp_path, "a", raw=json.dumps(foreign_claim).encode())  # under box/, claiming elsewhere
    put_claim(tmp_path, "b", desiredState="stopped")
    put_claim(tmp_path, "c", host="far", desiredState="stopped")
    assert [row.desired_state for row in roster(tmp_path, here=HOST, probe=alive).rows] == [
        "stopped", "running", "stopped",
    ]  # fmt: skip
    assert [row.desired_state for row in roster(tmp_path, here="elsewhere", probe=alive).rows] == [
        "stopped", "stopped", "stopped",
    ]  # fmt: skip


def test_desired_state_null_without_a_claim_or_with_a_garbled_one(tmp_path: Path) -> None:
    put_record(tmp_path, "none")
    put_claim(tmp_path, "garbled", raw=b'{"schema": "st2.harness-state.v1", "agent": ')
    put_claim(tmp_path, "foreign", raw=json.dumps({"schema": "com.example.harness-state.v1"}).encode())
    rows = roster(tmp_path, probe=alive).rows
    assert [(row.identity, row.harness, row.desired_state) for row in rows] == [
        ("foreign", None, None), ("garbled", None, None), ("none", None, None),
    ]  # fmt: skip
    assert rows[0].claim_problem and rows[1].claim_problem and rows[2].claim_problem is None


def test_pid_probe_against_real_processes() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)
    assert not pid_alive(0)  # would address our own process group
    assert not pid_alive(-1)
    assert not pid_alive(2**80)


def test_cli_derives_running_from_a_live_wrapper_on_the_real_host(tmp_path: Path) -> None:
    here = default_host()
    put_claim(tmp_path, "me", host=here, wrapperPid=os.getpid(), desiredState="stopped")
    put_claim(tmp_path, "gone", host=here, desiredState="stopped")
    done = hctx("agents", "--json", "--catalog", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [row["desiredState"] for row in json.loads(done.stdout)] == ["stopped", "running"]


def test_resolve_agent_by_id_or_host_slash_id(tmp_path: Path) -> None:
    put_record(tmp_path, "solo", host="far")
    put_record(tmp_path, "twin", host="far")
    put_record(tmp_path, "twin", host=HOST)
    put_record(tmp_path, "twin", host="zzz")
    assert resolve_agent(tmp_path, "solo", here=HOST) == ("far", "solo")
    assert resolve_agent(tmp_path, "twin", here=HOST) == (HOST, "twin")
    assert resolve_agent(tmp_path, "far/twin", here=HOST) == ("far", "twin")
    with pytest.raises(AgentNotFound, match="several hosts"):
        resolve_agent(tmp_path, "twin", here="other")
    for wanted in ("nobody", "../twin", "far/../x", "", "a/b/c"):
        with pytest.raises(AgentNotFound):
            resolve_agent(tmp_path, wanted, here=HOST)


def test_unknown_agent_exits_1_with_a_message(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha")
    done = hctx("agents", "nobody", "--json", "--catalog", str(tmp_path))
    assert (done.returncode, done.stdout) == (1, "")
    assert "no agent nobody" in done.stderr


# --- the catalog default ---------------------------------------------------------------------------


def test_catalog_defaults_to_hctx_catalog_then_xdg_state(tmp_path: Path) -> None:
    put_record(tmp_path / "explicit", "from-env")
    put_record(tmp_path / "state" / "hctx", "from-xdg")
    put_record(tmp_path / "home" / ".local" / "state" / "hctx", "from-home")
    base = {"HOME": str(tmp_path / "home"), "HCTX_CATALOG": "", "XDG_STATE_HOME": ""}
    cases = [
        ({"HCTX_CATALOG": str(tmp_path / "explicit"), "XDG_STATE_HOME": str(tmp_path / "state")}, "from-env"),
        ({"XDG_STATE_HOME": str(tmp_path / "state")}, "from-xdg"),
        ({}, "from-home"),
    ]
    for env, identity in cases:
        done = hctx("agents", "--json", env={**base, **env})
        assert done.returncode == 0, done.stderr
        assert [row["identity"] for row in json.loads(done.stdout)] == [identity]


@pytest.mark.parametrize("command", [["agents"], ["agents", "--json"], ["doctor"], ["top", "--once"],
                                     ["inspect", "x"], ["agents", "x"], ["watch"]])  # fmt: skip
def test_a_catalog_that_does_not_exist_is_named_with_where_it_came_from(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("HCTX_CATALOG", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    missing = tmp_path / "typo"
    cases = [
        ([*command, "--catalog", str(missing)], {}, f"{missing} does not exist (from --catalog)"),
        (command, {"HCTX_CATALOG": str(missing)}, f"{missing} does not exist (from $HCTX_CATALOG)"),
        (command, {"XDG_STATE_HOME": str(tmp_path / "state")},
         f"{tmp_path}/state/hctx does not exist (from the default, $XDG_STATE_HOME/hctx)"),
        (command, {}, f"{tmp_path}/home/.local/state/hctx does not exist (from the default, ~/.local/state/hctx)"),
    ]  # fmt: skip
    for argv, env, message in cases:
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err == f"hctx {command[0]}: cannot read the catalog: {message}\n"
    assert not missing.exists()  # a reader never creates it


# --- the human column ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"usedPercent": 92.0, "compactions": 1}, "ctx:92% ⟳1"),
        ({"usedPercent": 33.0}, "ctx:33%"),
        ({"usedPercent": None, "usedTokens": 5000}, "ctx:?"),
        ({"usedPercent": 92.0, "compactions": 1, "stale": True}, "ctx:92% ⟳1 stale"),
        ({"usedPercent": None, "stale": True}, "ctx:? stale"),
        ({"usedPercent": 585.6}, "ctx:586%"),  # rounded, never clamped
        ({"usedPercent": 100.4}, "ctx:100%"),
        ({"usedPercent": 99.5}, "ctx:100%"),
        ({"usedPercent": 2.5}, "ctx:3%"),  # half up, not to even
        ({"usedPercent": 0.0}, "ctx:0%"),
    ],
)
def test_ctx_column(fields: dict[str, Any], text: str) -> None:
    assert ctx_text(context(**fields)) == text


def test_no_record_is_a_dash_and_distinct_from_withheld() -> None:
    assert ctx_text(None) == "ctx:-"
    assert ctx_text(context(usedPercent=None)) == "ctx:?"


@pytest.mark.parametrize(
    ("used", "window", "text"),
    [
        (127_000, 200_000, "127k/200k"),
        (92_283, 258_400, "92k/258k"),
        (850, 4_000, "850/4k"),
        (23_424, 4_000, "23k/4k"),  # an overrun shows as it is
        (None, 200_000, "?/200k"),
        (150_000, None, "150k/?"),
        (999_600, 1_000_000, "1M/1M"),
        (1_250_000, 2_000_000, "1.3M/2M"),
        (0, 200_000, "0/200k"),
    ],
)
def test_meter_text(used: int | None, window: int | None, text: str) -> None:
    assert meter_text(context(usedTokens=used, windowTokens=window)) == text


def test_meter_is_empty_when_neither_count_is_known() -> None:
    assert meter_text(None) == ""
    assert meter_text(context()) == ""
    assert tokens_text(None) == "?"


@pytest.mark.parametrize(
    ("percent", "tint"),
    [(None, None), (79.99, None), (80.0, "amber"), (94.99, "amber"), (95.0, "red"), (585.6, "red")],
)
def test_meter_tint_thresholds(percent: float | None, tint: str | None) -> None:
    assert fill_tint(context(usedPercent=percent, usedTokens=1, windowTokens=2)) == tint


def test_human_rows_show_column_meter_age_and_cost(tmp_path: Path) -> None:
    put_record(tmp_path, "alpha", usedPercent=92.4, compactions=1, usedTokens=184_800, windowTokens=200_000,
               compactAtTokens=196_800)  # fmt: skip
    put_record(tmp_path, "beta", harness="pi", usedPercent=585.6, usedTokens=23_424, windowTokens=4_000,
               costUsd=0.0123, compactions=0, rateLimits=None)  # fmt: skip
    put_record(tmp_path, "gamma", harness="claude", usedPercent=None, usedTokens=None, windowTokens=None,
               compactions=0, observedAtMs=NOW - 2 * HOUR, rateLimits=None)  # fmt: skip
    (tmp_path / "agents" / HOST / "delta").mkdir()
    text = render_agents(roster(tmp_path).rows, colour=False, now=NOW)
    lines = text.splitlines()
    assert lines[0].split() == [
        "HOST", "AGENT", "HARNESS", "DESIRED", "CONTEXT", "TOKENS", "HEADROOM", "AGE", "COST", "LIMITS",
    ]  # fmt: skip
    assert lines[1].split() == [
        "box", "alpha", "codex", "-", "ctx:92%", "⟳1", "185k/200k", "→", "12k", "4s", "-", "5h", "31%", "7d", "55%",
    ]  # fmt: skip
    assert lines[2].split() == ["box", "beta", "pi", "-", "ctx:586%", "23k/4k", "-", "4s", "$0.0123", "-"]
    assert lines[3].split() == ["box", "delta", "-", "-", "ctx:-", "-", "-", "-", "-"]
    assert lines[4].split() == ["box", "gamma", "claude", "-", "ctx:?", "stale", "-", "2h00m", "-", "-"]
    assert "\x1b" not in text


def test_meter_is_tinted_only_when_colour_is_on(tmp_path: Path) -> None:
    put_record(tmp_path, "amber", usedPercent=85.0, usedTokens=170_000, windowTokens=200_000)
    put_record(tmp_path, "calm", usedPercent=50.0, usedTokens=100_000, windowTokens=200_000)
    put_record(tmp_path, "red", usedPercent=96.0, usedTokens=192_000, windowTokens=200_000)
    rows = roster(tmp_path).rows
    coloured = render_agents(rows, colour=True)
    assert "\x1b[33m170k/200k\x1b[0m" in coloured
    assert "\x1b[31m192k/200k\x1b[0m" in coloured
    assert "\x1b[" not in coloured.splitlines()[2]  # calm
    assert "\x1b" not in render_agents(rows, colour=False)


def test_colour_only_on_a_tty_without_no_color() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert colour_enabled(Tty(), {})
    assert not colour_enabled(Tty(), {"NO_COLOR": "1"})
    assert colour_enabled(Tty(), {"NO_COLOR": ""})  # no-color.org: set *and non-empty*
    assert not colour_enabled(Tty(), {"TERM": "dumb"})
    assert not colour_enabled(io.StringIO(), {})


def _run_in_pty(args: list[str], env: dict[str, str]) -> str:
    """`hctx` with its stdout on a real terminal."""
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "wrapper.cli", *args],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", **env},
        cwd=REPO,
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif child.poll() is not None:
            break
    child.wait(timeout=10)
    os.close(leader)
    return out.decode()


def test_terminal_gets_colour_pipe_and_no_color_do_not(tmp_path: Path) -> None:
    put_record(tmp_path, "hot", usedPercent=96.0, usedTokens=192_000, windowTokens=200_000)
    args = ["agents", "--catalog", str(tmp_path)]
    assert "\x1b[31m192k/200k\x1b[0m" in _run_in_pty(args, {"NO_COLOR": ""})
    on_tty_no_color = _run_in_pty(args, {"NO_COLOR": "1"})
    assert "192k/200k" in on_tty_no_color and "\x1b[" not in on_tty_no_color
    piped = hctx(*args, env={"NO_COLOR": ""})
    assert "192k/200k" in piped.stdout and "\x1b" not in piped.stdout


def test_json_is_never_coloured_even_on_a_terminal(tmp_path: Path) -> None:
    put_record(tmp_path, "hot", usedPercent=96.0)
    out = _run_in_pty(["agents", "--json", "--catalog", str(tmp_path)], {"NO_COLOR": ""})
    assert "\x1b" not in out and json.loads(out)[0]["context"]["usedPercent"] == 96.0


def test_agents_output_piped_into_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    for index in range(300):
        put_record(tmp_path, f"agent{index:03d}")
    shell = f"{sys.executable} -m wrapper.cli agents --json --catalog {tmp_path} | head -c 10"
    done = subprocess.run(shell, shell=True, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, check=False)  # fmt: skip
    assert "Traceback" not in done.stderr


def test_agents_json_imports_only_what_it_needs(tmp_path: Path) -> None:
    """Start-up is most of a small roster's cost: no trio, no network client, no terminal UI."""
    put_record(tmp_path, "alpha")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "wrapper.cli", "agents", "--json", "--catalog", str(tmp_path)],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
        check=True,
    )  # fmt: skip
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import")}
    assert "guard.projection" in imported
    for heavy in ("trio", "httpx", "wrapper.readers.top", "termios", "pythonjsonlogger", "sidecar.pipeline"):
        assert heavy not in imported, heavy


@pytest.mark.parametrize("command", ["agents", "doctor", "inspect", "top"])
def test_every_reader_has_help_and_a_catalog_option(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--catalog DIR" in text and "%%" not in text
