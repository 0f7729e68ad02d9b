"""`hctx watch`'s `rate-limit-forecast` event (issue 39): once when an account's window runs out more
than --forecast-margin before its reset at the fleet's pace, re-armed when it no longer does or the
window resets, remembered across restarts."""

from __future__ import annotations

import os
import time
from pathlib import Path

from readers_catalog import HOST, HOUR, MINUTE
from test_account_watch import KEY, seat
from test_watch import _lines, _stop, _wait, _watch

from wrapper.readers.forecast_watch import ForecastEvent, ForecastWatch, dump_forecast_state, load_forecast_state
from wrapper.readers.watch import StateFile, observe

NOW = 1_788_000_000_000
MARGIN_MS = 15 * MINUTE


class Watch:
    """The companion as `follow` runs it: history kept, state carried, saved in the watch directory."""

    def __init__(self, catalog: Path, margin_s: float = MARGIN_MS / 1000) -> None:
        self.catalog = catalog
        state_file = StateFile(catalog, "default")
        self.companion = ForecastWatch(state_file, margin_s)
        (catalog / ".st2" / "watch").mkdir(parents=True, exist_ok=True)
        self.dir_fd = os.open(catalog / ".st2" / "watch", os.O_RDONLY)
        self.companion.load(self.dir_fd)

    def read(self, now: int) -> list[tuple[str | None, str, int | None]]:
        snapshot, _ = observe(self.catalog, now, here=HOST)
        events = self.companion.step(self.dir_fd, snapshot, now, partial=False)
        out = []
        for event in events:
            assert isinstance(event, ForecastEvent) and event.forecast is not None
            out.append((event.wire()["account"], event.window, event.forecast.exhausted_at_ms))
        return out

    def close(self) -> None:
        os.close(self.dir_fd)


def test_fires_once_when_the_pace_runs_out_before_the_reset_and_re_arms(tmp_path: Path) -> None:
    watch = Watch(tmp_path)
    resets = NOW + 2 * HOUR
    seat(tmp_path, "a", 40, NOW - 20 * MINUTE, resets=resets)
    assert watch.read(NOW - 20 * MINUTE + 1000) == []  # one snapshot: no forecast
    seat(tmp_path, "b", 50, NOW - 10 * MINUTE, resets=resets)  # 60%/h: 100% at NOW+40m, 80m before the reset
    assert watch.read(NOW - 10 * MINUTE + 1000) == [(KEY, "fiveHour", NOW + 40 * MINUTE)]
    seat(tmp_path, "a", 60, NOW, resets=resets)  # still early: told once, not again
    assert watch.read(NOW + 1000) == []
    # A restart remembers it (the state file, and the history beside it).
    watch.close()
    restarted = Watch(tmp_path)
    assert restarted.read(NOW + 2000) == []
    # The pace slows: flat for the last hour, so no longer before the reset: re-armed, nothing told.
    for minute in (70, 80, 90, 100, 110, 120):
        seat(tmp_path, "a" if minute % 20 else "b", 60, NOW + minute * MINUTE - 60 * MINUTE, resets=resets)
        assert restarted.read(NOW + minute * MINUTE - 60 * MINUTE + 1000) == []
    assert restarted.companion.state[f"account:{KEY}/fiveHour"].fired is False
    # And it speeds up again: told again.
    seat(tmp_path, "b", 90, NOW + HOUR + 5 * MINUTE, resets=resets)
    told = restarted.read(NOW + HOUR + 5 * MINUTE + 1000)
    assert [(key, window) for key, window, _ in told] == [(KEY, "fiveHour")]
    restarted.close()


def test_the_margin_holds_it_back_and_a_window_without_reset_never_fires(tmp_path: Path) -> None:
    resets = NOW + 50 * MINUTE  # 100% at NOW+40m: only 10 minutes before the reset
    seat(tmp_path, "a", 40, NOW - 20 * MINUTE, resets=resets)
    seat(tmp_path, "b", 60, NOW, resets=resets)
    watch = Watch(tmp_path)
    assert watch.read(NOW + 1000) == []  # within the 15-minute margin
    watch.close()
    narrow = Watch(tmp_path / "narrow", margin_s=5 * 60)
    seat(tmp_path / "narrow", "a", 40, NOW - 20 * MINUTE, resets=resets)
    seat(tmp_path / "narrow", "b", 60, NOW, resets=resets)
    assert narrow.read(NOW + 1000) == [(KEY, "fiveHour", NOW + 40 * MINUTE)]
    narrow.close()
    unstated = Watch(tmp_path / "unstated")
    seat(tmp_path / "unstated", "a", 40, NOW - 20 * MINUTE)
    seat(tmp_path / "unstated", "b", 60, NOW)
    assert unstated.read(NOW + 1000) == []  # no reset stated: nothing to be early against
    unstated.close()


def test_the_wire_and_the_state_file(tmp_path: Path) -> None:
    seat(tmp_path, "a", 40, NOW - 20 * MINUTE, resets=NOW + 2 * HOUR)
    seat(tmp_path, "b", 60, NOW, resets=NOW + 2 * HOUR)
    watch = Watch(tmp_path)
    snapshot, _ = observe(tmp_path, NOW, here=HOST)
    (event,) = watch.companion.step(watch.dir_fd, snapshot, NOW, partial=False)
    wire = event.wire()
    assert wire["event"] == "rate-limit-forecast" and wire["agent"] == "b" and wire["agents"] == 2
    assert wire["exhaustedAtMs"] == NOW + 40 * MINUTE and wire["resetsAtMs"] == NOW + 2 * HOUR
    assert (wire["points"], wire["spanMs"], wire["marginMs"]) == (2, 20 * MINUTE, MARGIN_MS)
    assert wire["message"] == (
        "chatgpt · pro: five-hour rate limit runs out in 40m00s at the pace of its 2 agents "
        "(60.0%/h over 20m00s, 2 snapshots), 1h20m before it resets"
    )
    assert event.env()["HCTX_EXHAUSTED_AT_MS"] == str(NOW + 40 * MINUTE)
    saved = (tmp_path / ".st2" / "watch" / "default.forecast.json").read_bytes()
    assert load_forecast_state(saved) == watch.companion.state
    assert load_forecast_state(dump_forecast_state(watch.companion.state)) == watch.companion.state
    watch.close()


def test_the_command_tells_it_once_across_restarts(tmp_path: Path) -> None:
    catalog, got = tmp_path / "catalog", tmp_path / "got.jsonl"
    now = time.time_ns() // 1_000_000
    seat(catalog, "a", 40, now - 20 * MINUTE, resets=now + 2 * HOUR)
    seat(catalog, "b", 60, now - 1000, resets=now + 2 * HOUR)
    args = ("--exec", f"cat >> {got}", "--at", "1000", "--rate-limit-at", "99", "--reread", "600")
    watch = _watch(catalog, *args)
    try:
        _wait(lambda: len(_lines(got)) == 1)
    finally:
        _stop(watch)
    (told,) = _lines(got)
    assert told["event"] == "rate-limit-forecast" and told["account"] == KEY and told["points"] == 2
    again = _watch(catalog, *args, "--reread", "1")
    try:
        time.sleep(3)
    finally:
        _stop(again)
    assert len(_lines(got)) == 1  # remembered: not told again
    bad = _watch(catalog, "--forecast-margin", "-3")
    _, err = bad.communicate(timeout=30)
    assert bad.returncode == 2 and "not a number of minutes" in err


def test_a_notification_names_the_window_that_runs_out(tmp_path: Path) -> None:
    from wrapper.readers.notify import notice_of

    seat(tmp_path, "a", 40, NOW - 20 * MINUTE, resets=NOW + 2 * HOUR)
    seat(tmp_path, "b", 60, NOW, resets=NOW + 2 * HOUR)
    watch = Watch(tmp_path)
    snapshot, _ = observe(tmp_path, NOW, here=HOST)
    (event,) = watch.companion.step(watch.dir_fd, snapshot, NOW, partial=False)
    notice = notice_of(event)
    assert notice.title == "b: rate limit runs out before its reset, 60% used"
    assert "fill 60% · five-hour window of chatgpt · pro" in notice.body and "runs out in 40m00s" in notice.body
    watch.close()
