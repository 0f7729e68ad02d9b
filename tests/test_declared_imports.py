"""Every third-party module guard/, sidecar/ and wrapper/ import is a distribution pyproject.toml
declares as a runtime dependency: an import that works only because another package happens to pull
it in (anyio under httpx, starlette and watchfiles) breaks the day that package drops it.

Read with `ast` (nothing is imported), type-only imports included: mypy runs them in CI.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("guard", "sidecar", "wrapper")


def third_party_imports(root: Path) -> dict[str, list[str]]:
    """Top-level module -> the files (and lines) that import it, outside the stdlib and our packages."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
                        continue
                    found.setdefault(top, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def declared(pyproject: Path) -> set[str]:
    """The runtime dependencies' names, normalized (PEP 503)."""
    text = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {normalize(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]) for requirement in text}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def undeclared(root: Path) -> dict[str, list[str]]:
    """Each imported module whose distribution is not declared, with where it is imported."""
    distributions = importlib.metadata.packages_distributions()
    names = declared(root / "pyproject.toml")
    return {
        module: where
        for module, where in third_party_imports(root).items()
        if not {normalize(d) for d in distributions.get(module, [module])} & names
    }


def test_every_third_party_import_is_a_declared_dependency() -> None:
    assert undeclared(REPO) == {}


def test_an_undeclared_import_is_found_and_named(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "wrapper" / "x.py").write_text("import os\nimport trio\nfrom anyio import Event\n")
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["trio>=0.25"]\n')
    assert undeclared(tmp_path) == {"anyio": ["wrapper/x.py:3"]}
