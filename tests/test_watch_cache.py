"""Issue 37: `hctx watch --cache-warn SECONDS`, a `cache-expiring` event naming the agent, when its
warm prompt cache goes cold and what the turn after writes again (Claude 2.1.332's own figures)."""

from __future__ import annotations

import json

from readers_catalog import HOST

from guard.constants import HARNESS_CONTEXT_STALE_MS
from guard.projection import Context
from wrapper.readers.roster import AgentRow
from wrapper.readers.watch import Event, Observation, Seen, Settings, dump_state, load_state, step

NOW = 1_788_000_000_000
WARN = Settings(thresholds=(), cache_warn_ms=60_000)


def context(expires: int | None, *, warm: bool = True, stale: bool = False) -> Context:
    cache = {"warm": warm, "ttl": "5m", "expiresAtMs": expires, "recacheTokensIfCold": 754_995}
    return Context.model_validate({
        "harness": "claude", "usedTokens": 100_005, "windowTokens": 1_000_000, "usedPercent": 10,
        "compactions": 0, "compactAtTokens": None, "observedAtMs": NOW - 1000, "promptCache": cache,
        "ageMs": HARNESS_CONTEXT_STALE_MS + 1 if stale else 1000, "stale": stale, "headroomTokens": None,
    })  # fmt: skip


def seen(ctx: Context) -> Observation:
    return Observation(AgentRow(HOST, "builder", "claude", "running", ctx), "inc-1")


def run(readings: list[tuple[int, Context]], config: Settings = WARN) -> list[Event]:
    state: dict[str, Seen] = {}
    told: list[Event] = []
    for now, ctx in readings:
        events, state = step(state, [seen(ctx)], now, config)
        told += events
    return told


def test_a_cache_going_cold_within_the_warning_is_told_once_per_expiry() -> None:
    first, second = NOW + 300_000, NOW + 600_000
    told = run([
        (NOW, context(first)),  # 5 minutes left: not yet
        (first - 90_000, context(first)),
        (first - 50_000, context(first)),  # 50 s left: told
        (first - 20_000, context(first)),  # the same expiry: told already
        (first + 10_000, context(second)),  # a turn moved it: re-armed, 5 minutes left
        (second - 30_000, context(second)),  # told again
        (second + 1, context(None, warm=False)),  # cold: nothing to warn of
    ])  # fmt: skip
    assert [(e.kind, e.at_ms) for e in told] == [
        ("cache-expiring", first - 50_000),
        ("cache-expiring", second - 30_000),
    ]
    wire = told[0].wire()
    assert (wire["event"], wire["agent"], wire["cacheExpiresAtMs"], wire["cacheColdInMs"]) == (
        "cache-expiring", "builder", first, 50_000)  # fmt: skip
    assert wire["recacheTokensIfCold"] == 754_995
    assert told[0].message() == "box/builder: prompt cache goes cold in 50s; the turn after writes 755k tokens again"
    assert told[0].env()["HCTX_CACHE_COLD_IN_MS"] == "50000"


def test_without_cache_warn_no_cache_event_and_no_other_event_carries_its_keys() -> None:
    assert run([(NOW, context(NOW + 30_000))], Settings(thresholds=())) == []
    [fill] = run([(NOW, context(NOW + 600_000))], Settings(thresholds=(5,), cache_warn_ms=60_000))
    assert fill.kind == "fill" and "cacheExpiresAtMs" not in fill.wire()


def test_a_stale_record_or_an_expiry_already_past_warns_of_nothing() -> None:
    assert [e.kind for e in run([(NOW, context(NOW + 30_000, stale=True))])] == ["stale"]
    assert run([(NOW, context(NOW - 1))]) == []


def test_what_was_told_survives_a_restart_and_an_old_state_file_still_loads() -> None:
    state = {"box/builder": Seen("inc-1", cache_warned=NOW + 300_000)}
    assert load_state(dump_state(state)) == state
    assert json.loads(dump_state(state))["agents"]["box/builder"]["cacheWarned"] == NOW + 300_000
    assert "cacheWarned" not in json.loads(dump_state({"box/a": Seen("inc-2")}))["agents"]["box/a"]
    # A restarted watch does not tell the same expiry again.
    events, _ = step(state, [seen(context(NOW + 300_000))], NOW + 290_000, WARN)
    assert events == []
