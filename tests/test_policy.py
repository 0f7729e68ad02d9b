"""The write policy (HC-R09, HC-R10): properties over random reading streams, then the edges one by one.

The oracle below is the spec's decision list written out independently of guard/policy.py:
compaction edge, a change of floor(used / 1% of window) since the last written reading (withheld
and known are different buckets), a change of proven Claude exhaustion, or a record older than the
heartbeat while a reading newer than it is held. Anything else is a skip.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from guard_factory import fields
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.constants import HARNESS_CONTEXT_BUCKET_PERCENT, HARNESS_CONTEXT_HEARTBEAT_MS
from guard.policy import Reading, Write, WriteGuard, heartbeat_seconds, windows_at_limit
from guard.record import MAX_COUNT, ContextFields, HarnessContext, RateLimits

HEARTBEAT = HARNESS_CONTEXT_HEARTBEAT_MS
BUCKETS_PER_FILL = 100 // HARNESS_CONTEXT_BUCKET_PERCENT
START_MS = 1_788_000_000_000
READING_KEYS = tuple(ContextFields.model_fields)

# --- the oracle ------------------------------------------------------------------------------


def expected_bucket(reading: ContextFields) -> tuple[str | None, int | None, int | None, int | None]:
    """The tokens' 1% bucket and the displayed percent's 1% bucket, keyed by session and window (issue 19)."""
    used, window, shown = reading.used_tokens, reading.window_tokens, reading.used_percent
    tokens = (used * 100) // (window * HARNESS_CONTEXT_BUCKET_PERCENT) if used is not None and window else None
    displayed = None if shown is None else math.floor(shown / HARNESS_CONTEXT_BUCKET_PERCENT)
    return reading.session_id, window, tokens, displayed


def expected_exhausted(reading: ContextFields) -> frozenset[str]:
    """Which windows a producer proves exhausted, as Claude's does (a window at 100% stops it);
    the other harnesses prove none. A change of the set is an edge (issue 4)."""
    limits = reading.rate_limits
    if reading.harness != "claude" or limits is None:
        return frozenset()
    windows = {"fiveHour": limits.five_hour, "sevenDay": limits.seven_day}
    return frozenset(name for name, v in windows.items() if v is not None and v >= 100)


def offered(fields: ContextFields, compaction_edge: bool = False) -> Reading:
    """The reading as its producer hands it over: with the windows it proves exhausted."""
    return Reading(fields, compaction_edge, exhausted=expected_exhausted(fields))


def reading_of(record: HarnessContext) -> dict[str, Any]:
    return {key: getattr(record, key) for key in READING_KEYS}


# --- streams ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    advance_ms: int
    reading: ContextFields | None  # None: re-offer the previous reading (no new reading behind it)
    compaction_edge: bool


@dataclass(frozen=True)
class Tick:
    advance_ms: int


Step = Offer | Tick

# Strategies are built once here: building them inside a composite re-validates them per draw.
advances = st.one_of(
    st.just(0), st.integers(0, 5), st.integers(0, 60_000), st.integers(HEARTBEAT - 2, HEARTBEAT + 2),
    st.integers(HEARTBEAT, 3 * HEARTBEAT),
)  # fmt: skip
windows = st.sampled_from([None, 0, 1, 4000, 200_000, 258_400, 1_000_000])
limits = st.one_of(st.none(), st.sampled_from([0.0, 55.0, 99.9, 100.0, 100.0001, 131.5]))
rate_limits = st.one_of(st.none(), st.builds(RateLimits, five_hour=limits, seven_day=limits))
percents = st.one_of(st.none(), st.floats(0, 600, allow_nan=False), st.integers(0, 100).map(float))
# used as thousandths of the window (up to a 20% overrun), withheld, or an absurd count
used_shares = st.one_of(st.none(), st.integers(0, 1200), st.integers(10**6, MAX_COUNT).map(lambda n: -n))
kinds = st.sampled_from(["fresh", "fresh", "fresh", "echo", "tick", "tick"])
rare = st.integers(0, 7).map(lambda n: n == 0)


@st.composite
def readings(draw: st.DrawFn, harness: str, window: int | None) -> ContextFields:
    if draw(st.integers(0, 9)) == 0:  # occasionally the window itself changes or is withheld
        window = draw(windows)
    share = draw(used_shares)
    used = None if share is None else -share if share < 0 else (window or 1000) * share // 1000
    return fields(
        harness=harness, window_tokens=window, used_tokens=used, used_percent=draw(percents),
        rate_limits=draw(rate_limits), compactions=draw(st.integers(0, 3)), observed_at_ms=0,
    )  # fmt: skip


@st.composite
def streams(draw: st.DrawFn, max_steps: int = 40) -> list[Step]:
    harness = draw(st.sampled_from(["claude", "codex", "pi", "opencode"]))
    window = draw(st.sampled_from([None, 4000, 200_000, 258_400]))
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(kinds)
        advance = draw(advances)
        if kind == "tick":
            steps.append(Tick(advance))
        elif kind == "echo":
            steps.append(Offer(advance, None, draw(st.booleans())))
        else:
            steps.append(Offer(advance, draw(readings(harness, window)), draw(rare)))
    return steps


@dataclass
class Run:
    """One stream through a WriteGuard, with everything the properties need recorded."""

    # (step index, now_ms, the write, the record written before it or None, was it a tick)
    writes: list[tuple[int, int, Write, HarnessContext | None, bool]] = field(default_factory=list)
    offered: list[tuple[int, int, Reading]] = field(default_factory=list)  # (step, now_ms, reading)
    ticks: list[tuple[int, int, HarnessContext | None]] = field(default_factory=list)


def play(steps: list[Step]) -> Run:
    guard = WriteGuard("alice", "inc-1")
    run = Run()
    now = START_MS
    previous: ContextFields | None = None
    for index, step in enumerate(steps):
        now += step.advance_ms
        before = guard.last
        if isinstance(step, Tick):
            write = guard.tick(now)
            run.ticks.append((index, now, before))
        else:
            if step.reading is not None:
                previous = step.reading.model_copy(update={"observed_at_ms": now})
            if previous is None:
                continue
            reading = offered(previous, step.compaction_edge)
            run.offered.append((index, now, reading))
            write = guard.offer(reading, now)
        if write is not None:
            guard.committed(write)
            run.writes.append((index, now, write, before, isinstance(step, Tick)))
    return run


STREAM_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- properties over random streams ----------------------------------------------------------


@STREAM_SETTINGS
@given(streams())
def test_every_bucket_entry_and_every_edge_is_written(steps: list[Step]) -> None:
    run = play(steps)
    written_at_step = {index: write for index, _, write, _, tick in run.writes if not tick}
    last: HarnessContext | None = None
    for index, _, reading in run.offered:
        must_write = (
            reading.compaction_edge
            or last is None
            or expected_bucket(reading.fields) != expected_bucket(last)
            or expected_exhausted(reading.fields) != expected_exhausted(last)
        )
        write = written_at_step.get(index)
        if must_write:
            assert write is not None, f"step {index} had to be written"
            assert reading_of(write.record) == dict(reading.fields)
            expected_reason = (
                "compaction" if reading.compaction_edge
                else "bucket" if last is None or expected_bucket(reading.fields) != expected_bucket(last)
                else "exhaustion"
            )  # fmt: skip
            assert write.reason == expected_reason
        # ticks between offers may have written too; the latest write is the comparison point
        later = [w for i, _, w, _, _ in run.writes if i <= index]
        last = later[-1].record if later else None


@STREAM_SETTINGS
@given(streams())
def test_no_write_without_a_fresh_reading(steps: list[Step]) -> None:
    run = play(steps)
    for index, now, write, before, tick in run.writes:
        if write.reason != "heartbeat":
            continue
        # A heartbeat re-publishes a reading newer than the record, never re-stamps the record.
        assert before is not None
        assert write.record.observed_at_ms > before.observed_at_ms, f"step {index} re-stamped"
        assert now - before.written_at_ms >= HEARTBEAT
        if tick:
            assert any(dict(r.fields) == reading_of(write.record) for i, _, r in run.offered if i < index)
    # The skip rule: an offer with no edge, no bucket or exhaustion change and nothing fresh is
    # never written, however much time has passed.
    written = {index for index, *_ in run.writes}
    for index, now, reading in run.offered:
        previous = [(w, n) for i, n, w, _, _ in run.writes if i < index]
        if not previous or reading.compaction_edge:
            continue
        last, _ = previous[-1]
        unchanged = expected_bucket(reading.fields) == expected_bucket(last.record) and expected_exhausted(
            reading.fields
        ) == expected_exhausted(last.record)
        fresh = reading.fields.observed_at_ms > last.record.observed_at_ms
        if unchanged and not fresh:
            assert index not in written, f"step {index} wrote a reading that was already published"
        if unchanged and fresh:
            assert (index in written) == (now - last.record.written_at_ms >= HEARTBEAT)


@STREAM_SETTINGS
@given(streams())
def test_tick_without_a_new_reading_never_writes(steps: list[Step]) -> None:
    run = play(steps)
    written = {index: (write, tick) for index, _, write, _, tick in run.writes}
    for index, now, before in run.ticks:
        newer_offered = before is not None and any(
            r.fields.observed_at_ms > before.observed_at_ms for i, _, r in run.offered if i < index
        )
        if not newer_offered:
            assert index not in written, f"tick at step {index} wrote with no new reading"
        elif index in written:
            assert written[index][0].reason == "heartbeat"
            assert before is not None and now >= before.written_at_ms + HEARTBEAT


@STREAM_SETTINGS
@given(streams())
def test_heartbeat_publishes_a_held_reading_once_due(steps: list[Step]) -> None:
    run = play(steps)
    writes_before = {index: before for index, _, _, before, _ in run.writes}
    for index, now, before in run.ticks:
        if before is None or now < before.written_at_ms + HEARTBEAT:
            continue
        last_write_index = max((i for i, *_ in run.writes if i < index), default=-1)
        held = [
            r for i, _, r in run.offered
            if last_write_index < i < index and r.fields.observed_at_ms > before.observed_at_ms
        ]  # fmt: skip
        if held:
            assert index in writes_before, f"tick at step {index} left a fresh reading unpublished"


@STREAM_SETTINGS
@given(streams())
def test_observed_at_is_never_restamped(steps: list[Step]) -> None:
    run = play(steps)
    offered = [dict(r.fields) for _, _, r in run.offered]
    for index, _, write, _, _ in run.writes:
        assert reading_of(write.record) in offered, f"step {index} wrote a reading nobody offered"


@STREAM_SETTINGS
@given(streams())
def test_written_at_is_strictly_increasing(steps: list[Step]) -> None:
    stamps = [write.record.written_at_ms for _, _, write, _, _ in play(steps).writes]
    assert all(a < b for a, b in itertools.pairwise(stamps))


@st.composite
def monotone_fills(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[bool]]:
    window = draw(st.integers(1, 10**7))
    used = sorted(draw(st.lists(st.integers(0, window), min_size=1, max_size=400)))
    gaps = draw(st.lists(st.sampled_from([0, 0, 0, 1, 1000, HEARTBEAT]), min_size=len(used), max_size=len(used)))
    edges = draw(st.lists(st.integers(0, 30).map(lambda n: n == 0), min_size=len(used), max_size=len(used)))
    return window, used, gaps, edges


@settings(max_examples=200, deadline=None)
@given(monotone_fills())
def test_at_most_one_write_per_bucket_per_window_fill(fill: tuple[int, list[int], list[int], list[bool]]) -> None:
    window, used, gaps, edges = fill
    steps: list[Step] = [
        Offer(gap, fields(harness="codex", window_tokens=window, used_tokens=u), edge)
        for u, gap, edge in zip(used, gaps, edges, strict=True)
    ]
    reasons = [write.reason for _, _, write, _, _ in play(steps).writes]
    # The first write enters the starting bucket; a fill can then enter at most 100 more.
    assert reasons.count("bucket") <= BUCKETS_PER_FILL + 1
    assert len(reasons) <= BUCKETS_PER_FILL + 1 + sum(edges) + reasons.count("heartbeat")
    assert "exhaustion" not in reasons


# --- the rules one at a time -----------------------------------------------------------------


def _offer_all(guard: WriteGuard, readings: list[ContextFields], now_ms: int | None = None) -> list[Write]:
    writes = []
    for reading in readings:
        write = guard.offer(offered(reading), reading.observed_at_ms if now_ms is None else now_ms)
        if write is not None:
            guard.committed(write)
            writes.append(write)
    return writes


def test_a_full_fill_writes_exactly_one_record_per_bucket_entry() -> None:
    window = 20_000
    guard = WriteGuard("alice", "inc-1")
    stream = [fields(harness="codex", window_tokens=window, used_tokens=u, observed_at_ms=START_MS + u)
              for u in range(window + 1)]  # fmt: skip
    writes = _offer_all(guard, stream, now_ms=START_MS)  # the clock stands still: no heartbeat
    assert len(writes) == BUCKETS_PER_FILL + 1
    assert [w.record.used_tokens for w in writes] == [math.ceil(k * window / 100) for k in range(101)]
    assert {w.reason for w in writes} == {"bucket"}


def test_bucket_is_exact_integer_floor_even_for_huge_operands() -> None:
    # At the top of the range, floor(used * 100 / window) in floating point reads 1,080,863,910,568,919
    # of 2**53 as bucket 12; it is the last token of bucket 11.
    guard = WriteGuard("alice", "inc-1")
    window, first_of_12 = MAX_COUNT, -(-12 * MAX_COUNT // 100)
    last_of_11 = fields(harness="codex", window_tokens=window, used_tokens=first_of_12 - 1, observed_at_ms=1)
    entering_12 = fields(harness="codex", window_tokens=window, used_tokens=first_of_12, observed_at_ms=2)
    assert [w.reason for w in _offer_all(guard, [last_of_11, entering_12], now_ms=10)] == ["bucket", "bucket"]


def test_withheld_and_known_are_different_buckets() -> None:
    guard = WriteGuard("alice", "inc-1")
    base: dict[str, Any] = {"harness": "claude", "window_tokens": 200_000}
    stream = [
        fields(**base, used_tokens=None, observed_at_ms=1),  # window known, use withheld
        fields(**base, used_tokens=0, observed_at_ms=2),  # known: bucket 0 is not "withheld"
        fields(**base, used_tokens=1, observed_at_ms=3),  # same bucket 0: skipped
        fields(**base, used_tokens=None, observed_at_ms=4),  # withheld again
        fields(**base, used_tokens=None, used_percent=0.5, observed_at_ms=5),  # Claude's own percent
    ]
    writes = _offer_all(guard, stream, now_ms=10)
    assert [w.record.observed_at_ms for w in writes] == [1, 2, 4, 5]
    assert all(w.reason == "bucket" for w in writes)


def test_percent_over_100_keeps_moving_buckets() -> None:
    guard = WriteGuard("alice", "inc-1")
    stream = [fields(harness="pi", window_tokens=None, used_percent=p, observed_at_ms=i)
              for i, p in enumerate([99.5, 100.2, 100.9, 585.6], start=1)]  # fmt: skip
    assert [w.record.used_percent for w in _offer_all(guard, stream, now_ms=10)] == [99.5, 100.2, 585.6]


def _claude_limits(five_hour: float | None, harness: str = "claude", at: int = 1) -> ContextFields:
    return fields(harness=harness, window_tokens=200_000, used_tokens=50_000, observed_at_ms=at,
                  rate_limits=RateLimits(five_hour=five_hour, seven_day=40.0))  # fmt: skip


def test_claude_exhaustion_and_reset_are_edges() -> None:
    guard = WriteGuard("alice", "inc-1")
    stream = [_claude_limits(v, at=i) for i, v in enumerate([50.0, 99.0, 100.0, 120.0, 40.0, 60.0], start=1)]
    writes = _offer_all(guard, stream, now_ms=10)
    assert [(w.reason, w.record.rate_limits.five_hour if w.record.rate_limits else None) for w in writes] == [
        ("bucket", 50.0), ("exhaustion", 100.0), ("exhaustion", 40.0),
    ]  # fmt: skip


def test_claude_seven_day_exhaustion_is_an_edge() -> None:
    guard = WriteGuard("alice", "inc-1")
    exhausted = _claude_limits(10.0, at=2).model_copy(
        update={"rate_limits": RateLimits(five_hour=10.0, seven_day=100.0)}
    )
    writes = _offer_all(guard, [_claude_limits(10.0), exhausted], now_ms=10)
    assert [w.reason for w in writes] == ["bucket", "exhaustion"]


def test_a_second_claude_window_exhausting_is_an_edge_of_its_own() -> None:
    guard = WriteGuard("alice", "inc-1")
    five_hour = _claude_limits(100.0, at=1)
    both = five_hour.model_copy(
        update={"observed_at_ms": 2, "rate_limits": RateLimits(five_hour=100.0, seven_day=100.0)}
    )
    assert [w.reason for w in _offer_all(guard, [five_hour, both], now_ms=10)] == ["bucket", "exhaustion"]


def test_codex_window_reaching_100_is_not_an_edge() -> None:
    guard = WriteGuard("alice", "inc-1")
    stream = [_claude_limits(v, harness="codex", at=i) for i, v in enumerate([50.0, 100.0, 40.0], start=1)]
    assert [w.reason for w in _offer_all(guard, stream, now_ms=10)] == ["bucket"]


def test_compaction_edge_writes_even_without_a_new_reading() -> None:
    guard = WriteGuard("alice", "inc-1")
    held = fields(harness="codex", window_tokens=1000, used_tokens=500, observed_at_ms=100)
    assert _offer_all(guard, [held], now_ms=100)
    edge = held.model_copy(update={"compactions": 1, "last_compaction_trigger": "unknown"})
    write = guard.offer(Reading(edge, compaction_edge=True), 100)
    assert write is not None and write.reason == "compaction"
    assert write.record.observed_at_ms == 100  # the held reading's time, not re-stamped
    assert write.record.compactions == 1


def test_heartbeat_republishes_a_held_fresh_reading_once_due() -> None:
    guard = WriteGuard("alice", "inc-1")
    first = fields(harness="codex", window_tokens=1000, used_tokens=500, observed_at_ms=START_MS)
    assert _offer_all(guard, [first])
    same_bucket = first.model_copy(update={"used_tokens": 505, "observed_at_ms": START_MS + 1000})
    assert guard.offer(Reading(same_bucket), START_MS + 1000) is None
    assert guard.heartbeat_due_ms() == START_MS + HEARTBEAT
    assert guard.tick(START_MS + HEARTBEAT - 1) is None
    write = guard.tick(START_MS + HEARTBEAT)
    assert write is not None and write.reason == "heartbeat"
    assert write.record.observed_at_ms == START_MS + 1000  # the reading's time, never the tick's
    assert write.record.written_at_ms == START_MS + HEARTBEAT
    guard.committed(write)
    assert guard.tick(START_MS + 10 * HEARTBEAT) is None  # nothing new since: the record ages


@pytest.mark.parametrize("interval_ms", [None, 20_000, 1_000, HEARTBEAT])
def test_heartbeat_beats_at_the_configured_interval_and_the_spec_s_by_default(interval_ms: int | None) -> None:
    """HCTX_HEARTBEAT_S reaches the guard as `heartbeat_ms`: the held reading is due, by tick and by
    offer, exactly one interval after the last write, never earlier; unset, the spec's 5 minutes."""
    beat = HEARTBEAT if interval_ms is None else interval_ms
    for by_offer in (False, True):
        guard = WriteGuard("alice", "inc-1") if interval_ms is None else WriteGuard("alice", "inc-1", heartbeat_ms=beat)
        first = fields(harness="codex", window_tokens=1000, used_tokens=500, observed_at_ms=START_MS)
        assert _offer_all(guard, [first])
        for n in (1, 2):  # two beats in a row, each one interval after the write before it
            last = guard.last
            assert last is not None
            redraw = first.model_copy(update={"observed_at_ms": last.written_at_ms + 500})
            assert guard.offer(Reading(redraw), last.written_at_ms + 500) is None
            assert guard.heartbeat_due_ms() == last.written_at_ms + beat
            assert guard.tick(last.written_at_ms + beat - 1) is None
            if by_offer:
                again = redraw.model_copy(update={"observed_at_ms": last.written_at_ms + beat})
                write = guard.offer(Reading(again), last.written_at_ms + beat)
            else:
                write = guard.tick(last.written_at_ms + beat)
            assert write is not None and write.reason == "heartbeat", n
            assert write.record.written_at_ms == START_MS + n * beat
            guard.committed(write)


def test_a_heartbeat_is_asked_for_in_whole_seconds_within_the_spec_s() -> None:
    assert [heartbeat_seconds(text) for text in ("1", "20", " 300\n")] == [1, 20, 300]
    for bad, why in [("0", "outside"), ("301", "outside"), ("-5", "outside"), ("2.5", "not"), ("", "not"),
                     ("20s", "not"), ("1e3", "not")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"{why} whole seconds from 1 to 300"):
            heartbeat_seconds(bad)


def test_heartbeat_never_fires_without_a_new_reading() -> None:
    guard = WriteGuard("alice", "inc-1")
    only = fields(harness="codex", window_tokens=1000, used_tokens=500, observed_at_ms=START_MS)
    assert _offer_all(guard, [only])
    assert guard.heartbeat_due_ms() is None
    for hours in range(1, 30):
        now = START_MS + hours * 3_600_000
        assert guard.tick(now) is None
        assert guard.offer(Reading(only), now) is None  # the same reading offered again


def test_fresh_offer_past_the_heartbeat_writes_at_once() -> None:
    guard = WriteGuard("alice", "inc-1")
    first = fields(harness="codex", window_tokens=1000, used_tokens=500, observed_at_ms=START_MS)
    assert _offer_all(guard, [first])
    late = first.model_copy(update={"observed_at_ms": START_MS + HEARTBEAT})
    write = guard.offer(Reading(late), START_MS + HEARTBEAT)
    assert write is not None and write.reason == "heartbeat"


def test_written_at_strictly_increases_within_one_millisecond_and_backwards_clocks() -> None:
    guard = WriteGuard("alice", "inc-1")
    stream = [fields(harness="codex", window_tokens=100, used_tokens=u, observed_at_ms=5) for u in range(6)]
    stamps = [w.record.written_at_ms for w in _offer_all(guard, stream, now_ms=1_000)]
    assert stamps == [1_000, 1_001, 1_002, 1_003, 1_004, 1_005]
    back = fields(harness="codex", window_tokens=100, used_tokens=50, observed_at_ms=5)
    write = guard.offer(Reading(back), 10)  # the wall clock stepped back
    assert write is not None and write.record.written_at_ms == 1_006


def test_guard_resumes_from_an_existing_record() -> None:
    on_disk = HarnessContext(**dict(fields(harness="codex", window_tokens=1000, used_tokens=500)),
                             agent="alice", incarnation="old", written_at_ms=9_000)  # fmt: skip
    guard = WriteGuard("alice", "new", last=on_disk)
    same = fields(harness="codex", window_tokens=1000, used_tokens=500, observed_at_ms=2_000)
    assert guard.offer(Reading(same), 9_000) is None
    moved = same.model_copy(update={"used_tokens": 900})
    write = guard.offer(Reading(moved), 5_000)
    assert write is not None
    assert (write.record.incarnation, write.record.written_at_ms) == ("new", 9_001)


def test_exhaustion_is_what_the_producer_proves_whatever_the_limits_say() -> None:
    """The guard names no harness: a window at 100% is an edge only when the producer says its
    harness stops there, and a proven set that changes is one whatever the numbers."""
    guard = WriteGuard("alice", "inc-1")
    at_limit = _claude_limits(100.0, harness="codex", at=1)
    assert [w.reason for w in _offer_all(guard, [at_limit])] == ["bucket"]
    assert guard.offer(Reading(at_limit.model_copy(update={"observed_at_ms": 2})), 2) is None
    proven = guard.offer(Reading(at_limit.model_copy(update={"observed_at_ms": 3}), exhausted=frozenset({"x"})), 3)
    assert proven is not None and proven.reason == "exhaustion"
    guard.committed(proven)
    lifted = guard.offer(Reading(at_limit.model_copy(update={"observed_at_ms": 4})), 4)
    assert lifted is not None and lifted.reason == "exhaustion"


def test_windows_at_limit_reads_the_snapshot_alone() -> None:
    assert windows_at_limit(None) == frozenset()
    assert windows_at_limit(RateLimits(five_hour=100.0, seven_day=99.9)) == {"fiveHour"}
    assert windows_at_limit(RateLimits(five_hour=None, seven_day=120.0)) == {"sevenDay"}
