"""The shipped alert rules: promtool accepts them, every alert is exercised by `promtool test rules`
with the series names `hctx metrics` really exports, and the README shows exactly these files."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from readers_catalog import HOST, NOW, put_claim, put_record

from tests.prometheus_tools import README, RULES, RULES_TESTS, dead, exposition, parse, require_tool, yaml_blocks
from wrapper.cli import build_parser
from wrapper.metrics import DEFAULT_LISTEN
from wrapper.roster import collect_roster

ALERTS = re.findall(r"^ {6}- alert: (\w+)$", RULES.read_text(), re.M)


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout
    assert ALERTS == [
        "HctxContextFilling", "HctxContextNearlyFull", "HctxContextStale", "HctxRateLimitHigh",
        "HctxAccountRateLimitHigh", "HctxAccountRateLimitNearlyExhausted",
        "HctxCatalogUnreadable", "HctxExporterDown",
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
    names = {name for name, _ in parse(exposition(collect_roster(tmp_path, NOW, here=HOST, alive=dead)))}
    return names | {"hctx_catalog_readable"}  # the collector's own, beside the roster's


def test_rules_and_their_tests_use_the_exporters_real_series_names(tmp_path: Path) -> None:
    exported = _full_exposition(tmp_path)
    for path in (RULES, RULES_TESTS):
        used = set(re.findall(r"\b(hctx_[a-z_]+)\b", path.read_text()))
        assert used and used <= exported, (path.name, used - exported)
    tested = set(re.findall(r"'(hctx_[a-z_]+)\{", RULES_TESTS.read_text()))
    assert tested >= set(re.findall(r"\b(hctx_[a-z_]+)\b", RULES.read_text()))  # each one fed to a test
    assert '\'up{job="hctx"' in RULES_TESTS.read_text() and 'up{job="hctx"}' in RULES.read_text()


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
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", README, re.S) if "hctx metrics" in b]
    lines = block.strip().splitlines()
    assert len(lines) == 3
    parsed = [build_parser().parse_args(shlex.split(line)[1:]) for line in lines]
    assert parsed[0].listen is None and parsed[0].textfile is None  # the loopback default
    assert parsed[1].listen == ("0.0.0.0", 9478) and parsed[1].tls_client_ca == "ca.pem"
    assert parsed[2].textfile.suffix == ".prom" and parsed[2].interval == 15
