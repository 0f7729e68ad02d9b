"""Claude's setup plan (issue 36): its edits over arbitrary user settings, and the tee chaining the
user's own status line from where setup keeps it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.harnesses.claude.launch import HOOK_EVENTS, tee_command
from sidecar.harnesses.claude.setup import RenderersEdit, SettingsEdit, setup
from sidecar.setup_plan import UserFile, json_bytes
from tests.test_claude_tee import PAYLOAD, run_tee
from wrapper.launch.userfiles import apply_setup, undo_setup

TEE = "sidecar.harnesses.claude.tee"
EDIT = SettingsEdit(UserFile(Path("/nonexistent"), PurePosixPath("settings.json")))

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)  # fmt: skip
command = st.fixed_dictionaries({"type": st.just("command"), "command": st.text(max_size=16)})
groups = st.lists(
    st.fixed_dictionaries({"hooks": st.lists(command, max_size=2)}, optional={"matcher": st.text(max_size=6)}),
    max_size=2,
)
hooks = st.dictionaries(st.sampled_from([*HOOK_EVENTS, "Stop", "UserPromptSubmit", "ALaterBuildsEvent"]), groups,
                        max_size=4)  # fmt: skip
RESERVED = ("hooks", "statusLine", "subagentStatusLine")
user_settings = st.tuples(
    st.dictionaries(st.text(max_size=10).filter(lambda key: key not in RESERVED), values, max_size=4),
    st.fixed_dictionaries({}, optional={"hooks": hooks, "statusLine": command, "subagentStatusLine": command}),
).map(lambda pair: {**pair[0], **pair[1]})


def raw(value: dict[str, Any], indent: int | None = 4) -> bytes:
    return json.dumps(value, indent=indent).encode()


@given(user_settings, st.sampled_from([None, 4]))
def test_apply_is_idempotent_and_remove_gives_back_the_users_settings(user: dict[str, Any], indent: int | None) -> None:
    applied = EDIT.apply(raw(user, indent))
    assert EDIT.apply(applied) == applied  # setup twice is setup once, to the byte
    rendered = json.loads(applied)
    assert TEE in rendered["statusLine"]["command"] and TEE in rendered["subagentStatusLine"]["command"]
    assert all(TEE in rendered["hooks"][event][-1]["hooks"][0]["command"] for event in HOOK_EVENTS)
    assert {key: rendered[key] for key in user if key not in RESERVED} == {
        key: value for key, value in user.items() if key not in RESERVED
    }  # every other key, a later build's included, as it was
    removed = EDIT.remove(applied, raw(user, indent))
    assert removed is not None and json.loads(removed) == user
    assert EDIT.remove(raw(user), None) == raw(user)  # nothing of hctx's in it: not even reformatted


@given(user_settings, st.text(max_size=8).filter(lambda key: key not in RESERVED), values)
def test_a_key_the_user_adds_after_setup_survives_remove(user: dict[str, Any], key: str, value: object) -> None:
    applied = json.loads(EDIT.apply(raw(user)))
    applied[key] = value
    removed = EDIT.remove(json_bytes(applied), raw(user))
    assert removed is not None and json.loads(removed) == {**user, key: value}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(user_settings, st.booleans())
def test_setup_then_undo_leaves_every_file_byte_equal(user: dict[str, Any], absent: bool) -> None:
    with tempfile.TemporaryDirectory() as directory:
        home = Path(directory)
        root = home / ".claude"
        root.mkdir()
        if not absent:
            (root / "settings.json").write_bytes(raw(user, 3))  # a formatting setup never writes
        before = sorted(os.listdir(root)), None if absent else (root / "settings.json").read_bytes()
        journal = home / "state"
        apply_setup(setup(home, {}), journal)
        moved = {key: user[key] for key in ("statusLine", "subagentStatusLine") if key in user and not absent}
        if moved:
            assert json.loads((root / "hctx-renderers.json").read_text()) == moved
        undo_setup(setup(home, {}), journal)
        assert (sorted(os.listdir(root)), None if absent else (root / "settings.json").read_bytes()) == before


def test_the_renderers_edit_keeps_what_is_there_and_undoes_to_the_original() -> None:
    edit = RenderersEdit(UserFile(Path("/nonexistent"), PurePosixPath("hctx-renderers.json")),
                         {"statusLine": {"type": "command", "command": "mine"}})  # fmt: skip
    written = edit.apply(None)
    assert json.loads(written) == {"statusLine": {"type": "command", "command": "mine"}}
    assert edit.apply(written) == written
    assert edit.remove(written, None) is None  # it held only what setup kept there
    later = RenderersEdit(edit.file).apply(written)  # a second setup finds hctx's line in settings.json
    assert later == written


# --- the tee finds the user's line where setup kept it -----------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home" / ".claude").mkdir(parents=True)
    return tmp_path / "home"


def put_settings(home: Path, value: dict[str, Any]) -> None:
    (home / ".claude" / "settings.json").write_text(json.dumps(value))


HCTX_LINES = {
    "statusLine": {"type": "command", "command": tee_command("statusline")},
    "subagentStatusLine": {"type": "command", "command": tee_command("subagentstatusline")},
}
KEPT = {
    "statusLine": {"type": "command", "command": "printf KEPT-LINE"},
    "subagentStatusLine": {"type": "command", "command": "printf KEPT-ROWS"},
}


def test_the_tee_draws_the_users_line_setup_kept_while_their_settings_run_hctxs(home: Path) -> None:
    put_settings(home, HCTX_LINES)
    (home / ".claude" / "hctx-renderers.json").write_text(json.dumps(KEPT))
    assert run_tee("statusline", PAYLOAD, home).stdout == b"KEPT-LINE"
    assert run_tee("subagentstatusline", b'{"tasks": []}', home).stdout == b"KEPT-ROWS"
    # $CLAUDE_CONFIG_DIR: the same pair there.
    config = home.parent / "config"
    config.mkdir()
    (home / ".claude" / "hctx-renderers.json").rename(config / "hctx-renderers.json")
    (home / ".claude" / "settings.json").rename(config / "settings.json")
    assert run_tee("statusline", PAYLOAD, home, env_extra={"CLAUDE_CONFIG_DIR": str(config)}).stdout == b"KEPT-LINE"


def test_the_kept_line_ranks_below_a_projects_and_counts_only_under_hctxs_own(home: Path) -> None:
    (home / ".claude" / "hctx-renderers.json").write_text(json.dumps(KEPT))
    put_settings(home, {"statusLine": {"type": "command", "command": "printf THEIR-NEW-LINE"}})
    assert run_tee("statusline", PAYLOAD, home).stdout == b"THEIR-NEW-LINE"  # they replaced hctx's since
    put_settings(home, {})
    done = run_tee("statusline", PAYLOAD, home)  # no status line at all: Claude would draw none
    assert done.stdout == b"" and b"hctx-renderers.json" not in done.stderr
    put_settings(home, HCTX_LINES)
    project = home.parent / "project" / ".claude"
    project.mkdir(parents=True)
    (project / "settings.json").write_text(json.dumps({"statusLine": {"type": "command", "command": "printf PROJ"}}))
    assert run_tee("statusline", PAYLOAD, home).stdout == b"PROJ"  # Claude ranks the project's above the user's
