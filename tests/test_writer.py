"""The writer on trio's MockClock: heartbeat and retry happen exactly when they are due, no sooner,
and nothing is lost, with the store and the clock handed in (no disk, no sleeping in real time)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from guard.constants import HARNESS_CONTEXT_HEARTBEAT_MS
from guard.policy import Reading, WriteGuard
from guard.record import ContextFields, HarnessContext
from sidecar import app
from sidecar.app import LiveSchedule, Writer
from sidecar.pipeline import Pipeline

EPOCH_MS = 1_780_000_000_000
HEARTBEAT_S = HARNESS_CONTEXT_HEARTBEAT_MS / 1000


class MockWallClock:
    """Wall time that is trio's (mock) clock plus an epoch, so the two never disagree."""

    def wall_ms(self) -> int:
        return EPOCH_MS + round(trio.current_time() * 1000)


class Landed:
    """A store that keeps what it was given and when (trio's clock), failing while told to."""

    def __init__(self, failures: int = 0) -> None:
        self.records: list[HarnessContext] = []
        self.attempted_at: list[float] = []
        self.failures = failures

    async def write(self, record: HarnessContext) -> HarnessContext:
        await trio.lowlevel.checkpoint()
        self.attempted_at.append(trio.current_time())
        if self.failures:
            self.failures -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        self.records.append(record)
        return record


class Fills:
    """A producer whose events are the fills it reports, observed when they arrive."""

    harness = "pi"

    def feed(self, event: int, now_ms: int) -> list[Reading]:
        fields = ContextFields(harness="pi", used_tokens=event, window_tokens=1000, observed_at_ms=now_ms)
        return [Reading(fields)]


def writer(store: Landed, recorder: object = None) -> Writer:
    schedule = LiveSchedule(MockWallClock(), recorder)  # type: ignore[arg-type]
    return Writer(Pipeline(Fills(), WriteGuard("a", "inc")), store, schedule)


async def test_the_heartbeat_writes_the_held_reading_exactly_when_it_is_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Landed()
    subject = writer(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(subject.run)
        subject.submit(500)  # a bucket: written at once
        await trio.sleep(1)
        subject.submit(505)  # the same bucket: held for the heartbeat
        await trio.sleep(HEARTBEAT_S - 2)
        assert [record.used_tokens for record in store.records] == [500]  # not a moment early
        await trio.sleep(2)
        subject.close()
    assert [record.used_tokens for record in store.records] == [500, 505]
    first, beat = store.records
    assert beat.written_at_ms - first.written_at_ms == HARNESS_CONTEXT_HEARTBEAT_MS
    assert beat.observed_at_ms == EPOCH_MS + 1000  # the reading's own time, never the beat's


async def test_a_write_that_fails_is_retried_on_schedule_and_lands_the_newest_reading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Landed(failures=2)
    subject = writer(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(subject.run)
        subject.submit(100)
        await trio.sleep(1)
        for fill in (200, 300, 400):  # arrive while the store fails: only the newest is owed
            subject.submit(fill)
        await trio.sleep(3 * app.WRITE_RETRY_S)
        subject.close()
    assert store.attempted_at == [0, app.WRITE_RETRY_S, 2 * app.WRITE_RETRY_S]
    assert [record.used_tokens for record in store.records] == [400]
    assert subject.failures == 0


async def test_a_write_still_failing_at_exit_gets_one_last_try(autojump_clock: trio.testing.MockClock) -> None:
    store = Landed(failures=1)
    subject = writer(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(subject.run)
        subject.submit(100)
        await trio.sleep(1)  # the first attempt failed; the retry is 4 s away
        subject.close()
    assert store.attempted_at == [0, 1]
    assert [record.used_tokens for record in store.records] == [100]


class SlowStore(Landed):
    """Each write takes `seconds` to land (a held lock, a slow disk)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def write(self, record: HarnessContext) -> HarnessContext:
        await trio.sleep(self.seconds)
        return await super().write(record)


class Lines:
    """What the writer tells a recording (`hctx wrap --record`), as the recorder takes it."""

    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def line(self, entry: dict[str, object]) -> None:
        self.lines.append(entry)


async def test_a_write_found_late_is_recorded_once_and_folds_what_comes_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The outbox finds the write in flight late by the clock live, and the recording says so once,
    when it did: a replay folds by that line, not by its own clock (tests/test_recording.py)."""
    store = SlowStore(0.2)
    recording = Lines()
    subject = writer(store, recording)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(subject.run)
        subject.submit(100)  # in flight for 0.2 s
        await trio.sleep(0.05)
        subject.submit(200)  # waits its turn: the write in flight is not late yet
        assert [line["write"] for line in recording.lines] == ["taken"]
        await trio.sleep(0.1)
        subject.submit(300)  # 0.15 s in flight: late, so only the newest is owed
        subject.submit(400)
        assert [line["write"] for line in recording.lines] == ["taken", "late"]
        await trio.sleep(1)
        subject.submit(500)  # the late write landed: the next one waits its turn again
        subject.submit(600)
        await trio.sleep(1)
        subject.close()
    assert [record.used_tokens for record in store.records] == [100, 400, 500, 600]
    assert subject.outbox.coalesced == 2
    assert [line["write"] for line in recording.lines] == ["taken", "late", *["landed", "taken"] * 3, "landed"]


class TwoFills:
    """A decoder whose every chunk completes two events: the fills 500 and 505."""

    def receive_data(self, data: bytes) -> list[object]:
        return [500, 505]

    def end_of_data(self) -> list[object]:
        return []


def test_the_events_of_one_chunk_are_taken_at_the_time_it_arrived(monkeypatch: pytest.MonkeyPatch) -> None:
    """Live, every event a chunk completed is taken at the time its bytes arrived, the time its
    recording holds: a clock that ticks between them (each call here a millisecond later) never
    makes the second reading newer live than it is in replay, where one chunk has one time."""
    from sidecar import streams
    from sidecar.app import SystemClock

    ticks = iter(range(1_780_000_000_000, 1_780_000_001_000))
    monkeypatch.setattr(streams.time, "time_ns", lambda: next(ticks) * 1_000_000)
    seen: list[int] = []

    class Seen(Fills):
        def feed(self, event: int, now_ms: int) -> list[Reading]:
            seen.append(now_ms)
            return super().feed(event, now_ms)

    subject = Writer(Pipeline(Seen(), WriteGuard("a", "inc")), Landed(), LiveSchedule(SystemClock()))
    streams.Stream(TwoFills(), subject.submit, "channel").receive_data(b"two frames")
    assert seen == [1_780_000_000_000, 1_780_000_000_000]
    assert SystemClock().wall_ms() > seen[0]  # outside a chunk, the clock itself


def test_the_live_sidecar_and_a_replay_set_up_through_one_function(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 34.2: streams -> writer -> pipeline -> guard are set up by one function for the live
    sidecar and for each sidecar a replay plays; only the store and the schedule handed in differ,
    and the writer holds no control of a replay's own."""
    from sidecar.registry import spec_for
    from sidecar.replay import replay_recording
    from tests.conformance import RECORDINGS

    built: list[app.Sidecar] = []
    one_setup = app.assemble

    def assemble(*args: Any, **kwargs: Any) -> app.Sidecar:
        built.append(one_setup(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(app, "assemble", assemble)
    app.open_sidecar(app.SidecarConfig(tmp_path, "h", "a", "pi", "inc", tmp_path / "channel"))
    writes, _ = replay_recording(spec_for("pi"), RECORDINGS / "pi" / "wrapped" / "pi-1.6.0.rec")
    assert writes and [type(sidecar.writer.schedule).__name__ for sidecar in built] == [
        "LiveSchedule",
        "RecordedSchedule",
    ]
    assert [type(sidecar.writer.store).__name__ for sidecar in built] == ["CatalogStore", "MemoryStore"]
    for sidecar in built:
        assert not {"taking", "on_landed", "recorder"} & set(vars(sidecar.writer))
        assert not {"judge_by_clock", "on_late"} & set(vars(sidecar.writer.outbox))
