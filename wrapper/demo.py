"""`hctx demo`: a small fleet of recorded real sessions through the real wrapper and sidecar.

Each agent is a stand-in harness (`python -m wrapper.demo`, below) that plays back a capture of a
real harness session shipped under fixtures/, delivering every frame the way that harness does:
Claude's status-line payloads and hooks through the real `hctx-statusline` tee and `hctx-hook`
forwarder, pi/omp extension frames straight onto the channel. Only the pace is the demo's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from guard.record import Harness

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DEMO_HOST = "demo"
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DemoAgent:
    identity: str
    harness: Harness
    captures: tuple[str, ...]  # relative to fixtures/


FLEET = (
    DemoAgent("claude-1m", "claude", tuple(
        f"claude/{kind}-2.1.332.jsonl" for kind in ("statusline", "precompact", "postcompact", "sessionstart")
    )),
    DemoAgent("claude-sonnet", "claude", tuple(
        f"claude/{kind}-2.1.250-sonnet45.jsonl" for kind in ("statusline", "precompact", "postcompact",
                                                               "sessionstart")
    )),
    DemoAgent("pi-worker", "pi", ("pi/live/pi-0.84.2.channel.jsonl",)),
    DemoAgent("omp-worker", "omp", ("pi/live/omp-18.2.3.channel.jsonl",)),
)  # fmt: skip


def session_script(agent: DemoAgent) -> list[tuple[int | None, dict[str, object]]]:
    """The capture as timed frames, through the same decoder `hctx replay` uses."""
    from sidecar.producers import read_recordings, recording_for

    decode = recording_for(agent.harness)
    recordings = read_recordings(agent.harness, [FIXTURES / name for name in agent.captures])
    return [timed for data in recordings for timed in decode(data)]


def paced(
    script: list[tuple[int | None, dict[str, object]]], duration_s: float
) -> list[tuple[float, dict[str, object]]]:
    """Offsets in seconds: the recorded gaps, scaled so the whole session takes `duration_s`."""
    times = [at for at, _ in script if at is not None]
    start, span = (min(times), max(times) - min(times)) if times else (0, 0)
    offsets, last = [], 0.0
    for index, (at, frame) in enumerate(script):
        if span and at is not None:
            last = (at - start) / span * duration_s
        elif not span:
            last = index / max(1, len(script) - 1) * duration_s
        offsets.append((last, frame))
    return offsets


def write_script(agent: DemoAgent, directory: Path, duration_s: float) -> Path:
    path = directory / f"{agent.identity}.script.jsonl"
    with path.open("w") as out:
        for offset, frame in paced(session_script(agent), duration_s):
            out.write(json.dumps({"offset": offset, "frame": frame}) + "\n")
    return path


def launch(agent: DemoAgent, catalog: Path, work: Path, script: Path, linger: bool) -> subprocess.Popen[bytes]:
    """`hctx wrap` around the stand-in, in its own session so the terminal's Ctrl-C is the demo's."""
    cwd = work / agent.identity
    cwd.mkdir(parents=True, exist_ok=True)
    argv = [
        *(sys.executable, "-m", "wrapper.cli", "wrap", "--agent", agent.identity, "--harness", agent.harness),
        *("--catalog", str(catalog), "--host", DEMO_HOST, "--"),
        *(sys.executable, "-m", "wrapper.demo", str(script), *(["--linger"] if linger else [])),
    ]
    return subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_demo(catalog: Path | None, show_top: bool, duration_s: float) -> int:
    catalog = (catalog or Path(tempfile.mkdtemp(prefix="hctx-demo-"))).absolute()
    work = catalog / ".st2" / "demo"
    work.mkdir(parents=True, exist_ok=True)
    scripts = [write_script(agent, work, duration_s) for agent in FLEET]
    processes = [launch(agent, catalog, work, script, show_top) for agent, script in zip(FLEET, scripts, strict=True)]
    try:
        if show_top:
            from wrapper.top import run as run_top

            status = run_top(catalog, here=DEMO_HOST, once=False)
        else:
            deadline = time.monotonic() + duration_s + 20
            for process in processes:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            status = 0
    except KeyboardInterrupt:
        status = 130
    except subprocess.TimeoutExpired:
        print("hctx demo: a session did not finish in time", file=sys.stderr)
        status = 1
    finally:
        stop(processes)
    print(f"catalog: {catalog}\n  hctx agents --catalog {catalog}\n  hctx doctor --catalog {catalog}")
    return status


# --- the stand-in harness --------------------------------------------------------------------


def _deliver(frame: dict[str, object]) -> None:
    kind = frame.get("type")
    if kind in ("claude.statusline", "claude.hook"):
        entry = "statusline" if kind == "claude.statusline" else "hook"
        subprocess.run(
            [sys.executable, "-m", "sidecar.claude_tee", entry],
            input=json.dumps(frame["payload"]).encode(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(os.environ["HCTX_CHANNEL"])
        client.sendall(json.dumps({k: v for k, v in frame.items() if k != "atMs"}).encode() + b"\n")


def play(script: Path, linger: bool) -> int:
    start = time.monotonic()
    for line in script.read_text().splitlines():
        step = json.loads(line)
        time.sleep(max(0.0, start + step["offset"] - time.monotonic()))
        try:
            _deliver(step["frame"])
        except OSError as exc:
            print(f"demo stand-in: {exc}", file=sys.stderr)
    if linger:  # a live demo keeps its agents "running" until the viewer quits
        signal.sigwait({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m wrapper.demo", description="a demo stand-in harness")
    parser.add_argument("script", type=Path)
    parser.add_argument("--linger", action="store_true")
    # The wrapper adapts a real harness's command line (pi gets `--extension ...`): a stand-in
    # plays its capture whatever it is handed.
    args, _ = parser.parse_known_args()
    if args.linger:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    return play(args.script, args.linger)


if __name__ == "__main__":
    sys.exit(main())
