"""A stand-in harness for `hctx demo`: plays back a capture of a real harness session.

It delivers every frame the way that harness does — Claude's status-line payloads and hooks through
the real `hctx-statusline` tee and `hctx-hook` forwarder, pi/omp extension frames straight onto the
channel — decoded by the same code `hctx replay` uses. Only the pace is its own: the recorded gaps
are scaled so the whole session takes `--duration` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from guard.record import HARNESSES, Harness
from sidecar.producers import read_recordings, recording_for
from sidecar.producers.base import Frame

DEMO_CAPTURES = Path(__file__).resolve().parent / "assets" / "demo"
_TEE_ENTRY = {"claude.statusline": "statusline", "claude.hook": "hook"}


def paced(harness: Harness, paths: list[Path], duration_s: float) -> list[tuple[float, Frame]]:
    """(offset in seconds, frame): the recorded gaps scaled to `duration_s`, or even steps untimed."""
    decode = recording_for(harness)
    script = [timed for data in read_recordings(harness, paths) for timed in decode(data)]
    times = [at for at, _ in script if at is not None]
    start, span = (min(times), max(times) - min(times)) if times else (0, 0)
    offsets: list[tuple[float, Frame]] = []
    last = 0.0
    for index, (at, frame) in enumerate(script):
        if span and at is not None:
            last = (at - start) / span * duration_s
        elif not span:
            last = index / max(1, len(script) - 1) * duration_s
        offsets.append((last, frame))
    return offsets


def deliver(frame: Frame) -> None:
    entry = _TEE_ENTRY.get(str(frame.get("type")))
    if entry is not None:
        subprocess.run(
            [sys.executable, "-m", "sidecar.claude_tee", entry],
            input=json.dumps(frame["payload"]).encode(),
            stdout=subprocess.DEVNULL,
            check=False,
        )
        return
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(os.environ["HCTX_CHANNEL"])
        client.sendall(json.dumps({k: v for k, v in frame.items() if k != "atMs"}).encode() + b"\n")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m sidecar.demo_standin", description=__doc__)
    parser.add_argument("--harness", required=True, choices=HARNESSES)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--linger", action="store_true", help="stay up after the session until signalled")
    parser.add_argument("captures", nargs="+", metavar="CAPTURE", help="file names under sidecar/assets/demo")
    # The wrapper adapts a real harness's command line (pi gets `--extension ...`): a stand-in
    # plays its capture whatever else it is handed.
    args, _ = parser.parse_known_args()
    script = paced(args.harness, [DEMO_CAPTURES / name for name in args.captures], args.duration)
    start = time.monotonic()
    for offset, frame in script:
        time.sleep(max(0.0, start + offset - time.monotonic()))
        try:
            deliver(frame)
        except OSError as exc:
            print(f"demo stand-in: {exc}", file=sys.stderr)
    if args.linger:  # a live demo keeps its agents running until the viewer quits
        # Until now a stop signal simply ends the stand-in; from here it is waited for.
        stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        signal.sigwait(stop_signals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
