"""OpenCode's own install of its plugin SDK, and how the live tests (and a user offline) stay off the npm
registry (both pinned builds, `hctx setup opencode` in place, the box of tests/live/test_opencode_live.py).

At every start OpenCode installs `@opencode-ai/plugin` into its config dir from the npm registry unless
the dir holds it already, and with a plugin file there (hctx's) it waits for that install before loading
plugins: 74 s a start when the registry is unreachable (measured; see `provision_plugin_sdk`). Shown here:
the request is really made without the SDK (so the live tests' `registry_requests == []` means
something); with the SDK in place a start makes none and is not held up by a registry that refuses
connections (an offline machine: without it the start takes ~74 s); `offline=true` in the config dir's
`.npmrc` (the alternative docs/setup.md gives a user) spares that wait too. HCTX_NO_ADOPT=1 keeps the
plugin inert: the wait comes before any plugin is loaded, so it is the same, and no adopter is left to
clean up.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from sidecar.launching import free_loopback_port
from tests.fakes.opencode_model import OpenCodeFakeModel, opencode_fake_model
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_opencode_adopt_live import hctx_setup, plugin_file
from tests.live.test_opencode_live import TURN_S, Box

pytestmark = pytest.mark.live

# A start with the plugin and the SDK in place took 1.5-3.7 s here, 7.5-9.8 s with the two cores at a
# load of 8; offline without the SDK, 74 s (npm's retries, wall-clock). A liveness bound between.
START_BOUND_S = 45.0
SDK_REQUEST = "GET /@opencode-ai%2fplugin"


@pytest.fixture(params=list(HARNESS_VERSIONS["opencode"]), ids=lambda v: f"opencode-{v}")
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def plain_run(box: Box, env: dict[str, str]) -> float:
    """`opencode run` of one turn, with hctx's plugin inert: its seconds, asserted to succeed."""
    env = {**env, "HCTX_NO_ADOPT": "1"}
    start = time.monotonic()
    with (box.root / "run.out").open("wb") as out, trio.fail_after(TURN_S + 90):
        argv = [*box.command, "run", "hello [[u:1000:10]]"]
        done = await trio.run_process(argv, env=env, cwd=box.workspace, stdout=out, stderr=out, check=False)
    assert done.returncode == 0, (box.root / "run.out").read_text(errors="replace")[-2000:]
    return time.monotonic() - start


async def set_up(box: Box, fake: OpenCodeFakeModel) -> dict[str, str]:
    env = box.env(fake)
    await hctx_setup(env)
    assert plugin_file(env).is_file()
    return env


def refusing_registry() -> str:
    """A 127.0.0.1 port nobody listens on: connections refused, as on a machine without the registry."""
    return f"http://127.0.0.1:{free_loopback_port()}/"


async def test_without_its_plugin_sdk_opencode_asks_the_registry(version: str, tmp_path: Path) -> None:
    box = Box(tmp_path, version, require_harness("opencode", version), plugin_sdk=False)
    async with opencode_fake_model() as fake:
        await plain_run(box, await set_up(box, fake))
    assert SDK_REQUEST in fake.registry_requests  # npm_config_registry is honoured: the recorder hears it


async def test_with_its_plugin_sdk_in_place_opencode_starts_off_the_registry(version: str, tmp_path: Path) -> None:
    box = Box(tmp_path, version, require_harness("opencode", version))
    async with opencode_fake_model() as fake:
        env = await set_up(box, fake)
        await plain_run(box, env)
        assert fake.registry_requests == []
        seconds = await plain_run(box, {**env, "npm_config_registry": refusing_registry()})
    assert seconds < START_BOUND_S


async def test_offline_in_the_config_dirs_npmrc_spares_the_wait(version: str, tmp_path: Path) -> None:
    box = Box(tmp_path, version, require_harness("opencode", version), plugin_sdk=False)
    async with opencode_fake_model() as fake:
        env = await set_up(box, fake)
        (plugin_file(env).parent.parent / ".npmrc").write_text("offline=true\n")
        await plain_run(box, env)
        assert fake.registry_requests == []
        seconds = await plain_run(box, {**env, "npm_config_registry": refusing_registry()})
    assert seconds < START_BOUND_S
