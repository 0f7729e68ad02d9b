"""Issue 19 points 3 and 5 over verbatim captures: each record names the harness build that produced
it (`harnessVersion`, from the harness's own channel) and, for OpenCode, the session its reading
belongs to (`sessionId`), so one server's two sessions no longer alternate in one record unnamed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from readers_catalog import HOST, NOW, hctx, put_claim, put_record

from guard.record import parse_record
from sidecar.harnesses.claude.producer import VERIFIED_VERSIONS as CLAUDE_VERIFIED
from sidecar.harnesses.codex.producer import CODEX_CONTEXT_VERIFIED_VERSIONS, CodexProducer
from sidecar.harnesses.codex.rollout import RolloutFollower
from sidecar.harnesses.opencode.producer import OPENCODE_CONTEXT_VERIFIED_VERSIONS
from sidecar.harnesses.opencode.producer import SPEC as OPENCODE
from sidecar.recorder import Chunk
from sidecar.registry import verified_versions
from tests.conformance import chunks_of, fixture_writes, replayed
from tests.conftest import FIXTURE_ROOT
from wrapper.readers.render import doctor_advisories
from wrapper.readers.roster import collect_roster

FIXTURES = FIXTURE_ROOT


@pytest.mark.parametrize("version", CLAUDE_VERIFIED)
def test_claude_records_carry_the_status_line_version(version: str) -> None:
    written = fixture_writes("claude", f"claude/session-{version}.rec")
    assert written and {w.record.harness_version for w in written} == {version}
    assert json.loads(written[-1].record.to_json())["harnessVersion"] == version


@pytest.mark.parametrize("version", CODEX_CONTEXT_VERIFIED_VERSIONS)
@pytest.mark.parametrize("capture", ["stdio-main", "ws-main", "stdio-resume"])
def test_codex_records_carry_the_app_servers_user_agent_version(version: str, capture: str) -> None:
    written = fixture_writes("codex", f"codex/codex-{version}-{capture}.rec")
    assert written and {w.record.harness_version for w in written} == {version}


def test_a_codex_rollout_names_its_cli_version_from_session_meta() -> None:
    """The interactive codex path: the rollout's own first line (the lab's verbatim 0.171.0 shape,
    trimmed to the keys the follower reads) then a token_count; the version rides the reading."""
    meta = {
        "timestamp": "2026-11-29T22:33:22.000Z",
        "type": "session_meta",
        "payload": {"id": "t1", "timestamp": "2026-11-29T22:33:22.000Z", "cwd": "/w", "cli_version": "0.171.0"},
    }
    usage = {"timestamp": "2026-11-29T22:33:25.000Z", "type": "event_msg", "payload": {"type": "token_count",
             "info": {"total_token_usage": {"total_tokens": 30500}, "last_token_usage": {"total_tokens": 30500},
                      "model_context_window": 190000}, "rate_limits": None}}  # fmt: skip
    data = b"".join(json.dumps(line).encode() + b"\n" for line in (meta, usage))
    producer = CodexProducer()
    readings = [r for frame in RolloutFollower("t1").feed(data) for r in producer.feed(frame, 1)]
    assert [r.fields.harness_version for r in readings] == ["0.171.0"]


def _opencode_capture(version: str) -> tuple[bytes, bytes, dict[str, str]]:
    root = FIXTURES / "opencode" / f"v{version}"
    labels = {}
    for line in (root / "steps.jsonl").read_text().splitlines():
        step = json.loads(line)
        if step["step"] == "session-create":
            labels[step["id"]] = step["label"]
    return (root / "config_providers.json").read_bytes(), (root / "events.jsonl").read_bytes(), labels


def _completions(events: bytes) -> list[dict[str, Any]]:
    """Every assistant completion frame on the /event stream, in order, as the server sent it."""
    frames = []
    for line in events.splitlines():
        entry = json.loads(line)
        if entry["stream"] != "event":
            continue
        frame = json.loads(entry["raw"])
        info = frame.get("properties", {}).get("info", {})
        if (
            frame.get("type") == "message.updated"
            and info.get("role") == "assistant"
            and "total" in info.get("tokens", {})
        ):
            frames.append(info)
    return frames


@pytest.mark.parametrize("version", OPENCODE_CONTEXT_VERIFIED_VERSIONS)
def test_opencode_interleaved_sessions_each_record_names_its_session(version: str) -> None:
    """The verbatim capture in which sessions B and C were prompted at once, so their frames
    interleave on one server's stream: every record written names the session whose turn it carries,
    and a reader can tell B's 31,222 from C's 61,333 without guessing."""
    _, events, labels = _opencode_capture(version)
    totals = {(info["sessionID"], info["tokens"]["total"]) for info in _completions(events)}
    written = [w.record for w in fixture_writes("opencode", f"opencode/v{version}/providers+events.rec")]
    assert written
    for record in written:
        assert record.session_id in labels
        assert (record.session_id, record.used_tokens) in totals or record.used_tokens is None
        assert record.harness_version == version
        assert parse_record(record.to_json()).session_id == record.session_id
    named = {labels[r.session_id]: r.used_tokens for r in written if r.session_id and labels[r.session_id] in "BC"}  # type: ignore[index]
    assert named == {"B": 31_222, "C": 61_333}
    sequence = [labels[r.session_id] for r in written if r.session_id]  # type: ignore[index]
    assert len(set(sequence)) > 1  # the record still follows the newest reading, now saying whose


# --- readers: inspect shows the build, doctor names an unverified running one ----------------------


def test_every_producer_names_its_verified_set_and_the_live_suite_runs_it() -> None:
    from harnesses import PINNED_VERSIONS

    for harness, versions in PINNED_VERSIONS.items():
        assert verified_versions(harness) == versions  # type: ignore[arg-type]


@pytest.mark.parametrize(("version", "alive", "advised"), [("2.1.332", True, False), ("2.9.0", True, True),
                                                            ("2.9.0", False, False), (None, True, False)])  # fmt: skip
def test_doctor_says_when_a_running_agents_build_is_outside_the_verified_set(
    tmp_path: Path, version: str | None, alive: bool, advised: bool
) -> None:
    put_record(tmp_path, "seat", harness="claude", usedPercent=10, harnessVersion=version)
    put_claim(tmp_path, "seat", harness="claude", desiredState="stopped", wrapperPid=os.getpid())
    lines = doctor_advisories(collect_roster(tmp_path, NOW, here=HOST, alive=lambda pid: alive))
    expected = [
        "advisory: box/seat: claude 2.9.0 is not a verified build (verified: 2.1.250, 2.1.332); "
        "its numbers follow arithmetic measured on those"
    ]
    assert lines == (expected if advised else [])


def test_inspect_shows_the_build_and_the_session(tmp_path: Path) -> None:
    put_record(tmp_path, "seat", harness="opencode", harnessVersion="1.19.0", sessionId="ses_x")
    put_claim(tmp_path, "seat", harness="opencode")
    result = hctx("inspect", "--catalog", str(tmp_path), "--host", HOST, "seat")
    assert result.returncode == 0, result.stderr
    assert "  harness build 1.19.0 (not verified: 1.18.25, 1.18.33)\n" in result.stdout
    assert "  session       ses_x\n" in result.stdout


def _with_select(chunks: list[Chunk], after: bytes, session_id: str, event_id: str) -> list[Chunk]:
    """The recording's chunks with one `tui.session.select` event inserted after the first chunk
    containing `after`, at its time, in the exact shape the real 1.18.33 server published it for
    `POST /tui/select-session` (measured live)."""
    at = next(index for index, chunk in enumerate(chunks) if after in chunk.data)
    frame = {"id": event_id, "type": "tui.session.select", "properties": {"sessionID": session_id}}
    select = Chunk(chunks[at].at_ms, "sse", b"data: " + json.dumps(frame, separators=(",", ":")).encode() + b"\n\n",
                   chunks[at].stream)  # fmt: skip
    return [*chunks[: at + 1], select, *chunks[at + 1 :]]


@pytest.mark.parametrize("version", OPENCODE_CONTEXT_VERIFIED_VERSIONS)
def test_a_tui_told_to_show_one_session_keeps_its_record_on_that_session(version: str) -> None:
    """Composed, stated: the verbatim capture (B and C prompted at once, their frames interleaved on
    one server) with a `tui.session.select` naming B inserted after B's first assistant frame, then
    one naming C after the last frame. While the TUI shows B, C's turns never reach the record; told
    to show C, the record is C's newest turn at once, with that turn's own observedAtMs."""
    _, _, labels = _opencode_capture(version)
    by_label = {label: session for session, label in labels.items()}
    b, c = by_label["B"], by_label["C"]
    chunks = chunks_of(f"opencode/v{version}/providers+events.rec")
    first_b = next(chunk.data for chunk in chunks if b.encode() in chunk.data and b'"role":"assistant"' in chunk.data)
    composed = _with_select(chunks, first_b, b, "evt_hctx_select_b")
    composed = _with_select(composed, composed[-1].data, c, "evt_hctx_select_c")
    written = [w.record for w in replayed(OPENCODE, composed)]
    sessions = [r.session_id for r in written]
    b_at = sessions.index(b)
    shown_b = written[b_at:-1]
    assert shown_b and all(r.session_id == b for r in shown_b)
    assert 31_222 in [r.used_tokens for r in shown_b]
    final = written[-1]
    assert (final.session_id, final.used_tokens) == (c, 61_333)
    assert final.observed_at_ms < written[-2].written_at_ms  # C's own turn, not re-stamped
