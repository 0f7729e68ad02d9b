"""Live (issue 36): `hctx setup pi` / `hctx setup omp`, then the real harness started plainly.

Each pinned build, in an isolated HOME with its default agent directory (`~/.pi/agent`,
`~/.omp/agent`) and the user's own extension in it: `hctx setup <harness>` places hctx's loader
beside it; the harness is started with no hctx anywhere in its command (`node cli.js` / `bun cli.js
--mode rpc`) against the fake model on 127.0.0.1, and the scenario the wrapped live test runs
(tests/live/test_pi_live.py: the same turns, the same compactions, the restart with `--continue`)
is asserted on the adopted agent's record with the very same checks. Then: the agent is marked
adopted, named after its working directory; its exit marks it stopped and leaves no hctx process; a
wrapped seat in the same HOME (the extension then loaded twice) appears once, not adopted; `hctx
setup --undo` leaves the user's files byte-equal to before.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from guard.layout import AgentDir, default_host
from guard.state import read_state
from sidecar.harnesses.pi.setup import LOADER, agent_dir
from tests.fakes.pi_model import fake_model
from tests.harnesses import HARNESS_VERSIONS, require_harness
from tests.live.test_pi_live import (
    BUILDS,
    USER_EXTENSION,
    WINDOW,
    Catalog,
    Run,
    _isolated_env,
    _omp_scenario,
    _pi_scenario,
    prompt,
    wrapped,
    write_config,
)
from tests.wrapping import env as wrapping_env
from tests.wrapping import hctx

pytestmark = pytest.mark.live

GONE_TIMEOUT_S = 15
WORK = "adoptee"  # the working directory: the adopted agent's name, as `hctx wrap` names one


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hctx-piadopt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _plain_env(harness: str, version: str, home: Path, catalog: Path) -> dict[str, str]:
    """The wrapped test's isolated environment, minus PI_CODING_AGENT_DIR (the harness's default
    agent directory, the one setup finds), with hctx's catalog where the adopter will look for it."""
    env = _isolated_env(harness, version, home)
    del env["PI_CODING_AGENT_DIR"]
    runtime = home.parent / "run"
    runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    return env | {"HCTX_CATALOG": str(catalog), "XDG_RUNTIME_DIR": str(runtime)}


async def _hctx(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = await trio.run_process(
        hctx(*args), env=wrapping_env() | env, capture_stdout=True, capture_stderr=True, check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def _agents(env: dict[str, str], catalog: Path) -> list[dict[str, Any]]:
    code, out, err = await _hctx(env, "agents", "--json", "--catalog", str(catalog))
    assert code == 0, err
    listed = json.loads(out)
    return listed if isinstance(listed, list) else [listed]


def _hctx_processes(catalog: Path) -> list[int]:
    """Live processes whose environment names this test's catalog: an adopter, a resident, a sidecar."""
    needle = f"HCTX_CATALOG={catalog}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and needle in environ.split(b"\0") and b"wrapper" in cmdline + b"sidecar":
            found.append(int(entry.name))
    return found


def _user_files(agent_home: Path) -> dict[str, bytes]:
    """The user's configuration and extensions (sessions are the harness's to grow)."""
    return {
        str(path.relative_to(agent_home)): path.read_bytes()
        for path in sorted(agent_home.rglob("*"))
        if path.is_file() and "sessions" not in path.relative_to(agent_home).parts
    }


@pytest.mark.parametrize(("harness", "version"), BUILDS, ids=[f"{h}-{v}" for h, v in BUILDS])
async def test_a_plain_session_after_setup_has_the_wrapped_sessions_record(
    harness: str, version: str, short_tmp: Path
) -> None:
    command = require_harness(harness, version)
    home = short_tmp / "home"
    work = short_tmp / WORK
    work.mkdir(parents=True)
    catalog_root = short_tmp / "catalog"
    env = _plain_env(harness, version, home, catalog_root)
    agent_home = agent_dir(harness, home, {})  # type: ignore[arg-type]
    async with fake_model() as model:
        write_config(agent_home, model)
        extensions = agent_home / "extensions"
        extensions.mkdir()
        (extensions / "user-probe.ts").write_text(USER_EXTENSION)
        before = _user_files(agent_home)

        code, out, err = await _hctx(env, "setup", harness)
        assert code == 0, err + out
        loader = agent_home / LOADER
        assert loader.is_file()
        code, out, _ = await _hctx(env, "setup", harness)  # setup twice is setup once
        assert code == 0 and _user_files(agent_home) == before | {str(LOADER): loader.read_bytes()}

        catalog = Catalog(catalog_root, agent=WORK, host=default_host())
        run = Run(harness, command, env, work, catalog, adopted=True)
        with trio.fail_after(240):
            if harness == "pi":
                await _pi_scenario(run, model)
            else:
                await _omp_scenario(run, model, version)

        # Adopted, named as `hctx wrap` names it: one agent for the two plain sessions in turn.
        (agent,) = await _agents(env, catalog_root)
        assert (agent["identity"], agent["harness"], agent.get("adopted")) == (WORK, harness, True)
        claim = read_state(AgentDir(catalog_root, catalog.host, WORK))
        assert claim is not None and claim.adopted is True
        # Its exit stopped it and left nothing of hctx running.
        with trio.fail_after(GONE_TIMEOUT_S):
            while True:
                claim = read_state(AgentDir(catalog_root, catalog.host, WORK))
                if claim is not None and claim.desired_state == "stopped" and not _hctx_processes(catalog_root):
                    break
                await trio.sleep(0.2)

        # A wrapped seat in the same HOME (the loader beside `--extension`): one agent, not adopted.
        wrapped_catalog = Catalog(short_tmp / "wrapped-catalog")
        wrapped_run = Run(harness, command, env | {"HCTX_CATALOG": str(wrapped_catalog.root)}, work, wrapped_catalog)
        async with wrapped(wrapped_run, harness, "--no-session") as rpc:
            await rpc.turn(prompt("wrapped [[u:9600:320]]"))
            expected = 9920 if harness == "pi" else 9600  # each harness's own numerator, as wrapped
            await wrapped_catalog.settles(lambda r: r.used_tokens == expected, "the wrapped turn")
            (seat,) = await _agents(env, wrapped_catalog.root)
            assert "adopted" not in seat  # a wrapped agent's object is what it always was
            claim = read_state(AgentDir(wrapped_catalog.root, seat["host"], seat["identity"]))
            assert claim is not None and claim.adopted is False
        adoptions = short_tmp / "run" / f"hctx-{os.getuid()}"
        # the plain sessions' adoption dirs went with them; none was even begun for the wrapped seat
        assert not adoptions.exists() or not any(adoptions.iterdir())

    # The user's own extension loaded in every session, plain and wrapped.
    assert (home / "user-extension-loaded").read_text().count("session_start") == 3
    code, out, err = await _hctx(env, "setup", "--undo", harness)
    assert code == 0, err + out
    # (the harness writes files of its own beside them, auth.json and the like: those are its own)
    after = _user_files(agent_home)
    assert {name: after.get(name) for name in before} == before and not loader.exists()


@pytest.mark.parametrize("version", HARNESS_VERSIONS["omp"])
async def test_an_adopted_omps_subagent_rows_are_each_childs_own_reading(version: str, short_tmp: Path) -> None:
    """omp binds the extension anew to each `task` child in the same process: adopted, as wrapped
    (tests/live/test_subagents_live.py), each child's row is its own reading, the parent's never a
    child's, and the one adopter of the process serves them all."""
    from tests.live.test_subagents_live import OMP_CHILD_TOKENS, OMP_CHILDREN, omp_delegation

    command = require_harness("omp", version)
    home = short_tmp / "home"
    work = short_tmp / WORK
    work.mkdir(parents=True)
    catalog_root = short_tmp / "catalog"
    env = _plain_env("omp", version, home, catalog_root)
    async with fake_model() as model:
        write_config(agent_dir("omp", home, {}), model)
        code, out, err = await _hctx(env, "setup", "omp")
        assert code == 0, err + out
        run = Run("omp", command, env, work, Catalog(catalog_root, agent=WORK, host=default_host()), adopted=True)
        async with wrapped(run, "omp") as rpc:
            final = await omp_delegation(rpc, run.catalog)
    assert {row.id: row.used_tokens for row in final.subagents} == OMP_CHILDREN
    assert all((row.state, row.window_tokens) == ("finished", WINDOW) for row in final.subagents)
    writes = run.catalog.writes()
    assert writes and not {write["usedTokens"] for write in writes} & OMP_CHILD_TOKENS, writes
    (agent,) = await _agents(env, catalog_root)
    assert (agent["identity"], agent.get("adopted")) == (WORK, True)
