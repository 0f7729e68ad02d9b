"""The `st2.harness-context.v1` record (HC-R01) and its reading of bytes off disk."""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError
from pydantic.alias_generators import to_camel

from guard.account import Account
from guard.constants import ACCEPTED_SCHEMAS, SCHEMA_V1
from guard.errors import RecordRefused
from guard.json_rule import loads_object, strings_of
from guard.numbers import round_half_up

__all__ = [
    "AT_FIRST_USE",
    "COMPACTION_TRIGGERS",
    "HARNESS_NAME_PATTERN",
    "MAX_COUNT",
    "MAX_SUBAGENTS",
    "CompactionTrigger",
    "ContextFields",
    "Count",
    "FiniteFloat",
    "Harness",
    "HarnessContext",
    "Millis",
    "Printable",
    "PromptCache",
    "RateLimitResets",
    "RateLimitTimes",
    "RateLimits",
    "Subagent",
    "SubagentState",
    "Trigger",
    "WindowSource",
    "WireModel",
    "describe_validation_error",
    "optional_model",
    "parse_record",
    "record_json_schema",
    "refuse_nul_characters",
    "round_half_up",
]

# A harness's name as the registry (sidecar.registry) spells it. The record names no harness of
# its own: which ones exist, and what their numbers mean, is the registry's to say.
HARNESS_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
Harness = Annotated[str, Field(pattern=HARNESS_NAME_PATTERN)]

CompactionTrigger = Literal["manual", "auto", "threshold", "overflow", "idle", "unknown"]
COMPACTION_TRIGGERS: tuple[CompactionTrigger, ...] = get_args(CompactionTrigger)


def _trigger_or_unknown(value: object) -> object:
    """Additive-tolerant on read: a word this version does not know is `unknown`, never a guess."""
    if value is None or value in COMPACTION_TRIGGERS:
        return value
    return "unknown"


Trigger = Annotated[CompactionTrigger, BeforeValidator(_trigger_or_unknown)]
# The largest integer every JSON reader keeps exact (a JavaScript number, jq): no window, token
# count or counter comes near it, and a record must read the same everywhere.
MAX_COUNT = 2**53
Count = Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]
Millis = Annotated[int, Field(ge=0, strict=True)]


def _exact_as_float(value: object) -> object:
    """An integer a float cannot hold exactly (2**53 + 1) would be read as a neighbouring number."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            exact = float(value) == value
        except OverflowError:
            exact = False
        if not exact:
            raise RecordRefused("an integer with no exact floating-point value")
    return value


# Strict: a JSON `true` or "33" is not a number the harness published, so it is never read as one.
FiniteFloat = Annotated[float, BeforeValidator(_exact_as_float), Field(allow_inf_nan=False, strict=True)]


class WireModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


# A model's validator and serializer built at its first use, not at import (pydantic's `defer_build`):
# for the models a reader never validates or dumps on their own, only inside a record or a claim
# (whose schemas hold theirs). `hctx agents --json` then builds none of them (issue 38: it runs
# every few seconds, and every build is start-up); a writer pays for each once, at its first.
AT_FIRST_USE = ConfigDict(defer_build=True)


class RateLimits(WireModel):
    """Account-scoped window occupancy as the harness reported it; an absent window is null."""

    model_config = AT_FIRST_USE

    five_hour: FiniteFloat | None = None
    seven_day: FiniteFloat | None = None


class RateLimitResets(WireModel):
    """When each `rateLimits` window resets, as the harness stated it, in Unix ms; null unstated."""

    five_hour: Millis | None = None
    seven_day: Millis | None = None


class RateLimitTimes(WireModel):
    """When each `rateLimits` window's figure arrived from the service, in Unix ms (issue 35): not
    when the reading holding it was taken. A harness that redraws a figure it heard minutes ago
    (Claude's status line) restates it with its old time, so an idle agent's repeat never passes
    for the account's newest snapshot; null where the window is null."""

    five_hour: Millis | None = None
    seven_day: Millis | None = None


_Model = TypeVar("_Model", bound=BaseModel)


def optional_model(model: type[_Model], value: object) -> _Model | None:
    """An adjacent fact decoded conservatively: absent or malformed is null, never a guess."""
    if value is None:
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


def _tolerant(model: type[BaseModel]) -> BeforeValidator:
    """Additive-tolerant on read: a field of this model this version cannot read is null, and never
    a reason to refuse the record's numbers."""
    return BeforeValidator(lambda value: optional_model(model, value))


# Additive (issue 28): at most this many subagents ride a record, the newest first. 16 rows of the
# longest fields stay far under the record's 64 KiB (guard.projection.MAX_RECORD_BYTES).
MAX_SUBAGENTS = 16
# Text a harness names a subagent by: printable, bounded. A control character (a terminal escape in a
# hostile id) is refused, never cleaned into another name.
Printable = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")]
SubagentState = Literal["running", "finished"]
WindowSource = Literal["harness", "model-table"]


class Subagent(WireModel):
    """One subagent of the agent (issue 28): its own numbers, each from the harness's own field
    for that subagent, and never the parent's."""

    model_config = AT_FIRST_USE

    id: Printable
    name: Printable | None = None  # its type (Claude's agent_type, OpenCode's agent) where stated
    model: Printable | None = None
    used_tokens: Count | None = None
    window_tokens: Count | None = None
    used_percent: FiniteFloat | None = None
    # Where the window came from: the harness's own channel, or (Claude, which states none) the
    # model table `hctx scan` uses; null with a null window.
    window_source: WindowSource | None = None
    compactions: Count | None = None  # null where the harness states none for it
    state: SubagentState
    observed_at_ms: Millis


class PromptCache(WireModel):
    """The harness's prompt cache as it states it (issue 37; Claude 2.1.332's status-line
    `prompt_cache`): whether it is warm, when it goes cold, and what the next turn re-sends if it
    does. Each field null where the harness did not state it."""

    warm: StrictBool
    ttl: Annotated[str, Field(max_length=16, pattern=r"^[0-9]{1,6}[smh]$")] | None = None
    expires_at_ms: Millis | None = None  # when it goes cold (Claude's `expires_at`, epoch s), null when cold
    hit_ratio: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    recache_tokens_if_cold: Count | None = None  # what a cold cache makes the next turn write again
    cache_write_tokens: Count | None = None
    requests: Count | None = None
    misses: Count | None = None


class ContextFields(WireModel):
    """The reading a producer publishes: every record field except provenance and stamps."""

    model_config = AT_FIRST_USE

    harness: Harness
    used_tokens: Count | None = None
    window_tokens: Count | None = None
    # A float that may exceed 100 (an overrun is an observation) and is never clamped here.
    used_percent: FiniteFloat | None = None
    model: str | None = None
    cost_usd: FiniteFloat | None = None
    session_total_tokens: Count | None = None
    rate_limits: RateLimits | None = None
    compactions: Count = 0
    last_compaction_ms: Millis | None = None
    last_compaction_trigger: Trigger | None = None
    # Additive (issue 18): the occupancy, on usedTokens' own scale, at which the harness will compact
    # this session on its own, read from its own settings (the producer's docs name the source and
    # the comparison); null where the harness does not state it or auto-compaction is off.
    compact_at_tokens: Count | None = None
    # False only when the harness's own settings switch auto-compaction off; null when not known.
    auto_compaction: StrictBool | None = None
    # Additive (issue 19): the harness build that produced the reading, as its own channel names it
    # (a status line's `version`, a client's user agent, a session's or an extension host's build);
    # null where the channel does not say. Readers compare it with the producer's verified set.
    harness_version: Annotated[str, Field(max_length=64)] | None = None
    # Additive (issue 19): the harness session the reading belongs to, where one server hosts several
    # (OpenCode); null where the channel names none.
    session_id: Annotated[str, Field(max_length=512)] | None = None  # an OpenCode id: 512 at most
    # Additive (issue 28): the agent's running and recently finished subagents, newest first, at most
    # MAX_SUBAGENTS; the key is left out when there are none, so a session that never delegated
    # writes the bytes it wrote before, and a reader that knows nothing of it ignores it.
    subagents: Annotated[tuple[Subagent, ...], Field(max_length=MAX_SUBAGENTS)] = ()
    # Additive (issue 29): the account `rateLimits` belong to, as the harness states it (guard.account):
    # an opaque key and a label; null where nothing states one (the agent is its own group).
    account: Annotated[Account | None, _tolerant(Account)] = None
    # Additive (issue 29): when each rate-limit window resets, as the harness stated it.
    rate_limit_resets_at_ms: Annotated[RateLimitResets | None, _tolerant(RateLimitResets)] = None
    # Additive (issue 35): when each window's figure arrived from the service (RateLimitTimes); the
    # fan-in orders and ages an account's snapshots by it. Left out when null, as `subagents` is
    # when empty (a harness stating no limits writes the bytes it wrote before); absent, it reads as
    # the reading's own observedAtMs.
    rate_limits_at_ms: Annotated[RateLimitTimes | None, _tolerant(RateLimitTimes)] = None
    # Additive (issue 37): the prompt cache as the harness states it; the key is left out where it
    # states none (Claude 2.1.250, every other harness), as `subagents`, so those records keep their bytes.
    prompt_cache: Annotated[PromptCache | None, _tolerant(PromptCache)] = None
    observed_at_ms: Millis


class HarnessContext(ContextFields):
    """One JSON object at `<agent-dir>/harness-context`, replaced atomically."""

    # Built at import, unlike the reading it extends: every reader and writer validates records.
    model_config = ConfigDict(defer_build=False)

    schema_id: Literal["st2.harness-context.v1", "st2.harness-context.v2"] = Field(default=SCHEMA_V1, alias="schema")
    agent: str
    incarnation: str
    written_at_ms: Millis

    def to_json(self) -> str:
        """The exact bytes written: the spec's key order, newline-terminated."""
        fields = self.model_dump(mode="json", by_alias=True)
        ordered = {name: fields[name] for name in _FIELD_ORDER if name not in _LEFT_OUT_EMPTY or fields[name]}
        return json.dumps(ordered, ensure_ascii=False, allow_nan=False) + "\n"


_FIELD_ORDER = (
    "schema", "agent", "harness", "usedTokens", "windowTokens", "usedPercent", "model", "costUsd",
    "sessionTotalTokens", "rateLimits", "compactions", "lastCompactionMs", "lastCompactionTrigger",
    "compactAtTokens", "autoCompaction", "harnessVersion", "sessionId", "subagents", "account",
    "rateLimitResetsAtMs", "rateLimitsAtMs", "promptCache", "incarnation", "observedAtMs", "writtenAtMs",
)  # fmt: skip
# Keys left out of the bytes while they hold nothing (additive keys most records never carry).
_LEFT_OUT_EMPTY = frozenset({"subagents", "rateLimitsAtMs", "promptCache"})


def parse_record(data: bytes | str, *, harnesses: Container[str] | None = None) -> HarnessContext:
    """Decode a record, refusing (never guessing at) anything outside the accepted contract.

    `harnesses`: the names whose arithmetic the reader knows (the registry's); a record of any
    other is refused. None (the writer re-reading its own record) takes any well-formed name."""
    raw = loads_object(data, error=RecordRefused)
    refuse_nul_characters(raw, data)
    schema = raw.get("schema")
    if not isinstance(schema, str) or schema not in ACCEPTED_SCHEMAS:  # a list would raise TypeError
        raise RecordRefused(f"schema {schema!r} is not one this reader accepts")
    harness = raw.get("harness")
    if harnesses is not None and not (isinstance(harness, str) and harness in harnesses):
        raise RecordRefused(f"harness {harness!r} is not one whose arithmetic this reader knows")
    try:
        return HarnessContext.model_validate(raw, by_alias=True)
    except ValidationError as exc:
        raise RecordRefused(f"invalid record: {describe_validation_error(exc)}") from None


def refuse_nul_characters(raw: object, data: bytes | str | None = None) -> None:
    """A NUL character (`"\\u0000"`, which the JSON rule allows) in a record's or claim's value: no
    environment variable, path or C string carries one, and a record's values become all three
    (`hctx watch --exec`'s HCTX_* variables), so the file is refused where it is read.

    `data`: the JSON text `raw` was parsed from, when the caller has it. The rule refuses a raw NUL
    in it, so a parsed string holds one only where the text spells the escape; a text without it
    is not walked (the walk was an eighth of `hctx agents --json`'s reading, issue 38)."""
    if (isinstance(data, bytes) and b"\\u0000" not in data) or (isinstance(data, str) and "\\u0000" not in data):
        return
    if any("\x00" in text for text in strings_of(raw)):
        raise RecordRefused("holds a NUL character (\\u0000), which no environment or path carries")


def describe_validation_error(exc: ValidationError) -> str:
    """The first thing wrong, where: one short line for a log, not pydantic's essay."""
    errors = exc.errors(include_input=False, include_url=False)
    if not errors:
        return str(exc)[:200]
    where = ".".join(str(part) for part in errors[0]["loc"]) or "value"
    return f"{where}: {errors[0]['msg']}"


def record_json_schema(harnesses: Sequence[str] = ()) -> dict[str, Any]:
    """The record's JSON schema; `harness` enumerates `harnesses` when given (the registry's)."""
    schema = HarnessContext.model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = SCHEMA_V1
    properties = schema["properties"]
    schema["properties"] = {name: properties[name] for name in _FIELD_ORDER}
    if harnesses:
        schema["properties"]["harness"] = {"enum": list(harnesses), "title": "Harness", "type": "string"}
    return schema
