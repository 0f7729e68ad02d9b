"""`hctx doctor` (HC-R17): advisory lines exactly for the spec's two cases, never a failure exit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from readers_catalog import HOST, HOUR, MINUTE, NOW, hctx, put_claim, put_record

from guard import catalog as guard_catalog
from guard.constants import HARNESS_CONTEXT_STALE_MS, HARNESS_CONTEXT_WARN_PERCENT
from guard.layout import default_host
from wrapper.cli import main
from wrapper.readers.render import doctor_advisories
from wrapper.readers.roster import collect_roster, now_ms

# doctor adds a setup line per harness it finds installed (issue 36): these tests read its other lines.
pytestmark = pytest.mark.usefixtures("harnessless_home")


def advisories(catalog: Path, *, alive: bool = False, now: int = NOW) -> list[str]:
    return doctor_advisories(collect_roster(catalog, now, here=HOST, alive=lambda pid: alive))


def test_the_threshold_is_the_specs_80() -> None:
    assert HARNESS_CONTEXT_WARN_PERCENT == 80
    assert HARNESS_CONTEXT_STALE_MS == HOUR


def test_fill_at_or_above_the_threshold_is_one_line_with_the_age(tmp_path: Path) -> None:
    put_record(tmp_path, "full", usedPercent=92.4, usedTokens=184_800, windowTokens=200_000,
               observedAtMs=NOW - 4 * MINUTE - 12_000)  # fmt: skip
    assert advisories(tmp_path) == [
        "advisory: box/full: context fill 92% (185k/200k tokens), at or above 80%; reading 4m12s old"
    ]


@pytest.mark.parametrize(("percent", "fires"), [(80.0, True), (79.99, False), (79.5, False), (585.6, True)])
def test_threshold_boundary_uses_the_raw_percent_not_the_rounded_one(
    tmp_path: Path, percent: float, fires: bool
) -> None:
    put_record(tmp_path, "edge", usedPercent=percent)
    assert len(advisories(tmp_path)) == (1 if fires else 0)


def test_fill_line_without_counts_still_names_percent_and_age(tmp_path: Path) -> None:
    put_record(tmp_path, "claude", harness="claude", usedPercent=81.0, usedTokens=None, windowTokens=None)
    assert advisories(tmp_path) == ["advisory: box/claude: context fill 81%, at or above 80%; reading 4s old"]


def test_stale_record_while_running_is_one_line(tmp_path: Path) -> None:
    put_record(tmp_path, "quiet", harness="opencode", usedPercent=12.0, observedAtMs=NOW - HOUR - 5 * MINUTE)
    put_claim(tmp_path, "quiet", desiredState="running")
    assert advisories(tmp_path) == [
        "advisory: box/quiet: context record stale while desired state is running; "
        "the numbers are 1h05m old, older than the 1h00m horizon"
    ]


def test_stale_while_running_because_the_wrapper_lives(tmp_path: Path) -> None:
    put_record(tmp_path, "quiet", usedPercent=12.0, observedAtMs=NOW - 2 * HOUR)
    put_claim(tmp_path, "quiet", desiredState="stopped")
    assert advisories(tmp_path, alive=False) == []
    assert len(advisories(tmp_path, alive=True)) == 1


def test_stale_without_running_is_nothing(tmp_path: Path) -> None:
    put_record(tmp_path, "stopped", usedPercent=12.0, observedAtMs=NOW - 2 * HOUR)
    put_claim(tmp_path, "stopped", desiredState="stopped")
    put_record(tmp_path, "unclaimed", usedPercent=12.0, observedAtMs=NOW - 2 * HOUR)
    assert advisories(tmp_path) == []


def test_stale_boundary_is_exactly_the_horizon(tmp_path: Path) -> None:
    put_record(tmp_path, "edge", usedPercent=12.0, observedAtMs=NOW - HOUR)
    put_claim(tmp_path, "edge", desiredState="running")
    assert len(advisories(tmp_path)) == 1
    assert advisories(tmp_path, now=NOW - 1) == []


def test_full_and_stale_and_running_are_both_lines(tmp_path: Path) -> None:
    put_record(tmp_path, "both", usedPercent=97.0, observedAtMs=NOW - 3 * HOUR)
    put_claim(tmp_path, "both", desiredState="running")
    lines = advisories(tmp_path)
    assert [line.split(": ")[2].split(" ")[:2] for line in lines] == [["context", "fill"], ["context", "record"]]
    assert "reading 3h00m old" in lines[0]


def test_nothing_for_no_record_unreadable_record_or_fresh_below_threshold(tmp_path: Path) -> None:
    put_claim(tmp_path, "norecord", desiredState="running")
    put_record(tmp_path, "garbage", raw=b"\x00\xff not json")
    put_claim(tmp_path, "garbage", desiredState="running")
    put_record(tmp_path, "fresh", usedPercent=79.0)
    put_claim(tmp_path, "fresh", desiredState="running")
    put_record(tmp_path, "withheld", harness="claude", usedPercent=None)
    assert advisories(tmp_path) == []  # a future-dated record: its host's clock line, test_readers_replica.py


def test_cli_advisories_on_stdout_exit_zero_and_one_line_when_healthy(tmp_path: Path) -> None:
    now = now_ms()
    put_record(tmp_path, "full", usedPercent=91.0, observedAtMs=now)
    put_record(tmp_path, "stale", usedPercent=20.0, observedAtMs=now - 2 * HOUR)
    put_claim(tmp_path, "stale", host=HOST, desiredState="running")
    put_record(tmp_path, "junk", raw=b"{")
    done = hctx("doctor", "--catalog", str(tmp_path), "--host", HOST)
    assert done.returncode == 0
    assert [line.split(":")[1].strip() for line in done.stdout.splitlines()] == ["box/full", "box/stale"]
    assert done.stderr == ""

    healthy = tmp_path / "healthy"
    put_record(healthy, "ok", usedPercent=20.0, observedAtMs=now)
    put_claim(healthy, "ok", host=default_host(), wrapperPid=os.getpid(), desiredState="running")
    done = hctx("doctor", "--catalog", str(healthy))
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok: 2 agents, no advisories\n", "")


def test_an_empty_catalog_is_healthy_and_a_missing_one_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--catalog", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "ok: 0 agents, no advisories\n"
    assert main(["doctor", "--catalog", str(tmp_path / "never-created")]) == 2
    assert capsys.readouterr().err.endswith("never-created does not exist (from --catalog)\n")


def test_exit_non_zero_only_for_a_catalog_it_cannot_read_at_all(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("not a catalog")
    agents_is_a_file = tmp_path / "c1"
    agents_is_a_file.mkdir()
    (agents_is_a_file / "agents").write_text("")
    agents_is_a_symlink = tmp_path / "c2"
    agents_is_a_symlink.mkdir()
    (agents_is_a_symlink / "agents").symlink_to(tmp_path)
    for catalog in (a_file, agents_is_a_file, agents_is_a_symlink):
        done = hctx("doctor", "--catalog", str(catalog))
        assert done.returncode == 2, catalog
        assert done.stdout == "" and "cannot read the catalog" in done.stderr
        assert "Traceback" not in done.stderr


def test_unlistable_agents_dir_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Permission denied on `agents/` (simulated: the suite may run as root, which bypasses modes)."""
    (tmp_path / "agents").mkdir()

    def denied(path: Path, kind: str, *, legacy_ok: bool) -> tuple[list[str], list[str]]:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(guard_catalog, "agent_tree_children", denied)
    assert main(["doctor", "--catalog", str(tmp_path)]) == 2
    assert "Permission denied" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads through any mode")
def test_unreadable_catalog_for_real(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir(mode=0)
    try:
        done = hctx("doctor", "--catalog", str(tmp_path))
        assert done.returncode == 2
    finally:
        (tmp_path / "agents").chmod(0o755)


def test_one_bad_host_is_not_a_failure(tmp_path: Path) -> None:
    put_record(tmp_path, "full", usedPercent=90.0, observedAtMs=now_ms())
    (tmp_path / "agents" / "linked").symlink_to(tmp_path / "agents" / HOST)
    done = hctx("doctor", "--catalog", str(tmp_path))
    assert done.returncode == 0
    assert done.stdout.count("advisory:") == 1


# --- headroom to the harness's own compaction point (issue 18) --------------------------------


def test_headroom_under_a_tenth_of_the_window_is_one_line_and_at_a_tenth_is_nothing(tmp_path: Path) -> None:
    # Codex's lab seat: window 190,000, model_auto_compact_token_limit 160,000; 19,000 is a tenth.
    put_record(tmp_path, "close", harness="codex", usedPercent=79.0, usedTokens=141_001, windowTokens=190_000,
               compactAtTokens=160_000)  # fmt: skip
    put_record(tmp_path, "edge", harness="codex", usedPercent=79.0, usedTokens=141_000, windowTokens=190_000,
               compactAtTokens=160_000)  # fmt: skip
    put_record(tmp_path, "unstated", harness="claude", usedPercent=79.0, usedTokens=199_000, windowTokens=200_000)
    assert advisories(tmp_path) == [
        "advisory: box/close: → 19k tokens to the harness's own compaction at 160k, under 10% of the 190k window;"
        " reading 4s old"
    ]


def test_headroom_past_the_point_is_negative_and_still_advised(tmp_path: Path) -> None:
    put_record(tmp_path, "past", harness="codex", usedPercent=79.0, usedTokens=175_900, windowTokens=190_000,
               compactAtTokens=160_000)  # fmt: skip
    (line,) = advisories(tmp_path)
    assert line.startswith("advisory: box/past: → -16k tokens to the harness's own compaction at 160k")
