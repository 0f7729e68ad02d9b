"""Every command in the README runs, and the package installs with what it ships."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.wrapping import REPO, env
from wrapper.cli import build_parser

README = (REPO / "README.md").read_text()


def sh_blocks() -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", README, re.S)]


def block_with(text: str) -> list[str]:
    return next(block for block in sh_blocks() if any(text in line for line in block))


def test_the_two_commands_are_the_ones_ci_runs() -> None:
    assert block_with("hctx demo") == ["pip install . && hctx demo"]
    assert block_with("scripts/test") == ["scripts/test"]
    assert "exec scripts/test" in (REPO / ".ci" / "run").read_text()


def test_every_wrap_line_parses_and_names_a_harness_the_live_tests_run() -> None:
    lines = block_with("hctx wrap")
    assert len(lines) == 6
    harnesses = set()
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.command_line[0] == "--" and args.command_line[1] == args.harness.replace("omp", "omp")
        harnesses.add(args.harness)
    assert harnesses == {"claude", "codex", "pi", "omp", "opencode"}
    live = {path.stem.split("_")[1] for path in (REPO / "tests" / "live").glob("test_*_live.py")}
    assert {"claude", "codex", "pi", "opencode"} <= live  # omp runs in test_pi_live.py


def test_the_reading_commands_run_as_written(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    script = "\n".join(block_with("hctx agents")).replace("/tmp/hctx-demo", str(catalog))
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env() | {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert '"identity": "claude-1m"' in result.stdout  # jq's filter output
    assert "advisory:" in result.stdout  # doctor on a fleet with an agent past 80%
    assert "== record" in result.stdout or "record" in result.stdout  # inspect
    assert "Traceback" not in result.stderr


def test_schema_and_replay_run_as_written() -> None:
    for line in block_with("hctx schema"):
        result = subprocess.run(shlex.split(line), env=env(), capture_output=True, text=True, cwd=REPO, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
    replay = subprocess.run(shlex.split(block_with("hctx replay")[1]), env=env(), capture_output=True, text=True,
                            cwd=REPO, timeout=60)  # fmt: skip
    assert '"reason": "compaction"' in replay.stdout
