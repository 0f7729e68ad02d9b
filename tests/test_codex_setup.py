"""`hctx setup` for Codex (issue 36): the SessionStart hook in hooks.json, its trust in config.toml,
the hook's payload and process, and the adopted session's launch plan.

The trust hash and key are checked against what the real binaries report (`hooks/list` of codex
0.151.0 and 0.171.0, fixtures/codex/hooks/hooks-list-*.json), the payload decoder against the
payloads they handed a hook (fixtures/codex/hooks/session-start-*.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.harnesses.codex import setup as codex_setup
from sidecar.harnesses.codex.launch import adopted
from sidecar.harnesses.codex.producer import CodexTransport, Rollout
from sidecar.harnesses.codex.setup import (
    HOOK_MODULE,
    HooksJsonEdit,
    SessionStart,
    TrustEdit,
    decode_session_start,
    hook_command,
    hook_main,
    session_process,
    setup,
    trust_key,
    trusted_hash,
)
from sidecar.setup_plan import SetupRefused, UserFile

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "codex" / "hooks"
BUILDS = ("0.151.0", "0.171.0")
COMMAND = hook_command("/opt/hctx/bin/python")

USER_HOOKS = {
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "echo pre"}]}],
        "SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "echo mine"}]}],
    },
    "futureKey": {"kept": True},
}
USER_CONFIG = b"""# my settings
model = "gpt-5"  # the one I like

[features]
web_search = true

[hooks.state."/elsewhere/hooks.json:pre_tool_use:0:0"]
enabled = false
"""


def hooks_edit(tmp_path: Path) -> HooksJsonEdit:
    return HooksJsonEdit(UserFile(tmp_path, PurePosixPath("hooks.json")), COMMAND)


def trust_edit(tmp_path: Path, group: int = 1) -> TrustEdit:
    return TrustEdit(UserFile(tmp_path, PurePosixPath("config.toml")), key=trust_key(tmp_path, group),
                     hash=trusted_hash(hooks_edit(tmp_path).group()))  # fmt: skip


@pytest.mark.parametrize("build", BUILDS)
def test_the_trust_hash_is_the_one_each_binary_computes(build: str) -> None:
    hooks = json.loads((FIXTURES / f"hooks-list-{build}.hooks.json").read_bytes())
    [listed] = json.loads((FIXTURES / f"hooks-list-{build}.json").read_bytes())["result"]["data"]
    reported = {entry["key"].rsplit(":", 2)[1]: entry["currentHash"]
                for entry in listed["hooks"] if entry["eventName"] == "sessionStart"}  # fmt: skip
    groups = hooks["hooks"]["SessionStart"]
    # A matcher, a status message with a non-ASCII letter, a timeout, a path with a space: all hashed as Codex does.
    assert len(groups) == 2 and reported.keys() == {"0", "1"}
    assert {str(index): trusted_hash(group) for index, group in enumerate(groups)} == reported


def test_the_trust_key_names_the_real_path_of_hooks_json(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    # Measured: a symlinked CODEX_HOME's hooks are keyed by the resolved path.
    assert trust_key(tmp_path / "link", 2) == f"{real}/hooks.json:session_start:2:0"
    build = "0.171.0"
    [listed] = json.loads((FIXTURES / f"hooks-list-{build}.json").read_bytes())["result"]["data"]
    assert [entry["key"].split("hooks.json")[1] for entry in listed["hooks"]] == [
        ":pre_tool_use:0:0", ":session_start:0:0", ":session_start:1:0"]  # fmt: skip


def test_the_hook_is_appended_after_the_users_own_and_keeps_every_key(tmp_path: Path) -> None:
    edit = hooks_edit(tmp_path)
    user = json.dumps(USER_HOOKS).encode()
    applied = edit.apply(user)
    doc = json.loads(applied)
    assert doc["futureKey"] == {"kept": True}
    assert doc["hooks"]["PreToolUse"] == USER_HOOKS["hooks"]["PreToolUse"]
    first, ours = doc["hooks"]["SessionStart"]
    assert first == USER_HOOKS["hooks"]["SessionStart"][0]  # its place, so the trust Codex keyed by it, kept
    assert ours == {"hooks": [{"type": "command", "command": COMMAND, "timeout": 10}]}
    assert edit.index_in(user) == edit.index_in(applied) == 1
    assert edit.apply(applied) == applied  # setup twice is setup once, byte for byte
    assert json.loads(edit.remove(applied, user) or b"") == USER_HOOKS


def test_a_file_hctx_created_is_removed_whole(tmp_path: Path) -> None:
    edit = hooks_edit(tmp_path)
    created = edit.apply(None)
    assert json.loads(created) == {"hooks": {"SessionStart": [edit.group()]}}
    assert edit.apply(created) == created
    assert edit.remove(created, None) is None


def test_an_older_interpreters_hook_is_replaced_where_it_stands(tmp_path: Path) -> None:
    old = HooksJsonEdit(UserFile(tmp_path, PurePosixPath("hooks.json")), hook_command("/old/venv/bin/python"))
    stale = old.apply(json.dumps(USER_HOOKS).encode())
    doc = json.loads(stale)
    doc["hooks"]["SessionStart"].append({"hooks": [{"type": "command", "command": "echo later"}]})
    later = json.dumps(doc).encode()
    groups = json.loads(hooks_edit(tmp_path).apply(later))["hooks"]["SessionStart"]
    assert [group["hooks"][0]["command"] for group in groups] == ["echo mine", COMMAND, "echo later"]


@pytest.mark.parametrize(("content", "reason"), [
    (b'{"hooks": []}', '"hooks" is not an object'),
    (b'{"hooks": {"SessionStart": {}}}', '"hooks.SessionStart" is not a list'),
    (b"[1]", "not a JSON object"),
    (b"{not json", "Expecting property name"),
    (b'\xef\xbb\xbf{"hooks": {}}', "byte-order mark"),
    (b"[" * 100_000 + b"]" * 100_000, "nest"),
])  # fmt: skip
def test_a_hooks_file_it_will_not_touch_is_refused_with_the_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    with pytest.raises(SetupRefused, match=reason):
        hooks_edit(tmp_path).apply(content)


def test_the_trust_is_added_keeping_every_byte_of_the_users_config(tmp_path: Path) -> None:
    edit = trust_edit(tmp_path)
    applied = edit.apply(USER_CONFIG)
    assert applied.startswith(USER_CONFIG)  # comments, order, layout, the user's own hook state
    added = applied[len(USER_CONFIG) :].decode()
    assert added == f'\n[hooks.state."{edit.key}"]\ntrusted_hash = "{edit.hash}"\n'
    assert edit.apply(applied) == applied
    assert edit.remove(applied, USER_CONFIG) == USER_CONFIG
    created = edit.apply(None)
    assert edit.remove(created, None) is None


def test_the_users_own_trust_and_state_are_never_taken(tmp_path: Path) -> None:
    edit = trust_edit(tmp_path)
    theirs = USER_CONFIG + f'\n[hooks.state."{edit.key}"]\nenabled = true\ntrusted_hash = "sha256:theirs"\n'.encode()
    applied = edit.apply(theirs)
    assert b"enabled = true" in applied and b"sha256:theirs" not in applied
    removed = edit.remove(applied, theirs) or b""
    assert b"enabled = true" in removed and edit.hash.encode() not in removed
    # A trust that is not hctx's hash is the user's: removing leaves it.
    assert edit.remove(theirs, theirs) == theirs


@pytest.mark.parametrize("flag", ["hooks", "codex_hooks"])
def test_hooks_the_user_turned_off_stay_off(tmp_path: Path, flag: str) -> None:
    with pytest.raises(SetupRefused, match=rf"\[features\] {flag} = false"):
        trust_edit(tmp_path).apply(f"[features]\n{flag} = false\n".encode())


@pytest.mark.parametrize(("content", "reason"), [(b"model = \n", "not valid TOML"), (b"model = '\xff'\n", "not UTF-8")])
def test_a_config_it_will_not_touch_is_refused_with_the_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    with pytest.raises(SetupRefused, match=reason):
        trust_edit(tmp_path).apply(content)


def test_setup_names_codex_home_and_keys_the_trust_by_the_hooks_place(tmp_path: Path) -> None:
    codex_home = tmp_path / "codexhome"
    codex_home.mkdir()
    (codex_home / "hooks.json").write_text(json.dumps(USER_HOOKS))
    plan = setup(tmp_path, {"CODEX_HOME": str(codex_home), "PATH": ""})
    hooks, trust = plan.edits
    assert (plan.harness, plan.installed) == ("codex", True)
    assert hooks.file.path == codex_home / "hooks.json" and trust.file.path == codex_home / "config.toml"
    assert isinstance(trust, TrustEdit) and trust.key == f"{codex_home}/hooks.json:session_start:1:0"
    assert [(point.build, point.offered) for point in plan.builds] == [("0.151.0", True), ("0.171.0", True)]
    default = setup(tmp_path, {"PATH": ""})
    assert default.edits[0].file.root == tmp_path / ".codex" and not default.installed


def test_no_trust_is_written_for_a_hooks_file_that_cannot_be_read(tmp_path: Path) -> None:
    codex_home = tmp_path / "codexhome"
    codex_home.mkdir()
    (codex_home / "hooks.json").symlink_to("/etc/passwd")
    trust = setup(tmp_path, {"CODEX_HOME": str(codex_home)}).edits[1]
    with pytest.raises(SetupRefused, match=r"hooks\.json is a symlink"):
        trust.apply(None)


@pytest.mark.parametrize("capture", sorted(FIXTURES.glob("session-start-*.json")), ids=lambda path: path.stem)
def test_each_binarys_session_start_payload_is_decoded(capture: Path) -> None:
    payload = decode_session_start(capture.read_bytes())
    assert isinstance(payload, SessionStart), payload
    assert payload.source == ("resume" if "resume" in capture.stem else "startup")
    assert payload.transcript_path is not None
    assert payload.transcript_path.endswith(f"-{payload.session_id}.jsonl")
    assert "/codexhome/sessions/" in payload.transcript_path and payload.cwd.endswith("/work")


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "not a hook payload"),
    (b"\x00\x01", "not a hook payload"),
    (b'{"hook_event_name": "Stop", "session_id": "s", "cwd": "/w"}', "not a SessionStart payload"),
    (b'{"hook_event_name": "SessionStart", "cwd": "/w"}', "no session_id"),
    (b'{"hook_event_name": "SessionStart", "session_id": "s", "cwd": "w"}', "cwd is not an absolute path"),
    (b'{"hook_event_name": "SessionStart", "session_id": "s", "cwd": "/w", "transcript_path": 3}',
     "transcript_path is not an absolute path"),
    (b"[" * 100_000, "not a hook payload"),
])  # fmt: skip
def test_a_hostile_payload_is_a_reason_never_a_traceback(data: bytes, reason: str) -> None:
    decoded = decode_session_start(data)
    assert isinstance(decoded, str) and decoded.startswith(reason)


def _wait_for_child(parent: int) -> int:
    for _ in range(200):
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    raise AssertionError("no child")


def test_the_session_process_is_above_a_shell_that_forked_the_hook() -> None:
    # `$SHELL -lc <command>` as Codex runs it, with a command the shell cannot exec in place.
    shell = subprocess.Popen(["/bin/sh", "-lc", f"sleep 30; : {HOOK_MODULE} -m {HOOK_MODULE}"])
    try:
        _wait_for_child(shell.pid)
        assert session_process(shell.pid) == os.getpid()
    finally:
        shell.kill()
        shell.wait()
    assert session_process(os.getpid()) == os.getpid()  # a shell that exec'd: the parent is the session's


def test_a_session_in_the_shared_background_daemon_is_not_adopted() -> None:
    # 0.171.0's TUI: the hook's parent is `codex app-server --listen unix:// … --managed-daemon`.
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "app-server", "--listen",
                               "unix://", "--analytics-default-enabled", "--managed-daemon"])  # fmt: skip
    try:
        time.sleep(0.2)
        reason = session_process(daemon.pid)
        assert isinstance(reason, str) and "shared background app-server" in reason
    finally:
        daemon.kill()
        daemon.wait()


@pytest.mark.parametrize("guard", ["HCTX_CHANNEL", "HCTX_NO_ADOPT"])
def test_a_wrapped_seats_hook_adopts_nothing(guard: str) -> None:
    read, write = os.pipe()
    os.write(write, (FIXTURES / "session-start-0.151.0-exec-startup.json").read_bytes())
    os.close(write)
    try:
        # It would start the adopter (and redirect this process's stdio) if it went on; it returns, stdin unread.
        assert hook_main(read, {guard: "/run/hctx/channel" if guard == "HCTX_CHANNEL" else "1"}) == 0
        assert os.read(read, 10) != b""
    finally:
        os.close(read)


def test_an_adopted_session_follows_the_rollout_its_own_process_holds(tmp_path: Path) -> None:
    codex_home = tmp_path / "codexhome"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text("model_context_window = 200000\nmodel_auto_compact_token_limit = 9\n"
                                            "[profiles.p]\nmodel_auto_compact_token_limit = 160000\n")  # fmt: skip
    before = time.time_ns() // 1_000_000
    # A process standing for codex: its command line holds the profile, its environment CODEX_HOME.
    codex = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "codex", "-p", "p", "exec", "hi"],
                             env={**os.environ, "CODEX_HOME": str(codex_home)})  # fmt: skip
    try:
        time.sleep(0.2)
        plan = adopted(codex.pid, tmp_path / "work", {"rollout": "/elsewhere/rollout.jsonl", "session": "s"})
    finally:
        codex.kill()
        codex.wait()
    assert (plan.harness, plan.argv, plan.env, plan.cwd) == ("codex", (), {}, tmp_path / "work")
    assert isinstance(plan.transport, CodexTransport) and isinstance(plan.transport.root, Rollout)
    rollout = plan.transport.root
    assert (rollout.codex_home, rollout.cwd, rollout.root_pid) == (str(codex_home), str(tmp_path / "work"), codex.pid)
    assert (rollout.auto_compact_token_limit, rollout.model_context_window) == (160_000, 200_000)
    assert before - 1_000 <= rollout.started_at_ms <= time.time_ns() // 1_000_000  # the process's start, not now
    assert plan.account is None  # no auth.json in that CODEX_HOME


# Through the engine (`hctx setup codex`, a process of its own with a deadline: a FIFO opened for
# reading would block it for good): a file it will not touch is refused with the reason, and neither
# file is written, so no trust is ever left for a hook that is not there.
USER_TOML = USER_CONFIG


def _hooks_symlink_out(codex_home: Path, outside: Path) -> str:
    (outside / "hooks.json").write_text(json.dumps(USER_HOOKS))
    (codex_home / "hooks.json").symlink_to(outside / "hooks.json")
    return "symlink"


def _hooks_fifo(codex_home: Path, outside: Path) -> str:
    os.mkfifo(codex_home / "hooks.json")
    return "not a regular file"


def _hooks_huge(codex_home: Path, outside: Path) -> str:
    with open(codex_home / "hooks.json", "wb") as file:  # sparse: nothing of it is read
        file.truncate(100 * 1024 * 1024)
    return "104857600 bytes"


def _hooks_deep(codex_home: Path, outside: Path) -> str:
    (codex_home / "hooks.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    return "deep"


def _hooks_bom(codex_home: Path, outside: Path) -> str:
    (codex_home / "hooks.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(USER_HOOKS).encode())
    return "byte-order mark"


def _hooks_a_list(codex_home: Path, outside: Path) -> str:
    (codex_home / "hooks.json").write_text('{"hooks": {"SessionStart": {"x": 1}}}')
    return '"hooks.SessionStart" is not a list'


def _config_invalid(codex_home: Path, outside: Path) -> str:
    (codex_home / "config.toml").write_bytes(USER_TOML + b"[broken\n")
    return "not valid TOML"


def _hooks_off(codex_home: Path, outside: Path) -> str:
    (codex_home / "config.toml").write_bytes(USER_TOML.replace(b"web_search = true", b"hooks = false"))
    return "[features] hooks = false"


def _config_fifo(codex_home: Path, outside: Path) -> str:
    (codex_home / "config.toml").unlink()
    os.mkfifo(codex_home / "config.toml")
    return "not a regular file"


HOSTILE = {
    "hooks.json a symlink out": _hooks_symlink_out,
    "hooks.json a FIFO": _hooks_fifo,
    "hooks.json of 100 MB": _hooks_huge,
    "hooks.json nested too deep": _hooks_deep,
    "hooks.json with a BOM": _hooks_bom,
    "hooks.json's SessionStart an object": _hooks_a_list,
    "config.toml not TOML": _config_invalid,
    "config.toml turning hooks off": _hooks_off,
    "config.toml a FIFO": _config_fifo,
}


def _tree(root: Path) -> dict[str, bytes | str]:
    return {str(path.relative_to(root)): "fifo" if path.is_fifo() else path.read_bytes() if path.is_file()
            else "dir" for path in sorted(root.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_user_file_is_refused_and_nothing_is_written(case: str, tmp_path: Path) -> None:
    home, codex_home, outside = tmp_path / "home", tmp_path / "home" / ".codex", tmp_path / "outside"
    for directory in (codex_home, outside):
        directory.mkdir(parents=True)
    (codex_home / "config.toml").write_bytes(USER_TOML)
    reason = HOSTILE[case](codex_home, outside)
    before = _tree(home), _tree(outside)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # fmt: skip
    for args in (["setup", "codex"], ["setup", "codex", "--dry-run"]):
        done = subprocess.run([sys.executable, "-m", "wrapper.cli", *args], env=env, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert "Traceback" not in done.stderr
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "hctx setup: codex: refused:" in done.stderr and reason in done.stderr, done.stderr
        assert (_tree(home), _tree(outside)) == before


_KEYS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
_SCALARS = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
                     max_leaves=12)  # fmt: skip
_A_GROUP = st.just({"hooks": [{"type": "command", "command": "x"}]})
_GROUPS = st.lists(st.dictionaries(_KEYS, _JSON, max_size=3) | _A_GROUP, max_size=3)
_HOOKS_FILES = st.builds(lambda other, hooks, groups: {**other, "hooks": {**hooks, "SessionStart": groups}},
                         st.dictionaries(_KEYS.filter(lambda k: k != "hooks"), _JSON, max_size=3),
                         st.dictionaries(_KEYS.filter(lambda k: k != "SessionStart"), _JSON, max_size=2),
                         _GROUPS)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(user=_HOOKS_FILES)
def test_any_users_hooks_file_gets_the_hook_after_theirs_and_back(user: dict[str, object]) -> None:
    edit = hooks_edit(Path("/codexhome"))
    raw = json.dumps(user).encode()
    applied = edit.apply(raw)
    assert edit.apply(applied) == applied
    groups = json.loads(applied)["hooks"]["SessionStart"]
    assert groups[:-1] == user["hooks"]["SessionStart"] and groups[-1] == edit.group()  # type: ignore[index]
    assert edit.index_in(raw) == edit.index_in(applied) == len(groups) - 1
    assert json.loads(edit.remove(applied, raw) or b"") == user


_TOML_SCALARS = st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=8)
_TOML_TABLES = st.dictionaries(_KEYS | st.just("hooks"),
                               _TOML_SCALARS | st.dictionaries(_KEYS | st.just("state"), _TOML_SCALARS, max_size=3)
                               | st.just({"state": {}}), max_size=4)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(user=_TOML_TABLES)
def test_any_users_config_keeps_its_bytes_and_gets_them_back(user: dict[str, object]) -> None:
    import tomllib

    import tomlkit

    edit = trust_edit(Path("/codexhome"))
    raw = tomlkit.dumps(user).encode()
    hooks = user.get("hooks", {})
    if not isinstance(hooks, dict) or not isinstance(hooks.get("state", {}), dict):
        with pytest.raises(SetupRefused, match="is not a table"):
            edit.apply(raw)
        return
    applied = edit.apply(raw)
    assert edit.apply(applied) == applied
    parsed = tomllib.loads(applied.decode())
    assert parsed["hooks"]["state"][edit.key] == {"trusted_hash": edit.hash}
    assert edit.hash.encode() not in (edit.remove(applied, raw) or b"")
    assert tomllib.loads((edit.remove(applied, raw) or b"").decode()) == tomllib.loads(raw.decode())
    del parsed["hooks"]["state"][edit.key]
    if not parsed["hooks"]["state"] and "state" not in user.get("hooks", {}):  # type: ignore[operator]
        del parsed["hooks"]["state"]
    if not parsed["hooks"] and "hooks" not in user:
        del parsed["hooks"]
    assert parsed == tomllib.loads(raw.decode())
    if "hooks" not in user:
        assert applied.startswith(raw)
        assert edit.remove(applied, raw) == (raw.rstrip(b"\n") + b"\n" if raw.strip() else b"")


def _run_hook_under(words: list[str], payload: bytes, catalog: Path) -> bytes:
    """The hook (`python -m sidecar.harnesses.codex.setup`) run as the child of a process whose command
    line ends in `words` (standing for the process running the session); the hook's stdout."""
    root = str(Path(__file__).resolve().parent.parent)
    parent = ("import subprocess, sys; done = subprocess.run([sys.executable, '-m', " + repr(HOOK_MODULE) + "], "
              "input=sys.stdin.buffer.read(), capture_output=True); sys.stdout.buffer.write(done.stdout)")  # fmt: skip
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": root, "HCTX_CATALOG": str(catalog)}
    done = subprocess.run([sys.executable, "-c", parent, *words], input=payload, capture_output=True, env=env,
                          timeout=30, check=True)  # fmt: skip
    return done.stdout


def test_a_hook_that_adopts_nothing_says_why_in_the_adoption_log(tmp_path: Path) -> None:
    from wrapper.launch.adopt import ADOPT_LOG

    assert ADOPT_LOG == codex_setup.ADOPT_LOG
    log = tmp_path / "catalog" / ".st2" / "logs" / ADOPT_LOG
    payload = (FIXTURES / "session-start-0.171.0-tui-daemon-startup.json").read_bytes()
    # 0.171.0's TUI: the hook's parent is the background daemon (its command line as measured).
    daemon = ["app-server", "--listen", "unix://", "--analytics-default-enabled", "--managed-daemon"]
    assert _run_hook_under(daemon, payload, tmp_path / "catalog") == b""  # nothing for the model's context
    assert "not adopting session 01a2451c-0940-76f1-9376-f22be019a58d: the session runs in Codex's shared " \
           "background app-server" in log.read_text()  # fmt: skip
    assert _run_hook_under([], b"{oops", tmp_path / "catalog") == b""
    assert "codex hook: not adopting: not a hook payload" in log.read_text()
