"""The board's account panel says when each window runs out at the fleet's pace, and plots each
window over the kept hours (issue 39): in Chromium, as tests/test_web_browser.py drives it, and the
panel's data and SVG without a browser."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guard.account import account_key
from tests.web_board import HERE, browser, driver, now_ms, put, serving
from wrapper.readers.accounts import fan_in
from wrapper.readers.forecast import Point
from wrapper.readers.notice import Changes
from wrapper.readers.rate_history import Sighting, keep, sightings_of
from wrapper.readers.roster import collect_roster
from wrapper.readers.web.board import draw_accounts, limits_svg, rate_limit_panel
from wrapper.readers.web.feed import Board

KEY = account_key("claude", "uuid-1", "org-1")
MINUTE, HOUR = 60_000, 3_600_000


def _history(catalog: Path, now: int) -> None:
    """An hour of the account at 12%/h (five-hour) and flat at 30% (seven-day), as readers kept it."""
    seen = [Sighting(f"account:{KEY}", "fiveHour", Point(now - 60 * MINUTE + i * 5 * MINUTE, 8 + i, now + 8 * HOUR))
            for i in range(12)]  # fmt: skip
    seen += [Sighting(f"account:{KEY}", "sevenDay", Point(now - 60 * MINUTE + i * 5 * MINUTE, 30, now + 90 * HOUR))
             for i in range(12)]  # fmt: skip
    keep(catalog, seen, now)
    shared = {"key": KEY, "label": "claude · max"}
    limits = {"fiveHour": 20.0, "sevenDay": 30.0}
    resets = {"fiveHour": now + 8 * HOUR, "sevenDay": now + 90 * HOUR}
    for identity in ("builder", "reviewer"):
        put(catalog, identity, harness="claude", account=shared, rateLimits=limits, rateLimitResetsAtMs=resets,
            observedAtMs=now)  # fmt: skip


def test_the_panel_carries_the_forecast_and_a_plot_of_each_window(tmp_path: Path) -> None:
    now = now_ms()
    _history(tmp_path, now)
    rows = collect_roster(tmp_path, now, here=HERE).rows
    series, _ = keep(tmp_path, sightings_of(fan_in(rows)), now)  # as the board's worker keeps them
    (entry,) = rate_limit_panel(((row, now) for row in rows), now, draw_accounts(series, now))["entries"]
    assert entry["runsOutFiveHour"] == "in 6h40m (13 over 1h00m)"  # 20% at now, 12%/h: 80 points in 6h40m
    assert entry["runsOutSevenDay"] == "not before reset (13 over 1h00m)"
    lines = dict(re.findall(r'<polyline class="([a-z-]+)" points="([^"]+)"', entry["plot"]))
    assert set(lines) == {"five-hour", "seven-day"} and len(lines["five-hour"].split()) == 13
    (last_x, last_y) = map(float, lines["five-hour"].split()[-1].split(","))
    assert last_x == 178.0 and last_y == pytest.approx(48 - 2 - 0.2 * 44)  # the newest at the right edge, 20% high
    heights = {float(pair.split(",")[1]) for pair in lines["seven-day"].split()}
    assert heights == {round(48 - 2 - 0.3 * 44, 1)}  # flat at 30%
    # Hostile numbers stay inside the plot: no NaN, nothing past 100% or before the kept hours.
    odd = limits_svg({"fiveHour": [Point(now - 99 * HOUR, 50), Point(now, 1e9), Point(now - MINUTE, -5)]}, now)
    assert "nan" not in odd.lower() and re.search(r'points="[^"]*"', odd)
    assert all(0 <= float(v) <= 180 for pair in re.findall(r"(\d+\.?\d*,\d+\.?\d*)", odd) for v in pair.split(","))


def test_the_boards_own_panel_keeps_the_forecast_and_plot_through_a_read_of_one_agent(tmp_path: Path) -> None:
    """The board's panel is made again from the account groups it holds (`Board._repanel`, issue
    40), not by `rate_limit_panel`: after a whole read and after a read of one agent it still says
    when each window runs out and plots the windows, the newest snapshot kept and drawn."""
    now = now_ms() - 10 * MINUTE
    _history(tmp_path, now)
    board = Board(tmp_path, HERE)
    board.took(board.read(Changes(frozenset(), True), 1.0))
    (entry,) = board.panel["entries"]
    assert entry["runsOutFiveHour"].startswith("in ") and entry["runsOutSevenDay"].startswith("not before reset")
    assert len(re.findall(r'<polyline class="five-hour" points="([^"]+)"', entry["plot"])[0].split()) == 13
    time.sleep(1.1)  # past the racy second of the records written above
    resets = {"fiveHour": now + 8 * HOUR, "sevenDay": now + 90 * HOUR}
    put(tmp_path, "builder", harness="claude", account={"key": KEY, "label": "claude · max"},
        rateLimits={"fiveHour": 26.0, "sevenDay": 30.0}, rateLimitResetsAtMs=resets, observedAtMs=now_ms())  # fmt: skip
    board.took(board.read(Changes(frozenset({(HERE, "builder")}), False), 2.0))
    (entry,) = board.panel["entries"]
    assert entry["fiveHour"] == "26%" and entry["runsOutFiveHour"].startswith("in ")
    assert entry["runsOutSevenDay"].startswith("not before reset")
    assert len(re.findall(r'<polyline class="five-hour" points="([^"]+)"', entry["plot"])[0].split()) == 14


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with driver() as playwright, browser(playwright) as launched:
        yield launched


def test_the_board_shows_runs_out_and_draws_the_windows_in_chromium(tmp_path: Path, chromium: Any) -> None:
    now = now_ms()
    _history(tmp_path, now)
    with serving(tmp_path) as served:
        context = chromium.new_context(viewport={"width": 1400, "height": 720})
        page = context.new_page()
        page.goto(served.url)
        page.wait_for_selector("#live:not(.off)")
        page.wait_for_function("() => document.querySelectorAll('#limits tbody tr').length === 1")
        cells = page.locator("#limits tbody tr").nth(0).locator("td").all_inner_texts()
        assert cells[0] == "claude · max" and cells[5] == "2"
        assert re.fullmatch(r"in 6h(39|40)m \(1[34] over 1h00m\)", cells[7]), cells[7]
        assert cells[8].startswith("not before reset")
        headers = page.locator("#limits thead th").all_inner_texts()
        assert headers[7:] == ["five-hour runs out", "seven-day runs out", "last 6 h"]
        page.wait_for_selector("#limits tbody tr td.limits-plot svg polyline.five-hour")
        plot = page.locator("#limits tbody tr td.limits-plot svg")
        assert plot.count() == 1
        size = page.evaluate(
            "() => { const box = document.querySelector('#limits td.limits-plot svg').getBoundingClientRect();"
            " return [box.width, box.height]; }"
        )
        assert size == [180, 48]  # laid out as an SVG image, not an unknown empty node
        five = page.locator("#limits td.limits-plot polyline.five-hour")
        assert five.count() == 1 and len(five.get_attribute("points").split()) >= 13
        # Asked in one go: a push may rebuild the panel's rows between two calls.
        stroke = page.evaluate(
            "() => getComputedStyle(document.querySelector('#limits td.limits-plot polyline.five-hour')).stroke"
        )
        assert stroke == "rgb(37, 99, 235)"  # drawn, in the five-hour colour
        context.close()
