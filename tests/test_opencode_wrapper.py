"""`prepare` for OpenCode: the server always listens on a loopback port the sidecar knows."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from sidecar.launching import LaunchPlan, transport_json
from sidecar.registry import prepare


def wire(prepared: LaunchPlan) -> dict[str, Any]:
    """The plan's transport config as the sidecar receives it (defaults left out)."""
    text = transport_json(prepared)
    assert text is not None
    loaded: dict[str, Any] = {
        key: value for key, value in json.loads(text).items() if key == "base_url" or key == "directory"
    }
    return loaded


def plan(*argv: str, cwd: Path = Path("/work/project")) -> LaunchPlan:
    return LaunchPlan(harness="opencode", argv=argv, cwd=cwd)


def injected_port(argv: tuple[str, ...]) -> int:
    return int(argv[argv.index("--port") + 1])


def test_serve_without_a_port_gets_a_free_loopback_port() -> None:
    prepared = prepare(plan("opencode", "serve"))
    port = injected_port(prepared.argv)
    assert prepared.argv == ("opencode", "serve", "--port", str(port), "--hostname", "127.0.0.1")
    assert wire(prepared) == {"base_url": f"http://127.0.0.1:{port}"}
    with socket.socket() as probe:  # it was free when chosen
        probe.bind(("127.0.0.1", port))


def test_the_tui_gets_a_port_too_and_its_project_directory() -> None:
    prepared = prepare(plan("/opt/bin/opencode", "sub/dir", "--model", "fake/fake-model"))
    port = injected_port(prepared.argv)
    assert prepared.argv[:4] == ("/opt/bin/opencode", "sub/dir", "--model", "fake/fake-model")
    assert wire(prepared)["base_url"] == f"http://127.0.0.1:{port}"
    assert wire(prepared)["directory"] == "/work/project/sub/dir"
    bare = prepare(plan("opencode"))
    assert "--port" in bare.argv and "directory" not in wire(bare)


@pytest.mark.parametrize(
    "argv",
    [("opencode", "serve", "--port", "4096"), ("opencode", "serve", "--port=4096"), ("opencode", "--port", "4096")],
)
def test_a_port_the_user_gave_is_kept(argv: tuple[str, ...]) -> None:
    prepared = prepare(plan(*argv))
    assert prepared.argv == argv
    assert wire(prepared)["base_url"] == "http://127.0.0.1:4096"


def test_port_zero_means_random_and_is_replaced_not_duplicated() -> None:
    for argv in (("opencode", "serve", "--port", "0", "--print-logs"), ("opencode", "serve", "--port=0")):
        prepared = prepare(plan(*argv))
        assert prepared.argv.count("--port") == 1 and "--port=0" not in prepared.argv
        port = injected_port(prepared.argv)
        assert port > 0 and wire(prepared)["base_url"] == f"http://127.0.0.1:{port}"
        assert "--print-logs" in prepared.argv or argv[-1] == "--port=0"


def test_the_users_hostname_is_kept_and_loopback_used_for_any_interface() -> None:
    wildcard = prepare(plan("opencode", "serve", "--hostname", "0.0.0.0"))
    assert wildcard.argv.count("--hostname") == 1 and wildcard.argv[3] == "0.0.0.0"
    assert wire(wildcard)["base_url"] == f"http://127.0.0.1:{injected_port(wildcard.argv)}"
    named = prepare(plan("opencode", "serve", "--hostname=10.1.2.3", "--port", "5000"))
    assert named.argv == ("opencode", "serve", "--hostname=10.1.2.3", "--port", "5000")
    assert wire(named)["base_url"] == "http://10.1.2.3:5000"


def test_injected_options_go_before_a_literal_double_dash() -> None:
    prepared = prepare(plan("opencode", "serve", "--", "extra"))
    assert prepared.argv[-2:] == ("--", "extra")
    assert "--port" in prepared.argv[:-2]


@pytest.mark.parametrize("argv", [("opencode", "run", "hello"), ("opencode", "models"), ("opencode", "attach", "x")])
def test_commands_without_a_server_of_their_own_are_left_alone(argv: tuple[str, ...]) -> None:
    assert prepare(plan(*argv)) == plan(*argv)


def test_a_launch_through_npx_or_bunx_reads_the_subcommand_after_the_package() -> None:
    served = prepare(LaunchPlan(harness="opencode", argv=("npx", "opencode-ai", "serve"), cwd=Path("/w")))
    assert served.argv[:3] == ("npx", "opencode-ai", "serve") and "--port" in served.argv
    assert "directory" not in wire(served)  # `opencode-ai` is the program, not a project path
    tui = prepare(LaunchPlan(harness="opencode", argv=("bunx", "opencode-ai"), cwd=Path("/w")))
    assert "directory" not in wire(tui) and "--port" in tui.argv
