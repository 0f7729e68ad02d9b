"""omp's `hctx setup` plan: the loader of pi's (`setup.py`) in omp's own agent directory. Its spec
names this module (`HarnessSpec.setup`), as both harnesses share the pi package."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sidecar.harnesses.pi.setup import setup_for
from sidecar.setup_plan import HarnessSetup

__all__ = ["setup"]


def setup(home: Path, environ: Mapping[str, str]) -> HarnessSetup:
    return setup_for("omp", home, environ)
