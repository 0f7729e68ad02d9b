"""The producer side of issue 29, on the real harnesses' captures (fixtures/accounts): the reset
times Codex and Claude state, the account the seat's own login states read at launch, and the
sidecar stamping it on every reading. Each asserts the number that must be published and the
wrong one that must not."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from guard.account import Account, account_key, read_account_file
from guard.policy import WriteGuard
from sidecar.app import stated_account
from sidecar.harnesses.claude.launch import seat_account as claude_seat_account
from sidecar.harnesses.codex.launch import prepare as codex_prepare
from sidecar.harnesses.codex.launch import seat_account as codex_seat_account
from sidecar.launching import LaunchPlan, account_json
from sidecar.pipeline import Pipeline
from sidecar.registry import spec_for
from sidecar.replay import replay_recording
from tests.conformance import chunks_of, recording_of
from tests.conftest import REPO
from wrapper.launch.resident import sidecar_argv
from wrapper.launch.spec import AgentRef, Incarnation

FIXTURES = REPO / "fixtures" / "accounts"


def _records(harness: str, capture: Path) -> list[dict[str, Any]]:
    """The records the capture's recording (fixtures/recordings/accounts/) replays to."""
    writes, _ = replay_recording(spec_for(harness), recording_of(capture))
    return [json.loads(write.record.to_json()) for write in writes]


def _pushed(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [m["params"]["rateLimits"] for m in lines if m.get("method") == "account/rateLimits/updated"]


@pytest.mark.parametrize("capture", ["codex-0.151.0-seat-A.jsonl", "codex-0.171.0-seat-D.jsonl"])
def test_codex_publishes_each_windows_reset_in_ms(capture: str) -> None:
    (pushed, *_) = _pushed(FIXTURES / capture)
    last = _records("codex", FIXTURES / capture)[-1]
    five, seven = pushed["primary"], pushed["secondary"]
    assert last["rateLimits"] == {"fiveHour": five["usedPercent"], "sevenDay": seven["usedPercent"]}
    assert last["rateLimitResetsAtMs"] == {"fiveHour": five["resetsAt"] * 1000, "sevenDay": seven["resetsAt"] * 1000}
    assert last["rateLimitResetsAtMs"]["fiveHour"] != five["resetsAt"]  # seconds would read as January 1970
    assert last["account"] is None  # replay is not a seat: no login was read


def test_a_codex_snapshot_without_a_reset_clears_the_held_one() -> None:
    from sidecar.harnesses.codex.events import RateLimitsUpdated, RateWindow
    from sidecar.harnesses.codex.producer import merged_resets

    stated = RateLimitsUpdated(primary=RateWindow(used_percent=10, window_minutes=300, resets_at_s=1_800_000_000),
                               secondary=None)  # fmt: skip
    held = merged_resets((None, None), stated)
    assert held == (1_800_000_000_000, None)
    unstated = RateLimitsUpdated(primary=RateWindow(used_percent=40, window_minutes=300), secondary=None)
    assert merged_resets(held, unstated) == (None, None)  # an old reset never rides a newer percent
    assert merged_resets(held, RateLimitsUpdated(primary=None, secondary=None)) == held  # sparse: says nothing


@pytest.mark.parametrize("version", ["2.1.250", "2.1.332"])
def test_claude_publishes_its_windows_and_their_resets(version: str) -> None:
    path = FIXTURES / f"statusline-{version}-seat-B.jsonl"
    stated = [json.loads(line)["rate_limits"] for line in path.read_text().splitlines() if '"rate_limits"' in line]
    last = _records("claude", path)[-1]
    assert last["rateLimits"] == {"fiveHour": 85, "sevenDay": 31}  # the header's 0.85 and 0.31, as Claude gave them
    assert last["rateLimits"]["fiveHour"] != 0.85
    resets = last["rateLimitResetsAtMs"]
    assert resets == {"fiveHour": stated[-1]["five_hour"]["resets_at"] * 1000,
                      "sevenDay": stated[-1]["seven_day"]["resets_at"] * 1000}  # fmt: skip


def test_claude_withholds_a_reset_it_could_not_have_stated() -> None:
    from sidecar.harnesses.claude.producer import ClaudeProducer, StatusLine
    from sidecar.harnesses.claude.producer import RateWindow as ClaudeWindow

    def line(resets_at: float | None) -> StatusLine:
        window = ClaudeWindow(used_percentage=50, resets_at=resets_at)
        return StatusLine(total_input_tokens=1000, context_window_size=200_000, used_percentage=1, measured=True,
                          model=None, cost_usd=None, five_hour=window, seven_day=None, version="2.1.332")  # fmt: skip

    now = 1_800_000_000_000
    for hostile in (1e308, -5.0, None):
        (reading,) = ClaudeProducer().feed(line(hostile), now)
        assert reading.fields.rate_limit_resets_at_ms is None
    (reading,) = ClaudeProducer().feed(line(now / 1000 + 60.4), now)
    assert reading.fields.rate_limit_resets_at_ms is not None
    assert reading.fields.rate_limit_resets_at_ms.five_hour == now + 60_400


# --- the seat's account, read at launch -----------------------------------------------------------


def test_the_codex_launch_reads_the_seats_auth_json(tmp_path: Path) -> None:
    home = tmp_path / "codex-a"
    home.mkdir()
    shutil.copy(FIXTURES / "codex-0.171.0-seat-A.auth.json", home / "auth.json")
    plan = LaunchPlan(harness="codex", argv=("codex", "app-server"), cwd=tmp_path, env={"CODEX_HOME": str(home)})
    account = codex_seat_account(plan)
    assert account == Account(key=account_key("codex", "acct-AAA", "user-111"), label=f"chatgpt · pro · {home}")
    prepared = codex_prepare(plan)
    assert prepared.account == account
    stated = account_json(prepared)
    assert stated is not None and "alice" not in stated  # the email never leaves auth.json
    begun = Incarnation(AgentRef(str(tmp_path), "h", "a"), "codex", "i", channel=str(tmp_path / "s"), account=stated)
    argv = sidecar_argv(begun, 3, 4)
    assert argv[argv.index("--account") + 1] == stated  # every sidecar of the seat is started with it
    # Sessionless launches carry nothing, an API-key login no account.
    assert codex_prepare(LaunchPlan(harness="codex", argv=("codex", "login"), cwd=tmp_path,
                                    env={"CODEX_HOME": str(home)})).account is None  # fmt: skip
    (home / "auth.json").write_text('{"auth_mode": "apikey", "OPENAI_API_KEY": "sk-fake"}')
    assert codex_seat_account(plan) is None


def test_a_seat_counts_toward_its_account_from_its_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a Codex seat writes no record until its first token usage, yet the wrapper knows its
    account when it plans the launch. The claim names it then, so `hctx accounts` counts the seat
    with the one of the same login that already reported: two agents, not one."""
    from readers_catalog import NOW, put_record

    from guard.layout import AgentDir
    from guard.state import AgentLock, read_state
    from tests.prometheus_tools import exposition, parse
    from wrapper.launch.launcher import WrapOptions, begin_incarnation, claim
    from wrapper.readers.accounts import fan_in
    from wrapper.readers.roster import collect_roster

    home = tmp_path / "codex-a"
    home.mkdir()
    shutil.copy(FIXTURES / "codex-0.171.0-seat-A.auth.json", home / "auth.json")
    monkeypatch.setenv("CODEX_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    catalog = tmp_path / "catalog"
    agent = AgentDir(catalog, "box", "codex-a")
    options = WrapOptions(agent=agent, harness="codex", argv=("codex", "app-server"))
    incarnation = claim(options, AgentLock(agent))
    begun = begin_incarnation(options, incarnation, os.getpid())
    key = account_key("codex", "acct-AAA", "user-111")
    stated = read_state(agent)
    assert stated is not None and stated.account is not None and stated.account.key == key
    assert begun.account == stated.account.model_dump_json()  # the one the sidecar is given
    put_record(catalog, "codex-b", host="box", account={"key": key, "label": "chatgpt · pro"},
               rateLimits={"fiveHour": 23, "sevenDay": 61}, observedAtMs=NOW, writtenAtMs=NOW)  # fmt: skip
    (group,) = fan_in(collect_roster(catalog, NOW, here="box").rows)
    assert (group.key, [row.identity for row in group.agents]) == (key, ["codex-a", "codex-b"])
    samples = parse(exposition(catalog, NOW, "box"))
    assert samples[("hctx_account_agents", (("account", key),))] == 2  # the account series count it too


def test_the_claude_launch_reads_the_config_dir_then_the_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "claude-work"
    config.mkdir()
    shutil.copy(FIXTURES / "claude-2.1.332-seat-A.claude.json", config / ".claude.json")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("CLAUDE_CONFIG_DIR", "CLAUDE_CODE_ACCOUNT_UUID", "CLAUDE_CODE_ORGANIZATION_UUID",
                 "CLAUDE_CODE_USER_EMAIL", "CLAUDE_CODE_SUBSCRIPTION_TYPE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    env = {"CLAUDE_CONFIG_DIR": str(config), "CLAUDE_CODE_SUBSCRIPTION_TYPE": "max"}
    plan = LaunchPlan(harness="claude", argv=("claude",), cwd=tmp_path, env=env)
    stored = json.loads((config / ".claude.json").read_text())["oauthAccount"]
    expected = account_key("claude", stored["accountUuid"], stored["organizationUuid"])
    assert claude_seat_account(plan) == Account(key=expected, label="claude · max · ~/claude-work")
    # No stored account: Claude's own env seeding (all three, as Claude requires), else none.
    (config / ".claude.json").write_text('{"hasCompletedOnboarding": true}')
    seeded = {**env, "CLAUDE_CODE_ACCOUNT_UUID": "u-1", "CLAUDE_CODE_ORGANIZATION_UUID": "o-1"}
    assert claude_seat_account(LaunchPlan(harness="claude", argv=("claude",), cwd=tmp_path, env=seeded)) is None
    seeded["CLAUDE_CODE_USER_EMAIL"] = "a@example.com"
    account = claude_seat_account(LaunchPlan(harness="claude", argv=("claude",), cwd=tmp_path, env=seeded))
    assert account is not None and account.key == account_key("claude", "u-1", "o-1")
    # The default config: ~/.claude.json.
    shutil.copy(FIXTURES / "claude-2.1.332-seat-C.claude.json", tmp_path / ".claude.json")
    default = claude_seat_account(LaunchPlan(harness="claude", argv=("claude",), cwd=tmp_path))
    assert default is not None and default.label == "claude · ~" and default.key != expected


def test_an_account_file_that_is_not_a_file_states_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "auth.json"
    os.mkfifo(fifo)
    assert read_account_file(str(fifo)) is None  # never blocks on a FIFO
    (tmp_path / "big.json").write_bytes(b" " * (5 * 1024 * 1024))
    assert read_account_file(str(tmp_path / "big.json")) is None
    os.symlink(tmp_path / "big.json", tmp_path / "link.json")
    assert read_account_file(str(tmp_path / "link.json")) is None
    assert read_account_file(str(tmp_path / "absent.json")) is None


# --- the sidecar stamps it --------------------------------------------------------------------------


def test_every_reading_the_sidecar_writes_carries_the_seats_account() -> None:
    account = Account(key=account_key("claude", "u", "o"), label="claude · max")
    spec = spec_for("claude")
    pipeline = Pipeline(spec.make_producer(), WriteGuard("a", "i"), stated_account(account.model_dump_json()))
    decoder = spec.decoder(next(iter(spec.wires())))
    writes = []
    for chunk in chunks_of(recording_of(FIXTURES / "statusline-2.1.332-seat-B.jsonl")):
        for event in decoder.receive_data(chunk.data):
            writes.extend(pipeline.feed(event, chunk.at_ms or 1_796_000_000_000))
    assert writes and all(write.record.account == account for write in writes)
    assert json.loads(writes[-1].record.to_json())["account"] == {"key": account.key, "label": "claude · max"}
    assert stated_account("") is None
    assert stated_account('{"key": "alice@example.com"}') is None  # refused, logged: readings go out without
