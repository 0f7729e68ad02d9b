"""`hctx status`: one line for a status bar, its fields, waybar's JSON, and a start without pydantic.

Its numbers are the other readers' (top's summary, the accounts' fan-in) on the same catalog, and the
record's field names it reads are guard.record's: both are checked here, not assumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from guard import glance as glance_module
from guard.account import ACCOUNT_KEY_PATTERN, Account
from guard.record import HarnessContext, RateLimitResets, RateLimits
from tests.conftest import REPO
from tests.web_board import HERE, REPLICA, now_ms, put, put_claim
from wrapper.cli import main
from wrapper.readers.accounts import fan_in
from wrapper.readers.roster import collect_roster
from wrapper.readers.status import DEFAULT_FORMAT, Fleet, line_of, read_fleet
from wrapper.readers.top import AMBER_PERCENT, RED_PERCENT, fill_order

KEY_A, KEY_B = "a" * 32, "b" * 32


def _aliases(model: type[HarnessContext] | type[RateLimits] | type[RateLimitResets]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def test_the_glance_reads_the_records_own_field_names() -> None:
    """One definition: each name the fast view reads is guard.record's (and guard.account's)."""
    record = _aliases(HarnessContext)
    assert [name for name in record if name in glance_module.RECORD_FIELDS] == sorted(
        glance_module.RECORD_FIELDS, key=record.index
    )
    assert set(glance_module.RECORD_FIELDS) <= set(record)
    assert list(glance_module.WINDOW_FIELDS) == _aliases(RateLimits) == _aliases(RateLimitResets)
    assert set(glance_module.ACCOUNT_FIELDS) <= set(Account.model_fields)
    assert f"^{glance_module._ACCOUNT_KEY.pattern}$" == ACCOUNT_KEY_PATTERN


def _fleet_catalog(catalog: Path) -> None:
    """A fleet with every case the line counts or passes over."""
    now = now_ms()
    limits = {"fiveHour": 40.0, "sevenDay": 20.0}
    put(catalog, "calm", usedPercent=50.0, rateLimits=limits, account={"key": KEY_A})
    # The same account, newer: its 72% is the account's, not the older agent's 40%.
    put(catalog, "busy", usedPercent=85.0, rateLimits={"fiveHour": 72.0, "sevenDay": 21.0},
        account={"key": KEY_A}, observedAtMs=now - 1_000)  # fmt: skip
    put(
        catalog,
        "full",
        REPLICA,
        usedPercent=96.5,
        rateLimits={"fiveHour": 99.0},
        account={"key": KEY_B},
        rateLimitResetsAtMs={"fiveHour": now - 10},
    )  # fmt: skip  (reset since: not the tightest)
    put(
        catalog, "old", usedPercent=97.0, observedAtMs=now - 2 * 60 * 60 * 1000, rateLimits={"fiveHour": 98.0}
    )  # fmt: skip  (stale: counted, its window not the tightest)
    put(catalog, "ahead", usedPercent=99.0, observedAtMs=now + 10 * 60 * 1000)  # future-skewed: absent
    put(catalog, "refused", raw=b'{"schema": "st2.other", "usedPercent": 99}\n')
    put(catalog, "alien", harness="not-a-harness", usedPercent=99.0)
    put(catalog, "truthy", usedPercent=True)
    put(catalog, "withheld", usedPercent=None)
    put_claim(catalog, "empty")  # an agent directory with no record yet


def test_the_counts_are_tops_and_the_window_is_the_accounts_fan_in(tmp_path: Path) -> None:
    _fleet_catalog(tmp_path)
    now = now_ms()
    fleet = read_fleet(tmp_path, now)
    rows = collect_roster(tmp_path, now, here=HERE).rows
    percents = [row.context.used_percent for row in rows if row.context and row.context.used_percent is not None]
    fullest = sorted(rows, key=fill_order)[0]
    assert fleet.agents == len(rows) == 10
    assert fleet.hosts == len({row.host for row in rows}) == 2
    assert fleet.fullest == fullest.name == f"{HERE}/old" and fleet.fill == 97.0
    assert fleet.at80 == sum(percent >= AMBER_PERCENT for percent in percents) == 3
    assert fleet.at95 == sum(percent >= RED_PERCENT for percent in percents) == 2
    assert fleet.stale == sum(row.context.stale for row in rows if row.context) == 1
    current = [
        snapshot
        for group in fan_in(rows)
        for snapshot in group.windows.values()
        if not snapshot.stale and not snapshot.reset_passed(now)
    ]
    tightest = max(current, key=lambda snapshot: snapshot.used_percent)
    assert fleet.tightest is not None
    assert (fleet.tightest.window, fleet.tightest.used_percent, fleet.tightest.agent) == (
        tightest.window, tightest.used_percent, tightest.source.name,
    ) == ("fiveHour", 72.0, f"{HERE}/busy")  # fmt: skip


def test_a_snapshot_is_the_one_whose_figure_arrived_last_as_the_fan_in_takes_it(tmp_path: Path) -> None:
    """Issue 35: an idle seat redraws the limits it heard minutes ago in a fresh reading. Its figure's
    arrival (`rateLimitsAtMs`), not the reading's time, decides which snapshot is the account's, in
    the status line as in `hctx accounts`; a planted arrival past the skew bound is dated by its reading."""
    now = now_ms()
    put(tmp_path, "idle", usedPercent=10.0, rateLimits={"fiveHour": 78.0}, account={"key": KEY_A},
        observedAtMs=now - 1_000, rateLimitsAtMs={"fiveHour": now - 300_000})  # fmt: skip
    put(tmp_path, "busy", usedPercent=20.0, rateLimits={"fiveHour": 81.0}, account={"key": KEY_A},
        observedAtMs=now - 60_000, rateLimitsAtMs={"fiveHour": now - 60_000})  # fmt: skip
    fleet = read_fleet(tmp_path, now)
    rows = collect_roster(tmp_path, now, here=HERE).rows
    (group,) = fan_in(rows)
    assert group.windows["fiveHour"].used_percent == 81.0  # the fan-in's newest: busy's, by arrival
    assert fleet.tightest is not None and (fleet.tightest.used_percent, fleet.tightest.agent) == (
        81.0,
        f"{HERE}/busy",
    )  # fmt: skip  (by the reading's time it would be idle's 78%)
    put(tmp_path, "idle", usedPercent=10.0, rateLimits={"fiveHour": 78.0}, account={"key": KEY_A},
        observedAtMs=now - 1_000, rateLimitsAtMs={"fiveHour": now + 86_400_000})  # fmt: skip
    planted = read_fleet(tmp_path, now).tightest
    assert planted is not None and (planted.used_percent, planted.agent) == (78.0, f"{HERE}/idle")


def test_the_line_and_its_named_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fleet_catalog(tmp_path)
    assert main(["status", "--catalog", str(tmp_path)]) == 0
    line = capsys.readouterr().out
    assert line == f"10 agents · {HERE}/old 97% · 3 ≥80% · 2 ≥95% · 1 stale · limit 5h 72%\n"
    assert "\x1b[" not in line  # not a terminal: no colour
    template = "{fullest}={fill} {at80}/{at95} {stale} {hosts} {window} {window_agent} {agents}"
    assert main(["status", "--catalog", str(tmp_path), "--format", template]) == 0
    assert capsys.readouterr().out == f"{HERE}/old=97% 3/2 1 2 5h 72% {HERE}/busy 10\n"


def test_colour_on_a_terminal_only() -> None:
    fleet = Fleet(agents=1, hosts=1, fullest="h/a", fill=96.0, at80=1, at95=1, stale=0, tightest=None)
    assert "\x1b[31m96%\x1b[0m" in line_of(fleet, DEFAULT_FORMAT, colour=True)
    assert "\x1b[" not in line_of(fleet, DEFAULT_FORMAT, colour=False)


def test_waybar_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fleet_catalog(tmp_path)
    assert main(["status", "--catalog", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) == {"text", "tooltip", "class", "percentage"}
    assert shown["text"].startswith("10 agents · ") and "\n" not in shown["text"]
    assert shown["class"] == "red" and shown["percentage"] == 97
    assert f"tightest window: 5h 72% ({HERE}/busy)" in shown["tooltip"]
    put(tmp_path, "full", REPLICA, usedPercent=585.6)  # an overrun: the text says so, the gauge stops at 100
    assert main(["status", "--catalog", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["percentage"] == 100 and f"{REPLICA}/full 586%" in shown["text"]


def test_an_empty_catalog_is_a_line_and_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--catalog", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["class"] == "empty" and shown["percentage"] == 0 and shown["text"].startswith("0 agents · - ")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--format", "{nope}"], "hctx status: --format: no field 'nope'; the fields are agents, fullest,"),
        (["--format", "{agents"], "hctx status: --format '{agents': "),
        (["--format", "{agents.real}"], "hctx status: --format: no field 'agents.real'"),
    ],
)
def test_a_bad_format_is_one_line_and_exit_2(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--catalog", str(tmp_path), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(message) and captured.err.count("\n") == 1


def test_a_missing_catalog_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--catalog", str(tmp_path / "nope")]) == 2
    assert "cannot read the catalog" in capsys.readouterr().err


def test_status_starts_without_pydantic_or_another_commands_module(tmp_path: Path) -> None:
    """The console entry imports only the chosen command's module, and status's reads no pydantic."""
    _fleet_catalog(tmp_path)
    probe = (
        "import sys; from wrapper.cli import main; status = main(['status', '--catalog', sys.argv[1]]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core', 'trio', "
        "'starlette', 'httpx') or m.startswith(('wrapper.readers.web', 'wrapper.readers.roster', "
        "'wrapper.launch', 'sidecar.registry', 'guard.record')))); sys.exit(status)"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_readme_shows_the_tmux_line_and_the_waybar_module() -> None:
    import re

    readme = (REPO / "README.md").read_text()
    tmux = re.search(r"```tmux\n(.*?)```", readme, re.S)
    assert tmux is not None and "set -g status-right '#(hctx status" in tmux.group(1)
    template = re.search(r'#\(hctx status --format "(.*?)"\)', tmux.group(1))
    assert template is not None
    from wrapper.readers.status import format_problem

    assert format_problem(template.group(1)) is None  # the README's fields are ones it knows
    waybar = re.search(r"```json\n(.*?)```", readme, re.S)
    assert waybar is not None
    module = json.loads("{" + waybar.group(1) + "}")["custom/hctx"]
    assert module["exec"] == "hctx status --json" and module["return-type"] == "json"
