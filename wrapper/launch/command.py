"""`hctx wrap`'s command line: its options, the harness told from the command, the seat, the
recording's new file; the launch itself is wrapper.launch.launcher's (imported when `wrap` runs)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from guard.record import Harness
from wrapper.arguments import (
    FIRST,
    KNOWN,
    OTHERS,
    add_catalog_options,
    catalog_of,
    harness_name,
    non_negative,
    whole_number,
    with_host,
)

__all__ = ["register"]


def _wrap(args: argparse.Namespace) -> int:
    from guard.errors import CatalogError
    from guard.layout import AgentDir
    from sidecar.registry import infer_harness, programs
    from wrapper.arguments import UsageError
    from wrapper.launch.launcher import WrapOptions, free_seat, parse_command, run_wrap

    try:
        argv = parse_command(args.command_line)
        harness: Harness | None = args.harness or infer_harness(argv)
        if harness is None:
            known = ", ".join(sorted(set(programs().values())))
            raise UsageError(f"cannot tell which harness {argv[0]!r} is ({known}, or behind npx/bunx); "
                             "say it with --harness")  # fmt: skip
        catalog = catalog_of(args).absolute()
        identity = args.agent or free_seat(catalog, args.host, Path.cwd())
        agent = AgentDir(catalog, args.host, identity)
        if args.record_raw and args.record is None:
            raise UsageError("--record-raw records the whole session into --record FILE: name the file")
        record = None if args.record is None else _new_recording(args.record)
    except (ValueError, CatalogError) as exc:
        print(f"hctx wrap: {exc}", file=sys.stderr)
        return 2
    options = WrapOptions(
        agent=agent,
        harness=harness,
        argv=argv,
        restart=args.restart,
        max_restarts=args.max_restarts,
        restart_delay_s=args.restart_delay,
        restart_delay_max_s=args.restart_delay_max,
        takeover=args.takeover,
        record=None if record is None else record[0],
        record_raw=args.record_raw,
    )
    try:
        return run_wrap(options, None if record is None else record[1])
    except* OSError as group:
        for error in group.exceptions:
            print(f"hctx wrap: {error}", file=sys.stderr)
    finally:
        if record is not None:  # no sidecar ran (a refused claim): the empty file made is removed
            _remove_if_empty(*record)
    return 2


def _new_recording(path: Path) -> tuple[Path, int]:
    """`--record`'s file, created empty here (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), and its open
    descriptor, which the resident holds and hands each sidecar to append to (the file is never
    opened by name again): a path that exists, a symlink included, or whose directory does not,
    is refused."""
    from sidecar.recorder import create_recording
    from wrapper.arguments import UsageError

    path = path.absolute()
    if path.is_symlink():
        raise UsageError(f"--record {path} is a symlink; hctx records only into a new file of its own")
    if path.exists():
        raise UsageError(f"--record {path} exists; hctx records into a new file, never over one")
    if not path.parent.is_dir():
        raise UsageError(f"--record {path}: its directory {path.parent} does not exist")
    try:
        with create_recording(path) as file:
            return path, os.dup(file.fileno())  # the same open file (its O_APPEND), past this object
    except OSError as exc:
        raise UsageError(f"--record {path}: {exc.strerror}") from None


def _remove_if_empty(path: Path, fd: int) -> None:
    """The recording made for a session that never started, removed: only while the path still
    names that very file, and it is empty (a file swapped in at the path is not ours to remove)."""
    try:
        held, named = os.fstat(fd), os.lstat(path)
        if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino) and held.st_size == 0:
            path.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    wrap = commands.add_parser(
        "wrap",
        help="launch a harness as a managed agent, with a sidecar writing its context record",
        usage="%(prog)s [options] -- COMMAND [ARGS...]",
        description=f"hctx wrap -- {FIRST} (or {OTHERS}, also behind npx/bunx): claim the "
        "agent (a new incarnation), remove its old context record, start its sidecar, then run COMMAND "
        "with HCTX_CHANNEL, HCTX_AGENT, HCTX_INCARNATION and HCTX_CATALOG set. The harness keeps the "
        "terminal; the wrapper exits with its exit status.",
    )
    wrap.add_argument(
        "--agent", metavar="ID",
        help="the agent's identity in the catalog (default: the working directory's name; a second seat "
        "there, while the first runs, is NAME-2, then NAME-3, ...)",
    )  # fmt: skip
    wrap.add_argument(
        "--harness",
        type=harness_name,
        help=f"which harness COMMAND runs, one of {KNOWN} (default: told from its program's name)",
    )
    add_catalog_options(wrap)
    wrap.add_argument(
        "--restart",
        choices=("no", "on-failure", "always"),
        default="no",
        help="relaunch the harness when it exits (each relaunch is a new incarnation; default: no)",
    )
    wrap.add_argument("--max-restarts", type=whole_number, metavar="N", help="stop relaunching after N relaunches")
    wrap.add_argument(
        "--restart-delay", type=non_negative, default=1.0, metavar="S",
        help="first relaunch back-off in seconds, doubling each time (default: %(default)s)",
    )  # fmt: skip
    wrap.add_argument(
        "--restart-delay-max", type=non_negative, default=60.0, metavar="S",
        help="back-off cap in seconds (default: %(default)s)",
    )  # fmt: skip
    wrap.add_argument(
        "--takeover", action="store_true",
        help="when a live wrapper on this host holds the agent, stop it and take the agent over "
        "(without this, a second wrapper for one agent is refused); only a process proven to hold the "
        "agent's wrapper lock is signalled, anything else is refused with what was found",
    )  # fmt: skip
    wrap.add_argument(
        "--record", type=Path, metavar="FILE",
        help="record every byte the sidecar decodes, with its time and wire, into FILE, a new file "
        "(capped at 64 MiB; see docs/recording.md); `hctx replay FILE` replays it. Redacted: no prompt, "
        "message, tool input or output, file content, instruction, email, token or key is recorded, only "
        "what hctx reads for its numbers",
    )  # fmt: skip
    wrap.add_argument(
        "--record-raw", action="store_true",
        help="with --record: record the WHOLE session unredacted (prompts, replies, file contents, tool "
        "output, the account's email, tokens, API keys): never share such a recording",
    )  # fmt: skip
    wrap.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    wrap.set_defaults(run=with_host(_wrap))
