"""`hctx watch`'s `rate-limit` event (issue 29): once per account, window and crossing, across every
agent sharing the account; re-armed by a falling percent or a passed reset; silent on a stale
snapshot; remembered across restarts."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from readers_catalog import HOST, HOUR, MINUTE, put_record
from test_watch import _lines, _wait, _watch

from guard.account import account_key
from wrapper.readers.account_watch import (
    AccountWatch,
    RateLimitEvent,
    WindowSeen,
    account_step,
    dump_account_state,
    load_account_state,
)
from wrapper.readers.roster import RosterCache
from wrapper.readers.watch import Event, StateFile, observe

NOW = 1_788_000_000_000
KEY = account_key("codex", "acct-AAA", "user-111")
OTHER = account_key("codex", "acct-AAA", "user-222")
AT = (80.0, 95.0)


def seat(catalog: Path, identity: str, five_hour: float | None, observed: int, *, key: str | None = KEY,
         resets: int | None = None, seven_day: float | None = None) -> None:  # fmt: skip
    put_record(
        catalog, identity, incarnation=f"inc-{identity}", observedAtMs=observed, writtenAtMs=observed, compactions=0,
        rateLimits={"fiveHour": five_hour, "sevenDay": seven_day},
        rateLimitResetsAtMs=None if resets is None else {"fiveHour": resets},
        account=None if key is None else {"key": key, "label": "chatgpt · pro"},
    )  # fmt: skip


class Watch:
    """The pure step over a catalog, as `follow` runs it, with the state carried between reads."""

    def __init__(self, catalog: Path) -> None:
        self.catalog = catalog
        self.state: dict[str, WindowSeen] = {}

    def read(self, now: int) -> list[tuple[str | None, str, float | None, str]]:
        snapshot, _ = observe(self.catalog, now, here=HOST)
        events, self.state = account_step(self.state, snapshot, now, AT)
        return [_told(event) for event in events]


def _told(event: Event) -> tuple[str | None, str, float | None, str]:
    assert isinstance(event, RateLimitEvent)
    wire = event.wire()
    return wire["account"], wire["window"], wire["threshold"], wire["agent"]


def test_two_seats_on_one_account_fire_once_per_crossing(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    seat(tmp_path, "a", 70, NOW - 3 * MINUTE)
    seat(tmp_path, "b", 72, NOW - 2 * MINUTE)
    assert watch.read(NOW) == []
    seat(tmp_path, "a", 81, NOW - MINUTE)  # a crosses 80: told once, from a
    assert watch.read(NOW) == [(KEY, "fiveHour", 80, "a")]
    seat(tmp_path, "b", 83, NOW)  # b's newer snapshot is past 80 too: the same crossing, not told again
    assert watch.read(NOW + 1000) == []
    seat(tmp_path, "a", 82, NOW - 10)  # a's own is older than b's: the account's figure is still b's
    assert watch.read(NOW + 2000) == []
    seat(tmp_path, "a", 96, NOW + 3000)
    assert watch.read(NOW + 4000) == [(KEY, "fiveHour", 95, "a")]
    seat(tmp_path, "c", 96, NOW + 3000, key=OTHER)  # another person of the workspace: another account
    assert watch.read(NOW + 5000) == [(OTHER, "fiveHour", 80, "c"), (OTHER, "fiveHour", 95, "c")]


def test_a_file_event_naming_one_seat_is_judged_across_every_seat(tmp_path: Path) -> None:
    """A file event's tick observes only the agents it named (`observe(only=...)`); the account's
    newest snapshot is still across all of its agents, so an older seat's event neither re-arms the
    crossing nor, on the next full re-read, tells it again."""
    seat(tmp_path, "a", 70, NOW - 3 * MINUTE)
    seat(tmp_path, "b", 85, NOW - 2 * MINUTE)
    state_file = StateFile(tmp_path, "default")
    watch, cache = AccountWatch(state_file, AT), RosterCache(tmp_path)
    with state_file.held() as dir_fd:
        full, _ = observe(tmp_path, NOW, here=HOST, cache=cache)
        assert [_told(event) for event in watch.step(dir_fd, full, NOW)] == [(KEY, "fiveHour", 80, "b")]
        seat(tmp_path, "a", 70, NOW - 150_000)  # a's record again, still older than b's 85
        named, _ = observe(tmp_path, NOW + 1000, here=HOST, cache=cache, only={(HOST, "a")})
        assert [observation.row.identity for observation in named] == ["a"]
        assert watch.step(dir_fd, named, NOW + 1000, partial=True) == []
        full, _ = observe(tmp_path, NOW + 2000, here=HOST, cache=cache)
        assert watch.step(dir_fd, full, NOW + 2000) == []  # not re-armed by a's older 70: nothing again


def test_a_falling_percent_rearms_and_a_stale_snapshot_fires_nothing(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    seat(tmp_path, "a", 85, NOW)
    assert watch.read(NOW) == [(KEY, "fiveHour", 80, "a")]
    seat(tmp_path, "a", 60, NOW + MINUTE)
    assert watch.read(NOW + MINUTE) == []
    seat(tmp_path, "a", 85, NOW + 2 * MINUTE)
    assert watch.read(NOW + 2 * MINUTE) == [(KEY, "fiveHour", 80, "a")]  # re-armed by the 60
    seat(tmp_path, "a", 40, NOW)  # stale by the time it is read: neither re-arms nor fires
    assert watch.read(NOW + 2 * HOUR) == []
    seat(tmp_path, "a", 99, NOW)
    assert watch.read(NOW + 2 * HOUR) == []  # stale again: 99 an hour ago says nothing about now
    seat(tmp_path, "a", 86, NOW + 2 * HOUR)
    assert watch.read(NOW + 2 * HOUR) == []  # 80 still told (nothing re-armed it), 95 not reached


def test_a_passed_reset_rearms_and_a_snapshot_past_its_reset_fires_nothing(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    reset = NOW + 30 * MINUTE
    seat(tmp_path, "a", 90, NOW, resets=reset)
    assert watch.read(NOW) == [(KEY, "fiveHour", 80, "a")]
    # Past the reset, the same 90 no longer describes the account: nothing told, and armed again.
    assert watch.read(reset + MINUTE) == []
    assert watch.state[f"account:{KEY}/fiveHour"].fired == frozenset()
    seat(tmp_path, "a", 88, reset + 2 * MINUTE, resets=reset + 5 * HOUR)  # the new window, already at 88
    assert watch.read(reset + 2 * MINUTE) == [(KEY, "fiveHour", 80, "a")]


def test_the_reset_of_the_window_it_fired_in_rearms_on_its_own(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    seat(tmp_path, "a", 90, NOW, resets=NOW + MINUTE)
    assert watch.read(NOW) == [(KEY, "fiveHour", 80, "a")]
    seat(tmp_path, "a", 85, NOW + 2 * MINUTE, resets=NOW + 5 * HOUR)  # no reading fell below 80 meanwhile
    assert watch.read(NOW + 2 * MINUTE) == [(KEY, "fiveHour", 80, "a")]


def test_the_state_survives_a_restart_and_a_relaunch_empties_nothing(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    seat(tmp_path, "a", 85, NOW)
    assert watch.read(NOW) == [(KEY, "fiveHour", 80, "a")]
    restarted = Watch(tmp_path)
    restarted.state = load_account_state(dump_account_state(watch.state))
    assert restarted.read(NOW + 1000) == []
    (tmp_path / "agents" / HOST / "a" / "harness-context").unlink()  # a relaunch: no reading for a moment
    assert restarted.read(NOW + 2000) == []
    seat(tmp_path, "a", 86, NOW + 3000)
    assert restarted.read(NOW + 3000) == []  # the account was remembered while it had no agent
    (tmp_path / "agents" / HOST / "a" / "harness-context").unlink()
    restarted.read(NOW + 2 * HOUR)
    assert restarted.state == {}  # forgotten after the hour horizon


def test_an_agent_stating_no_account_is_its_own_group(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    seat(tmp_path, "a", 85, NOW, key=None)
    seat(tmp_path, "b", 85, NOW, key=None)
    assert watch.read(NOW) == [(None, "fiveHour", 80, "a"), (None, "fiveHour", 80, "b")]


def test_the_event_wire_env_and_message(tmp_path: Path) -> None:
    seat(tmp_path, "a", 81, NOW - MINUTE)
    seat(tmp_path, "b", 96.4, NOW, resets=NOW + 2 * HOUR + 13 * MINUTE)
    snapshot, _ = observe(tmp_path, NOW, here=HOST)
    (first, second), _ = account_step({}, snapshot, NOW, AT)
    wire = second.wire()
    assert wire == {
        "event": "rate-limit", "host": HOST, "agent": "b", "harness": "codex", "incarnation": "inc-b",
        "account": KEY, "accountLabel": "chatgpt · pro", "agents": 2, "window": "fiveHour", "threshold": 95,
        "usedPercent": 96.4, "resetsAtMs": NOW + 2 * HOUR + 13 * MINUTE, "observedAtMs": NOW, "ageMs": 0,
        "atMs": NOW,
        "message": "chatgpt · pro: five-hour rate limit 96% used, at or above 95%; resets in 2h13m "
                   "(newest of 2 agents: box/b, 0s old)",
    }  # fmt: skip
    env = second.env()
    assert env["HCTX_EVENT"] == "rate-limit" and env["HCTX_WINDOW"] == "fiveHour" and env["HCTX_ACCOUNT"] == KEY
    assert env["HCTX_ACCOUNT_LABEL"] == "chatgpt · pro" and env["HCTX_USED_PERCENT"] == "96.4"
    assert first.wire()["threshold"] == 80


def test_a_hostile_label_reaches_the_message_printable(tmp_path: Path) -> None:
    put_record(tmp_path, "a", observedAtMs=NOW, rateLimits={"fiveHour": 90, "sevenDay": None},
               account={"key": KEY, "label": "\x1b]2;owned\x07" + "z" * 10_000})  # fmt: skip
    snapshot, _ = observe(tmp_path, NOW, here=HOST)
    (event,), _ = account_step({}, snapshot, NOW, AT)
    message = event.wire()["message"]
    assert "\x1b" not in message and "\x07" not in message and len(message) < 300


# --- the command ---------------------------------------------------------------------------------


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return err


def test_the_command_tells_each_crossing_once_across_restarts_through_exec(tmp_path: Path) -> None:
    catalog, got = tmp_path / "catalog", tmp_path / "got.jsonl"
    now = time.time_ns() // 1_000_000
    seat(catalog, "a", 70, now - 2000)
    seat(catalog, "b", 81, now - 1000)  # fill events are not asked for: only rate limits reach the command
    script = f'cat >> {got}; printf "%s %s %s\\n" "$HCTX_EVENT" "$HCTX_WINDOW" "$HCTX_THRESHOLD" >> {got}.env'
    args = ("--exec", script, "--at", "1000", "--rate-limit-at", "80,90", "--reread", "600")
    watch = _watch(catalog, *args)
    try:
        _wait(lambda: len(_lines(got)) == 1)
    finally:
        _stop(watch)
    again = _watch(catalog, *args)  # restarted: nothing repeated
    try:
        time.sleep(2)
        seat(catalog, "a", 91, time.time_ns() // 1_000_000)
        _wait(lambda: len(_lines(got)) == 2)
        time.sleep(1)
    finally:
        _stop(again)
    told = _lines(got)
    assert [(e["agent"], e["window"], e["threshold"], e["agents"]) for e in told] == [
        ("b", "fiveHour", 80, 2), ("a", "fiveHour", 90, 2),
    ]  # fmt: skip
    assert (tmp_path / "got.jsonl.env").read_text().splitlines() == ["rate-limit fiveHour 80", "rate-limit fiveHour 90"]
    state = json.loads((catalog / ".st2" / "watch" / "default.accounts.json").read_text())
    assert state["schema"] == "hctx.watch-accounts.v1"
    assert state["windows"][f"account:{KEY}/fiveHour"]["fired"] == [80, 90]


def test_a_file_event_steps_only_the_accounts_of_the_agents_it_named(tmp_path: Path, monkeypatch: Any) -> None:
    """200 seats on another account and 100 agents stating none: a's event steps a's account (both
    its seats), nothing else, and an account an agent left is stepped too (issue 25: the watch's cost
    per event grew with the fleet)."""
    import wrapper.readers.account_watch as account_watch

    seat(tmp_path, "a", 70, NOW - 3 * MINUTE)
    seat(tmp_path, "b", 85, NOW - 2 * MINUTE)
    for n in range(200):
        seat(tmp_path, f"o{n:03d}", 10, NOW - MINUTE, key=OTHER)
    for n in range(100):
        seat(tmp_path, f"n{n:03d}", 10, NOW - MINUTE, key=None)
    stepped: list[list[str]] = []
    real = account_watch.account_step

    def counting(state: Any, snapshot: Any, *args: Any, **kwargs: Any) -> Any:
        rows = list(snapshot)
        stepped.append(sorted(observation.row.identity for observation in rows))
        return real(state, rows, *args, **kwargs)

    monkeypatch.setattr(account_watch, "account_step", counting)
    state_file = StateFile(tmp_path, "default")
    watch, cache = AccountWatch(state_file, AT), RosterCache(tmp_path)
    with state_file.held() as dir_fd:
        full, _ = observe(tmp_path, NOW, here=HOST, cache=cache)
        assert [_told(event) for event in watch.step(dir_fd, full, NOW)] == [(KEY, "fiveHour", 80, "b")]
        assert len(stepped[-1]) == 302
        seat(tmp_path, "a", 96, NOW)
        named, _ = observe(tmp_path, NOW + 1000, here=HOST, cache=cache, only={(HOST, "a")})
        assert [_told(event) for event in watch.step(dir_fd, named, NOW + 1000, partial=True)] == [
            (KEY, "fiveHour", 95, "a")
        ]
        assert stepped[-1] == ["a", "b"]
        seat(tmp_path, "b", 50, NOW + 1000, key=OTHER)  # b moves to the other account
        named, _ = observe(tmp_path, NOW + 2000, here=HOST, cache=cache, only={(HOST, "b")})
        watch.step(dir_fd, named, NOW + 2000, partial=True)
        assert stepped[-1] == sorted(["a", "b", *(f"o{n:03d}" for n in range(200))])
        assert f"{group_key_of(watch, 'a')}/fiveHour" in watch.state  # nothing forgotten by a partial step


def group_key_of(watch: AccountWatch, identity: str) -> str:
    from wrapper.readers.accounts import group_key

    return group_key(watch.held[f"{HOST}/{identity}"].row)


# --- issue 35: idle Claude seats beside a busy one, through the real producer ------------------------


def test_idle_seats_redrawing_old_limits_never_retell_a_crossing(tmp_path: Path) -> None:
    """The issue's run, on the captured 2.1.332 status line: seats a and b of one claude.ai account
    both heard 78% at T0; b's turn then moved it to 81%, while a idled, redrawing its 78% every 5 s
    (hctx's refreshInterval), its heartbeat writing that fresh reading every five minutes. Each
    record, as the sidecar writes it, is read as `hctx watch` and `hctx accounts` read it, every
    5 s: the account's figure is b's 81 from its turn on, and the 80% crossing is told once."""
    import copy

    from guard.account import Account
    from guard.policy import WriteGuard
    from sidecar.harnesses.claude.producer import ClaudeProducer
    from sidecar.pipeline import Pipeline
    from tests.test_claude_producer import T0, payloads, statusline
    from wrapper.readers.accounts import fan_in

    key = account_key("claude", "uuid-1", "org-1")
    turn = payloads("statusline-2.1.332-sonnet45-oauth.jsonl")[2]

    def limited(percent: float, api_ms: int) -> dict[str, Any]:
        payload = copy.deepcopy(turn)
        payload["rate_limits"]["five_hour"]["used_percentage"] = percent
        payload["cost"]["total_api_duration_ms"] = api_ms
        return payload

    account = Account(key=key, label="claude · max")
    seats = {name: Pipeline(ClaudeProducer(), WriteGuard(name, f"inc-{name}"), account) for name in "ab"}
    shown = {"a": limited(78, 100), "b": limited(78, 100)}
    watch, told, figures = Watch(tmp_path), [], set()
    beats = 0
    for step in range(0, 13 * MINUTE // 1000, 5):  # past two heartbeats of each seat
        now = T0 + step * 1000
        if step == 60:
            shown["b"] = limited(81, 900)  # b's turn: a new response, the account at 81%
        for name, pipeline in seats.items():
            for write in pipeline.feed(statusline(shown[name]), now):
                beats += write.reason == "heartbeat"
                put_record(tmp_path, name, raw=write.record.to_json().encode())
        told += watch.read(now)
        snapshot, _ = observe(tmp_path, now, here=HOST)
        (group,) = fan_in(observation.row for observation in snapshot)
        figures.add((step >= 60, group.windows["fiveHour"].used_percent))
    assert beats >= 4  # each seat's heartbeat wrote its redrawn reading at least twice
    assert told == [(key, "fiveHour", 80, "b")]
    assert figures == {(False, 78), (True, 81)}  # from b's turn on, always the figure the service gave last


def test_an_older_snapshot_left_newest_neither_rearms_nor_fires(tmp_path: Path) -> None:
    """The account's newest seat's record goes (a relaunch removes it until the first reading): the
    older seat's figure, newest now, says nothing new of the account; it must not re-arm the
    crossing, so the newest figure coming back is not told again."""
    watch = Watch(tmp_path)
    seat(tmp_path, "a", 78, NOW - 2 * MINUTE)
    path = put_record(tmp_path, "b", incarnation="inc-b", observedAtMs=NOW - MINUTE, writtenAtMs=NOW - MINUTE,
                      compactions=0, rateLimits={"fiveHour": 81, "sevenDay": None}, rateLimitResetsAtMs=None,
                      account={"key": KEY, "label": "chatgpt · pro"})  # fmt: skip
    assert watch.read(NOW) == [(KEY, "fiveHour", 80, "b")]
    kept = path.read_bytes()
    path.unlink()
    assert watch.read(NOW + 1000) == []
    path.write_bytes(kept)
    assert watch.read(NOW + 2000) == []
    seat(tmp_path, "a", 70, NOW + 3000)  # a newer figure below 80 re-arms, as before
    assert watch.read(NOW + 3000) == []
    seat(tmp_path, "a", 82, NOW + 4000)
    assert watch.read(NOW + 4000) == [(KEY, "fiveHour", 80, "a")]


def test_a_state_that_cannot_be_saved_is_said_and_the_events_still_go(tmp_path: Path, capsys: Any) -> None:
    """The companions' one save (`CompanionFile`): the account state's name taken by a directory,
    so its atomic replace fails; the crossing is told all the same and the failure said once."""
    seat(tmp_path, "a", 85, NOW)
    state_file = StateFile(tmp_path, "default")
    watch = AccountWatch(state_file, AT)
    with state_file.held() as dir_fd:
        watch.load(dir_fd)
        (tmp_path / ".st2" / "watch" / "default.accounts.json").mkdir()
        snapshot, _ = observe(tmp_path, NOW, here=HOST)
        assert [_told(event) for event in watch.step(dir_fd, snapshot, NOW)] == [(KEY, "fiveHour", 80, "a")]
    said = capsys.readouterr().err
    assert f"cannot save {tmp_path / '.st2' / 'watch' / 'default.accounts.json'}" in said, said
    assert "a restart may repeat these events" in said
    assert watch.state[f"account:{KEY}/fiveHour"].fired == frozenset({80.0})  # held in memory: not told again
