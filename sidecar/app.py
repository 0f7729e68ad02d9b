"""The sidecar process: channel, transport, write loop and parent watch in one nursery."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guard.account import Account
from guard.atomic import sweep_staging
from guard.history import start_fields, write_fields
from guard.json_rule import loads
from guard.layout import AgentDir
from guard.policy import Write, WriteGuard, WriteReason
from guard.record import Harness, HarnessContext, describe_validation_error
from guard.store import write_context
from sidecar import channel, lifeline
from sidecar.channel import BUFFER_BUDGET_BYTES
from sidecar.decoding import channel_decoder
from sidecar.pipeline import Pipeline
from sidecar.registry import HarnessSpec, spec_for
from sidecar.spec import ConfigError, Transport
from sidecar.streams import CHUNK_MS, Streams, transport_for

if TYPE_CHECKING:
    from sidecar.recorder import Recorder

__all__ = [
    "OUTBOX_WRITES",
    "SHUTDOWN_DRAIN_S",
    "STALLED_WRITE_S",
    "WRITE_RETRY_S",
    "CatalogStore",
    "Clock",
    "LiveSchedule",
    "Outbox",
    "Outcome",
    "Schedule",
    "Sidecar",
    "SidecarConfig",
    "SidecarSettings",
    "Store",
    "SystemClock",
    "Writer",
    "assemble",
    "open_recorder",
    "open_sidecar",
    "open_writer",
    "run_sidecar",
    "run_transport",
    "stated_account",
    "transport_settings",
    "transport_streams",
]

log = logging.getLogger("sidecar")

WRITE_RETRY_S = 5.0
# A write takes a millisecond or two (two fsyncs); one in flight this long is stalled, and from
# then on only the newest reading is owed. The bound caps what waits even before that.
STALLED_WRITE_S = 0.1
OUTBOX_WRITES = 64
# After the harness is gone, frames already on their way (a last hook process) still land; a
# client that keeps its connection open past this is cut off.
SHUTDOWN_DRAIN_S = 2.0
# Which reason a coalesced write keeps: the most telling of the writes it stands for.
_REASON_RANK: dict[WriteReason, int] = {
    "heartbeat": 0, "rate-limits": 1, "prompt-cache": 1, "bucket": 2, "exhaustion": 3, "compaction": 4,
}  # fmt: skip


class SidecarSettings(BaseModel):
    """Everything a sidecar was started with that decides what it writes: the header of each of its
    recordings holds it (`config`), and a replay sets its sidecar up from it, so a replay publishes
    every field the live run did. What is the process's own (the catalog's path, the channel's,
    inherited descriptors, the recording's) is not here: a replay has none of them. A recording
    made before the header held it replays with these defaults (the agent `replay`, no account,
    no transport config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    harness: str
    host: str = ""
    agent: str = "replay"
    incarnation: str = "replay"
    transport: str = ""  # the launch plan's transport config, as JSON (HarnessSpec.transport_config)
    account: str = ""  # the account the harness states, as JSON (guard.account.Account); "" none
    channel_budget_bytes: int = Field(default=BUFFER_BUDGET_BYTES, ge=0)


@dataclass(frozen=True)
class SidecarConfig:
    catalog: Path
    host: str
    agent: str
    harness: Harness
    incarnation: str
    channel: Path
    lifeline_fd: int | None = None
    ready_fd: int | None = None
    transport: str = ""  # the launch plan's transport config, as JSON (HarnessSpec.transport_config)
    account: str = ""  # the account the harness states, as JSON (guard.account.Account); "" none
    # `hctx wrap --record`: the descriptor of the file the wrapper created, which it hands every
    # sidecar of the session (never its path: whoever may rename in its directory could swap it).
    record_fd: int | None = None
    record_raw: bool = False  # `--record-raw`: the whole session, unredacted
    # What the channel's connections may hold of partial frames, together: this sidecar's own.
    channel_budget_bytes: int = BUFFER_BUDGET_BYTES

    def settings(self) -> SidecarSettings:
        return SidecarSettings(
            harness=self.harness, host=self.host, agent=self.agent, incarnation=self.incarnation,
            transport=self.transport, account=self.account, channel_budget_bytes=self.channel_budget_bytes,
        )  # fmt: skip


class Clock(Protocol):
    """The wall clock a record's times are read from (deadlines run on trio's own clock)."""

    def wall_ms(self) -> int: ...


class SystemClock:
    def wall_ms(self) -> int:
        """Now; for an event of a chunk, when the chunk arrived (sidecar.streams.CHUNK_MS)."""
        arrived = CHUNK_MS.get()
        return time.time_ns() // 1_000_000 if arrived is None else arrived


# What became of a write, as the writer says it to its schedule (and a recording holds it).
Outcome = Literal["taken", "late", "landed", "failed"]


class Schedule(Protocol):
    """When the writer acts, and the clock it stamps records by: live, the wall clock and trio's
    (`LiveSchedule`); a replay, what its recording says the live writer did (sidecar.replay)."""

    def wall_ms(self) -> int: ...

    async def take(self) -> None:
        """Until the writer may take the next write owed (refresh it with the newest reading, send it)."""
        ...

    def late(self, in_flight_s: float) -> bool:
        """Whether the write in flight this long (trio's clock) is late: from then, until it lands,
        only the newest write is owed."""
        ...

    def said(self, outcome: Outcome, write: Write) -> None:
        """What became of `write` (for `landed`, the record as it landed)."""
        ...


class LiveSchedule:
    """The live sidecar's: a write is taken at once and late past `STALLED_WRITE_S`, records are
    stamped by `clock`, and with `--record` each outcome is a line of the recording, so a replay
    takes, folds and lands its writes where the live writer did."""

    def __init__(self, clock: Clock | None = None, recorder: Recorder | None = None) -> None:
        self.clock = SystemClock() if clock is None else clock
        self.recorder = recorder

    def wall_ms(self) -> int:
        return self.clock.wall_ms()

    async def take(self) -> None:
        return  # at once: no checkpoint, so nothing else runs between deciding and taking

    def late(self, in_flight_s: float) -> bool:
        return in_flight_s >= STALLED_WRITE_S

    def said(self, outcome: Outcome, write: Write) -> None:
        if self.recorder is not None:
            self.recorder.line({"at_ms": self.clock.wall_ms(), "write": outcome})


class Store(Protocol):
    """Where records land."""

    async def write(self, record: HarnessContext) -> HarnessContext:
        """The record as it landed (writtenAtMs as stamped under the lock); OSError if it did not.
        Not cancellable: a write, once started, completes."""
        ...


@dataclass(frozen=True)
class CatalogStore:
    """The agent's directory in the catalog: the only holder of its lock and staging in this process."""

    agent_dir: AgentDir

    async def write(self, record: HarnessContext) -> HarnessContext:
        # In a worker thread: the lock may be contended and fsync is slow; the channel and a
        # relay keep serving meanwhile.
        return await trio.to_thread.run_sync(write_context, self.agent_dir, record)


class Outbox:
    """The writes owed, in order, bounded. Frames are folded into the producer as they arrive and
    each write the guard decides waits here while the one before it lands, so live writes are the
    ones replay shows. Once a write is late (in flight past `STALLED_WRITE_S`: a held lock, a slow
    disk), failing (a full disk), or `OUTBOX_WRITES` wait, a newer write replaces the newest waiting
    one instead: every write carries the whole reading, so only the newest is owed, and it keeps the
    reason of a compaction (or exhaustion) edge it stands for. Memory: at most `OUTBOX_WRITES` records."""

    def __init__(self, schedule: Schedule | None = None) -> None:
        self.schedule: Schedule = LiveSchedule() if schedule is None else schedule
        self.pending: deque[Write] = deque()
        self.coalesced = 0
        self.closed = False
        self.failing = False
        self.in_flight: Write | None = None
        self.in_flight_since: float | None = None  # trio's clock, while a write is landing
        # The write in flight was found late, as the schedule judges (live by the clock; a replay
        # where its recording says the live one was), and said once.
        self.late = False
        self._changed = trio.Event()

    def stalled(self) -> bool:
        since, write = self.in_flight_since, self.in_flight
        if not self.late and since is not None and write is not None:
            self.late = self.schedule.late(trio.current_time() - since)
            if self.late:
                self.schedule.said("late", write)
        return self.failing or self.late or len(self.pending) >= OUTBOX_WRITES

    def landing(self, write: Write) -> None:
        self.in_flight, self.in_flight_since = write, trio.current_time()

    def landed(self) -> None:
        self.in_flight = self.in_flight_since = None
        self.late = False

    def put(self, write: Write) -> None:
        if self.pending and self.stalled():
            self.coalesced += 1
            self.pending[-1] = _keep_reason(write, self.pending[-1])
        else:
            self.pending.append(write)
        self._changed.set()

    def restore(self, write: Write) -> None:
        """A write that failed goes back: alone, or folded into the newest that came meanwhile."""
        if self.pending:
            self.pending = deque([_keep_reason(self.pending[-1], write)])
        else:
            self.pending.append(write)

    def take(self) -> Write | None:
        return self.pending.popleft() if self.pending else None

    def take_all(self) -> Write | None:
        """The last write owed before the sidecar exits: every waiting one folded into the newest
        (counted as coalesced: the exit line says every write that never landed on its own)."""
        owed: Write | None = None
        while self.pending:
            newer = self.pending.popleft()
            if owed is not None:
                self.coalesced += 1
            owed = newer if owed is None else _keep_reason(newer, owed)
        return owed

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    def wake(self) -> None:
        """Nothing new is owed, but when the next write is due may have changed (a held reading)."""
        self._changed.set()

    async def changed(self) -> None:
        await self._changed.wait()
        self._changed = trio.Event()


def _keep_reason(newer: Write, older: Write) -> Write:
    if _REASON_RANK[older.reason] > _REASON_RANK[newer.reason]:
        return Write(newer.record, older.reason)
    return newer


class Writer:
    """Decoded events in, records out: the pipeline's writes landed in order in `store`, with the
    heartbeat and the retry of failed writes on trio's clock, taken, found late and stamped as
    `schedule` says (live: `LiveSchedule`; a replay: its recording)."""

    def __init__(self, pipeline: Pipeline, store: Store, schedule: Schedule | None = None) -> None:
        self.pipeline = pipeline
        self.store = store
        self.schedule: Schedule = LiveSchedule() if schedule is None else schedule
        self.outbox = Outbox(self.schedule)
        # While writes fail (a full disk, a catalog turned hostile) the newest is retried on this
        # schedule, not once per frame; the first failure is logged, the recovery says how many.
        self.failures = 0
        self.retry_at = math.inf
        self.on_fed: Callable[[], None] | None = None  # after each event: a transport pulling what it wants

    def submit(self, event: object) -> None:
        """Fold one decoded event in at once (a producer is a small state machine): none is ever
        queued, so a burst or a stalled write costs no memory and never drops the newest reading.
        Called from the channel's and the transports' tasks: whatever goes wrong costs this event."""
        due = self.pipeline.guard.heartbeat_due_ms()
        try:
            writes = self.pipeline.feed(event, self.schedule.wall_ms())
        except Exception:
            self.pipeline.count_drop("pipeline")
            log.exception("frame dropped: the write guard failed on it", extra={"event": "frame-dropped"})
            return
        for write in writes:
            self.outbox.put(write)
        if not writes and self.pipeline.guard.heartbeat_due_ms() != due:
            self.outbox.wake()  # a reading held back set the heartbeat's deadline the writer sleeps to
        if self.on_fed is not None:
            self.on_fed()

    def close(self) -> None:
        """No more frames: `run` makes one last try at what is owed, then returns."""
        self.outbox.close()

    async def _write(self, write: Write) -> None:
        await self.schedule.take()
        guard = self.pipeline.guard
        if not self.outbox.pending:  # the newest decided write: it lands with the newest reading held
            write = guard.refresh(write, self.schedule.wall_ms())
        self.schedule.said("taken", write)
        self.outbox.landing(write)
        try:
            record = await self.store.write(write.record)
        except OSError as exc:
            self.schedule.said("failed", write)
            self.outbox.failing = True
            self.outbox.restore(write)
            self.retry_at = trio.current_time() + WRITE_RETRY_S
            self.failures += 1
            if self.failures == 1:
                log.error("write failed, retrying every %ss: %s", WRITE_RETRY_S, exc,
                          extra={"event": "write-failed", "reason": write.reason})  # fmt: skip
            return
        finally:
            self.outbox.landed()
        landed = Write(record, write.reason)
        self.schedule.said("landed", landed)
        if self.failures:
            log.warning("write recovered after %d failed attempts", self.failures,
                        extra={"event": "write-recovered", "failures": self.failures})  # fmt: skip
        self.failures, self.retry_at = 0, math.inf
        self.outbox.failing = False
        if guard.last is write.record:  # nothing newer decided meanwhile: take writtenAtMs as it landed
            guard.committed(landed)
        log.info(
            "wrote %s",
            write.reason,
            extra={
                **write_fields(record, write.reason),  # the fill history's line (guard.history)
                # The whole record as it landed: what a live run is held to against its replay
                # (every field of every write), and what a bug report shows beside the numbers.
                "record": record.model_dump(mode="json", by_alias=True),
            },
        )

    def _deadline(self) -> float:
        due = self.pipeline.guard.heartbeat_due_ms()
        heartbeat = math.inf if due is None else trio.current_time() + (due - self.schedule.wall_ms()) / 1000
        return min(heartbeat, self.retry_at)

    def _write_due(self) -> bool:
        return bool(self.outbox.pending) and (not self.failures or trio.current_time() >= self.retry_at)

    async def run(self) -> None:
        """Write what is owed as it comes; asleep until a write, the heartbeat or a retry is due."""
        while not self.outbox.closed:
            if not self._write_due():
                with trio.move_on_at(self._deadline()):
                    await self.outbox.changed()
            for beat in self.pipeline.tick(self.schedule.wall_ms()):
                self.outbox.put(beat)
            if self._write_due() and (owed := self.outbox.take()) is not None:
                await self._write(owed)
        if (last := self.outbox.take_all()) is not None:  # one last try before the sidecar exits
            await self._write(last)


def transport_settings(spec: HarnessSpec, text: str) -> BaseModel | None:
    """The transport's config, validated by the model the wrapper built it with; None (logged)
    when the JSON is not one: the channel serves on, without the transport."""
    model = spec.transport_config
    if model is None or not text:  # a launch plan that set none: the channel is the only wire
        return None
    try:
        return model.model_validate(loads(text, error=ConfigError))
    except ConfigError as exc:
        reason = str(exc)
    except ValidationError as exc:
        reason = describe_validation_error(exc)
    log.error("no %s transport: its config is refused: %s", spec.name, reason, extra={"event": "transport-bad-config"})
    return None


async def run_transport(transport: Transport, config: BaseModel | None, streams: Streams) -> None:
    """A transport that fails costs its own stream, never the channel or the writer."""
    try:
        await transport(config, streams)
    except Exception:
        log.exception("transport failed; the channel keeps serving", extra={"event": "transport-failed"})


@dataclass(frozen=True)
class Sidecar:
    """One sidecar's path: its harness's spec, its writer (the pipeline and the write guard
    inside), and the streams its transport opens (a replay opens its recorded ones there)."""

    spec: HarnessSpec
    writer: Writer
    streams: Streams


def assemble(
    spec: HarnessSpec, settings: SidecarSettings, store: Store, schedule: Schedule, recorder: Recorder | None = None
) -> Sidecar:
    """Streams -> writer -> pipeline -> write guard for `settings`: the one setup of the live sidecar
    (`run_sidecar`, into the catalog on the wall clock) and of each sidecar a replay plays
    (sidecar.replay, into memory on its recording's schedule)."""
    guard = WriteGuard(settings.agent, settings.incarnation)
    pipeline = Pipeline(spec.make_producer(), guard, stated_account(settings.account))
    writer = Writer(pipeline, store, schedule)
    return Sidecar(spec, writer, transport_streams(spec, writer, recorder))


def open_sidecar(config: SidecarConfig, recorder: Recorder | None = None) -> Sidecar:
    """The live sidecar's path: its writes into the agent's directory, on the wall clock, each
    outcome recorded with `--record`."""
    if swept := sweep_staging(config.catalog):
        log.info("removed %d staging files of dead writers", swept, extra={"event": "staging-swept"})
    store = CatalogStore(AgentDir(config.catalog, config.host, config.agent))
    return assemble(spec_for(config.harness), config.settings(), store, LiveSchedule(recorder=recorder), recorder)


def open_writer(config: SidecarConfig) -> tuple[HarnessSpec, Writer]:
    """The harness's spec, and a writer of its producer's records into the agent's directory."""
    sidecar = open_sidecar(config)
    return sidecar.spec, sidecar.writer


def stated_account(text: str) -> Account | None:
    """The launch plan's account; None (logged) when the JSON is not one: readings go out without."""
    if not text:
        return None
    try:
        return Account.model_validate_json(text)
    except ValidationError as exc:
        log.error("no account: its JSON is refused: %s", describe_validation_error(exc),
                  extra={"event": "account-bad-config"})  # fmt: skip
        return None


def transport_streams(spec: HarnessSpec, writer: Writer, recorder: Recorder | None = None) -> Streams:
    """What the transport is handed: the writer's submit, and the producer's wants if it has any."""
    wants = getattr(writer.pipeline.producer, "wants", None)
    if wants is None:
        return Streams(spec, writer.submit, recorder=recorder)
    streams = Streams(spec, writer.submit, wants, recorder)
    writer.on_fed = streams.nudge
    return streams


def open_recorder(config: SidecarConfig) -> Recorder | None:
    """The recorder of `--record`'s file, which the wrapper created and hands down open (appending,
    0600): never opened by name here. Redacted (sidecar.redaction) unless `--record-raw`."""
    if config.record_fd is None:
        return None
    import guard
    from sidecar.recorder import FORMAT, Recorder
    from sidecar.redaction import redactors

    try:
        file = os.fdopen(config.record_fd, "ab")
        written = os.fstat(config.record_fd).st_size
    except OSError as exc:
        log.error("not recording: %s", exc, extra={"event": "recording-failed"})
        return None
    header = {"format": FORMAT, "harness": config.harness, "hctx": guard.__version__,
              "incarnation": config.incarnation, "started_ms": SystemClock().wall_ms(),
              "config": config.settings().model_dump(mode="json"), "redacted": not config.record_raw}  # fmt: skip
    redactor = None if config.record_raw else redactors(spec_for(config.harness))
    return Recorder(file, header, written=written, redactor=redactor)


async def run_sidecar(config: SidecarConfig) -> None:
    recorder = open_recorder(config)
    sidecar = open_sidecar(config, recorder)
    spec, writer = sidecar.spec, sidecar.writer
    submit = writer.submit
    log.info(
        "sidecar started",
        extra={**start_fields(), "harness": config.harness, "incarnation": config.incarnation,
               "pid": os.getpid(), "channel": str(config.channel)},
    )  # fmt: skip
    async with trio.open_nursery() as outer:
        outer.start_soon(writer.run)
        if recorder is not None:
            outer.start_soon(recorder.run)
        async with trio.open_nursery() as inputs:
            transport = transport_for(spec)
            settings = None if transport is None else transport_settings(spec, config.transport)
            if transport is not None and (settings is not None or spec.transport_config is None):
                inputs.start_soon(run_transport, transport, settings, sidecar.streams)
            session_over = trio.Event()
            async with trio.open_nursery() as channel_nursery:
                open_decoder = partial(channel_decoder, spec.channel_frames)
                budget = channel.ChannelBudget(config.channel_budget_bytes)
                serve = partial(channel.serve, recorder=recorder, budget=budget)
                await channel_nursery.start(serve, config.channel, open_decoder, submit, session_over)
                _signal_ready(config.ready_fd)
                orders = await _until_session_ends(config.lifeline_fd)
                if orders is not None and (group := orders.group_left) is not None:
                    # The wrapper vanished and left the harness's group: its end runs beside the drain.
                    log.warning("the wrapper is gone without finishing: ending the harness's group %d", group,
                                extra={"event": "group-ended", "group": group})  # fmt: skip
                    outer.start_soon(lifeline.end_group, group, orders.deadline_s)
                session_over.set()
                channel_nursery.cancel_scope.deadline = trio.current_time() + SHUTDOWN_DRAIN_S
            inputs.cancel_scope.cancel()
        writer.close()
        if recorder is not None:
            recorder.close()
    log.info(
        "sidecar exiting",
        extra={"event": "exit", "dropped": sum(writer.pipeline.drops.values()),
               "droppedBy": dict(writer.pipeline.drops),
               "coalesced": writer.outbox.coalesced, "writeFailures": writer.failures},
    )  # fmt: skip


def _signal_ready(fd: int | None) -> None:
    if fd is not None:
        os.write(fd, b"ready\n")
        os.close(fd)


async def _until_session_ends(lifeline_fd: int | None) -> lifeline.Orders | None:
    """Until a signal, or the lifeline's end (then the wrapper's orders)."""
    orders: lifeline.Orders | None = None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("signal %s", signal.Signals(signum).name, extra={"event": "signal"})
                    nursery.cancel_scope.cancel()

            nursery.start_soon(on_signal)
            if lifeline_fd is not None:
                orders = await lifeline.follow(lifeline_fd)
                log.info("wrapper gone", extra={"event": "lifeline-closed"})
                nursery.cancel_scope.cancel()
    return orders
