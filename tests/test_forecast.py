"""When does the account run out (issue 39): the sans-I/O forecast, the host-local history, and
series with known answers through the readers."""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing
import os
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from readers_catalog import HOST, HOUR, MINUTE, NOW, hctx, put_record

from guard.account import account_key
from tests.prometheus_tools import dead, exporter_of, parse, require_tool
from wrapper.readers.accounts import fan_in
from wrapper.readers.forecast import Forecast, Point, forecast, point_order
from wrapper.readers.metrics import exposition as render
from wrapper.readers.rate_history import HISTORY_DIR_NAME, KEEP_MS, MAX_POINTS, Sighting, keep, keep_groups, merge
from wrapper.readers.render import render_accounts
from wrapper.readers.roster import collect_roster

FIVE_H = 5 * HOUR
K1 = account_key("claude", "uuid-1", "org-1")


def _line(start: int, count: int, step_ms: int, first: float, per_step: float, resets: int | None) -> list[Point]:
    return [Point(start + i * step_ms, first + i * per_step, resets) for i in range(count)]


# --- the forecast: known answers ----------------------------------------------------------------


def test_a_linear_series_runs_out_where_the_line_reaches_100() -> None:
    # 10% at NOW-50m, +1% every 5 minutes: 12%/h; the newest, 20% at NOW, is 80 points from 100.
    points = _line(NOW - 50 * MINUTE, 11, 5 * MINUTE, 10, 1, NOW + 8 * HOUR)
    got = forecast(points, NOW, horizon_ms=FIVE_H)
    assert got.status == "runs-out" and got.reason is None
    assert got.percent_per_hour == pytest.approx(12)
    assert got.exhausted_at_ms == pytest.approx(NOW + 80 / 12 * HOUR, abs=1)
    assert (got.points, got.span_ms) == (11, 50 * MINUTE)
    # The same pace against a reset in two hours: the reset comes first.
    early = forecast(_line(NOW - 50 * MINUTE, 11, 5 * MINUTE, 10, 1, NOW + 2 * HOUR), NOW, horizon_ms=FIVE_H)
    assert early.status == "not-before-reset" and early.exhausted_at_ms is None
    assert early.projected_at_ms == pytest.approx(NOW + 80 / 12 * HOUR, abs=1)


def test_the_rate_is_over_the_recent_span_only() -> None:
    # Slow for hours, then 30%/h in the last hour: the last hour's pace is the one projected.
    slow = _line(NOW - 5 * HOUR, 40, 5 * MINUTE, 0, 0.1, NOW + 2 * HOUR)
    fast = _line(NOW - 55 * MINUTE, 12, 5 * MINUTE, 40, 2.5, NOW + 2 * HOUR)
    got = forecast(slow + fast, NOW, horizon_ms=FIVE_H)
    assert got.percent_per_hour == pytest.approx(30) and got.points == 12
    assert got.exhausted_at_ms == pytest.approx(NOW + (100 - 67.5) / 30 * HOUR, abs=1)


def test_flat_never_runs_out_and_says_so() -> None:
    got = forecast(_line(NOW - 30 * MINUTE, 7, 5 * MINUTE, 42, 0, NOW + HOUR), NOW, horizon_ms=FIVE_H)
    assert got.status == "not-before-reset" and got.percent_per_hour == 0
    assert got.exhausted_at_ms is None and got.projected_at_ms is None and got.points == 7


def test_a_fall_at_the_newest_point_is_a_reset_and_no_forecast() -> None:
    points = [*_line(NOW - 30 * MINUTE, 6, 5 * MINUTE, 50, 5, NOW + HOUR), Point(NOW, 3, NOW + 5 * HOUR)]
    got = forecast(points, NOW, horizon_ms=FIVE_H)
    assert got.status == "unknown" and got.reason == "percent fell" and got.exhausted_at_ms is None


def test_a_reset_mid_span_leaves_only_the_new_windows_points() -> None:
    old = _line(NOW - 50 * MINUTE, 5, 5 * MINUTE, 60, 5, NOW - 25 * MINUTE)  # 60..80, window ends at NOW-25m
    new = _line(NOW - 20 * MINUTE, 5, 5 * MINUTE, 2, 2, NOW + 5 * HOUR - 25 * MINUTE)  # 2..10: 24%/h
    got = forecast(old + new, NOW, horizon_ms=FIVE_H)
    assert got.points == 5 and got.span_ms == 20 * MINUTE
    assert got.percent_per_hour == pytest.approx(24)
    assert got.exhausted_at_ms == pytest.approx(NOW + 90 / 24 * HOUR, abs=1)
    # A window that rolled over between two points without a fall (0% then 0%) is cut at the reset too.
    rolled = [Point(NOW - 20 * MINUTE, 0, NOW - 10 * MINUTE), Point(NOW - MINUTE, 0, NOW + 5 * HOUR)]
    assert forecast(rolled, NOW, horizon_ms=FIVE_H).reason == "percent fell"


def test_too_few_stale_or_passed_is_null() -> None:
    one = forecast([Point(NOW - MINUTE, 50, NOW + HOUR)], NOW, horizon_ms=FIVE_H)
    assert (one.status, one.reason, one.points, one.span_ms) == ("unknown", "fewer than two snapshots", 1, 0)
    same_time = forecast([Point(NOW, 50, NOW + HOUR), Point(NOW, 51, NOW + HOUR)], NOW, horizon_ms=FIVE_H)
    assert same_time.reason == "fewer than two snapshots" and same_time.points == 2
    stale = forecast(_line(NOW - 3 * HOUR, 5, 10 * MINUTE, 10, 5, NOW + HOUR), NOW, horizon_ms=FIVE_H)
    assert stale.reason == "stale" and stale.exhausted_at_ms is None
    passed = forecast(_line(NOW - 30 * MINUTE, 4, 5 * MINUTE, 10, 5, NOW - MINUTE), NOW, horizon_ms=FIVE_H)
    assert passed.reason == "window passed"
    assert forecast([], NOW, horizon_ms=FIVE_H).reason == "no snapshot"


def test_out_of_order_from_the_future_and_a_jumping_reset() -> None:
    points = _line(NOW - 50 * MINUTE, 11, 5 * MINUTE, 10, 1, NOW + 8 * HOUR)
    shuffled = points[:]
    random.Random(7).shuffle(shuffled)
    assert forecast(shuffled, NOW, horizon_ms=FIVE_H) == forecast(points, NOW, horizon_ms=FIVE_H)
    # A host whose clock is ahead: its 99% "from the future" is not taken.
    ahead = forecast([*points, Point(NOW + 10 * MINUTE, 99, NOW + 8 * HOUR)], NOW, horizon_ms=FIVE_H)
    assert ahead == forecast(points, NOW, horizon_ms=FIVE_H)
    # The stated reset jumps between two values while the percent climbs: no cut, the newest reset counts.
    jumping = [Point(p.at_ms, p.used_percent, NOW + (8 if i % 2 else 3) * HOUR) for i, p in enumerate(points)]
    got = forecast(jumping, NOW, horizon_ms=FIVE_H)
    assert got.points == 11 and got.percent_per_hour == pytest.approx(12) and got.resets_at_ms == NOW + 3 * HOUR
    assert got.status == "not-before-reset"  # 100% at NOW+6h40m, after the newest reset (NOW+3h)


def test_already_at_100_runs_out_now_and_no_reset_stated_uses_the_window_length() -> None:
    full = forecast(_line(NOW - 10 * MINUTE, 3, 5 * MINUTE, 90, 5, NOW + HOUR), NOW, horizon_ms=FIVE_H)
    assert full.status == "runs-out" and full.exhausted_at_ms == NOW
    unstated = forecast(_line(NOW - 50 * MINUTE, 11, 5 * MINUTE, 10, 1, None), NOW, horizon_ms=FIVE_H)
    assert unstated.status == "not-before-reset"  # 6h40m ahead: past a five-hour window's length
    assert forecast(_line(NOW - 50 * MINUTE, 11, 5 * MINUTE, 10, 1, None), NOW, horizon_ms=7 * HOUR).status == (
        "runs-out"
    )


_points = st.lists(
    st.builds(
        Point,
        st.integers(NOW - 10 * HOUR, NOW + HOUR),
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, 150),
        st.none() | st.integers(0, NOW + 8 * 24 * HOUR),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(_points)
def test_any_series_gives_a_forecast_consistent_with_its_basis(points: list[Point]) -> None:
    got = forecast(points, NOW, horizon_ms=FIVE_H)
    assert isinstance(got, Forecast)
    assert got.points <= len(points) and got.span_ms >= 0
    assert (got.status == "unknown") == (got.reason is not None)
    if got.exhausted_at_ms is not None:
        assert got.status == "runs-out"
        assert got.resets_at_ms is None or got.exhausted_at_ms < got.resets_at_ms
        newest = max(p.at_ms for p in points if p.at_ms <= NOW)
        assert newest <= got.exhausted_at_ms
    if got.status != "unknown":
        assert got.points >= 2 and got.span_ms > 0 and got.percent_per_hour is not None
    json.dumps(got.wire(), allow_nan=False)  # a finite number or null, never NaN on the wire


# --- the history: bounded, concurrent, hostile files --------------------------------------------


def test_merge_is_bounded_deduplicated_and_never_from_the_future() -> None:
    many = _line(NOW - 5 * HOUR, 2000, 9_000, 0, 0.01, None)
    merged = merge(many[:1000], [*many[1000:], *many[:10], Point(NOW + MINUTE, 99, None)], NOW)
    assert len(merged) == MAX_POINTS and merged[0] == many[0] and merged[-1] == many[-1]
    assert merged == sorted(set(merged), key=point_order) and all(p.at_ms <= NOW for p in merged)
    gaps = [b.at_ms - a.at_ms for a, b in itertools.pairwise(merged)]
    assert max(gaps) < 4 * min(gaps)  # spread over the kept hours, not the oldest or newest only
    old = merge([Point(NOW - KEEP_MS - MINUTE, 5, None)], [Point(NOW, 6, None)], NOW)
    assert old == [Point(NOW, 6, None)]


def _keep_some(catalog: str, offset: int) -> None:
    for index in range(20):
        point = Point(NOW - HOUR + (offset * 20 + index) * 1000, float(offset), None)
        keep(Path(catalog), [Sighting(f"account:{K1}", "fiveHour", point)], NOW)


def test_concurrent_readers_lose_no_point(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_keep_some, args=(str(tmp_path), offset)) for offset in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert all(worker.exitcode == 0 for worker in workers)
    held = json.loads(next((tmp_path / ".st2" / HISTORY_DIR_NAME).glob("*.json")).read_text())
    assert len(held["windows"]["fiveHour"]) == 120  # 6 readers x 20 points, none lost to another's replace
    assert [name for name in os.listdir(tmp_path / ".st2" / HISTORY_DIR_NAME) if ".json." in name] == []


def test_a_hostile_history_file_is_started_afresh_and_an_unwritable_one_still_forecasts(tmp_path: Path) -> None:
    account = f"account:{K1}"
    keep(tmp_path, [Sighting(account, "fiveHour", Point(NOW - MINUTE, 5, None))], NOW)
    (path,) = (tmp_path / ".st2" / HISTORY_DIR_NAME).glob("*.json")
    for hostile in (b"\x00" * 10, b'{"schema":"hctx.rate-limit-history.v1","account":"x","windows":{}}',
                    b'{"schema":"hctx.rate-limit-history.v1","account":"' + account.encode() + b'",'
                    b'"windows":{"fiveHour":[[1,"NaN",null]]}}', b"[" * 100_000):  # fmt: skip
        path.write_bytes(hostile)
        series, problem = keep(tmp_path, [Sighting(account, "fiveHour", Point(NOW, 6, None))], NOW)
        assert problem is None and series[account, "fiveHour"] == [Point(NOW, 6, None)]
    blocked = tmp_path / "blocked"
    (blocked / ".st2").mkdir(parents=True)
    (blocked / ".st2" / HISTORY_DIR_NAME).symlink_to(tmp_path)  # never followed
    seen = [Sighting(account, "fiveHour", p) for p in _line(NOW - 10 * MINUTE, 3, 5 * MINUTE, 10, 1, None)]
    series, problem = keep(blocked, seen, NOW)
    assert problem is not None and "rate-limit history" in problem and len(series[account, "fiveHour"]) == 3


# --- through the readers ------------------------------------------------------------------------


def _seat(catalog: Path, identity: str, observed: int, five: float, seven: float, resets: dict[str, int]) -> None:
    put_record(catalog, identity, account={"key": K1, "label": "claude · max"}, observedAtMs=observed,
               writtenAtMs=observed, rateLimits={"fiveHour": five, "sevenDay": seven},
               rateLimitResetsAtMs=resets)  # fmt: skip


def _read(catalog: Path, now: int) -> dict[tuple[str, Any], Forecast]:
    groups = fan_in(collect_roster(catalog, now, here=HOST, alive=dead).rows)
    return keep_groups(catalog, groups, now)[1]


@pytest.mark.parametrize(
    ("name", "step", "resets_in", "expect_status", "expect_rate"),
    [
        ("linear", 1.0, 8 * HOUR, "runs-out", 12.0),
        ("flat", 0.0, 8 * HOUR, "not-before-reset", 0.0),
        ("slow", 1.0, 2 * HOUR, "not-before-reset", 12.0),
    ],
)
def test_a_fleet_of_two_builds_the_history_reader_by_reader(
    tmp_path: Path, name: str, step: float, resets_in: int, expect_status: str, expect_rate: float
) -> None:
    """Two seats on one account take turns every 5 minutes, each read by a reader in between."""
    start = NOW - 50 * MINUTE
    resets = {"fiveHour": NOW + resets_in, "sevenDay": NOW + 100 * HOUR}
    got: dict[tuple[str, Any], Forecast] = {}
    for turn in range(11):
        observed = start + turn * 5 * MINUTE
        _seat(tmp_path, "claude-a" if turn % 2 else "codex-b", observed, 10 + step * turn, 30, resets)
        got = _read(tmp_path, observed + 1000)
    five = got[f"account:{K1}", "fiveHour"]
    assert (five.status, five.points, five.span_ms) == (expect_status, 11, 50 * MINUTE)
    assert five.percent_per_hour == pytest.approx(expect_rate)
    if expect_status == "runs-out":
        assert five.exhausted_at_ms == pytest.approx(NOW + (100 - 20) / 12 * HOUR, abs=1)
    seven = got[f"account:{K1}", "sevenDay"]
    assert seven.status == "not-before-reset" and seven.percent_per_hour == 0  # flat at 30%


def test_falling_and_reset_mid_span_through_the_readers(tmp_path: Path) -> None:
    resets = {"fiveHour": NOW + HOUR, "sevenDay": NOW + 100 * HOUR}
    for turn, percent in enumerate((60, 70, 80)):
        _seat(tmp_path, "a", NOW - 40 * MINUTE + turn * 5 * MINUTE, percent, 30, resets)
        _read(tmp_path, NOW - 40 * MINUTE + turn * 5 * MINUTE + 1000)
    new = {"fiveHour": NOW + 4 * HOUR, "sevenDay": NOW + 100 * HOUR}
    _seat(tmp_path, "a", NOW - 20 * MINUTE, 1, 30, new)
    fell = _read(tmp_path, NOW - 20 * MINUTE + 1000)[f"account:{K1}", "fiveHour"]
    assert fell.status == "unknown" and fell.reason == "percent fell"
    for turn in range(1, 5):
        _seat(tmp_path, "a", NOW - 20 * MINUTE + turn * 5 * MINUTE, 1 + 2 * turn, 30, new)
        got = _read(tmp_path, NOW - 20 * MINUTE + turn * 5 * MINUTE + 1000)[f"account:{K1}", "fiveHour"]
    assert got.points == 5 and got.percent_per_hour == pytest.approx(24)
    assert got.status == "runs-out" and got.exhausted_at_ms == pytest.approx(NOW + 91 / 24 * HOUR, abs=1)


def test_hctx_accounts_shows_runs_out_and_its_basis(tmp_path: Path) -> None:
    real_now = int(time.time() * 1000)
    resets = {"fiveHour": real_now + 8 * HOUR, "sevenDay": real_now + 100 * HOUR}
    for turn in range(4):  # each `hctx accounts` run keeps what it saw
        _seat(tmp_path, "a", real_now - (30 - 10 * turn) * MINUTE, 10 + 2 * turn, 30, resets)
        done = hctx("accounts", "--json", "--catalog", str(tmp_path), "--host", HOST)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    (item,) = json.loads(done.stdout)
    five = item["rateLimits"]["fiveHour"]["forecast"]
    assert five["status"] == "runs-out" and five["points"] == 4 and five["spanMs"] == 30 * MINUTE
    assert five["percentPerHour"] == pytest.approx(12)
    assert abs(five["exhaustedAtMs"] - (real_now + (100 - 16) / 12 * HOUR)) <= 1
    human = hctx("accounts", "--catalog", str(tmp_path), "--host", HOST).stdout
    (line,) = [line for line in human.splitlines() if " 5h " in line]
    assert "in 7h00m (4 over 30m00s)" in line or "in 6h59m (4 over 30m00s)" in line
    (seven,) = [line for line in human.splitlines() if " 7d " in line]
    assert "not before reset (4 over 30m00s)" in seven


def test_render_marks_a_window_that_runs_out_before_its_reset(tmp_path: Path) -> None:
    resets = {"fiveHour": NOW + 8 * HOUR, "sevenDay": NOW + 100 * HOUR}
    for turn in range(3):
        _seat(tmp_path, "a", NOW - (20 - 10 * turn) * MINUTE, 40 + 10 * turn, 30, resets)
        got = _read(tmp_path, NOW - (20 - 10 * turn) * MINUTE + 1000)
    groups = fan_in(collect_roster(tmp_path, NOW, here=HOST, alive=dead).rows)
    text = render_accounts(groups, NOW, colour=True, forecasts=got)
    assert "\x1b[31min 40m00s (3 over 20m00s)" in text  # 60% at NOW, 60%/h: red, 40 minutes from now
    assert "\x1b[31mnot before reset" not in text


def test_metrics_exports_the_exhaustion_time_only_when_it_comes_before_the_reset(tmp_path: Path) -> None:
    resets = {"fiveHour": NOW + 8 * HOUR, "sevenDay": NOW + 100 * HOUR}
    exporter = exporter_of(tmp_path, NOW)
    for turn in range(11):  # the exporter, scraped between turns, keeps the history itself
        observed = NOW - 50 * MINUTE + turn * 5 * MINUTE
        _seat(tmp_path, "claude-a" if turn % 2 else "codex-b", observed, 10 + turn, 30, resets)
        exporter.clock = functools.partial(int, observed + 1000)
        text = render(exporter, False)
    samples = parse(text)
    exhausted = {dict(labels)["window"]: value for (name, labels), value in samples.items()
                 if name == "hctx_account_rate_limit_exhausted_at_seconds"}  # fmt: skip
    assert exhausted == {"five_hour": pytest.approx((NOW + 80 / 12 * HOUR) / 1000, abs=0.002)}  # 7d is flat: absent
    done = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
    # A reset happens (the percent falls): the series goes, rather than stand on the old window's pace.
    _seat(tmp_path, "codex-b", NOW + 2000, 1, 30, {"fiveHour": NOW + 5 * HOUR, "sevenDay": NOW + 100 * HOUR})
    exporter.clock = lambda: NOW + 3000
    assert "hctx_account_rate_limit_exhausted_at_seconds{" not in render(exporter, False)


def test_an_agent_stating_no_account_keeps_no_history(tmp_path: Path) -> None:
    put_record(tmp_path, "loner", account=None, observedAtMs=NOW, writtenAtMs=NOW,
               rateLimits={"fiveHour": 50, "sevenDay": 20}, rateLimitResetsAtMs={"fiveHour": NOW + HOUR})  # fmt: skip
    assert _read(tmp_path, NOW + 1000) == {}
    assert list((tmp_path / ".st2" / HISTORY_DIR_NAME).glob("*.json")) == []


def test_a_snapshot_is_kept_at_the_time_its_figure_arrived(tmp_path: Path) -> None:
    """Issue 35's dating: an idle seat redraws an old figure in fresh readings; the history keeps it at
    its arrival, so the redraw adds no point and does not flatten the pace."""
    resets = {"fiveHour": NOW + 8 * HOUR, "sevenDay": NOW + 100 * HOUR}
    for minutes_ago, percent in ((40, 20), (20, 30)):
        arrived = NOW - minutes_ago * MINUTE
        put_record(tmp_path, "a", account={"key": K1, "label": "claude · max"}, observedAtMs=NOW - MINUTE,
                   writtenAtMs=NOW - MINUTE, rateLimits={"fiveHour": percent, "sevenDay": 10},
                   rateLimitResetsAtMs=resets, rateLimitsAtMs={"fiveHour": arrived, "sevenDay": arrived})  # fmt: skip
        got = _read(tmp_path, NOW)[f"account:{K1}", "fiveHour"]
    assert (got.points, got.span_ms) == (2, 20 * MINUTE) and got.percent_per_hour == pytest.approx(30)
