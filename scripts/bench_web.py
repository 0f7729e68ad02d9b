#!/usr/bin/env python3
"""Time `hctx web` in Debian's Chromium at 100 and 1,000 agents, beside `hctx agents --json`.

Per catalog size, in the same run and on the same catalog:
- `hctx agents --json` as a whole process (median wall time): the baseline;
- the first full render: a fresh page's navigation start to the first frame painted with every
  row in it (the page stamps `performance.now()` in the animation frame after its snapshot);
- disk write -> page: a record renamed into place (as the store does) to the moment its new
  percent is in the page's DOM (a MutationObserver's `Date.now()`; same machine, same clock).
Targets: first render <= 1 s at 1,000 agents; write -> page p99 <= 1 s.

Also the import cost of the web server (starlette + hypercorn's trio worker) that only `hctx web`
pays, beside `import wrapper.cli` (what every command pays).

Usage: scripts/bench_web.py [--sizes 100,1000] [--loads 5] [--samples 100]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from tests.web_board import (  # noqa: E402
    browser,
    driver,
    first_line,
    many,
    record_bytes,
    replace_file,
    stop,
    web_argv,
    web_env,
)

SEEN = """([key, text]) => {
  window.seen = {};
  const cell = document.querySelector(`#fleet .row[data-key="${key}"] .context`);
  const look = () => {
    const chip = cell.querySelector(".chip");
    if (chip && chip.textContent === text && !window.seen[text]) window.seen[text] = Date.now();
  };
  if (window.watching) window.watching.disconnect();
  window.watching = new MutationObserver(look);
  window.watching.observe(cell, {subtree: true, childList: true, characterData: true});
}"""


def timed_ms(argv: list[str], repeat: int) -> float:
    samples = []
    for attempt in range(repeat + 1):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=web_env(), cwd=REPO)
        if attempt:
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def first_renders(chromium: object, url: str, agents: int, loads: int) -> list[float]:
    renders = []
    for _ in range(loads):
        context = chromium.new_context(viewport={"width": 1280, "height": 720})  # type: ignore[attr-defined]
        page = context.new_page()
        page.goto(url)
        page.wait_for_function("() => document.getElementById('board').dataset.rendered", timeout=60_000)
        assert page.locator("#fleet .row").count() == agents
        renders.append(float(page.evaluate("() => Number(document.getElementById('board').dataset.rendered)")))
        context.close()
    return renders


def latencies(chromium: object, url: str, paths: list[Path], samples: int) -> list[float]:
    context = chromium.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("n => document.querySelectorAll('#fleet .row').length === n", arg=len(paths),
                           timeout=60_000)  # fmt: skip
    found = []
    pick = random.Random(23)
    for sample in range(samples):
        path = pick.choice(paths)
        key = f"{path.parent.parent.name}/{path.parent.name}"
        percent = 100 + sample  # never a value already shown
        page.evaluate(SEEN, [key, f"{percent}%"])
        written = time.time() * 1000
        replace_file(path, record_bytes(path.parent.name, usedTokens=1000 + sample, usedPercent=float(percent)))
        page.wait_for_function("text => window.seen[text]", arg=f"{percent}%", timeout=30_000)
        found.append(float(page.evaluate("text => window.seen[text]", f"{percent}%")) - written)
        time.sleep(pick.uniform(0, 0.1))  # off the watcher's batching rhythm
    context.close()
    return found


def import_cost(repeat: int) -> tuple[float, float]:
    """Best-of-`repeat` milliseconds, from `-X importtime` in one process: `import wrapper.cli` (what
    every command pays), and what importing starlette and hypercorn's trio worker adds after it."""
    code = "import wrapper.cli, trio, anyio; import starlette.applications, hypercorn.trio, hypercorn.config"
    every, web = [], []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                              env=web_env(), cwd=REPO, check=True)  # fmt: skip
        top = {}
        for line in done.stderr.splitlines():
            if line.startswith("import time:") and "|" in line and "cumulative" not in line:
                _, cumulative, name = line.split("|")
                if not name.startswith("  "):  # top level: its cumulative time holds its own imports
                    top[name.strip()] = int(cumulative) / 1000
        every.append(top["wrapper.cli"])
        web.append(sum(ms for name, ms in top.items() if name.split(".")[0] in ("starlette", "hypercorn")))
    return min(every), min(web)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    every, web = import_cost(args.repeat)
    print(f"import wrapper.cli (every command)               {every:7.1f} ms")
    print(f"  + starlette and hypercorn (hctx web only)      {web:7.1f} ms  ({web / every:.2f}x of it)")
    print()
    print(
        "| agents | agents --json ms | first render ms (median, max) | render / agents --json "
        "| write->page p50 ms | p99 ms | p99 / agents --json |"
    )
    print(
        "|-------:|-----------------:|------------------------------:|-----------------------:"
        "|-------------------:|-------:|--------------------:|"
    )
    with (
        tempfile.TemporaryDirectory(prefix="hctx-bench-web-") as scratch,
        driver() as playwright,
        browser(playwright) as chromium,
    ):
        for size in (int(size) for size in args.sizes.split(",")):
            catalog = Path(scratch) / f"c{size}"
            paths = many(catalog, size)
            baseline = timed_ms([sys.executable, "-m", "wrapper.cli", "agents", "--json", "--catalog",
                                 str(catalog)], args.repeat)  # fmt: skip
            process = subprocess.Popen(web_argv(catalog, "--listen", "127.0.0.1:0"), stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True, env=web_env(), cwd=REPO)  # fmt: skip
            try:
                url = first_line(process).strip()
                renders = first_renders(chromium, url, size, args.loads)
                delays = latencies(chromium, url, paths, args.samples)
            finally:
                stop(process)
            render = statistics.median(renders)
            p50, p99 = percentile(delays, 0.5), percentile(delays, 0.99)
            print(f"| {size:6d} | {baseline:16.1f} | {render:20.1f}, {max(renders):7.1f} | "
                  f"{render / baseline:22.2f} | {p50:18.1f} | {p99:6.1f} | {p99 / baseline:19.2f} |",
                  flush=True)  # fmt: skip
    print()
    print(f"targets: first render <= 1000 ms at 1,000 agents; write->page p99 <= 1000 ms ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
