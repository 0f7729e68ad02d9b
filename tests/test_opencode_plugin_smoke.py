"""hctx's OpenCode plugin (`sidecar/harnesses/opencode/hctx-adopt.ts`, as `hctx setup` fills it) run on
OpenCode's own embedded Bun (`BUN_BE_BUN=1`, both pinned builds), driven as OpenCode drives a plugin
(tests/fakes/opencode_plugin_driver.mjs), the adopter replaced by a recorder of its argv.

Asserted: the adopting command it starts (the harness's pid, the bridge's URL, the directory); the
bridge's event stream as the server's `/event` serves it (`server.connected` first, the events
published before any stream was open kept and sent first, then the live ones); the config pulls
answered through the plugin's client; another path refused; inert under a wrapped seat
(HCTX_CHANNEL set) or HCTX_NO_ADOPT; and a failed adopter costing the harness no wait at its exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from sidecar.harnesses.opencode.launch import adopted
from sidecar.harnesses.opencode.producer import (
    CompactionSettings,
    ConfigAnswer,
    ProvidersAnswer,
    parse_config,
    parse_providers,
)
from sidecar.harnesses.opencode.setup import plugin_source
from sidecar.launching import LaunchPlan
from tests.conftest import REPO
from tests.harnesses import PINNED_VERSIONS, require_harness

DRIVER = REPO / "tests" / "fakes" / "opencode_plugin_driver.mjs"
RECORDER = REPO / "tests" / "fakes" / "record_argv.py"
STEP_S = 30


@pytest.fixture(params=PINNED_VERSIONS["opencode"], ids=lambda v: f"opencode-{v}")
def bun(request: pytest.FixtureRequest) -> list[str]:
    return require_harness("opencode", request.param)


def filled_plugin(tmp_path: Path, command: list[str]) -> Path:
    plugin = tmp_path / "hctx-adopt.ts"
    plugin.write_bytes(plugin_source(command))
    return plugin


class Driven:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = b""

    async def line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        with trio.fail_after(STEP_S):
            while b"\n" not in self.buffer:
                chunk = await self.process.stdout.receive_some(65536)
                assert chunk, f"the driver ended early: {self.buffer!r}"
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    async def end(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        answer = await self.line()
        with trio.fail_after(STEP_S):
            await self.process.wait()
        return answer


async def drive(bun: list[str], plugin: Path, directory: Path, env: dict[str, str]) -> Driven:
    process = await trio.lowlevel.open_process(
        [*bun, str(DRIVER), str(plugin), str(directory)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "BUN_BE_BUN": "1", **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=directory,
    )
    return Driven(process)


async def recorded(path: Path) -> list[list[str]]:
    with trio.fail_after(STEP_S):
        while not path.exists() or not path.read_text().endswith("\n"):  # noqa: ASYNC110 - another process writes it
            await trio.sleep(0.05)
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_plugin_adopts_and_serves_the_event_stream(bun: list[str], tmp_path: Path) -> None:
    argv_file = tmp_path / "argv.jsonl"
    plugin = filled_plugin(tmp_path, [sys.executable, str(RECORDER), "--harness", "opencode"])
    driven = await drive(bun, plugin, tmp_path, {"RECORD_ARGV": str(argv_file)})
    try:
        assert (await driven.line()) == {"hooks": ["dispose", "event"]}
        (argv,) = await recorded(argv_file)
        assert argv[:4] == ["--harness", "opencode", "--pid", str(driven.process.pid)]
        hints = dict(
            value.split("=", 1) for flag, value in zip(argv[4::2], argv[5::2], strict=True) if flag == "--hint"
        )
        assert argv[4::2] == ["--hint", "--hint"] and set(hints) == {"url", "directory"}
        assert hints["directory"] == str(tmp_path)
        launch: LaunchPlan = adopted(driven.process.pid, tmp_path, hints)  # the hints pass hctx's own check
        assert launch.transport is not None
        url = hints["url"]
        async with httpx.AsyncClient(trust_env=False, timeout=STEP_S) as client:
            providers = await client.get(f"{url}/config/providers", params={"directory": str(tmp_path)})
            model = {"id": "fake-model", "providerID": "fake", "limit": {"context": 128000, "output": 8192}}
            assert providers.json() == {"providers": [{"id": "fake", "models": {"fake-model": model}}]}
            config = await client.get(f"{url}/config")
            assert config.json() == {"compaction": {"auto": True, "reserved": 1000}}
            # only what the sidecar reads: no provider's options (API keys), headers or anything else
            assert b"sk-secret" not in providers.content + config.content
            # and all the sidecar's decoders need
            (read,) = parse_providers(providers.content)
            assert isinstance(read, ProvidersAnswer) and read.windows == {("fake", "fake-model"): 128000}
            (settings,) = parse_config(config.content)
            assert isinstance(settings, ConfigAnswer) and settings.config is not None
            assert settings.config.compaction == CompactionSettings(auto=True, reserved=1000)
            if os.getuid() == 0:  # another local user, who read the URL off a command line, is refused
                assert await status_as_another_user(f"{url}/config") == 403
            base = url.rsplit("/", 1)[0]
            assert (await client.get(f"{base}/event")).status_code == 404  # the token is the way in
            assert (await client.get(f"{base}/not-the-token/event")).status_code == 404
            events: list[dict[str, Any]] = []
            async with client.stream("GET", f"{url}/event", params={"directory": str(tmp_path)}) as stream:
                assert stream.headers["content-type"] == "text/event-stream"
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line.removeprefix("data: ")))
                    if sum(event["type"] == "tick" for event in events) >= 3:
                        break
        types = [event["type"] for event in events]
        assert types[0] == "server.connected"
        # kept while no stream was open, then sent first, in order; then the live ones
        assert [event.get("id") for event in events[1:4]] == ["evt_1", "evt_2", "evt_3"]
        assert events[1] == {"id": "evt_1", "type": "message.updated", "properties": {"n": 1}}
        ticks = [event["properties"]["tick"] for event in events if event["type"] == "tick"]
        assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)
        done = await driven.end()
        assert done["disposed_ms"] < 2500  # nothing kept: the exit waits for nothing, not DRAIN_MS (3 s)
    finally:
        if driven.process.returncode is None:
            driven.process.kill()


async def status_as_another_user(url: str) -> int:
    """The HTTP status a GET of `url` gets from a process of uid 65534 (nobody)."""
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    print(urllib.request.urlopen({url!r}, timeout=10).status)\n"
        "except urllib.error.HTTPError as exc:\n"
        "    print(exc.code)\n"
    )
    done = await trio.run_process(
        ["python3", "-I", "-c", probe], user=65534, group=65534, extra_groups=[], capture_stdout=True, check=True
    )
    return int(done.stdout)


@pytest.mark.parametrize("guard", ["HCTX_CHANNEL", "HCTX_NO_ADOPT"])
async def test_the_plugin_is_inert_under_a_wrapped_seat(bun: list[str], tmp_path: Path, guard: str) -> None:
    """A wrapped seat (HCTX_CHANNEL) or a session kept plain (HCTX_NO_ADOPT=1): nothing started."""
    argv_file = tmp_path / "argv.jsonl"
    plugin = filled_plugin(tmp_path, [sys.executable, str(RECORDER)])
    env = {"RECORD_ARGV": str(argv_file), guard: str(tmp_path / "channel.sock") if guard == "HCTX_CHANNEL" else "1"}
    driven = await drive(bun, plugin, tmp_path, env)
    assert (await driven.line()) == {"hooks": []}
    await driven.end()
    assert not argv_file.exists()


async def test_the_shipped_asset_is_inert(bun: list[str], tmp_path: Path) -> None:
    """The asset as shipped (no command written in) adopts nothing."""
    plugin = tmp_path / "hctx-adopt.ts"
    plugin.write_bytes((REPO / "sidecar" / "harnesses" / "opencode" / "hctx-adopt.ts").read_bytes())
    driven = await drive(bun, plugin, tmp_path, {})
    assert (await driven.line()) == {"hooks": []}
    await driven.end()


@pytest.mark.parametrize("command", ["missing", "failing"])
async def test_a_failed_adopter_costs_the_exit_no_wait(bun: list[str], tmp_path: Path, command: str) -> None:
    """The events stay kept (no stream ever opens), yet dispose returns at once: the adopter is known
    to have failed (a missing interpreter, or an adopter that refused and exited non-zero)."""
    argv_file = tmp_path / "argv.jsonl"
    program = [str(tmp_path / "no-such-python")] if command == "missing" else [sys.executable, str(RECORDER)]
    plugin = filled_plugin(tmp_path, program)
    driven = await drive(bun, plugin, tmp_path, {"RECORD_ARGV": str(argv_file), "RECORD_ARGV_STATUS": "3"})
    await driven.line()
    if command == "failing":
        await recorded(argv_file)
    await trio.sleep(0.5)  # the exit (or the spawn error) reaches the plugin
    done = await driven.end()
    assert done["disposed_ms"] < 2500  # not DRAIN_MS (3 s): the adopter is known to have failed


async def test_a_running_adopter_gets_the_kept_events_before_the_exit(bun: list[str], tmp_path: Path) -> None:
    """A session shorter than the adopter's start: dispose waits (bounded) until the kept events
    are sent to the stream that opens meanwhile and the config the sidecar pulls is served."""
    argv_file = tmp_path / "argv.jsonl"
    slow = tmp_path / "slow_adopter.py"
    slow.write_text(
        "import json, os, sys, time\n"
        f"open({str(argv_file)!r}, 'a').write(json.dumps([str(os.getpid()), *sys.argv[1:]]) + '\\n')\n"
        "time.sleep(60)\n"
    )
    plugin = filled_plugin(tmp_path, [sys.executable, str(slow)])
    driven = await drive(bun, plugin, tmp_path, {})
    await driven.line()
    ((adopter, *argv),) = await recorded(argv_file)
    url = argv[argv.index("--hint") + 1].removeprefix("url=")
    try:
        await exit_while_adopting(driven, url)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(adopter), signal.SIGKILL)  # the stand-in adopter this test started


async def exit_while_adopting(driven: Driven, url: str) -> None:
    assert driven.process.stdin is not None
    await driven.process.stdin.aclose()  # the harness exits now: dispose is waiting
    events: list[str] = []
    # As the sidecar's transport does: the stream opened, then the two pulls, then the events read.
    async with (
        httpx.AsyncClient(trust_env=False, timeout=STEP_S) as client,
        client.stream("GET", f"{url}/event") as stream,
    ):
        (await client.get(f"{url}/config/providers")).raise_for_status()
        # A slow pull: the exit still waits for the config. Asserted by order, not by the driver's
        # disposed_ms (its clock starts when it next looks at its stdin, up to 100 ms late).
        with trio.move_on_after(0.6) as slow_pull:
            early = await driven.line()
        assert slow_pull.cancelled_caught, f"the exit did not wait for the config pull: {early}"
        (await client.get(f"{url}/config")).raise_for_status()
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: "))["type"])
            if "message.updated" in events and events.count("message.updated") == 3:
                break
    done = await driven.line()
    assert done["disposed_ms"] < 3000  # done before the drain's bound, DRAIN_MS
    assert events[:4] == ["server.connected", "message.updated", "message.updated", "message.updated"]
    with trio.fail_after(STEP_S):
        await driven.process.wait()
