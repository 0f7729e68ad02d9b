"""`hctx demo`: a small fleet of recorded real sessions through the real wrapper and sidecar.

Every agent is launched by `hctx wrap` like a real one; its harness is a stand-in
(`sidecar.demo_standin`) playing back a capture of a real session that ships with the package.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from guard.record import Harness

DEMO_HOST = "demo"
STOP_TIMEOUT_S = 10.0
# Past the last frame, time for the wrappers and sidecars to finish and exit.
FINISH_SLACK_S = 20.0


@dataclass(frozen=True)
class DemoAgent:
    identity: str
    harness: Harness
    captures: tuple[str, ...]


def _claude(version: str) -> tuple[str, ...]:
    return tuple(f"{kind}-{version}.jsonl" for kind in ("statusline", "precompact", "postcompact", "sessionstart"))


FLEET = (
    DemoAgent("claude-1m", "claude", _claude("2.1.332")),
    DemoAgent("claude-sonnet", "claude", _claude("2.1.250-sonnet45")),
    DemoAgent("pi-worker", "pi", ("pi-0.84.2.channel.jsonl",)),
    DemoAgent("omp-worker", "omp", ("omp-18.2.3.channel.jsonl",)),
)


def launch(agent: DemoAgent, catalog: Path, duration_s: float, linger: bool) -> subprocess.Popen[bytes]:
    """`hctx wrap` around the stand-in, in its own session so the terminal's Ctrl-C is the demo's."""
    cwd = catalog / ".st2" / "demo" / agent.identity  # Claude's settings are rendered here
    cwd.mkdir(parents=True, exist_ok=True)
    standin = [sys.executable, "-m", "sidecar.demo_standin", "--harness", agent.harness]
    standin += ["--duration", str(duration_s), *(["--linger"] if linger else []), *agent.captures]
    argv = [
        *(sys.executable, "-m", "wrapper.cli", "wrap", "--agent", agent.identity, "--harness", agent.harness),
        *("--catalog", str(catalog), "--host", DEMO_HOST, "--", *standin),
    ]
    # The stand-ins' status lines go nowhere; a renderer that draws nothing keeps the tee quiet.
    env = os.environ | {"ST_CLAUDE_STATUSLINE_RENDERER": "true"}
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every wrapper (it forwards to its stand-in; its sidecar follows); SIGKILL the group
    of one that outlives the timeout."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(catalog: Path | None, show_top: bool, duration_s: float) -> int:
    catalog = (catalog or Path(tempfile.mkdtemp(prefix="hctx-demo-"))).absolute()
    # A closed terminal or a `kill` ends the demo the way Ctrl-C does: with every process it started.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    processes = [launch(agent, catalog, duration_s, linger=show_top) for agent in FLEET]
    status = 0
    try:
        if show_top:
            from wrapper.top import run as run_top

            status = run_top(catalog, here=DEMO_HOST, once=False)
        else:
            deadline = time.monotonic() + duration_s + FINISH_SLACK_S
            for process in processes:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except KeyboardInterrupt:
        status = 130
    except subprocess.TimeoutExpired:
        print("hctx demo: a session did not finish in time", file=sys.stderr)
        status = 1
    finally:
        stop(processes)
    print(f"catalog: {catalog}\n  hctx agents --catalog {catalog}\n  hctx doctor --catalog {catalog}")
    return status
