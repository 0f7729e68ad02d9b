"""A real Prometheus server (Debian's package) scraping `hctx metrics` on a live demo fleet.

The README's scrape config and the shipped rules file are what it loads; only the intervals and the
rules' `for` durations are shortened to seconds. As root the whole scenario runs again inside a
private network namespace holding nothing but loopback (`unshare -n`), so neither Prometheus nor
the exporters can be reached from, or reach, anything else; there the first exporter runs on its
default address, the README's target. Everything it starts, it stops.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from readers_catalog import put_record

from guard.record import HarnessContext, parse_record
from tests.prometheus_tools import README, REPO, RULES, get, require_tool, start_exporter, stop, yaml_blocks
from tests.wrapping import env, wait_for
from wrapper.demo import DEMO_HOST, FLEET
from wrapper.metrics import DEFAULT_LISTEN

IN_NAMESPACE = "HCTX_TEST_NETNS"
SECOND_HOST = "bravo"


def _can_unshare() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape_config(targets: list[str]) -> str:
    """The README's scrape config with one-second intervals and these targets."""
    (config,) = [block for block in yaml_blocks() if "rule_files:" in block]
    default = json.dumps([f"{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}"])
    for line in ("  scrape_interval: 15s\n", "  evaluation_interval: 15s\n", f"      - targets: {default}\n"):
        assert config.count(line) == 1, line
    return config.replace("15s", "1s").replace(default, json.dumps(targets))


def quick_rules() -> str:
    """The shipped rules with each `for` shortened to 3 seconds, and nothing else changed."""
    rules, count = re.subn(r"(?m)^( {8}for: )\d+m$", r"\g<1>3s", RULES.read_text())
    assert count == 6
    return rules


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        body = json.loads(get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
        result = self.api("query", query=promql)["result"]
        return {tuple(sorted(item["metric"].items())): float(item["value"][1]) for item in result}

    def value(self, promql: str) -> float | None:
        """The one sample the query selects, None when it selects none."""
        found = self.query(promql)
        assert len(found) <= 1, found
        return next(iter(found.values()), None)

    def scraped_since(self, moment: float) -> bool:
        targets = self.api("targets")["activeTargets"]
        return len(targets) == 2 and all(_unix(target["lastScrape"]) > moment + 0.05 for target in targets)


def _unix(stamp: str) -> float:
    # Go prints nanoseconds; Python parses at most microseconds.
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def test_prometheus_scrapes_the_live_fleet(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    if not os.environ.get(IN_NAMESPACE) and _can_unshare():
        inner = subprocess.run(
            ["unshare", "-n", "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"{Path(__file__).relative_to(REPO)}::test_prometheus_scrapes_the_live_fleet",
             "--basetemp", str(tmp_path / "in-namespace")],
            env=env() | {IN_NAMESPACE: "1"}, cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert inner.returncode == 0 and "1 passed" in inner.stdout, inner.stdout[-8000:] + inner.stderr[-2000:]
        return
    if os.environ.get(IN_NAMESPACE):
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    scenario(prometheus, tmp_path, in_namespace=bool(os.environ.get(IN_NAMESPACE)))


def scenario(prometheus: str, tmp_path: Path, *, in_namespace: bool) -> None:
    catalog, other = tmp_path / "catalog", tmp_path / "other"
    put_record(other, "far", host=SECOND_HOST, observedAtMs=time.time_ns() // 1_000_000, usedPercent=12.5)
    started: list[subprocess.Popen[bytes]] = []
    try:
        # In the namespace the first exporter takes its default address, the README's target.
        listen = [] if in_namespace else ["--listen", f"127.0.0.1:{_free_port()}"]
        first, first_url = start_exporter(catalog, DEMO_HOST, tmp_path / "first.log", *listen)
        started.append(first)
        second, second_url = start_exporter(other, SECOND_HOST, tmp_path / "second.log", "--listen", "127.0.0.1:0")
        started.append(second)
        if in_namespace:
            assert first_url == f"http://{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}/metrics"
        targets = [urllib.parse.urlsplit(url).netloc for url in (first_url, second_url)]
        (tmp_path / "prometheus.yml").write_text(scrape_config(targets))
        (tmp_path / RULES.name).write_text(quick_rules())
        port = _free_port()
        with open(tmp_path / "prometheus.log", "wb") as log:
            server = subprocess.Popen(
                [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--web.listen-address=127.0.0.1:{port}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
                cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip
        started.append(server)
        prom = Prometheus(f"http://127.0.0.1:{port}")
        wait_for(lambda: _ready(prom.url), timeout=60, what="prometheus ready")
        groups = prom.api("rules")["groups"]
        assert [rule["name"] for group in groups for rule in group["rules"]] == re.findall(
            r"- alert: (\w+)", RULES.read_text()
        )
        assert all(rule["health"] != "err" for group in groups for rule in group["rules"])

        # The fleet runs while Prometheus scrapes it; then every series must equal its record.
        demo = subprocess.run(
            [sys.executable, "-m", "wrapper.cli", "demo", "--catalog", str(catalog), "--no-top", "--duration", "4"],
            env=env(), cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert demo.returncode == 0, demo.stderr
        finished = time.time()
        wait_for(lambda: prom.scraped_since(finished), timeout=30, what="a scrape after the fleet finished")
        withheld = 0
        for agent in FLEET:
            record = _record(catalog, agent.identity)
            selector = f'{{job="hctx",host="{DEMO_HOST}",agent="{agent.identity}",harness="{agent.harness}"}}'
            assert prom.value(f"hctx_context_used_percent{selector}") == record.used_percent, agent.identity
            assert prom.value(f"hctx_context_window_tokens{selector}") == record.window_tokens, agent.identity
            assert prom.value(f"hctx_context_compactions{selector}") == record.compactions, agent.identity
            assert prom.value(f"hctx_context_observed_timestamp_seconds{selector}") == record.observed_at_ms / 1000
            withheld += record.used_percent is None
        assert withheld >= 1  # the pi session ends right after a compaction, its percent withheld

        # The alert for the agent past 95% reaches firing; the ones below it do not.
        hot = {a.identity for a in FLEET if (p := _record(catalog, a.identity).used_percent) is not None and p >= 95}
        assert hot, "the demo fleet has an agent past 95%"
        wait_for(lambda: _firing(prom, "HctxContextNearlyFull") == hot, timeout=60, what="HctxContextNearlyFull firing")
        assert _firing(prom, "HctxExporterDown") == set()

        # The model joins on from its info series, as the README shows.
        join = "hctx_context_used_percent * on (host, agent) group_left (model) hctx_model_info"
        assert join in README.replace("\n", " ")
        models = {dict(labels)["agent"]: dict(labels)["model"] for labels in prom.query(join)}
        for agent in FLEET:
            record = _record(catalog, agent.identity)
            assert models.get(agent.identity) == (record.model if record.used_percent is not None else None)

        # Two hosts, two exporters, one query.
        hosts = prom.query("count by (host) (hctx_context_window_tokens)")
        assert hosts == {(("host", DEMO_HOST),): len(FLEET), (("host", SECOND_HOST),): 1}

        # A relaunch claim removes the record: the next scrape has no reading series for the agent.
        relaunched = "claude-sonnet"
        before = f'hctx_context_window_tokens{{host="{DEMO_HOST}",agent="{relaunched}"}}'
        assert prom.value(before) == 200000
        cwd = tmp_path / "relaunch"
        cwd.mkdir()
        wrap = subprocess.run(
            [sys.executable, "-m", "wrapper.cli", "wrap", "--agent", relaunched, "--harness", "claude",
             "--catalog", str(catalog), "--host", DEMO_HOST, "--", sys.executable, "-c", "pass"],
            env=env() | {"ST_CLAUDE_STATUSLINE_RENDERER": "true"}, cwd=cwd, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert wrap.returncode == 0, wrap.stderr
        assert not (catalog / "agents" / DEMO_HOST / relaunched / "harness-context").exists()
        claimed = time.time()
        wait_for(lambda: prom.scraped_since(claimed), timeout=30, what="a scrape after the relaunch")
        assert prom.value(before) is None
        assert prom.value(f'hctx_agent_running{{host="{DEMO_HOST}",agent="{relaunched}"}}') is not None
        assert prom.value(f'hctx_context_used_percent{{host="{DEMO_HOST}",agent="omp-worker"}}') == 112.5
    finally:
        for process in reversed(started):
            stop(process)
    assert all(process.returncode is not None for process in started)


def _ready(url: str) -> bool:
    try:
        return "Ready" in get(f"{url}/-/ready")
    except OSError:
        return False


def _record(catalog: Path, identity: str) -> HarnessContext:
    return parse_record((catalog / "agents" / DEMO_HOST / identity / "harness-context").read_bytes())


def _firing(prom: Prometheus, alert: str) -> set[str]:
    alerts = prom.api("alerts")["alerts"]
    return {a["labels"]["agent"] if "agent" in a["labels"] else a["labels"]["instance"]
            for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib would send 127.0.0.1 through an HTTP proxy from the environment."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
