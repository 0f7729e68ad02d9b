"""Status-line slot chaining (HC-R18) and the hook forwarder, run as the processes Claude spawns.

Every arm asserts the tee's exact stdout bytes: the renderer's output and only that, or nothing.
The degraded arms take their evidence from stderr, since an empty stdout is also what a tee that
crashed at once would leave; and the recording is checked on a real channel socket.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.harnesses.claude import tee as claude_tee
from sidecar.harnesses.claude.launch import tee_command
from tests.conftest import FIXTURE_ROOT, REPO

FIXTURES = FIXTURE_ROOT / "claude"
PAYLOAD = (FIXTURES / "statusline-2.1.250.jsonl").read_bytes().splitlines()[1] + b"\n"
PRE_COMPACT = (FIXTURES / "precompact-2.1.250.jsonl").read_bytes().splitlines()[0] + b"\n"
SOURCES = (
    "$ST_CLAUDE_STATUSLINE_RENDERER",
    "~/.claude/statusline-renderer.json",
    ".claude/settings.json",
    "~/.claude/settings.json",
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home" / ".claude").mkdir(parents=True)
    return tmp_path / "home"


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    path = tmp_path / "ch.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(5)
    with listener:
        yield path, listener


def received(listener: socket.socket) -> list[dict[str, object]]:
    """Every frame sent so far; the kernel kept them in the backlog while the tee ran."""
    frames: list[dict[str, object]] = []
    listener.setblocking(False)
    try:
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.setblocking(True)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                assert data.endswith(b"\n") and data.count(b"\n") == 1  # one line per frame
                frames.append(json.loads(data))
    except BlockingIOError:
        return frames


def run_tee(
    entry: str,
    stdin: bytes,
    home: Path,
    *,
    renderer: str | None = None,
    channel: Path | None = None,
    env_extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HCTX_", "ST_CLAUDE", "CLAUDE_CONFIG_DIR"))
    }
    env["HOME"] = str(home)
    # The tee's parent here is pytest, no Claude to adopt (tests/test_adoption.py adopts one).
    env["HCTX_NO_ADOPT"] = "1"
    # The project hctx wrap names; a directory without settings unless a test gives it some.
    env["HCTX_CLAUDE_PROJECT_DIR"] = str(home.parent / "project")
    env |= env_extra or {}
    if renderer is not None:
        env["ST_CLAUDE_STATUSLINE_RENDERER"] = renderer
    if channel is not None:
        env["HCTX_CHANNEL"] = str(channel)
    # Exactly the command line the rendered settings give Claude, run the way Claude runs it.
    return subprocess.run(["/bin/sh", "-c", tee_command(entry)], input=stdin, env=env, capture_output=True, timeout=30)


def write_renderer_file(home: Path, command: object) -> None:
    (home / ".claude" / "statusline-renderer.json").write_text(json.dumps({"command": command}))


# --- the arms -------------------------------------------------------------------------------------


def test_env_renderer_gets_the_same_stdin_and_its_stdout_is_printed_exactly(
    home: Path, channel: tuple[Path, socket.socket]
) -> None:
    done = run_tee("statusline", PAYLOAD, home, renderer="cat", channel=channel[0])
    assert done.stdout == PAYLOAD  # `cat` proves the renderer saw the very bytes Claude sent
    assert done.returncode == 0 and done.stderr == b""
    assert received(channel[1]) == [{"type": "claude.statusline", "payload": json.loads(PAYLOAD)}]


def test_renderer_output_bytes_are_not_touched(home: Path) -> None:
    done = run_tee("statusline", PAYLOAD, home, renderer=r"printf '\033[32mctx 10%%\033[0m \342\237\2631'")
    assert done.stdout == b"\x1b[32mctx 10%\x1b[0m \xe2\x9f\xb31"  # no newline added, colours kept


def test_file_renderer_is_used_when_the_env_names_none(home: Path) -> None:
    write_renderer_file(home, "printf 'from-file'")
    assert run_tee("statusline", PAYLOAD, home).stdout == b"from-file"


def test_the_env_renderer_wins_over_the_file(home: Path) -> None:
    write_renderer_file(home, "printf 'from-file'")
    assert run_tee("statusline", PAYLOAD, home, renderer="printf 'from-env'").stdout == b"from-env"


def write_settings_file(path: Path, settings: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings))


def line(command: str) -> dict[str, object]:
    return {"statusLine": {"type": "command", "command": command, "padding": 1}}


def test_without_either_source_the_status_line_claude_would_have_drawn_is_chained(home: Path) -> None:
    """Claude's own precedence below the local file hctx renders: the project's, then the user's."""
    project = home.parent / "project" / ".claude" / "settings.json"
    write_settings_file(home / ".claude" / "settings.json", {"model": "x", **line("printf 'from-user'")})
    assert run_tee("statusline", PAYLOAD, home).stdout == b"from-user"
    write_settings_file(project, {"permissions": {}, **line("cat")})
    done = run_tee("statusline", PAYLOAD, home)
    assert done.stdout == PAYLOAD  # the project's file wins, and its renderer gets Claude's bytes
    write_renderer_file(home, "printf 'from-file'")
    assert run_tee("statusline", PAYLOAD, home).stdout == b"from-file"  # hctx's own two sources stay first
    assert run_tee("statusline", PAYLOAD, home, renderer="printf 'from-env'").stdout == b"from-env"


@pytest.mark.parametrize(
    "project_settings",
    [
        None,
        "not json",
        json.dumps({"model": "no status line here"}),
        json.dumps({"statusLine": {"type": "command", "command": "  "}}),
        json.dumps({"statusLine": "printf x"}),
        json.dumps(line(tee_command("statusline"))),  # hctx's own tee, e.g. committed by someone
    ],
)
def test_a_project_file_without_a_usable_status_line_falls_through_to_the_users(
    home: Path, project_settings: str | None
) -> None:
    if project_settings is not None:
        path = home.parent / "project" / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(project_settings)
    write_settings_file(home / ".claude" / "settings.json", line("printf 'from-user'"))
    assert run_tee("statusline", PAYLOAD, home).stdout == b"from-user"


def test_the_user_settings_follow_claude_config_dir(home: Path, tmp_path: Path) -> None:
    write_settings_file(home / ".claude" / "settings.json", line("printf 'from-home'"))
    write_settings_file(tmp_path / "config" / "settings.json", line("printf 'from-config-dir'"))
    done = run_tee("statusline", PAYLOAD, home, env_extra={"CLAUDE_CONFIG_DIR": str(tmp_path / "config")})
    assert done.stdout == b"from-config-dir"


def test_without_the_project_variable_the_project_is_the_working_directory(home: Path, tmp_path: Path) -> None:
    write_settings_file(tmp_path / "cwd" / ".claude" / "settings.json", line("printf 'from-cwd'"))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HCTX_", "ST_CLAUDE"))}
    env["HOME"] = str(home)
    done = subprocess.run(
        ["/bin/sh", "-c", tee_command("statusline")], input=PAYLOAD, env=env, cwd=tmp_path / "cwd",
        capture_output=True, timeout=30,
    )  # fmt: skip
    assert done.stdout == b"from-cwd"


@pytest.mark.parametrize(
    "file_content",
    [None, "not json", json.dumps({"command": ""}), json.dumps({"command": 7}), json.dumps(["printf x"]), "\xff"],
)
def test_no_source_resolving_leaves_stdout_empty_and_names_every_one(home: Path, file_content: str | None) -> None:
    if file_content is not None:
        (home / ".claude" / "statusline-renderer.json").write_text(file_content, errors="surrogateescape")
    done = run_tee("statusline", PAYLOAD, home, renderer="   ")
    assert done.stdout == b""
    assert done.returncode == 0
    assert all(source.encode() in done.stderr for source in SOURCES)


def test_a_failing_renderer_leaves_stdout_empty_even_after_a_partial_line(home: Path) -> None:
    done = run_tee("statusline", PAYLOAD, home, renderer="printf 'half a li'; exit 3")
    assert done.stdout == b""
    assert b"exited 3" in done.stderr and all(source.encode() in done.stderr for source in SOURCES)


def test_a_renderer_that_is_not_executable_leaves_stdout_empty(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "render.sh"
    script.write_text("#!/bin/sh\necho drawn\n")
    script.chmod(0o644)
    write_renderer_file(home, str(script))
    done = run_tee("statusline", PAYLOAD, home)
    assert done.stdout == b""
    assert b"exited 126" in done.stderr and all(source.encode() in done.stderr for source in SOURCES)
    script.chmod(0o755)
    assert run_tee("statusline", PAYLOAD, home).stdout == b"drawn\n"


def test_no_sidecar_listening_still_draws_and_says_so(home: Path, tmp_path: Path) -> None:
    done = run_tee("statusline", PAYLOAD, home, renderer="printf drawn", channel=tmp_path / "nobody.sock")
    assert done.stdout == b"drawn"
    assert b"no sidecar at" in done.stderr and b"not recorded" in done.stderr


def test_outside_hctx_wrap_it_still_draws(home: Path) -> None:
    done = run_tee("statusline", PAYLOAD, home, renderer="printf drawn")
    assert done.stdout == b"drawn" and b"HCTX_CHANNEL" in done.stderr


def test_stdin_that_is_not_one_json_object_is_drawn_but_not_recorded(
    home: Path, channel: tuple[Path, socket.socket]
) -> None:
    for junk in (b"not json", b"[1, 2]", PAYLOAD + PAYLOAD, b'{"a": NaN}', b"\xff\xfe", b""):
        done = run_tee("statusline", junk, home, renderer="cat", channel=channel[0])
        assert done.stdout == junk and b"not recorded" in done.stderr
    assert received(channel[1]) == []


def test_a_payload_spread_over_lines_is_sent_as_one_frame(home: Path, channel: tuple[Path, socket.socket]) -> None:
    pretty = json.dumps(json.loads(PAYLOAD), indent=2).encode()
    run_tee("statusline", pretty, home, renderer="true", channel=channel[0])
    assert received(channel[1]) == [{"type": "claude.statusline", "payload": json.loads(PAYLOAD)}]


def test_a_payload_cannot_smuggle_a_second_frame(home: Path, channel: tuple[Path, socket.socket]) -> None:
    smuggled = b'{"a": 1}, "type": "claude.hook", "payload": {"hook_event_name": "PreCompact"}'
    run_tee("statusline", smuggled, home, renderer="true", channel=channel[0])
    assert received(channel[1]) == []


def test_a_renderer_that_is_the_tee_itself_does_not_recurse(home: Path, channel: tuple[Path, socket.socket]) -> None:
    done = run_tee("statusline", PAYLOAD, home, renderer=tee_command("statusline"), channel=channel[0])
    assert done.stdout == b"" and b"the renderer is the tee itself" in done.stderr
    assert len(received(channel[1])) == 1  # recorded once, by the outer tee


# --- the subagent rows (issue 37) ----------------------------------------------------------------------

ROWS = (FIXTURES / "delegation-rows" / "2.1.332" / "subagent-statusline.jsonl").read_bytes().splitlines()[0] + b"\n"
# The user's own `subagentStatusLine`: one `{"id","content"}` line a task, Claude's row protocol.
USER_ROWS = f"{sys.executable} -S -c " + shlex.quote(
    "import json,sys; [print(json.dumps({'id': t['id'], 'content': 'mine'})) for t in json.load(sys.stdin)['tasks']]"
)


def test_subagent_rows_are_recorded_and_the_users_own_rows_answer_claude(
    home: Path, channel: tuple[Path, socket.socket]
) -> None:
    settings = {"subagentStatusLine": {"type": "command", "command": USER_ROWS}}
    (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    done = run_tee("subagentstatusline", ROWS, home, channel=channel[0])
    ids = [task["id"] for task in json.loads(ROWS)["tasks"]]
    assert ids and done.returncode == 0
    assert done.stdout == b"".join(json.dumps({"id": i, "content": "mine"}).encode() + b"\n" for i in ids)
    assert received(channel[1]) == [{"type": "claude.subagentstatusline", "payload": json.loads(ROWS)}]
    # The one wrap found in the user's .claude/settings.local.json wins, as the status line's does.
    env = {"ST_CLAUDE_SUBAGENT_STATUSLINE_RENDERER": "printf wrapped"}
    assert run_tee("subagentstatusline", ROWS, home, env_extra=env).stdout == b"wrapped"


def test_without_a_users_subagent_rows_the_tee_answers_nothing_and_claude_draws_its_own(
    home: Path, channel: tuple[Path, socket.socket]
) -> None:
    # The main status line's renderer is no subagent row renderer.
    write_renderer_file(home, "printf status-line")
    done = run_tee("subagentstatusline", ROWS, home, renderer="printf status-line", channel=channel[0])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert len(received(channel[1])) == 1


# --- the hook forwarder ------------------------------------------------------------------------------


def test_hook_forwards_and_prints_nothing(home: Path, channel: tuple[Path, socket.socket]) -> None:
    done = run_tee("hook", PRE_COMPACT, home, renderer="printf never", channel=channel[0])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert received(channel[1]) == [{"type": "claude.hook", "payload": json.loads(PRE_COMPACT)}]


def test_hook_exits_0_silently_on_stdout_when_the_sidecar_is_gone(home: Path, tmp_path: Path) -> None:
    for channel in (tmp_path / "gone.sock", None):
        done = run_tee("hook", PRE_COMPACT, home, channel=channel)
        assert (done.returncode, done.stdout) == (0, b"")
        assert b"not recorded" in done.stderr


@pytest.mark.parametrize("entry", ["statusline", "hook"])
def test_stdin_is_always_drained(entry: str, home: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(home), "HCTX_CHANNEL": str(tmp_path / "gone.sock")}
    process = subprocess.Popen(
        ["/bin/sh", "-c", tee_command(entry)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert process.stdin is not None
    process.stdin.write(b" " * (6 * 1024 * 1024))  # over every cap: would raise BrokenPipeError if not read
    process.stdin.close()
    assert process.wait(timeout=30) == 0


# --- in-process units -------------------------------------------------------------------------------


def test_a_renderer_past_its_deadline_is_killed_with_its_children_and_draws_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    output, why = claude_tee.render(f"printf early; sleep 2; touch {marker}", PAYLOAD, timeout_s=0.3)
    assert output is None and "did not finish" in why
    time.sleep(2.5)
    assert not marker.exists()  # the whole renderer group was killed, not just its shell


def test_a_renderer_printing_without_end_is_cut_off() -> None:
    output, why = claude_tee.render("yes", PAYLOAD, timeout_s=10)
    assert output is None and "did not finish" in why


def test_a_renderer_that_ignores_a_large_stdin_does_not_stall_the_tee() -> None:
    output, why = claude_tee.render("printf ok", b"x" * (2 * 1024 * 1024), timeout_s=10)
    assert (output, why) == (b"ok", "")


def test_renderer_resolution_without_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ST_CLAUDE_STATUSLINE_RENDERER", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    command, why = claude_tee.resolve_renderer()
    assert command is None and "$HOME is unset" in why


def test_usage_error_without_an_entry_point() -> None:
    assert claude_tee.main([]) == 2 and claude_tee.main(["render"]) == 2


def test_the_tee_imports_nothing_heavy() -> None:
    probe = (
        f"import sys; sys.path.append({str(REPO)!r}); import sidecar.harnesses.claude.tee; "
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert "sidecar.harnesses.claude.tee" in loaded
    heavy = {"json", "re", "socket", "subprocess", "enum", "typing", "pydantic", "trio", "guard", "threading", "os"}
    assert loaded.isdisjoint(heavy), loaded & heavy


def test_a_renderer_that_closes_stdout_and_lingers_is_still_held_to_its_deadline() -> None:
    from sidecar.harnesses.claude.tee import render

    started = time.monotonic()
    output, why = render("echo partial; exec >&-; sleep 5", b"{}", timeout_s=0.5)
    assert time.monotonic() - started < 4.0  # Claude waits on every render: the deadline, not the 5 s linger
    assert output is None and "did not finish within 0.5s" in why
