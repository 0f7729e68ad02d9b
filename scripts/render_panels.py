#!/usr/bin/env python3
"""Draw the Grafana dashboard's panels from real query results, and photograph them.

`tests/test_metrics_live.py` runs every query of `monitoring/hctx-dashboard.json` against a real
Prometheus scraping a live fleet; with `HCTX_PANELS_OUT=FILE` it keeps each query's last minute
(`query_range`) in FILE. This script draws those results as the dashboard lays them out (its
gridPos, titles, units, thresholds) in one small HTML page of inline SVG, and with `--png` has
Debian's headless Chromium take the screenshot docs/prometheus.md shows:

    HCTX_PANELS_OUT=/tmp/panels.json .venv/bin/python -m pytest tests/test_metrics_live.py
    scripts/render_panels.py /tmp/panels.json --html /tmp/panels.html --png docs/dashboard.png
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "monitoring" / "hctx-dashboard.json"
COLUMN_PX, ROW_PX = 56, 34
COLOURS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#b877d9", "#f2495c", "#8ab8ff", "#96d98d")


def legend(format_: str, labels: dict[str, str]) -> str:
    text = format_
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def _series(panel: dict[str, Any], ranges: list[list[dict[str, Any]]]) -> list[tuple[str, list[tuple[float, float]]]]:
    found = []
    for target, result in zip(panel["targets"], ranges, strict=True):
        for item in result:
            points = [(float(t), float(v)) for t, v in item["values"]]
            found.append((legend(target.get("legendFormat", ""), item["metric"]), points))
    return found


def timeseries(series: list[tuple[str, list[tuple[float, float]]]], width: int, height: int, unit: str) -> str:
    if not series:
        return '<text x="50%" y="50%" class="none">No data</text>'
    times = [t for _, points in series for t, _ in points]
    values = [v for _, points in series for _, v in points]
    t0, t1 = min(times), max(times) or 1
    low, high = min(0.0, min(values)), max(values) or 1.0
    plot_w, plot_h = width - 60, height - 28 - 16 * ((len(series) + 2) // 3)

    def xy(t: float, v: float) -> str:
        x = 50 + (t - t0) / max(t1 - t0, 1e-9) * (plot_w - 10)
        y = 8 + (1 - (v - low) / max(high - low, 1e-9)) * (plot_h - 16)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<line x1="50" y1="{plot_h - 8}" x2="{plot_w + 40}" y2="{plot_h - 8}" class="axis"/>']
    for tick in (low, (low + high) / 2, high):
        y = xy(t0, tick).split(",")[1]
        parts.append(f'<text x="44" y="{y}" class="tick">{tick:.4g}{"%" if unit == "percent" else ""}</text>')
    for index, (name, points) in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        parts.append(f'<polyline points="{" ".join(xy(t, v) for t, v in points)}" stroke="{colour}" class="line"/>')
        lx, ly = 50 + (index % 3) * (plot_w // 3), plot_h + 10 + 16 * (index // 3)
        parts.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="{ly}" class="legend">{html.escape(name)}</text>')  # fmt: skip
    return "".join(parts)


def last_values(series: list[tuple[str, list[tuple[float, float]]]]) -> list[tuple[str, float]]:
    return [(name, points[-1][1]) for name, points in series if points]


def colour_for(value: float, panel: dict[str, Any]) -> str:
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    colour = "#73bf69"
    for step in steps:
        if step["value"] is None or value >= step["value"]:
            colour = {"green": "#73bf69", "orange": "#ff9830", "red": "#f2495c"}.get(step["color"], colour)
    return colour


def panel_svg(panel: dict[str, Any], ranges: list[list[dict[str, Any]]], width: int, height: int) -> str:
    series = _series(panel, ranges)
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    if panel["type"] == "timeseries":
        return timeseries(series, width, height, unit)
    values = last_values(series)
    if not values:
        return '<text x="50%" y="50%" class="none">No data</text>'
    if panel["type"] == "stat":
        cell = width // len(values)
        return "".join(
            f'<text x="{cell * i + cell // 2}" y="{height // 2 - 10}" class="stat">{value:g}</text>'
            f'<text x="{cell * i + cell // 2}" y="{height // 2 + 20}" class="statname">{html.escape(name)}</text>'
            for i, (name, value) in enumerate(values)
        )
    rows = []
    top = max(abs(value) for _, value in values) or 1
    for i, (name, value) in enumerate(values[: max(1, (height - 20) // 26)]):
        y = 10 + i * 26
        if panel["type"] == "bargauge":
            bar = max(2, int(abs(value) / top * (width - 260)))
            rows.append(f'<text x="8" y="{y + 14}" class="legend">{html.escape(name)}</text>'
                        f'<rect x="180" y="{y}" width="{bar}" height="18" fill="#5794f2"/>'
                        f'<text x="{186 + bar}" y="{y + 14}" class="legend">{value:,.0f}</text>')  # fmt: skip
        else:
            rows.append(f'<text x="8" y="{y + 14}" class="legend">{html.escape(name)}</text>'
                        f'<text x="{width - 20}" y="{y + 14}" class="value">{value:g}</text>')  # fmt: skip
    return "".join(rows)


def render(data: dict[str, Any]) -> str:
    board = json.loads(DASHBOARD.read_text())
    panels = []
    bottom = 0
    for panel in board["panels"]:
        grid = panel["gridPos"]
        width, height = grid["w"] * COLUMN_PX - 8, grid["h"] * ROW_PX - 8
        bottom = max(bottom, (grid["y"] + grid["h"]) * ROW_PX)
        body = panel_svg(panel, data["ranges"][panel["title"]], width, height - 30)
        panels.append(
            f'<div class="panel" style="left:{grid["x"] * COLUMN_PX}px;top:{grid["y"] * ROW_PX + 40}px;'
            f'width:{width}px;height:{height}px"><h2>{html.escape(panel["title"])}</h2>'
            f'<svg width="{width}" height="{height - 30}">{body}</svg></div>'
        )
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(board["title"])}</title>
<style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 13px sans-serif; width: {24 * COLUMN_PX}px; }}
h1 {{ font-size: 16px; margin: 0; padding: 10px 12px; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 3px; }}
.panel h2 {{ font-size: 13px; margin: 0; padding: 7px 8px; font-weight: 500; }}
.axis {{ stroke: #2c3235; }} .line {{ fill: none; stroke-width: 2; }}
.tick {{ fill: #8e8e8e; font-size: 10px; text-anchor: end; }} .legend {{ fill: #ccccdc; font-size: 11px; }}
.value {{ fill: #ccccdc; text-anchor: end; }} .none {{ fill: #8e8e8e; text-anchor: middle; }}
.stat {{ fill: #73bf69; font-size: 40px; text-anchor: middle; }} .statname {{ fill: #ccccdc; text-anchor: middle; }}
</style></head><body><h1>{html.escape(board["title"])}</h1>{"".join(panels)}
<div style="height:{bottom + 50}px"></div></body></html>
"""


def screenshot(page: Path, png: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium is not installed (Debian's chromium package)")
    with tempfile.TemporaryDirectory(prefix="hctx-chromium-") as profile:
        subprocess.run(
            [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--screenshot={png.resolve()}", f"--window-size={24 * COLUMN_PX},1240",
             page.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("panels", type=Path, help="the JSON test_metrics_live.py wrote with HCTX_PANELS_OUT")
    parser.add_argument("--html", type=Path, required=True)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    args.html.write_text(render(json.loads(args.panels.read_text())))
    if args.png is not None:
        screenshot(args.html, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
