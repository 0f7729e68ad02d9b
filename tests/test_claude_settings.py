"""`hctx wrap --harness claude` renders `.claude/settings.local.json`: hctx's entries, nobody else's lost."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from wrapper.harnesses import LaunchPlan, prepare
from wrapper.harnesses.claude import HOOK_EVENTS, SETTINGS_PATH, SettingsError, tee_command, write_settings

REPO = Path(__file__).resolve().parent.parent
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
        if "sidecar.claude_tee" in hook["command"]
    ]


def plan(cwd: Path) -> LaunchPlan:
    return LaunchPlan(harness="claude", argv=("claude", "--model", "x"), cwd=cwd)


def test_a_fresh_directory_gets_the_status_line_and_three_hooks(tmp_path: Path) -> None:
    prepared = prepare(plan(tmp_path))
    assert prepared.argv == ("claude", "--model", "x") and prepared.env == {}
    settings = load(tmp_path)
    assert settings["statusLine"] == {
        "type": "command",
        "command": tee_command("statusline"),
        "padding": 0,
        "refreshInterval": 5,
    }
    assert set(settings["hooks"]) == set(HOOK_EVENTS) == {"PreCompact", "PostCompact", "SessionStart"}
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
    assert "claude_tee" in written["statusLine"]["command"]


def test_a_users_own_status_line_is_kept_and_keeps_drawing_through_the_tee(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from wrapper.harnesses.claude import DISPLACED_STATUS_LINE, RENDERER_ENV

    monkeypatch.delenv(RENDERER_ENV, raising=False)
    (tmp_path / ".claude").mkdir()
    (tmp_path / SETTINGS_PATH).write_text(json.dumps({"statusLine": {"type": "command", "command": "my-line.sh"}}))
    plan = prepare(LaunchPlan(harness="claude", argv=("claude",), cwd=tmp_path))
    assert plan.env[RENDERER_ENV] == "my-line.sh"
    assert json.loads((tmp_path / DISPLACED_STATUS_LINE).read_text())["command"] == "my-line.sh"
    assert "had its own statusLine" in capsys.readouterr().err
    again = prepare(LaunchPlan(harness="claude", argv=("claude",), cwd=tmp_path))
    assert again.env[RENDERER_ENV] == "my-line.sh"  # a relaunch still chains it, once the file is ours
    assert capsys.readouterr().err == ""
