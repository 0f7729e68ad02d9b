"""The Codex producer on the lab's verbatim captures (fixtures/codex/) and on synthetic edge cases."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from guard.policy import Reading
from sidecar.decoding import Decoder, Dropped
from sidecar.harnesses.codex.events import RateLimitsUpdated, TokenUsage
from sidecar.harnesses.codex.producer import (
    BASELINE_TOKENS,
    CODEX_CONTEXT_VERIFIED_VERSIONS,
    SPEC,
    CodexProducer,
    CodexTransport,
    percent_of_context_window_remaining,
    used_percent,
)
from sidecar.recorder import Chunk
from sidecar.registry import spec_for
from tests import conformance
from tests.codex_threads import own_producer
from tests.conformance import chunks_of, recording_of
from tests.conftest import FIXTURE_ROOT

FIXTURES = FIXTURE_ROOT / "codex"
VERSIONS = ("0.151.0", "0.171.0")

# From the lab README's "Assertions suitable for an automated test": 100 − Codex's "% context left"
# for the eleven tokenUsage frames of the main scenario (two turns, manual compaction, two turns,
# auto compaction inside turn 5), identical in both versions and on stdio and websocket.
MAIN_USED_PERCENT = [10, 44, 44, 45, 0, 5, 92, 92, 93, 0, 4]


def capture(version: str, scenario: str, suffix: str = ".jsonl") -> Path:
    return FIXTURES / f"codex-{version}-{scenario}{suffix}"


def messages(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def decoded(message: dict[str, Any], wire: str = "stdout") -> list[object]:
    """The events one message makes, sent as the app-server's stdout line."""
    decoder = SPEC.decoder(wire)
    return decoder.receive_data(json.dumps(message).encode() + b"\n") + decoder.end_of_data()


def feed(producer: CodexProducer, message: dict[str, Any], now_ms: int) -> list[Reading]:
    readings: list[Reading] = []
    for event in decoded(message):
        assert not isinstance(event, Dropped), event
        readings += producer.feed(event, now_ms)
    return readings


def recorded(path: Path) -> list[tuple[int | None, object]]:
    """(time, event) for every event the recording of a capture makes, one decoder per wire, as in replay."""
    decoders: dict[str, Decoder] = {}
    timed: list[tuple[int | None, object]] = []
    for chunk in chunks_of(recording_of(path)):
        decoder = decoders.setdefault(chunk.wire, SPEC.decoder(chunk.wire))
        timed += [(chunk.at_ms, event) for event in decoder.receive_data(chunk.data)]
    return timed


def run(path: Path, producer: CodexProducer | None = None) -> tuple[CodexProducer, list[Reading]]:
    producer = producer or CodexProducer()
    readings: list[Reading] = []
    for at_ms, event in recorded(path):
        if not isinstance(event, Dropped):
            readings += producer.feed(event, at_ms or 0)
    return producer, readings


def token_usage_params(path: Path) -> Iterator[dict[str, Any]]:
    for message in messages(path):
        if message.get("method") == "thread/tokenUsage/updated":
            yield message["params"]


def captured_cli_version(path: Path) -> str:
    for message in messages(path):
        if message.get("method") == "thread/started":
            version: str = message["params"]["thread"]["cliVersion"]
            return version
    raise AssertionError(f"{path.name} has no thread/started")


# ---- the verbatim captures --------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scenario", ["stdio-main", "ws-main"])
def test_every_captured_reading_is_100_minus_codex_percent_left_never_a_naive_ratio(
    version: str, scenario: str
) -> None:
    path = capture(version, scenario)
    assert version in CODEX_CONTEXT_VERIFIED_VERSIONS
    assert captured_cli_version(path) == version  # the version is asserted literally
    assert BASELINE_TOKENS == 12_000

    _, readings = run(path)
    usage = [r.fields for r in readings if not (r.compaction_edge or r.rate_limits_edge)]
    assert [f.used_percent for f in usage] == MAIN_USED_PERCENT
    for fields, params in zip(usage, token_usage_params(path), strict=True):
        window = params["tokenUsage"]["modelContextWindow"]
        last = params["tokenUsage"]["last"]["totalTokens"]
        total = params["tokenUsage"]["total"]["totalTokens"]
        assert window == 190_000  # already 95% of the configured 200,000: used as-is, never rescaled
        assert (fields.used_tokens, fields.window_tokens, fields.session_total_tokens) == (
            last,
            window,
            total,
        )
        # The two wrong numbers the spec names must not be what is published.
        assert fields.used_percent != pytest.approx(last / window * 100)
        assert fields.used_percent != pytest.approx(total / window * 100)
        assert fields.model is None and fields.cost_usd is None


def test_the_worked_example_frame_publishes_44_not_48() -> None:
    params = next(
        p
        for p in token_usage_params(capture("0.151.0", "stdio-main"))
        if p["tokenUsage"]["last"]["totalTokens"] == 90_800
    )
    producer = own_producer(params["threadId"])
    [reading] = feed(producer, {"method": "thread/tokenUsage/updated", "params": params}, 1)
    assert reading.fields.used_percent == 44  # codex: "56% context left"
    assert round(90_800 / 190_000 * 100) == 48  # what a baseline-free ratio would have said


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("scenario", "compactions"),
    [("stdio-main", 2), ("ws-main", 2), ("openai-main", 2), ("stdio-main-no-ratelimit-headers", 2)],
)
def test_compactions_are_counted_once_per_item(version: str, scenario: str, compactions: int) -> None:
    path = capture(version, scenario)
    compaction_frames = [
        m for m in messages(path)
        if m.get("params", {}).get("item", {}).get("type") == "contextCompaction"
    ]  # fmt: skip
    assert len(compaction_frames) == 2 * compactions  # started + completed for each
    producer, readings = run(path)
    assert producer.held.compactions.count == compactions
    edges = [r.fields for r in readings if r.compaction_edge]
    assert [e.compactions for e in edges] == list(range(1, compactions + 1))
    assert all(e.last_compaction_trigger == "unknown" for e in edges)


@pytest.mark.parametrize("version", VERSIONS)
def test_remote_compaction_v2_path_publishes_the_estimate_and_counts_once(version: str) -> None:
    # The built-in provider compacts remotely: one tokenUsage with the post-compaction estimate.
    _, readings = run(capture(version, "openai-main"))
    usage = [r.fields.used_percent for r in readings if not (r.compaction_edge or r.rate_limits_edge)]
    assert usage == [10, 44, 0, 5, 92, 0, 4]


@pytest.mark.parametrize("version", VERSIONS)
def test_compaction_edge_keeps_the_held_readings_time_and_numbers(version: str) -> None:
    _, readings = run(capture(version, "stdio-main"))
    for before, edge in itertools.pairwise(readings):
        if edge.compaction_edge:
            assert edge.fields.observed_at_ms == before.fields.observed_at_ms
            assert edge.fields.used_tokens == before.fields.used_tokens
            assert edge.fields.last_compaction_ms is not None
            assert edge.fields.last_compaction_ms > edge.fields.observed_at_ms


@pytest.mark.parametrize("version", VERSIONS)
def test_rate_limits_ride_the_next_reading_joined_by_window_length(version: str) -> None:
    _, readings = run(capture(version, "stdio-main"))
    usage = [r.fields for r in readings if not (r.compaction_edge or r.rate_limits_edge)]
    # The snapshot follows its tokenUsage frame, so the first reading has none yet ...
    assert usage[0].rate_limits is None
    # ... and the second carries the first snapshot: primary 10% over 300 min, secondary 40% over 7 days.
    assert usage[1].rate_limits is not None
    assert (usage[1].rate_limits.five_hour, usage[1].rate_limits.seven_day) == (10, 40)
    assert usage[-1].rate_limits is not None
    assert (usage[-1].rate_limits.five_hour, usage[-1].rate_limits.seven_day) == (48, 45)


@pytest.mark.parametrize("version", VERSIONS)
def test_null_rate_limit_windows_are_no_data(version: str) -> None:
    _, readings = run(capture(version, "stdio-main-no-ratelimit-headers"))
    assert readings and all(r.fields.rate_limits is None for r in readings)
    assert [
        r.fields.used_percent for r in readings if not (r.compaction_edge or r.rate_limits_edge)
    ] == MAIN_USED_PERCENT


def test_a_rate_limit_frame_never_yields_a_reading_of_its_own() -> None:
    producer = own_producer()
    assert feed(producer, rate_limits(primary=window(12, 300)), 5) == []
    assert feed(producer, token_usage(50_000, 100_000, 190_000), 6)[0].fields.rate_limits is not None


def test_rate_limits_merge_a_null_or_absent_window_never_clears() -> None:
    producer = own_producer()
    feed(producer, rate_limits(primary=window(10, 300), secondary=window(40, 10_080)), 1)
    feed(producer, rate_limits(primary=None, secondary=None), 2)
    feed(producer, {"method": "account/rateLimits/updated", "params": {"rateLimits": {}}}, 3)
    feed(producer, rate_limits(primary=window(15, 300)), 4)
    feed(producer, rate_limits(primary=window(99, 60), secondary=window(77, None)), 5)
    [reading] = feed(producer, token_usage(20_000, 20_000, 190_000), 6)
    assert reading.fields.rate_limits is not None
    assert (reading.fields.rate_limits.five_hour, reading.fields.rate_limits.seven_day) == (15, 40)


@pytest.mark.parametrize("version", VERSIONS)
def test_resume_in_a_fresh_process(version: str) -> None:
    _, readings = run(capture(version, "stdio-resume"))
    published = [
        (r.fields.used_tokens, r.fields.session_total_tokens, r.fields.used_percent)
        for r in readings
        if not r.rate_limits_edge
    ]
    if version == "0.151.0":
        # No replay before 0.154.0: blind until the next turn, whose total restarted at zero.
        assert published == [(22_300, 22_300, 6)]
    else:
        # The replayed frame is published; its turnId (turn 1 in 0.171.0) is not trusted for anything.
        assert published == [(18_250, 605_450, 4), (22_300, 627_750, 6)]
    assert all(r.fields.compactions == 0 for r in readings)  # incarnation-scoped


@pytest.mark.parametrize("version", VERSIONS)
def test_resume_with_exclude_turns(version: str) -> None:
    _, readings = run(capture(version, "stdio-resume-exclude"))
    expected = [] if version == "0.151.0" else [(22_300, 627_750)]
    assert [(r.fields.used_tokens, r.fields.session_total_tokens) for r in readings] == expected


def test_the_resume_replay_turn_id_is_no_key() -> None:
    # In 0.160.0+ the replay names turn 1 even though a later turn produced the usage; a producer
    # keyed on turnId would drop it as "already seen" or file it under the wrong turn.
    producer = own_producer()
    feed(producer, token_usage(30_500, 30_500, 190_000, turn="turn-1"), 1)
    feed(producer, compaction_item("item/started", "c1", turn="turn-1"), 2)
    [replayed] = feed(producer, token_usage(18_250, 605_450, 190_000, turn="turn-1"), 3)
    assert (replayed.fields.used_tokens, replayed.fields.observed_at_ms, replayed.fields.compactions) == (
        18_250,
        3,
        1,
    )


# ---- arithmetic --------------------------------------------------------------------------------------


def test_exact_half_mirrors_codex_not_the_used_fraction() -> None:
    # Effective window 200, used 101: codex shows "50% left", so 50 is published, where rounding
    # the used fraction half-away-from-zero gives 51.
    window = BASELINE_TOKENS + 200
    assert percent_of_context_window_remaining(BASELINE_TOKENS + 101, window) == 50
    assert used_percent(BASELINE_TOKENS + 101, window) == 50
    naive = 101 / 200 * 100
    assert int(naive + 0.5) == 51


def test_exact_half_rounds_away_from_zero_unlike_python_round() -> None:
    # Remaining 50.5%: Rust rounds to 51 left (49 used); Python's round() would say 50 left.
    window = BASELINE_TOKENS + 200
    assert percent_of_context_window_remaining(BASELINE_TOKENS + 99, window) == 51
    assert used_percent(BASELINE_TOKENS + 99, window) == 49
    assert round(101 / 200 * 100) == 50


@pytest.mark.parametrize(
    ("tokens", "window", "expected"),
    [
        (0, 190_000, 0),  # below the baseline: nothing used
        (12_000, 190_000, 0),
        (190_000, 190_000, 100),
        (197_800, 190_000, 100),  # an overrun saturates inside codex's own function
        (13_780, 190_000, 1),
        (12_001, 12_001, 100),  # the smallest window codex normalises
        (12_000, 12_001, 0),
    ],
)
def test_baseline_rule(tokens: int, window: int, expected: int) -> None:
    assert used_percent(tokens, window) == expected


@pytest.mark.parametrize("window", [None, 0, 1, 11_999, 12_000])
def test_percent_withheld_without_a_normalisable_window_operands_still_published(window: int | None) -> None:
    [reading] = feed(own_producer(), token_usage(9_000, 40_000, window), 7)
    fields = reading.fields
    assert fields.used_percent is None
    assert (fields.used_tokens, fields.window_tokens, fields.session_total_tokens) == (9_000, window, 40_000)


def test_absent_window_key_withholds_the_percent() -> None:
    message = token_usage(9_000, 40_000, 190_000)
    del message["params"]["tokenUsage"]["modelContextWindow"]
    [reading] = feed(own_producer(), message, 7)
    assert (reading.fields.used_percent, reading.fields.window_tokens) == (None, None)


# ---- compaction accounting ------------------------------------------------------------------------


def test_started_and_completed_of_one_item_count_once_even_across_connections() -> None:
    producer = own_producer()
    feed(producer, token_usage(90_800, 121_300, 190_000), 10)
    edges = []
    for method in ["item/started", "item/started", "item/completed", "item/completed"]:
        edges += feed(producer, compaction_item(method, "c1", turn="t"), 20)
    assert len(edges) == 1 and edges[0].compaction_edge
    assert producer.held.compactions.count == 1


def test_two_item_ids_in_one_turn_are_two_compactions() -> None:
    producer = own_producer()
    feed(producer, compaction_item("item/started", "c1", turn="t"), 1)
    feed(producer, compaction_item("item/started", "c2", turn="t"), 2)
    assert producer.held.compactions.count == 2


@pytest.mark.parametrize("legacy_first", [True, False])
def test_the_deprecated_thread_compacted_collapses_with_the_item_of_its_turn(legacy_first: bool) -> None:
    producer = own_producer()
    legacy = {"method": "thread/compacted", "params": {"threadId": "th", "turnId": "t"}}
    items = [
        compaction_item("item/started", "c1", turn="t"),
        compaction_item("item/completed", "c1", turn="t"),
    ]
    sequence = [legacy, *items] if legacy_first else [*items, legacy]
    for message in [*sequence, legacy]:
        feed(producer, message, 1)
    assert producer.held.compactions.count == 1
    feed(producer, {"method": "thread/compacted", "params": {"threadId": "th", "turnId": "u"}}, 2)
    assert producer.held.compactions.count == 2


def test_an_edge_before_any_reading_carries_only_the_count() -> None:
    [edge] = feed(own_producer(), compaction_item("item/started", "c1", turn="t"), 42)
    fields = edge.fields
    assert edge.compaction_edge
    assert (fields.used_tokens, fields.window_tokens, fields.used_percent) == (None, None, None)
    assert (fields.compactions, fields.last_compaction_ms, fields.observed_at_ms) == (1, 42, 42)


def test_other_items_are_not_compactions() -> None:
    producer = own_producer()
    assert feed(producer, compaction_item("item/started", "m1", turn="t", kind="agentMessage"), 1) == []
    assert producer.held.compactions.count == 0


# ---- several threads on one app-server --------------------------------------------------------------


def test_several_threads_last_writer_wins() -> None:
    producer = own_producer()
    [a] = feed(producer, token_usage(150_000, 400_000, 190_000, thread="A"), 1)
    [b] = feed(producer, token_usage(20_000, 20_000, 190_000, thread="B"), 2)
    assert (a.fields.used_tokens, b.fields.used_tokens) == (150_000, 20_000)
    # A compaction on thread A is counted and rides the newest reading, which is thread B's.
    [edge] = feed(producer, compaction_item("item/started", "cA", turn="tA", thread="A"), 3)
    assert (edge.fields.used_tokens, edge.fields.compactions, edge.fields.observed_at_ms) == (20_000, 1, 2)


# ---- replay through the CLI -------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("suffix", [".jsonl", ".timed.jsonl"])
def test_hctx_replay_prints_every_write_with_its_reason(
    version: str, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from wrapper.cli import main

    assert main(["replay", "--harness", "codex", str(recording_of(capture(version, "stdio-main", suffix)))]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["reason"], r["usedPercent"]) for r in lines] == [
        ("bucket", 10), ("rate-limits", 10), ("bucket", 44), ("rate-limits", 44), ("compaction", 44),
        ("rate-limits", 44), ("bucket", 45), ("bucket", 0), ("bucket", 5), ("rate-limits", 5), ("bucket", 92),
        ("rate-limits", 92), ("compaction", 92), ("rate-limits", 92), ("bucket", 93), ("bucket", 0), ("bucket", 4),
        ("rate-limits", 4),
    ]  # fmt: skip
    assert {r["harness"] for r in lines} == {"codex"}
    assert lines[-1]["compactions"] == 2 and lines[-1]["lastCompactionTrigger"] == "unknown"
    assert lines[-1]["sessionTotalTokens"] == 605_450 and lines[-1]["rateLimits"]["sevenDay"] == 46
    emitted = [m["emittedAtMs"] for m in messages(capture(version, "stdio-main")) if "emittedAtMs" in m]
    assert all(min(emitted) <= r["observedAtMs"] <= max(emitted) for r in lines)  # Codex's own clock


def test_both_recording_forms_decode_to_the_same_events() -> None:
    plain = recorded(capture("0.171.0", "stdio-main"))
    timed = recorded(capture("0.171.0", "stdio-main", ".timed.jsonl"))
    assert [event for _, event in plain] == [event for _, event in timed]
    wires = {chunk.wire for chunk in chunks_of(recording_of(capture("0.171.0", "stdio-main", ".timed.jsonl")))}
    assert wires == {"stdout"}
    assert spec_for("codex") is SPEC
    assert isinstance(SPEC.make_producer(), CodexProducer)


def test_a_corrupt_recording_line_is_dropped_not_fatal(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from wrapper.cli import main

    first, *rest = chunks_of(recording_of(capture("0.151.0", "stdio-main")))
    cut = Chunk(first.at_ms, first.wire, b'{"method": "thread/tokenUsage/upd\n', first.stream)
    corrupt = tmp_path / "corrupt.rec"
    corrupt.write_bytes(conformance.recorded("codex", [first, cut, *rest]))
    assert main(["replay", "--harness", "codex", str(corrupt)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 18


# ---- helpers ----------------------------------------------------------------------------------------


def token_usage(last: int, total: int, window: int | None, *, thread: str = "th", turn: str = "t") -> dict[str, Any]:
    def breakdown(n: int) -> dict[str, int]:
        return {"totalTokens": n, "inputTokens": n, "cachedInputTokens": 0, "cacheWriteInputTokens": 0,
                "outputTokens": 0, "reasoningOutputTokens": 0}  # fmt: skip

    return {
        "method": "thread/tokenUsage/updated",
        "params": {
            "threadId": thread,
            "turnId": turn,
            "tokenUsage": {"total": breakdown(total), "last": breakdown(last), "modelContextWindow": window},
        },
        "emittedAtMs": 1,
    }


def window(used: float, minutes: int | None) -> dict[str, Any]:
    return {"usedPercent": used, "windowDurationMins": minutes, "resetsAt": None}


def rate_limits(**windows: dict[str, Any] | None) -> dict[str, Any]:
    snapshot: dict[str, Any] = {"limitId": "codex", "limitName": None, "credits": None, **windows}
    return {"method": "account/rateLimits/updated", "params": {"rateLimits": snapshot}}


def compaction_item(
    method: str, item_id: str, *, turn: str, thread: str = "th", kind: str = "contextCompaction"
) -> dict[str, Any]:
    return {
        "method": method,
        "params": {"item": {"type": kind, "id": item_id}, "threadId": thread, "turnId": turn},
    }


def test_frames_of_another_type_are_refused() -> None:
    decoder = SPEC.decoder("channel")
    [dropped] = decoder.receive_data(json.dumps({"type": "pi.context", "payload": "{}"}).encode() + b"\n")
    assert isinstance(dropped, Dropped) and "codex.rpc" in dropped.reason


# ---- rate limits are the latest snapshot within a frame (issue 19, point 2) -------------------------


def _snapshots(path: Path) -> list[tuple[float | None, float | None]]:
    """(fiveHour, sevenDay) Codex reported in each `account/rateLimits/updated` of a capture."""
    found = []
    for message in messages(path):
        if message.get("method") == "account/rateLimits/updated":
            limits = message["params"]["rateLimits"]
            by_minutes = {w["windowDurationMins"]: w["usedPercent"] for w in (limits["primary"], limits["secondary"])}
            found.append((by_minutes.get(300), by_minutes.get(10_080)))
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scenario", ["stdio-main", "ws-main", "openai-main"])
def test_the_record_carries_codexs_latest_rate_limits_without_restamping(version: str, scenario: str) -> None:
    """Codex sends a request's tokenUsage before its rateLimits: the snapshot must reach the record at
    once (as the held reading with its own observedAtMs), not ride the next reading."""
    from guard.policy import WriteGuard
    from sidecar.pipeline import Pipeline

    path = capture(version, scenario)
    pipeline = Pipeline(own_producer(), WriteGuard("a", "inc"))
    snapshots = _snapshots(path)
    written: list[tuple[str, Any]] = []
    seen = 0
    usage_at: int | None = None  # when the newest reading was taken: its tokenUsage frame's time
    for at_ms, event in recorded(path):
        if isinstance(event, TokenUsage):
            usage_at = at_ms
        for write in pipeline.feed(event, at_ms or 0):
            written.append((write.reason, write.record))
            if write.reason == "rate-limits":
                assert usage_at is not None and at_ms is not None and usage_at <= at_ms
                assert write.record.observed_at_ms == usage_at  # the held reading, never re-stamped
        if isinstance(event, RateLimitsUpdated):
            seen += 1
            last = pipeline.guard.last
            assert last is not None and last.rate_limits is not None, f"snapshot {seen}"
            # Within the frame: the record's limits are Codex's latest snapshot.
            assert (last.rate_limits.five_hour, last.rate_limits.seven_day) == snapshots[seen - 1]
    assert seen == len(snapshots) >= 4
    reasons = [reason for reason, _ in written]
    assert reasons[:2] == ["bucket", "rate-limits"]  # after turn 1 the record holds the turn's limits
    final = written[-1][1]
    assert final.rate_limits is not None
    assert (final.rate_limits.five_hour, final.rate_limits.seven_day) == snapshots[-1]
    stamps = [record.written_at_ms for _, record in written]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # writtenAtMs strictly monotonic
    observed = [record.observed_at_ms for _, record in written]
    assert observed == sorted(observed)  # never a reading older than the one written before it


@pytest.mark.parametrize("version", VERSIONS)
def test_each_snapshot_is_dated_by_its_own_notification(version: str) -> None:
    """Issue 35: a window's `rateLimitsAtMs` is the time its `account/rateLimits/updated` arrived
    (the captured frame's), never the time of the reading that carries it: the next turn's usage
    reading, taken later, still says when its limits came."""
    pipeline_producer = own_producer()
    notified: int | None = None
    checked = 0
    for at_ms, event in recorded(capture(version, "stdio-main")):
        assert at_ms is not None
        readings = pipeline_producer.feed(event, at_ms)
        if isinstance(event, RateLimitsUpdated):
            notified = at_ms
        for reading in readings:
            times = reading.fields.rate_limits_at_ms
            if notified is None:
                assert times is None
                continue
            assert times is not None and (times.five_hour, times.seven_day) == (notified, notified)
            if isinstance(event, TokenUsage):
                assert reading.fields.observed_at_ms > notified  # a later reading, the snapshot's own time
                checked += 1
    assert checked >= 4


def test_a_repeated_snapshot_writes_nothing_and_the_heartbeat_never_restamps() -> None:
    from guard.constants import HARNESS_CONTEXT_HEARTBEAT_MS
    from guard.policy import WriteGuard
    from sidecar.pipeline import Pipeline

    pipeline = Pipeline(own_producer(), WriteGuard("a", "inc"))
    [usage] = decoded(token_usage(50_000, 50_000, 190_000))
    assert [w.reason for w in pipeline.feed(usage, 1_000)] == ["bucket"]
    [limits] = decoded(rate_limits(primary=window(10, 300), secondary=window(40, 10_080)))
    [write] = pipeline.feed(limits, 1_100)
    assert (write.reason, write.record.observed_at_ms, write.record.written_at_ms) == ("rate-limits", 1_000, 1_100)
    assert pipeline.feed(limits, 1_200) == []  # the same snapshot again (Codex re-sends it in compactions)
    # Nothing was re-taken since: the heartbeat has nothing to publish, however long the seat idles.
    assert pipeline.tick(1_100 + 10 * HARNESS_CONTEXT_HEARTBEAT_MS) == []
    assert pipeline.guard.heartbeat_due_ms() is None


# --- compactAtTokens (issue 18) --------------------------------------------------------------------

# The lab's config.toml (../shared/lab/codex/README.md): what the wrapper reads and hands over.
LAB_CONFIG = {"autoCompactTokenLimit": 160_000, "modelContextWindow": 200_000}


def apply_settings(producer: CodexProducer, config: dict[str, Any]) -> None:
    """The settings as the sidecar gets them: the transport config's JSON, validated by its model
    (a config that is not one runs no transport: no settings reach the producer), then the event
    its transport submits first."""
    text = json.dumps({"mode": "channel", **config})
    try:
        settings = CodexTransport.model_validate_json(text).root
    except ValidationError:
        return
    assert producer.feed(settings.compaction(), 0) == []


@pytest.mark.parametrize("version", ["0.151.0", "0.171.0"])
def test_the_configured_limit_is_published_and_is_where_the_lab_run_compacted(version: str) -> None:
    """The lab's main run: 160,000 configured on a 200,000 window. Turn 4 reached 175,900 and Codex
    compacted before turn 5; no reading under 160,000 was followed by an auto-compaction. Published:
    160,000 on every reading — never the 9/10 cap (180,000) nor the reported window (190,000)."""
    producer = own_producer()
    apply_settings(producer, LAB_CONFIG)
    _, readings = run(capture(version, "stdio-main"), producer)
    published = {r.fields.compact_at_tokens for r in readings}
    assert published == {160_000} and 180_000 not in published and 190_000 not in published
    assert {r.fields.window_tokens for r in readings} == {190_000}
    # the reading before the last compaction edge (the auto one) is the first at or over the point
    edges = [i for i, r in enumerate(readings) if r.compaction_edge]
    before_auto = [r.fields.used_tokens or 0 for r in readings[: edges[-1]]]
    assert max(before_auto) == 175_900 >= 160_000
    over = [i for i, r in enumerate(readings) if (r.fields.used_tokens or 0) >= 160_000]
    assert over and over[0] < edges[-1]


@pytest.mark.parametrize(
    ("config", "reported_window", "published"),
    [
        ({"autoCompactTokenLimit": 160_000, "modelContextWindow": 200_000}, 190_000, 160_000),
        ({"autoCompactTokenLimit": 185_000, "modelContextWindow": 200_000}, 190_000, 180_000),  # the 9/10 cap
        ({"autoCompactTokenLimit": 160_000}, 190_000, 160_000),  # under 9/10 of the reported: cannot bind
        ({"autoCompactTokenLimit": 175_000}, 190_000, None),  # the cap may bind on an unstated window
        ({"modelContextWindow": 200_000}, 190_000, None),  # unset: Codex states no effective value
        ({}, 190_000, None),
        ({"autoCompactTokenLimit": True}, 190_000, None),  # not a count
    ],
)
def test_compact_at_is_the_configured_limit_under_codexs_cap(
    config: dict[str, Any], reported_window: int, published: int | None
) -> None:
    producer = own_producer()
    apply_settings(producer, config)
    usage = {"total": {"totalTokens": 5}, "last": {"totalTokens": 5}, "modelContextWindow": reported_window}
    message = {"method": "thread/tokenUsage/updated", "params": {"threadId": "t", "turnId": "u", "tokenUsage": usage}}
    (reading,) = feed(producer, message, 1)
    assert reading.fields.compact_at_tokens == published
    configured = type(config.get("autoCompactTokenLimit")) is int
    assert reading.fields.auto_compaction is (True if configured else None)


def test_without_the_wrappers_config_nothing_is_published() -> None:
    _, readings = run(capture("0.171.0", "stdio-main"))
    assert {r.fields.compact_at_tokens for r in readings} == {None}
