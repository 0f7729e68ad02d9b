"""Live, issue 19 point 3: the real pi and omp under `hctx wrap` name their own build in the record.

Neither extension API exposes the host's version; hctx's extension reads the `version` of the
package.json above the running CLI (what both harnesses' own `VERSION` export is), and sends it as
an additive frame key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.pi_model import fake_model
from tests.harnesses import require_harness
from tests.live.test_pi_live import BUILDS, Catalog, Run, _isolated_env, prompt, short_tmp, wrapped, write_config

pytestmark = pytest.mark.live
__all__ = ["short_tmp"]  # the fixture


@pytest.mark.parametrize(("harness", "version"), BUILDS, ids=[f"{h}-{v}" for h, v in BUILDS])
async def test_the_record_names_the_hosts_build(harness: str, version: str, short_tmp: Path) -> None:
    command = require_harness(harness, version)
    home, work = short_tmp / "home", short_tmp / "work"
    work.mkdir(parents=True)
    catalog = Catalog(short_tmp / "catalog")
    async with fake_model() as model:
        write_config(home / "agent", model)
        run = Run(harness, command, _isolated_env(harness, version, home), work, catalog)
        async with wrapped(run, harness) as rpc:
            await rpc.turn(prompt("turn1 [[u:9600:320]]"))
            record = await catalog.settles(lambda r: r.used_tokens in (9600, 9920), "turn1")
    assert (record.harness, record.harness_version) == (harness, version)
