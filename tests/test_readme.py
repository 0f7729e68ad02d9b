"""Every command in the README and the docs pages runs, every link between them resolves, and the
package installs with what it ships."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.wrapping import REPO, env
from wrapper.cli import build_parser

README = (REPO / "README.md").read_text()
# The reference the README links to: `hctx wrap` per harness, and the reading commands.
WRAPPING = (REPO / "docs" / "wrapping.md").read_text()
RECORDS = (REPO / "docs" / "records.md").read_text()
# The README's first command: a venv of its own, so it works where `pip install .` is refused (PEP 668).
FIRST_COMMAND = "python3 -m venv .hctx && .hctx/bin/pip install . && .hctx/bin/hctx demo"


def sh_blocks(page: str) -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", page, re.S)]


def block_with(text: str, page: str = README) -> list[str]:
    return next(block for block in sh_blocks(page) if any(text in line for line in block))


def test_the_two_commands_are_the_ones_ci_runs() -> None:
    assert block_with("hctx demo") == [FIRST_COMMAND]  # run as printed by tests/test_wheel.py
    assert block_with("scripts/test") == ["scripts/test"]
    assert "exec scripts/test" in (REPO / ".ci" / "run").read_text()


def test_every_wrap_line_parses_and_names_a_harness_the_live_tests_run() -> None:
    lines = block_with("hctx wrap", WRAPPING)
    assert len(lines) == 6
    harnesses = set()
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.command_line[0] == "--" and args.command_line[1] == args.harness.replace("omp", "omp")
        harnesses.add(args.harness)
    assert harnesses == {"claude", "codex", "pi", "omp", "opencode"}
    live = {path.stem.split("_")[1] for path in (REPO / "tests" / "live").glob("test_*_live.py")}
    assert {"claude", "codex", "pi", "opencode"} <= live  # omp runs in test_pi_live.py


def test_the_wrap_lines_on_a_machine_without_the_harnesses_leave_no_ghost_agent(tmp_path: Path) -> None:
    """Each line exits 127 naming its program; nothing is claimed, no sidecar starts, and the
    readers then see no agent at all (issue 27: six `stopped ctx:-` rows and `ok: 6 agents`)."""
    catalog, home = tmp_path / "catalog", tmp_path / "home"
    catalog.mkdir()
    home.mkdir()
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # hctx, and none of the harnesses
    assert not any(shutil.which(name, path=path) for name in ("claude", "codex", "pi", "omp", "opencode"))
    environ = env() | {"HOME": str(home), "HCTX_CATALOG": str(catalog), "PATH": path}
    for line in block_with("hctx wrap", WRAPPING):
        result = subprocess.run(["bash", "-c", line], env=environ, capture_output=True, text=True, timeout=60,
                                cwd=tmp_path)  # fmt: skip
        program = shlex.split(line)[shlex.split(line).index("--") + 1]
        assert result.returncode == 127, (line, result.stderr)
        assert f"hctx wrap: cannot start {program!r}: no {program!r} on PATH" in result.stderr
    assert list(catalog.rglob("*")) == []  # no agent directory, no claim, no sidecar log
    agents = subprocess.run(["hctx", "agents"], env=environ, capture_output=True, text=True, timeout=60)
    doctor = subprocess.run(["hctx", "doctor"], env=environ, capture_output=True, text=True, timeout=60)
    assert (agents.returncode, agents.stdout) == (0, "no agents\n")
    assert doctor.returncode == 0 and "ok: 6 agents" not in doctor.stdout and "stopped" not in agents.stdout


def test_the_reading_commands_run_as_written(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    script = "\n".join(block_with("hctx agents", RECORDS)).replace("/tmp/hctx-demo", str(catalog))
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env() | {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert '"identity": "claude-1m"' in result.stdout  # jq's filter output
    assert "advisory:" in result.stdout  # doctor on a fleet with an agent past 80%
    assert "== record" in result.stdout or "record" in result.stdout  # inspect
    assert "Traceback" not in result.stderr


def test_schema_and_replay_run_as_written() -> None:
    for line in block_with("hctx schema", RECORDS):
        result = subprocess.run(shlex.split(line), env=env(), capture_output=True, text=True, cwd=REPO, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
    replay_line = block_with("hctx replay", RECORDS)[1]
    replay = subprocess.run(shlex.split(replay_line), env=env(), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert '"reason": "compaction"' in replay.stdout


def test_the_install_lines_are_the_first_commands_install_into_a_lasting_venv() -> None:
    """The install block is the first command's install part (tests/test_wheel.py runs that as
    printed, where `pip install .` is refused), into a venv outside the checkout, linked onto PATH."""
    venv = "~/.local/share/hctx"
    install = FIRST_COMMAND.removesuffix(" && .hctx/bin/hctx demo").replace(".hctx", venv)
    link = f"mkdir -p ~/.local/bin && ln -sf {venv}/bin/hctx ~/.local/bin/hctx"
    assert block_with("python3 -m venv ~/") == [install, link]


def test_the_setup_lines_run_as_written_and_undo_leaves_the_home_as_it_was(tmp_path: Path) -> None:
    """The README's `hctx setup` block, line by line, in a HOME where only Claude's config directory
    is found: --dry-run writes nothing, setup writes Claude's user settings, --undo takes them out."""
    lines = block_with("hctx setup")
    assert [line.split()[2:] for line in lines] == [["--dry-run"], [], ["--undo"]]
    assert all(build_parser().parse_args(shlex.split(line)[1:]).command == "setup" for line in lines)
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # hctx, and none of the harnesses
    assert not any(shutil.which(name, path=path) for name in ("claude", "codex", "pi", "omp", "opencode"))
    moved = ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "PI_CODING_AGENT_DIR", "PI_CONFIG_DIR", "XDG_CONFIG_HOME")
    environ = {key: value for key, value in env().items() if key not in moved}
    environ |= {"HOME": str(home), "XDG_STATE_HOME": str(tmp_path / "state"), "PATH": path}

    def tree() -> list[str]:
        return sorted(str(entry.relative_to(home)) for entry in home.rglob("*"))

    before = tree()
    done = [subprocess.run(["bash", "-c", line], env=environ, capture_output=True, text=True, timeout=60,
                           cwd=tmp_path) for line in lines]  # fmt: skip
    assert [result.returncode for result in done] == [0, 0, 0], [result.stderr for result in done]
    assert "nothing was written" in done[0].stdout and '"statusLine"' in done[0].stdout
    assert "settings.json: written" in done[1].stdout
    assert "settings.json: removed" in done[2].stdout and tree() == before == [".claude"]


# --- the links between the README and docs/ ---------------------------------------------------------

# A link or an image: its target up to the first space or ")" (a title may follow).
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"(?ms)^(```|~~~).*?^\1[ \t]*$")
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)


def _prose(markdown: str) -> str:
    """The text with its code blocks and code spans left out: a `[x](y)` in code is no link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def _anchors(markdown: str) -> set[str]:
    """Each heading's anchor as GitHub makes it: lower case, punctuation dropped (a code span's
    backticks too, its text kept), each space a hyphen; a repeated one gets -1, -2…"""
    anchors: set[str] = set()
    for heading in re.findall(r"(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$", _FENCE.sub("", markdown)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        anchor, count = slug, 0
        while anchor in anchors:
            count += 1
            anchor = f"{slug}-{count}"
        anchors.add(anchor)
    return anchors


def broken_links(page: Path, root: Path) -> list[str]:
    """Every relative link of `page` whose file (inside `root`) or heading anchor does not exist."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of ours
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing = not file.is_relative_to(root.resolve()) or not file.exists()
        if missing or (anchor and (file.suffix != ".md" or anchor not in _anchors(file.read_text()))):
            broken.append(target)
    return broken


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_link_in_the_readme_and_docs_resolves() -> None:
    assert len(_pages()) > 10
    for page in _pages():
        assert broken_links(page, REPO) == [], page.relative_to(REPO)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """The reference moved out of the README stays one click away from it."""
    linked = {(REPO / target.partition("#")[0]).resolve() for target in _LINK.findall(_prose(README))}
    for page in _pages()[1:]:
        assert page.resolve() in linked, page.relative_to(REPO)


def test_the_link_check_finds_a_missing_file_a_missing_anchor_and_a_link_out_of_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "page.md").write_text("# A page: `hctx top`\n\n## Seen twice\n\n## Seen twice\n")
    (root / "README.md").write_text(
        "[fine](docs/page.md#a-page-hctx-top) [fine too](docs/page.md#seen-twice-1) [here](#top-heading)\n"
        "![a picture](docs/page.md) [out](https://example.com/x) `[code](nowhere.md)`\n"
        "```sh\n[fenced](nowhere.md)\n```\n# Top heading\n"
        "[gone](docs/gone.md) [no anchor](docs/page.md#seen-thrice) [up](../outside.md)\n"
    )
    (tmp_path / "outside.md").write_text("# Outside\n")
    assert broken_links(root / "README.md", root) == ["docs/gone.md", "docs/page.md#seen-thrice", "../outside.md"]


def test_the_readme_reads_in_a_few_minutes() -> None:
    """Issue 36: the first hour on the first screen, the reference under docs/ (it was 1,047 lines)."""
    assert len(README.splitlines()) <= 300, "move reference material to a docs/ page and link it"
