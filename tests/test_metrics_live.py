"""A real Prometheus server (Debian's package) scraping `hctx metrics` on a live demo fleet.

docs/prometheus.md's scrape config and the shipped rules file are what it loads; only the intervals and the
rules' `for` durations are shortened to seconds. As root the whole scenario runs again inside a
private network namespace holding nothing but loopback (`unshare -n`), so neither Prometheus nor
the exporters can be reached from, or reach, anything else; there the first exporter runs on its
default address, the scrape config's target. Everything it starts, it stops.
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
from readers_catalog import put_claim, put_record

from guard.record import HarnessContext, parse_record
from tests.prometheus_tools import PROMETHEUS_DOC, REPO, RULES, get, require_tool, start_exporter, stop, yaml_blocks
from tests.wrapping import env, wait_for
from wrapper.demo import DEMO_HOST, FLEET
from wrapper.readers.metrics import DEFAULT_LISTEN

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
    """docs/prometheus.md's scrape config with one-second intervals and these targets."""
    (config,) = [block for block in yaml_blocks() if "rule_files:" in block]
    default = json.dumps([f"{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}"])
    for line in ("  scrape_interval: 15s\n", "  evaluation_interval: 15s\n", f"      - targets: {default}\n"):
        assert config.count(line) == 1, line
    return config.replace("15s", "1s").replace(default, json.dumps(targets))


def quick_rules() -> str:
    """The shipped rules with each `for` shortened to 3 seconds, and nothing else changed."""
    rules, count = re.subn(r"(?m)^( {8}for: )\d+m$", r"\g<1>3s", RULES.read_text())
    assert count == len(re.findall(r"- alert: ", rules))
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
        """Both targets scraped after `moment`, and served: a scrape past its 1 s timeout (a loaded
        machine) is a scrape too, but it leaves every series of its target stale."""
        targets = self.api("targets")["activeTargets"]
        return len(targets) == 2 and all(
            target["health"] == "up" and _unix(target["lastScrape"]) > moment + 0.05 for target in targets
        )


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


# The second host's agents, all claimed running but for `parked`: each per-agent alert must fire for
# `hot` alone (stopped, stale and cool agents stay silent) and the stale one for `old` alone.
SECOND_FLEET: dict[str, dict[str, Any]] = {
    "far": {"usedPercent": 12.5},
    "hot": {"usedPercent": 97.0, "usedTokens": 250_000, "compactAtTokens": 255_000,
            "rateLimits": {"fiveHour": 95.0, "sevenDay": 40.0}},
    "parked": {"usedPercent": 97.0, "usedTokens": 250_000, "compactAtTokens": 255_000,
               "rateLimits": {"fiveHour": 95.0, "sevenDay": 40.0}},
    "old": {"usedPercent": 85.0, "usedTokens": 250_000, "compactAtTokens": 255_000, "ageMs": 2 * 3600_000,
            "rateLimits": {"fiveHour": 95.0, "sevenDay": 40.0}},
}  # fmt: skip


def second_fleet(catalog: Path) -> None:
    now = time.time_ns() // 1_000_000
    for identity, fields in SECOND_FLEET.items():
        fields = dict(fields)
        observed = now - fields.pop("ageMs", 0)
        put_record(catalog, identity, host=SECOND_HOST, observedAtMs=observed, writtenAtMs=observed, **fields)
        put_claim(catalog, identity, host=SECOND_HOST, desiredState="stopped" if identity == "parked" else "running")


def scenario(prometheus: str, tmp_path: Path, *, in_namespace: bool) -> None:
    catalog, other = tmp_path / "catalog", tmp_path / "other"
    second_fleet(other)
    started: list[subprocess.Popen[bytes]] = []
    try:
        # In the namespace the first exporter takes its default address, the scrape config's target.
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
            assert prom.value(f"hctx_context_compactions_total{selector}") == record.compactions, agent.identity
            assert prom.value(f"hctx_context_observed_timestamp_seconds{selector}") == record.observed_at_ms / 1000
            withheld += record.used_percent is None
        assert withheld >= 1  # the pi session ends right after a compaction, its percent withheld

        # Every per-agent alert fires for the running, fresh, hot agent alone: never for the demo's
        # agents (stopped now, one of them past 95%), the stopped `parked`, or the stale `old`.
        stopped_hot = {a.identity for a in FLEET if (p := _record(catalog, a.identity).used_percent) and p >= 95}
        assert stopped_hot, "the demo fleet has an agent past 95%"
        for alert in ("HctxContextNearlyFull", "HctxContextFilling", "HctxContextHeadroomLow", "HctxRateLimitHigh"):
            wait_for(lambda alert=alert: _firing(prom, alert) == {"hot"}, timeout=60, what=f"{alert} firing")
        wait_for(lambda: _firing(prom, "HctxContextStale") == {"old"}, timeout=60, what="HctxContextStale firing")
        time.sleep(4)  # past every `for`: nothing else joins them (`hot` may have left with a scrape timed out)
        for alert in ("HctxContextNearlyFull", "HctxContextFilling", "HctxContextHeadroomLow", "HctxRateLimitHigh"):
            assert _firing(prom, alert) | _pending(prom, alert) <= {"hot"}, alert
        assert _firing(prom, "HctxExporterDown") | _firing(prom, "HctxExporterAbsent") == set()
        annotations = _annotations(prom, "HctxContextHeadroomLow")
        assert annotations["summary"] == f"{SECOND_HOST}/hot: 5k tokens left before it compacts", annotations
        assert annotations["runbook_url"] == "docs/alerts.md#hctxcontextheadroomlow"

        # Prometheus negotiated OpenMetrics: it knows the counters and the info family as such.
        metadata = prom.api("metadata")
        for name, kind in (("hctx_session_tokens", "counter"), ("hctx_context_compactions", "counter"),
                           ("hctx_model", "info"), ("hctx_context_used_percent", "gauge"),
                           ("hctx_exporter_build", "info")):  # fmt: skip
            assert [entry["type"] for entry in metadata.get(name, [])][:1] == [kind], (name, metadata.get(name))
        assert prom.value(f'process_resident_memory_bytes{{instance="{targets[1]}"}}') is not None

        check_dashboard(prom, catalog, targets, tmp_path)

        # The model joins on from its info series, as docs/prometheus.md shows.
        join = "hctx_context_used_percent * on (host, agent) group_left (model) hctx_model_info"
        assert join in PROMETHEUS_DOC.replace("\n", " ")
        models = {dict(labels)["agent"]: dict(labels)["model"] for labels in prom.query(join)}
        for agent in FLEET:
            record = _record(catalog, agent.identity)
            assert models.get(agent.identity) == (record.model if record.used_percent is not None else None)

        # Two hosts, two exporters, one query.
        hosts = prom.query("count by (host) (hctx_context_window_tokens)")
        assert hosts == {(("host", DEMO_HOST),): len(FLEET), (("host", SECOND_HOST),): len(SECOND_FLEET)}

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


def _firing(prom: Prometheus, alert: str, state: str = "firing") -> set[str]:
    alerts = prom.api("alerts")["alerts"]
    return {a["labels"]["agent"] if "agent" in a["labels"] else a["labels"].get("instance", "")
            for a in alerts if a["labels"]["alertname"] == alert and a["state"] == state}  # fmt: skip


def _pending(prom: Prometheus, alert: str) -> set[str]:
    return _firing(prom, alert, "pending")


def _annotations(prom: Prometheus, alert: str) -> dict[str, str]:
    (found,) = [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == alert]
    annotations: dict[str, str] = found["annotations"]
    return annotations


DASHBOARD = REPO / "monitoring" / "hctx-dashboard.json"


def dashboard_queries() -> dict[str, list[str]]:
    """Every panel's PromQL, by title, with the `host` variable at its "All" value."""
    board = json.loads(DASHBOARD.read_text())
    (host,) = [v for v in board["templating"]["list"] if v["name"] == "host"]
    return {panel["title"]: [t["expr"].replace("$host", host["allValue"]) for t in panel["targets"]]
            for panel in board["panels"]}  # fmt: skip


def _agents(result: dict[tuple[tuple[str, str], ...], float]) -> dict[str, float]:
    return {f"{dict(labels)['host']}/{dict(labels)['agent']}": value for labels, value in result.items()}


def check_dashboard(prom: Prometheus, catalog: Path, targets: list[str], tmp_path: Path) -> None:
    """Each panel's queries return exactly the series the records and the claims imply."""
    queries = dashboard_queries()
    results = {title: [prom.query(expr) for expr in exprs] for title, exprs in queries.items()}
    hot, far, old = (f"{SECOND_HOST}/{name}" for name in ("hot", "far", "old"))
    demo = {f"{DEMO_HOST}/{agent.identity}" for agent in FLEET}
    assert _agents(results["Fleet fill"][0]) == {far: 12.5, hot: 97.0, old: 85.0}
    assert [list(r.values()) for r in results["Running agents at or above 80% / 95%"]] == [[1.0], [1.0]]
    assert _agents(results["Headroom to the harness's own compaction point"][0]) == {hot: 5000.0, old: 5000.0}
    compactions = _agents(results["Compactions in the last hour"][0])
    assert set(compactions) == demo | {f"{SECOND_HOST}/{name}" for name in SECOND_FLEET}, set(compactions)
    assert all(value >= 0 for value in compactions.values())
    rates = results["Account rate limits"][0]
    assert {(dict(k)["agent"], dict(k)["window"]): v for k, v in rates.items() if dict(k)["agent"] == "hot"} == {
        ("hot", "five_hour"): 95.0, ("hot", "seven_day"): 40.0}  # fmt: skip
    assert _agents(results["Stale agents"][0]) == {old: 1.0}
    running, every = results["Agents per host"]
    assert {dict(k)["host"]: v for k, v in running.items()} == {DEMO_HOST: 0.0, SECOND_HOST: 3.0}
    assert {dict(k)["host"]: v for k, v in every.items()} == {DEMO_HOST: len(demo), SECOND_HOST: len(SECOND_FLEET)}
    up, took = results["Exporters"]
    assert {dict(k)["instance"]: v for k, v in up.items()} == dict.fromkeys(targets, 1.0)
    assert {dict(k)["instance"] for k in took} == set(targets) and all(0 <= v < 30 for v in took.values())
    ranges = {title: [prom.api("query_range", query=expr, start=str(time.time() - 60), end=str(time.time()),
                                step="2")["result"] for expr in exprs]
              for title, exprs in queries.items()}  # fmt: skip
    (tmp_path / "panels.json").write_text(json.dumps({"queries": queries, "ranges": ranges}))
    if out := os.environ.get("HCTX_PANELS_OUT"):
        Path(out).write_text(json.dumps({"queries": queries, "ranges": ranges}, indent=1))


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib would send 127.0.0.1 through an HTTP proxy from the environment."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
