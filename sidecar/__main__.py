"""`python -m sidecar`: started by `hctx wrap`, bound to one incarnation of one agent."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from sidecar import logs
from sidecar.app import SidecarConfig, run_sidecar
from sidecar.spec import UnknownHarness


def _harness(text: str) -> str:
    from sidecar.registry import spec_for

    try:
        return spec_for(text).name
    except UnknownHarness as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None) -> SidecarConfig:
    parser = argparse.ArgumentParser(prog="python -m sidecar", description=__doc__)
    parser.add_argument("--catalog", type=Path, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--harness", required=True, type=_harness, help="a name the registry knows")
    parser.add_argument("--incarnation", required=True)
    parser.add_argument("--channel", type=Path, required=True, help="unix socket path to listen on")
    parser.add_argument("--lifeline-fd", type=int, help="exit when this inherited pipe reaches EOF")
    parser.add_argument("--ready-fd", type=int, help="write 'ready' here once the channel listens")
    parser.add_argument("--transport", default="", help="the transport's config, JSON of its harness's model")
    parser.add_argument("--account", default="", help="the account the harness states, JSON {key, label}")
    parser.add_argument("--record-fd", type=int, help="append every byte decoded, redacted, to this inherited file "
                        "(hctx wrap --record hands it to each sidecar)")  # fmt: skip
    parser.add_argument("--record-raw", action="store_true", help="with --record-fd: record it unredacted")
    args = parser.parse_args(argv)
    return SidecarConfig(
        catalog=args.catalog,
        host=args.host,
        agent=args.agent,
        harness=args.harness,
        incarnation=args.incarnation,
        channel=args.channel,
        lifeline_fd=args.lifeline_fd,
        ready_fd=args.ready_fd,
        transport=args.transport,
        account=args.account,
        record_fd=args.record_fd,
        record_raw=args.record_raw,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logs.configure(config.catalog, config.host, config.agent)
    # From here on nothing goes to the stderr the harness shares: the log is where to look, and the
    # wrapper, which holds this process's pid, says when it died.
    logs.silence_stderr()
    try:
        trio.run(run_sidecar, config)
    except Exception:
        logging.getLogger("sidecar").exception("sidecar failed", extra={"event": "crash"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
