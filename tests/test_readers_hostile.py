"""A catalog full of junk: bad rows read `context: null` with a warning, good rows stay right,
nothing is fabricated, nothing hangs, nothing is written, and no command prints a traceback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from guard_factory import wire
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from readers_catalog import HOST, MINUTE, NOW, agent_path, claim, hctx, put_claim, put_record, snapshot

from guard import catalog as guard_catalog
from guard.catalog import printable
from guard.projection import MAX_RECORD_BYTES, decode_record
from tests.wrapping import read_chars
from wrapper.readers import roster as roster_module
from wrapper.readers.render import render_agents, render_inspection
from wrapper.readers.roster import collect_inspection, collect_roster, now_ms


def dead(pid: int) -> bool:
    return False


def roster(catalog: Path, now: int = NOW) -> roster_module.Roster:
    return collect_roster(catalog, now, here=HOST, alive=dead)


def one(catalog: Path, identity: str) -> roster_module.AgentRow:
    (row,) = [row for row in roster(catalog).rows if row.identity == identity]
    return row


BAD_RECORDS: dict[str, bytes] = {
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "truncated": json.dumps(wire()).encode()[:-7],
    "not-an-object": b"[1, 2, 3]\n",
    "string-tokens": json.dumps(wire(usedTokens="92283")).encode(),
    "float-tokens": json.dumps(wire(usedTokens=92283.5)).encode(),
    "bool-percent": json.dumps(wire(usedPercent=True)).encode(),
    "string-percent": json.dumps(wire(usedPercent="33")).encode(),
    "nan": json.dumps(wire()).replace('"usedPercent": 33', '"usedPercent": NaN').encode(),
    "infinity": json.dumps(wire()).replace('"costUsd": null', '"costUsd": Infinity').encode(),
    "huge-number": json.dumps(wire()).replace('"usedPercent": 33', '"usedPercent": 1e999').encode(),
    "negative-tokens": json.dumps(wire(usedTokens=-5)).encode(),
    "negative-compactions": json.dumps(wire(compactions=-1)).encode(),
    "negative-observed": json.dumps(wire(observedAtMs=-1)).encode(),
    "foreign-schema": json.dumps(wire(schema="com.example.harness-context.v1")).encode(),
    "unversioned-schema": json.dumps(wire(schema="st2.harness-context")).encode(),
    "list-schema": json.dumps(wire(schema=["st2.harness-context.v1"])).encode(),
    "no-schema": json.dumps({k: v for k, v in wire().items() if k != "schema"}).encode(),
    "unknown-harness": json.dumps(wire(harness="gemini")).encode(),
    "no-observed": json.dumps({k: v for k, v in wire().items() if k != "observedAtMs"}).encode(),
    "deep-nesting": b'{"schema": "st2.harness-context.v1", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "invalid-utf8": json.dumps(wire(model="m")).encode().replace(b'"m"', b'"\xff\xfe"'),
    "over-the-bound": json.dumps(wire(model="x" * MAX_RECORD_BYTES)).encode(),
}


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_bad_record_is_null_with_a_warning_beside_a_good_row(tmp_path: Path, name: str) -> None:
    put_record(tmp_path, "bad", raw=BAD_RECORDS[name])
    put_record(tmp_path, "good")
    bad, good = roster(tmp_path).rows
    assert bad.context is None and bad.problem, name
    assert any(warning.startswith("box/bad: context record") for warning in bad.warnings())
    assert good.context is not None and good.context.used_tokens == 92283 and good.problem is None


def test_additive_fields_and_v2_schema_are_read(tmp_path: Path) -> None:
    put_record(tmp_path, "additive", futureField={"nested": [1, 2]}, schema="st2.harness-context.v2")
    row = one(tmp_path, "additive")
    assert row.context is not None and row.context.used_tokens == 92283


def test_unknown_compaction_trigger_reads_as_unknown_not_as_a_guess(tmp_path: Path) -> None:
    put_record(tmp_path, "trig", lastCompactionTrigger="memory-pressure")
    context = one(tmp_path, "trig").context
    assert context is not None and context.last_compaction_trigger == "unknown"


def test_future_skewed_record_is_null_with_a_warning(tmp_path: Path) -> None:
    put_record(tmp_path, "ahead", observedAtMs=NOW + MINUTE + 1)
    put_record(tmp_path, "within", observedAtMs=NOW + MINUTE)
    ahead, within = roster(tmp_path).rows
    assert ahead.context is None and ahead.problem is not None and "future" in ahead.problem
    assert within.context is not None and within.context.age_ms == 0 and not within.context.stale


def test_huge_sparse_record_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = agent_path(tmp_path, "huge") / "harness-context"
    with open(path, "wb") as handle:
        handle.truncate(4 * 1024**3)  # 4 GiB, sparse: reading it whole would take seconds and memory
    before = read_chars()
    row = one(tmp_path, "huge")
    assert read_chars() - before < 1 << 20
    assert row.context is None and row.problem is not None and "over the" in row.problem


def test_directory_where_the_record_belongs(tmp_path: Path) -> None:
    (agent_path(tmp_path, "dir") / "harness-context").mkdir()
    (agent_path(tmp_path, "dir") / "harness-state").mkdir()
    row = one(tmp_path, "dir")
    assert row.context is None and row.problem == "context record is not a regular file"
    assert row.claim_problem == "harness-state claim is not a regular file"


def test_symlinked_record_is_not_followed_even_to_a_valid_record(tmp_path: Path) -> None:
    real = put_record(tmp_path / "elsewhere", "real")
    (agent_path(tmp_path, "linked") / "harness-context").symlink_to(real)
    (agent_path(tmp_path, "zero") / "harness-context").symlink_to("/dev/zero")
    linked, zero = roster(tmp_path).rows
    assert linked.context is None and linked.problem == "context record is a symlink; not followed"
    assert zero.context is None and zero.problem == "context record is a symlink; not followed"


def test_fifo_does_not_hang_the_roster(tmp_path: Path) -> None:
    os.mkfifo(agent_path(tmp_path, "fifo") / "harness-context")
    os.mkfifo(agent_path(tmp_path, "fifo") / "harness-state")
    started = time.monotonic()
    row = one(tmp_path, "fifo")
    assert time.monotonic() - started < 10  # a liveness bound: an open of the fifo would block for good
    assert row.context is None and row.problem == "context record is not a regular file"


def test_unreadable_record_is_null_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EACCES simulated at the open: the suite may run as root, which reads through any mode."""
    put_record(tmp_path, "locked")
    put_record(tmp_path, "open")
    real_open = os.open

    def open_denying(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if (
            path == "harness-context"
            and dir_fd is not None
            and os.readlink(f"/proc/self/fd/{dir_fd}").endswith("/locked")
        ):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_denying)
    locked, unlocked = roster(tmp_path).rows
    assert locked.context is None and locked.problem == "context record unreadable: Permission denied"
    assert unlocked.context is not None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads through any mode")
def test_unreadable_record_for_real(tmp_path: Path) -> None:
    put_record(tmp_path, "locked").chmod(0)
    row = one(tmp_path, "locked")
    assert row.context is None and row.problem is not None and "unreadable" in row.problem


def test_unexpected_entries_are_passed_over_with_warnings(tmp_path: Path) -> None:
    put_record(tmp_path, "good")
    agents = tmp_path / "agents"
    (agents / "stray-file").write_text("x")
    (agents / ".hidden").mkdir()
    (agents / "sp ace").mkdir()
    (agents / "linked-host").symlink_to(agents / HOST)
    (agents / HOST / "file-agent").write_text("x")
    (agents / HOST / "linked-agent").symlink_to(agents / HOST / "good")
    (agents / HOST / "bad\x1bname").mkdir()
    (agents / HOST / ".harness-context.tmp-123-456").write_text("{")  # a legacy writer's staging file
    result = roster(tmp_path)
    assert [(row.host, row.identity) for row in result.rows] == [(HOST, "good")]
    assert result.rows[0].context is not None
    joined = "\n".join(result.warnings)
    for name in ("stray-file", ".hidden", "sp ace", "linked-host", "file-agent", "linked-agent", "bad\\x1bname"):
        assert name in joined, name
    assert "\x1b" not in joined
    assert "tmp-123-456" not in joined


def test_unreadable_host_dir_skips_that_host_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put_record(tmp_path, "a", host="locked")
    put_record(tmp_path, "b", host="open")
    real = guard_catalog.agent_tree_children

    def list_denying(path: Path, kind: str, *, legacy_ok: bool) -> tuple[list[str], list[str]]:
        if path.name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, kind, legacy_ok=legacy_ok)

    monkeypatch.setattr(guard_catalog, "agent_tree_children", list_denying)
    result = roster(tmp_path)
    assert [row.name for row in result.rows] == ["open/b"]
    assert any("Permission denied" in warning and "locked" in warning for warning in result.warnings)


def test_agent_dir_vanishing_between_listing_and_reading(tmp_path: Path) -> None:
    files = guard_catalog.read_agent_files(tmp_path, HOST, "gone")
    assert files.problem == "agent directory does not exist"
    assert decode_record(files.record)[0] is None


PAST_CLAIM = {"incarnation": "i", "claimedAtMs": 1, "wrapperPid": 1}


def test_hostile_claims_never_crash(tmp_path: Path) -> None:
    hostile = {
        "garbage": b"\x00\x01",
        "wrong-types": json.dumps(claim("x", wrapperPid="12", claimedAtMs=-1)).encode(),
        "bad-desired": json.dumps(claim("x", desiredState="paused")).encode(),
        "bad-harness": json.dumps(claim("x", harness="gemini")).encode(),
        "huge-history": json.dumps(claim("x", history=[PAST_CLAIM] * 10_000)).encode(),
        "deep": b"[" * 100_000,
    }
    for name, raw in hostile.items():
        put_record(tmp_path, name)
        put_claim(tmp_path, name, raw=raw)
    for row in roster(tmp_path).rows:
        assert (row.harness, row.desired_state) == (None, None), row.identity
        assert row.claim_problem, row.identity
        assert row.context is not None  # the record beside a bad claim is an independent axis


def test_terminal_controls_in_fields_are_escaped_in_human_output(tmp_path: Path) -> None:
    put_record(tmp_path, "evil", model="\x1b]0;pwned\x07\x1b[2J", incarnation="\x1b[31mred")
    rows = roster(tmp_path).rows
    assert rows[0].context is not None and rows[0].context.model.startswith("\x1b")  # JSON keeps it
    inspection = render_inspection(collect_inspection(tmp_path, HOST, "evil", NOW, here=HOST, alive=dead))
    assert "\x1b" not in inspection and "\x07" not in inspection
    assert "\\u001b]0;pwned" in inspection  # the raw record, as JSON spells it
    assert "incarnation   \\x1b[31mred" in inspection  # the decoded field, escaped
    put_record(tmp_path, "raw-escape", raw=b'{"schema": "\x1b[2J\x1b]0;x\x07"}')
    raw = render_inspection(collect_inspection(tmp_path, HOST, "raw-escape", NOW, here=HOST, alive=dead))
    assert "\x1b" not in raw and "\\x1b[2J\\x1b]0;x\\x07" in raw
    assert "\x1b" not in render_agents(rows, colour=False)
    assert printable("a\u202eb\x9bc") == "a\\u202eb\\x9bc"


# Bidi overrides and isolates, marks, line and paragraph separators, zero-width and BOM: each drives how
# a terminal lays the line out (or breaks it) without being a C0/C1 control.
UNSEEN = "\u202e\u2028\u2029\u200e\u200f\u061c\u2066\u200b\ufeff"


def test_bidi_and_line_separators_in_every_printed_string_are_escaped(tmp_path: Path) -> None:
    """Issue 40: a bidi override (U+202E) and a line separator (U+2028) in a subagent's model
    reached `agents`, `top` and `inspect` raw; the agent's own model too (`inspect`)."""
    sub = {"id": "a91242bfc47ae887e", "name": "general-purpose", "model": f"evil{UNSEEN}model", "usedTokens": 9_000,
           "windowTokens": 150_000, "usedPercent": 6.0, "windowSource": "model-table", "compactions": 0,
           "state": "running", "observedAtMs": NOW}  # fmt: skip
    put_record(tmp_path, "evil", model=f"m{UNSEEN}", subagents=[sub])
    outputs = {
        "agents": hctx("agents", "--catalog", str(tmp_path)).stdout,
        "top": hctx("top", "--once", "--catalog", str(tmp_path)).stdout,
        "inspect": hctx("inspect", "evil", "--catalog", str(tmp_path)).stdout,
    }
    for command, shown in outputs.items():
        assert not set(UNSEEN) & set(shown), (command, [hex(ord(c)) for c in set(UNSEEN) & set(shown)])
    assert "evil\\u202e\\u2028" in outputs["agents"] and "evil\\u202e\\u2028" in outputs["inspect"]
    assert printable("a\u2028b c\u00a0") == "a\\u2028b c\\xa0"


JUNK_CATALOG_NAMES = ("binary", "empty", "foreign-schema", "nan", "negative-tokens", "over-the-bound")


def junk_catalog(root: Path) -> None:
    for name in JUNK_CATALOG_NAMES:
        put_record(root, name, raw=BAD_RECORDS[name])
    put_record(root, "good", observedAtMs=now_ms())
    put_record(root, "ahead", observedAtMs=now_ms() + 10 * MINUTE)
    (agent_path(root, "dir") / "harness-context").mkdir()
    os.mkfifo(agent_path(root, "fifo") / "harness-context")
    (agent_path(root, "link") / "harness-context").symlink_to("/dev/zero")
    put_claim(root, "good", raw=b"\xff")
    (root / "agents" / "stray").write_text("x")


def test_every_reader_on_a_junk_catalog_as_a_process(tmp_path: Path) -> None:
    junk_catalog(tmp_path)
    done = hctx("agents", "--json", "--catalog", str(tmp_path), "--host", HOST)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    rows = {row["identity"]: row for row in json.loads(done.stdout)}
    assert rows["good"]["context"]["usedTokens"] == 92283
    for name in (*JUNK_CATALOG_NAMES, "ahead", "dir", "fifo", "link"):
        assert rows[name]["context"] is None, name
        assert f"box/{name}: context record" in done.stderr, name
    assert "stray" in done.stderr and "box/good: harness-state claim refused" in done.stderr

    for argv in (("agents",), ("doctor",), ("inspect", "binary"), ("inspect", "fifo"), ("inspect", "good"),
                 ("top", "--once"), ("agents", "dir", "--json")):  # fmt: skip
        done = hctx(*argv, "--catalog", str(tmp_path), "--host", HOST)
        assert done.returncode == 0, (argv, done.stderr)
        assert "Traceback" not in done.stderr, argv


def test_readers_never_write_into_the_catalog(tmp_path: Path) -> None:
    junk_catalog(tmp_path)
    put_record(tmp_path, "full", usedPercent=95.0, observedAtMs=now_ms())
    put_claim(tmp_path, "full", desiredState="running")
    before = snapshot(tmp_path)
    for argv in (("agents",), ("agents", "--json"), ("agents", "full"), ("doctor",), ("inspect", "full"),
                 ("top", "--once")):  # fmt: skip
        assert hctx(*argv, "--catalog", str(tmp_path), "--host", HOST).returncode == 0, argv
    assert snapshot(tmp_path) == before
    assert not (tmp_path / ".st2").exists()


# --- never a fabricated number ---------------------------------------------------------------------

NUMERIC = ("usedTokens", "windowTokens", "usedPercent", "costUsd", "sessionTotalTokens", "compactions",
           "lastCompactionMs", "observedAtMs")  # fmt: skip
json_values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(wire())), json_values, max_size=6))
def test_fuzzed_fields_are_published_verbatim_or_not_at_all(tmp_path_factory: Any, mutation: dict[str, Any]) -> None:
    catalog = tmp_path_factory.mktemp("fuzz")
    raw = {**wire(observedAtMs=NOW - 1000), **mutation}
    put_record(catalog, "fuzz", raw=json.dumps(raw, allow_nan=True).encode())
    row = one(catalog, "fuzz")
    if row.context is None:
        return
    for key in NUMERIC:
        published = row.context.wire()[key]
        given_value = raw.get(key)
        if given_value is None:
            assert published in (None, 0) if key == "compactions" else published is None, key
        else:
            assert published == given_value and type(given_value) is not bool, key
    assert row.context.age_ms == max(0, NOW - raw["observedAtMs"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise(tmp_path_factory: Any, data: bytes) -> None:
    catalog = tmp_path_factory.mktemp("bytes")
    put_record(catalog, "noise", raw=data)
    put_claim(catalog, "noise", raw=data)
    row = one(catalog, "noise")
    assert row.context is None or row.context.harness in ("claude", "codex", "pi", "omp", "opencode")
    render_agents([row], colour=True)
    render_inspection(collect_inspection(catalog, HOST, "noise", NOW, here=HOST, alive=dead))
