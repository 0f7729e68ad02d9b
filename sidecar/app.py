"""The sidecar process: channel, transport, write loop and parent watch in one nursery."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from guard.policy import Write, WriteGuard, WriteReason
from guard.record import Harness
from guard.store import AgentDir, sweep_staging, write_context
from sidecar import channel, logs
from sidecar.pipeline import Pipeline
from sidecar.producers import producer_for
from sidecar.producers.base import Frame
from sidecar.transports import Submit, Transport, transport_for

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
    transport: dict[str, Any] = field(default_factory=dict)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        self._changed = trio.Event()

    def stalled(self) -> bool:
        since = self.in_flight_since
        late = since is not None and trio.current_time() - since >= STALLED_WRITE_S
        return self.failing or late or len(self.pending) >= OUTBOX_WRITES

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
        """The last write owed before the sidecar exits: every waiting one folded into the newest."""
        owed: Write | None = None
        while self.pending:
            newer = self.pending.popleft()
            owed = newer if owed is None else _keep_reason(newer, owed)
        return owed

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    async def changed(self) -> None:
        await self._changed.wait()
        self._changed = trio.Event()


def _keep_reason(newer: Write, older: Write) -> Write:
    if _REASON_RANK[older.reason] > _REASON_RANK[newer.reason]:
        return Write(newer.record, older.reason)
    return newer


class Writer:
    """The only holder of the agent's lock and staging directory in this process."""

    def __init__(self, config: SidecarConfig) -> None:
        self.agent_dir = AgentDir(config.catalog, config.host, config.agent)
        if swept := sweep_staging(config.catalog):
            log.info("removed %d staging files of dead writers", swept, extra={"event": "staging-swept"})
        guard = WriteGuard(config.agent, config.incarnation)
        self.pipeline = Pipeline(producer_for(config.harness), guard)
        self.outbox = Outbox()
        # While writes fail (a full disk, a catalog turned hostile) the newest is retried on this
        # schedule, not once per frame; the first failure is logged, the recovery says how many.
        self.failures = 0
        self.retry_at = math.inf

    def submit(self, frame: Frame) -> None:
        """Fold one frame in at once (a producer is a small state machine): no frame is ever queued,
        so a burst or a stalled write costs no memory and never drops the newest reading. Called
        from the channel's and the transports' tasks: whatever goes wrong costs this frame only."""
        try:
            writes = self.pipeline.feed(frame, now_ms())
        except Exception:
            logs.drops["pipeline"] += 1
            log.exception("frame dropped: the write guard failed on it", extra={"event": "frame-dropped"})
            return
        for write in writes:
            self.outbox.put(write)

    def close(self) -> None:
        """No more frames: `run` makes one last try at what is owed, then returns."""
        self.outbox.close()

    async def _write(self, write: Write) -> None:
        guard = self.pipeline.guard
        if not self.outbox.pending:  # the newest decided write: it lands with the newest reading held
            write = guard.refresh(write, now_ms())
        self.outbox.in_flight_since = trio.current_time()
        try:
            # In a worker thread: the lock may be contended and fsync is slow; the channel and a
            # relay keep serving meanwhile. Not cancellable: a write, once started, completes.
            record = await trio.to_thread.run_sync(write_context, self.agent_dir, write.record)
        except OSError as exc:
            self.outbox.failing = True
            self.outbox.restore(write)
            self.retry_at = trio.current_time() + WRITE_RETRY_S
            self.failures += 1
            if self.failures == 1:
                log.error("write failed, retrying every %ss: %s", WRITE_RETRY_S, exc,
                          extra={"event": "write-failed", "reason": write.reason})  # fmt: skip
            return
        finally:
            self.outbox.in_flight_since = None
        if self.failures:
            log.warning("write recovered after %d failed attempts", self.failures,
                        extra={"event": "write-recovered", "failures": self.failures})  # fmt: skip
        self.failures, self.retry_at = 0, math.inf
        self.outbox.failing = False
        if guard.last is write.record:  # nothing newer decided meanwhile: take writtenAtMs as it landed
            guard.committed(Write(record, write.reason))
        log.info(
            "wrote %s",
            write.reason,
            extra={
                "event": "write",
                "reason": write.reason,
                "usedTokens": record.used_tokens,
                "windowTokens": record.window_tokens,
                "usedPercent": record.used_percent,
                "compactions": record.compactions,
                "observedAtMs": record.observed_at_ms,
                "writtenAtMs": record.written_at_ms,
            },
        )

    def _deadline(self) -> float:
        due = self.pipeline.guard.heartbeat_due_ms()
        heartbeat = math.inf if due is None else trio.current_time() + (due - now_ms()) / 1000
        return min(heartbeat, self.retry_at)

    def _write_due(self) -> bool:
        return bool(self.outbox.pending) and (not self.failures or trio.current_time() >= self.retry_at)

    async def run(self) -> None:
        """Write what is owed as it comes; asleep until a write, the heartbeat or a retry is due."""
        while not self.outbox.closed:
            if not self._write_due():
                with trio.move_on_at(self._deadline()):
                    await self.outbox.changed()
            for beat in self.pipeline.tick(now_ms()):
                self.outbox.put(beat)
            if self._write_due() and (owed := self.outbox.take()) is not None:
                await self._write(owed)
        if (last := self.outbox.take_all()) is not None:  # one last try before the sidecar exits
            await self._write(last)


async def run_transport(transport: Transport, config: dict[str, Any], submit: Submit) -> None:
    """A transport that fails costs its own stream, never the channel or the writer."""
    try:
        await transport(config, submit)
    except Exception:
        log.exception("transport failed; the channel keeps serving", extra={"event": "transport-failed"})


async def wait_for_eof(fd: int) -> None:
    """Returns when the other end of the lifeline pipe is closed: the wrapper exited or died."""
    os.set_blocking(fd, False)
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            continue


async def run_sidecar(config: SidecarConfig) -> None:
    writer = Writer(config)
    submit = writer.submit
    log.info(
        "sidecar started",
        extra={"event": "start", "harness": config.harness, "incarnation": config.incarnation,
               "pid": os.getpid(), "channel": str(config.channel)},
    )  # fmt: skip
    async with trio.open_nursery() as outer:
        outer.start_soon(writer.run)
        async with trio.open_nursery() as inputs:
            transport = transport_for(config.harness)
            if transport is not None:
                inputs.start_soon(run_transport, transport, config.transport, submit)
            session_over = trio.Event()
            async with trio.open_nursery() as channel_nursery:
                await channel_nursery.start(channel.serve, config.channel, submit, session_over)
                _signal_ready(config.ready_fd)
                await _until_session_ends(config.lifeline_fd)
                session_over.set()
                channel_nursery.cancel_scope.deadline = trio.current_time() + SHUTDOWN_DRAIN_S
            inputs.cancel_scope.cancel()
        writer.close()
    log.info(
        "sidecar exiting",
        extra={"event": "exit", "dropped": sum(logs.drops.values()), "droppedBy": dict(logs.drops),
               "coalesced": writer.outbox.coalesced, "writeFailures": writer.failures},
    )  # fmt: skip


def _signal_ready(fd: int | None) -> None:
    if fd is not None:
        os.write(fd, b"ready\n")
        os.close(fd)


async def _until_session_ends(lifeline_fd: int | None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("signal %s", signal.Signals(signum).name, extra={"event": "signal"})
                    nursery.cancel_scope.cancel()

            nursery.start_soon(on_signal)
            if lifeline_fd is not None:
                await wait_for_eof(lifeline_fd)
                log.info("wrapper gone", extra={"event": "lifeline-closed"})
                nursery.cancel_scope.cancel()
