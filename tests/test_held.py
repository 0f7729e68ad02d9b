"""The shared producer kernel (`sidecar.held`): the held reading and the compaction ledger, each rule
on its own, then hostile sequences, and that every producer (and the sixth-harness template) holds
its state there rather than a copy of its own."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import FrameRejected
from guard.policy import windows_at_limit
from guard.record import MAX_COUNT, ContextFields, RateLimits
from sidecar.held import COMPACTION_KEYS_REMEMBERED, CompactionLedger, Held
from sidecar.registry import BUILT_IN, spec_for

T0 = 1_788_000_000_000


def usage(tokens: int, at_ms: int, **fields: Any) -> ContextFields:
    return ContextFields(harness="pi", used_tokens=tokens, window_tokens=100_000, used_percent=tokens / 1000,
                         observed_at_ms=at_ms, **fields)  # fmt: skip


def compaction_fields(fields: ContextFields) -> tuple[int, int | None, str | None]:
    return fields.compactions, fields.last_compaction_ms, fields.last_compaction_trigger


# --- the ledger ------------------------------------------------------------------------------------


def test_each_edge_counts_one_at_its_own_time_with_its_trigger() -> None:
    ledger = CompactionLedger()
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (0, None, None)  # none known: no time, no trigger
    assert ledger.counted(T0, "manual")
    assert ledger.counted(T0 + 50)  # a harness that names none: unknown, never a guess
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (2, T0 + 50, "unknown")
    assert ledger.fields() == {"compactions": 2, "last_compaction_ms": T0 + 50, "last_compaction_trigger": "unknown"}


def test_a_keyed_edge_counts_once_however_often_it_is_delivered() -> None:
    ledger = CompactionLedger()
    assert ledger.counted(T0, key="evt-1")
    assert not ledger.counted(T0 + 10, key="evt-1")  # the same event again: nothing moves
    assert (ledger.count, ledger.last_ms) == (1, T0)
    assert ledger.counted(T0 + 20, key="evt-2")
    assert ledger.count == 2


def test_the_keys_remembered_are_bounded_the_oldest_forgotten_first() -> None:
    ledger = CompactionLedger()
    for n in range(COMPACTION_KEYS_REMEMBERED + 10):
        ledger.counted(T0 + n, key=n)
    assert len(ledger._keys) == COMPACTION_KEYS_REMEMBERED
    assert not ledger.counted(T0, key=COMPACTION_KEYS_REMEMBERED + 9)  # a recent one is still known
    assert ledger.counted(T0, key=0)  # the oldest was let go: a hostile stream cannot grow the ring


def test_a_stated_count_wins_over_the_one_held_even_a_lower_one() -> None:
    ledger = CompactionLedger()
    ledger.counted(T0, "threshold", stated=3)  # the store already holds this compaction
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (3, T0, "threshold")
    ledger.stated(1)  # a count going down: another session's store, taken as said
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (1, T0, "threshold")
    ledger.counted(T0 + 5)  # an edge whose store could not be read counts on from what is held
    assert ledger.count == 2


def test_a_stated_zero_forgets_the_last_compaction_and_a_first_count_takes_the_stores_time() -> None:
    ledger = CompactionLedger()
    ledger.counted(T0, "manual")
    ledger.stated(0)  # a new session with no compaction: the last one was another's
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (0, None, None)
    ledger.stated(2, T0 - 9_000)  # a resumed session: its compaction at the store's own time
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (2, T0 - 9_000, None)  # the store names no trigger
    ledger.stated(2, T0 - 1)  # a time already known is not replaced by a later statement
    assert ledger.last_ms == T0 - 9_000


def test_a_finished_compaction_moves_its_time_forward_never_back() -> None:
    ledger = CompactionLedger()
    ledger.counted(T0, "auto")
    ledger.finished(T0 + 900)
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (1, T0 + 900, "auto")
    ledger.finished(T0 + 100)  # a clock stepped back: it cannot have finished before it did
    assert ledger.last_ms == T0 + 900


def test_a_new_session_forgets_the_time_and_trigger_and_keeps_the_count() -> None:
    ledger = CompactionLedger()
    ledger.counted(T0, "manual")
    ledger.new_session()
    assert (ledger.count, ledger.last_ms, ledger.trigger, ledger.owed) == (1, None, None, False)


# --- the held reading ------------------------------------------------------------------------------


def test_a_new_reading_carries_the_ledger_and_the_rows() -> None:
    held = Held("pi")
    held.measured(usage(10_000, T0))
    [edge] = held.compacted(T0 + 100, "manual")
    held.subagent("child", T0 + 150, state="running")
    after = held.measured(usage(2_000, T0 + 200))
    assert compaction_fields(after.fields) == (1, T0 + 100, "manual")  # a new reading forgets none of them
    assert [row.id for row in after.fields.subagents] == ["child"]
    assert not after.compaction_edge and edge.compaction_edge
    assert held.reading is after.fields


def test_an_edge_keeps_the_held_numbers_and_their_time() -> None:
    held = Held("pi")
    held.measured(usage(10_000, T0, model="m"))
    [edge] = held.compacted(T0 + 5_000, "threshold", harness_version="1.6.0")
    # The held numbers and their time, not re-stamped:
    assert (edge.fields.used_tokens, edge.fields.model, edge.fields.observed_at_ms) == (10_000, "m", T0)
    assert compaction_fields(edge.fields) == (1, T0 + 5_000, "threshold")
    assert edge.fields.harness_version == "1.6.0"  # a held fact newer than the reading is restated with it
    assert edge.compaction_edge


def test_an_edge_before_any_reading_is_the_count_alone_taken_now() -> None:
    held = Held("codex")
    [edge] = held.compacted(T0)
    assert edge.compaction_edge and edge.fields.observed_at_ms == T0
    assert (edge.fields.used_tokens, edge.fields.window_tokens, edge.fields.used_percent) == (None, None, None)
    assert edge.fields.compactions == 1


def test_an_edge_that_waits_rides_the_first_reading() -> None:
    held = Held("claude", edge_waits_for_reading=True)
    assert held.compacted(T0, "auto") == []
    first = held.measured(usage(0, T0 + 10))
    assert first.compaction_edge and compaction_fields(first.fields) == (1, T0, "auto")
    assert not held.measured(usage(10, T0 + 20)).compaction_edge  # the edge is published once


def test_a_new_session_forgets_the_held_reading() -> None:
    held = Held("pi")
    held.measured(usage(10_000, T0))
    held.compacted(T0 + 1, "manual")
    held.new_session()
    assert held.reading is None
    assert compaction_fields(held.measured(usage(5, T0 + 2)).fields) == (1, None, None)


def test_every_reading_names_what_the_harness_proves_exhausted() -> None:
    held = Held("claude", exhausted=lambda fields: windows_at_limit(fields.rate_limits))
    reading = held.measured(usage(1, T0, rate_limits=RateLimits(five_hour=100.0, seven_day=3.0)))
    assert reading.exhausted == {"fiveHour"}
    [edge] = held.compacted(T0 + 1)
    assert edge.exhausted == {"fiveHour"}
    assert Held("codex").measured(usage(1, T0, rate_limits=RateLimits(five_hour=100.0))).exhausted == frozenset()


# --- subagent rows ---------------------------------------------------------------------------------


def test_a_subagents_row_rides_the_held_reading_unstamped() -> None:
    held = Held("codex")
    held.measured(usage(10_000, T0))
    [reading] = held.subagent("t-1", T0 + 500, state="running", used_tokens=4_000)
    assert reading.fields.observed_at_ms == T0 and reading.fields.used_tokens == 10_000  # the parent's, as held
    [row] = reading.fields.subagents
    assert (row.id, row.state, row.used_tokens, row.observed_at_ms) == ("t-1", "running", 4_000, T0 + 500)
    assert held.subagent("t-1", T0 + 600, state="running", used_tokens=4_000) != []  # its time moved: a new row
    assert held.subagent("t-1", T0 + 600, state="running", used_tokens=4_000) == []  # nothing changed: no reading
    assert held.subagent("t-1", T0 + 700, used_tokens=-1) == []  # a row that does not validate is refused whole
    assert held.subagents.get("t-1") is not None and held.subagents.get("t-1").used_tokens == 4_000  # type: ignore[union-attr]


def test_a_subagents_compaction_is_counted_on_its_row_never_the_agents() -> None:
    held = Held("opencode")
    [first] = held.subagent_compacted("child", T0)  # a row not seen yet: its first compaction
    [second] = held.subagent_compacted("child", T0 + 1)
    assert [row.compactions for row in first.fields.subagents] == [1]
    assert [row.compactions for row in second.fields.subagents] == [2]
    assert held.compactions.count == 0 and not second.compaction_edge


# --- hostile input ---------------------------------------------------------------------------------

NOT_COUNTS = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=MAX_COUNT + 1), st.booleans(), st.floats(), st.text(max_size=3)
)
NOT_TIMES = st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(), st.none(), st.text(max_size=3))


@given(count=NOT_COUNTS)
def test_a_stated_count_that_is_no_count_is_refused_and_changes_nothing(count: Any) -> None:
    held = Held("pi")
    held.measured(usage(1, T0))
    held.compacted(T0 + 1, "manual", stated=2)
    before = (compaction_fields(held.reading), held.reading) if held.reading else None
    with pytest.raises(FrameRejected):
        held.compacted(T0 + 2, stated=count)
    with pytest.raises(FrameRejected):
        held.compactions.stated(count)
    assert held.reading is not None and (compaction_fields(held.reading), held.reading) == before
    assert (held.compactions.count, held.compactions.last_ms, held.compactions.trigger) == (2, T0 + 1, "manual")


@given(at=NOT_TIMES)
def test_a_time_that_is_no_time_is_refused_and_changes_nothing(at: Any) -> None:
    ledger = CompactionLedger()
    ledger.counted(T0, "auto", key="k")
    for refused in (lambda: ledger.counted(at, key="other"), lambda: ledger.finished(at)):
        with pytest.raises(FrameRejected):
            refused()
    if at is not None:
        with pytest.raises(FrameRejected):
            ledger.stated(3, at)
    assert (ledger.count, ledger.last_ms, ledger.trigger) == (1, T0, "auto")
    assert ledger.counted(T0 + 1, key="other")  # the refused edge did not use up its key


def test_the_count_never_runs_past_what_a_record_can_carry() -> None:
    ledger = CompactionLedger()
    ledger.stated(MAX_COUNT)
    with pytest.raises(FrameRejected):
        ledger.counted(T0)
    assert ledger.count == MAX_COUNT and ledger.last_ms is None


Step = tuple[str, int, int]  # (what, a time, a key or a stated count)
KINDS = st.sampled_from(["edge", "keyed", "stated", "finished", "reading", "session", "row"])
STEPS = st.lists(st.tuples(KINDS, st.integers(0, 2**41), st.integers(0, 6)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_out_of_order_times_and_counts_going_down_never_make_a_number_up(steps: list[Step]) -> None:
    """Whatever the order of times, the keys and the stated counts: the count is exactly what the
    edges and statements make it; the last compaction's time is one an event carried; an edge or a
    row never re-stamps the held reading; every reading carries the ledger as it stands."""
    held, ledger = Held("pi"), CompactionLedger()
    held.compactions = ledger
    count, keys, times = 0, set(), {None}
    for what, at, value in steps:
        readings = []
        measured_at = held.reading.observed_at_ms if held.reading is not None else None
        if what == "edge":
            readings = held.compacted(at)
            count += 1
        elif what == "keyed":
            readings = held.compacted(at, key=value)
            count += value not in keys
            keys.add(value)
        elif what == "stated":
            ledger.stated(value, at)
            count = value
        elif what == "finished":
            ledger.finished(at)
        elif what == "reading":
            readings = [held.measured(usage(value, at))]
        elif what == "session":
            held.new_session()
            times = {None}
        else:
            readings = held.subagent(f"r{value}", at, state="running")
        times.add(at)
        assert ledger.count == count
        assert ledger.last_ms in times  # a time some event carried, never one made up
        for reading in readings:
            if what != "row":  # a row restates the held reading as it is; its ledger rides the next one
                assert compaction_fields(reading.fields) == (ledger.count, ledger.last_ms, ledger.trigger)
            if what != "reading" and measured_at is not None:
                assert reading.fields.observed_at_ms == measured_at  # nothing was re-measured
        if what == "edge" and readings:
            assert ledger.last_ms == at  # the newest edge's own time, even one before the last


# --- every producer holds its state here -----------------------------------------------------------


@pytest.mark.parametrize("harness", list(BUILT_IN))
def test_every_producer_holds_its_reading_and_ledger_in_the_kernel(harness: str) -> None:
    producer = spec_for(harness).make_producer()
    held = getattr(producer, "held", None)
    assert isinstance(held, Held) and held.harness == harness
    # No copy of its own beside the kernel's (the names the four ledgers had before it).
    copies = {"compactions", "last_compaction_ms", "last_compaction_trigger", "last_reading", "last", "_reading",
              "_compaction", "_edge_pending", "_counted_compactions", "subagents"}  # fmt: skip
    assert copies & set(vars(producer)) == set()


def test_the_sixth_harness_template_uses_the_kernel() -> None:
    from tests.sixth_harness.spec import SixthProducer

    assert isinstance(SixthProducer().held, Held)
