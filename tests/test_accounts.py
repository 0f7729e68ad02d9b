"""Accounts (issue 29): the key each harness's own login yields, the fan-in of an account's rate
limits across its agents, `hctx accounts`, the figure beside each agent, and the account series."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from readers_catalog import HOST, HOUR, MINUTE, NOW, hctx, put_record

from guard.account import Account, account_key, clean_label
from guard.record import parse_record
from sidecar.harnesses.claude.account import claude_account
from sidecar.harnesses.codex.account import codex_account
from tests.conftest import REPO
from tests.prometheus_tools import dead, exposition, parse
from wrapper.readers.accounts import fan_in, groups_by_agent
from wrapper.readers.render import render_accounts, render_agents, render_agents_json
from wrapper.readers.roster import collect_roster

FIXTURES = REPO / "fixtures" / "accounts"
CODEX_VERSIONS = ("0.151.0", "0.171.0")
CLAUDE_VERSIONS = ("2.1.250", "2.1.332")
K1 = account_key("claude", "uuid-1", "org-1")
K2 = account_key("claude", "uuid-2", "org-1")


def _messages(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the key, from what the real harnesses wrote and said ---------------------------------------


@pytest.mark.parametrize("version", CODEX_VERSIONS)
def test_codex_key_is_the_workspace_with_the_user_codex_states(version: str) -> None:
    keys = {seat: codex_account((FIXTURES / f"codex-{version}-seat-{seat}.auth.json").read_bytes()) for seat in "ABC"}
    a, b, c = keys["A"], keys["B"], keys["C"]
    assert a is not None and b is not None and c is not None
    assert a.key == b.key == account_key("codex", "acct-AAA", "user-111")  # one person, two seats
    assert c.key == account_key("codex", "acct-AAA", "user-222")
    assert c.key != a.key  # the workspace alone would have merged carol into alice's account
    assert a.key != account_key("codex", "acct-AAA")
    for seat in "ABC":
        read = next(m["result"] for m in _messages(FIXTURES / f"codex-{version}-seat-{seat}.jsonl") if m.get("id") == 2)
        email = read["account"]["email"]
        account = keys[seat]
        assert account is not None and account.label == "chatgpt · pro"
        assert email not in json.dumps(account.model_dump())  # never the email
        if version == "0.171.0":  # the ids the key is made of are the ones Codex states
            workspace, user = read["workspaceRouting"]["chatgptAccountId"], read["userId"]
            assert account.key == account_key("codex", workspace, user)
        else:
            assert "userId" not in read  # 0.151.0 states none: only auth.json has them


def test_codex_states_no_account_for_an_api_key_or_a_file_that_is_not_a_login() -> None:
    assert codex_account(b'{"auth_mode": "apikey", "OPENAI_API_KEY": "sk-fake"}') is None
    for junk in (b"", b"[]", b"{", b'{"tokens": {"account_id": "acct-AAA"}}', b'{"tokens": []}', b"\xff\xfe"):
        assert codex_account(junk) is None  # a workspace with no user is not an account
    auth = json.loads((FIXTURES / "codex-0.171.0-seat-A.auth.json").read_text())
    auth["tokens"]["account_id"] = "acct\x1b[31m"  # an id no harness issued
    auth["tokens"]["id_token"] = "x.y"  # and no claims to fall back on
    assert codex_account(json.dumps(auth).encode()) is None


@pytest.mark.parametrize("version", CLAUDE_VERSIONS)
def test_claude_key_is_the_config_dirs_account_and_organization(version: str) -> None:
    keys = {
        seat: claude_account((FIXTURES / f"claude-{version}-seat-{seat}.claude.json").read_bytes(), "~/claude-x", "max")
        for seat in "ABC"
    }
    a, b, c = keys["A"], keys["B"], keys["C"]
    assert a is not None and b is not None and c is not None
    assert a.key == b.key != c.key
    assert a.label == "claude · max · ~/claude-x"
    stored = json.loads((FIXTURES / f"claude-{version}-seat-A.claude.json").read_text())["oauthAccount"]
    assert a.key == account_key("claude", stored["accountUuid"], stored["organizationUuid"])
    assert stored["emailAddress"] not in json.dumps(a.model_dump())
    assert claude_account(b'{"hasCompletedOnboarding": true}') is None  # an API-key seat
    assert claude_account(b'{"oauthAccount": {"accountUuid": "u"}}') is None  # no organization: no key


def test_a_label_is_printable_and_short_whatever_it_was() -> None:
    assert clean_label("pro\x1b[2J\x07 · ~/.codex") == "pro?[2J? · ~/.codex"
    long = clean_label("x" * 10_000)
    assert long is not None and len(long) == 64 and long.endswith("…")
    assert clean_label(42) is None and clean_label("") is None


@pytest.mark.parametrize(
    ("where", "email"),
    [("~/.claude-alice@example.com", "alice@example.com"), ("/srv/bob.smith@corp.example/.codex", "bob.smith@corp"),
     ("~/x@y", "x@y")],
)  # fmt: skip
def test_an_email_in_the_config_directorys_name_never_reaches_the_label(where: str, email: str, tmp_path: Path) -> None:
    """Issue 40: a config directory named after its login (`~/.claude-alice@example.com`) kept
    the email in the label, hence in the record and every reader's output."""
    claude = claude_account((FIXTURES / "claude-2.1.332-seat-A.claude.json").read_bytes(), where, "max")
    codex = codex_account((FIXTURES / "codex-0.171.0-seat-A.auth.json").read_bytes(), where)
    for account in (claude, codex):
        assert account is not None and account.label is not None
        assert "@" not in account.label and "(email)" in account.label, account.label
    # A record that carries one anyway (written by another build) is listed without it.
    put_record(tmp_path, "seat", account={"key": K1, "label": f"claude · {where}"})
    for command in (("agents",), ("accounts",), ("agents", "--json")):
        shown = hctx(*command, "--catalog", str(tmp_path)).stdout
        assert "@" not in shown and email not in shown, (command, shown)


# --- the record ---------------------------------------------------------------------------------


def _account_record(tmp_path: Path, identity: str, key: str | None, label: Any, observed: int, **fields: Any) -> None:
    account = None if key is None else {"key": key, "label": label}
    put_record(tmp_path, identity, account=account, observedAtMs=observed, writtenAtMs=observed, **fields)


def test_the_account_is_additive_and_a_bad_one_never_refuses_the_numbers(tmp_path: Path) -> None:
    _account_record(tmp_path, "a", K1, "claude · max", NOW - 5000, rateLimitResetsAtMs={"fiveHour": NOW + HOUR})
    record = parse_record((tmp_path / "agents" / HOST / "a" / "harness-context").read_bytes())
    assert record.account == Account(key=K1, label="claude · max")
    assert record.rate_limit_resets_at_ms is not None and record.rate_limit_resets_at_ms.five_hour == NOW + HOUR
    out = json.loads(record.to_json())
    assert out["account"] == {"key": K1, "label": "claude · max"}
    for bad in ({"key": "alice@example.com"}, {"key": K1.upper()}, "K1", [K1], {"label": "x"}):
        raw = json.loads(record.to_json()) | {"account": bad, "rateLimitResetsAtMs": {"fiveHour": -1}}
        reread = parse_record(json.dumps(raw))
        assert reread.account is None and reread.rate_limit_resets_at_ms is None
        assert reread.used_tokens == 92283  # the fill is read as before


# --- the fan-in ---------------------------------------------------------------------------------


def _fleet(tmp_path: Path) -> None:
    """a and b share K1 (b's snapshot newer), c is on K2, d states no account, p reports no limits."""
    _account_record(tmp_path, "a", K1, "claude · max · ~/claude-a", NOW - 4 * MINUTE,
                    rateLimits={"fiveHour": 80, "sevenDay": 30},
                    rateLimitResetsAtMs={"fiveHour": NOW + 2 * HOUR, "sevenDay": NOW + 72 * HOUR})  # fmt: skip
    _account_record(tmp_path, "b", K1, "claude · max · ~/claude-b", NOW - 1 * MINUTE,
                    rateLimits={"fiveHour": 85, "sevenDay": None},
                    rateLimitResetsAtMs={"fiveHour": NOW + 2 * HOUR})  # fmt: skip
    _account_record(tmp_path, "c", K2, "claude · pro", NOW - 2 * MINUTE, rateLimits={"fiveHour": 10, "sevenDay": 15})
    _account_record(tmp_path, "d", None, None, NOW - 3 * MINUTE, rateLimits={"fiveHour": 13, "sevenDay": 44})
    _account_record(tmp_path, "p", None, None, NOW - 3 * MINUTE, harness="pi", rateLimits=None)


def test_the_fan_in_is_the_newest_snapshot_per_account_and_window(tmp_path: Path) -> None:
    _fleet(tmp_path)
    rows = collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows
    groups = fan_in(rows)
    assert [(g.key, [r.identity for r in g.agents]) for g in groups] == [
        (K1, ["a", "b"]), (K2, ["c"]), (None, ["d"]),
    ]  # fmt: skip
    shared = groups[0]
    assert shared.label == "claude · max · ~/claude-b"  # the newest agent's
    five, seven = shared.windows["fiveHour"], shared.windows["sevenDay"]
    assert (five.used_percent, five.source.identity, five.age_ms) == (85, "b", MINUTE)  # not a's older 80
    assert (seven.used_percent, seven.source.identity) == (30, "a")  # b has no seven-day window: a's stands
    assert five.resets_at_ms == NOW + 2 * HOUR
    wire = shared.wire(NOW)
    assert wire["agentCount"] == 2 and wire["agents"] == [f"{HOST}/a", f"{HOST}/b"]
    assert wire["rateLimits"]["fiveHour"] == {
        "usedPercent": 85, "resetsAtMs": NOW + 2 * HOUR, "resetPassed": False, "observedAtMs": NOW - MINUTE,
        "ageMs": MINUTE, "stale": False, "agent": f"{HOST}/b",
    }  # fmt: skip
    # Beside each agent: the account's figure, marked where it came from a newer agent's snapshot.
    table = render_agents(rows, colour=False, now=NOW).splitlines()
    assert table[0].split()[-1] == "LIMITS"
    line_of = {line.split()[1]: line for line in table[1:]}
    assert line_of["a"].endswith("5h 85%* 7d 30%")
    assert line_of["b"].endswith("5h 85% 7d 30%*")
    assert line_of["p"].endswith(" -")
    agents = {item["identity"]: item for item in json.loads(render_agents_json(rows, now=NOW))}
    assert agents["a"]["accountRateLimits"]["fiveHour"]["fromAnotherAgent"] is True
    assert agents["b"]["accountRateLimits"]["fiveHour"]["fromAnotherAgent"] is False
    assert agents["a"]["context"]["rateLimits"]["fiveHour"] == 80  # the agent's own snapshot stays its own
    assert agents["p"]["accountRateLimits"] is None


def test_hctx_accounts_human_and_json(tmp_path: Path) -> None:
    _fleet(tmp_path)
    done = hctx("accounts", "--json", "--catalog", str(tmp_path), "--host", HOST)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[\n") and len(done.stdout.splitlines()) == 5  # one array, an object a line
    listed = json.loads(done.stdout)
    assert [item["account"] for item in listed] == [K1, K2, None]
    assert listed[0]["rateLimits"]["fiveHour"]["usedPercent"] == 85 and listed[0]["agentCount"] == 2
    human = hctx("accounts", "--catalog", str(tmp_path), "--host", HOST)
    lines = human.stdout.splitlines()
    assert lines[0].split() == ["ACCOUNT", "LABEL", "WINDOW", "USED", "RESETS", "RUNS", "OUT", "AGE", "FROM", "AGENTS"]
    assert any(K1[:12] in line and " 5h " in line and "85%" in line and f"{HOST}/b" in line for line in lines)
    assert any("(no account stated)" in line and f"{HOST}/d" in line for line in lines)
    missing = hctx("accounts", "--catalog", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and not missing.stdout


def test_resets_are_shown_and_a_passed_one_is_said(tmp_path: Path) -> None:
    _account_record(tmp_path, "a", K1, "claude · max", NOW - MINUTE, rateLimits={"fiveHour": 97, "sevenDay": 50},
                    rateLimitResetsAtMs={"fiveHour": NOW - 5 * MINUTE, "sevenDay": NOW + 26 * HOUR})  # fmt: skip
    groups = fan_in(collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows)
    text = render_accounts(groups, NOW, colour=True)
    assert "passed 5m00s ago" in text and "in 26h00m" in text
    red = "\x1b[31m97%\x1b[0m"
    assert red not in text  # past its reset, 97% is not the account's state: not painted red
    assert groups[0].wire(NOW)["rateLimits"]["fiveHour"]["resetPassed"] is True


def test_hostile_labels_future_stamps_and_thousands_of_accounts(tmp_path: Path) -> None:
    _account_record(tmp_path, "evil", K1, "\x1b]0;pwned\x07" + "y" * 10_000, NOW - MINUTE,
                    rateLimits={"fiveHour": 40, "sevenDay": None})  # fmt: skip
    # Stamped an hour ahead: read as absent, so its 99% is never the account's newest figure.
    _account_record(tmp_path, "ahead", K1, "claude", NOW + HOUR, rateLimits={"fiveHour": 99, "sevenDay": 99})
    (group,) = fan_in(collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows)
    assert group.windows["fiveHour"].used_percent == 40 and group.label is not None
    assert len(group.label) == 64 and "\x1b" not in group.label and "\x07" not in group.label
    assert [row.identity for row in group.agents] == ["evil"]  # a record read as absent names no account either
    text = render_accounts([group], NOW, colour=False)
    assert "\x1b" not in text and "99%" not in text

    many = tmp_path / "many"
    stamp = int(time.time() * 1000) - MINUTE
    for index in range(3000):
        key = account_key("codex", f"acct-{index // 2}", "user")
        _account_record(many, f"a{index:04d}", key, f"seat {index}", stamp + index,
                        rateLimits={"fiveHour": index % 101, "sevenDay": None})  # fmt: skip
    done = hctx("accounts", "--json", "--catalog", str(many), "--host", HOST, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert len(listed) == 1500 and all(item["agentCount"] == 2 for item in listed)
    by_key = {item["account"]: item for item in listed}
    newest = by_key[account_key("codex", "acct-7", "user")]["rateLimits"]["fiveHour"]
    assert newest["agent"] == f"{HOST}/a0015" and newest["usedPercent"] == 15


def test_the_account_series_are_the_fan_in_keyed_never_labelled(tmp_path: Path) -> None:
    _fleet(tmp_path)
    samples = parse(exposition(tmp_path, NOW, HOST))
    account = {
        (name, dict(labels).get("account"), dict(labels).get("window")): value
        for (name, labels), value in samples.items()
        if name.startswith("hctx_account_")
    }
    assert account[("hctx_account_rate_limit_used_percent", K1, "five_hour")] == 85  # b's, not a's 80
    assert account[("hctx_account_rate_limit_used_percent", K1, "seven_day")] == 30
    assert account[("hctx_account_rate_limit_observed_timestamp_seconds", K1, "five_hour")] == (NOW - MINUTE) / 1000
    assert account[("hctx_account_rate_limit_resets_timestamp_seconds", K1, "five_hour")] == (NOW + 2 * HOUR) / 1000
    assert ("hctx_account_rate_limit_resets_timestamp_seconds", K2, "five_hour") not in account  # none stated
    assert account[("hctx_account_agents", K1, None)] == 2
    assert {key for _, key, _ in account} == {K1, K2}  # an agent stating no account has no account series
    assert not any("claude · max" in str(labels) for _, labels in samples)  # the key, never the label


def test_a_snapshot_is_ordered_and_aged_by_when_its_figure_arrived(tmp_path: Path) -> None:
    """Issue 35: a's reading is the freshest (an idle redraw a second ago) but its 80 arrived twenty
    minutes ago; b's 85 arrived four minutes ago in an older reading. `accounts`, the figure beside
    each agent and the account series all take b's, aged by its arrival; a Codex-style restatement
    (limits arriving after the reading that carries them) is aged by the limits."""
    _account_record(tmp_path, "a", K1, "claude · max", NOW - 1000, rateLimits={"fiveHour": 80, "sevenDay": 30},
                    rateLimitsAtMs={"fiveHour": NOW - 20 * MINUTE, "sevenDay": NOW - 20 * MINUTE})  # fmt: skip
    put_record(tmp_path, "b", account={"key": K1, "label": "claude · max"}, observedAtMs=NOW - 5 * MINUTE,
               writtenAtMs=NOW - 4 * MINUTE, rateLimits={"fiveHour": 85, "sevenDay": None},
               rateLimitsAtMs={"fiveHour": NOW - 4 * MINUTE, "sevenDay": None})  # limits after the reading  # fmt: skip
    rows = collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows
    (group,) = fan_in(rows)
    five, seven = group.windows["fiveHour"], group.windows["sevenDay"]
    assert (five.used_percent, five.source.identity, five.observed_at_ms, five.age_ms) == (
        85, "b", NOW - 4 * MINUTE, 4 * MINUTE,
    )  # fmt: skip
    assert (seven.used_percent, seven.age_ms) == (30, 20 * MINUTE)  # a's, as old as its figure
    agents = {item["identity"]: item for item in json.loads(render_agents_json(rows, now=NOW))}
    assert agents["a"]["accountRateLimits"]["fiveHour"]["fromAnotherAgent"] is True
    samples = parse(exposition(tmp_path, NOW, HOST))
    assert samples[("hctx_account_rate_limit_used_percent", (("account", K1), ("window", "five_hour")))] == 85
    observed = ("hctx_account_rate_limit_observed_timestamp_seconds", (("account", K1), ("window", "five_hour")))
    assert samples[observed] == (NOW - 4 * MINUTE) / 1000
    _account_record(tmp_path, "a", K1, "claude · max", NOW - 3 * HOUR, rateLimits={"fiveHour": 90, "sevenDay": None},
                    rateLimitsAtMs={"fiveHour": NOW - MINUTE})  # fmt: skip
    (group,) = fan_in(collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows)
    five = group.windows["fiveHour"]
    assert (five.used_percent, five.age_ms, five.stale) == (90, MINUTE, False)
    # A planted arrival past the clock's skew bound would pin its figure as the newest: its reading dates it.
    _account_record(tmp_path, "a", K1, "claude · max", NOW - 3 * HOUR, rateLimits={"fiveHour": 99, "sevenDay": None},
                    rateLimitsAtMs={"fiveHour": NOW + 10 * HOUR})  # fmt: skip
    (group,) = fan_in(collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows)
    five = group.windows["fiveHour"]
    assert (five.used_percent, five.source.identity) == (85, "b")
    assert (
        parse(exposition(tmp_path, NOW, HOST))[
            ("hctx_account_rate_limit_used_percent", (("account", K1), ("window", "five_hour")))
        ]
        == 85
    )  # the series likewise: a figure cannot arrive after the record holding it was written


def test_groups_by_agent_names_every_member(tmp_path: Path) -> None:
    _fleet(tmp_path)
    groups = groups_by_agent(fan_in(collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows))
    assert groups[f"{HOST}/a"] is groups[f"{HOST}/b"] and f"{HOST}/p" not in groups
