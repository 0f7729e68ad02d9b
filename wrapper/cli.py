"""The `hctx` command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import guard
from guard.record import Harness
from sidecar.registry import BUILT_IN
from wrapper.account_watch import add_watch_command
from wrapper.arguments import harness_name, non_negative, whole_number
from wrapper.metrics import add_metrics_command
from wrapper.reader_commands import add_catalog_options, add_reader_commands, catalog_of, with_host
from wrapper.replication import add_replication_command
from wrapper.scan import add_scan_command
from wrapper.web.command import add_web_command

__all__ = [
    "COMMAND_ORDER",
    "DEMO_NO_TOP_S",
    "DEMO_TOP_S",
    "FIRST",
    "KNOWN",
    "OTHERS",
    "Command",
    "Parser",
    "build_parser",
    "main",
    "order_commands",
]

Command = Callable[[argparse.Namespace], int]
# Named in --help without loading a spec; a registered harness (an entry point) is accepted too.
KNOWN = ", ".join(BUILT_IN)
FIRST = next(iter(BUILT_IN))
OTHERS = ", ".join(tuple(BUILT_IN)[1:])


def _schema(_: argparse.Namespace) -> int:
    from guard.record import record_json_schema
    from sidecar.registry import harness_names

    print(json.dumps(record_json_schema(harness_names()), indent=2))
    return 0


def _replay(args: argparse.Namespace) -> int:
    """Each recording through the live driver (sidecar.replay.replay_recording), its writes printed.
    Only a recording `hctx wrap --record` made: any other file is refused, exit 2."""
    from sidecar.registry import spec_for
    from sidecar.replay import header_of, replay_bytes, write_line
    from sidecar.spec import RecordingError, UnknownHarness, recording_bytes

    harness: Harness | None = args.harness
    status = 0
    for name in args.files:
        path = Path(name)
        try:
            data = recording_bytes(path)  # a FIFO, a device or a huge file is refused, not read forever
            named = header_of(data, path).get("harness")
            if harness is not None and named != harness:
                raise RecordingError(f"{path} is a recording of {named!r}, not of {harness!r}")
            writes, summary = replay_bytes(spec_for(str(named)), data, name=path)
        except (OSError, RecordingError, UnknownHarness) as exc:
            print(f"hctx replay: {exc}", file=sys.stderr)
            return 2
        for write in writes:
            sys.stdout.write(write_line(write))
        for problem in summary.problems:
            print(f"hctx replay: {path}: {problem}", file=sys.stderr)
        if summary.lost_chunks:
            print(f"hctx replay: {path}: the recorder lost {summary.lost_chunks} chunks (a gap)", file=sys.stderr)
        if summary.truncated:
            print(f"hctx replay: {path}: the recording stops at its byte cap", file=sys.stderr)
        if summary.problems:
            status = 1
    return status


def _wrap(args: argparse.Namespace) -> int:
    from guard.errors import CatalogError
    from guard.layout import AgentDir
    from sidecar.registry import infer_harness, programs
    from wrapper.arguments import UsageError
    from wrapper.launcher import WrapOptions, free_seat, parse_command, run_wrap

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
        record=record,
    )
    try:
        return run_wrap(options)
    except* OSError as group:
        for error in group.exceptions:
            print(f"hctx wrap: {error}", file=sys.stderr)
    finally:
        if record is not None and record.stat().st_size == 0:  # no sidecar ran (a refused claim)
            record.unlink()
    return 2


def _new_recording(path: Path) -> Path:
    """`--record`'s file, created empty here (O_CREAT|O_EXCL|O_NOFOLLOW, 0600) for the sidecars to
    append to: a path that exists, a symlink included, or whose directory does not, is refused."""
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
        create_recording(path).close()
    except OSError as exc:
        raise UsageError(f"--record {path}: {exc.strerror}") from None
    return path


# How long each demo session plays by default: watchable in the top view, brief without it.
DEMO_TOP_S = 60.0
DEMO_NO_TOP_S = 15.0


def _demo(args: argparse.Namespace) -> int:
    from wrapper.demo import run_demo
    from wrapper.top import has_terminal

    no_top: bool = args.no_top
    if not no_top and not has_terminal():  # piped or in CI: the run is still worth watching, as text
        print("hctx demo: no terminal on stdin and stdout for `hctx top`; playing as --no-top", file=sys.stderr)
        no_top = True
    default = DEMO_NO_TOP_S if no_top else DEMO_TOP_S
    duration: float = args.duration if args.duration is not None else default
    return run_demo(args.catalog, show_top=not no_top, duration_s=duration)


# `hctx --help` lists the commands in the order a user meets them; one registered later by a module
# of its own lands in its place here, one not named here after these, and a name here that is not
# registered is skipped.
COMMAND_ORDER = (
    "demo", "wrap", "agents", "accounts", "top", "doctor", "inspect", "watch", "metrics", "web", "scan", "replication",
    "replay", "schema",
)  # fmt: skip


class Parser(argparse.ArgumentParser):
    """Every hctx (sub)command's parser: an option's value may start with a minus and a digit
    (`--since -1h`), so it reaches that option's own check instead of reading as an unknown option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own default takes only `-5` or `-.5` as a value; no hctx option looks like `-1`.
        self._negative_number_matcher = re.compile(r"^-\d")


def order_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The help's command list (and the choices an error names) in COMMAND_ORDER."""
    rank = {name: index for index, name in enumerate(COMMAND_ORDER)}
    commands._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))
    parsers = commands._name_parser_map
    for name in sorted(parsers, key=lambda name: rank.get(name, len(rank))):
        parsers[name] = parsers.pop(name)


def _usage_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command that was run: its usage is the one a bad option of it should show."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if isinstance(chosen, argparse.ArgumentParser):
                return _usage_parser(chosen, args)
    return parser


def build_parser() -> argparse.ArgumentParser:
    # Typed as the base class, so every add_*_command takes the subparsers as argparse's own; each
    # subcommand's parser is a Parser all the same (argparse makes them of the parent's class).
    parser: argparse.ArgumentParser = Parser(
        prog="hctx",
        description="Live context-window fill for every coding agent, in the harness's own numbers.",
    )
    parser.add_argument("--version", action="version", version=f"hctx {guard.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    schema = commands.add_parser(
        "schema",
        help="print the harness-context record's JSON Schema",
        description="Print the JSON Schema (draft 2020-12) of st2.harness-context.v1, the record every "
        "sidecar writes and every reader reads, with its fields in the order they are written.",
    )
    schema.set_defaults(run=_schema)

    replay = commands.add_parser(
        "replay",
        help="replay a recording `hctx wrap --record` made through the sidecar's own path",
        description="Replay a recording `hctx wrap --record` made (docs/recording.md) through the live "
        "sidecar's streams, decoders, producer, writer (its outbox, refresh and heartbeat) and write guard, "
        "on a simulated clock and an in-memory store, and print one JSON line per record it writes, with "
        "its reason. Any other file is refused (exit 2); damaged lines are said on stderr (exit 1).",
    )
    replay.add_argument(
        "--harness", type=harness_name,
        help=f"one of {KNOWN}: refuse a recording of any other (a recording names its own)",
    )  # fmt: skip
    replay.add_argument(
        "files", nargs="+", metavar="FILE",
        help="a recording `hctx wrap --record` made; each is replayed as its own session",
    )  # fmt: skip
    replay.set_defaults(run=_replay)

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
        "(capped at 64 MiB; see docs/recording.md); `hctx replay FILE` replays it",
    )  # fmt: skip
    wrap.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    wrap.set_defaults(run=with_host(_wrap))

    demo = commands.add_parser(
        "demo",
        help="a small fleet of recorded real sessions through the real wrapper, sidecar and top view",
        description="Starts four agents (Claude Code, pi, omp) through `hctx wrap`, each a stand-in "
        "that plays back a capture of a real session (turns, a compaction, one agent past 80%), and "
        f"opens `hctx top` on them: each session plays for {DEMO_TOP_S:g} s, then its agent stays "
        "up with its last reading. q or Ctrl-C stops everything.",
    )
    demo.add_argument(
        "--catalog", type=Path, metavar="DIR", help="where the records go (default: a new temporary directory)"
    )
    demo.add_argument(
        "--no-top",
        action="store_true",
        help=f"play every session to its end ({DEMO_NO_TOP_S:g} s), printing each record as it lands, then the "
        "roster, and exit (what the demo does without a terminal)",
    )
    demo.add_argument(
        "--duration",
        type=non_negative,
        metavar="S",
        help=f"seconds each session takes (default: {DEMO_TOP_S:g}, or {DEMO_NO_TOP_S:g} with --no-top)",
    )
    demo.set_defaults(run=_demo)
    add_reader_commands(commands)
    add_scan_command(commands)
    add_metrics_command(commands)
    add_replication_command(commands)
    add_watch_command(commands)
    add_web_command(commands)
    order_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(words)
    if unknown:  # argparse hands a subcommand's unknown options up to the top; its own usage says more
        before_command = unknown[0] in words[: words.index(args.command)]
        usage = parser if before_command else _usage_parser(parser, args)
        usage.error(f"unrecognized arguments: {' '.join(unknown)}")
    run: Command = args.run
    try:
        return run(args)
    except BrokenPipeError:
        # A reader piped into `head` is a normal ending, not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
