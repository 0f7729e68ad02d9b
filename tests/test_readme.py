"""Every command in the README runs, and the package installs with what it ships."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.wrapping import REPO, env
from wrapper.cli import build_parser

README = (REPO / "README.md").read_text()
# The README's first command: a venv of its own, so it works where `pip install .` is refused (PEP 668).
FIRST_COMMAND = "python3 -m venv .hctx && .hctx/bin/pip install . && .hctx/bin/hctx demo"


def sh_blocks() -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", README, re.S)]


def block_with(text: str) -> list[str]:
    return next(block for block in sh_blocks() if any(text in line for line in block))


def test_the_two_commands_are_the_ones_ci_runs() -> None:
    assert block_with("hctx demo") == [FIRST_COMMAND]  # run as printed by tests/test_wheel.py
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


def test_the_wrap_lines_on_a_machine_without_the_harnesses_leave_no_ghost_agent(tmp_path: Path) -> None:
    """Each line exits 127 naming its program; nothing is claimed, no sidecar starts, and the
    readers then see no agent at all (issue 27: six `stopped ctx:-` rows and `ok: 6 agents`)."""
    catalog, home = tmp_path / "catalog", tmp_path / "home"
    catalog.mkdir()
    home.mkdir()
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # hctx, and none of the harnesses
    assert not any(shutil.which(name, path=path) for name in ("claude", "codex", "pi", "omp", "opencode"))
    environ = env() | {"HOME": str(home), "HCTX_CATALOG": str(catalog), "PATH": path}
    for line in block_with("hctx wrap"):
        result = subprocess.run(["bash", "-c", line], env=environ, capture_output=True, text=True, timeout=60,
                                cwd=tmp_path)  # fmt: skip
        program = shlex.split(line)[shlex.split(line).index("--") + 1]
        assert result.returncode == 127, (line, result.stderr)
        assert f"hctx wrap: cannot start {program!r}: no {program!r} on PATH" in result.stderr
    assert list(catalog.rglob("*")) == []  # no agent directory, no claim, no sidecar log
    agents = subprocess.run(["hctx", "agents"], env=environ, capture_output=True, text=True, timeout=60)
    doctor = subprocess.run(["hctx", "doctor"], env=environ, capture_output=True, text=True, timeout=60)
    assert (agents.returncode, agents.stdout) == (0, "no agents\n")
    assert doctor.returncode == 0 and "ok: 6 agents" not in doctor.stdout and "stopped" not in agents.stdout


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
