"""The pi/omp extension's adopting path (issue 36), run by the real loaders outside the harness.

`hctx setup` places a loader (sidecar/harnesses/pi/setup.py) that imports the shipped
`hctx-channel.ts` and calls its `adopt`. Driven here as pi (jiti on node 22) and omp (bun) load it,
with the driver of tests/test_pi_extension_smoke.py: in a session without $HCTX_CHANNEL it starts the
adopter once, for its own process, and reports to the channel `sidecar.adoption` names for that
process, the frames sent before that sidecar listens kept in order; under `hctx wrap` (the extension
loaded twice: `--extension`, and through the loader) it starts nothing and every frame arrives once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.adoption import ADOPT_ENV_GUARDS, adoption_channel, process_start_ticks
from sidecar.harnesses.pi.setup import loader_source
from tests.conftest import REPO
from tests.fakes.pi_channel import recording_channel
from tests.harnesses import harness_prefix, require_harness
from wrapper.launch.adopt import make_adoption_dir

ASSET = REPO / "sidecar" / "harnesses" / "pi" / "hctx-channel.ts"
DRIVER = REPO / "tests" / "fakes" / "pi_extension_driver.mjs"
PATHS = REPO / "tests" / "fakes" / "pi_adoption_paths.mjs"
FAKE_ADOPTER = REPO / "tests" / "fakes" / "pi_adopter.py"
RUN_TIMEOUT_S = 30
# (loader, the build whose runtime/loader runs it, the host the extension then names)
LOADERS = [("jiti", "pi", "0.84.2"), ("jiti", "pi", "1.6.0"), ("bun", "omp", "18.1.16"), ("bun", "omp", "18.2.3")]
IDS = [f"{harness}-{version}" for _, harness, version in LOADERS]
# The events the driver's populated pi script sends, as the wrapped path sends them (the smoke test's).
PI_EVENTS = [
    "session_start", "message_end", "message_end", "turn_end", "agent_end", "agent_settled",
    "session_compact", "message_end", "turn_end", "agent_end", "session_start", "session_stop",
]  # fmt: skip


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can exceed that."""
    path = Path(tempfile.mkdtemp(prefix="hctx-pa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _runtime(loader: str, harness: str, version: str) -> tuple[str, list[str]]:
    """The runtime and, for jiti, the trailing argument naming pi's own jiti."""
    runtime = require_harness(harness, version)[0]
    if loader == "bun":
        return runtime, []
    jiti = harness_prefix(harness, version) / "node_modules" / "jiti" / "lib" / "jiti.mjs"
    if not jiti.is_file():
        pytest.fail(f"pi {version} no longer ships jiti at {jiti}; its extension loader moved")
    return runtime, [os.fspath(jiti)]


def _adopting_loader(directory: Path, asset: Path = ASSET, adopter: str = os.fspath(FAKE_ADOPTER)) -> Path:
    """The loader setup writes, its adopting commands running the stand-in adopter."""
    commands = {host: [sys.executable, adopter, "--harness", host] for host in ("pi", "omp")}
    loader = directory / "hctx-adopt.ts"
    loader.write_bytes(loader_source(asset, commands))
    return loader


def _env(directory: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "HCTX_CHANNEL"}
    return env | {"HCTX_FAKE_ADOPTER_LOG": os.fspath(directory / "adopter.log")} | extra


def _adoptions(directory: Path) -> list[list[str]]:
    log = directory / "adopter.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _summary(stdout: bytes) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    assert "fatal" not in summary, summary.get("fatal")
    return summary


@pytest.mark.parametrize(("loader", "harness", "version"), LOADERS, ids=IDS)
async def test_a_plain_session_starts_its_adopter_once_and_reports_to_the_adoption_channel(
    loader: str, harness: str, version: str, short_dir: Path
) -> None:
    runtime, jiti = _runtime(loader, harness, version)
    argv = [runtime, os.fspath(DRIVER), os.fspath(_adopting_loader(short_dir)), "populated", "pi", *jiti]
    # The driver lingers after its last event until the test is done with it: the stand-in sidecar
    # comes up while it runs.
    done = short_dir / "done"
    env = _env(short_dir, HCTX_DRIVER_LINGER_UNTIL=os.fspath(done))
    process = await trio.lowlevel.open_process(argv, env=env, cwd=short_dir, stdout=subprocess.PIPE)
    try:
        with trio.fail_after(RUN_TIMEOUT_S):
            while True:
                if _adoptions(short_dir):
                    break
                await trio.sleep(0.02)
        ticks = process_start_ticks(process.pid)
        assert ticks is not None
        # Late, as an adoption's sidecar is: the driver's summary line comes once every event was
        # fired, so the extension has sent all its frames (into its queue) by then.
        assert process.stdout is not None
        with trio.fail_after(RUN_TIMEOUT_S):
            output = b""
            while not output.endswith(b"\n"):
                chunk = await process.stdout.receive_some()
                assert chunk, f"the driver's stdout closed before its summary line: {output!r}"
                output += chunk
        assert _summary(output)["threw"] == []
        make_adoption_dir(process.pid, ticks)
        channel_path = Path(adoption_channel(process.pid, ticks))
        async with recording_channel(channel_path) as recording:
            await recording.wait_for(lambda frame: frame["event"] == "session_stop", RUN_TIMEOUT_S)
        done.touch()
        with trio.fail_after(RUN_TIMEOUT_S):
            result = await process.wait()
    finally:
        process.kill()
    assert result == 0
    (adoption,) = _adoptions(short_dir)  # the script's second session_start (/new) starts none
    host = "omp" if loader == "bun" else "pi"  # the driver has no host package: the runtime tells
    assert adoption == [
        "--harness",
        host,
        "--pid",
        str(process.pid),
        "--cwd",
        os.fspath(short_dir),
        "--hint",
        f"harness={host}",
    ]
    # Every frame, the ones queued before the channel listened first and in order, exactly once.
    assert [frame["event"] for _, frame in recording.frames] == PI_EVENTS
    assert recording.frames[3][1]["reading"]["tokens"] == 16480


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]], ids=[IDS[0], IDS[2]])
async def test_a_wrapped_seat_that_loads_the_extension_twice_reports_once_and_adopts_nothing(
    loader: str, harness: str, version: str, short_dir: Path
) -> None:
    """`hctx wrap`'s `--extension` and the user-level loader both load: $HCTX_CHANNEL set, `adopt`
    stays out, the wrapped default export reports, each event once."""
    runtime, jiti = _runtime(loader, harness, version)
    both = short_dir / "both.ts"
    both.write_text(
        f"import channel from {json.dumps(os.fspath(ASSET))};\n"
        f"import adoptLoader from {json.dumps(os.fspath(_adopting_loader(short_dir)))};\n"
        "export default async function (pi: any) {\n\tchannel(pi);\n\tawait adoptLoader(pi);\n}\n"
    )
    channel_path = short_dir / "wrapped.sock"
    env = _env(short_dir, HCTX_CHANNEL=os.fspath(channel_path))
    async with recording_channel(channel_path) as recording:
        with trio.fail_after(RUN_TIMEOUT_S):
            result = await trio.run_process(
                [runtime, os.fspath(DRIVER), os.fspath(both), "populated", "pi", *jiti],
                env=env, capture_stdout=True, capture_stderr=True,
            )  # fmt: skip
        await trio.sleep(0.05)
    assert _summary(result.stdout)["threw"] == [] and result.stderr == b""
    assert [frame["event"] for _, frame in recording.frames] == PI_EVENTS
    assert _adoptions(short_dir) == []


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]], ids=[IDS[0], IDS[2]])
async def test_every_binding_in_a_process_shares_one_socket(
    loader: str, harness: str, version: str, short_dir: Path
) -> None:
    """omp binds the extension anew to each `task` child: all of a process's bindings write to one
    socket, so a child's frames and the parent's `async-result` naming it finished keep their order."""
    runtime, jiti = _runtime(loader, harness, version)
    twice = short_dir / "twice.ts"
    twice.write_text(
        f"import channel from {json.dumps(os.fspath(ASSET))};\n"
        "export default function (pi: any) {\n\tchannel(pi);\n\tchannel(pi);\n}\n"
    )
    channel_path = short_dir / "wrapped.sock"
    async with recording_channel(channel_path) as recording:
        with trio.fail_after(RUN_TIMEOUT_S):
            result = await trio.run_process(
                [runtime, os.fspath(DRIVER), os.fspath(twice), "populated", "pi", *jiti],
                env=_env(short_dir, HCTX_CHANNEL=os.fspath(channel_path)), capture_stdout=True,
            )  # fmt: skip
        await trio.sleep(0.05)
    assert _summary(result.stdout)["threw"] == []
    events = [frame["event"] for _, frame in recording.frames]
    assert events == [event for event in PI_EVENTS for _ in range(2)]  # both bindings report, in order
    assert recording.connections == 1


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]], ids=[IDS[0], IDS[2]])
@pytest.mark.parametrize("gone", ["adopter", "extension"])
async def test_hctx_moved_away_never_breaks_the_session(
    loader: str, harness: str, version: str, gone: str, short_dir: Path
) -> None:
    """The interpreter in the loader's command, or the extension it imports, no longer exists: every
    handler returns, nothing on the harness's screen, and nobody is listening so nothing arrives."""
    runtime, jiti = _runtime(loader, harness, version)
    missing = os.fspath(short_dir / "uninstalled" / "hctx-channel.ts")
    loader_file = (
        _adopting_loader(short_dir, adopter=os.fspath(short_dir / "no-such-python"))
        if gone == "adopter"
        else _adopting_loader(short_dir, asset=Path(missing))
    )
    with trio.fail_after(RUN_TIMEOUT_S):
        result = await trio.run_process(
            [runtime, os.fspath(DRIVER), os.fspath(loader_file), "populated", "pi", *jiti],
            env=_env(short_dir), capture_stdout=True, capture_stderr=True,
        )  # fmt: skip
    summary = _summary(result.stdout)
    assert summary["threw"] == [] and result.stderr == b""
    # Without the extension the loader registers nothing; with it, every handler is in place.
    assert (summary["registered"] == []) == (gone == "extension")
    assert _adoptions(short_dir) == []


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]], ids=[IDS[0], IDS[2]])
async def test_a_session_kept_plain_is_left_alone(loader: str, harness: str, version: str, short_dir: Path) -> None:
    """HCTX_NO_ADOPT (one of sidecar.adoption's guards beside HCTX_CHANNEL): no adopter, no handler."""
    assert set(ADOPT_ENV_GUARDS) == {"HCTX_CHANNEL", "HCTX_NO_ADOPT"}  # the list the extension mirrors
    runtime, jiti = _runtime(loader, harness, version)
    argv = [runtime, os.fspath(DRIVER), os.fspath(_adopting_loader(short_dir)), "populated", "pi", *jiti]
    with trio.fail_after(RUN_TIMEOUT_S):
        result = await trio.run_process(
            argv, env=_env(short_dir, HCTX_NO_ADOPT="1"), capture_stdout=True, capture_stderr=True
        )
    assert _summary(result.stdout) == {"registered": [], "threw": []} and result.stderr == b""
    assert _adoptions(short_dir) == []


@pytest.mark.parametrize(("loader", "harness", "version"), [LOADERS[0], LOADERS[2]], ids=[IDS[0], IDS[2]])
async def test_the_extension_names_the_channel_sidecar_adoption_names(
    loader: str, harness: str, version: str, short_dir: Path
) -> None:
    """The TypeScript and the Python compute one path for one process, whatever $XDG_RUNTIME_DIR holds."""
    runtime, jiti = _runtime(loader, harness, version)
    runtime_dir = short_dir / "run"
    runtime_dir.mkdir()
    envs: list[dict[str, str]] = [
        {}, {"XDG_RUNTIME_DIR": os.fspath(runtime_dir)}, {"XDG_RUNTIME_DIR": f"{runtime_dir}//"},
        {"XDG_RUNTIME_DIR": "relative/run"}, {"XDG_RUNTIME_DIR": os.fspath(short_dir / "absent")},
        {"XDG_RUNTIME_DIR": ""},
    ]  # fmt: skip
    pid = os.getpid()
    with trio.fail_after(RUN_TIMEOUT_S):
        result = await trio.run_process(
            [runtime, os.fspath(PATHS), os.fspath(ASSET), str(pid), json.dumps(envs), *jiti], capture_stdout=True
        )
    computed = json.loads(result.stdout)
    ticks = process_start_ticks(pid)
    assert ticks is not None and computed["ticks"] == ticks and computed["gone"] is None
    expected = [
        adoption_channel(pid, ticks, {key.encode(): value.encode() for key, value in env.items()}) for env in envs
    ]
    assert computed["channels"] == expected
    assert len(set(expected)) == 2  # the runtime dir (however spelled) and /tmp: both ways exercised
