"""The artifact a user gets: the wheel `pip install .` builds, in a venv of its own, run from elsewhere.

The wheel is built from a clean copy of the sources (what a fresh clone holds, so no stale `build/`
can hide a missing file), installed with its dependencies into a venv without system site packages,
and driven from a directory outside the checkout with the checkout nowhere on `sys.path`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.wrapping import REPO, STANDIN, context_frame, wait_for

PACKAGES = ("guard", "sidecar", "wrapper")
BYTECODE = ("__pycache__", ".pyc")


def source_files() -> list[str]:
    """Tracked files and new files not ignored: what the next commit ships."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    return sorted(name for name in listed if name and os.path.lexists(REPO / name))


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    outside: Path

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def run(self, *argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(word) for word in argv], cwd=self.outside, env=user_env(self.venv), capture_output=True,
            text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def user_env(venv_dir: Path) -> dict[str, str]:
    """A user's shell with `venv_dir` activated: no PYTHONPATH, nothing of the suite's own venv."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HCTX_", "VIRTUAL_ENV"))}
    suite_bin = str(Path(sys.executable).parent)
    path = [entry for entry in environ.get("PATH", "/usr/bin:/bin").split(":") if entry != suite_bin]
    return environ | {"PATH": ":".join([str(venv_dir / "bin"), *path]), "VIRTUAL_ENV": str(venv_dir)}


def fresh_clone(target: Path) -> Path:
    for name in source_files():
        copy = target / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy, follow_symlinks=False)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("shipped")
    clone = fresh_clone(root / "clone")
    dist = root / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
         "--wheel-dir", str(dist), str(clone)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("hctx-*.whl")
    env_dir = root / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=True)
    install = subprocess.run(
        [env_dir / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    outside = root / "elsewhere"
    outside.mkdir()
    return Installed(wheel, env_dir, outside)


def test_the_wheel_holds_exactly_the_package_sources(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as archive:
        shipped = {name for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
    expected = {
        name for name in source_files() if name.split("/")[0] in PACKAGES and not any(part in name for part in BYTECODE)
    }
    assert shipped == expected
    # The guard must have teeth where the bug was: subpackages and the assets beside the modules.
    nested = {
        "sidecar/harnesses/claude/launch.py",
        "sidecar/harnesses/pi/producer.py",
        "sidecar/harnesses/codex/transport.py",
    }
    assert nested <= shipped
    assert {
        "sidecar/harnesses/pi/hctx-channel.ts",
        "sidecar/harnesses/opencode/hctx-adopt.ts",
        "sidecar/harnesses/claude/model_windows.json",
    } <= shipped
    board = ("index.html", "agent.html", "board.js", "board.css")
    assert {f"wrapper/readers/web/assets/{name}" for name in board} <= shipped
    with zipfile.ZipFile(installed.wheel) as archive:
        recording = archive.read("sidecar/assets/demo/pi-0.84.2.channel.rec")
    assert recording == (REPO / "fixtures/recordings/pi/live/pi-0.84.2.channel.rec").read_bytes()  # a file, not a link


def test_the_venv_imports_nothing_from_the_checkout(installed: Installed) -> None:
    probe = installed.run(
        installed.bin("python"), "-c",
        "import json, sys, guard, sidecar.harnesses, sidecar.launching;"
        "print(json.dumps([sys.path, [m.__file__ for m in (guard, sidecar.harnesses, sidecar.launching)]]))",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    path, files = json.loads(probe.stdout)
    assert not any(entry and Path(entry).resolve().is_relative_to(REPO) for entry in path), path
    assert all(Path(file).is_relative_to(installed.venv) for file in files), files
    version = installed.run(installed.bin("hctx"), "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("hctx ")
    for script in ("hctx-statusline", "hctx-hook"):
        assert installed.bin(script).is_file()


def test_the_installed_demo_writes_four_records(installed: Installed) -> None:
    catalog = installed.outside / "demo-catalog"
    demo = installed.run(installed.bin("hctx"), "demo", "--no-top", "--duration", "3", "--catalog", catalog)
    assert demo.returncode == 0, demo.stderr
    assert "Traceback" not in demo.stderr
    agents = installed.run(installed.bin("hctx"), "agents", "--json", "--catalog", catalog)
    assert agents.returncode == 0, agents.stderr
    rows = {f"{row['host']}/{row['identity']}": row for row in json.loads(agents.stdout)}
    assert set(rows) == {"demo/claude-1m", "demo/claude-sonnet", "demo/pi-worker", "demo/omp-worker"}
    for row in rows.values():
        assert row["context"] is not None, row
    # The pi capture ends on its third compaction, an overflow, whose reading pi withholds
    # (fixtures/recordings/pi/live/pi-0.84.2.channel.rec): null, never the 0 a guess would give.
    pi = rows["demo/pi-worker"]["context"]
    assert (pi["windowTokens"], pi["compactions"], pi["lastCompactionTrigger"]) == (32000, 3, "overflow")
    assert pi["usedTokens"] is None and pi["usedPercent"] is None


def test_the_installed_replay_runs_a_recording_through_the_producer(installed: Installed) -> None:
    recording = installed.outside / "session.rec"
    shutil.copy(REPO / "fixtures/recordings/claude/session-2.1.332.rec", recording)
    replay = installed.run(installed.bin("hctx"), "replay", "--harness", "claude", recording)
    assert replay.returncode == 0, replay.stderr
    writes = [json.loads(line) for line in replay.stdout.splitlines()]
    assert writes, replay.stdout
    # The pre-turn payload withholds (null, never 0); then Claude's own numbers, as in the capture.
    first, second = writes[0], writes[1]
    assert (first["usedTokens"], first["usedPercent"], first["windowTokens"]) == (None, None, 1_000_000)
    assert (second["usedTokens"], second["usedPercent"]) == (100_005, 10.0)
    assert any(write["reason"] == "compaction" and write["compactions"] == 1 for write in writes)


def test_the_installed_wrapper_records_a_stand_in(installed: Installed) -> None:
    catalog = installed.outside / "wrap-catalog"
    standin = installed.outside / "standin.py"
    standin.write_text(STANDIN)
    wrap = installed.run(
        installed.bin("hctx"), "wrap", "--agent", "w", "--harness", "pi", "--catalog", catalog, "--host", "h",
        "--", installed.bin("python"), standin, context_frame(12345, 32000, 38.578125),
    )  # fmt: skip
    assert wrap.returncode == 0, wrap.stderr
    record = json.loads((catalog / "agents" / "h" / "w" / "harness-context").read_text())
    claim = json.loads((catalog / "agents" / "h" / "w" / "harness-state").read_text())
    assert (record["usedTokens"], record["windowTokens"], record["usedPercent"]) == (12345, 32000, 38.578125)
    assert record["incarnation"] == claim["incarnation"]


# Debian's own interpreter: it carries the EXTERNALLY-MANAGED marker in its stdlib, so its pip
# refuses `pip install .` as on a stock Debian 12 or Ubuntu 24.04 (pip ignores the marker inside a
# venv, so a venv cannot stand in for it). scripts/install_system_deps.sh installs it with venv and pip.
DEBIAN_PYTHON = Path("/usr/bin/python3")


def externally_managed_shell(tmp_path: Path) -> dict[str, str]:
    """A user's shell whose `python3` is Debian's own, refusing installs outside a venv (PEP 668)."""
    if not DEBIAN_PYTHON.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{DEBIAN_PYTHON} is missing; scripts/install_system_deps.sh installs it")
        pytest.skip(f"{DEBIAN_PYTHON} is missing")
    marker = subprocess.run(
        [DEBIAN_PYTHON, "-c", "import os, sysconfig; print(os.path.join(sysconfig.get_path('stdlib'), "
         "'EXTERNALLY-MANAGED'))"], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(marker).is_file(), f"{DEBIAN_PYTHON} is not externally managed: no {marker}"
    bin_dir = tmp_path / "bin"  # `python3` is Debian's, whatever else this machine has first on PATH
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(DEBIAN_PYTHON)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HCTX_", "VIRTUAL_ENV", "PIP_"))}
    return environ | {"PATH": f"{bin_dir}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"), reason="tmux is not installed")
def test_the_readme_first_command_works_as_printed_where_pip_install_is_refused(tmp_path: Path) -> None:
    """The README's first command, exactly as printed, in a fresh clone on an interpreter that
    refuses `pip install .` (PEP 668): it makes its venv, installs, and shows four live agents."""
    from tests.test_readme import FIRST_COMMAND

    (command,) = re.findall(r"```sh\n(python3 -m venv [^\n]*hctx demo)\n```", (REPO / "README.md").read_text())
    assert command == FIRST_COMMAND
    clone = fresh_clone(tmp_path / "hctx")
    environ = externally_managed_shell(tmp_path)
    refused = subprocess.run(["bash", "-c", "python3 -m pip install ."], cwd=clone, env=environ,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, refused.stderr
    done, log = tmp_path / "done", tmp_path / "log"
    session = f"hctx-readme-{os.getpid()}"
    tmux = ["tmux", "-L", session]
    shell = f"{command} 2> {log}; echo $? > {done}"
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "20", "-c", str(clone),
                    "env", "-u", "COLUMNS", "-u", "LINES", "bash", "-c", shell],
                   check=True, env=environ)  # fmt: skip

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    def four_live_agents() -> str | None:
        text = screen()
        rows = [line for line in text.splitlines() if re.match(r"demo/\S+ +(claude|pi|omp) ", line)]
        return text if len(rows) == 4 and all(re.search(r" \d+% ", row) for row in rows) else None

    try:
        shown = wait_for(four_live_agents, timeout=600, what="four agents with a fill in hctx top")
        assert "4 agents" in shown
        subprocess.run([*tmux, "send-keys", "-t", session, "q"], check=True)
        wait_for(done.exists, timeout=30, what="the demo to end")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert done.read_text().strip() == "0", log.read_text()
    assert "Traceback" not in log.read_text()
    # Installed in the venv the command made, from the clone; nothing went into Debian's Python.
    assert (clone / ".hctx" / "bin" / "hctx").is_file()
    outside = subprocess.run([DEBIAN_PYTHON, "-c", "import wrapper"], cwd=tmp_path, env=environ, capture_output=True)
    assert outside.returncode != 0


def test_the_installed_board_serves_its_page_from_the_wheel(installed: Installed) -> None:
    """`hctx web` from the wheel, outside the checkout: the page and every file it loads come from
    the installed package (its own files, no CDN), and the API answers."""
    import re
    import select
    import signal
    import urllib.request

    catalog = installed.outside / "web-catalog"
    (catalog / "agents").mkdir(parents=True)
    process = subprocess.Popen(
        [str(installed.bin("hctx")), "web", "--catalog", str(catalog), "--listen", "127.0.0.1:0"],
        cwd=installed.outside, env=user_env(installed.venv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 90)
        assert ready, "hctx web printed no URL"
        url = process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
        with urllib.request.urlopen(url, timeout=30) as page:
            html = page.read().decode()
        files = re.findall(r'(?:src|href)="(/[^"]+)"', html)
        assert {"/assets/board.js", "/assets/common.js", "/assets/board.css"} <= set(files)
        for name in files:
            with urllib.request.urlopen(url.rstrip("/") + name, timeout=30) as asset:
                assert asset.status == 200 and asset.read()
        with urllib.request.urlopen(url + "api/agents", timeout=30) as api:
            assert api.read() == b"[]\n"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0 and "Traceback" not in stderr, stderr
