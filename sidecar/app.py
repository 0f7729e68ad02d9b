"""The sidecar process: channel, transport, write loop and parent watch in one nursery."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio
from pydantic import BaseModel, ValidationError

from guard.account import Account
from guard.atomic import sweep_staging
from guard.errors import ConfigError
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
from sidecar.spec import Transport
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
    "Outbox",
    "SidecarConfig",
    "Store",
    "SystemClock",
    "Writer",
    "open_recorder",
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
    "heartbeat": 0, "rate-limits": 1, "bucket": 2, "exhaustion": 3, "compaction": 4,
}  # fmt: skip


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
    record: Path | None = None  # `hctx wrap --record`: the file the wrapper created, appended to
    # What the channel's connections may hold of partial frames, together: this sidecar's own.
    channel_budget_bytes: int = BUFFER_BUDGET_BYTES


class Clock(Protocol):
    """The wall clock a record's times are read from (deadlines run on trio's own clock)."""

    def wall_ms(self) -> int: ...


class SystemClock:
    def wall_ms(self) -> int:
        """Now; for an event of a chunk, when the chunk arrived (sidecar.streams.CHUNK_MS)."""
        arrived = CHUNK_MS.get()
        return time.time_ns() // 1_000_000 if arrived is None else arrived


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

    def __init__(self) -> None:
        self.pending: deque[Write] = deque()
        self.coalesced = 0
        self.closed = False
        self.failing = False
        self.in_flight_since: float | None = None  # trio's clock, while a write is landing
        # The write in flight was found late. Live it is found by the clock, and `on_late` told
        # (the recording says so); a replay is told instead (`judge_by_clock` off), so it folds
        # exactly the writes the live outbox folded, however near the bound the recorded times fell.
        self.late = False
        self.judge_by_clock = True
        self.on_late: Callable[[], None] | None = None
        self._changed = trio.Event()

    def stalled(self) -> bool:
        since = self.in_flight_since
        if self.judge_by_clock and not self.late and since is not None:
            self.late = trio.current_time() - since >= STALLED_WRITE_S
            if self.late and self.on_late is not None:
                self.on_late()
        return self.failing or self.late or len(self.pending) >= OUTBOX_WRITES

    def landing(self) -> None:
        self.in_flight_since = trio.current_time()

    def landed(self) -> None:
        self.in_flight_since = None
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
    heartbeat and the retry of failed writes on trio's clock and record times from `clock`."""

    def __init__(self, pipeline: Pipeline, store: Store, clock: Clock | None = None) -> None:
        self.pipeline = pipeline
        self.store = store
        self.clock = SystemClock() if clock is None else clock
        self.outbox = Outbox()
        self.outbox.on_late = partial(self._recorded, "late")
        # While writes fail (a full disk, a catalog turned hostile) the newest is retried on this
        # schedule, not once per frame; the first failure is logged, the recovery says how many.
        self.failures = 0
        self.retry_at = math.inf
        self.on_landed: Callable[[Write], None] | None = None  # each write as it landed (replay prints them)
        self.on_fed: Callable[[], None] | None = None  # after each event: a transport pulling what it wants
        # `--record`: when each write landed or failed, so a replay's writes overlap its frames as live
        self.recorder: Recorder | None = None
        # A replay's writer takes each write when its recording says the live one did (sidecar.replay).
        self.taking: Callable[[], Awaitable[object]] | None = None

    def submit(self, event: object) -> None:
        """Fold one decoded event in at once (a producer is a small state machine): none is ever
        queued, so a burst or a stalled write costs no memory and never drops the newest reading.
        Called from the channel's and the transports' tasks: whatever goes wrong costs this event."""
        due = self.pipeline.guard.heartbeat_due_ms()
        try:
            writes = self.pipeline.feed(event, self.clock.wall_ms())
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
        if self.taking is not None:
            await self.taking()
        guard = self.pipeline.guard
        if not self.outbox.pending:  # the newest decided write: it lands with the newest reading held
            write = guard.refresh(write, self.clock.wall_ms())
        self._recorded("taken")
        self.outbox.landing()
        try:
            record = await self.store.write(write.record)
        except OSError as exc:
            self._recorded("failed")
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
        self._recorded("landed")
        if self.failures:
            log.warning("write recovered after %d failed attempts", self.failures,
                        extra={"event": "write-recovered", "failures": self.failures})  # fmt: skip
        self.failures, self.retry_at = 0, math.inf
        self.outbox.failing = False
        if guard.last is write.record:  # nothing newer decided meanwhile: take writtenAtMs as it landed
            guard.committed(Write(record, write.reason))
        if self.on_landed is not None:
            self.on_landed(Write(record, write.reason))
        log.info(
            "wrote %s",
            write.reason,
            extra=write_fields(record, write.reason),  # the fill history's line (guard.history)
        )

    def _recorded(self, outcome: str) -> None:
        if self.recorder is not None:
            self.recorder.line({"at_ms": self.clock.wall_ms(), "write": outcome})

    def _deadline(self) -> float:
        due = self.pipeline.guard.heartbeat_due_ms()
        heartbeat = math.inf if due is None else trio.current_time() + (due - self.clock.wall_ms()) / 1000
        return min(heartbeat, self.retry_at)

    def _write_due(self) -> bool:
        return bool(self.outbox.pending) and (not self.failures or trio.current_time() >= self.retry_at)

    async def run(self) -> None:
        """Write what is owed as it comes; asleep until a write, the heartbeat or a retry is due."""
        while not self.outbox.closed:
            if not self._write_due():
                with trio.move_on_at(self._deadline()):
                    await self.outbox.changed()
            for beat in self.pipeline.tick(self.clock.wall_ms()):
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


def open_writer(config: SidecarConfig) -> tuple[HarnessSpec, Writer]:
    """The harness's spec, and a writer of its producer's records into the agent's directory."""
    if swept := sweep_staging(config.catalog):
        log.info("removed %d staging files of dead writers", swept, extra={"event": "staging-swept"})
    spec = spec_for(config.harness)
    guard = WriteGuard(config.agent, config.incarnation)
    pipeline = Pipeline(spec.make_producer(), guard, stated_account(config.account))
    return spec, Writer(pipeline, CatalogStore(AgentDir(config.catalog, config.host, config.agent)))


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
    """The recorder of `--record`'s file, which the wrapper created: opened to append (never
    created, truncated or followed through a symlink here), and None, logged, when it cannot be."""
    if config.record is None:
        return None
    import guard
    from sidecar.recorder import FORMAT, Recorder

    try:
        fd = os.open(config.record, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        file = os.fdopen(fd, "ab")
        written = os.fstat(fd).st_size
    except OSError as exc:
        log.error("not recording: %s", exc, extra={"event": "recording-failed"})
        return None
    header = {"format": FORMAT, "harness": config.harness, "hctx": guard.__version__,
              "incarnation": config.incarnation, "started_ms": SystemClock().wall_ms()}  # fmt: skip
    return Recorder(file, header, written=written)


async def run_sidecar(config: SidecarConfig) -> None:
    spec, writer = open_writer(config)
    submit = writer.submit
    recorder = writer.recorder = open_recorder(config)
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
                inputs.start_soon(run_transport, transport, settings, transport_streams(spec, writer, recorder))
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
