"""A stand-in harness for `hctx demo`: plays back a recording of a real harness session.

It plays the channel chunks of a recording (`hctx wrap --record`'s format, the one `hctx replay`
reads; the demo's are converted from the lab's captures of the real builds) the way that harness
sends them: a line the Claude tee built (`sidecar.harnesses.claude.frames.channel_line`) goes
through the real `hctx-statusline` tee or `hctx-hook` forwarder again, with the payload it was built
from as stdin; any other channel line (pi/omp extension frames) straight onto the channel. The
sidecar decodes them on its live path. Only the pace is its own: the recorded gaps are scaled so
the whole session takes `--duration` seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from guard.errors import Unusable
from sidecar.decoding import CHANNEL
from sidecar.harnesses.claude.frames import unwrap
from sidecar.recorder import Chunk
from sidecar.registry import harness_names
from sidecar.replay import header_of, read_chunks
from sidecar.spec import RecordingError, recording_bytes

__all__ = [
    "DEMO_RECORDINGS",
    "FleetFailed",
    "deliver",
    "main",
    "paced",
]


class FleetFailed(Unusable):
    """A demo agent failed to start, or its recording cannot be played."""


DEMO_RECORDINGS = Path(__file__).resolve().parent / "assets" / "demo"


def paced(harness: str, path: Path, duration_s: float) -> list[tuple[float, Chunk]]:
    """(offset in seconds, chunk) of the recording at `path`: its gaps scaled to `duration_s`.
    RecordingError for a file that is no recording of `harness`."""
    data = recording_bytes(path)
    named = header_of(data, path).get("harness")
    if named != harness:
        raise RecordingError(f"{path} is a recording of {named!r}, not of {harness!r}")
    script = read_chunks(data)
    times = [chunk.at_ms for chunk in script if chunk.at_ms is not None]
    start, span = (min(times), max(times) - min(times)) if times else (0, 0)
    offsets: list[tuple[float, Chunk]] = []
    last = 0.0
    for index, chunk in enumerate(script):
        if span and chunk.at_ms is not None:
            last = (chunk.at_ms - start) / span * duration_s
        elif not span:
            last = index / max(1, len(script) - 1) * duration_s
        offsets.append((last, chunk))
    return offsets


def deliver(chunk: Chunk) -> None:
    """The chunk's bytes onto the channel, the way the harness's own process sends them."""
    if chunk.wire != CHANNEL:
        raise FleetFailed(f"a {chunk.wire!r} chunk has no sender in the demo; only the channel's")
    tee = unwrap(chunk.data)
    if tee is not None:
        entry, payload = tee
        subprocess.run(
            [sys.executable, "-m", "sidecar.harnesses.claude.tee", entry],
            input=payload,
            stdout=subprocess.DEVNULL,
            check=False,
        )
        return
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(os.environ["HCTX_CHANNEL"])
        client.sendall(chunk.data)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m sidecar.demo_standin", description=__doc__)
    parser.add_argument("--harness", required=True, choices=harness_names())
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--linger", action="store_true", help="stay up after the session until signalled")
    parser.add_argument("recording", metavar="RECORDING", help="a file name under sidecar/assets/demo")
    # The wrapper adapts a real harness's command line (pi gets `--extension ...`): a stand-in
    # plays its capture whatever else it is handed.
    args, _ = parser.parse_known_args()
    try:
        script = paced(args.harness, DEMO_RECORDINGS / args.recording, args.duration)
    except (OSError, RecordingError) as exc:
        print(f"demo stand-in: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    for offset, chunk in script:
        time.sleep(max(0.0, start + offset - time.monotonic()))
        try:
            deliver(chunk)
        except (OSError, FleetFailed) as exc:
            print(f"demo stand-in: {exc}", file=sys.stderr)
    if args.linger:  # a live demo keeps its agents running until the viewer quits
        # Until now a stop signal simply ends the stand-in; from here it is waited for.
        stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        signal.sigwait(stop_signals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
