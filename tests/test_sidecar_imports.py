"""A sidecar imports only what its harness needs (issue 14).

Each case starts the real sidecar (`sidecar.__main__` run as `python -m sidecar` runs it, with the
wrapper's arguments: lifeline and ready pipes, a transport config), lets its transport start against
127.0.0.1 sockets that accept and never answer, ends it through the lifeline, and reads the modules it
had loaded at exit (written by an atexit hook to an inherited pipe). The list is the whole run's, so
a library a transport loads late is in it too; each case also asserts that the modules its own
harness does need are there, so an empty or truncated list cannot pass.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from scripts.bench_sidecar import free_port, silent_listener
from tests.conftest import REPO

# Runs the sidecar's `__main__` as `-m` would; at exit writes sys.modules to the fd in argv[1].
RUNNER = """\
import atexit, os, runpy, sys
fd = int(sys.argv.pop(1))
def dump():
    os.write(fd, "\\n".join(sorted(sys.modules)).encode())
    os.close(fd)
atexit.register(dump)
runpy.run_module("sidecar", run_name="__main__", alter_sys=True)
"""

HTTP = ("httpx", "httpcore")
WEBSOCKET = ("trio_websocket", "wsproto")
NEVER = ("wrapper",)

# name -> (harness, transport kind, modules it must have loaded, top-level packages it must not have)
CASES: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "claude": ("claude", "none", (), HTTP + WEBSOCKET),
    "pi": ("pi", "none", (), HTTP + WEBSOCKET),
    "omp": ("omp", "none", (), HTTP + WEBSOCKET),
    "codex-stdio": ("codex", "channel", ("sidecar.harnesses.codex.transport",), HTTP + WEBSOCKET),
    "codex-rollout": (
        "codex",
        "rollout",
        ("sidecar.harnesses.codex.transport", "sidecar.harnesses.codex.rollout"),
        HTTP + WEBSOCKET,
    ),
    "codex-relay": ("codex", "relay", ("sidecar.harnesses.codex.transport", "trio_websocket"), HTTP),
    "opencode": ("opencode", "opencode", ("sidecar.harnesses.opencode.transport", *HTTP, "anyio"), WEBSOCKET),
}


def launch_modules(modules: Iterable[str]) -> list[str]:
    """The launch side among `modules`: the kernel's `sidecar.launching` and every harness's launch
    plan (`sidecar.harnesses.<name>.launch`), which run in the wrapper process only."""
    return sorted(
        name
        for name in modules
        if name == "sidecar.launching" or (name.startswith("sidecar.harnesses.") and name.split(".")[3:4] == ["launch"])
    )


def transport_wire(kind: str, tmp_path: Path, port: int) -> dict[str, Any]:
    if kind == "relay":
        return {"mode": "relay", "listen": f"ws://127.0.0.1:{free_port()}", "upstream": f"ws://127.0.0.1:{port}"}
    if kind == "rollout":
        (tmp_path / "codex-home").mkdir()
        return {"mode": "rollout", "codexHome": str(tmp_path / "codex-home"), "cwd": str(tmp_path),
                "startedAtMs": time.time_ns() // 10**6, "rootPid": os.getpid()}  # fmt: skip
    if kind == "channel":
        return {"mode": "channel"}
    if kind == "opencode":
        return {"base_url": f"http://127.0.0.1:{port}"}
    return {}


def read_all(fd: int, deadline: float) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        if not chunk:
            return data
        data += chunk
    raise AssertionError("the pipe was not closed in time")


def connect_once(url: str, deadline: float) -> None:
    """One connection to the relay (closed at once): its per-connection code runs, and loads what it
    loads, even if trio-websocket is imported only there."""
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError:
            assert time.monotonic() < deadline, f"the relay never listened on {url}"
            time.sleep(0.01)


def modules_of_a_sidecar(harness: str, kind: str, tmp_path: Path) -> set[str]:
    with silent_listener() as port:
        config = transport_wire(kind, tmp_path, port)
        lifeline_read, lifeline_write = os.pipe()
        ready_read, ready_write = os.pipe()
        modules_read, modules_write = os.pipe()
        argv = [sys.executable, "-c", RUNNER, str(modules_write), "--harness", harness,
                "--catalog", str(tmp_path / "catalog"), "--host", "h", "--agent", "a", "--incarnation", "i",
                "--channel", str(tmp_path / "ch"), "--lifeline-fd", str(lifeline_read),
                "--ready-fd", str(ready_write), "--transport", json.dumps(config)]  # fmt: skip
        env = os.environ | {"PYTHONPATH": str(REPO)}
        fds = (lifeline_read, ready_write, modules_write)
        process = subprocess.Popen(argv, env=env, cwd=tmp_path, pass_fds=fds, process_group=0)
        for fd in fds:
            os.close(fd)
        lifeline = [lifeline_write]  # closed once, by whichever comes first
        try:
            deadline = time.monotonic() + 30
            assert read_all(ready_read, deadline) == b"ready\n", "the sidecar never said ready"
            if kind == "relay":
                connect_once(config["listen"], deadline)
            time.sleep(0.5)  # the transport task runs beside the channel: let it start and connect
            os.close(lifeline.pop())  # the wrapper is gone: the sidecar exits, atexit writes the list
            modules = read_all(modules_read, deadline).decode().split()
            assert process.wait(timeout=10) == 0
        finally:
            for fd in (ready_read, modules_read, *lifeline):
                os.close(fd)
            if process.poll() is None:  # only the process this test started
                process.kill()
                process.wait()
    return set(modules)


@pytest.mark.parametrize("case", CASES)
def test_a_sidecar_loads_only_its_harness_libraries(case: str, tmp_path: Path) -> None:
    harness, kind, needed, unneeded = CASES[case]
    modules = modules_of_a_sidecar(harness, kind, tmp_path)
    for name in ("sidecar.app", "sidecar.channel", "trio", "pythonjsonlogger", *needed):  # the list is real
        assert name in modules, f"{case}: {name} not loaded"
    loaded = {name.split(".")[0] for name in modules}
    wrong = sorted(loaded & {*unneeded, *NEVER})
    assert not wrong, f"{case} sidecar loaded {', '.join(wrong)}"
    # A harness's launch plan lives in its package, beside what the sidecar loads, and stays out of it.
    assert launch_modules(modules) == [], f"{case} sidecar loaded its launch side"


def test_the_launch_side_is_found_by_name() -> None:
    """Not vacuous: every built-in harness's launch plan and the kernel's launch module are what
    `launch_modules` finds, and nothing else of a harness package."""
    from sidecar.registry import BUILT_IN, spec_for

    named = {f"{spec_for(name).package}.{spec_for(name).launch}" for name in BUILT_IN}
    assert all((REPO / name.replace(".", "/")).with_suffix(".py").is_file() for name in named)
    others = {"sidecar.harnesses.claude.producer", "sidecar.harnesses.codex.transport", "sidecar.app", "wrapper.cli"}
    assert launch_modules({*named, "sidecar.launching", *others}) == sorted({*named, "sidecar.launching"})


def test_the_log_line_keeps_its_shape() -> None:
    """sidecar.logs formats with python-json-logger; the lines are byte for byte the ones `hctx
    inspect` and existing logs read (the fixed fields first, the static ones, then the extras)."""
    import logging

    from sidecar.logs import json_lines

    def record(msg: object, args: tuple[object, ...] = (), level: int = logging.INFO, **extra: object) -> str:
        item = logging.LogRecord("sidecar.x", level, "/p.py", 3, msg, args, None)
        item.created, item.msecs = 1795991913.762, 762.0
        for key, value in extra.items():
            setattr(item, key, value)
        line = json_lines({"agent": "a", "host": "h"}).format(item)
        # asctime is local time: compare the rest, and the time's shape
        stamp = json.loads(line)["time"]
        assert len(stamp) == 23 and stamp[19] == ",", stamp
        return line.replace(stamp, "T")

    assert record("wrote %s", ("bucket",), event="write", reason="bucket", usedTokens=5, usedPercent=1.5,
                  droppedBy={"a": 1}) == (
        '{"time": "T", "level": "INFO", "logger": "sidecar.x", "message": "wrote bucket", "agent": "a", '
        '"host": "h", "event": "write", "reason": "bucket", "usedTokens": 5, "usedPercent": 1.5, "droppedBy": {"a": 1}}'
    )  # fmt: skip
    assert record("frame dropped: %s", ("x\u00e9\u2603",), logging.WARNING, event="frame-dropped", suppressed=3,
                  err=ValueError("bad"), b=b"\x00\xff", host="override", _private=1) == (
        '{"time": "T", "level": "WARNING", "logger": "sidecar.x", "message": "frame dropped: x\\u00e9\\u2603", '
        '"agent": "a", "host": "override", "event": "frame-dropped", "suppressed": 3, "err": "ValueError: bad", '
        '"b": "AP8="}'
    )  # fmt: skip
