"""`hctx replay` as a command: the flags and the errors a user meets.

It replays recordings only (`hctx wrap --record`'s format); the lab's captures were converted once
into recordings by scripts/convert_fixtures.py, whose readers of the captures' own shapes are
tested here too (a damaged `.times` beside a Claude capture)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sidecar.spec import MAX_RECORDING_BYTES
from tests.conformance import recording_path
from tests.wrapping import REPO, run

OPENCODE = "opencode/v1.18.25"


def replay(*args: str) -> tuple[int, str, str]:
    result = run([sys.executable, "-m", "wrapper.cli", "replay", *args])
    return result.returncode, result.stdout, result.stderr


def test_the_providers_answer_in_the_recording_supplies_the_windows_before_the_events() -> None:
    code, joined, _ = replay(str(recording_path(f"{OPENCODE}/providers+events.rec")))
    assert code == 0
    assert '"windowTokens": 128000' in joined.splitlines()[0]
    code, without, _ = replay("--harness", "opencode", str(recording_path(f"{OPENCODE}/events.rec")))
    assert code == 0 and '"windowTokens": null' in without.splitlines()[0]  # no window known: withheld, never guessed


def test_an_old_flag_a_missing_file_and_a_recording_of_another_harness_are_clear_errors() -> None:
    code, out, err = replay("--providers", "x.json", "y.jsonl")
    assert (code, out) == (2, "") and "unrecognized arguments: --providers" in err
    code, out, err = replay("--harness", "claude", "/nonexistent/session.rec")
    assert (code, out) == (2, "") and "/nonexistent/session.rec" in err and "Traceback" not in err
    codex = recording_path("codex/codex-0.171.0-stdio-main.rec")
    for harness in ("claude", "pi", "opencode"):  # a Codex recording handed to another harness
        code, out, err = replay("--harness", harness, str(codex))
        assert (code, out) == (2, "") and f"is a recording of 'codex', not of '{harness}'" in err
    code, out, err = replay("--harness", "codex", str(codex))
    assert code == 0 and out and not err


def test_a_file_that_is_no_recording_is_refused_for_every_harness() -> None:
    for path in (Path("/etc/passwd"), REPO / "fixtures" / "codex" / "codex-0.171.0-stdio-main.jsonl"):
        for harness in ("claude", "codex", "pi", "omp", "opencode"):
            code, out, err = replay("--harness", harness, str(path))
            assert (code, out) == (2, ""), harness
            assert err.startswith(f"hctx replay: {path} is not a recording `hctx wrap --record` made ("), err


def test_an_undecodable_or_fifo_times_file_beside_a_claude_capture_converts_without_a_hang(tmp_path: Path) -> None:
    """The converter's reader of Claude's captures (scripts/capture_readers/claude.py)."""
    from scripts.capture_readers.claude import read_recording

    capture = tmp_path / "statusline.jsonl"
    capture.write_bytes((REPO / "fixtures" / "claude" / "statusline-2.1.332.jsonl").read_bytes())
    capture.with_suffix(".times").write_bytes(b"\xff\xfe\x00 not times\n")
    assert len(list(read_recording([capture]))) == len(capture.read_bytes().splitlines())
    capture.with_suffix(".times").unlink()
    os.mkfifo(capture.with_suffix(".times"))
    assert len(list(read_recording([capture]))) == len(capture.read_bytes().splitlines())


def test_a_fifo_a_device_or_a_huge_file_is_refused_not_read_forever(tmp_path: Path) -> None:
    """Issue 24/26: `hctx replay` of a FIFO nobody writes, of /dev/zero, of a file over the bound."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.rec"
    with huge.open("wb") as out:
        out.truncate(MAX_RECORDING_BYTES + 1)  # sparse: no disk spent
    for path in (fifo, Path("/dev/zero"), huge):
        for args in (["--harness", "codex"], []):
            code, out, err = replay(*args, str(path))
            assert (code, out) == (2, ""), (path, err)
            assert str(path) in err and "Traceback" not in err
    code, _, err = replay(str(fifo))
    assert "is not a regular file" in err
