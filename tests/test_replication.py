"""`hctx replication syncthing`: the include list is the pinned record names, and nothing else.

The real daemons run it in tests/live/test_replication_live.py; here, its exact output."""

from __future__ import annotations

import json
from pathlib import Path

from readers_catalog import REPO, hctx

from guard.constants import CONTEXT_LOCK_NAME, REPLICATED_RECORD_NAMES
from wrapper.readers.replication import include_patterns, stignore


def patterns(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("//")]


def test_the_ignore_file_includes_exactly_the_pinned_records_at_their_depth_and_ignores_the_rest() -> None:
    assert REPLICATED_RECORD_NAMES == ("harness-state", "harness-context")
    assert include_patterns() == ["!/*/*/harness-state", "!/*/*/harness-context", "*"]
    text = stignore(Path("/srv/catalog"))
    assert patterns(text) == include_patterns()  # every other line is a `//` comment Syncthing skips
    assert "(?d)" not in patterns(text) and CONTEXT_LOCK_NAME not in "".join(patterns(text))
    assert "// The folder is /srv/catalog/agents: save this as /srv/catalog/agents/.stignore on every host" in text


def test_the_command_prints_it_for_the_catalog_it_resolves(tmp_path: Path) -> None:
    printed = hctx("replication", "syncthing", env={"HCTX_CATALOG": str(tmp_path)})
    assert (printed.returncode, printed.stderr) == (0, "")
    assert printed.stdout == stignore(tmp_path)
    explicit = hctx("replication", "syncthing", "--catalog", str(tmp_path / "other"))
    assert explicit.stdout == stignore(tmp_path / "other")


def test_the_json_carries_the_same_file_and_the_folder_settings_that_matter(tmp_path: Path) -> None:
    printed = hctx("replication", "syncthing", "--json", "--catalog", str(tmp_path))
    data = json.loads(printed.stdout)
    assert data == {
        "path": str(tmp_path / "agents"),
        "stignore": stignore(tmp_path),
        "type": {"agentHost": "sendreceive", "readerHost": "receiveonly"},
        "folder": {
            "fsWatcherEnabled": True,
            "fsWatcherDelayS": 1,
            "rescanIntervalS": 60,
            "versioning": {"type": ""},
            "maxConflicts": 0,
            "ignoreDelete": False,
            "ignorePerms": False,
        },
    }
    for key in data["folder"]:  # each setting is explained in the file's comments
        assert f"//   {key}" in data["stignore"], key


def test_a_relative_catalog_is_printed_absolute() -> None:
    printed = hctx("replication", "syncthing", "--json", "--catalog", "rel")  # run from the repository
    assert json.loads(printed.stdout)["path"] == str(REPO / "rel" / "agents")


def test_a_catalog_path_with_a_newline_or_control_character_is_refused(tmp_path: Path) -> None:
    """Issue 26, point 8: `--catalog $'fleet\\n!*\\n'` printed a live `!*` into the .stignore."""
    for catalog in ("fleet\n!*\n", "fleet\r!*", "a\x1bb", "x\u2028!*", "tab\there"):
        for json_flag in ((), ("--json",)):
            printed = hctx("replication", "syncthing", *json_flag, "--catalog", str(tmp_path / catalog))
            assert (printed.returncode, printed.stdout) == (2, ""), catalog
            assert "control characters" in printed.stderr and "Traceback" not in printed.stderr
