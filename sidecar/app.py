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

from guard.policy import Write, WriteGuard
from guard.record import Harness
from guard.store import AgentDir, sweep_staging, write_context
from sidecar import channel
from sidecar.pipeline import Pipeline
from sidecar.producers import producer_for
from sidecar.producers.base import Frame
from sidecar.transports import Submit, Transport, transport_for

log = logging.getLogger("sidecar")

# Deep enough for a rollout backlog replayed at once; a full queue drops (and logs) the newest.
FRAME_QUEUE = 8192
WRITE_RETRY_S = 5.0
# After the harness is gone, frames already on their way (a last hook process) still land; a
# client that keeps its connection open past this is cut off.
SHUTDOWN_DRAIN_S = 2.0


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


class Writer:
    """The only holder of the agent's lock and staging directory in this process."""

    def __init__(self, config: SidecarConfig) -> None:
        self.agent_dir = AgentDir(config.catalog, config.host, config.agent)
        if swept := sweep_staging(config.catalog):
            log.info("removed %d staging files of dead writers", swept, extra={"event": "staging-swept"})
        guard = WriteGuard(config.agent, config.incarnation)
        self.pipeline = Pipeline(producer_for(config.harness), guard)
        # The newest write that failed (a full disk, a catalog turned hostile): retried until it
        # lands or a newer write supersedes it. Every write carries the whole reading, so the newest
        # is all that is owed.
        self.unwritten: Write | None = None
        self.retry_at = math.inf

    async def commit(self, writes: list[Write]) -> None:
        for write in writes:
            await self._write(write)

    async def _write(self, write: Write) -> None:
        try:
            # In a worker thread: the lock may be contended and fsync is slow; the channel and a
            # relay keep serving meanwhile. Not cancellable: a write, once started, completes.
            record = await trio.to_thread.run_sync(write_context, self.agent_dir, write.record)
        except OSError as exc:
            self.unwritten, self.retry_at = write, trio.current_time() + WRITE_RETRY_S
            log.error("write failed, retrying in %ss: %s", WRITE_RETRY_S, exc,
                      extra={"event": "write-failed", "reason": write.reason})  # fmt: skip
            return
        self.unwritten, self.retry_at = None, math.inf
        self.pipeline.guard.committed(Write(record, write.reason))  # writtenAtMs as it landed
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

    async def run(self, frames: trio.MemoryReceiveChannel[Frame]) -> None:
        """Feed frames as they come; asleep until the heartbeat or a retry is due otherwise."""
        async with frames:
            while True:
                with trio.move_on_at(self._deadline()):
                    try:
                        frame = await frames.receive()
                    except trio.EndOfChannel:
                        break
                    await self.commit(self.pipeline.feed(frame, now_ms()))
                    continue
                if self.unwritten is not None and trio.current_time() >= self.retry_at:
                    await self._write(self.unwritten)
                await self.commit(self.pipeline.tick(now_ms()))
        if self.unwritten is not None:  # one last try before the sidecar exits
            await self._write(self.unwritten)


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
    send, receive = trio.open_memory_channel[Frame](FRAME_QUEUE)

    def submit(frame: Frame) -> None:
        try:
            send.send_nowait(frame)
        except trio.WouldBlock:
            log.warning("frame dropped: queue full", extra={"event": "frame-dropped", "why": "queue full"})
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            log.info("frame after shutdown dropped", extra={"event": "frame-dropped", "why": "shutdown"})

    log.info(
        "sidecar started",
        extra={"event": "start", "harness": config.harness, "incarnation": config.incarnation,
               "pid": os.getpid(), "channel": str(config.channel)},
    )  # fmt: skip
    async with trio.open_nursery() as outer:
        outer.start_soon(writer.run, receive)
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
        await send.aclose()
    log.info("sidecar exiting", extra={"event": "exit", "dropped": writer.pipeline.dropped})


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
