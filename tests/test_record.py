"""The record (HC-R01, HC-R04): every field rule, the schema identifiers, the pinned constants."""

from __future__ import annotations

import ast
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from guard_factory import SPEC_EXAMPLE, SPEC_KEY_ORDER, record, wire, wire_bytes
from pydantic import ValidationError

import guard.constants as constants
from guard.errors import RecordRefused
from guard.record import (
    COMPACTION_TRIGGERS,
    ContextFields,
    HarnessContext,
    parse_record,
)
from sidecar.registry import BUILT_IN, spec_for
from sidecar.spec import UnknownHarness
from tests.conftest import REPO


def test_spec_example_parses_and_reserializes_in_the_spec_key_order() -> None:
    parsed = parse_record(wire_bytes())
    assert parsed.used_tokens == 92283
    assert parsed.rate_limits is not None and parsed.rate_limits.seven_day == 55
    out = parsed.to_json()
    assert tuple(json.loads(out)) == SPEC_KEY_ORDER
    assert json.loads(out) == SPEC_EXAMPLE  # 33 and 33.0 compare equal: numerically identical
    assert parse_record(out) == parsed


def test_serialized_record_is_one_newline_terminated_line() -> None:
    out = record().to_json()
    assert out.endswith("\n")
    assert out.count("\n") == 1


def test_key_order_holds_even_when_every_optional_field_is_null() -> None:
    bare = HarnessContext(harness="pi", agent="a", incarnation="i", observed_at_ms=1, written_at_ms=1)
    assert tuple(json.loads(bare.to_json())) == SPEC_KEY_ORDER


# --- harness: a name the registry knows; the record names none itself -------------------------


def test_the_built_in_harnesses_are_exactly_the_five() -> None:
    assert tuple(BUILT_IN) == ("claude", "codex", "pi", "omp", "opencode")


@pytest.mark.parametrize("name", ["", "Claude", "cl aude", "x" * 33, "1pi", "pi\n"])
def test_a_harness_that_is_not_a_name_is_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        ContextFields(harness=name, observed_at_ms=1)


@pytest.mark.parametrize("harness", ["claude", "codex", "pi", "omp", "opencode"])
def test_each_known_harness_is_accepted(harness: str) -> None:
    assert parse_record(wire_bytes(harness=harness)).harness == harness


@pytest.mark.parametrize("harness", ["aider", "Claude", "", None, 5, ["claude"]])
def test_unknown_harness_is_refused(harness: Any) -> None:
    with pytest.raises(RecordRefused, match="harness"):
        parse_record(wire_bytes(harness=harness), harnesses=BUILT_IN)


def test_a_harness_outside_the_registry_has_no_producer_to_construct_a_record() -> None:
    with pytest.raises(UnknownHarness, match="aider"):
        spec_for("aider")


# --- usedTokens / windowTokens / usedPercent: independently nullable -------------------------


@pytest.mark.parametrize("nulls", list(itertools.product([False, True], repeat=3)))
def test_used_window_and_percent_are_independently_nullable(nulls: tuple[bool, bool, bool]) -> None:
    values = {"usedTokens": 1000, "windowTokens": 4000, "usedPercent": 25.0}
    overrides = {key: None if null else value for (key, value), null in zip(values.items(), nulls, strict=True)}
    parsed = parse_record(wire_bytes(**overrides))
    assert (parsed.used_tokens, parsed.window_tokens, parsed.used_percent) == tuple(overrides.values())
    again = json.loads(parsed.to_json())
    for key, value in overrides.items():
        assert key in again  # a withheld field is written as null, never dropped
        assert again[key] == value


def test_percent_without_window_is_legal() -> None:
    parsed = parse_record(wire_bytes(harness="claude", usedTokens=None, windowTokens=None, usedPercent=12))
    assert parsed.used_percent == 12.0
    assert parsed.window_tokens is None


# --- usedPercent: a float that may exceed 100, never clamped ---------------------------------


@pytest.mark.parametrize("percent", [585.6, 100.5, 104.1, 1e6, 0.0])
def test_used_percent_is_carried_raw_and_never_clamped(percent: float) -> None:
    parsed = parse_record(wire_bytes(harness="pi", usedPercent=percent))
    assert parsed.used_percent == percent
    assert json.loads(parsed.to_json())["usedPercent"] == percent
    built = record(harness="pi", used_percent=percent)
    assert json.loads(built.to_json())["usedPercent"] == percent


def test_used_percent_is_a_float() -> None:
    parsed = parse_record(wire_bytes(usedPercent=33))
    assert isinstance(parsed.used_percent, float)
    assert '"usedPercent": 33.0' in parsed.to_json()


@pytest.mark.parametrize("field", ["usedPercent", "costUsd"])
@pytest.mark.parametrize("value", [True, False, "33", "1e3", [33], {"v": 33}])
def test_a_non_number_is_never_read_as_a_number(field: str, value: Any) -> None:
    # `true` read as 1.0 or "33" read as 33.0 would be a number the writer never published.
    with pytest.raises(RecordRefused):
        parse_record(wire_bytes(**{field: value}))


@pytest.mark.parametrize("value", [True, "31"])
def test_a_non_number_rate_limit_is_refused(value: Any) -> None:
    with pytest.raises(RecordRefused):
        parse_record(wire_bytes(rateLimits={"fiveHour": value, "sevenDay": None}))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused(literal: str) -> None:
    text = json.dumps(wire(usedPercent=0)).replace('"usedPercent": 0', f'"usedPercent": {literal}')
    assert literal in text
    with pytest.raises(RecordRefused):
        parse_record(text)


@pytest.mark.parametrize("field", ["usedTokens", "windowTokens", "sessionTotalTokens", "compactions"])
@pytest.mark.parametrize("value", [-1, 1.5, "12", True])
def test_token_counts_are_non_negative_integers(field: str, value: Any) -> None:
    with pytest.raises(RecordRefused):
        parse_record(wire_bytes(**{field: value}))


@pytest.mark.parametrize("field", ["observedAtMs", "writtenAtMs"])
@pytest.mark.parametrize("value", [None, -5, 1.5, "1788000100000"])
def test_stamps_are_required_non_negative_integers(field: str, value: Any) -> None:
    with pytest.raises(RecordRefused):
        parse_record(wire_bytes(**{field: value}))


# --- lastCompactionTrigger: closed union, unknown words decode as unknown --------------------


def test_trigger_union_is_exactly_the_spec_words() -> None:
    assert set(COMPACTION_TRIGGERS) == {"manual", "auto", "threshold", "overflow", "idle", "unknown"}


@pytest.mark.parametrize("word", ["manual", "auto", "threshold", "overflow", "idle", "unknown"])
def test_known_trigger_words_are_kept(word: str) -> None:
    assert parse_record(wire_bytes(lastCompactionTrigger=word)).last_compaction_trigger == word


@pytest.mark.parametrize("word", ["gremlins", "AUTO", "manual ", "", 7])
def test_unknown_trigger_word_decodes_as_unknown(word: Any) -> None:
    parsed = parse_record(wire_bytes(lastCompactionTrigger=word))
    assert parsed.last_compaction_trigger == "unknown"
    assert json.loads(parsed.to_json())["lastCompactionTrigger"] == "unknown"


def test_absent_trigger_stays_null() -> None:
    assert parse_record(wire_bytes(lastCompactionTrigger=None)).last_compaction_trigger is None


# --- additive tolerance --------------------------------------------------------------------


def test_unknown_extra_keys_are_ignored_on_read_and_not_rewritten() -> None:
    data = wire_bytes(futureField={"x": 1}, rateLimits={"fiveHour": 1, "sevenDay": 2, "monthly": 3})
    parsed = parse_record(data)
    assert parsed.rate_limits is not None and parsed.rate_limits.five_hour == 1
    out = json.loads(parsed.to_json())
    assert "futureField" not in out
    assert out["rateLimits"] == {"fiveHour": 1, "sevenDay": 2}


def test_absent_optional_keys_read_as_null() -> None:
    minimal = {key: SPEC_EXAMPLE[key] for key in ("schema", "agent", "harness", "incarnation")}
    minimal |= {"observedAtMs": 5, "writtenAtMs": 6}
    parsed = parse_record(json.dumps(minimal))
    assert parsed.used_tokens is None and parsed.window_tokens is None and parsed.used_percent is None
    assert parsed.compactions == 0


# --- schema identifiers ----------------------------------------------------------------------


def test_v2_is_accepted_and_kept() -> None:
    parsed = parse_record(wire_bytes(schema="st2.harness-context.v2"))
    assert parsed.schema_id == "st2.harness-context.v2"
    assert json.loads(parsed.to_json())["schema"] == "st2.harness-context.v2"


def test_new_records_are_v1() -> None:
    assert json.loads(record().to_json())["schema"] == "st2.harness-context.v1"


@pytest.mark.parametrize(
    "schema",
    [
        "com.example.harness-context.v1",  # foreign
        "st2.harness-context",  # invalid: no version
        "st2.harness-context.v3",
        "st2.harness-state.v1",
        "ST2.HARNESS-CONTEXT.V1",
        " st2.harness-context.v1",
        "",
        None,
        1,
        [],  # unhashable: must be refused, not crash the reader
        {"v": 1},
    ],
)
def test_any_other_schema_is_refused(schema: Any) -> None:
    with pytest.raises(RecordRefused, match="schema"):
        parse_record(wire_bytes(schema=schema))


def test_missing_schema_is_refused() -> None:
    raw = wire()
    del raw["schema"]
    with pytest.raises(RecordRefused, match="schema"):
        parse_record(json.dumps(raw))


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b"null", b"42", b'"st2.harness-context.v1"', b"\xff\xfe{}", b"[" * 100_000],
)
def test_bytes_that_are_not_a_record_object_are_refused(data: bytes) -> None:
    with pytest.raises(RecordRefused):
        parse_record(data)


def test_truncated_record_is_refused() -> None:
    data = wire_bytes()
    for cut in range(1, len(data) - 1):
        with pytest.raises(RecordRefused):
            parse_record(data[:cut])


# --- constants -------------------------------------------------------------------------------


def test_constants_have_the_spec_values() -> None:
    assert constants.HARNESS_CONTEXT_STALE_MS == 60 * 60 * 1000
    assert constants.HARNESS_CONTEXT_FUTURE_SKEW_MS == 60 * 1000
    assert constants.HARNESS_CONTEXT_BUCKET_PERCENT == 1
    assert constants.HARNESS_CONTEXT_WARN_PERCENT == 80
    assert constants.HARNESS_CONTEXT_HEARTBEAT_MS == 300 * 1000
    assert constants.SCHEMA_V1 == "st2.harness-context.v1"
    assert constants.SCHEMA_V2 == "st2.harness-context.v2"
    assert {"st2.harness-context.v1", "st2.harness-context.v2"} == constants.ACCEPTED_SCHEMAS


def test_constants_are_their_own_values_not_aliases() -> None:
    # HC-R04: not aliases of the presence or harness-state constants. The module may import
    # nothing but typing, so every value is a literal of its own.
    tree = ast.parse(Path(constants.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"typing", "__future__"}


def test_replicated_record_names_are_pinned() -> None:
    # HC-T08: the transport's include list (another repository) names exactly these.
    assert constants.REPLICATED_RECORD_NAMES == ("harness-state", "harness-context")
    assert constants.CONTEXT_RECORD_NAME == "harness-context"
    assert constants.CONTEXT_LOCK_NAME == ".harness-context.lock"
    assert (constants.CONTROL_DIR_NAME, constants.STAGING_DIR_NAME) == (".st2", "harness-context-staging")
    assert constants.AGENTS_DIR_NAME == "agents"


# --- `hctx schema` ---------------------------------------------------------------------------


def _hctx_schema(cwd: Path) -> dict[str, Any]:
    script = shutil.which("hctx")
    argv = [script, "schema"] if script else [sys.executable, "-m", "wrapper.cli", "schema"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    schema: dict[str, Any] = json.loads(done.stdout)
    return schema


def test_hctx_schema_prints_the_record_schema(tmp_path: Path) -> None:
    schema = _hctx_schema(tmp_path)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "st2.harness-context.v1"
    # The spec's keys in its order, and issue 28's additive `subagents` after `sessionId`; issue 35's
    # `rateLimitsAtMs` and issue 37's `promptCache` after `rateLimitResetsAtMs` (each key left out of a
    # record when empty).
    additive = ("subagents", "rateLimitsAtMs", "promptCache")
    assert tuple(k for k in schema["properties"] if k not in additive) == SPEC_KEY_ORDER
    assert list(schema["properties"]).index("subagents") == SPEC_KEY_ORDER.index("sessionId") + 1
    order = list(schema["properties"])
    assert order.index("rateLimitsAtMs") == order.index("rateLimitResetsAtMs") + 1
    assert order.index("promptCache") == order.index("rateLimitsAtMs") + 1
    assert set(schema["required"]) >= {"harness", "agent", "incarnation", "observedAtMs", "writtenAtMs"}
    assert schema["properties"]["harness"]["enum"] == list(BUILT_IN)


def test_hctx_schema_validates_a_real_record(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _hctx_schema(tmp_path)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for real in (
        record(),
        record(harness="pi", used_percent=585.6, used_tokens=None, rate_limits=None, last_compaction_trigger=None),
        parse_record(wire_bytes(schema="st2.harness-context.v2")),
    ):
        validator.validate(json.loads(real.to_json()))
    assert not validator.is_valid(wire(harness="aider"))
    assert not validator.is_valid(wire(usedTokens=-1))
    assert not validator.is_valid(wire(schema="com.example.harness-context.v1"))


@pytest.mark.parametrize("field", ["model", "agent", "incarnation"])
def test_a_lone_surrogate_json_can_spell_is_refused_not_printed(field: str) -> None:
    raw = json.loads(wire_bytes())
    raw[field] = "ok\ud800"
    with pytest.raises(RecordRefused, match="lone surrogate"):
        parse_record(json.dumps(raw))  # ensure_ascii spells it as the escape a hostile writer would


def test_a_roster_over_a_lone_surrogate_record_prints_and_warns(tmp_path: Path) -> None:
    raw = json.loads(wire_bytes())
    raw["model"] = "\udfff"
    agent = tmp_path / "agents" / "h" / "a"
    agent.mkdir(parents=True)
    (agent / "harness-context").write_text(json.dumps(raw))
    result = subprocess.run(
        [sys.executable, "-m", "wrapper.cli", "agents", "--json", "--catalog", str(tmp_path)],
        capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["context"] is None
    assert "lone surrogate" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", [2**53 + 1, 10**400])
def test_a_percent_no_float_holds_exactly_is_refused_not_rounded(value: int) -> None:
    raw = json.loads(wire_bytes())
    raw["usedPercent"] = value
    with pytest.raises(RecordRefused, match="no exact floating-point value"):
        parse_record(json.dumps(raw))
