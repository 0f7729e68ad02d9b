"""The Prometheus side of the `hctx metrics` tests: the real tools, and reading an exposition back."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO
from tests.wrapping import env
from wrapper.readers.metrics import Exporter
from wrapper.readers.metrics import exposition as render

RULES = REPO / "monitoring" / "hctx-alerts.yml"
RULES_TESTS = REPO / "monitoring" / "hctx-alerts.test.yml"
# The page that shows the scrape configs, the rules file and the `hctx metrics` lines to copy.
PROMETHEUS_DOC = (REPO / "docs" / "prometheus.md").read_text()
INSTALL_HINT = "run scripts/install_system_deps.sh (Debian's prometheus package; promtool comes with it)"

# One sample: its name and its labels, sorted; `up` and the exporter's catalog series have only a few.
Key = tuple[str, tuple[tuple[str, str], ...]]


def require_tool(name: str) -> str:
    """The tool's path; a test without it is skipped, or failed under CI (a skip is no proof)."""
    path = shutil.which(name)
    if path is not None:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; CI requires it: {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"{name} is not installed; {INSTALL_HINT}")


def dead(pid: int) -> bool:
    """A pid probe for which no wrapper lives: the desired state is what the claim says."""
    return False


def yaml_blocks() -> list[str]:
    """docs/prometheus.md's ```yaml blocks: the scrape configs and the rules file to copy."""
    return re.findall(r"```yaml\n(.*?)```", PROMETHEUS_DOC, re.S)


def parse(text: str) -> dict[Key, float]:
    """Every sample of an exposition (text format 0.0.4, or OpenMetrics), by name and labels."""
    reader = openmetrics_families if text.endswith("# EOF\n") else text_string_to_metric_families
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in reader(text)
        for sample in family.samples
    }


def of(samples: dict[Key, float], agent: str) -> dict[str, float]:
    """One agent's samples by series name (with `:window` for the rate limits)."""
    found = {}
    for (name, labels), value in samples.items():
        label = dict(labels)
        if label.get("agent") == agent:
            found[name + (f":{label['window']}" if "window" in label else "")] = value
    return found


def exporter_of(catalog: Path, now: int, host: str = "box", alive: Any = None) -> Exporter:
    """An exporter of `catalog` whose clock stands at `now` and whose wrappers are all dead."""
    return Exporter(lambda: catalog, host, process=False, alive=alive or dead, clock=lambda: now)


def exposition(catalog: Path, now: int, host: str = "box", *, openmetrics: bool = False) -> str:
    """The text `hctx metrics` serves for this catalog at `now`."""
    return render(exporter_of(catalog, now, host), openmetrics)


def start_exporter(catalog: Path, host: str, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """`hctx metrics` as a process and the URL it says it serves; its stderr goes to `log`
    (a pipe nobody drains would block it at its first screenful of warnings)."""
    argv = [sys.executable, "-m", "wrapper.cli", "metrics", "--catalog", str(catalog), "--host", host, *extra]
    with open(log, "wb") as err:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err, env=env(), cwd=REPO)
    deadline = time.monotonic() + 20
    while not (match := re.search(r"serving (\S+)", log.read_text())):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise AssertionError(f"hctx metrics did not start: {log.read_text()}")
        time.sleep(0.02)
    return process, match.group(1)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get(url: str, **kwargs: Any) -> str:
    with urllib.request.urlopen(url, timeout=10, **kwargs) as response:
        body: bytes = response.read()
    return body.decode()
