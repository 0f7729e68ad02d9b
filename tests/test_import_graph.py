"""The import graph of guard/, sidecar/ and wrapper/, read with `ast` (nothing is imported): no
cycle, and one ladder every import points down:

    guard <- the kernel (framing, decoders, the JSON rule, the producer contract and its held state, HarnessSpec,
             the LaunchPlan type)
          <- the harness packages (sidecar/harnesses/<name>/) <- the registry
          <- the sidecar's runtime (streams, writer, channel, logs, replay)
          <- the wrapper and the readers

A module imports only from its own rung and the rungs below it; a harness package imports no other
harness; the wrapper imports no harness module (it goes through the registry). A harness's launch
plan (`sidecar/harnesses/<name>/launch.py`) and the kernel's `sidecar.launching` are the wrapper
process's: nothing else runs an import of them (`test_only_the_wrapper_side_imports_a_launch_plan`).

Two graphs may hold no cycle: what runs at import time (module and class bodies, also inside
`if`, `try`, `with`), and what runs at all (also inside functions: a lazy import). What
`if TYPE_CHECKING:` guards never runs and is in neither, but the layering counts it too. A failure
names each cycle module by module, with the line of each import.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from tests.conftest import REPO

PACKAGES = ("guard", "sidecar", "wrapper")
HARNESSES = "sidecar.harnesses"
# The ladder, bottom first: each rung's modules, by name or `prefix.*`. Every module is on exactly
# one rung, so a new module is placed on purpose (test_every_module_is_on_one_rung).
LADDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("guard", ("guard", "guard.*")),
    ("kernel", ("sidecar", "sidecar.names", "sidecar.framing", "sidecar.decoding", "sidecar.producer", "sidecar.held",
                "sidecar.spec", "sidecar.transcripts", "sidecar.launching", "sidecar.setup_plan",
                "sidecar.setup_state", "sidecar.adoption")),
    ("harnesses", (HARNESSES, f"{HARNESSES}.*")),
    ("registry", ("sidecar.registry",)),
    ("runtime", ("sidecar.streams", "sidecar.pipeline", "sidecar.app", "sidecar.channel", "sidecar.logs",
                 "sidecar.lifeline", "sidecar.replay", "sidecar.recorder", "sidecar.redaction", "sidecar.__main__",
                 "sidecar.demo_standin")),
    ("wrapper", ("wrapper", "wrapper.*")),
)  # fmt: skip

Graph = dict[str, dict[str, int]]  # module -> imported module -> the line of the first such import
# Which imports a graph holds: at import time, at run time (lazy ones too), or any (type-only too).
Scope = Literal["import-time", "run-time", "any"]


def _matches(module: str, pattern: str) -> bool:
    return module.startswith(pattern[:-1]) if pattern.endswith(".*") else module == pattern


def rungs_of(module: str) -> list[int]:
    return [rung for rung, (_, patterns) in enumerate(LADDER) if any(_matches(module, p) for p in patterns)]


def harness_of(module: str) -> str | None:
    """`claude` for `sidecar.harnesses.claude.producer`; None outside a harness package."""
    parts = module.split(".")
    return parts[2] if module.startswith(f"{HARNESSES}.") and len(parts) > 2 else None


def module_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_CONTAINERS = (ast.stmt, ast.excepthandler, ast.match_case)


def _statements(body: list[ast.stmt], *, functions: bool, type_only: bool) -> Iterator[ast.stmt]:
    """Every statement of `body` and of the blocks inside it; a function's only with `functions`
    (it runs when called, not when imported), `if TYPE_CHECKING:`'s only with `type_only`."""
    for node in body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements([*(node.body if type_only else []), *node.orelse],
                                   functions=functions, type_only=type_only)  # fmt: skip
            continue
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not functions:
            continue
        children = [child for child in ast.iter_child_nodes(node) if isinstance(child, _CONTAINERS)]
        for child in children:
            if isinstance(child, ast.stmt):
                yield from _statements([child], functions=functions, type_only=type_only)
            else:  # an except clause or a match case: its body
                yield from _statements(child.body, functions=functions, type_only=type_only)


def _targets(module: str, node: ast.stmt) -> Iterator[str]:
    """The project modules an import statement loads."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in MODULES:
                yield alias.name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in MODULES:
                yield submodule  # `from wrapper.readers import roster`
            elif base in MODULES:
                yield base


def imports_of(module: str, source: str, scope: Scope) -> dict[str, int]:
    """The project modules `module` imports in `scope`, each with the line of its first import."""
    tree = ast.parse(source, filename=str(MODULES.get(module, module)))
    edges: dict[str, int] = {}
    for node in _statements(tree.body, functions=scope != "import-time", type_only=scope == "any"):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _targets(module, node):
                if target != module:
                    edges.setdefault(target, node.lineno)
    return edges


def import_graph(scope: Scope) -> Graph:
    return {module: imports_of(module, path.read_text(), scope) for module, path in MODULES.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module]):
                if target == start:
                    return [*paths[module], start]
                if target in component and target not in paths:
                    paths[target] = [*paths[module], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")  # Tarjan said there is one


def described(graph: Graph, cycle: list[str]) -> str:
    return (
        " -> ".join(f"{module} (line {graph[module][target]})" for module, target in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
    )


@pytest.mark.parametrize("scope", ["import-time", "run-time", "any"])
def test_no_import_cycle(scope: Scope) -> None:
    graph = import_graph(scope)
    found = [described(graph, cycle) for cycle in cycles(graph)]
    assert not found, f"import cycles ({scope}):\n  " + "\n  ".join(found)


def test_every_module_is_on_one_rung() -> None:
    misplaced = {module: [LADDER[rung][0] for rung in rungs_of(module)] for module in MODULES}
    assert {module: rungs for module, rungs in misplaced.items() if len(rungs) != 1} == {}


def crossings(graph: Graph) -> list[str]:
    """Every import that runs up the ladder, into another harness, or from the wrapper into a harness."""
    found = []
    for module, edges in sorted(graph.items()):
        (rung,) = rungs_of(module)
        for target, line in sorted(edges.items()):
            (target_rung,) = rungs_of(target)
            where = f"{module} imports {target} (line {line})"
            if target_rung > rung:
                found.append(f"{where}: {LADDER[rung][0]} may not import {LADDER[target_rung][0]}")
            elif harness_of(target) is not None and harness_of(module) not in (None, harness_of(target)):
                found.append(f"{where}: one harness package imports another")
            elif harness_of(target) is not None and module.split(".")[0] == "wrapper":
                found.append(f"{where}: the wrapper reaches a harness through the registry only")
    return found


def test_every_import_points_down_the_ladder() -> None:
    found = crossings(import_graph("any"))  # type-only imports count too
    assert not found, "imports against the ladder:\n  " + "\n  ".join(found)


def test_a_crossing_is_found_and_named() -> None:
    """Not vacuous: each rule catches the import it forbids, type-only ones included."""
    graph = {module: {} for module in MODULES} | {
        "sidecar.harnesses.codex.producer": {"sidecar.registry": 3, "sidecar.harnesses.claude.frames": 4},
        "wrapper.readers.scan": {"sidecar.harnesses.codex.producer": 5, "sidecar.registry": 6},
        "sidecar.decoding": {"sidecar.streams": 7},
    }
    assert crossings(graph) == [
        "sidecar.decoding imports sidecar.streams (line 7): kernel may not import runtime",
        "sidecar.harnesses.codex.producer imports sidecar.harnesses.claude.frames (line 4): "
        "one harness package imports another",
        "sidecar.harnesses.codex.producer imports sidecar.registry (line 3): harnesses may not import registry",
        "wrapper.readers.scan imports sidecar.harnesses.codex.producer (line 5): "
        "the wrapper reaches a harness through the registry only",
    ]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sidecar.app\n"
    typed = imports_of("sidecar.decoding", source, "any")
    assert typed == {"sidecar.app": 3}


def test_the_claude_producer_does_not_load_the_tee() -> None:
    """The tee's sockets and select stay out of the sidecar: the producer takes the frames' module."""
    graph = import_graph("run-time")
    assert "sidecar.harnesses.claude.frames" in graph["sidecar.harnesses.claude.producer"]
    assert "sidecar.harnesses.claude.tee" not in graph["sidecar.harnesses.claude.producer"]


SAMPLE = """\
from typing import TYPE_CHECKING
import guard.store
from guard import catalog
from . import render
if TYPE_CHECKING:
    from wrapper.readers.top import Screen
else:
    import wrapper.cli
try:
    from wrapper.readers.metrics import families
except ImportError:
    from wrapper.readers.watch import observe
class Lazy:
    from wrapper.readers.scan import scan
def later():
    from wrapper.readers.roster import collect_roster
    if TYPE_CHECKING:
        import wrapper.demo
"""


def test_each_scope_holds_the_imports_it_should() -> None:
    import_time = {"guard.store": 2, "guard.catalog": 3, "wrapper.readers.render": 4, "wrapper.cli": 8,
                   "wrapper.readers.metrics": 10, "wrapper.readers.watch": 12, "wrapper.readers.scan": 14}  # fmt: skip
    assert imports_of("wrapper.readers.reader_commands", SAMPLE, "import-time") == import_time
    run_time = {**import_time, "wrapper.readers.roster": 16}
    assert imports_of("wrapper.readers.reader_commands", SAMPLE, "run-time") == run_time
    assert imports_of("wrapper.readers.reader_commands", SAMPLE, "any") == {
        **run_time,
        "wrapper.readers.top": 6,
        "wrapper.demo": 18,
    }


def test_the_graph_is_the_projects() -> None:
    """Not vacuous: every package's modules are read, and known edges are found where they are."""
    assert {module.split(".")[0] for module in MODULES} == set(PACKAGES)
    import_time, run_time = import_graph("import-time"), import_graph("run-time")
    assert "guard.walk" in import_time["guard.catalog"]
    assert "wrapper.readers.roster" in import_time["wrapper.readers.render"]
    assert "wrapper.readers.top" not in import_time["wrapper.readers.reader_commands"]  # imported when `top` runs
    assert "wrapper.readers.top" in run_time["wrapper.readers.reader_commands"]


def test_a_cycle_is_found_and_named() -> None:
    graph: Graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7, "d": 1}, "d": {}}
    (cycle,) = cycles(graph)
    assert described(graph, cycle) == "a (line 3) -> b (line 5) -> c (line 7) -> a"
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_the_wrapper_and_guard_name_codex_nowhere() -> None:
    """What a harness is lives in its package, its launch plan included; the wrapper and guard reach
    it through the registry."""
    naming = sorted(
        path.relative_to(REPO).as_posix()
        for package in ("guard", "wrapper")
        for path in (REPO / package).rglob("*")
        if path.is_file() and path.suffix in {".py", ".json"} and "codex" in path.read_text().lower()
    )
    assert naming == []


# The wrapper's two rooms: launch and supervision (`hctx wrap`, its resident, the sidecars it keeps;
# the launch plans it loads sit in their harness packages) and the readers (every command that reads
# the catalog). Neither reaches the other, not even through a module of neither (the shared argument
# types, wrapper.arguments); only the command line and the demo, which run both, import both.
ROOMS: dict[str, tuple[str, ...]] = {
    "launch": ("wrapper.launch", "wrapper.launch.*"),
    "readers": ("wrapper.readers", "wrapper.readers.*"),
}
# The composition above the rooms and what both share; a new wrapper module is placed on purpose.
ABOVE_ROOMS = ("wrapper.cli", "wrapper.demo")
SHARED = ("wrapper", "wrapper.arguments", "wrapper.record")
# The readers' one door into the sidecar: the registry (what a harness is), nothing below it, and
# the registry's table of names alone (sidecar.names, which it re-exports) for a reader that must
# start without loading a spec (`hctx status`).
READERS_SIDECAR = ("sidecar.registry", "sidecar.names")


def room_of(module: str) -> str | None:
    return next((room for room, patterns in ROOMS.items() if any(_matches(module, p) for p in patterns)), None)


def room_crossings(graph: Graph) -> list[str]:
    """Each module of a room that reaches the other room (directly or through any module), and each
    reader importing the sidecar anywhere but the registry; each named with its path."""
    found = []
    for module in sorted(graph):
        room = room_of(module)
        if room is None:
            continue
        via: dict[str, list[str]] = {module: [module]}
        frontier = [module]
        while frontier:
            following = []
            for current in frontier:
                for target in sorted(graph.get(current, {})):
                    if target in via:
                        continue
                    via[target] = [*via[current], target]
                    if room_of(target) not in (None, room):
                        path = " -> ".join(via[target])
                        found.append(f"{path}: {room} may not import {room_of(target)}")
                    else:
                        following.append(target)
            frontier = following
        if room == "readers":
            for target, line in sorted(graph[module].items()):
                if target.split(".")[0] == "sidecar" and target not in READERS_SIDECAR:
                    found.append(
                        f"{module} imports {target} (line {line}): a reader reaches the sidecar by its registry"
                    )
    return found


def test_every_wrapper_module_is_in_a_room_or_above_them() -> None:
    unplaced = [
        m for m in MODULES if m.split(".")[0] == "wrapper" and room_of(m) is None and m not in ABOVE_ROOMS + SHARED
    ]
    assert unplaced == []
    assert {room_of(m) for m in MODULES} == {None, "launch", "readers"}  # not vacuous: both rooms hold modules


def test_the_rooms_import_neither_each_other_nor_the_sidecar_below_the_registry() -> None:
    found = room_crossings(import_graph("any"))  # lazy and type-only imports count too
    assert not found, "imports across the wrapper's rooms:\n  " + "\n  ".join(found)


def test_a_room_crossing_is_found_and_named() -> None:
    """Not vacuous: a reader into launch code (directly, and through a shared module), launch code into
    a reader, a reader into the sidecar's runtime; the registry is allowed."""
    graph: Graph = {module: {} for module in MODULES} | {
        "wrapper.readers.watch": {"wrapper.launch.sidecars": 3, "sidecar.logs": 4, "sidecar.registry": 5},
        "wrapper.readers.top": {"wrapper.arguments": 6},
        "wrapper.arguments": {"wrapper.launch.resident": 7},
        "wrapper.launch.launcher": {"wrapper.readers.render": 8},
    }
    assert room_crossings(graph) == [
        "wrapper.launch.launcher -> wrapper.readers.render: launch may not import readers",
        "wrapper.readers.top -> wrapper.arguments -> wrapper.launch.resident: readers may not import launch",
        "wrapper.readers.watch -> wrapper.launch.sidecars: readers may not import launch",
        "wrapper.readers.watch imports sidecar.logs (line 4): a reader reaches the sidecar by its registry",
    ]


# What only the wrapper process runs: how to launch a harness, and how `hctx setup` edits its user
# files (issue 36: a harness's `setup` module reuses its launch plan's settings).
LAUNCH_SIDE_KERNEL = ("sidecar.launching",)
# (omp shares pi's package: its setup module is named apart, `HarnessSpec.setup`)
LAUNCH_SIDE_MODULES = (["launch"], ["setup"], ["setup_omp"])


def is_launch_side(module: str) -> bool:
    """The kernel's `sidecar.launching`, each harness's launch plan and setup module: the wrapper
    process's code."""
    return module in LAUNCH_SIDE_KERNEL or (
        harness_of(module) is not None and module.split(".")[3:4] in LAUNCH_SIDE_MODULES
    )


def launch_imports(graph: Graph) -> list[str]:
    """Every run-time import of the launch side by a module that a sidecar may load: anything but
    the wrapper and the launch side itself."""
    return [
        f"{module} imports {target} (line {line}): only the wrapper's side loads a launch plan"
        for module, edges in sorted(graph.items())
        if module.split(".")[0] != "wrapper" and not is_launch_side(module)
        for target, line in sorted(edges.items())
        if is_launch_side(target)
    ]


def test_only_the_wrapper_side_imports_a_launch_plan() -> None:
    """A launch plan sits in its harness's package, beside the producer a sidecar loads, and stays
    out of the sidecar: no producer, transport, registry or runtime module imports one (the registry
    loads one, by the spec's name, only when the wrapper asks: tests/test_sidecar_imports.py)."""
    graph = import_graph("run-time")
    from sidecar.registry import BUILT_IN, spec_for

    plans = {f"{spec_for(name).package}.{spec_for(name).launch}" for name in BUILT_IN}
    setups = {f"{spec_for(name).package}.{spec_for(name).setup}" for name in BUILT_IN} & set(MODULES)
    assert "sidecar.harnesses.claude.setup" in setups
    assert {module for module in MODULES if is_launch_side(module)} == {*LAUNCH_SIDE_KERNEL, *plans, *setups}
    assert "sidecar.launching" in graph["sidecar.harnesses.claude.launch"]  # the graph sees their imports
    assert launch_imports(graph) == []
    # Not vacuous: a producer or the runtime importing one is named.
    bad = {**graph, "sidecar.harnesses.pi.producer": {"sidecar.harnesses.pi.launch": 9},
           "sidecar.app": {"sidecar.launching": 4}}  # fmt: skip
    assert launch_imports(bad) == [
        "sidecar.app imports sidecar.launching (line 4): only the wrapper's side loads a launch plan",
        "sidecar.harnesses.pi.producer imports sidecar.harnesses.pi.launch (line 9): only the wrapper's side "
        "loads a launch plan",
    ]
