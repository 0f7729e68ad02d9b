"""`hctx replay` as a command: the flags and the errors a user meets."""

from __future__ import annotations

import sys

from tests.wrapping import REPO, run

OPENCODE = REPO / "fixtures" / "opencode" / "v1.18.25"


def replay(*args: str) -> tuple[int, str, str]:
    result = run([sys.executable, "-m", "wrapper.cli", "replay", *args])
    return result.returncode, result.stdout, result.stderr


def test_providers_flag_supplies_the_windows_before_the_events() -> None:
    code, flagged, _ = replay("--harness", "opencode", "--providers", str(OPENCODE / "config_providers.json"),
                              str(OPENCODE / "events.jsonl"))  # fmt: skip
    assert code == 0
    assert '"windowTokens": 128000' in flagged.splitlines()[0]
    _, without, _ = replay("--harness", "opencode", str(OPENCODE / "events.jsonl"))
    assert '"windowTokens": null' in without.splitlines()[0]  # no window known: withheld, never guessed


def test_providers_with_another_harness_and_missing_files_are_clear_errors() -> None:
    code, out, err = replay("--harness", "codex", "--providers", "x.json", "y.jsonl")
    assert (code, out) == (2, "") and "goes with --harness opencode" in err
    code, out, err = replay("--harness", "claude", "/nonexistent/capture.jsonl")
    assert (code, out) == (2, "") and "/nonexistent/capture.jsonl" in err and "Traceback" not in err
