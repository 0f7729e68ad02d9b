"""`hctx wrap --harness pi|omp` loads the shipped extension on the command line and touches nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.harnesses.pi.launch import channel_extension
from sidecar.launching import LaunchPlan
from sidecar.registry import prepare
from tests.conftest import REPO


def plan(harness: str, *argv: str) -> LaunchPlan:
    return LaunchPlan(harness=harness, argv=argv, cwd=Path("/work"), env={"KEEP": "1"})  # type: ignore[arg-type]


def test_the_extension_is_the_shipped_package_asset() -> None:
    asset = channel_extension()
    assert asset.is_file() and asset.name == "hctx-channel.ts"
    assert asset.resolve() == (REPO / "sidecar" / "harnesses" / "pi" / "hctx-channel.ts").resolve()


def test_the_asset_imports_nothing_from_either_harness() -> None:
    """One file must load in pi (jiti) and omp (bun): only runtime built-ins may be imported."""
    source = channel_extension().read_text()
    imported = re.findall(r"""^\s*import\b[^;]*?from\s+["']([^"']+)["']""", source, flags=re.M)
    assert imported and all(module.startswith("node:") for module in imported), imported
    assert "require(" not in source and "import(" not in source


@pytest.mark.parametrize("harness", ["pi", "omp"])
def test_prepare_appends_the_extension_flag_and_changes_nothing_else(harness: str) -> None:
    before = plan(harness, harness, "--mode", "rpc", "--model", "fake/fake-32k")
    after = prepare(before)
    assert after.argv == (*before.argv, "--extension", str(channel_extension()))
    assert (after.cwd, after.env, after.transport, after.tap_stdout) == (before.cwd, {"KEEP": "1"}, None, False)


def test_a_runtime_prefix_keeps_the_flag_with_the_harness_arguments() -> None:
    """`node cli.js ...`: the flag goes after the script, never between the runtime and it."""
    after = prepare(plan("pi", "/opt/node", "/opt/pi/cli.js", "-p", "hello"))
    assert after.argv[:4] == ("/opt/node", "/opt/pi/cli.js", "-p", "hello")
    assert after.argv[4:] == ("--extension", str(channel_extension()))


def test_the_flag_goes_before_an_end_of_options_marker() -> None:
    after = prepare(plan("omp", "omp", "-p", "--", "--literal prompt"))
    assert after.argv == ("omp", "-p", "--extension", str(channel_extension()), "--", "--literal prompt")


@pytest.mark.parametrize(
    "given",
    [("-e", "{asset}"), ("--extension", "{asset}"), ("--extension={asset}",)],
)
def test_a_command_that_already_loads_the_asset_is_left_alone(given: tuple[str, ...]) -> None:
    asset = str(channel_extension())
    argv = ("pi", "--mode", "rpc", *(part.format(asset=asset) for part in given))
    assert prepare(plan("pi", *argv)).argv == argv


def test_the_users_own_extension_flags_stay_and_ours_is_added() -> None:
    after = prepare(plan("pi", "pi", "-e", "/home/u/mine.ts", "--no-extensions"))
    assert after.argv[:4] == ("pi", "-e", "/home/u/mine.ts", "--no-extensions")
    assert after.argv[4:] == ("--extension", str(channel_extension()))
