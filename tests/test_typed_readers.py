"""The typed read side (issue 34, point 3): readers get the projected record as a model derived from
the record's own field definitions and read its attributes, never its string keys; the board's
fill plot reads a versioned history (guard.history) through one typed model, never the sidecar's
log lines by hand."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

from guard_factory import record
from pydantic import BaseModel

from guard.history import FILL_HISTORY, PLOTTED, StartLine, WriteLine, read_fill_line, start_fields, write_fields
from guard.projection import CONTEXT_KEYS, Context, SubagentReading, project, reading_of
from guard.record import ContextFields, HarnessContext, RateLimitResets, RateLimits, Subagent
from sidecar.logs import json_lines
from tests.conftest import REPO
from wrapper.readers.web.board import read_fill_history

# Record keys that also name other things the wrapper reads by key (the launch payloads, a URL's
# parameters, the board's own view): a lookup of one is not told from a record's by its text. On a
# record they are guarded by the types instead: a projection (guard.projection.Context) is a model,
# and mypy (strict, over wrapper/) refuses a subscript of it.
SHARED_WORDS = frozenset({"agent", "harness", "incarnation", "schema", "name", "id", "model", "state", "account",
                          "event", "reason", "history"})  # fmt: skip


def _aliases(*models: type[BaseModel]) -> set[str]:
    return {field.alias or name for model in models for name, field in model.model_fields.items()}


RECORD_KEYS = frozenset(
    _aliases(HarnessContext, Context, SubagentReading, RateLimits, RateLimitResets, WriteLine) - SHARED_WORDS
)


def string_key_lookups(source: str) -> list[tuple[int, str]]:
    """Each `x["key"]` and `x.get("key")` whose key is a record field's name, with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key: object = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            key = node.args[0].value
        if isinstance(key, str) and key in RECORD_KEYS:
            found.append((node.lineno, key))
    return found


def test_no_reader_reads_a_record_field_by_a_string_key() -> None:
    """Every module of the wrapper (the readers and the launch side, wherever they are moved to)."""
    found = [
        f"{path.relative_to(REPO)}:{line}: {key}"
        for path in sorted((REPO / "wrapper").rglob("*.py"))
        for line, key in string_key_lookups(path.read_text())
    ]
    assert found == []


def test_the_check_finds_a_lookup_in_each_form() -> None:
    source = 'a = context["usedPercent"]\nb = sub.get("ageMs")\nc = args["harness"]\nd = row["agents"]\n'
    assert string_key_lookups(source) == [(1, "usedPercent"), (2, "ageMs")]
    assert {"usedPercent", "ageMs", "subagents", "rateLimits", "fiveHour", "compactions", "stale"} <= RECORD_KEYS


def test_the_projection_is_the_records_fields_and_the_readers_three() -> None:
    """One definition per field: every field of the record's reading is the projection's, with the
    very same annotation; the projection adds only what the reader derives at its clock."""
    reading, projected = ContextFields.model_fields, Context.model_fields
    for name, field in reading.items():
        if name != "subagents":  # the record's rows, each with its age (SubagentReading below)
            assert projected[name].annotation == field.annotation, name
            assert projected[name].alias == field.alias, name
    assert set(projected) - set(reading) == {"age_ms", "stale", "headroom_tokens"}
    for name, field in Subagent.model_fields.items():
        assert SubagentReading.model_fields[name].annotation == field.annotation, name
    assert set(SubagentReading.model_fields) - set(Subagent.model_fields) == {"age_ms"}


def test_a_reader_reads_attributes_and_the_wire_is_the_rosters_context() -> None:
    held = record(compact_at_tokens=100_000, used_tokens=92_283, subagents=[
        {"id": "a1", "state": "running", "observed_at_ms": 1788000099000, "used_percent": 4.0}])  # fmt: skip
    context = project(held, held.observed_at_ms + 4210)
    assert context is not None
    assert (context.used_tokens, context.age_ms, context.stale, context.headroom_tokens) == (92_283, 4210, False, 7717)
    assert context.subagents[0].age_ms == 5210 and context.subagents[0].used_percent == 4.0
    wire = context.wire()
    assert tuple(wire) == (*CONTEXT_KEYS, "subagents")
    assert wire["headroomTokens"] == 7717 and wire["subagents"][0]["ageMs"] == 5210
    assert "subagents" not in project(record(), 1788000100000).wire()  # type: ignore[union-attr]


def test_the_history_lines_numbers_are_the_records_fields() -> None:
    """The write line's numbers: the record's fields, same names, types, bounds and defaults (the one
    exception, `writtenAtMs`, is optional to a reader of the history: the plot does without it)."""
    fields = WriteLine.model_fields
    for name in PLOTTED[:-1]:
        own = HarnessContext.model_fields[name]
        assert (fields[name].alias, fields[name].annotation, fields[name].metadata, fields[name].default) == (
            own.alias, own.annotation, own.metadata, own.default), name  # fmt: skip
    assert set(PLOTTED) <= set(fields)


def _logged(extra: dict[str, object]) -> str:
    """A line as the sidecar's log writes it (sidecar.logs.json_lines), static fields and all."""
    entry = logging.LogRecord("sidecar", logging.INFO, __file__, 1, "wrote %s", ("bucket",), None)
    entry.__dict__.update(extra)
    return json_lines({"agent": "a", "host": "h"}).format(entry)


def test_the_sidecars_write_line_reads_back_as_the_record_landed() -> None:
    landed = record(compact_at_tokens=182_000, used_percent=585.6)
    line = read_fill_line(_logged(write_fields(landed, "compaction")))
    assert isinstance(line, WriteLine) and (line.history, line.reason) == (FILL_HISTORY, "compaction")
    assert {name: getattr(line, name) for name in PLOTTED} == {name: getattr(landed, name) for name in PLOTTED}
    start = read_fill_line(_logged({**start_fields(), "harness": "pi", "pid": 7}))
    assert isinstance(start, StartLine)


def _log(catalog: Path, lines: list[dict[str, object]]) -> None:
    logs = catalog / ".st2" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "box~amber.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_only_this_versions_lines_are_plotted(tmp_path: Path) -> None:
    """An unversioned `write` line (the log's own, or an older sidecar's) and another version's are
    passed over, as is a start line that is not the history's: only v1 lines make points and runs."""
    point = {"event": "write", "reason": "bucket", "usedTokens": 10, "windowTokens": 100, "compactions": 0}
    _log(tmp_path, [
        {"event": "start", "history": FILL_HISTORY},
        {**point, "observedAtMs": 1000},  # unversioned
        {**point, "history": "hctx.fill-history.v2", "observedAtMs": 2000},
        {**point, "history": FILL_HISTORY, "observedAtMs": 3000},
        {"event": "start"},  # unversioned: not a new run
        {**point, "history": FILL_HISTORY, "observedAtMs": 4000, "usedTokens": 2**53 + 1},  # past a count
        {**point, "history": FILL_HISTORY, "observedAtMs": 5000},
    ])  # fmt: skip
    history = read_fill_history(tmp_path, "box", "amber", here="box")
    assert [(point.at_ms, point.run) for point in history.points] == [(3000, 1), (5000, 1)]


def test_the_format_is_documented() -> None:
    doc = (REPO / "docs" / "fill-history.md").read_text()
    assert f"`{FILL_HISTORY}`" in doc
    for name, field in (StartLine.model_fields | WriteLine.model_fields).items():
        assert f"| `{field.alias or name}` |" in doc, name
    assert "docs/fill-history.md" in (REPO / "README.md").read_text()


def test_the_board_reads_no_sidecar_runtime() -> None:
    """The plot reads the history through guard.history, not the sidecar's log module."""
    for path in (REPO / "wrapper").rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "sidecar.logs" not in imported, path


def test_the_wire_held_between_projections_is_the_models_own() -> None:
    """`reading_of` serializes a record once; each projection's wire is still exactly its model's, and
    a copy that changes anything but the clock's fields is serialized again."""
    held = record(subagents=[{"id": "a1", "state": "running", "observed_at_ms": 1788000099000}])
    for now in (1788000100000, 1788000100000 + 7 * 3_600_000):
        context = project(held, now, reading_of(held))
        assert context is not None
        assert context.wire() == Context.model_validate(context.model_dump()).wire()  # built without the cache
    changed = context.model_copy(update={"used_tokens": 5})
    assert changed.wire()["usedTokens"] == 5 and context.wire()["usedTokens"] == 92283
