"""`hctx setup` and its user-file engine (issue 36), on Claude's real plan in a throwaway HOME:
dry run, idempotence, exact undo, the user's later changes kept, hostile files refused with the
reason and left byte for byte, and `hctx doctor`'s line in its three states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from sidecar.harnesses.claude.launch import tee_command
from sidecar.harnesses.claude.setup import setup as claude_setup
from sidecar.setup_plan import HarnessSetup, SetupRefused, UserFile
from tests.conftest import REPO
from wrapper.cli import main
from wrapper.launch.userfiles import apply_setup, undo_setup
from wrapper.readers.reader_commands import setup_lines

TEE = "sidecar.harnesses.claude.tee"
USER: dict[str, Any] = {
    "model": "claude-opus-5",
    "statusLine": {"type": "command", "command": "my-own-line", "padding": 1},
    "hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
        "SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "~/bin/hello"}]}],
    },
    "aKeyOfALaterBuild": {"nested": [1, 2, {"x": None}]},
}
# The user's own formatting, which only --undo's exact restore keeps.
USER_BYTES = (json.dumps(USER, indent=4) + "\n").encode()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join((os.path.dirname(sys.executable), "/usr/bin", "/bin")))
    return home


def settings(home: Path) -> Path:
    return home / ".claude" / "settings.json"


def tree(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every path below `root`: its mode and bytes (a link: its target)."""
    found: dict[str, tuple[int, bytes | str]] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            info = path.lstat()
            content: bytes | str = b""
            if path.is_symlink():
                content = os.readlink(path)
            elif path.is_file():
                content = path.read_bytes()
            found[str(path.relative_to(root))] = (info.st_mode, content)
    return found


def hctx(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_dry_run_writes_nothing_and_shows_each_files_diff(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings(home).write_bytes(USER_BYTES)
    before = tree(home)
    status, out, _ = hctx(capsys, "setup", "claude", "--dry-run")
    assert status == 0
    assert tree(home) == before  # not even the journal's directory
    assert f"--- {settings(home)}\n+++ {settings(home)}\n" in out
    assert '-    "statusLine": {\n' in out and f'+    "command": {json.dumps(tee_command("statusline"))},\n' in out
    assert f"--- /dev/null\n+++ {home / '.claude' / 'hctx-renderers.json'}\n" in out  # the user's line, kept
    assert '+    "command": "my-own-line",' in out
    assert out.endswith("dry run: nothing was written\n")


def test_setup_twice_is_setup_once_and_undo_gives_back_the_bytes(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings(home).write_bytes(USER_BYTES)
    os.chmod(settings(home), 0o640)
    before = tree(home / ".claude")
    assert hctx(capsys, "setup", "claude")[0] == 0
    once = tree(home)
    rendered = json.loads(settings(home).read_text())
    assert TEE in rendered["statusLine"]["command"] and TEE in rendered["subagentStatusLine"]["command"]
    assert rendered["model"] == USER["model"] and rendered["aKeyOfALaterBuild"] == USER["aKeyOfALaterBuild"]
    assert rendered["hooks"]["Stop"] == USER["hooks"]["Stop"]  # the user's hooks kept, ours after theirs
    assert rendered["hooks"]["SessionStart"][0] == USER["hooks"]["SessionStart"][0]
    assert TEE in rendered["hooks"]["SessionStart"][1]["hooks"][0]["command"]
    assert settings(home).stat().st_mode & 0o777 == 0o640  # the mode kept
    kept = json.loads((home / ".claude" / "hctx-renderers.json").read_text())
    assert kept == {"statusLine": USER["statusLine"]}  # where the tee finds the user's line

    status, out, _ = hctx(capsys, "setup", "claude")
    assert status == 0 and out.count("in place, unchanged") == 2
    assert tree(home) == once  # bytes, modes, the journal: all as after the first

    status, out, _ = hctx(capsys, "setup", "--undo", "claude")
    assert status == 0 and "restored byte for byte" in out and "removed (setup created it)" in out
    assert tree(home / ".claude") == before


def test_a_file_absent_before_is_removed_with_the_directories_setup_created(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "elsewhere" / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    assert hctx(capsys, "setup", "claude")[0] == 0
    assert (config / "settings.json").stat().st_mode & 0o777 == 0o600  # settings may hold secrets
    assert config.stat().st_mode & 0o777 == 0o700 and (tmp_path / "elsewhere").stat().st_mode & 0o777 == 0o700
    assert sorted(os.listdir(config)) == ["settings.json"]  # no user line to keep: no renderers file
    assert hctx(capsys, "setup", "--undo", "claude")[0] == 0
    assert not (tmp_path / "elsewhere").exists()


def test_the_directories_setup_creates_are_0700_whatever_the_umask(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The process-wide umask narrowed for a moment by another thread (a channel binds under 0177)
    must not leave a directory no one can enter: found by CI, 0600 for `claude-config`."""
    config = tmp_path / "elsewhere" / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    old = os.umask(0o177)
    try:
        assert hctx(capsys, "setup", "claude")[0] == 0
    finally:
        os.umask(old)
    assert config.stat().st_mode & 0o777 == 0o700 and (tmp_path / "elsewhere").stat().st_mode & 0o777 == 0o700


def test_undo_keeps_what_the_user_changed_after_setup(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings(home).write_bytes(USER_BYTES)
    assert hctx(capsys, "setup", "claude")[0] == 0
    changed = json.loads(settings(home).read_text())
    changed["theme"] = "light"
    changed["hooks"]["Stop"].append({"hooks": [{"type": "command", "command": "added-later"}]})
    settings(home).write_text(json.dumps(changed))
    status, out, _ = hctx(capsys, "setup", "--undo", "claude")
    assert status == 0 and "your later changes kept" in out
    after = json.loads(settings(home).read_text())
    expected = {**USER, "theme": "light"}
    expected["hooks"] = {**USER["hooks"], "Stop": [*USER["hooks"]["Stop"], changed["hooks"]["Stop"][-1]]}
    assert after == expected  # their status line back, their change kept, nothing of hctx's
    assert TEE not in settings(home).read_text()


# --- hostile files: each refused with its reason, left byte for byte --------------------------------


def _symlink_out(home: Path, tmp_path: Path) -> str:
    outside = tmp_path / "dotfiles" / "settings.json"
    outside.parent.mkdir()
    outside.write_bytes(USER_BYTES)
    settings(home).symlink_to(outside)
    return "outside"


def _fifo(home: Path, tmp_path: Path) -> str:
    os.mkfifo(settings(home))
    return "is not a regular file"


def _huge(home: Path, tmp_path: Path) -> str:
    with open(settings(home), "wb") as file:  # 100 MB, sparse: nothing of it is read
        file.truncate(100 * 1024 * 1024)
    return "is 104857600 bytes, over the 1048576-byte bound"


def _deep(home: Path, tmp_path: Path) -> str:
    settings(home).write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    return "nested too deep"


def _deep_enough_to_parse(home: Path, tmp_path: Path) -> str:
    settings(home).write_text('{"a":' * 200 + "1" + "}" * 200)  # json.loads takes it; json.dumps would not
    return "nests deeper than 64 levels"


def _bom(home: Path, tmp_path: Path) -> str:
    settings(home).write_bytes(b"\xef\xbb\xbf" + USER_BYTES)
    return "byte-order mark"


def _invalid(home: Path, tmp_path: Path) -> str:
    settings(home).write_bytes(USER_BYTES[:-3])
    return "is not JSON hctx will edit: malformed JSON"


def _not_an_object(home: Path, tmp_path: Path) -> str:
    settings(home).write_text("[1, 2]\n")
    return "holds a JSON list, not an object"


def _hooks_a_list(home: Path, tmp_path: Path) -> str:
    settings(home).write_text(json.dumps({"hooks": [1]}))
    return '"hooks" is a list, not an object'


def _event_an_object(home: Path, tmp_path: Path) -> str:
    settings(home).write_text(json.dumps({"hooks": {"SessionStart": {"oops": 1}}}))
    return '"hooks.SessionStart" is a dict, not a list'


def _not_utf8(home: Path, tmp_path: Path) -> str:
    settings(home).write_bytes(b'{"model": "\xff"}')
    return "not UTF-8 text"


def _parent_a_symlink(home: Path, tmp_path: Path) -> str:
    # The renderers file's directory is the root itself; a plan's file below a linked directory:
    # ~/.claude/settings.json -> sub/settings.json where sub links out.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "settings.json").write_bytes(USER_BYTES)
    (home / ".claude" / "sub").symlink_to(tmp_path / "out")
    settings(home).symlink_to(home / ".claude" / "sub" / "settings.json")
    return "outside"


HOSTILE = {
    "symlink out of the config dir": _symlink_out,
    "FIFO": _fifo,
    "100 MB": _huge,
    "deep nesting": _deep,
    "nesting json.dumps cannot write": _deep_enough_to_parse,
    "BOM": _bom,
    "invalid JSON": _invalid,
    "not an object": _not_an_object,
    "hooks of a wrong type": _hooks_a_list,
    "a hook event of a wrong type": _event_an_object,
    "not UTF-8": _not_utf8,
    "a symlink through a linked directory": _parent_a_symlink,
}

# A file whose JSON is an object but whose hooks Claude's edit will not merge: --undo reads it whole,
# finds nothing of hctx's and leaves it.
UNDO_READS = {"hooks of a wrong type", "a hook event of a wrong type"}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_settings_file_is_refused_with_the_reason_and_left_as_it_was(
    case: str, home: Path, tmp_path: Path
) -> None:
    reason = HOSTILE[case](home, tmp_path)
    before, outside = tree(home), tree(tmp_path / "dotfiles") if (tmp_path / "dotfiles").exists() else {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args in (["setup", "claude"], ["setup", "claude", "--dry-run"], ["setup", "--undo", "claude"]):
        # A process of its own with a deadline: a FIFO opened for reading would block it for good.
        done = subprocess.run([sys.executable, "-m", "wrapper.cli", *args], env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        assert "Traceback" not in done.stderr
        if args[1] == "--undo" and case in UNDO_READS:  # hctx's part is nowhere in it: nothing to undo
            assert (done.returncode, done.stdout) == (0, f"claude: {settings(home)}: holds nothing of hctx's\n")
            continue
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert f"hctx setup: claude: refused: {settings(home)}" in done.stderr and reason in done.stderr, done.stderr
    assert tree(home) == before  # nothing written: not the file, not the renderers, not a journal
    assert (tree(tmp_path / "dotfiles") if outside else {}) == outside


def test_doctor_says_the_same_refusal(home: Path) -> None:
    _bom(home, home)
    assert setup_lines(os.environ) == [
        f"setup: claude: cannot tell: {settings(home)}: starts with a UTF-8 byte-order mark; left as it is "
        "(remove the mark)"
    ]


def test_a_symlink_to_a_file_inside_the_config_dir_is_written_through(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = home / ".claude" / "kept" / "settings.json"
    real.parent.mkdir()
    real.write_bytes(USER_BYTES)
    settings(home).symlink_to("kept/settings.json")
    assert hctx(capsys, "setup", "claude")[0] == 0
    assert settings(home).is_symlink() and TEE in real.read_text()
    assert hctx(capsys, "setup", "--undo", "claude")[0] == 0
    assert settings(home).is_symlink() and real.read_bytes() == USER_BYTES


# --- the journal -------------------------------------------------------------------------------------


def test_concurrent_setups_leave_what_one_leaves_and_undo_still_restores(home: Path) -> None:
    settings(home).write_bytes(USER_BYTES)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.Popen([sys.executable, "-m", "wrapper.cli", "setup", "claude"], env=env,
                             stdout=subprocess.DEVNULL) for _ in range(4)]  # fmt: skip
    assert [run.wait(timeout=60) for run in runs] == [0] * 4
    plan = claude_setup(home, os.environ)
    journal = home / ".local" / "state" / "hctx" / "setup"
    assert [change.changes for change in apply_setup(plan, journal)] == [False, False]
    assert {undone.how for undone in undo_setup(claude_setup(home, os.environ), journal)} == {
        "restored byte for byte", "removed (setup created it)",
    }  # fmt: skip
    assert settings(home).read_bytes() == USER_BYTES


def test_a_directory_another_setup_makes_meanwhile_is_used_and_not_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two setups at once both found the journal's directory missing; the second one's mkdir met the
    first one's directory and failed the setup ("File exists", seen in a full run): now it goes on,
    and the directory is not listed as its own (its undo must not remove it)."""
    from guard.walk import open_parent_within

    root, real_mkdir = tmp_path / "state" / "hctx", os.mkdir

    def another_setup_first(path: str | os.PathLike[str], mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if dir_fd is None and Path(path) == root:
            real_mkdir(path, mode)
        real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", another_setup_first)
    fd, created = open_parent_within(root, ("lock",), create=True)
    os.close(fd)
    assert created == [tmp_path / "state"] and root.is_dir()


def test_the_lock_makes_a_second_setup_wait(home: Path) -> None:
    """Held by one setup, the journal's lock keeps another out until it is released."""
    import fcntl

    settings(home).write_bytes(USER_BYTES)
    journal = home / ".local" / "state" / "hctx" / "setup"
    journal.mkdir(parents=True)
    lock = os.open(journal / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    finished = threading.Event()
    thread = threading.Thread(target=lambda: (apply_setup(claude_setup(home, os.environ), journal), finished.set()))
    thread.start()
    assert not finished.wait(0.5)
    assert settings(home).read_bytes() == USER_BYTES
    os.close(lock)
    assert finished.wait(10)
    thread.join()
    assert TEE in settings(home).read_text()


def test_an_unreadable_journal_is_refused_and_nothing_is_written(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings(home).write_bytes(USER_BYTES)
    journal = home / ".local" / "state" / "hctx" / "setup" / "journal.json"
    journal.parent.mkdir(parents=True)
    journal.write_text('{"version": 1, "files": {"x": {"harness": "claude", "original": "%%", "written": ""}}}')
    status, _, err = hctx(capsys, "setup", "claude")
    assert status == 1 and "hctx's setup journal is unreadable" in err and "move it aside" in err
    assert settings(home).read_bytes() == USER_BYTES


def test_undo_without_a_journal_still_takes_hctxs_part_out(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings(home).write_bytes(USER_BYTES)
    assert hctx(capsys, "setup", "claude")[0] == 0
    (home / ".local" / "state" / "hctx" / "setup" / "journal.json").unlink()
    assert hctx(capsys, "setup", "--undo", "claude")[0] == 0
    left = json.loads(settings(home).read_text())
    assert TEE not in json.dumps(left) and left["model"] == USER["model"] and "statusLine" not in left


# --- the command ------------------------------------------------------------------------------------


def test_a_harness_without_a_setup_module_says_so_plainly(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import wrapper.launch.setup as command

    real = command.setup_module
    monkeypatch.setattr(command, "setup_module", lambda harness: None if harness == "codex" else real(harness))
    status, out, _ = hctx(capsys, "setup", "codex")
    assert status == 0
    assert out == "codex: no user-level extension point measured for this harness; nothing to set up\n"


def test_a_build_without_a_point_is_said_and_nothing_edited(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import wrapper.launch.setup as command
    from sidecar.setup_plan import BuildPoint

    class Module:
        @staticmethod
        def setup(home: Path, environ: object) -> HarnessSetup:
            return HarnessSetup("codex", True, (), (BuildPoint("0.151.0", False, "its hooks never run"),))

    real = command.setup_module
    monkeypatch.setattr(command, "setup_module", lambda harness: Module if harness == "codex" else real(harness))
    status, out, _ = hctx(capsys, "setup", "codex")
    assert status == 0
    assert out == (
        "codex 0.151.0: no user-level extension point: its hooks never run\n"
        "codex: no user-level extension point measured for this harness; nothing to set up\n"
    )


def test_without_names_only_installed_harnesses_are_set_up(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / ".claude").rmdir()
    status, out, _ = hctx(capsys, "setup", "--dry-run")
    assert status == 0 and "no harness found installed" in out and not (home / ".claude").exists()
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text("#!/bin/sh\n")
    (bin_dir / "claude").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    status, out, _ = hctx(capsys, "setup", "--dry-run")
    assert status == 0 and f"+++ {settings(home)}" in out


def test_a_plan_file_outside_its_root_is_refused() -> None:
    class Escaping:
        file = UserFile(Path("/tmp"), PurePosixPath("../etc/passwd"))

        def apply(self, current: bytes | None) -> bytes:
            return b""

        def remove(self, current: bytes, original: bytes | None) -> bytes | None:
            return None

    with pytest.raises(SetupRefused, match="a plain path inside its root"):
        apply_setup(HarnessSetup("x", True, (Escaping(),), ()), Path("/nonexistent/journal"))


# --- hctx doctor ------------------------------------------------------------------------------------


def test_doctor_says_not_set_up_current_and_stale(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings(home).write_bytes(USER_BYTES)
    assert setup_lines(os.environ) == [
        "setup: claude: not set up: a session started without hctx wrap is not seen (hctx setup claude)"
    ]
    assert hctx(capsys, "setup", "claude")[0] == 0
    (catalog := home / "catalog").mkdir()
    status, out, _ = hctx(capsys, "doctor", "--catalog", str(catalog))
    assert status == 0
    assert out == (
        "ok: 0 agents, no advisories\n"
        f"setup: claude: in place and current ({settings(home)}, {home / '.claude' / 'hctx-renderers.json'})\n"
    )
    moved = settings(home).read_text().replace(json.dumps(sys.executable)[1:-1], "/old/venv/bin/python3")
    assert moved != settings(home).read_text()
    settings(home).write_text(moved)  # an older hctx's commands: its venv moved away
    assert setup_lines(os.environ) == [
        f"setup: claude: stale: {settings(home)} holds another hctx's commands (an older install, a moved venv); "
        "run hctx setup claude again"
    ]
    assert hctx(capsys, "setup", "claude")[0] == 0
    assert setup_lines(os.environ)[0].startswith("setup: claude: in place and current")


def test_doctor_says_nothing_of_a_harness_not_installed(harnessless_home: Path) -> None:
    assert setup_lines(os.environ) == []


def test_the_registry_finds_a_setup_module_only_where_a_harness_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import sidecar.registry as registry

    claude = registry.setup_module("claude")
    assert claude is not None and claude.setup is claude_setup
    real = registry.spec_for
    for package in ("os", "sidecar.harnesses"):  # a plain module; a package with no setup.py in it
        monkeypatch.setattr(
            registry, "spec_for", lambda name, package=package: types.SimpleNamespace(package=package, setup="setup")
        )
        assert registry.setup_module("claude") is None
    monkeypatch.setattr(registry, "spec_for", real)


def test_a_write_that_fails_after_the_journal_leaves_a_record_undo_acts_on(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal is written before the file: a setup killed in between still leaves the original
    where --undo finds it."""
    import wrapper.launch.userfiles as userfiles

    settings(home).write_bytes(USER_BYTES)
    journal = home / ".local" / "state" / "hctx" / "setup"

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(userfiles, "_write", crash)
        with pytest.raises(OSError, match="No space"):
            apply_setup(claude_setup(home, os.environ), journal)
    assert settings(home).read_bytes() == USER_BYTES
    entries = json.loads((journal / "journal.json").read_text())["files"]
    assert list(entries) == [str(settings(home))]
    apply_setup(claude_setup(home, os.environ), journal)  # the retry keeps the first original
    undo_setup(claude_setup(home, os.environ), journal)
    assert settings(home).read_bytes() == USER_BYTES
