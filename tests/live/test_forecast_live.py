"""Live: the forecast of a shared window at the fleet's pace (issue 39), from what real seats report.

Two wrapped Codex 0.151.0 ChatGPT seats of one person (A and B: one account key) take turns against
the fake ChatGPT backend, whose every response raises the five-hour window by 7.5 points
(`tests.fakes.codex_model`: primary `10 + 7.5·n`, the reset three hours ahead). After each turn
`hctx accounts --json` reads the catalog, as a user would, and so keeps each account's history.
The forecast it shows at the end must lie on the straight line through what the records reported:

- `percentPerHour` within 1% of the least-squares slope of (arrival, fiveHour) over every
  snapshot the runs saw (both seats' records after each turn), and resting on all of them;
- `exhaustedAtMs` where that line reaches 100%, give or take how far the snapshots lie off the
  line (the forecast goes on at the line's pace from the newest snapshot, the line from the mean of
  all; turns take one or two requests of 7.5 points each at uneven times, and Codex rounds each
  header's percent to a whole number): within the largest distance of any reported snapshot from
  the line, counted in the time the fleet takes to burn that many points, and 1 ms for rounding.

Codex 0.171.0 sends ChatGPT turns to https://chatgpt.com only (tests/live/test_accounts_live.py),
and a Claude seat is never on a Codex account (each harness's key is of its own login), so one
account shared by Claude and Codex seats does not exist to test: Claude's seats are forecast by
the same code from the same record fields.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fakes.chatgpt_backend import fake_chatgpt
from tests.fakes.codex_client import stdio_client
from tests.harnesses import require_harness
from tests.live.test_accounts_live import _codex_home
from tests.wrapping import HOST, wrap_argv
from tests.wrapping import env as suite_env

pytestmark = pytest.mark.live

VERSION = "0.151.0"
TURNS = 6  # A, B, A, B, A, B: 10% to 47.5%, well short of the fake's 100% cap


def _accounts(catalog: Path) -> list[dict[str, object]]:
    done = subprocess.run([sys.executable, "-m", "wrapper.cli", "accounts", "--json", "--catalog", str(catalog)],
                          capture_output=True, text=True, timeout=120, env=suite_env(), check=False)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    listed: list[dict[str, object]] = json.loads(done.stdout)
    return listed


def _line(points: set[tuple[int, float]]) -> tuple[float, float, float]:
    """The least-squares line: (slope per ms, mean time, mean percent)."""
    xs, ys = [float(t) for t, _ in points], [p for _, p in points]
    mean_x, mean_y = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    slope = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / math.fsum(
        (x - mean_x) ** 2 for x in xs
    )
    return slope, mean_x, mean_y


def _snapshot(record: dict[str, Any]) -> tuple[int, float]:
    """(when the five-hour figure arrived, the figure): the record's `rateLimitsAtMs` (issue 35), by
    which every reader dates a snapshot, else its reading's time."""
    arrived = (record.get("rateLimitsAtMs") or {}).get("fiveHour")
    return (arrived if arrived is not None else record["observedAtMs"], float(record["rateLimits"]["fiveHour"]))


async def test_two_codex_seats_forecast_on_the_line_through_what_they_reported(tmp_path: Path) -> None:
    codex = require_harness("codex", VERSION)
    catalog = tmp_path / "catalog"
    reported: set[tuple[int, float]] = set()
    async with fake_chatgpt() as fake:
        seats = {}
        for seat in "AB":
            env, _, work = _codex_home(VERSION, seat, fake, tmp_path)
            seats[seat] = (env, work, wrap_argv(catalog, f"codex-seat-{seat}", "codex", *codex, "app-server"))
        (env_a, work_a, argv_a), (env_b, work_b, argv_b) = seats["A"], seats["B"]
        async with (
            stdio_client(argv_a, env=env_a, cwd=work_a, stderr=tmp_path / "A.stderr") as (a, _, _),
            stdio_client(argv_b, env=env_b, cwd=work_b, stderr=tmp_path / "B.stderr") as (b, _, _),
        ):
            clients = {"A": a, "B": b}
            threads = {}
            for seat, client in clients.items():
                await client.initialize()
                threads[seat] = await client.start_thread(seats[seat][1])
            for turn in range(TURNS):
                seat = "AB"[turn % 2]
                client = clients[seat]
                pushed = client.count("account/rateLimits/updated")
                await client.turn(threads[seat], f"seat {seat} turn {turn} [[u:1200:20]]")
                await client.wait_for(lambda _, c=client, n=pushed: c.count("account/rateLimits/updated") > n)
                path = catalog / "agents" / HOST / f"codex-seat-{seat}" / "harness-context"
                for _ in range(300):  # the record of this turn's snapshot (15 s)
                    record = json.loads(path.read_text()) if path.exists() else None
                    if record and record["rateLimits"] and _snapshot(record) not in reported:
                        break
                    await trio.sleep(0.05)
                else:
                    raise AssertionError(f"seat {seat}: no new rate-limit snapshot after turn {turn}")
                for other in "AB":  # what `hctx accounts` is about to read: both seats' records as they stand
                    other_path = catalog / "agents" / HOST / f"codex-seat-{other}" / "harness-context"
                    if other_path.exists():
                        held = json.loads(other_path.read_text())
                        if held["rateLimits"]:
                            reported.add(_snapshot(held))
                listed = _accounts(catalog)
    (group,) = [item for item in listed if item["agentCount"] == 2]
    five = group["rateLimits"]["fiveHour"]  # type: ignore[index]
    forecast = five["forecast"]
    slope, mean_t, mean_p = _line(reported)
    assert len(reported) >= TURNS and forecast["points"] == len(reported), (forecast, sorted(reported))
    assert forecast["spanMs"] == max(t for t, _ in reported) - min(t for t, _ in reported)
    assert forecast["percentPerHour"] == pytest.approx(slope * 3_600_000, rel=0.01)
    line_at_100 = mean_t + (100 - mean_p) / slope
    # How far any reported snapshot lies off the line, in the time the fleet takes to burn that much.
    off_ms = max(abs(p - (mean_p + slope * (t - mean_t))) for t, p in reported) / slope
    assert forecast["status"] == "runs-out" and forecast["resetsAtMs"] == five["resetsAtMs"]
    assert abs(forecast["exhaustedAtMs"] - line_at_100) <= off_ms + 1, (forecast, line_at_100, off_ms)
