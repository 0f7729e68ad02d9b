"""`hctx wrap --harness claude` renders `.claude/settings.local.json`: hctx's entries, nobody else's lost."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sidecar.harnesses.claude.launch import (
    HOOK_EVENTS,
    PROJECT_DIR_ENV,
    RENDERER_ENV,
    SEATS_PATH,
    SETTINGS_PATH,
    SUBAGENT_RENDERER_ENV,
    SettingsError,
    render_settings,
    tee_command,
    unrender_settings,
    write_settings,
)
from sidecar.launching import LaunchPlan
from sidecar.registry import prepare, teardown
from tests.conftest import REPO

PAYLOAD = (REPO / "fixtures" / "claude" / "statusline-2.1.250.jsonl").read_bytes().splitlines()[1]

USER_SETTINGS: dict[str, Any] = {
    "model": "claude-opus-5",
    "permissions": {"allow": ["Bash(ls:*)"], "deny": []},
    "env": {"FOO": "bar"},
    "statusLine": {"type": "command", "command": "my-own-line"},
    "hooks": {
        "PreCompact": [{"matcher": "manual", "hooks": [{"type": "command", "command": "~/bin/save-state.sh"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
    },
}


def settings_path(cwd: Path) -> Path:
    return cwd / ".claude" / "settings.local.json"


def load(cwd: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(settings_path(cwd).read_text())
    return value


def our_commands(settings: dict[str, Any], event: str) -> list[str]:
    return [
        hook["command"]
        for group in settings["hooks"][event]
        for hook in group["hooks"]
        if "sidecar.harnesses.claude.tee" in hook["command"]
    ]


def plan(cwd: Path) -> LaunchPlan:
    return LaunchPlan(harness="claude", argv=("claude", "--model", "x"), cwd=cwd)


def test_a_fresh_directory_gets_the_status_line_and_three_hooks(tmp_path: Path) -> None:
    prepared = prepare(plan(tmp_path))
    assert prepared.argv == ("claude", "--model", "x") and prepared.env == {PROJECT_DIR_ENV: str(tmp_path)}
    settings = load(tmp_path)
    assert settings["statusLine"] == {
        "type": "command",
        "command": tee_command("statusline"),
        "padding": 0,
        "refreshInterval": 5,
    }
    assert set(settings["hooks"]) == set(HOOK_EVENTS) == {
        "PreCompact", "PostCompact", "SessionStart", "SubagentStart", "SubagentStop"
    }  # fmt: skip
    for event in HOOK_EVENTS:
        assert our_commands(settings, event) == [tee_command("hook")]


def test_every_user_key_and_hook_survives(tmp_path: Path) -> None:
    settings_path(tmp_path).parent.mkdir()
    settings_path(tmp_path).write_text(json.dumps(USER_SETTINGS))
    prepare(plan(tmp_path))
    settings = load(tmp_path)
    for key in ("model", "permissions", "env"):
        assert settings[key] == USER_SETTINGS[key]
    assert settings["hooks"]["Stop"] == USER_SETTINGS["hooks"]["Stop"]
    assert settings["hooks"]["PreCompact"][0] == USER_SETTINGS["hooks"]["PreCompact"][0]
    assert our_commands(settings, "PreCompact") == [tee_command("hook")]
    # The slot is single-valued and hctx owns it here (spec: the human renderer is chained instead).
    assert settings["statusLine"]["command"] == tee_command("statusline")


def test_a_second_launch_changes_nothing(tmp_path: Path) -> None:
    settings_path(tmp_path).parent.mkdir()
    settings_path(tmp_path).write_text(json.dumps(USER_SETTINGS))
    prepare(plan(tmp_path))
    first = settings_path(tmp_path).read_bytes()
    first_stat = settings_path(tmp_path).stat()
    prepare(plan(tmp_path))
    assert settings_path(tmp_path).read_bytes() == first
    assert settings_path(tmp_path).stat().st_ino == first_stat.st_ino  # not even rewritten
    for event in HOOK_EVENTS:
        assert len(our_commands(load(tmp_path), event)) == 1


def test_an_entry_from_an_older_install_is_replaced_not_duplicated(tmp_path: Path) -> None:
    stale = "/old/venv/bin/python -I -S -c 'from sidecar.claude_tee import main' hook"
    old = {
        "hooks": {
            "PostCompact": [
                {"hooks": [{"type": "command", "command": stale}]},
                {"hooks": [{"type": "command", "command": stale}, {"type": "command", "command": "theirs"}]},
            ]
        }
    }
    settings_path(tmp_path).parent.mkdir()
    settings_path(tmp_path).write_text(json.dumps(old))
    write_settings(tmp_path)
    groups = load(tmp_path)["hooks"]["PostCompact"]
    assert groups == [
        {"hooks": [{"type": "command", "command": "theirs"}]},
        {"hooks": [{"type": "command", "command": tee_command("hook")}]},
    ]


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"hooks": []}', b'{"hooks": {"PreCompact": {}}}', b'{"model": "\xff"}'],
)
def test_a_file_hctx_cannot_merge_is_left_alone(tmp_path: Path, content: bytes) -> None:
    settings_path(tmp_path).parent.mkdir()
    settings_path(tmp_path).write_bytes(content)
    with pytest.raises(SettingsError, match="will not overwrite"):
        write_settings(tmp_path)
    assert settings_path(tmp_path).read_bytes() == content
    assert [p.name for p in settings_path(tmp_path).parent.iterdir()] == ["settings.local.json"]


def test_the_files_mode_is_kept(tmp_path: Path) -> None:
    settings_path(tmp_path).parent.mkdir()
    settings_path(tmp_path).write_text("{}")
    settings_path(tmp_path).chmod(0o640)
    write_settings(tmp_path)
    assert settings_path(tmp_path).stat().st_mode & 0o777 == 0o640
    assert [p.name for p in settings_path(tmp_path).parent.iterdir()] == ["settings.local.json"]


def test_an_empty_file_is_treated_as_no_settings(tmp_path: Path) -> None:
    settings_path(tmp_path).parent.mkdir()
    settings_path(tmp_path).write_text("")
    write_settings(tmp_path)
    assert load(tmp_path)["statusLine"]["refreshInterval"] == 5


def test_the_rendered_commands_run_without_path_from_any_directory(tmp_path: Path) -> None:
    """Claude's shell may have any PATH and cwd: the commands must not depend on either."""
    prepare(plan(tmp_path))
    settings = load(tmp_path)
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path), "ST_CLAUDE_STATUSLINE_RENDERER": "printf drawn"}
    for command, expected in (
        (settings["statusLine"]["command"], b"drawn"),
        (our_commands(settings, "PreCompact")[0], b""),
    ):
        done = subprocess.run(
            ["/bin/sh", "-c", command], input=PAYLOAD, env=env, cwd="/", capture_output=True, timeout=30
        )
        assert (done.returncode, done.stdout) == (0, expected), done.stderr
    assert os.access(tee_command("hook").split()[0], os.X_OK)


def test_a_symlinked_settings_file_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles" / "claude-local.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text(json.dumps({"permissions": {"allow": ["Bash(ls:*)"]}}))
    (tmp_path / ".claude").mkdir()
    (tmp_path / SETTINGS_PATH).symlink_to(dotfiles)
    write_settings(tmp_path)
    assert (tmp_path / SETTINGS_PATH).is_symlink()
    written = json.loads(dotfiles.read_text())
    assert written["permissions"] == {"allow": ["Bash(ls:*)"]}
    assert "sidecar.harnesses.claude.tee" in written["statusLine"]["command"]


def test_a_users_own_status_line_keeps_drawing_through_the_tee_in_every_seat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RENDERER_ENV, raising=False)
    (tmp_path / ".claude").mkdir()
    (tmp_path / SETTINGS_PATH).write_text(json.dumps({"statusLine": {"type": "command", "command": "my-line.sh"}}))
    assert prepare(plan(tmp_path)).env[RENDERER_ENV] == "my-line.sh"
    assert load(tmp_path)["statusLine"]["command"] == tee_command("statusline")
    assert prepare(plan(tmp_path)).env[RENDERER_ENV] == "my-line.sh"  # the file is ours by now: still chained
    monkeypatch.setenv(RENDERER_ENV, "exported-by-the-user")
    assert RENDERER_ENV not in prepare(plan(tmp_path)).env  # the operator's own choice wins


def test_claude_hands_each_subagents_row_to_the_tee_and_the_users_own_rows_still_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: the `subagentStatusLine` slot is hctx's too; the user's own command is chained."""
    monkeypatch.delenv(SUBAGENT_RENDERER_ENV, raising=False)
    prepare(plan(tmp_path))
    assert load(tmp_path)["subagentStatusLine"] == {"type": "command", "command": tee_command("subagentstatusline")}
    teardown(plan(tmp_path))
    (tmp_path / ".claude").mkdir(exist_ok=True)
    own = {"type": "command", "command": "my-rows.sh"}
    (tmp_path / SETTINGS_PATH).write_text(json.dumps({"subagentStatusLine": own}))
    assert prepare(plan(tmp_path)).env[SUBAGENT_RENDERER_ENV] == "my-rows.sh"
    assert load(tmp_path)["subagentStatusLine"]["command"] == tee_command("subagentstatusline")
    teardown(plan(tmp_path))
    assert json.loads((tmp_path / SETTINGS_PATH).read_text()) == {"subagentStatusLine": own}


# --- the working directory left as it was found -------------------------------------------------------
# In process, the seat is this test's own pid; tests/test_claude_seats.py runs real wrappers.

USER_BYTES = (
    b'{\n\t"model":"claude-opus-5",  "statusLine": {"type": "command", "command": "my-line.sh"},\n'
    b'\t"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send \xc3\xa9t\xc3\xa9"}]}]}}'
)  # tabs, odd spacing, no final newline, UTF-8: nothing hctx would write itself


def session(cwd: Path) -> None:
    """One wrapped session's effect on the directory: prepared, then torn down."""
    teardown(prepare(plan(cwd)))


def test_a_file_hctx_created_is_gone_after_the_session_with_the_claude_dir(tmp_path: Path) -> None:
    prepared = prepare(plan(tmp_path))
    assert sorted(p.name for p in (tmp_path / ".claude").iterdir()) == ["hctx-seats.json", "settings.local.json"]
    teardown(prepared)
    assert list(tmp_path.iterdir()) == []


def test_a_users_file_gets_its_exact_bytes_and_mode_back(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_bytes(USER_BYTES)
    settings_path(tmp_path).chmod(0o640)
    prepared = prepare(plan(tmp_path))
    assert load(tmp_path)["statusLine"]["command"] == tee_command("statusline")
    teardown(prepared)
    assert settings_path(tmp_path).read_bytes() == USER_BYTES
    assert settings_path(tmp_path).stat().st_mode & 0o777 == 0o640
    assert [p.name for p in (tmp_path / ".claude").iterdir()] == ["settings.local.json"]


def test_a_relaunch_by_the_same_wrapper_holds_one_seat(tmp_path: Path) -> None:
    """`--restart`: every incarnation prepares again; the wrapper is still one seat."""
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_bytes(USER_BYTES)
    prepare(plan(tmp_path))
    prepared = prepare(plan(tmp_path))
    assert [seat["pid"] for seat in json.loads((tmp_path / SEATS_PATH).read_text())["seats"]] == [os.getpid()]
    teardown(prepared)
    assert settings_path(tmp_path).read_bytes() == USER_BYTES


def test_a_claude_dir_that_was_there_stays_even_when_empty(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    session(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [".claude"] and list((tmp_path / ".claude").iterdir()) == []


def test_a_claude_dir_hctx_created_stays_when_something_else_moved_in(tmp_path: Path) -> None:
    prepared = prepare(plan(tmp_path))
    (tmp_path / ".claude" / "commands").mkdir()  # e.g. the user saved a slash command meanwhile
    teardown(prepared)
    assert [p.name for p in (tmp_path / ".claude").iterdir()] == ["commands"]


def test_changes_made_during_the_session_are_kept_and_only_hctxs_entries_leave(tmp_path: Path) -> None:
    """The rule: hctx takes its own entries out of the file as it is at the end; the rest stays."""
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_text(json.dumps(USER_SETTINGS))
    prepared = prepare(plan(tmp_path))
    during = load(tmp_path)
    during["permissions"]["allow"].append("Bash(npm test:*)")  # what Claude saves on "always allow"
    during["hooks"]["PostCompact"].insert(0, {"hooks": [{"type": "command", "command": "mine-too"}]})
    settings_path(tmp_path).write_text(json.dumps(during))
    teardown(prepared)
    expected = json.loads(json.dumps(USER_SETTINGS))
    expected["permissions"]["allow"].append("Bash(npm test:*)")
    expected["hooks"]["PostCompact"] = [{"hooks": [{"type": "command", "command": "mine-too"}]}]
    assert load(tmp_path) == expected  # the user's statusLine back, none of hctx's hooks left
    assert "sidecar.harnesses.claude.tee" not in settings_path(tmp_path).read_text()
    assert not (tmp_path / SEATS_PATH).exists()


def test_a_file_hctx_created_stays_with_what_claude_saved_in_it(tmp_path: Path) -> None:
    prepared = prepare(plan(tmp_path))
    during = load(tmp_path)
    during["permissions"] = {"allow": ["WebFetch(domain:example.com)"]}
    settings_path(tmp_path).write_text(json.dumps(during))
    teardown(prepared)
    assert load(tmp_path) == {"permissions": {"allow": ["WebFetch(domain:example.com)"]}}
    assert [p.name for p in (tmp_path / ".claude").iterdir()] == ["settings.local.json"]


def test_a_status_line_the_user_set_during_the_session_is_kept(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_bytes(USER_BYTES)
    prepared = prepare(plan(tmp_path))
    during = load(tmp_path)
    during["statusLine"] = {"type": "command", "command": "a-newer-line.sh"}
    settings_path(tmp_path).write_text(json.dumps(during))
    teardown(prepared)
    assert load(tmp_path)["statusLine"] == {"type": "command", "command": "a-newer-line.sh"}
    assert set(load(tmp_path)["hooks"]) == {"Stop"}


def test_a_file_the_user_removed_during_the_session_stays_removed(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_bytes(USER_BYTES)
    prepared = prepare(plan(tmp_path))
    settings_path(tmp_path).unlink()
    teardown(prepared)
    assert list((tmp_path / ".claude").iterdir()) == []


def test_a_file_broken_during_the_session_is_left_alone_and_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prepared = prepare(plan(tmp_path))
    settings_path(tmp_path).write_text("{half")
    teardown(prepared)  # never raises: the wrapper's exit status is the harness's
    assert settings_path(tmp_path).read_text() == "{half"
    assert "could not put" in capsys.readouterr().err


def test_a_symlinked_file_gets_its_bytes_back_through_the_link(tmp_path: Path) -> None:
    """A link to a file inside the project (the user's own layout); one out of it is refused, see
    tests/test_claude_symlinks.py."""
    work = tmp_path / "work"
    dotfiles = work / "dotfiles" / "claude-local.json"
    dotfiles.parent.mkdir(parents=True)
    dotfiles.write_bytes(USER_BYTES)
    (work / ".claude").mkdir(parents=True)
    (work / SETTINGS_PATH).symlink_to(Path("../dotfiles/claude-local.json"))
    session(work)
    assert (work / SETTINGS_PATH).is_symlink() and dotfiles.read_bytes() == USER_BYTES


def test_an_unmergeable_file_refuses_the_launch_and_leaves_no_seat(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_text('{"hooks": {"PreCompact": {}}}')
    with pytest.raises(SettingsError, match="will not overwrite"):
        prepare(plan(tmp_path))
    assert [p.name for p in (tmp_path / ".claude").iterdir()] == ["settings.local.json"]
    assert settings_path(tmp_path).read_text() == '{"hooks": {"PreCompact": {}}}'


def test_what_an_earlier_hctx_left_behind_is_cleaned_by_the_next_session(tmp_path: Path) -> None:
    """A file rendered by an hctx that never put it back (older, or its seat record lost)."""
    (tmp_path / ".claude").mkdir()
    settings_path(tmp_path).write_text(json.dumps(render_settings({"model": "claude-opus-5"})))
    session(tmp_path)
    assert load(tmp_path) == {"model": "claude-opus-5"}
    settings_path(tmp_path).write_text(json.dumps(render_settings({})))
    session(tmp_path)
    assert list((tmp_path / ".claude").iterdir()) == []  # nothing but hctx's: gone


@pytest.mark.parametrize(
    "original",
    [
        {},
        USER_SETTINGS,
        {"hooks": {}},
        {"hooks": {"PreCompact": []}, "statusLine": None},
        {"hooks": {"SessionStart": [{"hooks": []}, {"matcher": "compact", "hooks": [{"command": "x"}]}]}},
    ],
)
def test_taking_hctxs_entries_out_gives_back_exactly_what_was_there(original: dict[str, Any]) -> None:
    assert unrender_settings(render_settings(original), original) == original
    assert unrender_settings(original, {}) == original  # nothing of hctx's: nothing changes
