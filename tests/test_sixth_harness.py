"""A sixth harness is one folder, its launch plan included, and one line in the registry.

`tests/sixth_harness/` defines one entirely outside the product (docs/sixth-harness.md is the
recipe it follows): its spec module and its launch plan, side by side in its package (the spec names
`launch` inside it), and its registry line, an entry point in the
`hctx.harnesses` group (a dist-info under `registered/`, as an installed plugin would have). Nothing
under guard/, sidecar/ or wrapper/ names it, and yet `hctx replay`, `hctx wrap` with its real
sidecar, the readers and the conformance properties all take it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.record import ContextFields
from sidecar import registry
from sidecar.registry import harness_names, spec_for
from sidecar.replay import replay_recording
from tests.conformance import bytewise, chunks_of, outcome, replayed
from tests.conftest import REPO
from tests.wrapping import HOST, agent_dir, hctx, log_events, wrap_argv

SIXTH = REPO / "tests" / "sixth_harness"
REGISTERED = SIXTH / "registered"
SESSION = SIXTH / "session.rec"  # a recording of its channel, as `hctx wrap --record` writes one
PRODUCT = ("guard", "sidecar", "wrapper")


def sixth_env() -> dict[str, str]:
    """The suite's environment with the sixth harness installed (its dist-info on the path)."""
    path = os.pathsep.join([str(REPO), str(REGISTERED)])
    return os.environ | {"PYTHONPATH": path, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The sixth harness registered in this process, and gone again afterwards."""
    monkeypatch.syspath_prepend(str(REGISTERED))
    registry.rescan()
    yield
    monkeypatch.undo()
    registry.rescan()


def test_nothing_in_the_product_names_the_sixth_harness() -> None:
    for root in PRODUCT:
        for path in (REPO / root).rglob("*.py"):
            text = path.read_text()
            assert '"sixth"' not in text and "'sixth'" not in text and "import tests" not in text, path


def test_the_registry_finds_it_by_its_entry_point_and_the_built_ins_first(installed: None) -> None:
    assert harness_names() == (*registry.BUILT_IN, "sixth")
    spec = spec_for("sixth")
    assert spec.name == "sixth" and f"{spec.package}.{spec.launch}" == "tests.sixth_harness.launch"


def test_its_session_replays_through_the_shared_decoder_and_guard(installed: None) -> None:
    spec = spec_for("sixth")
    writes = replay_recording(spec, SESSION)[0]
    assert [(write.reason, write.record.used_tokens, write.record.compactions) for write in writes] == [
        ("bucket", 1000, 0), ("bucket", 40000, 0), ("bucket", 90000, 0), ("compaction", 90000, 1), ("bucket", 12000, 1),
    ]  # fmt: skip
    assert writes[2].record.used_percent == 90.0 and writes[2].record.used_percent != 0.9
    # The shared properties hold for it as for the built-ins: a byte at a time, the same writes.
    chunks = chunks_of(SESSION)
    assert [outcome(write) for write in replayed(spec, bytewise(chunks))] == [outcome(write) for write in writes]


def test_the_write_after_a_compaction_keeps_when_it_was(installed: None) -> None:
    """The template keeps every field: a reading after the compaction still says when it was."""
    writes = replay_recording(spec_for("sixth"), SESSION)[0]
    compaction, after = writes[3], writes[4]
    assert compaction.reason == "compaction" and compaction.record.last_compaction_ms is not None
    assert (after.record.compactions, after.record.last_compaction_ms) == (1, compaction.record.last_compaction_ms)
    assert all(write.record.last_compaction_ms is None for write in writes[:3])  # none before it


def test_the_template_keeps_every_field_a_new_reading_does_not_measure(installed: None) -> None:
    """Every field of the reading the compaction wrote stays on the next write but what that
    reading measured anew (its usage and its time): the kernel holds them, the template forgets none."""
    writes = replay_recording(spec_for("sixth"), SESSION)[0]
    compaction, after = writes[3].record, writes[4].record
    measured = {"used_tokens", "window_tokens", "used_percent", "observed_at_ms"}
    kept = set(ContextFields.model_fields) - measured
    assert {name: getattr(after, name) for name in kept} == {name: getattr(compaction, name) for name in kept}
    assert (after.compactions, after.last_compaction_trigger) == (1, "unknown")  # it names no trigger
    assert (after.used_tokens, after.observed_at_ms) != (compaction.used_tokens, compaction.observed_at_ms)


def test_hctx_replay_takes_it_as_installed() -> None:
    done = subprocess.run(
        hctx("replay", "--harness", "sixth", str(SESSION)), env=sixth_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["reason"], line["usedTokens"]) for line in lines][-2:] == [("compaction", 90000), ("bucket", 12000)]
    assert {line["harness"] for line in lines} == {"sixth"}


def test_without_its_registry_line_it_is_unknown_and_said_so() -> None:
    done = subprocess.run(
        hctx("replay", "--harness", "sixth", str(SESSION)),
        env=sixth_env() | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "no harness 'sixth'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("told", [True, False], ids=["--harness", "inferred"])
def test_hctx_wrap_runs_its_agent_with_a_real_sidecar_and_the_readers_show_it(tmp_path: Path, told: bool) -> None:
    catalog = tmp_path / "catalog"
    program = tmp_path / "bin" / "sixth-agent"  # the name the spec's `programs` lists
    program.parent.mkdir()
    program.write_text(f"#!{sys.executable}\n" + (SIXTH / "agent.py").read_text())
    program.chmod(0o755)
    argv = wrap_argv(catalog, "six", "sixth", str(program))
    if not told:
        argv.remove("--harness")
        argv.remove("sixth")
    done = subprocess.run(argv, env=sixth_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sixth agent done" in done.stdout
    record = json.loads((agent_dir(catalog, "six") / "harness-context").read_text())
    assert (record["harness"], record["usedTokens"], record["windowTokens"], record["compactions"]) == (
        "sixth", 12000, 100000, 1,
    )  # fmt: skip
    writes = [event["reason"] for event in log_events(catalog, "six") if event["event"] == "write"]
    assert writes == ["bucket", "bucket", "bucket", "compaction", "bucket"]
    listed = subprocess.run(
        hctx("agents", "--json", "--catalog", str(catalog), "--host", HOST),
        env=sixth_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["context"]["harness"] == "sixth" and row["context"]["usedPercent"] == 12.0


def test_a_spec_names_modules_only_inside_its_own_package() -> None:
    """A harness is one folder: its spec names its launch plan, transport, transcript reader and
    model table by their names inside its package, and a path out of it is refused."""
    from sidecar.spec import HarnessSpec, UnknownHarness

    base = spec_for("pi")
    for field in ("launch", "transport", "transcripts", "model_windows"):
        with pytest.raises(UnknownHarness, match="names only modules of its own package"):
            HarnessSpec(name="pi", make_producer=base.make_producer, channel_frames=base.channel_frames, decoders={},
                        verified_versions=(), package=base.package, **{field: "wrapper.harnesses.pi"})  # fmt: skip
    for name in registry.BUILT_IN:
        spec = spec_for(name)
        named = [spec.launch, spec.transport, spec.transcripts, spec.model_windows]
        assert spec.package.startswith("sidecar.harnesses.") and spec.module(spec.launch).__file__
        assert all(module is None or spec.module(module).__name__ == f"{spec.package}.{module}" for module in named)


def test_what_was_a_wrapper_literal_is_each_harness_spec(installed: None) -> None:
    """Whether a percent can run past 100 and the model-window table are the harness's own, reached
    through its spec: the sixth states neither, and is in neither."""
    from sidecar.harnesses.claude.windows import shipped_model_table

    overrun = registry.overrun_harnesses()
    assert overrun[:3] == ("pi", "omp", "opencode") and not {"claude", "codex", "sixth"} & set(overrun)
    assert registry.model_table("claude", {"HOME": "/nonexistent"}, []) == shipped_model_table()
    assert registry.model_table("codex", {}, []) == registry.model_table("sixth", {}, []) == {}
