"""`hctx scan`: unmanaged Claude and Codex sessions read from their transcripts, through the CLI."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.harnesses.claude.windows import shipped_model_table
from sidecar.transcripts import TAIL_BUDGET_BYTES
from tests.wrapping import read_chars
from wrapper.cli import main
from wrapper.readers.scan import parse_duration

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT / "fixtures" / "transcripts"
SONNET_SESSION = "fdb85929-1fc5-4043-8b56-f9c792819382"  # transcript-2.1.250-sonnet45.jsonl
OPUS_250_SESSION = "d817b9b9-785f-4046-81df-a37e49f0990f"  # transcript-2.1.250.jsonl
OPUS_332_SESSION = "3a4a852d-39cf-4518-b93a-ff6a632801e6"  # transcript-2.1.332.jsonl
CODEX_THREAD = "01a2296f-0383-7d63-ae7b-88a8d43eee9a"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "XDG_CONFIG_HOME", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def claude_session(config_dir: Path, fixture: str, session: str, project: str = "-work-repo") -> Path:
    directory = config_dir / "projects" / project
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{session}.jsonl"
    path.write_bytes((TRANSCRIPTS / fixture).read_bytes())
    return path


def codex_rollout(codex_home: Path, version: str = "0.151.0", thread: str = CODEX_THREAD) -> Path:
    """The lab's rollout lines of one thread, in a file named as Codex names it."""
    directory = codex_home / "sessions" / "2026" / "11" / "29"
    directory.mkdir(parents=True, exist_ok=True)
    source = TRANSCRIPTS / f"codex-{version}" / "rollout-token-events.jsonl"
    lines = [line for line in source.read_bytes().splitlines() if thread.encode() in line]
    path = directory / f"rollout-2026-11-29T22-31-10-{thread}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def scan_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["scan", "--json", *args]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list)
    return rows


def by_session(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["sessionId"]: row for row in rows}


def test_claude_and_codex_sessions_with_their_window_sources(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    codex_rollout(home / ".codex")
    rows = by_session(scan_json(capsys, "--since", "1h"))
    claude, codex = rows[SONNET_SESSION], rows[CODEX_THREAD]

    assert claude["harness"] == "claude"
    assert claude["usedTokens"] == 2500 and claude["usedTokens"] != 2520  # output is not occupancy
    assert claude["windowTokens"] == 200000 and claude["windowSource"] == "model-table"
    assert claude["usedPercent"] == 1.25
    assert claude["model"] == "claude-sonnet-4-5"
    assert claude["compactions"] == 2
    assert claude["lastCompactionTrigger"] == "auto"
    assert (claude["lastCompactionPreTokens"], claude["lastCompactionPostTokens"]) == (3042, 1122)
    assert claude["compactedSinceReading"] is False
    assert claude["observedAtMs"] == 1795992227928  # the reply's own timestamp, not the file's mtime
    assert claude["ageMs"] >= 0 and claude["path"].endswith(f"{SONNET_SESSION}.jsonl")

    # The resumed 0.151.0 turn is the latest token_count: 22,300 of 190,000 through Codex's baseline.
    assert codex["harness"] == "codex"
    assert (codex["usedTokens"], codex["windowTokens"], codex["windowSource"]) == (22300, 190000, "transcript")
    assert codex["usedPercent"] == 6 and codex["usedPercent"] != 12  # not the naive 22300 / 190000
    assert codex["sessionTotalTokens"] == 22300
    assert codex["compactions"] == 2 and codex["lastCompactionTrigger"] == "unknown"
    assert codex["rateLimits"] == {"fiveHour": 63.0, "sevenDay": 47.0}  # 62.5 in the rollout, rounded as Codex does


def test_an_unknown_model_has_no_window_and_no_percent(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2.1.250 wrote `claude-opus-5` for a 1M-window [1m] session: the id alone cannot say which tier.
    claude_session(home / ".claude", "transcript-2.1.250.jsonl", OPUS_250_SESSION)
    claude_session(home / ".claude", "transcript-2.1.332.jsonl", OPUS_332_SESSION)
    rows = by_session(scan_json(capsys))
    unknown, known = rows[OPUS_250_SESSION], rows[OPUS_332_SESSION]
    assert unknown["model"] == "claude-opus-5" and unknown["usedTokens"] == 12500
    assert unknown["windowTokens"] is None and unknown["usedPercent"] is None and unknown["windowSource"] is None
    assert "claude-opus-5" not in shipped_model_table()
    assert known["windowTokens"] == 1000000 and known["usedPercent"] == 1.25 and known["compactions"] == 3


def test_the_user_table_extends_and_removes(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    claude_session(home / ".claude", "transcript-2.1.250.jsonl", OPUS_250_SESSION)
    claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    table = home / "cfg" / "hctx" / "models.json"
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({
        "schema": "hctx.model-windows.v1", "windows": {"claude-opus-5": 1000000, "claude-sonnet-4-5": None},
    }))  # fmt: skip
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "cfg"))
    rows = by_session(scan_json(capsys))
    assert rows[OPUS_250_SESSION]["windowTokens"] == 1000000 and rows[OPUS_250_SESSION]["usedPercent"] == 1.25
    assert rows[SONNET_SESSION]["windowTokens"] is None


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"schema":"other","windows":{}}', b'{"schema":"hctx.model-windows.v1","windows":{"m":-1}}',
     b'{"schema":"hctx.model-windows.v1","windows":{"m":true}}', b'{"schema":"hctx.model-windows.v1","windows":[]}',
     b'{"schema":"hctx.model-windows.v1","windows":{"claude-sonnet-4-5":1152921504606846976}}'],  # 2**60: past 2**53
)  # fmt: skip
def test_a_broken_user_table_warns_and_the_shipped_one_stands(
    home: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    table = home / ".config" / "hctx" / "models.json"
    table.parent.mkdir(parents=True)
    table.write_bytes(content)
    assert main(["scan", "--json"]) == 0
    captured = capsys.readouterr()
    assert "model table" in captured.err
    assert json.loads(captured.out)[0]["windowTokens"] == 200000


def test_config_dir_variables_are_honoured_and_since_filters(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = claude_session(home / "claude-cfg", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    claude_session(home / ".claude", "transcript-2.1.332.jsonl", OPUS_332_SESSION)  # not the configured dir
    codex_rollout(home / "codex-home")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(home / "claude-cfg"))
    monkeypatch.setenv("CODEX_HOME", str(home / "codex-home"))
    assert set(by_session(scan_json(capsys))) == {SONNET_SESSION, CODEX_THREAD}
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert set(by_session(scan_json(capsys, "--since", "1h"))) == {CODEX_THREAD}
    assert set(by_session(scan_json(capsys, "--since", "3h"))) == {SONNET_SESSION, CODEX_THREAD}


def _line(**fields: Any) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def test_clear_and_compact_behave_as_the_decision_record_says(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reply = _line(type="assistant", timestamp="2026-11-29T22:00:00Z",
                  message={"model": "claude-sonnet-4-5", "usage": {"input_tokens": 150000}})  # fmt: skip
    boundary = _line(type="system", subtype="compact_boundary", timestamp="2026-11-29T22:01:00Z",
                     compactMetadata={"trigger": "manual", "preTokens": 150000, "postTokens": 900})  # fmt: skip
    projects = home / ".claude" / "projects" / "-work"
    projects.mkdir(parents=True)
    compacted = "11111111-1111-1111-1111-111111111111"
    cleared = "22222222-2222-2222-2222-222222222222"
    (projects / f"{compacted}.jsonl").write_bytes(reply + boundary)
    (projects / f"{cleared}.jsonl").write_bytes(_line(type="user", message={"content": "/clear"}))
    rows = by_session(scan_json(capsys))
    # /compact: the value stays stale until the next assistant message, and the row says so.
    assert rows[compacted]["usedTokens"] == 150000 and rows[compacted]["compactedSinceReading"] is True
    assert rows[compacted]["compactions"] == 1 and rows[compacted]["lastCompactionTrigger"] == "manual"
    # /clear: a new session file, empty until its first reply: no reading, no age.
    assert rows[cleared]["usedTokens"] is None and rows[cleared]["usedPercent"] is None
    assert rows[cleared]["observedAtMs"] is None and rows[cleared]["ageMs"] is None


def test_the_table_shows_the_meter_and_the_window_source(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    codex_rollout(home / ".codex")
    assert main(["scan"]) == 0
    out = capsys.readouterr().out
    assert "3k/200k" in out and "model-table" in out
    assert "22k/190k" in out and "transcript" in out
    assert "\x1b[" not in out  # not a terminal: no colour


def test_nothing_to_scan(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan"]) == 0
    assert capsys.readouterr().out == "no sessions\n"
    assert main(["scan", "--json"]) == 0
    assert capsys.readouterr().out == "[]\n"


def test_json_is_one_array_as_for_agents(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    older = claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    os.utime(older, (time.time() - 60, time.time() - 60))
    codex_rollout(home / ".codex")
    assert main(["scan", "--json"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (lines[0], lines[-1], len(lines)) == ("[", "]", 4)  # one session per line, inside one array
    assert [row["harness"] for row in json.loads(out)] == ["codex", "claude"]  # newest first


def test_every_json_option_prints_one_array_and_says_so() -> None:
    """The convention: `--json` is one JSON array (`jq '.[]'`); only a single named agent is an object,
    and `hctx status`, whose `--json` is waybar's custom-module object (issue 38), which says so."""
    from wrapper.cli import build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    documented = {}
    for name, parser in commands.choices.items():
        for action in parser._actions:
            if "--json" in action.option_strings:
                documented[name] = action.help or ""
    assert {"agents", "scan", "status"} <= documented.keys()
    assert "waybar's custom-module JSON" in documented.pop("status")
    for name, text in documented.items():
        assert "one JSON array" in text and "jq '.[]'" in text, name


def _reply(tokens: int) -> bytes:
    return _line(type="assistant", timestamp="2026-11-29T22:00:00Z",
                 message={"model": "claude-sonnet-4-5", "usage": {"input_tokens": tokens}})  # fmt: skip


def test_an_out_of_range_count_is_null_with_a_warning_and_the_rest_is_listed(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    projects = home / ".claude" / "projects" / "-work"
    projects.mkdir(parents=True)
    huge, fine = "33333333-3333-3333-3333-333333333333", "44444444-4444-4444-4444-444444444444"
    (projects / f"{huge}.jsonl").write_bytes(_reply(2**53 + 1))
    (projects / f"{fine}.jsonl").write_bytes(_reply(1000))
    rollout = codex_rollout(home / ".codex")
    lines = [json.loads(line) for line in rollout.read_bytes().splitlines()]
    latest = next(line for line in reversed(lines) if (line["payload"].get("info") or {}).get("last_token_usage"))
    latest["payload"]["info"]["last_token_usage"]["total_tokens"] = 2**53 + 1
    rollout.write_text("".join(json.dumps(line) + "\n" for line in lines))

    assert main(["scan", "--json"]) == 0
    captured = capsys.readouterr()
    rows = by_session(json.loads(captured.out))
    assert rows[fine]["usedTokens"] == 1000 and rows[fine]["problem"] is None
    assert rows[huge]["usedTokens"] is None and rows[huge]["usedPercent"] is None
    assert rows[huge]["problem"] == "usedTokens 9007199254740993 is out of range (above 2**53); shown as null"
    assert rows[CODEX_THREAD]["usedTokens"] is None and "total_tokens" in rows[CODEX_THREAD]["problem"]
    warnings = captured.err.splitlines()
    assert len(warnings) == 2 and all(line.startswith("hctx scan: ") for line in warnings)
    assert any(f"{huge}.jsonl: usedTokens 9007199254740993 is out of range" in line for line in warnings)
    assert main(["scan"]) == 0  # the table too
    assert "(usedTokens 9007199254740993 is out of range" in capsys.readouterr().out


def test_a_session_file_dated_before_1970_is_read(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    path.write_bytes(_line(type="user", message={"content": "no reply yet"}))
    os.utime(path, (-86_400, -86_400))
    (row,) = scan_json(capsys, "--since", "100000w")
    assert row["modifiedAtMs"] == 0 and row["usedTokens"] is None


def test_hostile_session_files_cost_a_row_never_the_scan(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    projects = home / ".claude" / "projects" / "-work"
    projects.mkdir(parents=True)
    (projects / "dir.jsonl").mkdir()
    (projects / "link.jsonl").symlink_to("/etc/passwd")
    (projects / "garbage.jsonl").write_bytes(os.urandom(4096) + b"\n\x00\xff{[")
    (projects / "wrong.jsonl").write_bytes(
        _line(type="assistant", timestamp="2026-11-29T22:00:00Z", message={"usage": {"input_tokens": "many"}})
    )
    unreadable = projects / "unreadable.jsonl"
    unreadable.write_bytes(b"{}")
    unreadable.chmod(0)
    rows = scan_json(capsys)
    named = {Path(row["path"]).name: row for row in rows}
    assert "dir.jsonl" not in named and "link.jsonl" not in named
    assert named["garbage.jsonl"]["usedTokens"] is None
    assert named["wrong.jsonl"]["usedTokens"] is None
    assert "unreadable.jsonl" in named  # root reads it anyway; otherwise the row carries the problem


def test_a_1gb_transcript_is_scanned_by_its_tail(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = claude_session(home / ".claude", "transcript-2.1.250-sonnet45.jsonl", SONNET_SESSION)
    tail = path.read_bytes()
    with path.open("wb") as handle:
        handle.truncate(1 << 30)
        handle.seek(1 << 30)
        handle.write(b"\n" + tail)
    before = read_chars()
    rows = scan_json(capsys)
    read = read_chars() - before
    assert rows[0]["usedTokens"] == 2500 and rows[0]["compactions"] is None  # the count needs the whole file
    assert rows[0]["lastCompactionTrigger"] == "auto"
    # its tail (at most the tail budget), the rest of the home and the modules it imports; never the gigabyte
    assert read < TAIL_BUDGET_BYTES + (8 << 20), read


@pytest.mark.parametrize(("text", "ms"), [("90s", 90_000), ("30m", 1_800_000), ("2h", 7_200_000),
                                          ("7d", 604_800_000), ("1h30m", 5_400_000), ("1.5h", 5_400_000)])  # fmt: skip
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "5", "h", "5x", "-5m", "5m garbage", "1e9h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_a_fifo_where_the_model_table_belongs_never_hangs_the_scan(tmp_path: Path) -> None:
    from sidecar.harnesses.claude.windows import model_table

    (tmp_path / "hctx").mkdir()
    os.mkfifo(tmp_path / "hctx" / "models.json")
    warnings: list[str] = []
    table = model_table({"XDG_CONFIG_HOME": str(tmp_path)}, warnings)
    assert table["claude-sonnet-4-5"] == 200_000  # the shipped table stands
    assert warnings and "not a regular file" in warnings[0]
