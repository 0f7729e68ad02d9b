"""`hctx setup [HARNESS ...] [--dry-run] [--undo]` (issue 36): each harness's own user-level extension
point arranged so that a session started without `hctx wrap` adopts itself.

For each harness named (else each found installed) the harness's setup module
(`sidecar.registry.setup_module`) plans its edits and the engine (`wrapper.launch.userfiles`)
carries them out: `--dry-run` prints, file by file, the unified diff of what would change and
writes nothing; `--undo` takes hctx's part out again (the user's bytes exactly where the file is
still what setup wrote). A refused file is printed with its reason and the exit status is 1; a
harness with no setup module says plainly that no user-level extension point was measured for it.
docs/setup.md is the user's page.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from guard.errors import CatalogError
from sidecar.registry import harness_names, setup_module, spec_for
from sidecar.setup_plan import HarnessSetup, SetupRefused
from wrapper.arguments import KNOWN, harness_name
from wrapper.launch.userfiles import apply_setup, journal_dir, plan_changes, render_diff, undo_setup

__all__ = ["NO_POINT", "register", "run_setup", "setup_one"]

NO_POINT = "no user-level extension point measured for this harness; nothing to set up"


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or os.path.expanduser("~"))


def _on_path(harness: str, environ: Mapping[str, str]) -> bool:
    path = environ.get("PATH", os.defpath)
    return any(shutil.which(program, path=path) for program in spec_for(harness).programs if "/" not in program)


def _out(line: str) -> None:
    sys.stdout.write(line if line.endswith("\n") else line + "\n")


def setup_one(harness: str, plan: HarnessSetup, *, dry_run: bool, undo: bool, journal: Path) -> bool:
    """One harness's setup (or undo); False when a file was refused or could not be written."""
    for build in plan.builds:
        if not build.offered:
            _out(f"{harness} {build.build}: no user-level extension point: {build.how}")
    if not plan.edits:
        _out(f"{harness}: {NO_POINT}")
        return True
    try:
        if undo:
            for undone in undo_setup(plan, journal, dry_run=dry_run):
                if undone.before is None and undone.after is None:
                    continue  # no such file: nothing to say
                if undone.after == undone.before:
                    _out(f"{harness}: {undone.file.path}: {undone.how}")
                elif dry_run:
                    sys.stdout.write(render_diff(undone.file.path, undone.before, undone.after))
                else:
                    _out(f"{harness}: {undone.file.path}: {undone.how}")
            return True
        if dry_run:
            for change in plan_changes(plan):
                if change.changes:
                    sys.stdout.write(render_diff(change.edit.file.path, change.current, change.new))
                else:
                    _out(f"{harness}: {change.edit.file.path}: in place, unchanged")
            return True
        for change in apply_setup(plan, journal):
            state = "written" if change.changes else "in place, unchanged"
            _out(f"{harness}: {change.edit.file.path}: {state}")
    except SetupRefused as exc:
        print(f"hctx setup: {harness}: refused: {exc}", file=sys.stderr)
        return False
    except (CatalogError, OSError) as exc:
        print(f"hctx setup: {harness}: {exc.strerror or exc if isinstance(exc, OSError) else exc}", file=sys.stderr)
        return False
    return True


def run_setup(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    home = _home(environ)
    journal = journal_dir(environ)
    named: list[str] = list(dict.fromkeys(args.harness))
    ok = True
    found = False
    for harness in named or harness_names():
        module = setup_module(harness)
        if module is None:
            if named or _on_path(harness, environ):
                _out(f"{harness}: {NO_POINT}")
                found = True
            continue
        plan = module.setup(home, environ)
        if not plan.installed and not named and not args.undo:
            continue
        found = True
        ok = setup_one(harness, plan, dry_run=args.dry_run, undo=args.undo, journal=journal) and ok
    if not found:
        _out(f"no harness found installed ({KNOWN}); name one to set it up anyway")
    if args.dry_run and ok:
        _out("dry run: nothing was written")
    return 0 if ok else 1


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    setup = commands.add_parser(
        "setup",
        help="have sessions started without hctx wrap seen too (each harness's user-level extension point)",
        description="For each harness named (default: each found installed), put hctx's part into the "
        "harness's own user-level extension point (a user settings file, a hook, an extension or plugin "
        "directory: --dry-run names each file), so a session started without `hctx wrap` gets its own "
        "sidecar and record. The user's keys, hooks and "
        "status line are kept; setup twice is setup once; files are never written through a symlink out "
        "of the harness's config directory, and a file hctx will not edit (a FIFO, over 1 MiB, not JSON, "
        "a byte-order mark) is refused with the reason (exit status 1). A journal under "
        "$XDG_STATE_HOME/hctx/setup keeps each file's bytes from before, for --undo.",
    )
    setup.add_argument("harness", nargs="*", type=harness_name, metavar="HARNESS", help=f"one of {KNOWN}")
    setup.add_argument(
        "--dry-run", action="store_true",
        help="print, file by file, the unified diff of what would change; write nothing",
    )  # fmt: skip
    setup.add_argument(
        "--undo", action="store_true",
        help="take hctx's part out again: a file still as setup wrote it gets its bytes from before exactly "
        "(or is removed, with the directories setup created); one changed since keeps those changes",
    )  # fmt: skip
    setup.set_defaults(run=run_setup)
