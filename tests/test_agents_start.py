"""`hctx agents --json`'s start-up (issue 38): what it loads, and that loading less changed no byte.

The bench (scripts/bench_status.py) measures the time; these tests hold what made it shorter: the
output over varied catalogs is the one main printed before (fixtures/agents-json, written by
tests/agents_catalogs.py), and a run of the command leaves out of its process the modules and the
model builds the JSON path does not use.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agents_catalogs import HOST, NOW, SEEDS, build
from guard_factory import wire_bytes
from readers_catalog import claim

from guard import record as record_module
from guard.errors import RecordRefused
from guard.record import parse_record
from guard.state import parse_state
from tests.conftest import REPO
from wrapper.cli import main
from wrapper.readers import roster

GOLDEN = REPO / "fixtures" / "agents-json"


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("seed", SEEDS)
def test_agents_json_prints_byte_for_byte_what_main_printed(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte of stdout and stderr and the exit code, for the roster and for one agent."""
    monkeypatch.setattr(roster, "now_ms", lambda: NOW)
    catalog = tmp_path / "catalog"
    build(catalog, seed)
    code, out, err = run(["agents", "--json", "--catalog", str(catalog), "--host", HOST])
    assert out == (GOLDEN / f"{seed}.out").read_text()
    assert err.replace(str(catalog), "CATALOG") == (GOLDEN / f"{seed}.err").read_text()
    assert f"{code}\n" == (GOLDEN / f"{seed}.code").read_text()
    first = sorted(path.name for path in (catalog / "agents" / HOST).iterdir())[0]
    _, one, _ = run(["agents", f"{HOST}/{first}", "--json", "--catalog", str(catalog), "--host", HOST])
    assert one == (GOLDEN / f"{seed}.one").read_text()


def test_the_golden_catalogs_hold_what_they_claim_to() -> None:
    """The fixtures are not a roster of nulls: readings, refusals, stale, subagents, caches, shared
    accounts, every desired state, warnings."""
    rows = [row for seed in SEEDS for row in json.loads((GOLDEN / f"{seed}.out").read_text())]
    contexts = [row["context"] for row in rows if row["context"] is not None]
    limits = [row["accountRateLimits"] for row in rows if row["accountRateLimits"] is not None]
    assert len(rows) == 240 and len(contexts) > 120
    assert any(context["stale"] for context in contexts) and not all(context["stale"] for context in contexts)
    assert any("subagents" in context for context in contexts)
    assert any("promptCache" in context for context in contexts)
    assert any("rateLimitsAtMs" in context for context in contexts)
    assert any(context["account"] is not None for context in contexts)
    assert any(
        window and window["fromAnotherAgent"]
        for group in limits
        for window in group.values()
        if isinstance(window, dict)
    )
    assert {row["desiredState"] for row in rows} == {None, "running", "stopped"}
    errors = "".join((GOLDEN / f"{seed}.err").read_text() for seed in SEEDS)
    for reason in ("invalid record", "harness-state refused", "in the future", "malformed JSON", "not a regular file"):
        assert reason in errors


# What `agents --json` must not load: the text renderer and what only it needs, the claim's writer,
# logging (nothing on its path logs).
NOT_LOADED = (
    "logging",
    "wrapper.readers.render",
    "wrapper.readers.tint",
    "wrapper.readers.forecast",
    "guard.store",
    "guard.atomic",
    "guard.locks",
)
# The models the JSON path never validates or dumps itself: built only when something does.
NOT_BUILT = (
    "guard.record.ContextFields",
    "guard.record.RateLimits",
    "guard.record.Subagent",
    "guard.projection.Context",
    "guard.projection.SubagentReading",
    "guard.state.PastClaim",
    "guard.state.Unobserved",
)

_PROBE = """
import importlib, json, sys
from wrapper.cli import main
code = main(["agents", "--json", "--catalog", sys.argv[1], "--host", "box"])
built = {}
for name in sys.argv[2:]:
    module, _, model = name.rpartition(".")
    built[name] = getattr(importlib.import_module(module), model).__pydantic_complete__
import pydantic.plugin._loader as plugins
scanned = plugins._plugins is not None  # pydantic's cache of the installed plugins it looked for
sys.stderr.write(json.dumps({"code": code, "modules": sorted(sys.modules), "built": built, "scanned": scanned}))
"""


def test_agents_json_loads_only_what_it_prints(tmp_path: Path) -> None:
    """A whole process, as the console script starts it, over a catalog of every kind of agent."""
    catalog = tmp_path / "catalog"
    build(catalog, 0)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(catalog), *NOT_BUILT],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        timeout=60,
        check=False,
    )
    probe = json.loads(done.stderr[done.stderr.rindex('{"code"') :])
    assert probe["code"] == 0 and json.loads(done.stdout)
    loaded = set(probe["modules"])
    assert "guard.record" in loaded and "pydantic" in loaded  # the records are still validated by their model
    assert sorted(loaded.intersection(NOT_LOADED)) == []
    assert probe["built"] == dict.fromkeys(NOT_BUILT, False)
    assert probe["scanned"] is False  # no scan of every installed package for pydantic plugins (~10 ms)


def test_only_the_readers_that_start_no_process_turn_pydantics_plugins_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PYDANTIC_DISABLE_PLUGINS` is set in the process of a reader that starts none, never in one
    whose environment a harness or a user's command inherits (`wrap`, `watch --exec`); a value the
    user set is kept."""
    from wrapper import cli

    assert cli.COMMAND_HOMES["agents"] in cli.PLUGINLESS_HOMES
    assert all(cli.COMMAND_HOMES[name] not in cli.PLUGINLESS_HOMES for name in ("wrap", "watch", "adopt", "demo"))
    monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", "logfire")
    with pytest.raises(SystemExit):
        cli.main(["agents", "--help"])
    assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == "logfire"


def test_a_text_without_the_escape_is_not_walked_for_nul(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NUL check reads the text first: only a text spelling `\\u0000` is walked, and that one is
    still refused (record and claim alike)."""

    def no_walk(value: object) -> list[str]:
        raise AssertionError("walked a text that spells no NUL")

    data = wire_bytes(model="gpt-5 \\u0000 escaped backslash, no NUL")  # JSON `\\\\u0000`: text, not NUL
    with monkeypatch.context() as patched:
        patched.setattr(record_module, "strings_of", no_walk)
        assert parse_record(wire_bytes()).harness == "codex"
        assert parse_state(json.dumps(claim("alpha")).encode()).agent == "alpha"
        with pytest.raises(AssertionError, match="walked"):
            parse_record(data)  # spells the escape: walked
    assert parse_record(data).model == "gpt-5 \\u0000 escaped backslash, no NUL"
    with pytest.raises(RecordRefused, match="NUL character"):
        parse_record(wire_bytes(model="nul \x00 inside"))
    with pytest.raises(RecordRefused, match="NUL character"):
        parse_state(json.dumps(claim("alpha", incarnation="a\x00b")).encode())
