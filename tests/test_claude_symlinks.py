"""Issue 26, points 1 and 6: what hctx writes in a Claude project is written there and nowhere else.

A symlinked `.claude/`, `.claude/hctx-seats.json` or a settings file linked out of the project (as a
cloned repository can carry them: `../../victim`) is refused with a message saying why, and the
file it points at keeps its bytes and mode; a hostile seats file is set aside and the launch goes on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.harnesses.claude.launch import SEATS_PATH, SETTINGS_PATH, SettingsError
from sidecar.launching import LaunchPlan
from sidecar.registry import prepare, teardown

VICTIM_BYTES = b'{"victim": true}\n'


def plan(cwd: Path) -> LaunchPlan:
    return LaunchPlan(harness="claude", argv=("claude",), cwd=cwd)


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.json"
    path.parent.mkdir()
    path.write_bytes(VICTIM_BYTES)
    path.chmod(0o644)
    return path


def untouched(path: Path) -> bool:
    return path.read_bytes() == VICTIM_BYTES and path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_symlinked_seats_file_is_refused_and_its_target_untouched(tmp_path: Path, relative: bool) -> None:
    target = victim(tmp_path)
    work = tmp_path / "repo" / "sub"
    (work / ".claude").mkdir(parents=True)
    (work / SEATS_PATH).symlink_to(Path("../../../outside/victim.json") if relative else target)
    with pytest.raises(SettingsError, match=r"hctx-seats\.json is a symlink"):
        prepare(plan(work))
    assert untouched(target)
    assert not (work / SETTINGS_PATH).exists()  # nothing rendered either


def test_a_symlinked_claude_dir_is_refused_and_nothing_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / ".claude").symlink_to(elsewhere)
    with pytest.raises(SettingsError, match=r"\.claude is a symlink"):
        prepare(plan(work))
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("dangling", [False, True], ids=["existing", "dangling"])
def test_a_settings_file_linked_out_of_the_project_is_refused(tmp_path: Path, dangling: bool) -> None:
    target = victim(tmp_path)
    if dangling:
        target.unlink()
    work = tmp_path / "work"
    (work / ".claude").mkdir(parents=True)
    (work / SETTINGS_PATH).symlink_to(Path("../../outside/victim.json"))
    with pytest.raises(SettingsError, match="outside"):
        prepare(plan(work))
    if dangling:
        assert not target.exists()  # nothing created through the link
    else:
        assert untouched(target)
    assert not (work / SEATS_PATH).exists()


def test_a_seats_file_swapped_for_a_symlink_during_the_session_is_not_followed(tmp_path: Path) -> None:
    target = victim(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    prepared = prepare(plan(work))
    (work / SEATS_PATH).unlink()
    (work / SEATS_PATH).symlink_to(target)
    teardown(prepared)  # reports, never writes through
    assert untouched(target)


HOSTILE_SEATS = {
    "huge-pid": b'{"original": null, "createdClaudeDir": false, "seats": [{"pid": 1e400, "startTime": 1}]}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "not-an-object": b"[]",
    "lone-surrogate": b'{"original": "\\ud800", "createdClaudeDir": false, "seats": []}',
    "not-utf8": b"\xff\xfe",
}


@pytest.mark.parametrize("content", HOSTILE_SEATS.values(), ids=HOSTILE_SEATS.keys())
def test_a_hostile_seats_file_is_set_aside_and_the_launch_goes_on(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".claude").mkdir()
    (tmp_path / SEATS_PATH).write_bytes(content)
    prepared = prepare(plan(tmp_path))
    err = capsys.readouterr().err
    assert "set aside" in err and "Traceback" not in err
    aside = [p for p in (tmp_path / ".claude").iterdir() if p.name.startswith("hctx-seats.json.unreadable-")]
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert [seat["pid"] for seat in json.loads((tmp_path / SEATS_PATH).read_text())["seats"]] == [os.getpid()]
    teardown(prepared)
    assert not (tmp_path / SETTINGS_PATH).exists()


def test_a_fifo_as_the_seats_file_does_not_hang_the_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".claude").mkdir()
    os.mkfifo(tmp_path / SEATS_PATH)
    teardown(prepare(plan(tmp_path)))
    assert "set aside" in capsys.readouterr().err


def test_a_deeply_nested_settings_file_is_refused_with_a_message(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    (tmp_path / SETTINGS_PATH).write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(SettingsError, match="will not overwrite"):
        prepare(plan(tmp_path))
