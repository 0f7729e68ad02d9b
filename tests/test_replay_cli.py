"""`hctx replay` as a command: the flags and the errors a user meets."""

from __future__ import annotations

import sys
from pathlib import Path

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


CODEX_STREAM = REPO / "fixtures" / "codex" / "codex-0.171.0-stdio-main.jsonl"


def test_a_file_with_no_frame_of_the_harness_says_so_and_exits_1() -> None:
    passwd = Path("/etc/passwd")
    lines = len(passwd.read_bytes().splitlines())
    for harness in ("claude", "codex", "pi", "omp", "opencode"):
        code, out, err = replay("--harness", harness, str(passwd))
        assert (code, out) == (1, ""), harness
        assert err.endswith(f"hctx replay: read {lines} lines; none was a frame of the {harness} harness\n")
    codex_lines = len(CODEX_STREAM.read_bytes().splitlines())
    for harness in ("claude", "pi", "opencode"):  # a Codex stream handed to another harness
        code, out, err = replay("--harness", harness, str(CODEX_STREAM))
        assert (code, out) == (1, "")
        assert err.endswith(f"read {codex_lines} lines; none was a frame of the {harness} harness\n")
    code, out, err = replay("--harness", "codex", str(CODEX_STREAM))
    assert code == 0 and out and "none was a frame" not in err


def test_an_undecodable_times_file_beside_a_claude_capture_is_no_traceback(tmp_path: Path) -> None:
    capture = tmp_path / "statusline.jsonl"
    capture.write_bytes((REPO / "fixtures" / "claude" / "statusline-2.1.332.jsonl").read_bytes())
    capture.with_suffix(".times").write_bytes(b"\xff\xfe\x00 not times\n")
    code, out, err = replay("--harness", "claude", str(capture))
    assert code == 0 and '"reason": "bucket"' in out and "Traceback" not in err


def test_a_fifo_a_device_or_a_huge_file_is_refused_not_read_forever(tmp_path: Path) -> None:
    """Issue 24/26: `hctx replay` of a FIFO nobody writes, of /dev/zero, of a file over the bound."""
    import os

    from sidecar.spec import MAX_RECORDING_BYTES

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as out:
        out.truncate(MAX_RECORDING_BYTES + 1)  # sparse: no disk spent
    for path in (fifo, Path("/dev/zero"), huge):
        for harness in ("claude", "codex", "pi", "opencode"):
            code, out, err = replay("--harness", harness, str(path))
            assert (code, out) == (2, ""), (path, harness, err)
            assert str(path) in err and "Traceback" not in err
    code, _, err = replay("--harness", "codex", str(fifo))
    assert "is not a regular file" in err


def test_a_fifo_as_the_times_file_beside_a_claude_capture_does_not_hang(tmp_path: Path) -> None:
    import os

    capture = tmp_path / "statusline.jsonl"
    capture.write_bytes((REPO / "fixtures" / "claude" / "statusline-2.1.332.jsonl").read_bytes())
    os.mkfifo(capture.with_suffix(".times"))
    code, out, err = replay("--harness", "claude", str(capture))
    assert code == 0 and '"reason": "bucket"' in out and "Traceback" not in err
