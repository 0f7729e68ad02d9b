"""Two real Syncthing daemons replicating host A's catalog to host B, driven end to end.

Run by tests/live/test_replication_live.py as root under `unshare -n` (a private network namespace
holding only loopback): `python tests/live/syncthing_pair.py WORKDIR`. It writes WORKDIR/result.json
with what it observed and leaves the asserting to the test. It stops the two daemons and the fleet
it started, and nothing else.

The scenario: both daemons are configured before their first start with every outward feature off
and only `tcp://127.0.0.1:PORT` to listen on and dial; they are paired over the REST API; on each
host docs/replication.md's block writes `<catalog>/agents/.stignore` and prints the folder
settings, with which A shares its `agents/` (sendreceive) and B receives it (receiveonly). Then a
fleet under `hctx wrap` on A: the demo's four recorded sessions, an agent whose 200 frames each land
a replacement, an agent writing one reading every 2 s (the latency probe) and an agent relaunched
by a second wrap. Meanwhile B's tree is polled: every record read is parsed, every name is noted,
and B's readers run in-process and as processes.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from guard.constants import CONTEXT_RECORD_NAME, STATE_RECORD_NAME  # noqa: E402
from guard.errors import RecordRefused  # noqa: E402
from guard.layout import log_path  # noqa: E402
from guard.record import parse_record  # noqa: E402
from guard.state import parse_state  # noqa: E402
from wrapper.demo import FLEET, stop  # noqa: E402
from wrapper.readers.roster import collect_roster, now_ms  # noqa: E402

HOST_A, HOST_B = "host-a", "host-b"
FOLDER_ID = "hctx-agents"
PORTS = {HOST_A: (22101, 28101), HOST_B: (22102, 28102)}  # (sync listen, GUI/REST), in our namespace
BURST_WRITES = 200
PULSES = 15
PULSE_GAP_S = 2.0
DEMO_DURATION_S = 6.0
TIMEOUT_S = 60.0
# For a measurement by hand only, e.g. '{"fsWatcherDelayS": 10}': folder settings over docs/replication.md's.
OVERRIDES: dict[str, Any] = json.loads(os.environ.get("HCTX_SYNCTHING_OVERRIDES", "{}"))

# Every name the replica must never hold: the writer's lock, the staging tree and its files, logs,
# a legacy writer's staging file, a Claude settings directory.
FORBIDDEN = re.compile(
    r"(^|/)(\.harness-context\.lock|\.st2|harness-context-staging|logs|\.claude)(/|$)|\.jsonl$"
    r"|\.harness-context\.tmp-|(^|/)harness-(context|state)\.[0-9]+\.[0-9a-f]+$"
)
SYNCTHING_TEMPORARY = re.compile(r"(^|/)\.syncthing\..+\.tmp$")

# A pi stand-in: sends the frames of a JSON file ([[delay_s, frame], ...]) to the channel, each once
# the record (argv[2]) holds the previous one, so that no two coalesce into one write; then stays up
# until signalled, like a harness waiting for its next prompt.
STANDIN = r"""
import json, os, signal, socket, sys, time
stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
signal.pthread_sigmask(signal.SIG_BLOCK, stops)

def landed(tokens):
    try:
        with open(sys.argv[2]) as record:
            return json.load(record)["usedTokens"] == tokens
    except (OSError, ValueError, KeyError):
        return False

for delay, frame in json.load(open(sys.argv[1])):
    time.sleep(delay)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["HCTX_CHANNEL"])
        s.sendall(json.dumps(frame).encode() + b"\n")
    deadline = time.monotonic() + 10
    while not landed(frame["reading"]["tokens"]) and time.monotonic() < deadline:
        time.sleep(0.002)
signal.sigwait(stops)
"""


def pi_frame(tokens: int, window: int) -> dict[str, Any]:
    reading = {"tokens": tokens, "contextWindow": window, "percent": tokens * 100 / window, "model": "m",
               "costUsd": None}  # fmt: skip
    return {"type": "context", "reading": reading, "compaction": None}


def hctx_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "wrapper.cli", *args]


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


# ---------------------------------------------------------------------------------------------
# The daemons


@dataclass
class Daemon:
    host: str
    home: Path
    catalog: Path
    device_id: str = ""
    api_key: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def listen(self) -> str:
        return f"tcp://127.0.0.1:{PORTS[self.host][0]}"

    @property
    def gui(self) -> str:
        return f"127.0.0.1:{PORTS[self.host][1]}"

    def generate(self) -> None:
        subprocess.run(["syncthing", "generate", f"--home={self.home}", "--no-default-folder", "--skip-port-probing"],
                       check=True, capture_output=True, env=self.env())  # fmt: skip
        path = self.home / "config.xml"
        tree = ET.parse(path)
        root = tree.getroot()
        own = root.find("device")
        gui = root.find("gui")
        options = root.find("options")
        assert own is not None and gui is not None and options is not None
        self.device_id = own.attrib["id"]
        own.attrib["name"] = self.host
        gui.attrib["tls"] = "false"
        _set(gui, "address", self.gui)
        self.api_key = _text(gui, "apikey")
        # Before the first start: nothing that reaches out, only loopback to listen on.
        for key, value in {
            "listenAddress": self.listen,
            "globalAnnounceEnabled": "false",
            "localAnnounceEnabled": "false",
            "relaysEnabled": "false",
            "natEnabled": "false",
            "urAccepted": "-1",
            "autoUpgradeIntervalH": "0",
            "crashReportingEnabled": "false",
            "startBrowser": "false",
            "announceLANAddresses": "false",
            "stunKeepaliveStartS": "0",
        }.items():
            _set(options, key, value)
        tree.write(path)

    def env(self) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.home), "STNOUPGRADE": "1", "STNODEFAULTFOLDER": "1"}

    def start(self) -> None:
        log = (self.home / "syncthing.log").open("ab")
        self.process = subprocess.Popen(
            ["syncthing", "serve", f"--home={self.home}", "--no-browser", "--no-restart", "--no-upgrade"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(), start_new_session=True,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        wait_for(lambda: self.rest("GET", "/rest/system/ping") == {"ping": "pong"}, "the REST API of " + self.host)

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{self.gui}{path}",
            data=data,
            method=method,
            headers={"X-API-Key": self.api_key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                text = response.read()
        except OSError:
            return None
        return json.loads(text) if text.strip() else {}

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def _die_with_parent() -> None:
    """In a daemon's or wrapper's child before exec: a driver killed outright (a test timeout) takes it along."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _set(parent: ET.Element, tag: str, value: str) -> None:
    element = parent.find(tag)
    if element is None:
        element = ET.SubElement(parent, tag)
    element.text = value


def _text(parent: ET.Element, tag: str) -> str:
    element = parent.find(tag)
    assert element is not None and element.text
    return element.text


def wait_for(predicate: Any, what: str, timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------------------------------
# docs/replication.md's block, run on a host


def readme_block() -> str:
    readme = (REPO / "docs" / "replication.md").read_text()
    blocks: list[str] = re.findall(r"```sh\n(.*?)```", readme, re.S)
    return next(block for block in blocks if "hctx replication syncthing" in block)


def run_readme_block(catalog: Path) -> dict[str, Any]:
    """The block with HCTX_CATALOG set, as a user runs it; what it prints is the folder settings."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block()], capture_output=True, text=True,
                            env=child_env(HCTX_CATALOG=str(catalog), PATH=path), cwd=REPO, timeout=60,
                            check=True)  # fmt: skip
    settings: dict[str, Any] = json.loads(result.stdout)
    return settings


# ---------------------------------------------------------------------------------------------
# Watching B


@dataclass
class Watch:
    catalog: Path
    names: set[str] = field(default_factory=set)
    temporaries: set[str] = field(default_factory=set)
    reads: int = 0
    torn: list[str] = field(default_factory=list)
    # (relative path, writtenAtMs or the claim's incarnation, or None for absent) -> first seen, ms
    seen: dict[tuple[str, object], int] = field(default_factory=dict)
    reader_warnings: list[str] = field(default_factory=list)
    roster_passes: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def poll_once(self) -> None:
        agents = self.catalog / "agents"
        now = now_ms()
        for directory, dirs, files in os.walk(self.catalog):
            for name in [*dirs, *files]:
                relative = os.path.relpath(os.path.join(directory, name), agents)
                self.names.add(relative)
                if SYNCTHING_TEMPORARY.search(relative):
                    self.temporaries.add(relative)
            for name in files:
                if name in (CONTEXT_RECORD_NAME, STATE_RECORD_NAME):
                    self.read(os.path.join(directory, name), name, now)
        for relative in list(self.tracked()):
            if not (agents / relative).exists():
                self.seen.setdefault((relative, None), now)

    def tracked(self) -> set[str]:
        return {path for path, version in self.seen if version is not None}

    def read(self, path: str, name: str, now: int) -> None:
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        self.reads += 1
        relative = os.path.relpath(path, self.catalog / "agents")
        try:
            version: object = (parse_record(data).written_at_ms if name == CONTEXT_RECORD_NAME
                               else parse_state(data).incarnation)  # fmt: skip
        except RecordRefused as exc:
            self.torn.append(f"{relative}: {len(data)} bytes: {str(exc)[:200]}")
            return
        self.seen.setdefault((relative, version), now)

    def roster_once(self) -> None:
        roster = collect_roster(self.catalog, now_ms(), here=HOST_B)
        self.roster_passes += 1
        self.reader_warnings.extend(roster.all_warnings())

    def run(self) -> None:
        passes = 0
        while not self.stop.is_set():
            self.poll_once()
            passes += 1
            if passes % 10 == 0:
                self.roster_once()
            time.sleep(0.005)


def reader_processes(catalog: Path, stop_event: threading.Event, out: list[dict[str, Any]]) -> None:
    """B's readers as a user runs them, over and over while Syncthing writes."""
    commands = [["agents", "--json"], ["doctor"], ["top", "--once"], ["agents"]]
    index = 0
    while not stop_event.is_set():
        command = commands[index % len(commands)]
        index += 1
        result = subprocess.run(hctx_argv(*command, "--catalog", str(catalog), "--host", HOST_B),
                                capture_output=True, text=True, env=child_env(), timeout=60)  # fmt: skip
        out.append({"command": command, "status": result.returncode, "stderr": result.stderr})


# ---------------------------------------------------------------------------------------------
# The fleet on A


def wrap(catalog: Path, identity: str, harness: str, *command: str) -> subprocess.Popen[bytes]:
    cwd = catalog / ".st2" / "work" / identity
    cwd.mkdir(parents=True, exist_ok=True)
    argv = hctx_argv("wrap", "--agent", identity, "--harness", harness, "--catalog", str(catalog),
                     "--host", HOST_A, "--", *command)  # fmt: skip
    return subprocess.Popen(argv, cwd=cwd, env=child_env(ST_CLAUDE_STATUSLINE_RENDERER="true"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent)  # fmt: skip


def standin(catalog: Path, identity: str, frames: list[tuple[float, dict[str, Any]]]) -> subprocess.Popen[bytes]:
    script = catalog / ".st2" / "work" / f"{identity}.frames.json"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(json.dumps(frames))
    record = catalog / "agents" / HOST_A / identity / CONTEXT_RECORD_NAME
    return wrap(catalog, identity, "pi", sys.executable, "-c", STANDIN, str(script), str(record))


def demo_agent(catalog: Path, index: int) -> subprocess.Popen[bytes]:
    agent = FLEET[index]
    command = [sys.executable, "-m", "sidecar.demo_standin", "--harness", agent.harness,
               "--duration", str(DEMO_DURATION_S), "--linger", agent.recording]  # fmt: skip
    return wrap(catalog, agent.identity, agent.harness, *command)


def writes_logged(catalog: Path, identity: str) -> list[dict[str, Any]]:
    path = log_path(catalog, HOST_A, identity)
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [event for event in events if event.get("event") == "write"]


def tree(catalog: Path) -> dict[str, bytes]:
    """Every file below `<catalog>/agents` with its bytes, Syncthing's own folder files left out."""
    agents = catalog / "agents"
    found = {}
    for directory, _, files in os.walk(agents):
        for name in files:
            path = Path(directory, name)
            found[str(path.relative_to(agents))] = path.read_bytes()
    return found


def percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


# ---------------------------------------------------------------------------------------------


def scenario(work: Path, result: dict[str, Any]) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    result["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    a = Daemon(HOST_A, work / "a" / "syncthing", work / "a" / "catalog")
    b = Daemon(HOST_B, work / "b" / "syncthing", work / "b" / "catalog")
    daemons = [a, b]
    fleet: list[subprocess.Popen[bytes]] = []
    watch = Watch(b.catalog)
    stop_readers = threading.Event()
    reader_runs: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    try:
        for daemon in daemons:
            daemon.generate()
        result["configured"] = {d.host: (d.home / "config.xml").read_text() for d in daemons}
        for daemon in daemons:
            daemon.start()
        result["daemon_pids"] = [d.process.pid for d in daemons if d.process]
        for daemon, peer in ((a, b), (b, a)):
            daemon.rest("POST", "/rest/config/devices", {
                "deviceID": peer.device_id, "name": peer.host, "addresses": [peer.listen],
                "autoAcceptFolders": False,
            })  # fmt: skip

        # docs/replication.md's block on each host: the .stignore in place before the folder exists.
        settings = {daemon.host: run_readme_block(daemon.catalog) | OVERRIDES for daemon in daemons}
        result["settings"] = settings[HOST_A]
        result["readme_block"] = readme_block()
        result["a_catalog"] = str(a.catalog)
        result["stignore"] = (a.catalog / "agents" / ".stignore").read_text()
        # A legacy writer's staging file on A: the ignore file must keep it home.
        (a.catalog / "agents" / HOST_A).mkdir(parents=True, exist_ok=True)
        (a.catalog / "agents" / HOST_A / ".harness-context.tmp-4242-7").write_text('{"partial": ')
        for daemon, kind in ((a, "sendreceive"), (b, "receiveonly")):
            daemon.rest("POST", "/rest/config/folders", {
                "id": FOLDER_ID, "label": "hctx agents", "path": str(daemon.catalog / "agents"), "type": kind,
                "devices": [{"deviceID": a.device_id}, {"deviceID": b.device_id}], **settings[daemon.host],
            })  # fmt: skip
        result["folder_config"] = {d.host: d.rest("GET", f"/rest/config/folders/{FOLDER_ID}") for d in daemons}
        result["devices"] = {d.host: d.rest("GET", "/rest/config/devices") for d in daemons}
        wait_for(lambda: (a.rest("GET", "/rest/system/connections") or {}).get("connections", {})
                 .get(b.device_id, {}).get("connected"), "A and B to connect")  # fmt: skip

        threads = [
            threading.Thread(target=watch.run, daemon=True),
            threading.Thread(target=reader_processes, args=(b.catalog, stop_readers, reader_runs), daemon=True),
        ]
        for thread in threads:
            thread.start()

        # The fleet on A.
        fleet += [demo_agent(a.catalog, index) for index in range(len(FLEET))]
        first = standin(a.catalog, "relaunched", [(0.0, pi_frame(12_000, 100_000))])
        fleet.append(first)
        wait_for(lambda: len(writes_logged(a.catalog, "relaunched")) == 1, "relaunched's first write on A")
        # 200 frames, each in a new 1% bucket of the window: 200 replacements of the record.
        steps = [*range(1, 101), *range(99, -1, -1)]
        fleet.append(standin(a.catalog, "burst", [(0.02, pi_frame(step * 1000, 100_000)) for step in steps]))
        demo_identities = [agent.identity for agent in FLEET]
        wait_for(lambda: len(writes_logged(a.catalog, "burst")) == BURST_WRITES, "burst's 200 writes on A")
        wait_for(lambda: all(writes_logged(a.catalog, name) for name in demo_identities), "the demo fleet's writes")
        result["burst_writes_on_a"] = len(writes_logged(a.catalog, "burst"))

        # The latency probe: one reading every PULSE_GAP_S, alone on the wire.
        pulses = [(PULSE_GAP_S, pi_frame(1000 * (step + 1), 100_000)) for step in range(PULSES)]
        fleet.append(standin(a.catalog, "pulse", pulses))
        wait_for(lambda: len(writes_logged(a.catalog, "pulse")) == PULSES, "pulse's writes on A",
                 timeout=PULSES * PULSE_GAP_S + TIMEOUT_S)  # fmt: skip

        # The relaunch: a new wrap claims the agent and removes the previous incarnation's record; the
        # new stand-in sends nothing, so the removal is what B must come to show.
        relaunch = f"{HOST_A}/relaunched/"
        wait_for(lambda: relaunch + CONTEXT_RECORD_NAME in watch.tracked(), "relaunched's first record on B")
        claim_path = a.catalog / "agents" / HOST_A / "relaunched" / STATE_RECORD_NAME
        old_incarnation = parse_state(claim_path.read_bytes()).incarnation
        stop([first])
        fleet.remove(first)
        fleet.append(standin(a.catalog, "relaunched", []))
        new_incarnation = wait_for(lambda: _new_incarnation(claim_path, old_incarnation), "the relaunch's claim on A")
        wait_for(lambda: (relaunch + STATE_RECORD_NAME, new_incarnation) in watch.seen, "the new claim on B")
        wait_for(lambda: (relaunch + CONTEXT_RECORD_NAME, None) in watch.seen, "the removal on B")
        result["relaunch"] = {
            "oldIncarnation": old_incarnation,
            "newIncarnation": new_incarnation,
            "recordOnA": (a.catalog / "agents" / relaunch / CONTEXT_RECORD_NAME).exists(),
            "recordOnB": (b.catalog / "agents" / relaunch / CONTEXT_RECORD_NAME).exists(),
            "rosterOnB": _roster_json(b.catalog, f"{HOST_A}/relaunched"),
        }

        # Converged: B holds exactly A's records, byte for byte.
        def converged() -> bool:
            records = (CONTEXT_RECORD_NAME, STATE_RECORD_NAME)
            want = {k: v for k, v in tree(a.catalog).items() if Path(k).name in records}
            have = {k: v for k, v in tree(b.catalog).items() if not k.startswith(".st")}
            return want == have

        wait_for(converged, "B to hold exactly A's records")
        result["a_roster"] = json.loads(_hctx(a.catalog, HOST_A, "agents", "--json").stdout)
        b_listed = _hctx(b.catalog, HOST_B, "agents", "--json")
        result["b_roster"] = {"stdout": json.loads(b_listed.stdout), "stderr": b_listed.stderr}
        result["b_doctor"] = _hctx(b.catalog, HOST_B, "doctor").stdout
        result["b_tree"] = sorted(tree(b.catalog))
        result["modes"] = {d.host: _modes(d.catalog) for d in daemons}
        result["folder_errors"] = {d.host: d.rest("GET", f"/rest/folder/errors?folder={FOLDER_ID}") for d in daemons}

        # Latency: each write on A (writtenAtMs) to its first sighting on B.
        def latencies(identity: str) -> list[int]:
            path = f"{HOST_A}/{identity}/{CONTEXT_RECORD_NAME}"
            return [watch.seen[(path, w["writtenAtMs"])] - w["writtenAtMs"]
                    for w in writes_logged(a.catalog, identity) if (path, w["writtenAtMs"]) in watch.seen]  # fmt: skip

        pulse = latencies("pulse")
        result["latency_ms"] = {"pulse": pulse, "median": statistics.median(pulse), "p95": percentile(pulse, 0.95),
                                "burst_versions_seen_on_b": len(latencies("burst"))}  # fmt: skip
    finally:
        watch.stop.set()
        stop_readers.set()
        for thread in threads:
            thread.join(timeout=90)
        stop(fleet)
        result["daemon_exit"] = {d.host: d.stop() for d in daemons}
        result["watch"] = {
            "names": sorted(watch.names), "temporaries": sorted(watch.temporaries), "reads": watch.reads,
            "torn": watch.torn, "forbidden": sorted(n for n in watch.names if FORBIDDEN.search(n)),
            "readerWarnings": watch.reader_warnings, "rosterPasses": watch.roster_passes,
        }  # fmt: skip
        result["reader_runs"] = reader_runs


def _new_incarnation(claim_path: Path, old: str) -> str | None:
    try:
        claim = parse_state(claim_path.read_bytes())
    except (OSError, RecordRefused):
        return None
    return claim.incarnation if claim.incarnation != old else None


def _hctx(catalog: Path, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(hctx_argv(*args, "--catalog", str(catalog), "--host", host), capture_output=True,
                          text=True, env=child_env(), timeout=60)  # fmt: skip


def _roster_json(catalog: Path, name: str) -> Any:
    return json.loads(_hctx(catalog, HOST_B, "agents", name, "--json").stdout)


def _modes(catalog: Path) -> dict[str, str]:
    agents = catalog / "agents"
    return {str(path.relative_to(agents)): oct(path.lstat().st_mode & 0o777)
            for path in sorted(agents.rglob("*")) if not path.name.startswith(".st")}  # fmt: skip


def main() -> int:
    work = Path(sys.argv[1])
    result: dict[str, Any] = {}
    status = 0
    try:
        scenario(work, result)
    except Exception as exc:  # reported to the test, which fails with it
        result["error"] = f"{type(exc).__name__}: {exc}"
        status = 1
    (work / "result.json").write_text(json.dumps(result, indent=2, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
