"""The sidecar process: channel, transport, write loop and parent watch in one nursery."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
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
# After the harness is gone, frames already on their way (a last hook process) still land; a
# client that keeps its connection open past this is cut off.
SHUTDOWN_DRAIN_S = 2.0
# Which reason a coalesced write keeps: the most telling of the writes it stands for.
_REASON_RANK: dict[WriteReason, int] = {"heartbeat": 0, "bucket": 1, "exhaustion": 2, "compaction": 3}


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
    """The write owed, coalesced: frames are folded into the producer as they arrive, and while a
    write is in flight (a contended lock, a slow fsync) or failing (a full disk), each newer write
    replaces the one waiting. Every write carries the whole reading, so only the newest is owed;
    it keeps the reason of a compaction (or exhaustion) edge it stands for. Memory: one write."""

    def __init__(self) -> None:
        self.pending: Write | None = None
        self.coalesced = 0
        self.closed = False
        self._changed = trio.Event()

    def put(self, write: Write) -> None:
        if self.pending is not None:
            self.coalesced += 1
            write = _keep_reason(write, self.pending)
        self.pending = write
        self._changed.set()

    def restore(self, write: Write) -> None:
        """A write that failed goes back, unless a newer one took its place meanwhile."""
        if self.pending is None:
            self.pending = write
        else:
            self.pending = _keep_reason(self.pending, write)

    def take(self) -> Write | None:
        write, self.pending = self.pending, None
        return write

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
        write = guard.refresh(write, now_ms())
        try:
            # In a worker thread: the lock may be contended and fsync is slow; the channel and a
            # relay keep serving meanwhile. Not cancellable: a write, once started, completes.
            record = await trio.to_thread.run_sync(write_context, self.agent_dir, write.record)
        except OSError as exc:
            self.outbox.restore(write)
            self.retry_at = trio.current_time() + WRITE_RETRY_S
            self.failures += 1
            if self.failures == 1:
                log.error("write failed, retrying every %ss: %s", WRITE_RETRY_S, exc,
                          extra={"event": "write-failed", "reason": write.reason})  # fmt: skip
            return
        if self.failures:
            log.warning("write recovered after %d failed attempts", self.failures,
                        extra={"event": "write-recovered", "failures": self.failures})  # fmt: skip
        self.failures, self.retry_at = 0, math.inf
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
        return self.outbox.pending is not None and (not self.failures or trio.current_time() >= self.retry_at)

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
        if (last := self.outbox.take()) is not None:  # one last try before the sidecar exits
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
