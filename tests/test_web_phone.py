"""The board on a phone (issue 38), in Chromium's mobile viewport under Playwright: the fleet as
cards, fullest first, the counts above them, nothing wider than the screen; the counts and the
filter box on every width; and the access token a LAN board asks for, as a phone's browser meets it.
"""

from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.conftest import REPO
from tests.web_board import (
    HERE,
    REPLICA,
    Served,
    browser,
    driver,
    first_line,
    fleet,
    serving,
    stop,
    web_argv,
    web_env,
)

README = (REPO / "README.md").read_text()
SCREENSHOT = REPO / "docs" / "board-phone.png"
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 2}
RED = "rgb(220, 38, 38)"
COUNTS = f"2 at or above 80% · 1 at or above 95% · 1 stale · hosts: {HERE} 6, {REPLICA} 1"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("board")
    fleet(root)
    return root


@pytest.fixture(scope="module")
def served(catalog: Path) -> Iterator[Served]:
    with serving(catalog) as board:
        yield board


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with driver() as playwright, browser(playwright) as launched:
        yield launched


@pytest.fixture
def phone(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(**PHONE)
    yield context.new_page()
    context.close()


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#live:not(.off)")
    page.wait_for_function("() => document.querySelectorAll('#fleet .row').length === 7")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_at_390px_the_fleet_reads_as_cards_fullest_first_under_the_counts(phone: Any, served: Served) -> None:
    """HCTX_PHONE_SCREENSHOT_OUT=FILE saves the capture, to refresh docs/board-phone.png from a test run."""
    _open(phone, served.url)
    # No horizontal scroll: nothing on the page is wider than the screen.
    widths = phone.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1] == 390, widths
    assert phone.locator("#fleet .head").is_hidden()
    keys = phone.locator("#fleet .row").evaluate_all("rows => rows.map(row => row.dataset.key)")
    assert keys[:3] == [f"{HERE}/red", f"{HERE}/amber", f"{HERE}/stale"]  # fullest first
    first = phone.locator("#fleet .row").first
    card = first.bounding_box()
    assert card["width"] <= 390 and card["height"] > 60  # a card: the row's cells stacked, not one line
    # The fullest agent's percent and tint are on the first screen, without scrolling.
    chip = first.locator(".context .chip")
    expect(chip).to_have_text("96%")
    assert chip.evaluate("node => getComputedStyle(node).backgroundColor") == RED
    box = chip.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390 and box["y"] >= 0 and box["y"] + box["height"] <= 844
    counts = phone.locator("#counts")
    assert " ".join(counts.inner_text().split()) == COUNTS
    assert counts.bounding_box()["y"] < card["y"]  # the counts on top
    shot = phone.screenshot()
    if target := os.environ.get("HCTX_PHONE_SCREENSHOT_OUT"):
        Path(target).write_bytes(shot)
    assert "](docs/board-phone.png)" in README
    assert _png_size(SCREENSHOT.read_bytes()) == _png_size(shot) == (390 * 2, 844 * 2)


def test_the_counts_and_the_filter_box_on_a_wide_screen(chromium: Any, served: Served) -> None:
    context = chromium.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        _open(page, served.url)
        assert " ".join(page.locator("#counts").inner_text().split()) == COUNTS
        rows = page.locator("#fleet .row")
        page.locator("#filter").fill("REPLI")  # a substring of the host, in any case, as `hctx top`'s
        expect(rows.locator("visible=true")).to_have_count(1)
        assert rows.locator("visible=true").first.get_attribute("data-key") == f"{REPLICA}/far"
        assert page.locator("#summary").inner_text() == "7 agents · 1 shown"
        assert " ".join(page.locator("#counts").inner_text().split()) == COUNTS  # of the whole fleet
        page.locator("#filter").fill("claude")  # the harness
        expect(rows.locator("visible=true")).to_have_count(1)
        assert rows.locator("visible=true").first.get_attribute("data-key") == f"{HERE}/withheld"
        page.locator("#filter").fill("amb")  # the name
        expect(rows.locator("visible=true")).to_have_count(1)
        page.locator("#filter").fill("")
        expect(rows.locator("visible=true")).to_have_count(7)
        assert page.locator("#summary").inner_text() == "7 agents"
    finally:
        context.close()


def test_a_phone_opens_the_token_url_once_and_keeps_the_board(chromium: Any, catalog: Path) -> None:
    """The URL `hctx web --require-token` prints: the token becomes an HttpOnly cookie, the address
    loses it, and the page's own requests (its files, its event stream) carry the cookie."""
    argv = web_argv(catalog, "--listen", "127.0.0.1:0", "--require-token")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=web_env(), cwd=REPO)
    context = chromium.new_context(**PHONE)
    try:
        url = first_line(process).strip()
        bare = url.split("?", 1)[0]
        page = context.new_page()
        refused = page.goto(bare)
        assert refused is not None and refused.status == 401
        _open(page, url)
        assert urlsplit(page.url).query == ""  # the token left the address bar
        cookies = context.cookies()
        assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [("hctx_board", True, "Strict")]
        assert page.evaluate("() => document.cookie") == ""  # no script reads it
        _open(page, bare)  # later visits: the cookie alone
    finally:
        context.close()
        stop(process)
