"""The product's defined surface, read from the source with `ast` (nothing imported):

- every exception hctx raises on purpose is a leaf of guard/errors.py's tree: it derives from one
  of the branches there (by what a caller does), never from a builtin directly, and lives in the
  module the tree names for it (the layer that raises it); no module raises a bare builtin error
  where the root has a class (the tee's frames excepted: they import nothing of hctx, for the tee's
  start-up);
- every module that defines public names says which in `__all__`, and each name there exists;
- no module reaches into another's private (`_`-prefixed) names.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from guard import errors
from tests.conftest import REPO

PACKAGES = ("guard", "sidecar", "wrapper")
MODULES = sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))
BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def names_of(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def tree() -> dict[str, str]:
    """Each leaf guard/errors.py's tree names, and the module it names for it."""
    found = {}
    for line in (errors.__doc__ or "").splitlines():
        words = line.replace("│", " ").replace("├──", " ").replace("└──", " ").split()
        if len(words) >= 2 and words[-1].split(".")[0] in PACKAGES and words[0].isidentifier():
            found[words[0]] = words[-1]
    return found


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


@pytest.mark.parametrize("path", MODULES, ids=names_of)
def test_exceptions_are_defined_in_one_place(path: Path) -> None:
    """Outside guard/errors.py, an exception class derives from hctx's tree, never from a builtin,
    and is the leaf the tree names in this module."""
    if path == REPO / "guard" / "errors.py":
        return
    named = tree()
    for node in ast.walk(parsed(path)):
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue  # a private class is control flow inside its module (top's quit), never raised out
        bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
        assert not bases & BUILTIN_EXCEPTIONS, f"{names_of(path)}: {node.name}"
        if bases & (set(errors.__all__) | set(named)):
            assert named.get(node.name) == dotted(path), f"{names_of(path)}: {node.name} is not in the tree here"


def test_every_leaf_of_the_tree_is_where_it_says_and_under_a_branch() -> None:
    import importlib

    branches = (errors.Refused, errors.Unavailable, errors.NotFound, errors.Unusable, errors.Held)
    assert set(tree()) >= {
        name for name in errors.__all__ if getattr(errors, name) not in (errors.HctxError, *branches)
    }
    for name, module in tree().items():
        leaf = getattr(importlib.import_module(module), name)
        assert leaf.__module__ == module and issubclass(leaf, branches), name


BARE = frozenset({"ValueError", "OSError", "LookupError", "KeyError", "TypeError"})
# Which builtin errors a module may still raise bare, and why.
BARE_RAISES_ALLOWED = {
    # Claude spawns the tee every few seconds: its frames module imports only C modules, not guard.
    REPO / "sidecar" / "harnesses" / "claude" / "frames.py": {"ValueError"},
}


def bare_raises(module: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every `raise ValueError(...)`/`raise OSError(...)` (and kin) in `module`."""
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                found.append((node.lineno, exc.id))
    return found


@pytest.mark.parametrize("path", MODULES, ids=names_of)
def test_no_bare_builtin_error_is_raised(path: Path) -> None:
    allowed = BARE_RAISES_ALLOWED.get(path, set())
    assert [(line, name) for line, name in bare_raises(parsed(path)) if name not in allowed] == []


def test_a_bare_raise_is_found() -> None:
    source = "def f():\n    raise ValueError('x')\n\ndef g():\n    raise OSError\n    raise UsageError('y')\n"
    assert bare_raises(ast.parse(source)) == [(2, "ValueError"), (5, "OSError")]


def test_every_error_derives_from_the_root_and_is_documented() -> None:
    for name in errors.__all__:
        error = getattr(errors, name)
        assert issubclass(error, errors.HctxError), name
        assert name in (errors.__doc__ or ""), f"{name} is not in guard/errors.py's tree"


def public_definitions(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    # TYPE_CHECKING = False: a stdlib-only module's annotations without importing typing (wrapper.launch.resident)
    return {name for name in names if not name.startswith("_") and name not in ("log", "logger", "TYPE_CHECKING")}


def declared(module: ast.Module) -> list[str] | None:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            assert isinstance(node.value, ast.List)
            return [element.value for element in node.value.elts if isinstance(element, ast.Constant)]
    return None


@pytest.mark.parametrize("path", [path for path in MODULES if path.name != "__main__.py"], ids=names_of)
def test_every_public_module_declares_its_names(path: Path) -> None:
    module = parsed(path)
    defined = public_definitions(module)
    exported = declared(module)
    if not defined:
        return
    assert exported is not None, f"{names_of(path)} defines {sorted(defined)} but has no __all__"
    assert defined <= set(exported), f"{names_of(path)}: __all__ leaves out {sorted(defined - set(exported))}"
    unknown = set(exported) - defined - imported(module)
    assert not unknown, f"{names_of(path)}: __all__ names what it neither defines nor imports: {sorted(unknown)}"


def imported(module: ast.Module) -> set[str]:
    """Names a module re-exports (an `__all__` may name them: a module's public face, kept)."""
    return {
        alias.asname or alias.name for node in module.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }


def test_no_module_imports_another_modules_private_names() -> None:
    crossings: list[str] = []
    for path in [*MODULES, *sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "scripts").glob("*.py"))]:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                crossings += [f"{names_of(path)}: {node.module}.{alias.name}" for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]  # fmt: skip
    assert crossings == []
