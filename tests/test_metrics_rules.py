"""The shipped alert rules: promtool accepts them, every alert is exercised by `promtool test rules`
with the series names `hctx metrics` really exports, and docs/prometheus.md shows exactly these files."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from readers_catalog import HOST, NOW, put_claim, put_record

from tests.conftest import REPO
from tests.prometheus_tools import PROMETHEUS_DOC, RULES, RULES_TESTS, exposition, parse, require_tool, yaml_blocks
from wrapper.cli import build_parser
from wrapper.readers.metrics import DEFAULT_LISTEN

ALERTS = re.findall(r"^ {6}- alert: (\w+)$", RULES.read_text(), re.M)


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout
    assert ALERTS == [
        "HctxContextFilling", "HctxContextNearlyFull", "HctxContextHeadroomLow", "HctxContextStale",
        "HctxRateLimitHigh", "HctxAccountRateLimitHigh", "HctxAccountRateLimitNearlyExhausted",
        "HctxCatalogUnreadable", "HctxExporterDown", "HctxExporterAbsent",
    ]  # fmt: skip


def test_promtool_unit_tests_pass() -> None:
    done = promtool("test", "rules", RULES_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_proven_to_fire_by_the_unit_tests(tmp_path: Path) -> None:
    """Without its rule, each alert's expected firing is missed: every alert has a positive case."""
    rules = RULES.read_text()
    blocks = re.split(r"(?m)^(?= {6}- alert: )", rules)
    assert len(blocks) == len(ALERTS) + 1
    shutil.copy(RULES_TESTS, tmp_path / RULES_TESTS.name)
    for index, alert in enumerate(ALERTS, start=1):
        (tmp_path / RULES.name).write_text("".join(blocks[:index] + blocks[index + 1 :]))
        done = promtool("test", "rules", tmp_path / RULES_TESTS.name)
        assert done.returncode != 0 and f"alertname: {alert}" in done.stdout + done.stderr, alert


def _full_exposition(tmp_path: Path) -> set[str]:
    """Every series name `hctx metrics` exports, from a record with every field filled."""
    put_record(tmp_path, "alice", model="gpt-5", costUsd=1.5, account={"key": "0" * 32, "label": "pro"},
               rateLimitResetsAtMs={"fiveHour": NOW + 60_000, "sevenDay": NOW + 60_000})  # fmt: skip
    put_claim(tmp_path, "alice", desiredState="running")
    put_record(tmp_path, "bob", compactAtTokens=160_000)
    return {name for name, _ in parse(exposition(tmp_path, NOW, HOST))}


def test_rules_and_their_tests_use_the_exporters_real_series_names(tmp_path: Path) -> None:
    exported = _full_exposition(tmp_path)
    for path in (RULES, RULES_TESTS):
        used = set(re.findall(r"\b(hctx_[a-z_]+)\b", path.read_text()))
        assert used and used <= exported, (path.name, used - exported)
    tested = set(re.findall(r"'(hctx_[a-z_]+)\{", RULES_TESTS.read_text()))
    assert tested >= set(re.findall(r"\b(hctx_[a-z_]+)\b", RULES.read_text()))  # each one fed to a test
    # The exporters are found by their target label, never by a job name.
    assert 'up{exporter="hctx"}' in RULES.read_text() and "job=" not in RULES.read_text()
    assert '\'up{job="agents",exporter="hctx"' in RULES_TESTS.read_text()


def test_the_readme_shows_the_shipped_rules_file_verbatim() -> None:
    assert RULES.read_text() in yaml_blocks()


def test_the_readme_scrape_configs_pass_promtool(tmp_path: Path) -> None:
    (tmp_path / RULES.name).write_text(RULES.read_text())
    for name in ("ca.pem", "prometheus.pem", "prometheus.key"):
        (tmp_path / name).write_text("")  # promtool checks that the TLS files exist
    configs = [block for block in yaml_blocks() if "scrape_configs:" in block]
    assert len(configs) == 2
    for index, block in enumerate(configs):
        (tmp_path / f"prometheus-{index}.yml").write_text(block)
        done = promtool("check", "config", tmp_path / f"prometheus-{index}.yml")
        assert done.returncode == 0, done.stdout + done.stderr
    assert f'targets: ["{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}"]' in configs[0]


def test_the_readme_metrics_lines_parse() -> None:
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", PROMETHEUS_DOC, re.S) if "hctx metrics" in b]
    lines = block.strip().splitlines()
    assert len(lines) == 3
    parsed = [build_parser().parse_args(shlex.split(line)[1:]) for line in lines]
    assert parsed[0].listen is None and parsed[0].textfile is None  # the loopback default
    assert parsed[1].listen == ("0.0.0.0", 9478) and parsed[1].tls_client_ca == "ca.pem"
    assert parsed[2].textfile.suffix == ".prom" and parsed[2].interval == 15


ALERT_BLOCKS = dict(zip(ALERTS, re.split(r"(?m)^ {6}- alert: ", RULES.read_text())[1:], strict=True))
PER_AGENT = [alert for alert in ALERTS if "$labels.agent" in ALERT_BLOCKS[alert]]


def test_every_alert_says_what_and_where_to_look_and_has_its_runbook_section() -> None:
    runbook = (REPO / "docs" / "alerts.md").read_text()
    for alert, block in ALERT_BLOCKS.items():
        for key in ("summary:", "description:", f'runbook_url: "docs/alerts.md#{alert.lower()}"'):
            assert key in block, (alert, key)
        assert f"\n## {alert}\n" in runbook, alert
        assert "{{ $value }}" not in block, alert  # humanised wherever a value is shown


def test_every_per_agent_alert_needs_a_running_agent_and_a_fresh_reading() -> None:
    """The joins themselves; the unit tests prove them (a stopped, a stale, a withheld case)."""
    assert PER_AGENT == ["HctxContextFilling", "HctxContextNearlyFull", "HctxContextHeadroomLow",
                         "HctxContextStale", "HctxRateLimitHigh"]  # fmt: skip
    for alert in PER_AGENT:
        block = ALERT_BLOCKS[alert]
        assert "and on (host, agent) hctx_agent_running == 1" in block, alert
        if alert != "HctxContextStale":
            assert "time() - hctx_context_observed_timestamp_seconds < 3600" in block, alert


def test_without_the_joins_the_silent_cases_fire(tmp_path: Path) -> None:
    """Each join is what keeps the stopped and the stale agents quiet: drop it and promtool fails."""
    shutil.copy(RULES_TESTS, tmp_path / RULES_TESTS.name)
    rules = RULES.read_text()
    indent = "\n            and on (host, agent) "
    for join, silenced in ((indent + "hctx_agent_running == 1", "stopped"),
                           (indent + "time() - hctx_context_observed_timestamp_seconds < 3600", "stale")):  # fmt: skip
        assert join in rules
        (tmp_path / RULES.name).write_text(rules.replace(join, ""))
        done = promtool("test", "rules", tmp_path / RULES_TESTS.name)
        assert done.returncode != 0 and f'agent="{silenced}"' in done.stdout + done.stderr, silenced


def test_promtool_check_metrics_finds_nothing_in_the_exposition(tmp_path: Path) -> None:
    put_record(tmp_path, "alice", model="gpt-5", costUsd=1.5, compactAtTokens=160_000)
    put_claim(tmp_path, "alice", desiredState="running")
    put_record(tmp_path, "cached", harness="claude",
               promptCache={"warm": True, "expiresAtMs": NOW + 90_000, "recacheTokensIfCold": 12_500})  # fmt: skip
    put_record(tmp_path, "bad", raw=b"{")
    text = exposition(tmp_path, NOW, HOST)
    done = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
    # The linter is real: a gauge spelled like a counter is reported.
    done = subprocess.run([require_tool("promtool"), "check", "metrics"], capture_output=True, text=True, timeout=60,
                          input=text.replace("# TYPE hctx_session_tokens_total counter",
                                             "# TYPE hctx_session_tokens_total gauge"))  # fmt: skip
    assert 'hctx_session_tokens_total non-counter metrics should not have "_total" suffix' in done.stdout + done.stderr


def test_the_panel_render_draws_every_dashboard_panel_with_its_series() -> None:
    """scripts/render_panels.py (docs/prometheus.md's screenshot) draws each panel of the shipped dashboard,
    by its title, with each series' legend and last value; a panel whose queries found nothing says so."""
    import json

    from scripts.render_panels import DASHBOARD, render

    board = json.loads(DASHBOARD.read_text())
    ranges = {panel["title"]: [[] for _ in panel["targets"]] for panel in board["panels"]}
    ranges["Fleet fill"] = [[{"metric": {"host": "bravo", "agent": "hot"}, "values": [[1, "90"], [2, "97"]]}]]
    ranges["Stale agents"] = [[{"metric": {"host": "bravo", "agent": "old"}, "values": [[2, "1"]]}]]
    page = render({"ranges": ranges})
    for panel in board["panels"]:
        assert f"<h2>{panel['title']}</h2>".replace("'", "&#x27;") in page, panel["title"]
    assert "bravo/hot" in page and "bravo/old" in page
    assert page.count("No data") == len(board["panels"]) - 2
