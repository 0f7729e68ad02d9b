"""`hctx replication syncthing`: the ignore file and folder settings that replicate a catalog.

hctx replicates nothing itself (HC-R05): an existing sync engine carries `<catalog>/agents/`, fed by
an include list of exactly the pinned record names. For Syncthing that list is a `.stignore` whose
includes name the two records at their place, `agents/<host>/<identity>/<record>`, and whose last
pattern ignores everything else. The folder settings printed with it were each measured by the
two-daemon test (tests/live/test_replication_live.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from pathlib import Path
from typing import Any, Final

from guard.constants import (
    AGENTS_DIR_NAME,
    CONTEXT_LOCK_NAME,
    CONTROL_DIR_NAME,
    HARNESS_CONTEXT_BUCKET_PERCENT,
    REPLICATED_RECORD_NAMES,
)
from wrapper.arguments import UsageError, catalog_of

__all__ = [
    "FOLDER_SETTINGS",
    "FOLDER_TYPES",
    "include_patterns",
    "register",
    "run_syncthing",
    "settings_json",
    "stignore",
]

# Folder options, as Syncthing's config and REST API spell them, with why each is set.
FOLDER_SETTINGS: Final[tuple[tuple[str, Any, str], ...]] = (
    ("fsWatcherEnabled", True, "a replaced record is seen by inotify, not by the next full scan"),
    ("fsWatcherDelayS", 1, "Syncthing's default of 10 holds every change back up to 10 s more"),
    ("rescanIntervalS", 60, "a change the watcher missed is still sent within a minute, not an hour"),
    (
        "versioning",
        {"type": ""},
        f"else .stversions keeps every replacement, one per {HARNESS_CONTEXT_BUCKET_PERCENT}% of fill",
    ),
    ("maxConflicts", 0, "the newer record wins and no .sync-conflict- copy is left beside it"),
    ("ignoreDelete", False, "a relaunch removes the previous record, and the removal must reach every host"),
    ("ignorePerms", False, "records keep their 0644, readable by any user of the other host"),
)
FOLDER_TYPES: Final = {
    "agentHost": ("sendreceive", "a host that runs agents: it writes only its own agents/<host>/"),
    "readerHost": ("receiveonly", "a host that only reads the roster"),
}


def include_patterns() -> list[str]:
    """The record names at their depth below the folder root, then everything else ignored."""
    return [*(f"!/*/*/{name}" for name in REPLICATED_RECORD_NAMES), "*"]


def stignore(catalog: Path) -> str:
    """A complete `.stignore` for the folder `<catalog>/agents`, its settings in `//` comments.

    The path is printed in those comments: one holding a newline (or any other control or line
    separator character) would inject live patterns (`!*`) into the file, so it is a UsageError."""
    root = catalog / AGENTS_DIR_NAME
    if bad := sorted({char for char in str(root) if unicodedata.category(char) in ("Cc", "Zl", "Zp")}):
        shown = ", ".join(f"U+{ord(char):04X}" for char in bad)
        raise UsageError(f"the catalog path {str(catalog)!r} holds control characters ({shown}); refusing to print it "
                         "into a .stignore, where a line break starts a pattern")  # fmt: skip
    width = max(len(key) for key, _, _ in FOLDER_SETTINGS)
    lines = [
        "// Syncthing ignore patterns for an hctx catalog, from `hctx replication syncthing`.",
        f"// The folder is {root}: save this as {root / '.stignore'} on every host",
        "// BEFORE adding the folder, so that its first scan already offers nothing but the records.",
        "// The first pattern that matches decides: the two records, at agents/<host>/<identity>/, are",
        f"// included; everything else is ignored: the writer's lock ({CONTEXT_LOCK_NAME}), a legacy",
        f"// writer's .harness-context.tmp-*, any stray file. Staging and logs live in <catalog>/{CONTROL_DIR_NAME}/,",
        "// outside the folder. No (?d): Syncthing must never delete an ignored file, such as a live lock.",
        *include_patterns(),
        "//",
        "// Folder settings (Edit Folder > Advanced in the GUI, or the REST API's /rest/config/folders):",
        *(f"//   {'type':<{width}}  {kind:<11}  on {why}" for kind, why in FOLDER_TYPES.values()),
        *(f"//   {key:<{width}}  {_shown(value):<11}  {why}" for key, value, why in FOLDER_SETTINGS),
    ]
    return "\n".join(lines) + "\n"


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "none" if value == {"type": ""} else json.dumps(value)
    return json.dumps(value)


def settings_json(catalog: Path) -> str:
    """The same as data: the folder path, the ignore file's text, and the folder options."""
    return json.dumps({
        "path": str(catalog / AGENTS_DIR_NAME),
        "stignore": stignore(catalog),
        "type": {role: kind for role, (kind, _) in FOLDER_TYPES.items()},
        "folder": {key: value for key, value, _ in FOLDER_SETTINGS},
    }, indent=2) + "\n"  # fmt: skip


def run_syncthing(args: argparse.Namespace) -> int:
    catalog = catalog_of(args).absolute()
    try:
        text = settings_json(catalog) if args.json else stignore(catalog)
    except ValueError as exc:
        print(f"hctx replication syncthing: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replication = commands.add_parser(
        "replication",
        help="what a sync engine needs to replicate the catalog across hosts",
        description="hctx replicates nothing itself; these print the configuration that makes an "
        "existing sync engine carry exactly the records.",
    )
    engines = replication.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    syncthing = engines.add_parser(
        "syncthing",
        help="the .stignore and folder settings for Syncthing",
        description="Prints the .stignore for the folder <catalog>/agents, which includes exactly the "
        "records (harness-state, harness-context) and ignores everything else, with the folder settings "
        "that matter in its comments: hctx replication syncthing > <catalog>/agents/.stignore",
    )
    syncthing.add_argument(
        "--catalog",
        type=Path,
        metavar="DIR",
        help="catalog root (default: $HCTX_CATALOG, else $XDG_STATE_HOME/hctx, else ~/.local/state/hctx)",
    )
    syncthing.add_argument("--json", action="store_true", help="the path, the ignore file and the settings as JSON")
    syncthing.set_defaults(run=run_syncthing)
