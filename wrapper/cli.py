"""The `hctx` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import guard
from guard.record import HARNESSES, Harness

Command = Callable[[argparse.Namespace], int]


def _schema(_: argparse.Namespace) -> int:
    from guard.record import record_json_schema

    print(json.dumps(record_json_schema(), indent=2))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from sidecar.replay import replay, write_line

    harness: Harness = args.harness
    try:
        recordings = [Path(name).read_bytes() for name in args.files]
    except OSError as exc:
        print(f"hctx replay: {exc}", file=sys.stderr)
        return 2
    for write in replay(harness, recordings):
        sys.stdout.write(write_line(write))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hctx",
        description="Live context-window fill for every coding agent, in the harness's own numbers.",
    )
    parser.add_argument("--version", action="version", version=f"hctx {guard.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    schema = commands.add_parser("schema", help="print the harness-context record's JSON Schema")
    schema.set_defaults(run=_schema)

    replay = commands.add_parser(
        "replay",
        help="run a recorded harness stream through the producer and write guard",
        description="Print one JSON line per record the write guard would write, with its reason. "
        "Untimed frames advance a simulated clock by one second each.",
    )
    replay.add_argument("--harness", required=True, choices=HARNESSES)
    replay.add_argument("files", nargs="+", metavar="FILE", help="a recorded stream of that harness")
    replay.set_defaults(run=_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Command = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
