"""`hctx wrap -- pi`: the harness told from the program, the agent named after the working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.registry import infer_harness
from tests.wrapping import HOST, STANDIN, context_frame, env, wait_for


@pytest.mark.parametrize(
    ("argv", "harness"),
    [
        (("claude",), "claude"),
        (("/usr/local/bin/codex", "app-server"), "codex"),
        (("npx", "-y", "@openai/codex@0.171.0", "exec", "hi"), "codex"),
        (("npx", "@anthropic-ai/claude-code"), "claude"),
        (("bunx", "opencode-ai@latest", "serve"), "opencode"),
        (("npx", "--yes", "@oh-my-pi/pi-coding-agent"), "omp"),
        (("npx", "@earendil-works/pi-coding-agent@0.84.2"), "pi"),
        (("pi", "--continue"), "pi"),
        (("omp",), "omp"),
        (("vim",), None),
        (("npx", "cowsay"), None),
        (("node", "cli.js"), None),  # a bare script names no harness: --harness must say it
        (("npx",), None),
    ],
)
def test_the_harness_is_told_from_the_program_or_the_package_behind_npx(
    argv: tuple[str, ...], harness: str | None
) -> None:
    assert infer_harness(argv) == harness


def _seat_dir(tmp_path: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A working directory and a PATH whose `pi` is a stand-in: it sends its frames, then waits for
    the file named by $RELEASE (if any) before it exits."""
    work = tmp_path / name
    work.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    program = bin_dir / "pi"
    program.write_text(
        f"#!{sys.executable}\n{STANDIN}\n"
        "import os, time\nwhile os.environ.get('RELEASE') and not os.path.exists(os.environ['RELEASE']):\n"
        "    time.sleep(0.02)\n"
    )
    program.chmod(0o755)
    return work, env() | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _wrap(catalog: Path, *words: str) -> list[str]:
    return [sys.executable, "-m", "wrapper.cli", "wrap", "--catalog", str(catalog), "--host", HOST, "--", *words]


def _record(catalog: Path, seat: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((catalog / "agents" / HOST / seat / "harness-context").read_text())
    return data


def test_wrap_of_a_bare_program_infers_harness_and_agent(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    work, environ = _seat_dir(tmp_path, "my project")
    result = subprocess.run(_wrap(catalog, "pi", context_frame(5000, 32000, 15.625)), cwd=work, env=environ,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = _record(catalog, "my-project")  # the directory's name, made a valid identity
    assert (record["harness"], record["usedTokens"], record["usedPercent"]) == ("pi", 5000, 15.625)
    assert [p.name for p in (catalog / "agents" / HOST).iterdir()] == ["my-project"]


def test_a_second_seat_in_one_directory_gets_the_next_name_while_the_first_runs(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    work, environ = _seat_dir(tmp_path, "proj")
    release = tmp_path / "release"
    first = subprocess.Popen(_wrap(catalog, "pi", context_frame(1000, 32000, 3.125)), cwd=work,
                             env=environ | {"RELEASE": str(release)}, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(lambda: (catalog / "agents" / HOST / "proj" / "harness-context").exists(), what="first seat")
        second = subprocess.run(_wrap(catalog, "pi", context_frame(2000, 32000, 6.25)), cwd=work, env=environ,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert second.returncode == 0, second.stderr
        assert _record(catalog, "proj-2")["usedTokens"] == 2000
        assert _record(catalog, "proj")["usedTokens"] == 1000  # the first seat's record is its own
    finally:
        release.touch()
        assert first.wait(timeout=30) == 0
    # With the first seat ended, the directory's name is free again.
    third = subprocess.run(_wrap(catalog, "pi", context_frame(3000, 32000, 9.375)), cwd=work, env=environ,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert _record(catalog, "proj")["usedTokens"] == 3000


def test_an_unknown_program_is_refused_naming_the_five(tmp_path: Path) -> None:
    result = subprocess.run(_wrap(tmp_path, "vim"), env=env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "cannot tell which harness 'vim' is (claude, codex, omp, opencode, pi" in result.stderr
    assert "--harness" in result.stderr
    assert not (tmp_path / "agents").exists()
