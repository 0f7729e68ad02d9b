"""`hctx demo`: a small fleet of recorded real sessions through the real wrapper and sidecar.

Every agent is launched by `hctx wrap` like a real one; its harness is a stand-in
(`sidecar.demo_standin`) playing back a recording of a real session that ships with the package.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from guard.constants import AGENTS_DIR_NAME, CONTEXT_RECORD_NAME, STATE_RECORD_NAME
from guard.errors import RecordRefused
from guard.record import Harness, parse_record
from wrapper.arguments import non_negative

__all__ = [
    "DEMO_HOST",
    "DEMO_NO_TOP_S",
    "DEMO_TOP_S",
    "FINISH_SLACK_S",
    "FLEET",
    "LOG_TAIL_LINES",
    "PROGRESS_POLL_S",
    "STOP_TIMEOUT_S",
    "WRAPPER_LOG",
    "DemoAgent",
    "Progress",
    "failures",
    "launch",
    "record_path",
    "register",
    "run_demo",
    "stop",
    "workdir",
]

DEMO_HOST = "demo"
STOP_TIMEOUT_S = 10.0
# Beyond the play itself, time for the wrappers and sidecars to start, finish and exit: a bound for a
# hung session, not a pace (on two busy cores the start alone has taken 10 s).
FINISH_SLACK_S = 60.0
WRAPPER_LOG = "wrapper.stderr"
LOG_TAIL_LINES = 8
# How often `--no-top` looks for records that landed.
PROGRESS_POLL_S = 0.2

# How long each demo session plays by default: watchable in the top view, brief without it.
DEMO_TOP_S = 60.0
DEMO_NO_TOP_S = 15.0


@dataclass(frozen=True)
class DemoAgent:
    identity: str
    harness: Harness
    recording: str  # under sidecar/assets/demo: a recording of a real session (fixtures/recordings/)


FLEET = (
    DemoAgent("claude-1m", "claude", "claude-session-2.1.332.rec"),
    DemoAgent("claude-sonnet", "claude", "claude-session-2.1.250-sonnet45.rec"),
    DemoAgent("pi-worker", "pi", "pi-0.84.2.channel.rec"),
    DemoAgent("omp-worker", "omp", "omp-18.2.3.channel.rec"),
)


def launch(agent: DemoAgent, catalog: Path, duration_s: float, linger: bool) -> subprocess.Popen[bytes]:
    """`hctx wrap` around the stand-in, in its own session so the terminal's Ctrl-C is the demo's.

    The wrapper's stderr goes to a file beside the agent's working directory: on a failure the demo
    prints it, and while `hctx top` runs nothing scribbles over the screen.
    """
    cwd = workdir(catalog, agent)  # Claude's settings are rendered here
    cwd.mkdir(parents=True, exist_ok=True)
    standin = [sys.executable, "-m", "sidecar.demo_standin", "--harness", agent.harness]
    standin += ["--duration", str(duration_s), *(["--linger"] if linger else []), agent.recording]
    argv = [
        *(sys.executable, "-m", "wrapper.cli", "wrap", "--agent", agent.identity, "--harness", agent.harness),
        *("--catalog", str(catalog), "--host", DEMO_HOST, "--", *standin),
    ]
    # The stand-ins' status lines go nowhere; a renderer that draws nothing keeps the tee quiet.
    env = os.environ | {"ST_CLAUDE_STATUSLINE_RENDERER": "true"}
    with open(cwd / WRAPPER_LOG, "wb") as stderr:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip


def workdir(catalog: Path, agent: DemoAgent) -> Path:
    return catalog / ".st2" / "demo" / agent.identity


def record_path(catalog: Path, agent: DemoAgent) -> Path:
    return catalog / AGENTS_DIR_NAME / DEMO_HOST / agent.identity / CONTEXT_RECORD_NAME


@dataclass
class Progress:
    """`--no-top`'s running commentary: one line per record as it lands (each record the sidecar
    writes, as often as it is polled), saying which agent is at what fill."""

    catalog: Path
    started: float = field(default_factory=time.monotonic)
    shown: dict[str, tuple[int | None, int]] = field(default_factory=dict)  # identity -> (writtenAtMs, compactions)

    def _clock(self) -> str:
        return f"{time.monotonic() - self.started:5.1f}s"

    def lines(self) -> list[str]:
        from wrapper.readers.render import meter_text, percent_text

        found = []
        width = max(len(agent.identity) for agent in FLEET) + len(DEMO_HOST) + 1
        for agent in FLEET:
            name = f"{DEMO_HOST}/{agent.identity}"
            claimed = record_path(self.catalog, agent).with_name(STATE_RECORD_NAME).is_file()
            if claimed and agent.identity not in self.shown:  # the wrapper claimed it: its sidecar starts
                self.shown[agent.identity] = (None, 0)
                found.append(f"{self._clock()}  {name:<{width}}  {agent.harness:<7} launched")
            try:
                record = parse_record(record_path(self.catalog, agent).read_bytes())
            except (OSError, RecordRefused):
                continue  # not written yet, or removed by a relaunch's claim
            written, compactions = self.shown.get(agent.identity, (None, 0))
            if written == record.written_at_ms:
                continue
            self.shown[agent.identity] = (record.written_at_ms, record.compactions)
            percent = "?" if record.used_percent is None else percent_text(record.used_percent)
            meter = meter_text(record)
            found.append(f"{self._clock()}  {name:<{width}}  {record.harness:<7} "
                         f"{percent:>4}  {meter:<10}  ⟳{record.compactions}"
                         f"{'  compacted' if record.compactions > compactions else ''}")  # fmt: skip
        return found


def failures(fleet: list[tuple[DemoAgent, subprocess.Popen[bytes]]], catalog: Path, *, ended: bool) -> list[str]:
    """Why each agent that went wrong did. Before the end, any exit is early; at the end, a
    non-zero exit or a session that left no record is a failure."""
    found = []
    for agent, process in fleet:
        status = process.poll()
        if status is None:
            continue
        record = record_path(catalog, agent)
        if status != 0:
            why = f"its wrapper exited with {status}"
        elif not ended:
            why = "its wrapper ended before the demo did"
        elif not record.is_file():
            why = "its session ended without writing a record"
        else:
            continue
        log = workdir(catalog, agent) / WRAPPER_LOG
        tail = log.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:] if log.is_file() else []
        found.append("\n".join([f"{DEMO_HOST}/{agent.identity}: {why}", *(f"    {line}" for line in tail)]))
    return found


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
    from sidecar.demo_standin import FleetFailed  # the demo's error, raised by its stand-ins too

    catalog = (catalog or Path(tempfile.mkdtemp(prefix="hctx-demo-"))).absolute()
    # A closed terminal or a `kill` ends the demo the way Ctrl-C does: with every process it started.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    fleet: list[tuple[DemoAgent, subprocess.Popen[bytes]]] = []

    def child_ended(signum: int, frame: object) -> None:
        if failures(fleet, catalog, ended=False):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # once: the terminal's restoration must not be cut
            raise FleetFailed

    failed_in_top = False

    async def until_a_session_fails() -> None:
        """Top's own end, under its trio loop: a handler raising there would strike trio itself."""
        nonlocal failed_in_top
        import trio

        with trio.open_signal_receiver(signal.SIGCHLD) as ended:
            while not failures(fleet, catalog, ended=False):  # also one that ended before the receiver
                await ended.__anext__()
        failed_in_top = True

    status = 0
    if not show_top:
        names = ", ".join(agent.identity for agent in FLEET)
        print(f"hctx demo: {len(FLEET)} recorded sessions ({names}), {duration_s:g} s each; "
              "every record as it lands:", flush=True)  # fmt: skip
    try:
        # Held while launching, so no wrapper can be started without being in `fleet`.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        if show_top:
            # The stand-ins linger while top runs, so any wrapper that ends before top does failed.
            signal.signal(signal.SIGCHLD, child_ended)
        fleet.extend((agent, launch(agent, catalog, duration_s, linger=show_top)) for agent in FLEET)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        if show_top:
            from wrapper.readers.top import run as run_top

            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # until_a_session_fails watches from here
            status = run_top(catalog, here=DEMO_HOST, once=False, until=until_a_session_fails)
            if failed_in_top:
                raise FleetFailed
        else:
            _play(fleet, catalog, duration_s)
    except KeyboardInterrupt:
        status = 130
    except FleetFailed:
        status = 1
    except subprocess.TimeoutExpired:
        print("hctx demo: a session did not finish in time", file=sys.stderr)
        status = 1
    finally:
        # Stopping has begun: a second Ctrl-C, SIGTERM or hang-up must not cut it short.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        problems = failures(fleet, catalog, ended=not show_top)
        stop([process for _, process in fleet])
    if problems:
        print(f"hctx demo: {len(problems)} of {len(FLEET)} agents failed:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        status = status if status == 130 else 1
    if not show_top and status != 130:
        from wrapper.readers.render import colour_enabled, render_agents
        from wrapper.readers.roster import collect_roster, now_ms

        roster = collect_roster(catalog, now_ms(), here=DEMO_HOST)
        print(f"\n{render_agents(roster.rows, colour=colour_enabled(sys.stdout))}", end="")
    print(f"catalog: {catalog}\n  hctx agents --catalog {catalog}\n  hctx doctor --catalog {catalog}")
    return status


def _play(fleet: list[tuple[DemoAgent, subprocess.Popen[bytes]]], catalog: Path, duration_s: float) -> None:
    """Wait for every session to end, printing each record as it lands."""
    progress = Progress(catalog)
    deadline = time.monotonic() + duration_s + FINISH_SLACK_S
    while any(process.poll() is None for _, process in fleet):
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired("hctx demo", duration_s + FINISH_SLACK_S)
        for line in progress.lines():
            print(line, flush=True)
        time.sleep(PROGRESS_POLL_S)
    for line in progress.lines():
        print(line, flush=True)


def _demo(args: argparse.Namespace) -> int:
    from wrapper.readers.top import has_terminal

    no_top: bool = args.no_top
    if not no_top and not has_terminal():  # piped or in CI: the run is still worth watching, as text
        print("hctx demo: no terminal on stdin and stdout for `hctx top`; playing as --no-top", file=sys.stderr)
        no_top = True
    default = DEMO_NO_TOP_S if no_top else DEMO_TOP_S
    duration: float = args.duration if args.duration is not None else default
    return run_demo(args.catalog, show_top=not no_top, duration_s=duration)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
