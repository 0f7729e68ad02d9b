"""OpenCode's `hctx setup` plan (sidecar/harnesses/opencode/setup.py) and its adoption plan
(`sidecar.harnesses.opencode.launch.adopted`): the plugin file edit, where it goes, and the hints
a plugin hands the adopter decoded, a non-loopback or malformed address refused."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from sidecar import registry
from sidecar.adoption import ADOPT_ENV_GUARDS
from sidecar.harnesses.opencode import setup as opencode_setup
from sidecar.harnesses.opencode.launch import adopted
from sidecar.harnesses.opencode.producer import OpenCodeTransport
from sidecar.launching import transport_json
from sidecar.setup_plan import OwnedFile, SetupRefused, adopt_command
from sidecar.setup_state import setup_state
from sidecar.spec import ConfigError
from tests.harnesses import PINNED_VERSIONS
from wrapper.launch.userfiles import apply_setup, undo_setup

HOME = Path("/home/someone")


def plan(environ: dict[str, str] | None = None, home: Path = HOME) -> OwnedFile:
    (edit,) = opencode_setup.setup(home, environ or {"PATH": ""}).edits
    assert isinstance(edit, OwnedFile)
    return edit


def test_the_registry_finds_the_setup_module() -> None:
    assert registry.setup_module("opencode") is opencode_setup


def test_the_plugin_goes_in_the_user_level_plugin_dir() -> None:
    edit = plan()
    assert edit.file.root == HOME / ".config" / "opencode"
    assert edit.file.relative == PurePosixPath("plugin/hctx-adopt.ts")
    assert plan({"XDG_CONFIG_HOME": "/x/cfg"}).file.root == Path("/x/cfg/opencode")
    # OpenCode's xdg-basedir treats an empty variable as unset
    assert plan({"XDG_CONFIG_HOME": ""}).file.root == HOME / ".config" / "opencode"


def test_every_pinned_build_offers_the_point() -> None:
    builds = opencode_setup.setup(HOME, {}).builds
    assert tuple(point.build for point in builds) == PINNED_VERSIONS["opencode"]
    assert all(point.offered and "plugin" in point.how for point in builds)


def test_installed_is_the_program_on_path_or_the_config_dir(tmp_path: Path) -> None:
    assert not opencode_setup.setup(tmp_path, {"PATH": str(tmp_path / "bin")}).installed
    (tmp_path / "bin").mkdir()
    program = tmp_path / "bin" / "opencode"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert opencode_setup.setup(tmp_path, {"PATH": str(tmp_path / "bin")}).installed
    program.unlink()
    (tmp_path / ".config" / "opencode").mkdir(parents=True)
    assert opencode_setup.setup(tmp_path, {"PATH": str(tmp_path / "bin")}).installed


def test_the_plugin_carries_the_adopting_command_once() -> None:
    content = plan().content
    text = content.decode()
    command = adopt_command("opencode")
    assert f"const ADOPT_COMMAND: string[] = {json.dumps(command)}; // hctx: adopt command" in text
    assert opencode_setup.COMMAND_LINE not in text  # the inert line is gone
    assert content.startswith(opencode_setup.MARK)
    asset = (Path(opencode_setup.__file__).parent / opencode_setup.ASSET_NAME).read_bytes()
    assert content.replace(json.dumps(command).encode(), b"[]") == asset  # nothing else changed


def test_the_plugin_stands_down_under_the_adoption_guards() -> None:
    """The plugin's guard list is the adopter's own (a wrapped seat, HCTX_NO_ADOPT)."""
    asset = (Path(opencode_setup.__file__).parent / opencode_setup.ASSET_NAME).read_text()
    assert f"const ENV_GUARDS: string[] = {json.dumps(list(ADOPT_ENV_GUARDS))};" in asset


def test_an_interpreter_path_with_quotes_stays_one_string() -> None:
    text = opencode_setup.plugin_source(['/opt/my "py"/bin/python3', "-I"]).decode()
    assert 'const ADOPT_COMMAND: string[] = ["/opt/my \\"py\\"/bin/python3", "-I"];' in text


def test_apply_writes_the_plugin_and_is_idempotent() -> None:
    edit = plan()
    once = edit.apply(None)
    assert once == edit.content
    assert edit.apply(once) == once


def test_apply_replaces_an_older_hctx_plugin() -> None:
    edit = plan()
    older = opencode_setup.MARK + b" ... an older build's plugin\n"
    assert edit.apply(older) == edit.content


def test_apply_refuses_a_users_file_of_the_same_name() -> None:
    edit = plan()
    with pytest.raises(SetupRefused, match=r"plugin/hctx-adopt\.ts exists and is not hctx's plugin"):
        edit.apply(b"export const Mine = async () => ({})\n")


def test_remove_deletes_hctxs_file_and_keeps_a_users_replacement() -> None:
    edit = plan()
    assert edit.remove(edit.content, None) is None
    mine = b"export const Mine = async () => ({})\n"
    assert edit.remove(mine, None) == mine


# --- the adoption plan from the plugin's hints ---------------------------------------------------

BRIDGE = "http://127.0.0.1:38905/fcddd6c8e910abc941490488cf9bf276a021"


def test_adopted_follows_the_bridge_with_the_instance_directory(tmp_path: Path) -> None:
    launch = adopted(4242, tmp_path, {"url": BRIDGE, "directory": "/work/my project"})
    assert launch.argv == () and launch.cwd == tmp_path and launch.harness == "opencode"
    assert launch.transport == OpenCodeTransport(base_url=BRIDGE, directory="/work/my project")
    # what the sidecar is handed validates on its side of the seam
    wire = transport_json(launch)
    assert wire is not None
    assert OpenCodeTransport.model_validate_json(wire) == launch.transport


def test_adopted_accepts_ipv6_loopback_and_no_directory(tmp_path: Path) -> None:
    launch = adopted(1, tmp_path, {"url": "http://[::1]:4096"})
    assert launch.transport == OpenCodeTransport(base_url="http://[::1]:4096", directory=None)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.7:4096/x",  # another interface
        "http://example.com:4096/x",  # a name: whatever the resolver says
        "http://localhost:4096/x",  # even this one (and OpenCode's fallback serverUrl, where nothing listens)
        "https://127.0.0.1:4096/x",
        "http://127.0.0.1/x",  # no port
        "http://user:pw@127.0.0.1:4096/x",
        "http://127.0.0.1:4096/x?directory=/etc",
        "http://127.0.0.1:4096/x#frag",
        "http://127.0.0.1:99999/x",
        "http://127.0.0.1:4096/a b",
        "http://127.0.0.1:4096/" + "a" * 5000,
        "ws://127.0.0.1:4096",
        "",
        "http://[::ffff:10.0.0.1]:80",
        "\x00http://127.0.0.1:1",
    ],
)
def test_adopted_refuses_a_url_that_is_not_loopback_http(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError, match=r"url hint is not http://127\.0\.0\.1:PORT") as refused:
        adopted(1, tmp_path, {"url": url, "directory": "/w"})
    assert len(str(refused.value)) < 300  # the hostile value is shown cut, never whole


@pytest.mark.parametrize("directory", ["relative/dir", "/w\x00/etc"])
def test_adopted_refuses_a_directory_that_is_not_absolute(tmp_path: Path, directory: str) -> None:
    with pytest.raises(ConfigError, match="directory hint is not an absolute path"):
        adopted(1, tmp_path, {"url": BRIDGE, "directory": directory})


def test_adopted_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gave no url hint"):
        adopted(1, tmp_path, {"directory": "/w"})


# --- through the engine: the user's files kept, setup twice is once, undo byte-equal -------------


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root: a file's bytes, None for a directory."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))
    }


def user_config(home: Path) -> Path:
    root = home / ".config" / "opencode"
    (root / "plugin").mkdir(parents=True)
    (root / "opencode.json").write_text('{"plugin": ["opencode-wakatime"], "theme": "x", "future_key": {"a": 1}}\n')
    (root / "plugin" / "mine.ts").write_text("export const Mine = async () => ({})\n")
    (root / "plugins").mkdir()
    (root / "plugins" / "other.js").write_text("export default async () => ({})\n")
    return root


def test_setup_adds_only_its_file_and_undo_restores_every_byte(tmp_path: Path) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal"
    root = user_config(home)
    before = tree(root)
    plan = opencode_setup.setup(home, {"PATH": ""})
    (change,) = apply_setup(plan, journal)
    assert change.changes
    after = tree(root)
    assert after.pop("plugin/hctx-adopt.ts") == plan.edits[0].apply(None)
    assert after == before  # opencode.json, its plugin list and the user's plugins: untouched
    (again,) = apply_setup(plan, journal)
    assert not again.changes  # setup twice is setup once
    undo_setup(plan, journal)
    assert tree(root) == before


def test_undo_removes_the_dirs_setup_created(tmp_path: Path) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal"
    home.mkdir()
    plan = opencode_setup.setup(home, {"PATH": ""})
    apply_setup(plan, journal)
    assert (home / ".config" / "opencode" / "plugin" / "hctx-adopt.ts").is_file()
    undo_setup(plan, journal)
    assert not (home / ".config" / "opencode" / "plugin").exists()


def test_a_users_file_of_that_name_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal"
    root = user_config(home)
    (root / "plugin" / "hctx-adopt.ts").write_text("// mine\n")
    before = tree(root)
    with pytest.raises(SetupRefused, match="is not hctx's plugin"):
        apply_setup(opencode_setup.setup(home, {"PATH": ""}), journal)
    assert tree(root) == before


def test_a_plugin_path_that_links_out_of_the_config_dir_is_refused(tmp_path: Path) -> None:
    home, journal = tmp_path / "home", tmp_path / "journal"
    root = user_config(home)
    outside = tmp_path / "outside.ts"
    outside.write_bytes(opencode_setup.MARK + b" ...\n")
    (root / "plugin" / "hctx-adopt.ts").symlink_to(outside)
    with pytest.raises(SetupRefused):
        apply_setup(opencode_setup.setup(home, {"PATH": ""}), journal)
    assert outside.read_bytes() == opencode_setup.MARK + b" ...\n"
    assert (root / "plugin" / "hctx-adopt.ts").is_symlink()


def test_doctors_reading_not_set_up_current_then_stale(tmp_path: Path) -> None:
    """`hctx doctor`'s state of the plan: absent, as setup wrote it, and an older build's plugin
    (hctx's mark, other bytes: an upgrade of hctx or of its interpreter path) left in place."""
    home, journal = tmp_path / "home", tmp_path / "journal"
    user_config(home)
    plan = opencode_setup.setup(home, {"PATH": ""})
    assert setup_state(plan).state == "not set up"
    apply_setup(plan, journal)
    assert setup_state(plan).state == "current"
    plugin = home / ".config" / "opencode" / "plugin" / "hctx-adopt.ts"
    plugin.write_bytes(opencode_setup.MARK + b" an older build\n")
    assert setup_state(plan).state == "stale"


def test_doctor_says_the_sdks_stall_while_the_plugin_is_in_place_and_the_sdk_is_not(tmp_path: Path) -> None:
    """A plugin file makes OpenCode wait on its own npm install of the plugin SDK at each start (74 s
    offline): `hctx doctor` says so while setup is in place and OpenCode has not installed it, and
    nothing once it has (its lock and package there), nor while setup is not in place."""
    from wrapper.readers.reader_commands import setup_lines

    home, journal = tmp_path / "home", tmp_path / "journal"
    root = user_config(home)
    environ = {"HOME": str(home), "PATH": "", "XDG_CONFIG_HOME": str(home / ".config")}
    assert not [line for line in setup_lines(environ) if "note:" in line]  # not set up: nothing to say
    apply_setup(opencode_setup.setup(home, environ), journal)
    (noted,) = [line for line in setup_lines(environ) if line.startswith("setup: opencode: note:")]
    assert "has not installed its plugin SDK" in noted and str(root) in noted and "offline=true" in noted
    (root / "node_modules" / "@opencode-ai" / "plugin").mkdir(parents=True)
    (root / "package-lock.json").write_text("{}\n")
    assert not [line for line in setup_lines(environ) if "note:" in line]
