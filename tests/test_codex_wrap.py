"""`hctx wrap --harness codex`: launch preparation, and the whole path with stand-in app-servers.

The stand-ins replay a verbatim lab capture, so these tests prove without the real binary that the
client receives exactly the bytes the app-server sent (stdio and websocket) and that the record the
sidecar writes is the one `hctx replay` computes for that capture.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.record import HarnessContext, parse_record
from sidecar.harnesses.codex.launch import MAX_CONFIG_BYTES
from sidecar.launching import LaunchPlan, transport_json
from sidecar.registry import prepare
from tests.conformance import fixture_writes
from tests.conftest import FIXTURE_ROOT
from tests.fakes.codex_client import ws_client
from tests.wrapping import agent_dir, env, wrap_argv

FIXTURES = FIXTURE_ROOT / "codex"
CAPTURE = FIXTURES / "codex-0.171.0-stdio-main.jsonl"


def wire(prepared: LaunchPlan) -> dict[str, Any]:
    """The plan's transport config as the sidecar receives it."""
    text = transport_json(prepared)
    assert text is not None
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def plan(*argv: str) -> LaunchPlan:
    return prepare(LaunchPlan(harness="codex", argv=argv, cwd=Path.cwd()))


# ---- prepare ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("codex", "app-server"),
        ("/opt/codex/bin/codex.js", "-c", "model=x", "app-server", "--listen", "stdio://"),
        ("codex", "app-server", "--stdio"),
        ("node", "/x/bin/codex.js", "app-server", "--enable", "foo"),
        ("npx", "codex", "app-server"),
    ],
)
def test_a_stdio_app_server_gets_its_stdout_tapped_and_nothing_else(argv: tuple[str, ...]) -> None:
    prepared = plan(*argv)
    assert prepared.tap_stdout is True
    assert (prepared.argv, wire(prepared), prepared.env) == (argv, {"mode": "channel"}, {})


@pytest.mark.parametrize("inline", [False, True])
def test_a_websocket_app_server_moves_to_a_private_loopback_port(inline: bool) -> None:
    listen = ["--listen=ws://127.0.0.1:4500"] if inline else ["--listen", "ws://127.0.0.1:4500"]
    prepared = plan("codex", "app-server", *listen, "--analytics-default-enabled")
    upstream = wire(prepared)["upstream"]
    assert wire(prepared)["listen"] == "ws://127.0.0.1:4500" and wire(prepared)["mode"] == "relay"
    assert upstream.startswith("ws://127.0.0.1:") and upstream != "ws://127.0.0.1:4500"
    expected = [f"--listen={upstream}"] if inline else ["--listen", upstream]
    assert prepared.argv == ("codex", "app-server", *expected, "--analytics-default-enabled")
    assert prepared.tap_stdout is False
    port = int(upstream.rsplit(":", 1)[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # free: the harness can bind it


def test_a_non_loopback_listener_keeps_its_auth_options_and_the_harness_stays_on_loopback() -> None:
    argv = ("codex", "app-server", "--listen", "ws://0.0.0.0:4500", "--ws-auth", "capability-token")
    prepared = plan(*argv)
    assert wire(prepared)["listen"] == "ws://0.0.0.0:4500"
    assert prepared.argv[3].startswith("ws://127.0.0.1:") and prepared.argv[4:] == argv[4:]


@pytest.mark.parametrize(
    "argv",
    [
        ("codex",),
        ("codex", "exec", "app-server"),
        ("codex", "fix the app-server"),
        ("codex", "fix"),
        ("codex", "--", "app-server"),
        ("codex", "-m", "app-server"),
        ("codex", "resume", "--last"),
    ],
)
def test_an_interactive_seat_follows_its_rollout(argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEX_HOME", "/somewhere/codex-home")
    before = time.time_ns() // 1_000_000
    prepared = plan(*argv)
    assert (prepared.argv, prepared.tap_stdout) == (argv, False)
    transport = wire(prepared)
    started = transport.pop("startedAtMs")
    assert transport == {
        "mode": "rollout", "codexHome": "/somewhere/codex-home", "cwd": str(Path.cwd()),
        "rootPid": os.getpid(),  # the wrapper: the harness it launches is its child
    }  # fmt: skip
    assert before <= started <= time.time_ns() // 1_000_000


@pytest.mark.parametrize(
    "argv",
    [
        ("codex", "app-server", "generate-ts", "--out", "x"),
        ("codex", "app-server", "--listen", "unix://"),
        ("codex", "app-server", "--listen", "off"),
        ("codex", "login"),
        ("codex", "mcp", "list"),
        ("python", "tool.py"),
    ],
)
def test_launches_without_a_readable_stream_are_left_alone(argv: tuple[str, ...]) -> None:
    prepared = plan(*argv)
    assert prepared == LaunchPlan(harness="codex", argv=argv, cwd=prepared.cwd)


# ---- the whole path, stand-in app-servers -----------------------------------------------------------


STDIO_STANDIN = r"""
import sys
sys.stdout.buffer.write(open(sys.argv[1], "rb").read())
sys.stdout.buffer.flush()
"""

WS_STANDIN = r"""
import os, sys, trio, trio_websocket
capture, listen = sys.argv[1], sys.argv[sys.argv.index("--listen") + 1]
host, port = listen.removeprefix("ws://").rsplit(":", 1)
lines = open(capture, "rb").read().decode().splitlines()

async def serve(request):
    connection = await request.accept()
    for line in lines:
        await connection.send_message(line)
    try:
        while (message := await connection.get_message()) != "quit":
            await connection.send_message(message)
    except trio_websocket.ConnectionClosed:
        return
    os._exit(0)

trio.run(trio_websocket.serve_websocket, serve, host, int(port), None)
"""


def expected_last_record() -> HarnessContext:
    return fixture_writes("codex", "codex/codex-0.171.0-stdio-main.rec")[-1].record


def assert_same_reading(record: HarnessContext, expected: HarnessContext) -> None:
    # Times are each run's own: rateLimitsAtMs is when the limits arrived, as observedAtMs is a reading's.
    keep = {"observed_at_ms", "written_at_ms", "last_compaction_ms", "rate_limits_at_ms", "agent", "incarnation"}
    assert record.model_dump(exclude=keep) == expected.model_dump(exclude=keep)
    assert (record.used_percent, record.compactions, record.session_total_tokens) == (4, 2, 605_450)


def test_stdio_stdout_is_copied_byte_for_byte_and_the_record_is_the_replayed_one(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    argv = wrap_argv(catalog, "cx", "codex", sys.executable, "-c", STDIO_STANDIN, str(CAPTURE), "app-server")
    result = subprocess.run(argv, env=env(), capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout == CAPTURE.read_bytes()
    record = parse_record((agent_dir(catalog, "cx") / "harness-context").read_bytes())
    assert_same_reading(record, expected_last_record())


async def test_websocket_client_gets_the_app_servers_bytes_and_the_record_is_the_replayed_one(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listen = f"ws://127.0.0.1:{port}"
    command = (sys.executable, "-c", WS_STANDIN, str(CAPTURE), "app-server", "--listen", listen)
    argv = wrap_argv(catalog, "cx", "codex", *command)
    expected_lines = CAPTURE.read_bytes().decode().splitlines()
    async with trio.open_nursery() as nursery:
        run = partial(trio.run_process, argv, env=env(), stdin=subprocess.DEVNULL, capture_stderr=True, check=False)
        process = await nursery.start(run)
        with trio.fail_after(30):
            async with ws_client(listen) as client:
                await client.wait_for(lambda messages: len(messages) >= len(expected_lines))
                await client.send({"method": "echo", "params": {"text": "héllo ✓"}})
                await client.wait_for(lambda messages: messages[-1].get("method") == "echo")
                await client.send_raw("quit")
            await process.wait()
    assert process.returncode == 0
    assert client.raw[: len(expected_lines)] == expected_lines  # byte-identical, in order
    assert client.raw[-1] == client.sent[0]
    record = parse_record((agent_dir(catalog, "cx") / "harness-context").read_bytes())
    assert_same_reading(record, await trio.to_thread.run_sync(expected_last_record))
    assert json.loads(expected_lines[-1])  # the capture ends on a complete frame


# --- the compaction settings handed to the producer (issue 18) --------------------------------------


def _plan(codex_home: Path, *argv: str) -> LaunchPlan:
    return prepare(
        LaunchPlan(harness="codex", argv=("codex", *argv), cwd=codex_home, env={"CODEX_HOME": str(codex_home)})
    )


def test_the_compaction_settings_come_from_the_layer_codex_loads_last(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        'model_auto_compact_token_limit = 160000\nmodel_context_window = 200000\nprofile = "small"\n'
        "[profiles.small]\nmodel_auto_compact_token_limit = 120000\n"
        "[profiles.big]\nmodel_auto_compact_token_limit = 170000\nmodel_context_window = 400000\n"
    )

    def settings(*argv: str) -> dict[str, object]:
        transport = wire(_plan(tmp_path, *argv))
        return {key: transport.get(key) for key in ("autoCompactTokenLimit", "modelContextWindow")}

    # the file's own profile, then `--profile`, then `-c` over everything; every mode carries them
    assert settings("app-server") == {"autoCompactTokenLimit": 120_000, "modelContextWindow": 200_000}
    assert settings("-p", "big", "app-server") == {"autoCompactTokenLimit": 170_000, "modelContextWindow": 400_000}
    assert settings("app-server", "-c", "model_auto_compact_token_limit=100000") == {
        "autoCompactTokenLimit": 100_000, "modelContextWindow": 200_000,
    }  # fmt: skip
    assert settings("app-server", "--listen", "ws://127.0.0.1:1")["autoCompactTokenLimit"] == 120_000
    assert settings("exec", "hi")["autoCompactTokenLimit"] == 120_000  # the rollout follower's too
    # a value Codex would not take as a count is not handed over as one
    assert settings("app-server", "-c", 'model_auto_compact_token_limit="x"')["autoCompactTokenLimit"] is None


@pytest.mark.parametrize("kind", ["fifo", "huge", "directory", "not-utf8"])
def test_a_config_that_is_no_readable_toml_hands_over_nothing_and_never_hangs(tmp_path: Path, kind: str) -> None:
    config = tmp_path / "config.toml"
    if kind == "fifo":
        os.mkfifo(config)  # a plain open() blocks here forever, with no writer
    elif kind == "huge":
        config.write_bytes(b"model_auto_compact_token_limit = 160000\n" + b"#" * (MAX_CONFIG_BYTES + 1))
    elif kind == "directory":
        config.mkdir()
    else:
        config.write_bytes(b"model_auto_compact_token_limit = 160000\n# \xff\n")
    outcome: list[dict[str, object]] = []
    reader = threading.Thread(target=lambda: outcome.append(wire(_plan(tmp_path, "app-server"))), daemon=True)
    reader.start()
    reader.join(10)
    assert outcome, f"reading a {kind} config.toml did not return"
    assert "autoCompactTokenLimit" not in outcome[0]


def test_a_symlinked_config_is_the_users_own_file_and_is_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "dotfiles" / "codex.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("model_auto_compact_token_limit = 150000\n")
    (tmp_path / "config.toml").symlink_to(elsewhere)
    assert wire(_plan(tmp_path, "app-server"))["autoCompactTokenLimit"] == 150_000


def test_no_config_file_hands_over_nothing(tmp_path: Path) -> None:
    transport = wire(_plan(tmp_path, "app-server"))
    assert "autoCompactTokenLimit" not in transport and "modelContextWindow" not in transport
