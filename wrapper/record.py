"""`hctx schema` and `hctx replay`: the record every sidecar writes, as its JSON Schema, and a
recording `hctx wrap --record` made, replayed through the sidecar's own path. Neither launches an
agent nor reads the catalog."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from guard.record import Harness
from wrapper.arguments import KNOWN, harness_name

__all__ = ["register"]


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


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
