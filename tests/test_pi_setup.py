"""pi's and omp's `hctx setup` plan (sidecar/harnesses/pi/setup.py) and their adopted launch plan.

The plan is one file of hctx's own in each harness's user extension directory: placed whole, kept
when it is already there, refused over a file of the user's, taken out whole by --undo, and never
written into a pi extension directory that is a package (pi would not load it there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar import registry
from sidecar.harnesses.pi import launch
from sidecar.harnesses.pi.setup import LOADER, LOADER_MARK, agent_dir, loader_source, setup_for
from sidecar.setup_plan import SetupRefused, adopt_command

HOME = Path("/home/someone")


@pytest.mark.parametrize(
    ("host", "environ", "expected"),
    [
        ("pi", {}, HOME / ".pi/agent"),
        ("pi", {"PI_CODING_AGENT_DIR": "/srv/pi-agent"}, Path("/srv/pi-agent")),
        ("pi", {"PI_CODING_AGENT_DIR": "~/elsewhere"}, HOME / "elsewhere"),
        ("pi", {"PI_CONFIG_DIR": ".other", "OMP_PROFILE": "work"}, HOME / ".pi/agent"),  # omp's variables
        ("omp", {}, HOME / ".omp/agent"),
        ("omp", {"PI_CODING_AGENT_DIR": "/srv/pi-agent"}, Path("/srv/pi-agent")),
        ("omp", {"PI_CONFIG_DIR": ".omp-alt"}, HOME / ".omp-alt/agent"),
        ("omp", {"OMP_PROFILE": "work", "PI_CODING_AGENT_DIR": "/srv/x"}, HOME / ".omp/profiles/work/agent"),
        ("omp", {"PI_PROFILE": "legacy"}, HOME / ".omp/profiles/legacy/agent"),
        # an explicitly empty OMP_PROFILE selects the default profile over PI_PROFILE (omp's dirs.ts)
        ("omp", {"OMP_PROFILE": "", "PI_PROFILE": "legacy"}, HOME / ".omp/agent"),
        ("omp", {"OMP_PROFILE": "default"}, HOME / ".omp/agent"),
    ],
)
def test_the_agent_dir_is_the_one_the_harness_reads(host: str, environ: dict[str, str], expected: Path) -> None:
    assert agent_dir(host, HOME, environ) == expected  # type: ignore[arg-type]


def test_each_harness_gets_the_loader_in_its_own_extension_directory(tmp_path: Path) -> None:
    pi, omp = registry.setup_module("pi"), registry.setup_module("omp")
    assert pi is not None and omp is not None
    pi_plan, omp_plan = pi.setup(tmp_path, {}), omp.setup(tmp_path, {})
    assert (pi_plan.harness, omp_plan.harness) == ("pi", "omp")
    ((pi_edit,), (omp_edit,)) = pi_plan.edits, omp_plan.edits
    assert pi_edit.file.path == tmp_path / ".pi/agent/extensions/hctx-adopt.ts"
    assert omp_edit.file.path == tmp_path / ".omp/agent/extensions/hctx-adopt.ts"
    assert [b.build for b in pi_plan.builds] == ["0.84.2", "1.6.0"]
    assert [b.build for b in omp_plan.builds] == ["18.1.16", "18.2.3"]
    assert all(build.offered for build in (*pi_plan.builds, *omp_plan.builds))
    # One text for both: an agent directory both share ($PI_CODING_AGENT_DIR) holds one file serving both.
    assert pi_edit.apply(None) == omp_edit.apply(None)
    shared = {"PI_CODING_AGENT_DIR": str(tmp_path / "shared")}
    assert pi.setup(tmp_path, shared).edits[0].file == omp.setup(tmp_path, shared).edits[0].file


def test_the_loader_imports_the_packaged_extension_and_names_each_adopting_command(tmp_path: Path) -> None:
    (edit,) = setup_for("pi", tmp_path, {}).edits
    source = edit.apply(None)
    assert source.startswith(LOADER_MARK)
    assert f"const EXTENSION = {json.dumps(str(launch.channel_extension()))};".encode() in source
    commands = {"pi": adopt_command("pi"), "omp": adopt_command("omp")}
    assert f"const ADOPT: Record<string, string[]> = {json.dumps(commands)};".encode() in source
    assert launch.channel_extension().is_file()


def test_setup_twice_is_setup_once_and_an_older_loader_is_brought_current(tmp_path: Path) -> None:
    (edit,) = setup_for("omp", tmp_path, {}).edits
    once = edit.apply(None)
    assert edit.apply(once) == once
    older = loader_source(Path("/old/site-packages/sidecar/harnesses/pi/hctx-channel.ts"), {"pi": ["/old/python"]})
    assert older != once and edit.apply(older) == once


def test_a_file_of_the_users_by_that_name_is_refused_and_kept(tmp_path: Path) -> None:
    (edit,) = setup_for("pi", tmp_path, {}).edits
    theirs = b"export default function (pi: any) {}\n"
    with pytest.raises(SetupRefused, match="is not hctx's"):
        edit.apply(theirs)
    # --undo over a file the user has since replaced with their own keeps theirs
    assert edit.remove(theirs, None) == theirs


def test_undo_removes_the_file_hctx_created(tmp_path: Path) -> None:
    (edit,) = setup_for("pi", tmp_path, {}).edits
    assert edit.remove(edit.apply(None), None) is None


@pytest.mark.parametrize("entry", ["index.ts", "index.js", "package.json"])
def test_a_pi_extension_directory_that_is_a_package_is_refused_with_the_reason(tmp_path: Path, entry: str) -> None:
    extensions = tmp_path / ".pi/agent/extensions"
    extensions.mkdir(parents=True)
    (extensions / entry).write_text("{}")
    (edit,) = setup_for("pi", tmp_path, {}).edits
    with pytest.raises(SetupRefused, match=f"{entry} makes .* one package: pi loads only what it names"):
        edit.apply(None)
    # omp discovers every file beside an index.ts: its loader is placed all the same
    omp_extensions = tmp_path / ".omp/agent/extensions"
    omp_extensions.mkdir(parents=True)
    (omp_extensions / entry).write_text("{}")
    (omp_edit,) = setup_for("omp", tmp_path, {}).edits
    assert omp_edit.apply(None).startswith(LOADER_MARK)


def test_installed_is_the_program_on_path_or_the_agent_dir(tmp_path: Path) -> None:
    assert not setup_for("omp", tmp_path, {"PATH": str(tmp_path / "bin")}).installed
    (tmp_path / ".omp/agent").mkdir(parents=True)
    assert setup_for("omp", tmp_path, {"PATH": str(tmp_path / "bin")}).installed
    (tmp_path / "bin").mkdir()
    program = tmp_path / "bin" / "pi"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert setup_for("pi", tmp_path, {"PATH": str(tmp_path / "bin")}).installed


@pytest.mark.parametrize("harness", ["pi", "omp"])
def test_the_adopted_plan_spawns_nothing_for_the_harness_the_hint_names(harness: str, tmp_path: Path) -> None:
    plan = launch.adopted(4242, tmp_path, {launch.HARNESS_HINT: harness})
    assert (plan.harness, plan.argv, plan.cwd, plan.env) == (harness, (), tmp_path, {})
    assert (plan.transport, plan.account, plan.tap_stdout) == (None, None, False)


@pytest.mark.parametrize("hints", [{}, {"harness": "claude"}])
def test_an_adoption_without_the_harness_hint_is_refused_with_the_reason(hints: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"needs the hint harness=pi\|omp"):
        launch.adopted(4242, tmp_path, hints)


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under root."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("harness", ["pi", "omp"])
def test_through_the_engine_setup_twice_is_once_and_undo_is_byte_equal(harness: str, tmp_path: Path) -> None:
    """`hctx setup`'s own engine over the plan: the user's extension and settings never touched, the
    loader placed once, and --undo leaves the agent directory exactly as it was (the extensions
    folder setup had to create removed with it)."""
    from wrapper.launch.userfiles import apply_setup, undo_setup

    home, journal = tmp_path / "home", tmp_path / "journal"
    root = agent_dir(harness, home, {})  # type: ignore[arg-type]
    root.mkdir(parents=True)
    (root / "settings.json").write_bytes(b'{"compaction": {"enabled": true}}\n')
    plan = setup_for(harness, home, {})  # type: ignore[arg-type]
    before = _tree(home)
    apply_setup(plan, journal)
    once = _tree(home)
    assert set(once) - set(before) == {f"{root.relative_to(home)}/extensions", f"{root.relative_to(home)}/{LOADER}"}
    apply_setup(plan, journal)
    assert _tree(home) == once
    undo_setup(plan, journal)
    assert _tree(home) == before

    # With the user's own extension already in the folder: it is kept as it is, before and after.
    extensions = root / "extensions"
    extensions.mkdir()
    (extensions / "mine.ts").write_bytes(b"export default function (pi: any) {}\n")
    before = _tree(home)
    apply_setup(plan, journal)
    assert {name: data for name, data in _tree(home).items() if name in before} == before
    undo_setup(plan, journal)
    assert _tree(home) == before
